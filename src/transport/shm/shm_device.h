// The shm transport's part for CUDA device memory (device/cuda.h): a target
// describes a device region by a legacy IPC handle of its allocation, or,
// for memory of cuMemCreate (VMM), as one whose physical memory it passes
// as a file descriptor over the Unix socket when asked ("getvmm"); an
// initiator opens each allocation once per link (DeviceImports) and copies
// with the driver wherever either side is device memory. Two engines of one
// process use each other's device pointers directly (the driver opens no IPC
// handle in the process that exported it), once the driver confirms them. Local device memory
// and peer host memory that is not mapped here go through a host buffer on
// the calling thread (StagedCma).
// Thread safety: DeviceImports is thread-safe; the functions touch only what
// they are given.
#ifndef HIXL_TRANSPORT_SHM_SHM_DEVICE_H_
#define HIXL_TRANSPORT_SHM_SHM_DEVICE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/net.h"
#include "common/wire.h"
#include "hixl/hixl.h"
#include "memory/local_regions.h"
#include "memory/remote_regions.h"

namespace hixl::transport::shm {

// Target side: the region's entry for peers (its allocation's IPC handle or
// "vmm", the region's offset in it, the device's UUID), or, when peers
// cannot open it, the reason ("none").
void DescribeDeviceRegion(const memory::LocalRegion& r, wire::Msg& info);
// Target side: a new descriptor of the physical memory of VMM device region
// r, for a peer's "getvmm" request (the caller sends and closes it).
Status ExportDeviceRegion(const memory::LocalRegion& r, int& fd);

// Initiator side: the peer's device allocations opened in this process, by
// the peer's buffer id (never reused by the peer, so memory it freed and
// allocated again at the same address is opened anew). An allocation is
// closed when the last region using it is gone.
class DeviceImports {
 public:
  explicit DeviceImports(std::string peer) : peer_(std::move(peer)) {}
  // Asks the peer for region id's physical memory (VMM), over the link's
  // Unix socket.
  using FetchFd = std::function<Status(uint64_t id, net::Fd& fd)>;
  // Makes the device region r reachable: r.mapped is then this process's
  // pointer to its first byte, on device r.device_ordinal.
  Status Prepare(memory::RemoteRegion& r, const wire::Msg* info, const FetchFd& fetch);

 private:
  struct Import;
  std::string peer_;
  std::mutex mu_;
  std::map<uint64_t, std::weak_ptr<Import>> by_buffer_;
};

// Copies len bytes between local and the peer's memory at remote when one
// side is device memory: `mapped` is where the peer's bytes lie in this
// process (imported device memory or a mapping of its host memory);
// ordinal is the device of the device side.
Status CopyDevice(TransferOp op, uintptr_t local, char* mapped, size_t len, int ordinal,
                  const device::StreamEvent& after = nullptr);

// Local device memory and peer host memory reached by cross-memory attach
// meet in this thread's host buffer, kStageBytes at a time.
inline constexpr size_t kStageBytes = 4u << 20;
char* StagingBuffer();

}  // namespace hixl::transport::shm

#endif  // HIXL_TRANSPORT_SHM_SHM_DEVICE_H_
