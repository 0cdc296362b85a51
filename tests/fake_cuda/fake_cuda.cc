// A fake CUDA driver for hixl's tests: a shared library loaded in place of
// libcuda.so.1 on machines without a GPU. Like the real driver it is reached
// only through cuGetProcAddress_v2, so the code under test resolves and calls
// its entry points exactly as it would with a GPU.
//
// Device memory is a memfd mapped twice: PROT_NONE at the address handed out
// as the device pointer (a CPU load or store through it faults, as on a
// discrete GPU), and read-write at an alias only the fake's copies use.
// Another process maps the same memfd through /proc/<pid>/fd/<fd>, which is
// what an IPC handle names. Each stream is a worker thread that runs copies,
// event records and event waits in the order they were queued.
//
// Environment variables and test controls: fake_cuda_control.h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "fake_cuda_control.h"
#include "fake_cuda_internal.h"

namespace hixl_fake_cuda {

std::atomic<pid_t> g_init_pid{0};
std::atomic<bool> g_shut_down{false};
std::atomic<unsigned> g_copy_delay_us{0};
std::atomic<long long> g_copy_budget{-1};
std::atomic<long long> g_copies{0};
std::atomic<long long> g_bytes_copied{0};
// Initial-exec: a few bytes of the static TLS block, taken when the library
// is loaded, rather than dynamic TLS (whose ranges LeakSanitizer's exit
// scan misreads in this toolchain and faults on).
__attribute__((tls_model("initial-exec"))) thread_local Context* t_current = nullptr;

namespace {

constexpr int kDriverVersion = 13000;
// Larger requests fail with CUDA_ERROR_OUT_OF_MEMORY before any size
// arithmetic can overflow.
constexpr size_t kMaxBytes = size_t{1} << 46;
constexpr char kIpcMagic[8] = {'h', 'i', 'x', 'l', 'f', 'i', 'p', 'c'};

std::atomic<int> g_live_allocs{0};
std::atomic<int> g_live_ipc{0};
// Serialises cuInit; never held by anything else.
std::mutex g_init_mu;

// What an IPC handle carries; the rest of its 64 bytes are zero.
struct IpcPayload {
  char magic[8];
  int32_t pid;  // the owner
  int32_t fd;   // the owner's memfd, opened by peers as /proc/<pid>/fd/<fd>
  uint64_t size;
  uint64_t serial;  // names the memfd, so a freed buffer's handle is refused
};
static_assert(sizeof(IpcPayload) <= CU_IPC_HANDLE_SIZE);

size_t RoundUpToPage(size_t n) { return (n + kPageSize - 1) / kPageSize * kPageSize; }

std::string MemfdName(pid_t pid, unsigned long long serial) {
  return "hixl-fake-cuda-" + std::to_string(pid) + "-" + std::to_string(serial);
}

// True when the link target of a memfd (or of /proc/<pid>/fd/<fd>) is the
// memfd called `name`: "/memfd:<name>", with " (deleted)" after it.
bool NamesMemfd(const std::string& target, const std::string& name) {
  const std::string want = "/memfd:" + name;
  return target.compare(0, want.size(), want) == 0 &&
         (target.size() == want.size() || target[want.size()] == ' ');
}

std::string ReadLink(const std::string& path) {
  char buf[512];
  const ssize_t n = readlink(path.c_str(), buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Parses all of `text` as an integer in [lo, hi].
bool ParseInt(const char* text, long long lo, long long hi, long long* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Maps the memfd twice: PROT_NONE for the device pointer, read-write for the
// alias. On failure the caller's DevMapping unmaps whatever was mapped.
CUresult MapTwice(int fd, DevMapping* m) {
  void* base = mmap(nullptr, m->mapped, PROT_NONE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  m->base = reinterpret_cast<uintptr_t>(base);
  void* alias = mmap(nullptr, m->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (alias == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  m->alias = static_cast<char*>(alias);
  return CUDA_SUCCESS;
}

// The device mapping whose requested bytes hold p, or nullptr.
const std::shared_ptr<DevMapping>* FindDevice(State& s, uintptr_t p) {
  auto it = s.device.upper_bound(p);
  if (it == s.device.begin()) return nullptr;
  --it;
  return p < it->first + it->second->size ? &it->second : nullptr;
}

// The pinned or registered host range holding p, or end().
std::map<uintptr_t, HostRange>::iterator FindHost(State& s, uintptr_t p) {
  auto it = s.host.upper_bound(p);
  if (it == s.host.begin()) return s.host.end();
  --it;
  return p < it->first + it->second.size ? it : s.host.end();
}

CUcontext ContextOf(State& s, int ordinal) { return ToHandle(&s.contexts[ordinal]); }

// ----------------------------------------------------------------------------
// Errors

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

#define FAKE_CUDA_ERROR(code, text) \
  { code, #code, text }
constexpr ErrorText kErrors[] = {
    FAKE_CUDA_ERROR(CUDA_SUCCESS, "no error"),
    FAKE_CUDA_ERROR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    FAKE_CUDA_ERROR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    FAKE_CUDA_ERROR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    FAKE_CUDA_ERROR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    FAKE_CUDA_ERROR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    FAKE_CUDA_ERROR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    FAKE_CUDA_ERROR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    FAKE_CUDA_ERROR(CUDA_ERROR_OPERATING_SYSTEM,
                    "OS call failed or operation not supported on this OS"),
    FAKE_CUDA_ERROR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    FAKE_CUDA_ERROR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    FAKE_CUDA_ERROR(CUDA_ERROR_NOT_READY, "device not ready"),
    FAKE_CUDA_ERROR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    FAKE_CUDA_ERROR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    FAKE_CUDA_ERROR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    FAKE_CUDA_ERROR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                    "part or all of the requested memory range is already mapped"),
    FAKE_CUDA_ERROR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                    "pointer does not correspond to a registered memory region"),
    FAKE_CUDA_ERROR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    FAKE_CUDA_ERROR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    FAKE_CUDA_ERROR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    FAKE_CUDA_ERROR(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef FAKE_CUDA_ERROR

const ErrorText* FindError(CUresult code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

CUresult GetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = FindError(error);
  *str = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult GetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = FindError(error);
  *str = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ----------------------------------------------------------------------------
// Initialisation, devices and contexts

// Reads HIXL_FAKE_CUDA_DEVICES and HIXL_FAKE_CUDA_VISIBLE into s.
CUresult ReadDevices(State& s) {
  long long physical = 1;
  if (const char* v = std::getenv("HIXL_FAKE_CUDA_DEVICES")) {
    if (!ParseInt(v, 0, kMaxDevices, &physical)) return CUDA_ERROR_INVALID_VALUE;
  }
  int count = 0;
  if (const char* v = std::getenv("HIXL_FAKE_CUDA_VISIBLE")) {
    // Like CUDA_VISIBLE_DEVICES: the devices listed, in that order, up to the
    // first entry that is malformed, out of range or listed already.
    std::string list(v);
    bool seen[kMaxDevices] = {};
    size_t pos = 0;
    while (count < kMaxDevices) {
      const size_t comma = list.find(',', pos);
      const std::string item = list.substr(pos, comma - pos);
      long long index = 0;
      if (!ParseInt(item.c_str(), 0, physical - 1, &index) || seen[index]) break;
      seen[index] = true;
      s.physical[count++] = static_cast<int>(index);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  } else {
    for (; count < physical; ++count) s.physical[count] = count;
  }
  if (count == 0) return CUDA_ERROR_NO_DEVICE;
  s.device_count = count;
  for (int i = 0; i < count; ++i) s.contexts[i].ordinal = i;
  return CUDA_SUCCESS;
}

CUresult Init(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const pid_t self = getpid();
  pid_t owner = g_init_pid.load(std::memory_order_acquire);
  // A child forked from an initialised process cannot use the driver, as
  // with real CUDA; it must not touch the locks either, which another thread
  // of its parent may have held at the fork.
  if (owner != 0 && owner != self) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard lock(g_init_mu);
  owner = g_init_pid.load(std::memory_order_acquire);
  if (owner == self) {
    return g_shut_down.load(std::memory_order_acquire) ? CUDA_ERROR_DEINITIALIZED : CUDA_SUCCESS;
  }
  long long delay = 0;
  const char* delay_env = std::getenv("HIXL_FAKE_CUDA_COPY_DELAY_US");
  if (delay_env != nullptr && !ParseInt(delay_env, 0, 60'000'000, &delay)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  long long fail_after = -1;
  const char* fail_env = std::getenv("HIXL_FAKE_CUDA_FAIL_COPY_AFTER");
  if (fail_env != nullptr && !ParseInt(fail_env, -1, INT64_MAX, &fail_after)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = GetState();
  {
    std::lock_guard state_lock(s.mu);
    const CUresult r = ReadDevices(s);
    if (r != CUDA_SUCCESS) return r;
  }
  // Unset variables leave what the control functions set before cuInit.
  if (delay_env != nullptr) g_copy_delay_us.store(static_cast<unsigned>(delay));
  if (fail_env != nullptr) g_copy_budget.store(fail_after < 0 ? -1 : fail_after);
  g_init_pid.store(self, std::memory_order_release);
  return CUDA_SUCCESS;
}

CUresult DriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult DeviceGetCount(int* count) {
  FAKE_CUDA_TRY(CheckInit());
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = GetState().device_count;
  return CUDA_SUCCESS;
}

CUresult CheckDevice(CUdevice dev) {
  FAKE_CUDA_TRY(CheckInit());
  return dev >= 0 && dev < GetState().device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult DeviceGet(CUdevice* device, int ordinal) {
  FAKE_CUDA_TRY(CheckDevice(ordinal));
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult DeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  FAKE_CUDA_TRY(CheckDevice(dev));
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  char text[32];
  std::snprintf(text, sizeof(text), "hixlfakegpu%05d", GetState().physical[dev]);
  static_assert(sizeof(uuid->bytes) == 16);
  std::memcpy(uuid->bytes, text, sizeof(uuid->bytes));
  return CUDA_SUCCESS;
}

CUresult DevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  FAKE_CUDA_TRY(CheckDevice(dev));
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  s.contexts[dev].refs.fetch_add(1);
  *pctx = ContextOf(s, dev);
  return CUDA_SUCCESS;
}

CUresult DevicePrimaryCtxRelease(CUdevice dev) {
  FAKE_CUDA_TRY(CheckDevice(dev));
  std::atomic<int>& refs = GetState().contexts[dev].refs;
  int n = refs.load();
  do {
    if (n <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  } while (!refs.compare_exchange_weak(n, n - 1));
  return CUDA_SUCCESS;
}

CUresult CtxSetCurrent(CUcontext ctx) {
  FAKE_CUDA_TRY(CheckInit());
  if (ctx == nullptr) {
    t_current = nullptr;
    return CUDA_SUCCESS;
  }
  State& s = GetState();
  for (int i = 0; i < s.device_count; ++i) {
    if (ctx == ContextOf(s, i)) {
      t_current = &s.contexts[i];
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CtxGetCurrent(CUcontext* pctx) {
  FAKE_CUDA_TRY(CheckInit());
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = ToHandle(t_current);
  return CUDA_SUCCESS;
}

// ----------------------------------------------------------------------------
// Device memory

CUresult MemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  FAKE_CUDA_TRY(CheckContext());
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (bytesize > kMaxBytes) return CUDA_ERROR_OUT_OF_MEMORY;
  State& s = GetState();
  auto m = std::make_shared<DevMapping>();
  {
    std::lock_guard lock(s.mu);
    m->buffer_id = s.next_serial++;
  }
  m->size = bytesize;
  m->mapped = RoundUpToPage(bytesize);
  m->ordinal = t_current->ordinal;
  m->fd = memfd_create(MemfdName(getpid(), m->buffer_id).c_str(), MFD_CLOEXEC);
  if (m->fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(m->fd, static_cast<off_t>(m->mapped)) != 0 ||
      MapTwice(m->fd, m.get()) != CUDA_SUCCESS) {
    close(m->fd);  // m unmaps whatever was mapped
    m->fd = -1;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  {
    std::lock_guard lock(s.mu);
    s.device.emplace(m->base, m);
  }
  g_live_allocs.fetch_add(1);
  *dptr = m->base;
  return CUDA_SUCCESS;
}

CUresult MemFree(CUdeviceptr dptr) {
  FAKE_CUDA_TRY(CheckContext());
  State& s = GetState();
  // Unmapped when the lock is released, or later by the last queued copy
  // that still uses it.
  std::shared_ptr<DevMapping> freed;
  {
    std::lock_guard lock(s.mu);
    auto it = s.device.find(dptr);
    if (it == s.device.end() || it->second->ipc || it->second->vmm) return CUDA_ERROR_INVALID_VALUE;
    freed = std::move(it->second);
    s.device.erase(it);
    // Closing the memfd now (its pages live on in the mappings) is what makes
    // peers refuse this buffer's IPC handle from here on.
    close(freed->fd);
    freed->fd = -1;
  }
  g_live_allocs.fetch_sub(1);
  return CUDA_SUCCESS;
}

CUresult MemGetAddressRange(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  FAKE_CUDA_TRY(CheckContext());
  State& s = GetState();
  std::lock_guard lock(s.mu);
  const std::shared_ptr<DevMapping>* m = FindDevice(s, dptr);
  if (m == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = (*m)->base;
  if (psize != nullptr) *psize = (*m)->size;
  return CUDA_SUCCESS;
}

// ----------------------------------------------------------------------------
// Pinned host memory

// True when [p, p + n) overlaps a host range already pinned or registered.
bool OverlapsHost(State& s, uintptr_t p, size_t n) {
  auto it = s.host.lower_bound(p);
  if (it != s.host.end() && it->first < p + n) return true;
  if (it == s.host.begin()) return false;
  --it;
  return p < it->first + it->second.size;
}

CUresult MemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  FAKE_CUDA_TRY(CheckContext());
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || bytesize == 0 || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (bytesize > kMaxBytes) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t mapped = RoundUpToPage(bytesize);
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  State& s = GetState();
  std::lock_guard lock(s.mu);
  s.host[reinterpret_cast<uintptr_t>(p)] =
      HostRange{bytesize, mapped, t_current->ordinal, s.next_serial++};
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult MemFreeHost(void* p) {
  FAKE_CUDA_TRY(CheckContext());
  State& s = GetState();
  std::lock_guard lock(s.mu);
  auto it = s.host.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.host.end() || it->second.mapped == 0) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.mapped);
  s.host.erase(it);
  return CUDA_SUCCESS;
}

CUresult MemHostRegister(void* p, size_t bytesize, unsigned int flags) {
  FAKE_CUDA_TRY(CheckContext());
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  const auto start = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr || bytesize == 0 || (flags & ~kKnown) != 0 || bytesize > kMaxBytes ||
      start + bytesize < start) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = GetState();
  std::lock_guard lock(s.mu);
  if (OverlapsHost(s, start, bytesize)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  s.host[start] = HostRange{bytesize, 0, t_current->ordinal, s.next_serial++};
  return CUDA_SUCCESS;
}

CUresult MemHostUnregister(void* p) {
  FAKE_CUDA_TRY(CheckContext());
  State& s = GetState();
  std::lock_guard lock(s.mu);
  auto it = s.host.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.host.end() || it->second.mapped != 0) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  s.host.erase(it);
  return CUDA_SUCCESS;
}

// ----------------------------------------------------------------------------
// Pointer attributes

CUresult PointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                              CUdeviceptr ptr) {
  FAKE_CUDA_TRY(CheckContext());
  if (count != 0 && (attributes == nullptr || data == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned int i = 0; i < count; ++i) {
    switch (attributes[i]) {
      case CU_POINTER_ATTRIBUTE_CONTEXT:
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      case CU_POINTER_ATTRIBUTE_IS_MANAGED: break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  // What an unknown pointer reports: the real driver's "not a CUDA pointer"
  // values, and no error.
  CUcontext ctx = nullptr;
  unsigned int type = 0;
  CUdeviceptr device_pointer = 0;
  void* host_pointer = nullptr;
  int ordinal = -2;
  unsigned long long buffer_id = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  {
    State& s = GetState();
    std::lock_guard lock(s.mu);
    if (const std::shared_ptr<DevMapping>* m = FindDevice(s, ptr)) {
      type = CU_MEMORYTYPE_DEVICE;
      ordinal = (*m)->ordinal;
      device_pointer = ptr;
      buffer_id = (*m)->buffer_id;
      start = (*m)->base;
      size = (*m)->size;
    } else if (auto it = FindHost(s, ptr); it != s.host.end()) {
      type = CU_MEMORYTYPE_HOST;
      ordinal = it->second.ordinal;
      device_pointer = ptr;  // unified addressing: the same address on both sides
      host_pointer = reinterpret_cast<void*>(ptr);
      buffer_id = it->second.buffer_id;
      start = it->first;
      size = it->second.size;
    }
    if (ordinal >= 0) ctx = ContextOf(s, ordinal);
  }
  for (unsigned int i = 0; i < count; ++i) {
    void* out = data[i];
    if (out == nullptr) continue;
    switch (attributes[i]) {
      case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(out) = ctx; break;
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned int*>(out) = type; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *static_cast<CUdeviceptr*>(out) = device_pointer;
        break;
      case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(out) = host_pointer; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(out) = ordinal; break;
      case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *static_cast<unsigned long long*>(out) = buffer_id;
        break;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(out) = start; break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(out) = size; break;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned int*>(out) = 0; break;
      default: break;
    }
  }
  return CUDA_SUCCESS;
}

// ----------------------------------------------------------------------------
// IPC

CUresult IpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  FAKE_CUDA_TRY(CheckContext());
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lock(s.mu);
  auto it = s.device.find(dptr);
  if (it == s.device.end() || it->second->ipc) return CUDA_ERROR_INVALID_VALUE;
  // Memory of cuMemCreate is shared through cuMemExportToShareableHandle.
  if (it->second->vmm) return CUDA_ERROR_NOT_SUPPORTED;
  IpcPayload payload{};
  std::memcpy(payload.magic, kIpcMagic, sizeof(kIpcMagic));
  payload.pid = getpid();
  payload.fd = it->second->fd;
  payload.size = it->second->size;
  payload.serial = it->second->buffer_id;
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &payload, sizeof(payload));
  return CUDA_SUCCESS;
}

CUresult IpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  FAKE_CUDA_TRY(CheckContext());
  if (pdptr == nullptr || (flags & ~unsigned{CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  IpcPayload h;
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (std::memcmp(h.magic, kIpcMagic, sizeof(kIpcMagic)) != 0 || h.pid <= 0 || h.fd < 0 ||
      h.size == 0 || h.size > kMaxBytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The real driver refuses to open a handle in the process that made it.
  if (h.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  State& s = GetState();
  std::lock_guard lock(s.mu);
  const std::pair<pid_t, unsigned long long> owner{h.pid, h.serial};
  if (auto it = s.ipc_by_owner.find(owner); it != s.ipc_by_owner.end()) {
    s.device.at(it->second)->ipc_refs++;
    *pdptr = it->second;
    return CUDA_SUCCESS;
  }
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the owner exited or closed the fd
  // Checked on the file now open, not on the owner's fd table, so an fd
  // number the owner reused for another buffer cannot slip in between.
  struct stat st = {};
  if (!NamesMemfd(ReadLink("/proc/self/fd/" + std::to_string(fd)), MemfdName(h.pid, h.serial)) ||
      fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != RoundUpToPage(h.size)) {
    close(fd);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  auto m = std::make_shared<DevMapping>();
  m->size = h.size;
  m->mapped = RoundUpToPage(h.size);
  const CUresult mapped = MapTwice(fd, m.get());
  close(fd);  // the mappings keep the memfd alive
  if (mapped != CUDA_SUCCESS) return mapped;
  m->buffer_id = s.next_serial++;
  m->ordinal = t_current->ordinal;
  m->ipc = true;
  m->owner = owner;
  m->ipc_refs = 1;
  s.device.emplace(m->base, m);
  s.ipc_by_owner.emplace(owner, m->base);
  g_live_ipc.fetch_add(1);
  *pdptr = m->base;
  return CUDA_SUCCESS;
}

CUresult IpcCloseMemHandle(CUdeviceptr dptr) {
  FAKE_CUDA_TRY(CheckContext());
  State& s = GetState();
  std::shared_ptr<DevMapping> closed;  // unmapped once the lock is released
  {
    std::lock_guard lock(s.mu);
    auto it = s.device.find(dptr);
    if (it == s.device.end() || !it->second->ipc) return CUDA_ERROR_INVALID_VALUE;
    if (--it->second->ipc_refs > 0) return CUDA_SUCCESS;
    closed = std::move(it->second);
    s.device.erase(it);
    s.ipc_by_owner.erase(closed->owner);
  }
  g_live_ipc.fetch_sub(1);
  return CUDA_SUCCESS;
}

// ----------------------------------------------------------------------------
// cuGetProcAddress

struct ProcEntry {
  const char* name;
  int min_version;
  void* fn;
};

// Converting to Pfn first makes the build fail if an implementation's
// signature is not the ABI that name and version select in cudaTypedefs.h.
template <typename Pfn>
void* AsProc(Pfn fn) {
  return reinterpret_cast<void*>(fn);
}
// (clang-format would split the pasted template argument.)
// clang-format off
#define FAKE_CUDA_ENTRY(sym, version, impl) \
  ProcEntry{#sym, version, AsProc<PFN_##sym##_v##version>(&impl)}
// clang-format on
const ProcEntry kProcs[] = {
    FAKE_CUDA_ENTRY(cuGetErrorString, 6000, GetErrorString),
    FAKE_CUDA_ENTRY(cuGetErrorName, 6000, GetErrorName),
    FAKE_CUDA_ENTRY(cuInit, 2000, Init),
    FAKE_CUDA_ENTRY(cuDriverGetVersion, 2020, DriverGetVersion),
    FAKE_CUDA_ENTRY(cuDeviceGetCount, 2000, DeviceGetCount),
    FAKE_CUDA_ENTRY(cuDeviceGet, 2000, DeviceGet),
    FAKE_CUDA_ENTRY(cuDeviceGetUuid, 11040, DeviceGetUuid),
    FAKE_CUDA_ENTRY(cuDevicePrimaryCtxRetain, 7000, DevicePrimaryCtxRetain),
    FAKE_CUDA_ENTRY(cuDevicePrimaryCtxRelease, 11000, DevicePrimaryCtxRelease),
    FAKE_CUDA_ENTRY(cuCtxSetCurrent, 4000, CtxSetCurrent),
    FAKE_CUDA_ENTRY(cuCtxGetCurrent, 4000, CtxGetCurrent),
    FAKE_CUDA_ENTRY(cuPointerGetAttributes, 7000, PointerGetAttributes),
    FAKE_CUDA_ENTRY(cuMemGetAddressRange, 3020, MemGetAddressRange),
    FAKE_CUDA_ENTRY(cuMemAlloc, 3020, MemAlloc),
    FAKE_CUDA_ENTRY(cuMemFree, 3020, MemFree),
    FAKE_CUDA_ENTRY(cuMemHostAlloc, 2020, MemHostAlloc),
    FAKE_CUDA_ENTRY(cuMemFreeHost, 2000, MemFreeHost),
    FAKE_CUDA_ENTRY(cuMemHostRegister, 6050, MemHostRegister),
    FAKE_CUDA_ENTRY(cuMemHostUnregister, 4000, MemHostUnregister),
    FAKE_CUDA_ENTRY(cuMemcpy, 4000, Memcpy),
    FAKE_CUDA_ENTRY(cuMemcpyAsync, 4000, MemcpyAsync),
    FAKE_CUDA_ENTRY(cuStreamCreate, 2000, StreamCreate),
    FAKE_CUDA_ENTRY(cuStreamDestroy, 4000, StreamDestroy),
    FAKE_CUDA_ENTRY(cuStreamSynchronize, 2000, StreamSynchronize),
    FAKE_CUDA_ENTRY(cuStreamWaitEvent, 3020, StreamWaitEvent),
    FAKE_CUDA_ENTRY(cuEventCreate, 2000, EventCreate),
    FAKE_CUDA_ENTRY(cuEventRecord, 2000, EventRecord),
    FAKE_CUDA_ENTRY(cuEventQuery, 2000, EventQuery),
    FAKE_CUDA_ENTRY(cuEventSynchronize, 2000, EventSynchronize),
    FAKE_CUDA_ENTRY(cuEventDestroy, 4000, EventDestroy),
    FAKE_CUDA_ENTRY(cuIpcGetMemHandle, 4010, IpcGetMemHandle),
    FAKE_CUDA_ENTRY(cuIpcOpenMemHandle, 11000, IpcOpenMemHandle),
    FAKE_CUDA_ENTRY(cuIpcCloseMemHandle, 4010, IpcCloseMemHandle),
    FAKE_CUDA_ENTRY(cuMemCreate, 10020, MemCreate),
    FAKE_CUDA_ENTRY(cuMemRelease, 10020, MemRelease),
    FAKE_CUDA_ENTRY(cuMemAddressReserve, 10020, MemAddressReserve),
    FAKE_CUDA_ENTRY(cuMemAddressFree, 10020, MemAddressFree),
    FAKE_CUDA_ENTRY(cuMemMap, 10020, MemMap),
    FAKE_CUDA_ENTRY(cuMemUnmap, 10020, MemUnmap),
    FAKE_CUDA_ENTRY(cuMemSetAccess, 10020, MemSetAccess),
    FAKE_CUDA_ENTRY(cuMemRetainAllocationHandle, 11000, MemRetainAllocationHandle),
    FAKE_CUDA_ENTRY(cuMemExportToShareableHandle, 10020, MemExportToShareableHandle),
    FAKE_CUDA_ENTRY(cuMemImportFromShareableHandle, 10020, MemImportFromShareableHandle),
    FAKE_CUDA_ENTRY(cuMemGetAllocationPropertiesFromHandle, 10020,
                    MemGetAllocationPropertiesFromHandle),
    FAKE_CUDA_ENTRY(cuMemGetAllocationGranularity, 10020, MemGetAllocationGranularity),
};
#undef FAKE_CUDA_ENTRY

// Frees everything when the library is unloaded or the process exits, so a
// sanitizer build sees no leaked memory and no stream thread outlives the
// library. Calls made after this return CUDA_ERROR_DEINITIALIZED, as the real
// driver's do while the process exits.
void Shutdown() {
  if (g_init_pid.load(std::memory_order_acquire) != getpid()) return;  // incl. forked children
  if (g_shut_down.exchange(true)) return;
  State& s = GetState();
  std::vector<std::shared_ptr<Stream>> streams;
  std::map<uintptr_t, std::shared_ptr<DevMapping>> device;
  std::map<uintptr_t, HostRange> host;
  std::map<const Event*, std::shared_ptr<Event>> events;
  {
    std::lock_guard lock(s.mu);
    for (auto& [handle, stream] : s.streams) streams.push_back(std::move(stream));
    s.streams.clear();
    if (s.default_stream) streams.push_back(std::move(s.default_stream));
    device.swap(s.device);
    host.swap(s.host);
    events.swap(s.events);
    s.ipc_by_owner.clear();
  }
  // Every queue drains before any thread is joined: a stream may wait for an
  // event that another stream records.
  for (auto& stream : streams) RequestStop(*stream);
  for (auto& stream : streams) JoinWorker(*stream);
  for (auto& [base, m] : device) {
    if (m->fd >= 0) close(m->fd);
  }
  device.clear();  // vmm mappings first: their reservations go next
  DropVmm(s);
  for (auto& [base, range] : host) {
    if (range.mapped != 0) munmap(reinterpret_cast<void*>(base), range.mapped);
  }
}

struct Reaper {
  ~Reaper() { Shutdown(); }
} g_reaper;

}  // namespace

State& GetState() {
  // Constructed on first use and never destroyed, so a call racing with the
  // process's exit finds its mutexes intact.
  alignas(State) static unsigned char storage[sizeof(State)];
  static State* const state = new (storage) State();
  return *state;
}

CUresult CheckInit() {
  const pid_t owner = g_init_pid.load(std::memory_order_acquire);
  // Never initialised, or a child forked from the process that initialised.
  if (owner == 0 || owner != getpid()) return CUDA_ERROR_NOT_INITIALIZED;
  if (g_shut_down.load(std::memory_order_acquire)) return CUDA_ERROR_DEINITIALIZED;
  return CUDA_SUCCESS;
}

CUresult CheckContext() {
  FAKE_CUDA_TRY(CheckInit());
  // A released primary context counts as none: using it is a bug the real
  // driver reports too.
  if (t_current == nullptr || t_current->refs.load() <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

CUresult ResolveCopySide(State& s, CUdeviceptr p, size_t n, char** out,
                         std::shared_ptr<DevMapping>* keep) {
  if (p == 0 || p + n < p) return CUDA_ERROR_INVALID_VALUE;
  auto next = s.device.upper_bound(p);
  if (next != s.device.begin()) {
    const std::shared_ptr<DevMapping>& m = std::prev(next)->second;
    // Device memory, or the slack after it in its last page.
    if (p < m->base + m->mapped) {
      if (p + n > m->base + m->size) return CUDA_ERROR_INVALID_VALUE;
      // A cuMemMap range before cuMemSetAccess: the GPU would fault.
      if (m->vmm && !m->accessible) return CUDA_ERROR_ILLEGAL_ADDRESS;
      *out = m->alias + (p - m->base);
      *keep = m;
      return CUDA_SUCCESS;
    }
  }
  // Host memory, which must not run on into device memory.
  if (next != s.device.end() && next->first < p + n) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<char*>(p);
  return CUDA_SUCCESS;
}

}  // namespace hixl_fake_cuda

using hixl_fake_cuda::kProcs;

extern "C" {

HIXL_FAKE_CUDA_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int driverVersion,
                                                cuuint64_t flags,
                                                CUdriverProcAddressQueryResult* status) {
  constexpr cuuint64_t kKnownFlags =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (symbol == nullptr || pfn == nullptr || (flags & ~kKnownFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *pfn = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  for (const auto& entry : kProcs) {
    if (std::strcmp(entry.name, symbol) != 0) continue;
    if (driverVersion >= entry.min_version) {
      *pfn = entry.fn;
      found = CU_GET_PROC_ADDRESS_SUCCESS;
    } else {
      found = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    }
    break;
  }
  if (status != nullptr) *status = found;
  return found == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

HIXL_FAKE_CUDA_API void hixl_fake_cuda_set_copy_delay_us(unsigned us) {
  hixl_fake_cuda::g_copy_delay_us.store(us);
}

HIXL_FAKE_CUDA_API void hixl_fake_cuda_fail_copies_after(long long n) {
  hixl_fake_cuda::g_copy_budget.store(n < 0 ? -1 : n);
}

HIXL_FAKE_CUDA_API int hixl_fake_cuda_live_allocs(void) {
  return hixl_fake_cuda::g_live_allocs.load();
}

HIXL_FAKE_CUDA_API int hixl_fake_cuda_live_ipc_mappings(void) {
  return hixl_fake_cuda::g_live_ipc.load();
}

HIXL_FAKE_CUDA_API int hixl_fake_cuda_live_vmm_mappings(void) {
  return hixl_fake_cuda::LiveVmmMappings();
}

HIXL_FAKE_CUDA_API int hixl_fake_cuda_live_vmm_handles(void) {
  return hixl_fake_cuda::LivePhysAllocs();
}

HIXL_FAKE_CUDA_API long long hixl_fake_cuda_copies(void) { return hixl_fake_cuda::g_copies.load(); }

HIXL_FAKE_CUDA_API long long hixl_fake_cuda_bytes_copied(void) {
  return hixl_fake_cuda::g_bytes_copied.load();
}

}  // extern "C"
