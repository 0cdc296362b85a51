// The CUDA driver, loaded at run time (see cuda.h).
#include "device/cuda.h"

#include <cstdio>

#ifndef HIXL_HAVE_CUDA

namespace hixl::device {
namespace {
Status NoCuda() {
  return Status::Unsupported(
      "device memory needs a build with CUDA (HIXL_WITH_CUDA=ON); this build has host memory "
      "only");
}
}  // namespace
Status Available() { return NoCuda(); }
bool DriverLoaded() { return false; }
Status Query(uintptr_t, PtrInfo& out) {
  out = PtrInfo{};
  return NoCuda();
}
Status Alloc(size_t, uintptr_t&) { return NoCuda(); }
Status Free(uintptr_t) { return NoCuda(); }
Status Copy(void*, const void*, size_t, int, const StreamEvent&) { return NoCuda(); }
Status RecordOn(void*, StreamEvent&) { return NoCuda(); }
Status WaitOnCpu(const StreamEvent& ev) { return ev ? NoCuda() : Status::Ok(); }
Status IpcExport(uintptr_t, int, std::string&) { return NoCuda(); }
Status IpcOpen(const std::string&, const Uuid&, uintptr_t&, int&) { return NoCuda(); }
Status IpcClose(uintptr_t, int) { return NoCuda(); }
Status VmmProbe(uintptr_t, int, bool& vmm, bool& exportable, std::string&) {
  vmm = exportable = false;
  return NoCuda();
}
Status VmmExport(uintptr_t, int, int&) { return NoCuda(); }
Status VmmImport(int, size_t, const Uuid&, uintptr_t&, int&) { return NoCuda(); }
Status VmmClose(uintptr_t, size_t, int) { return NoCuda(); }
}  // namespace hixl::device

#else  // HIXL_HAVE_CUDA

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace hixl::device {
namespace {

// Every entry point at the ABI of the version named in its typedef; they are
// resolved with cuGetProcAddress_v2 asking for driver API 12.0, which selects
// those ABIs (a plain dlsym of "cuMemAlloc" would give the 32-bit one).
constexpr int kAbiVersion = 12000;

struct Api {
  PFN_cuGetErrorName_v6000 GetErrorName = nullptr;
  PFN_cuInit_v2000 Init = nullptr;
  PFN_cuDeviceGetCount_v2000 DeviceGetCount = nullptr;
  PFN_cuDeviceGet_v2000 DeviceGet = nullptr;
  PFN_cuDeviceGetUuid_v11040 DeviceGetUuid = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 PrimaryCtxRetain = nullptr;
  PFN_cuCtxSetCurrent_v4000 CtxSetCurrent = nullptr;
  PFN_cuCtxGetCurrent_v4000 CtxGetCurrent = nullptr;
  PFN_cuPointerGetAttributes_v7000 PointerGetAttributes = nullptr;
  PFN_cuMemAlloc_v3020 MemAlloc = nullptr;
  PFN_cuMemFree_v3020 MemFree = nullptr;
  PFN_cuMemcpyAsync_v4000 MemcpyAsync = nullptr;
  PFN_cuStreamCreate_v2000 StreamCreate = nullptr;
  PFN_cuStreamSynchronize_v2000 StreamSynchronize = nullptr;
  PFN_cuStreamWaitEvent_v3020 StreamWaitEvent = nullptr;
  PFN_cuEventCreate_v2000 EventCreate = nullptr;
  PFN_cuEventRecord_v2000 EventRecord = nullptr;
  PFN_cuEventSynchronize_v2000 EventSynchronize = nullptr;
  PFN_cuEventDestroy_v4000 EventDestroy = nullptr;
  PFN_cuIpcGetMemHandle_v4010 IpcGetMemHandle = nullptr;
  PFN_cuIpcOpenMemHandle_v11000 IpcOpenMemHandle = nullptr;
  PFN_cuIpcCloseMemHandle_v4010 IpcCloseMemHandle = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 MemRetainAllocationHandle = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 MemGetAllocationPropertiesFromHandle = nullptr;
  PFN_cuMemRelease_v10020 MemRelease = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle = nullptr;
  PFN_cuMemAddressReserve_v10020 MemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 MemAddressFree = nullptr;
  PFN_cuMemMap_v10020 MemMap = nullptr;
  PFN_cuMemUnmap_v10020 MemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 MemSetAccess = nullptr;
};

const char* DriverPath() {
  const char* p = std::getenv("HIXL_CUDA_DRIVER");
  return (p != nullptr && *p != '\0') ? p : "libcuda.so.1";
}

class Driver {
 public:
  // OK once the driver is loaded, initialized and has a device.
  Status Ready() {
    std::lock_guard<std::mutex> lock(mu_);
    if (tried_) {
      if (pid_ != getpid() && status_.ok()) {
        return Status::Unsupported(
            "CUDA was initialized in this process's parent before fork; a forked child cannot "
            "use the driver (start the child with exec, or touch device memory only after fork)");
      }
      return status_;
    }
    tried_ = true;
    pid_ = getpid();
    status_ = Load();
    if (status_.ok()) loaded_.store(true, std::memory_order_release);
    return status_;
  }

  // Asked before every transfer while no device memory is registered: the
  // answer "loaded" is kept, "not loaded" looked at again at most every
  // 100 ms (a dlopen probe takes the loader's lock).
  bool Loaded() {
    if (loaded_.load(std::memory_order_acquire)) return true;
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t last = last_probe_ms_.load(std::memory_order_relaxed);
    if (last != 0 && now - last < 100) return false;
    if (!last_probe_ms_.compare_exchange_strong(last, now)) return false;
    void* h = dlopen(DriverPath(), RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) return false;
    dlclose(h);
    loaded_.store(true, std::memory_order_release);
    return true;
  }

  const Api& api() const { return api_; }
  int count() const { return count_; }
  const Uuid& uuid(int ordinal) const { return uuids_[static_cast<size_t>(ordinal)]; }

  int OrdinalOf(const Uuid& u) const {
    for (int i = 0; i < count_; ++i) {
      if (uuids_[static_cast<size_t>(i)] == u) return i;
    }
    return -1;
  }

  // The device's primary context, retained on first use and kept.
  Status Primary(int ordinal, CUcontext& out) {
    if (ordinal < 0 || ordinal >= count_) {
      return Status::ParamInvalid("CUDA device ordinal " + std::to_string(ordinal) +
                                  " is not one of this process's " + std::to_string(count_));
    }
    std::lock_guard<std::mutex> lock(mu_);
    CUcontext& c = primary_[static_cast<size_t>(ordinal)];
    if (c == nullptr) {
      CUdevice dev = 0;
      CUresult r = api_.DeviceGet(&dev, ordinal);
      if (r == CUDA_SUCCESS) r = api_.PrimaryCtxRetain(&c, dev);
      if (r != CUDA_SUCCESS) {
        c = nullptr;
        return Error("cuDevicePrimaryCtxRetain", r);
      }
    }
    out = c;
    return Status::Ok();
  }

  // A non-blocking stream of device ordinal from the pool (made when none is
  // free); the caller's thread has that device's context current.
  Status TakeStream(int ordinal, CUstream& out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& pool = streams_[static_cast<size_t>(ordinal)];
      if (!pool.empty()) {
        out = pool.back();
        pool.pop_back();
        return Status::Ok();
      }
    }
    CUresult r = api_.StreamCreate(&out, CU_STREAM_NON_BLOCKING);
    return r == CUDA_SUCCESS ? Status::Ok() : Error("cuStreamCreate", r);
  }
  void GiveStream(int ordinal, CUstream s) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_[static_cast<size_t>(ordinal)].push_back(s);
  }

  Status Error(const char* call, CUresult r) const {
    const char* name = nullptr;
    if (api_.GetErrorName == nullptr || api_.GetErrorName(r, &name) != CUDA_SUCCESS ||
        name == nullptr) {
      name = "unknown error";
    }
    return Status::Failed(std::string(call) + " failed: " + name + " (" +
                          std::to_string(static_cast<int>(r)) + ")");
  }

 private:
  template <typename F>
  Status Resolve(PFN_cuGetProcAddress_v12000 gpa, const char* name, F& fn) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = gpa(name, &p, kAbiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r == CUDA_ERROR_STUB_LIBRARY) return Stub();
    if (r != CUDA_SUCCESS || p == nullptr || found != CU_GET_PROC_ADDRESS_SUCCESS) {
      return Status::Unsupported(std::string("the CUDA driver ") + DriverPath() + " has no " +
                                 name + " at API version " + std::to_string(kAbiVersion) +
                                 " (too old a driver)");
    }
    fn = reinterpret_cast<F>(p);
    return Status::Ok();
  }

  static Status Stub() {
    return Status::Unsupported(std::string("the CUDA driver ") + DriverPath() +
                               " is the toolkit's stub library: no real driver is installed on "
                               "this host");
  }

  Status Load() {
    const char* path = DriverPath();
    lib_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      const char* e = dlerror();
      return Status::Unsupported(std::string("no CUDA driver: cannot load ") + path + " (" +
                                 (e ? e : "unknown error") +
                                 "); set HIXL_CUDA_DRIVER to the driver library's path");
    }
    auto gpa = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib_, "cuGetProcAddress_v2"));
    if (gpa == nullptr) {
      return Status::Unsupported(std::string("the CUDA driver ") + path +
                                 " is older than CUDA 12 (no cuGetProcAddress_v2)");
    }
    Status s;
    auto need = [&](const char* name, auto& fn) {
      if (s.ok()) s = Resolve(gpa, name, fn);
    };
    need("cuGetErrorName", api_.GetErrorName);
    need("cuInit", api_.Init);
    need("cuDeviceGetCount", api_.DeviceGetCount);
    need("cuDeviceGet", api_.DeviceGet);
    need("cuDeviceGetUuid", api_.DeviceGetUuid);
    need("cuDevicePrimaryCtxRetain", api_.PrimaryCtxRetain);
    need("cuCtxSetCurrent", api_.CtxSetCurrent);
    need("cuCtxGetCurrent", api_.CtxGetCurrent);
    need("cuPointerGetAttributes", api_.PointerGetAttributes);
    need("cuMemAlloc", api_.MemAlloc);
    need("cuMemFree", api_.MemFree);
    need("cuMemcpyAsync", api_.MemcpyAsync);
    need("cuStreamCreate", api_.StreamCreate);
    need("cuStreamSynchronize", api_.StreamSynchronize);
    need("cuStreamWaitEvent", api_.StreamWaitEvent);
    need("cuEventCreate", api_.EventCreate);
    need("cuEventRecord", api_.EventRecord);
    need("cuEventSynchronize", api_.EventSynchronize);
    need("cuEventDestroy", api_.EventDestroy);
    need("cuIpcGetMemHandle", api_.IpcGetMemHandle);
    need("cuIpcOpenMemHandle", api_.IpcOpenMemHandle);
    need("cuIpcCloseMemHandle", api_.IpcCloseMemHandle);
    need("cuMemRetainAllocationHandle", api_.MemRetainAllocationHandle);
    need("cuMemGetAllocationPropertiesFromHandle", api_.MemGetAllocationPropertiesFromHandle);
    need("cuMemRelease", api_.MemRelease);
    need("cuMemExportToShareableHandle", api_.MemExportToShareableHandle);
    need("cuMemImportFromShareableHandle", api_.MemImportFromShareableHandle);
    need("cuMemAddressReserve", api_.MemAddressReserve);
    need("cuMemAddressFree", api_.MemAddressFree);
    need("cuMemMap", api_.MemMap);
    need("cuMemUnmap", api_.MemUnmap);
    need("cuMemSetAccess", api_.MemSetAccess);
    if (!s.ok()) return s;
    CUresult r = api_.Init(0);
    if (r == CUDA_ERROR_STUB_LIBRARY) return Stub();
    if (r == CUDA_ERROR_NO_DEVICE) {
      return Status::Unsupported(std::string("the CUDA driver ") + path +
                                 " found no device on this host");
    }
    if (r != CUDA_SUCCESS) {
      Status e = Error("cuInit", r);
      return Status::Unsupported("the CUDA driver cannot be used: " + e.message());
    }
    int n = 0;
    if ((r = api_.DeviceGetCount(&n)) != CUDA_SUCCESS) return Error("cuDeviceGetCount", r);
    if (n <= 0) {
      return Status::Unsupported(std::string("the CUDA driver ") + path +
                                 " found no device on this host");
    }
    count_ = n;
    uuids_.resize(static_cast<size_t>(n));
    primary_.assign(static_cast<size_t>(n), nullptr);
    streams_.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      CUdevice dev = 0;
      CUuuid u;
      if ((r = api_.DeviceGet(&dev, i)) != CUDA_SUCCESS) return Error("cuDeviceGet", r);
      if ((r = api_.DeviceGetUuid(&u, dev)) != CUDA_SUCCESS) return Error("cuDeviceGetUuid", r);
      std::memcpy(uuids_[static_cast<size_t>(i)].data(), u.bytes, 16);
    }
    return Status::Ok();
  }

  std::atomic<bool> loaded_{false};
  std::atomic<int64_t> last_probe_ms_{0};
  std::mutex mu_;
  bool tried_ = false;
  pid_t pid_ = 0;
  Status status_;
  void* lib_ = nullptr;  // never closed: streams and contexts outlive every caller
  Api api_;
  int count_ = 0;
  std::vector<Uuid> uuids_;
  std::vector<CUcontext> primary_;
  std::vector<std::vector<CUstream>> streams_;
};

Driver& D() {
  static Driver* d = new Driver;  // never destroyed: threads may call in at exit
  return *d;
}

// Makes device ordinal's primary context current on this thread for the
// scope, and puts back what the thread had (an application thread's own
// context is left as it found it).
class ScopedContext {
 public:
  // Any context: the thread's own when it has one (no device's context is
  // created for a question any context answers), else device 0's.
  struct Any {};
  explicit ScopedContext(Any) {
    CUcontext cur = nullptr;
    if (D().api().CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != nullptr) return;
    *this = ScopedContext(0);
  }
  explicit ScopedContext(int ordinal) {
    CUcontext want = nullptr;
    if (Status s = D().Primary(ordinal, want); !s.ok()) {
      status_ = s;
      return;
    }
    const Api& a = D().api();
    CUresult r = a.CtxGetCurrent(&prev_);
    if (r != CUDA_SUCCESS) {
      status_ = D().Error("cuCtxGetCurrent", r);
      return;
    }
    if (prev_ != want) {
      if ((r = a.CtxSetCurrent(want)) != CUDA_SUCCESS) {
        status_ = D().Error("cuCtxSetCurrent", r);
        return;
      }
      restore_ = true;
    }
  }
  ~ScopedContext() {
    if (restore_) D().api().CtxSetCurrent(prev_);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  ScopedContext& operator=(ScopedContext&& o) noexcept {
    status_ = o.status_;
    prev_ = o.prev_;
    restore_ = o.restore_;
    o.restore_ = false;
    return *this;
  }
  const Status& status() const { return status_; }

 private:
  Status status_;
  CUcontext prev_ = nullptr;
  bool restore_ = false;
};

}  // namespace

Status Available() { return D().Ready(); }

bool DriverLoaded() { return D().Loaded(); }

Status Query(uintptr_t addr, PtrInfo& out) {
  out = PtrInfo{};
  if (Status s = Available(); !s.ok()) return s;
  ScopedContext ctx{ScopedContext::Any{}};
  if (!ctx.status().ok()) return ctx.status();
  unsigned int type = 0;
  int ordinal = -2;
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned long long buffer = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID};
  void* data[] = {&type, &ordinal, &start, &size, &buffer};
  CUresult r = D().api().PointerGetAttributes(5, attrs, data, static_cast<CUdeviceptr>(addr));
  if (r != CUDA_SUCCESS) return D().Error("cuPointerGetAttributes", r);
  if (type == CU_MEMORYTYPE_DEVICE) {
    if (ordinal < 0 || ordinal >= D().count()) {
      return Status::Failed("the CUDA driver put device memory at " + std::to_string(addr) +
                            " on unknown device " + std::to_string(ordinal));
    }
    out.device = true;
    out.ordinal = ordinal;
    out.uuid = D().uuid(ordinal);
    out.base = static_cast<uintptr_t>(start);
    out.size = size;
    out.buffer_id = buffer;
  } else if (type == CU_MEMORYTYPE_HOST) {
    out.pinned = true;
  }
  return Status::Ok();
}

Status Alloc(size_t n, uintptr_t& out) {
  if (Status s = Available(); !s.ok()) return s;
  const Api& a = D().api();
  CUcontext cur = nullptr;
  int ordinal = 0;
  if (a.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != nullptr) {
    for (int i = 0; i < D().count(); ++i) {  // the thread's device, when it is a primary one
      CUcontext p = nullptr;
      if (D().Primary(i, p).ok() && p == cur) ordinal = i;
    }
  }
  ScopedContext ctx(ordinal);
  if (!ctx.status().ok()) return ctx.status();
  CUdeviceptr p = 0;
  CUresult r = a.MemAlloc(&p, n);
  if (r != CUDA_SUCCESS) {
    Status e = D().Error("cuMemAlloc", r);
    return Status(r == CUDA_ERROR_OUT_OF_MEMORY ? StatusCode::kResourceExhausted
                                                : StatusCode::kFailed,
                  "allocating " + std::to_string(n) + " bytes on CUDA device " +
                      std::to_string(ordinal) + ": " + e.message());
  }
  out = static_cast<uintptr_t>(p);
  return Status::Ok();
}

Status Free(uintptr_t p) {
  if (Status s = Available(); !s.ok()) return s;
  PtrInfo info;
  if (Status s = Query(p, info); !s.ok()) return s;
  ScopedContext ctx(info.device ? info.ordinal : 0);
  if (!ctx.status().ok()) return ctx.status();
  CUresult r = D().api().MemFree(static_cast<CUdeviceptr>(p));
  return r == CUDA_SUCCESS ? Status::Ok() : D().Error("cuMemFree", r);
}

Status Copy(void* dst, const void* src, size_t n, int ordinal, const StreamEvent& after) {
  if (n == 0) return Status::Ok();
  if (Status s = Available(); !s.ok()) return s;
  ScopedContext ctx(ordinal);
  if (!ctx.status().ok()) return ctx.status();
  CUstream stream = nullptr;
  if (Status s = D().TakeStream(ordinal, stream); !s.ok()) return s;
  const Api& a = D().api();
  CUresult r = CUDA_SUCCESS;
  if (after) {
    r = a.StreamWaitEvent(stream, static_cast<CUevent>(after.get()), CU_EVENT_WAIT_DEFAULT);
    if (r != CUDA_SUCCESS) {
      D().GiveStream(ordinal, stream);
      return D().Error("cuStreamWaitEvent (the application's stream)", r);
    }
  }
  r = a.MemcpyAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), n,
                    stream);
  // Waited for even when the copy was refused: the stream then holds no
  // work of this call, and goes back to the pool clean.
  CUresult w = a.StreamSynchronize(stream);
  D().GiveStream(ordinal, stream);
  if (r != CUDA_SUCCESS) return D().Error("cuMemcpyAsync", r);
  if (w != CUDA_SUCCESS) return D().Error("a device copy", w);
  return Status::Ok();
}

Status RecordOn(void* stream, StreamEvent& out) {
  out.reset();
  if (Status s = Available(); !s.ok()) return s;
  ScopedContext ctx{ScopedContext::Any{}};
  if (!ctx.status().ok()) return ctx.status();
  const Api& a = D().api();
  CUevent ev = nullptr;
  CUresult r = a.EventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) return D().Error("cuEventCreate", r);
  // Destroying an event whose work is pending is allowed: the driver frees
  // it once that work is done. hixl's copies that wait for it have ended by
  // then (each is synchronized before its transfer part ends).
  StreamEvent held(static_cast<void*>(ev), [](void* e) {
    ScopedContext c{ScopedContext::Any{}};
    D().api().EventDestroy(static_cast<CUevent>(e));
  });
  r = a.EventRecord(ev, static_cast<CUstream>(stream));
  if (r != CUDA_SUCCESS) return D().Error("cuEventRecord (TransferArgs::stream)", r);
  out = std::move(held);
  return Status::Ok();
}

Status WaitOnCpu(const StreamEvent& ev) {
  if (!ev) return Status::Ok();
  if (Status s = Available(); !s.ok()) return s;
  ScopedContext ctx{ScopedContext::Any{}};
  if (!ctx.status().ok()) return ctx.status();
  CUresult r = D().api().EventSynchronize(static_cast<CUevent>(ev.get()));
  return r == CUDA_SUCCESS ? Status::Ok() : D().Error("cuEventSynchronize", r);
}

Status IpcExport(uintptr_t base, int ordinal, std::string& handle) {
  if (Status s = Available(); !s.ok()) return s;
  ScopedContext ctx(ordinal);
  if (!ctx.status().ok()) return ctx.status();
  CUipcMemHandle h;
  CUresult r = D().api().IpcGetMemHandle(&h, static_cast<CUdeviceptr>(base));
  if (r != CUDA_SUCCESS) return D().Error("cuIpcGetMemHandle", r);
  handle.assign(reinterpret_cast<const char*>(h.reserved), sizeof(h.reserved));
  return Status::Ok();
}

Status IpcOpen(const std::string& handle, const Uuid& uuid, uintptr_t& base, int& ordinal) {
  if (Status s = Available(); !s.ok()) return s;
  CUipcMemHandle h;
  if (handle.size() != sizeof(h.reserved)) {
    return Status::ParamInvalid("a CUDA IPC handle has " + std::to_string(sizeof(h.reserved)) +
                                " bytes, not " + std::to_string(handle.size()));
  }
  ordinal = D().OrdinalOf(uuid);
  if (ordinal < 0) {
    return Status::Unsupported("the peer's CUDA device " + UuidString(uuid) +
                               " is not visible in this process");
  }
  ScopedContext ctx(ordinal);
  if (!ctx.status().ok()) return ctx.status();
  std::memcpy(h.reserved, handle.data(), sizeof(h.reserved));
  CUdeviceptr p = 0;
  CUresult r = D().api().IpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) return D().Error("cuIpcOpenMemHandle", r);
  base = static_cast<uintptr_t>(p);
  return Status::Ok();
}

Status IpcClose(uintptr_t base, int ordinal) {
  if (Status s = Available(); !s.ok()) return s;
  ScopedContext ctx(ordinal);
  if (!ctx.status().ok()) return ctx.status();
  CUresult r = D().api().IpcCloseMemHandle(static_cast<CUdeviceptr>(base));
  return r == CUDA_SUCCESS ? Status::Ok() : D().Error("cuIpcCloseMemHandle", r);
}

Status VmmProbe(uintptr_t base, int ordinal, bool& vmm, bool& exportable, std::string& why_not) {
  vmm = exportable = false;
  why_not.clear();
  if (Status s = Available(); !s.ok()) return s;
  ScopedContext ctx(ordinal);
  if (!ctx.status().ok()) return ctx.status();
  const Api& a = D().api();
  CUmemGenericAllocationHandle h = 0;
  // Refused for memory of cuMemAlloc: not VMM memory.
  if (a.MemRetainAllocationHandle(&h, reinterpret_cast<void*>(base)) != CUDA_SUCCESS) {
    return Status::Ok();
  }
  vmm = true;
  CUmemAllocationProp prop{};
  CUresult r = a.MemGetAllocationPropertiesFromHandle(&prop, h);
  a.MemRelease(h);
  if (r != CUDA_SUCCESS) return D().Error("cuMemGetAllocationPropertiesFromHandle", r);
  exportable = (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  if (!exportable) {
    why_not =
        "it is cuMemCreate memory created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in "
        "its requestedHandleTypes, so no other process can open it (create it with that "
        "handle type, or use cuMemAlloc memory)";
  }
  return Status::Ok();
}

Status VmmExport(uintptr_t base, int ordinal, int& fd) {
  fd = -1;
  if (Status s = Available(); !s.ok()) return s;
  ScopedContext ctx(ordinal);
  if (!ctx.status().ok()) return ctx.status();
  const Api& a = D().api();
  CUmemGenericAllocationHandle h = 0;
  CUresult r = a.MemRetainAllocationHandle(&h, reinterpret_cast<void*>(base));
  if (r != CUDA_SUCCESS) return D().Error("cuMemRetainAllocationHandle", r);
  int out = -1;
  r = a.MemExportToShareableHandle(&out, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  a.MemRelease(h);
  if (r != CUDA_SUCCESS) return D().Error("cuMemExportToShareableHandle", r);
  fd = out;
  return Status::Ok();
}

Status VmmImport(int fd, size_t size, const Uuid& uuid, uintptr_t& base, int& ordinal) {
  base = 0;
  if (Status s = Available(); !s.ok()) return s;
  ordinal = D().OrdinalOf(uuid);
  if (ordinal < 0) {
    return Status::Unsupported("the peer's CUDA device " + UuidString(uuid) +
                               " is not visible in this process");
  }
  ScopedContext ctx(ordinal);
  if (!ctx.status().ok()) return ctx.status();
  const Api& a = D().api();
  CUmemGenericAllocationHandle h = 0;
  CUresult r = a.MemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return D().Error("cuMemImportFromShareableHandle", r);
  CUdeviceptr p = 0;
  const char* step = "cuMemAddressReserve";
  r = a.MemAddressReserve(&p, size, 0, 0, 0);
  if (r == CUDA_SUCCESS) {
    step = "cuMemMap";
    r = a.MemMap(p, size, 0, h, 0);
    if (r == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = ordinal;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      step = "cuMemSetAccess";
      r = a.MemSetAccess(p, size, &access, 1);
      if (r != CUDA_SUCCESS) a.MemUnmap(p, size);
    }
    if (r != CUDA_SUCCESS) a.MemAddressFree(p, size);
  }
  a.MemRelease(h);  // the mapping holds the memory from here on
  if (r != CUDA_SUCCESS) return D().Error(step, r);
  base = static_cast<uintptr_t>(p);
  return Status::Ok();
}

Status VmmClose(uintptr_t base, size_t size, int ordinal) {
  if (Status s = Available(); !s.ok()) return s;
  ScopedContext ctx(ordinal);
  if (!ctx.status().ok()) return ctx.status();
  const Api& a = D().api();
  CUresult r = a.MemUnmap(static_cast<CUdeviceptr>(base), size);
  if (r != CUDA_SUCCESS) return D().Error("cuMemUnmap", r);
  r = a.MemAddressFree(static_cast<CUdeviceptr>(base), size);
  return r == CUDA_SUCCESS ? Status::Ok() : D().Error("cuMemAddressFree", r);
}

}  // namespace hixl::device

#endif  // HIXL_HAVE_CUDA

namespace hixl::device {
std::string UuidString(const Uuid& u) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    std::snprintf(b, sizeof(b), "%02x", u[i]);
    s += b;
  }
  return "GPU-" + s;
}
}  // namespace hixl::device
