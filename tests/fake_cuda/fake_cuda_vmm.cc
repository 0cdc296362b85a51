// Virtual memory management of the fake CUDA driver: physical memory
// (cuMemCreate: a memfd), address reservations (cuMemAddressReserve:
// PROT_NONE pages the CPU cannot touch), mappings of the one into the other
// (cuMemMap: a DevMapping whose copies go through a read-write alias of the
// memfd), access (copies fail with CUDA_ERROR_ILLEGAL_ADDRESS before
// cuMemSetAccess), and sharing between processes as a POSIX file descriptor
// (cuMemExportToShareableHandle: a duplicate of the memfd, allowed only for
// memory created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested;
// cuMemImportFromShareableHandle: the same memfd as physical memory here).
// Legacy IPC handles and cuMemFree refuse these mappings, as the real
// driver's do.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fake_cuda_internal.h"

namespace hixl_fake_cuda {
namespace {

// The real driver's minimum granularity on current GPUs.
constexpr size_t kGranularity = size_t{2} << 20;
constexpr size_t kMaxVmmBytes = size_t{1} << 40;
constexpr char kVmmPrefix[] = "hixl-fake-cuda-vmm-";

std::atomic<int> g_live_maps{0};
std::atomic<int> g_live_phys{0};

bool Aligned(uint64_t v) { return v % kGranularity == 0; }

// The link target of this process's fd.
std::string FdTarget(int fd) {
  char buf[512];
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(path.c_str(), buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// A new handle for alloc (one reference). Called with s.mu held.
CUmemGenericAllocationHandle AddPhys(State& s, std::shared_ptr<PhysAlloc> alloc) {
  const CUmemGenericAllocationHandle h = s.next_serial++;
  s.phys[h] = PhysEntry{std::move(alloc), 1};
  g_live_phys.fetch_add(1);
  return h;
}

// The reservation holding [p, p + n), or end(). Called with s.mu held.
std::map<uintptr_t, size_t>::iterator FindReservation(State& s, uintptr_t p, size_t n) {
  auto it = s.reserved.upper_bound(p);
  if (it == s.reserved.begin()) return s.reserved.end();
  --it;
  if (p < it->first || n > it->second || p - it->first > it->second - n) return s.reserved.end();
  return it;
}

// Whether a device mapping overlaps [p, p + n). Called with s.mu held.
bool OverlapsMapping(State& s, uintptr_t p, size_t n) {
  auto it = s.device.lower_bound(p);
  if (it != s.device.end() && it->first < p + n) return true;
  if (it == s.device.begin()) return false;
  --it;
  return it->first + it->second->mapped > p;
}

}  // namespace

CUresult MemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                   const CUmemAllocationProp* prop, unsigned long long flags) {
  FAKE_CUDA_TRY(CheckContext());
  if (handle == nullptr || prop == nullptr || flags != 0 || size == 0 || !Aligned(size) ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
      prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (size > kMaxVmmBytes) return CUDA_ERROR_OUT_OF_MEMORY;
  State& s = GetState();
  if (prop->location.id < 0 || prop->location.id >= s.device_count)
    return CUDA_ERROR_INVALID_DEVICE;
  auto alloc = std::make_shared<PhysAlloc>();
  unsigned long long serial = 0;
  {
    std::lock_guard lock(s.mu);
    serial = s.next_serial++;
  }
  const std::string name = kVmmPrefix + std::to_string(getpid()) + "-" + std::to_string(serial);
  alloc->fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (alloc->fd < 0 || ftruncate(alloc->fd, static_cast<off_t>(size)) != 0) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  alloc->size = size;
  alloc->ordinal = prop->location.id;
  alloc->fd_exportable = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::lock_guard lock(s.mu);
  *handle = AddPhys(s, std::move(alloc));
  return CUDA_SUCCESS;
}

CUresult MemRelease(CUmemGenericAllocationHandle handle) {
  FAKE_CUDA_TRY(CheckContext());
  State& s = GetState();
  std::shared_ptr<PhysAlloc> dropped;  // closed after the lock, unless mapped
  std::lock_guard lock(s.mu);
  auto it = s.phys.find(handle);
  if (it == s.phys.end()) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs == 0) {
    dropped = std::move(it->second.alloc);
    s.phys.erase(it);
    g_live_phys.fetch_sub(1);
  }
  return CUDA_SUCCESS;
}

CUresult MemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                           unsigned long long flags) {
  FAKE_CUDA_TRY(CheckInit());
  (void)addr;  // a hint
  if (ptr == nullptr || size == 0 || !Aligned(size) || flags != 0 ||
      (alignment != 0 && (alignment & (alignment - 1)) != 0) || size > kMaxVmmBytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t align = alignment > kGranularity ? alignment : kGranularity;
  // Reserve extra, then keep an aligned window of the asked size.
  void* raw =
      mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + align - 1) / align * align;
  if (aligned > start) munmap(raw, aligned - start);
  if (const size_t tail = start + size + align - (aligned + size); tail > 0) {
    munmap(reinterpret_cast<void*>(aligned + size), tail);
  }
  State& s = GetState();
  std::lock_guard lock(s.mu);
  s.reserved[aligned] = size;
  *ptr = aligned;
  return CUDA_SUCCESS;
}

CUresult MemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKE_CUDA_TRY(CheckInit());
  State& s = GetState();
  std::lock_guard lock(s.mu);
  auto it = s.reserved.find(ptr);
  if (it == s.reserved.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  // The real driver wants every mapping in it unmapped first.
  if (OverlapsMapping(s, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reserved.erase(it);
  return CUDA_SUCCESS;
}

CUresult MemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                unsigned long long flags) {
  FAKE_CUDA_TRY(CheckContext());
  if (flags != 0 || size == 0 || !Aligned(ptr) || !Aligned(size) || !Aligned(offset)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = GetState();
  std::lock_guard lock(s.mu);
  auto ph = s.phys.find(handle);
  if (ph == s.phys.end()) return CUDA_ERROR_INVALID_HANDLE;
  const std::shared_ptr<PhysAlloc>& alloc = ph->second.alloc;
  if (offset > alloc->size || size > alloc->size - offset) return CUDA_ERROR_INVALID_VALUE;
  if (FindReservation(s, ptr, size) == s.reserved.end() || OverlapsMapping(s, ptr, size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto m = std::make_shared<DevMapping>();
  void* alias = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, alloc->fd,
                     static_cast<off_t>(offset));
  if (alias == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  m->alias = static_cast<char*>(alias);
  m->base = ptr;
  m->size = size;
  m->mapped = size;
  m->buffer_id = s.next_serial++;
  m->ordinal = alloc->ordinal;
  m->vmm = true;
  m->accessible = false;
  m->phys = alloc;
  s.device.emplace(ptr, std::move(m));
  g_live_maps.fetch_add(1);
  return CUDA_SUCCESS;
}

CUresult MemUnmap(CUdeviceptr ptr, size_t size) {
  FAKE_CUDA_TRY(CheckInit());
  State& s = GetState();
  std::shared_ptr<DevMapping> gone;  // its alias goes with the last queued copy using it
  std::lock_guard lock(s.mu);
  auto it = s.device.find(ptr);
  if (it == s.device.end() || !it->second->vmm || it->second->size != size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  gone = std::move(it->second);
  s.device.erase(it);
  g_live_maps.fetch_sub(1);
  return CUDA_SUCCESS;
}

CUresult MemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  FAKE_CUDA_TRY(CheckContext());
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  bool readwrite = false;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
        desc[i].location.id >= s.device_count) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) readwrite = true;
  }
  std::lock_guard lock(s.mu);
  // Every byte of the range must be mapped.
  std::vector<DevMapping*> hit;
  for (uintptr_t p = ptr; p < ptr + size;) {
    auto it = s.device.find(p);
    if (it == s.device.end() || !it->second->vmm) return CUDA_ERROR_INVALID_VALUE;
    hit.push_back(it->second.get());
    p += it->second->size;
  }
  for (DevMapping* m : hit) m->accessible = readwrite;
  return CUDA_SUCCESS;
}

CUresult MemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  FAKE_CUDA_TRY(CheckContext());
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lock(s.mu);
  const uintptr_t p = reinterpret_cast<uintptr_t>(addr);
  auto it = s.device.upper_bound(p);
  if (it == s.device.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (!it->second->vmm || p >= it->first + it->second->size) return CUDA_ERROR_INVALID_VALUE;
  // The handle it was mapped from while that lives, else a new one.
  for (auto& [h, entry] : s.phys) {
    if (entry.alloc == it->second->phys) {
      entry.refs++;
      *handle = h;
      return CUDA_SUCCESS;
    }
  }
  *handle = AddPhys(s, it->second->phys);
  return CUDA_SUCCESS;
}

CUresult MemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                    CUmemAllocationHandleType type, unsigned long long flags) {
  FAKE_CUDA_TRY(CheckContext());
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lock(s.mu);
  auto it = s.phys.find(handle);
  if (it == s.phys.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !it->second.alloc->fd_exportable) {
    return CUDA_ERROR_NOT_PERMITTED;
  }
  const int fd = fcntl(it->second.alloc->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult MemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                      CUmemAllocationHandleType type) {
  FAKE_CUDA_TRY(CheckContext());
  if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  // Only this driver's physical memory: another file is not device memory.
  const std::string want = std::string("/memfd:") + kVmmPrefix;
  struct stat st = {};
  if (fd < 0 || FdTarget(fd).compare(0, want.size(), want) != 0 || fstat(fd, &st) != 0 ||
      st.st_size <= 0 || !Aligned(static_cast<uint64_t>(st.st_size))) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  auto alloc = std::make_shared<PhysAlloc>();
  alloc->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);  // the caller keeps its own fd
  if (alloc->fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  alloc->size = static_cast<size_t>(st.st_size);
  alloc->ordinal = t_current->ordinal;
  alloc->fd_exportable = true;
  State& s = GetState();
  std::lock_guard lock(s.mu);
  *handle = AddPhys(s, std::move(alloc));
  return CUDA_SUCCESS;
}

CUresult MemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                              CUmemGenericAllocationHandle handle) {
  FAKE_CUDA_TRY(CheckContext());
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lock(s.mu);
  auto it = s.phys.find(handle);
  if (it == s.phys.end()) return CUDA_ERROR_INVALID_HANDLE;
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->requestedHandleTypes = it->second.alloc->fd_exportable
                                   ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                   : CU_MEM_HANDLE_TYPE_NONE;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = it->second.alloc->ordinal;
  return CUDA_SUCCESS;
}

CUresult MemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                     CUmemAllocationGranularity_flags option) {
  FAKE_CUDA_TRY(CheckInit());
  if (granularity == nullptr || prop == nullptr ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
       option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

int LiveVmmMappings() { return g_live_maps.load(); }
int LivePhysAllocs() { return g_live_phys.load(); }

void DropVmm(State& s) {
  std::map<unsigned long long, PhysEntry> phys;
  std::map<uintptr_t, size_t> reserved;
  {
    std::lock_guard lock(s.mu);
    phys.swap(s.phys);
    reserved.swap(s.reserved);
  }
  for (auto& [start, size] : reserved) munmap(reinterpret_cast<void*>(start), size);
}

}  // namespace hixl_fake_cuda
