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
#if __has_include(<cuda.h>)
#include <cuda.h>  // only to check the layouts declared below
#endif

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
  // Device memory made the way PyTorch's expandable segments and the memory
  // savers of vLLM and SGLang make it ("VMM": cuMemCreate, cuMemAddressReserve,
  // cuMemMap, cuMemSetAccess), n bytes rounded up to the driver's granularity
  // (*size receives it); fd_shareable: created with
  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, so other processes can open it.
  // 0 on failure. Released with FreeVmm(p, *size).
  uintptr_t AllocVmm(size_t n, bool fd_shareable, size_t* size) {
    if (!Current() || !vmm_ok_) return 0;
    MemProp prop{};
    prop.type = 1;                                 // CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requested_handle_types = fd_shareable ? 1 : 0;  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location = {1, 0};                        // CU_MEM_LOCATION_TYPE_DEVICE, device 0
    size_t g = 0;
    if (granularity_(&g, &prop, 0) != 0 || g == 0) return 0;
    const size_t total = (n + g - 1) / g * g;
    unsigned long long h = 0, p = 0;
    if (create_(&h, total, &prop, 0) != 0) return 0;
    bool ok = reserve_(&p, total, 0, 0, 0) == 0;
    if (ok && map_(p, total, 0, h, 0) != 0) {
      address_free_(p, total);
      ok = false;
    }
    release_(h);  // the mapping keeps the memory
    AccessDesc access{{1, 0}, 3};  // device 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    if (ok && set_access_(p, total, &access, 1) != 0) {
      FreeVmm(p, total);
      ok = false;
    }
    if (!ok) return 0;
    *size = total;
    return static_cast<uintptr_t>(p);
  }
  bool FreeVmm(uintptr_t p, size_t size) {
    return Current() && vmm_ok_ && unmap_(p, size) == 0 && address_free_(p, size) == 0;
  }
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
    // Optional: VMM memory for the tests that need it.
    vmm_ok_ = get("cuMemCreate", create_) && get("cuMemRelease", release_) &&
              get("cuMemAddressReserve", reserve_) && get("cuMemAddressFree", address_free_) &&
              get("cuMemMap", map_) && get("cuMemUnmap", unmap_) &&
              get("cuMemSetAccess", set_access_) &&
              get("cuMemGetAllocationGranularity", granularity_);
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
  // The layouts of CUmemLocation, CUmemAllocationProp and CUmemAccessDesc.
  struct MemLocation {
    int type;
    int id;
  };
  struct MemProp {
    int type;
    int requested_handle_types;
    MemLocation location;
    void* win32_handle_meta_data;
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
  };
  struct AccessDesc {
    MemLocation location;
    int flags;
  };
#if __has_include(<cuda.h>)
  static_assert(sizeof(MemProp) == sizeof(CUmemAllocationProp) &&
                    offsetof(MemProp, location) == offsetof(CUmemAllocationProp, location) &&
                    offsetof(MemProp, win32_handle_meta_data) ==
                        offsetof(CUmemAllocationProp, win32HandleMetaData) &&
                    sizeof(AccessDesc) == sizeof(CUmemAccessDesc),
                "the driver's structure layouts");
#endif
  bool vmm_ok_ = false;
  int (*create_)(unsigned long long*, size_t, const MemProp*, unsigned long long) = nullptr;
  int (*release_)(unsigned long long) = nullptr;
  int (*reserve_)(unsigned long long*, size_t, size_t, unsigned long long,
                  unsigned long long) = nullptr;
  int (*address_free_)(unsigned long long, size_t) = nullptr;
  int (*map_)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long) = nullptr;
  int (*unmap_)(unsigned long long, size_t) = nullptr;
  int (*set_access_)(unsigned long long, size_t, const AccessDesc*, size_t) = nullptr;
  int (*granularity_)(size_t*, const MemProp*, int) = nullptr;
};

}  // namespace hixl::device

#endif  // HIXL_DEVICE_DRIVER_CLIENT_H_
