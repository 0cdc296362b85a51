# Sourced by scripts/build.sh and scripts/demo.sh. hixl_cuda_args prints the
# CMake arguments that build CUDA device memory in (HIXL_WITH_CUDA needs only
# the toolkit's headers: CUDAToolkit_ROOT, nvcc on PATH, or /usr/local/cuda),
# or fails when no toolkit is found.
hixl_cuda_args() {
  if [ -n "${CUDAToolkit_ROOT:-}" ] || command -v nvcc >/dev/null; then
    echo "-DHIXL_WITH_CUDA=ON"
  elif [ -d /usr/local/cuda/include ]; then
    echo "-DHIXL_WITH_CUDA=ON -DCUDAToolkit_ROOT=/usr/local/cuda"
  else
    return 1
  fi
}
