# Sourced by scripts/test.sh and scripts/stress.sh: the sanitizers' options.
#   hixl_test_env ROOT FLAVOUR     (FLAVOUR: release, asan or tsan)
hixl_test_env() {
  local root="$1" flavour="$2"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/tsan_ucx.supp"
  if [ "$flavour" != release ]; then
    # UCX's own signal handlers and malloc/mmap hooks fight the sanitizers.
    # LeakSanitizer also reports what UCX keeps of its own at exit (tests/lsan_ucx.supp).
    export UCX_HANDLE_ERRORS=none UCX_MEM_MALLOC_HOOKS=n UCX_MEM_MMAP_HOOK_MODE=none
    export LSAN_OPTIONS="suppressions=$root/tests/lsan_ucx.supp"
  fi
}
