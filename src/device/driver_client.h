// A second, minimal client of the CUDA driver for hixl's tests and tools
// (the library itself never uses it): it loads the driver HIXL_CUDA_DRIVER
// names (default libcuda.so.1) and fills, reads, allocates and frees device
// memory with synchronous driver calls. Independent of src/device/cuda.cc on
// purpose: tests check hixl's copies, and the bench times its baselines,
// through a path of their own.
//
// Declares the few driver signatures it uses itself (no CUDA headers needed).
// Thread safety: Get() is thread-safe; every call makes device 0's primary
// context current on the calling thread first. Ownership: the library stays
// loaded until the process exits.
#ifndef HIXL_DEVICE_DRIVER_CLIENT_H_
#define HIXL_DEVICE_DRIVER_CLIENT_H_

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace hixl::device {

class DriverClient {
 public:
  // The driver HIXL_CUDA_DRIVER names (default libcuda.so.1), loaded and
  // initialized once.
  static DriverClient& Get() {
    static DriverClient* c = new DriverClient;
    return *c;
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }

  bool Copy(void* dst, const void* src, size_t n) {
    return Current() &&
           memcpy_(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), n) == 0;
  }
  uintptr_t Alloc(size_t n) {
    unsigned long long p = 0;
    if (!Current() || alloc_(&p, n) != 0) return 0;
    return static_cast<uintptr_t>(p);
  }
  bool Free(uintptr_t p) { return Current() && free_(p) == 0; }
  // A stream of the application's kind (nullptr on failure), a copy queued
  // on it (returns before the copy ran), waiting for it, destroying it.
  void* NewStream() {
    void* s = nullptr;
    return Current() && stream_create_(&s, 0) == 0 ? s : nullptr;
  }
  bool CopyAsync(void* dst, const void* src, size_t n, void* stream) {
    return Current() && memcpy_async_(reinterpret_cast<uintptr_t>(dst),
                                      reinterpret_cast<uintptr_t>(src), n, stream) == 0;
  }
  bool Sync(void* stream) { return Current() && stream_sync_(stream) == 0; }
  bool DestroyStream(void* stream) { return Current() && stream_destroy_(stream) == 0; }
  // A function the library exports by name (the fake driver's controls).
  void* Symbol(const char* name) const { return lib_ ? dlsym(lib_, name) : nullptr; }

 private:
  using GetProc = int (*)(const char*, void**, int, unsigned long long, int*);
  DriverClient() {
    const char* path = std::getenv("HIXL_CUDA_DRIVER");
    if (path == nullptr || *path == '\0') path = "libcuda.so.1";
    lib_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      error_ = std::string("cannot load ") + path;
      return;
    }
    auto gpa = reinterpret_cast<GetProc>(dlsym(lib_, "cuGetProcAddress_v2"));
    if (gpa == nullptr) {
      error_ = "no cuGetProcAddress_v2";
      return;
    }
    auto get = [&](const char* name, auto& fn) {
      void* p = nullptr;
      int found = 0;
      if (gpa(name, &p, 12000, 0, &found) != 0 || p == nullptr) return false;
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      return true;
    };
    if (!get("cuInit", init_) || !get("cuDeviceGet", device_get_) ||
        !get("cuDevicePrimaryCtxRetain", retain_) || !get("cuCtxSetCurrent", set_current_) ||
        !get("cuMemcpy", memcpy_) || !get("cuMemAlloc", alloc_) || !get("cuMemFree", free_) ||
        !get("cuStreamCreate", stream_create_) || !get("cuMemcpyAsync", memcpy_async_) ||
        !get("cuStreamSynchronize", stream_sync_) || !get("cuStreamDestroy", stream_destroy_)) {
      error_ = "the driver lacks an entry point this client uses";
      return;
    }
    int dev = 0;
    if (init_(0) != 0 || device_get_(&dev, 0) != 0 || retain_(&ctx_, dev) != 0) {
      error_ = "the driver has no usable device";
      return;
    }
    ok_ = true;
  }
  bool Current() { return ok_ && set_current_(ctx_) == 0; }

  void* lib_ = nullptr;
  bool ok_ = false;
  std::string error_;
  void* ctx_ = nullptr;
  int (*init_)(unsigned) = nullptr;
  int (*device_get_)(int*, int) = nullptr;
  int (*retain_)(void**, int) = nullptr;
  int (*set_current_)(void*) = nullptr;
  int (*memcpy_)(unsigned long long, unsigned long long, size_t) = nullptr;
  int (*alloc_)(unsigned long long*, size_t) = nullptr;
  int (*free_)(unsigned long long) = nullptr;
  int (*stream_create_)(void**, unsigned) = nullptr;
  int (*memcpy_async_)(unsigned long long, unsigned long long, size_t, void*) = nullptr;
  int (*stream_sync_)(void*) = nullptr;
  int (*stream_destroy_)(void*) = nullptr;
};

}  // namespace hixl::device

#endif  // HIXL_DEVICE_DRIVER_CLIENT_H_
