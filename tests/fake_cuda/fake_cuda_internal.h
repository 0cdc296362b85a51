// State shared by the parts of the fake CUDA driver: fake_cuda.cc
// (devices, contexts, memory, IPC, cuGetProcAddress) and fake_cuda_streams.cc
// (streams, events, copies) and fake_cuda_vmm.cc (cuMemCreate memory).
// Nothing here is exported from the library.
#ifndef HIXL_TESTS_FAKE_CUDA_FAKE_CUDA_INTERNAL_H_
#define HIXL_TESTS_FAKE_CUDA_FAKE_CUDA_INTERNAL_H_

#include <cuda.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#define FAKE_CUDA_TRY(expr)                    \
  do {                                         \
    const CUresult fake_cuda_result_ = (expr); \
    if (fake_cuda_result_ != CUDA_SUCCESS) {   \
      return fake_cuda_result_;                \
    }                                          \
  } while (0)

namespace hixl_fake_cuda {

constexpr int kMaxDevices = 64;
constexpr size_t kPageSize = 4096;

// The process that called cuInit (0: none yet). Calls from any other process,
// that is from a child forked after cuInit, fail without touching a lock.
extern std::atomic<pid_t> g_init_pid;
// Set when the library is unloaded or the process exits.
extern std::atomic<bool> g_shut_down;
extern std::atomic<unsigned> g_copy_delay_us;
// Copies that may still succeed; -1: unlimited.
extern std::atomic<long long> g_copy_budget;
extern std::atomic<long long> g_copies;
extern std::atomic<long long> g_bytes_copied;

// A device's primary context; its address is the CUcontext handle.
struct Context {
  int ordinal = 0;
  std::atomic<int> refs{0};
};

// The calling thread's current context (cuCtxSetCurrent).
extern __attribute__((tls_model("initial-exec"))) thread_local Context* t_current;

inline CUcontext ToHandle(Context* c) { return reinterpret_cast<CUcontext>(c); }

// Physical memory of cuMemCreate (or of cuMemImportFromShareableHandle: the
// same memfd, in another process): mapped into reservations by cuMemMap.
struct PhysAlloc {
  int fd = -1;  // the memfd: the bytes
  size_t size = 0;
  int ordinal = 0;
  bool fd_exportable = false;  // requestedHandleTypes had POSIX_FILE_DESCRIPTOR
  PhysAlloc() = default;
  PhysAlloc(const PhysAlloc&) = delete;
  PhysAlloc& operator=(const PhysAlloc&) = delete;
  ~PhysAlloc() {
    if (fd >= 0) close(fd);
  }
};

// A handle of physical memory and its references (cuMemCreate, Import and
// RetainAllocationHandle add one, cuMemRelease drops one).
struct PhysEntry {
  std::shared_ptr<PhysAlloc> alloc;
  int refs = 0;
};

// A device allocation of this process, a peer's allocation mapped here
// through an IPC handle, or a cuMemMap of physical memory (vmm).
struct DevMapping {
  uintptr_t base = 0;                // the PROT_NONE mapping: the device pointer
  size_t size = 0;                   // the bytes asked for
  size_t mapped = 0;                 // size rounded up to whole pages
  char* alias = nullptr;             // the same pages, read-write, for copies only
  int fd = -1;                       // allocations: the memfd, open for IPC peers until freed
  unsigned long long buffer_id = 0;  // allocations: also the memfd's serial
  int ordinal = 0;
  bool ipc = false;
  std::pair<pid_t, unsigned long long> owner{0, 0};  // IPC: pid and serial
  int ipc_refs = 0;                                  // IPC: opens not yet closed
  // vmm: base lies in a cuMemAddressReserve range (which owns the PROT_NONE
  // pages); copies fail until cuMemSetAccess made it accessible.
  bool vmm = false;
  bool accessible = true;
  std::shared_ptr<PhysAlloc> phys;

  DevMapping() = default;
  DevMapping(const DevMapping&) = delete;
  DevMapping& operator=(const DevMapping&) = delete;
  // Runs once the memory is freed and no queued copy holds it any more, so a
  // copy in flight never touches unmapped pages.
  ~DevMapping() {
    if (alias != nullptr) munmap(alias, mapped);
    if (base != 0 && !vmm) munmap(reinterpret_cast<void*>(base), mapped);
  }
};

// Pinned host memory: from cuMemHostAlloc (mapped != 0, the bytes to unmap)
// or cuMemHostRegister (mapped == 0).
struct HostRange {
  size_t size = 0;
  size_t mapped = 0;
  int ordinal = 0;
  unsigned long long buffer_id = 0;
};

// Guarded by State::event_mu. Each record bumps `recorded`; the stream that
// runs it raises `completed` to that number, so the event is done when the
// two are equal, and carries the error of its latest completed record.
struct Event {
  uint64_t recorded = 0;
  uint64_t completed = 0;
  CUresult error = CUDA_SUCCESS;
};

// Lets cuMemcpy wait for its own copy.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  CUresult result = CUDA_SUCCESS;
};

// One piece of work on a stream.
struct Op {
  enum class Kind { kCopy, kRecord, kWait };
  Kind kind = Kind::kCopy;
  uint64_t seq = 0;  // position in the stream, from 1
  // kCopy: host addresses, or aliases of device memory kept mapped by keep_*.
  char* dst = nullptr;
  const char* src = nullptr;
  size_t n = 0;
  std::shared_ptr<DevMapping> keep_dst, keep_src;
  std::shared_ptr<Completion> completion;  // cuMemcpy: reports to its caller only
  // kRecord: the record number it completes; kWait: the one it waits for.
  std::shared_ptr<Event> event;
  uint64_t gen = 0;
};

struct Stream {
  std::mutex mu;               // guards everything below but `worker`
  std::condition_variable cv;  // new work, a finished op, or stopping
  std::deque<Op> queue;
  uint64_t enqueued = 0;   // seq of the last op queued
  uint64_t completed = 0;  // seq of the last op finished
  // The first failure since the last cuStreamSynchronize, and its op.
  CUresult error = CUDA_SUCCESS;
  uint64_t error_seq = 0;
  bool stopping = false;
  std::thread worker;  // started and joined by one thread each
};

struct State {
  std::mutex mu;  // guards all below but the contexts' refcounts and events
  // Fixed by cuInit before g_init_pid is published; read-only afterwards.
  int device_count = 0;
  int physical[kMaxDevices] = {};  // ordinal -> physical device
  Context contexts[kMaxDevices];
  unsigned long long next_serial = 1;  // buffer ids and memfd names, never reused
  std::map<uintptr_t, std::shared_ptr<DevMapping>> device;  // by base
  std::map<std::pair<pid_t, unsigned long long>, uintptr_t> ipc_by_owner;
  std::map<uintptr_t, HostRange> host;  // by start
  std::map<const Stream*, std::shared_ptr<Stream>> streams;
  std::shared_ptr<Stream> default_stream;  // started on first use
  std::map<const Event*, std::shared_ptr<Event>> events;
  std::map<unsigned long long, PhysEntry> phys;  // by handle (a serial)
  std::map<uintptr_t, size_t> reserved;          // cuMemAddressReserve: start -> size

  // One lock and condition for all events: streams wait on each other's.
  // Lock order: a Stream's mu, then event_mu.
  std::mutex event_mu;
  std::condition_variable event_cv;
};

State& GetState();

// CUDA_SUCCESS after cuInit in this process, else why not.
CUresult CheckInit();
// CheckInit, and a live context current on the calling thread.
CUresult CheckContext();

// One side of a copy: device memory becomes its alias (kept mapped through
// *keep), anything else is host memory. [p, p + n) must lie inside one
// allocation or outside all of them. Called with s.mu held.
CUresult ResolveCopySide(State& s, CUdeviceptr p, size_t n, char** out,
                         std::shared_ptr<DevMapping>* keep);

// Stopping a stream: RequestStop lets its queue drain, JoinWorker waits.
void RequestStop(Stream& stream);
void JoinWorker(Stream& stream);

// Entry points of fake_cuda_vmm.cc (virtual memory management).
CUresult MemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                   const CUmemAllocationProp* prop, unsigned long long flags);
CUresult MemRelease(CUmemGenericAllocationHandle handle);
CUresult MemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                           unsigned long long flags);
CUresult MemAddressFree(CUdeviceptr ptr, size_t size);
CUresult MemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                unsigned long long flags);
CUresult MemUnmap(CUdeviceptr ptr, size_t size);
CUresult MemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count);
CUresult MemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr);
CUresult MemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                    CUmemAllocationHandleType type, unsigned long long flags);
CUresult MemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                      CUmemAllocationHandleType type);
CUresult MemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                              CUmemGenericAllocationHandle handle);
CUresult MemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                     CUmemAllocationGranularity_flags option);
// Live cuMemMap mappings and physical handles, for the controls.
int LiveVmmMappings();
int LivePhysAllocs();
// Drops every physical handle and reservation (Shutdown; s.mu not held).
void DropVmm(State& s);

// Entry points of fake_cuda_streams.cc.
CUresult Memcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
CUresult MemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult StreamCreate(CUstream* stream, unsigned int flags);
CUresult StreamDestroy(CUstream stream);
CUresult StreamSynchronize(CUstream stream);
CUresult StreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
CUresult EventCreate(CUevent* event, unsigned int flags);
CUresult EventRecord(CUevent event, CUstream stream);
CUresult EventQuery(CUevent event);
CUresult EventSynchronize(CUevent event);
CUresult EventDestroy(CUevent event);

}  // namespace hixl_fake_cuda

#endif  // HIXL_TESTS_FAKE_CUDA_FAKE_CUDA_INTERNAL_H_
