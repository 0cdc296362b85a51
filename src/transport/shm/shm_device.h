// The shm transport's part for CUDA device memory (device/cuda.h): a target
// describes a device region by a legacy IPC handle of its allocation; an
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
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/wire.h"
#include "hixl/hixl.h"
#include "memory/local_regions.h"
#include "memory/remote_regions.h"

namespace hixl::transport::shm {

// Target side: the region's entry for peers (its allocation's IPC handle,
// the region's offset in it, the device's UUID). Leaves info null when the
// driver refuses a handle (peers then cannot reach the region).
void DescribeDeviceRegion(const memory::LocalRegion& r, wire::Msg& info);

// Initiator side: the peer's device allocations opened in this process, by
// the peer's buffer id (never reused by the peer, so memory it freed and
// allocated again at the same address is opened anew). An allocation is
// closed when the last region using it is gone.
class DeviceImports {
 public:
  explicit DeviceImports(std::string peer) : peer_(std::move(peer)) {}
  // Makes the device region r reachable: r.mapped is then this process's
  // pointer to its first byte, on device r.device_ordinal.
  Status Prepare(memory::RemoteRegion& r, const wire::Msg* info);

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
