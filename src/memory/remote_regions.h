// What an initiator knows of one peer's registered regions, and the check of
// transfer descriptors against them.
//
// A RemoteRegion is pinned by every transfer validated against it: the
// transfer holds a reference (RegionRef) until it ends. The peer's removal of
// a region takes it out of the table and marks it revoked (no new transfer
// resolves against it); the removal is acknowledged only once the last
// reference is gone (a weak_ptr to it has expired), which is how
// DeregisterMem on the peer knows no transfer still touches it.
// Thread safety: RemoteRegionTable is thread-safe; a RemoteRegion's fields
// are immutable once it is in a table, except revoked.
#ifndef HIXL_MEMORY_REMOTE_REGIONS_H_
#define HIXL_MEMORY_REMOTE_REGIONS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "hixl/hixl.h"

namespace hixl::memory {

struct RemoteRegion {
  RemoteRegion(uint64_t id_, uintptr_t addr_, size_t len_, uint32_t perms_, bool shareable_)
      : id(id_), addr(addr_), len(len_), perms(perms_), shareable(shareable_) {}
  ~RemoteRegion();
  RemoteRegion(const RemoteRegion&) = delete;
  RemoteRegion& operator=(const RemoteRegion&) = delete;

  const uint64_t id;
  const uintptr_t addr;  // in the peer's address space
  const size_t len;
  const uint32_t perms;
  const bool shareable;  // backed by a memfd the peer will pass us

  // Set by a transport before the region is published: a local mapping of
  // the peer's memory (shm) — the peer's bytes [map_lo, map_hi), a part of
  // the region or all of it, are at `mapped` here; map_base/map_len is the
  // mapping, unmapped when the region is destroyed.
  char* mapped = nullptr;
  uintptr_t map_lo = 0, map_hi = 0;
  void* map_base = nullptr;
  size_t map_len = 0;
  // Set by a transport before the region is published: what it needs to reach
  // the region (UCX: the unpacked remote key), released with the region.
  std::shared_ptr<void> transport_state;
  // The peer registered device memory (MEM_DEVICE). shm moves its bytes
  // once it imported it (`mapped` is then a device pointer of this process,
  // on its device device_ordinal); tcp lets the target stage them; the
  // engine refuses the other links.
  bool device = false;
  int device_ordinal = -1;
  std::string unreachable;  // device memory this link cannot reach: why

  // Set when the peer removed the region (RemoteRegionTable::Remove).
  std::atomic<bool> revoked{false};
};

using RegionRef = std::shared_ptr<RemoteRegion>;
// A region a thread resolved against last, for the next transfer's quick
// check (RemoteRegionTable::Resolve); it does not keep the region alive.
using RegionHint = std::weak_ptr<RemoteRegion>;

// One piece of a transfer: len bytes between local and remote.
struct Slice {
  uintptr_t local = 0;
  uintptr_t remote = 0;
  size_t len = 0;
  RemoteRegion* region = nullptr;  // kept alive by the transfer's pins
  // The local side lies in device memory this engine registered: the device's
  // ordinal (set by the engine after Resolve); -1 for host memory.
  int local_device = -1;
};

class RemoteRegionTable {
 public:
  // Adds r unless a region with its id is known (returns false then).
  bool Insert(RegionRef r);
  bool Contains(uint64_t id) const;
  // Removes the named regions (unknown ids are skipped), marks them revoked
  // and returns them.
  std::vector<RegionRef> Remove(const std::vector<uint64_t>& ids);
  std::vector<RegionRef> RemoveAll();
  size_t size() const;
  // Every region now in the table (for diagnostics).
  std::vector<RegionRef> Snapshot() const;

  // Checks every descriptor (non-zero length and addresses, no wrap-around,
  // wholly inside one region, permission for op). On success fills slices
  // and pins each region used; on failure both are left empty and nothing
  // is pinned. Their storage is reused (a caller may keep the vectors
  // between transfers); pinned must hold no pins on entry.
  //
  // hint (optional, one per thread and table): when every descriptor lies
  // in the region it names and that region is not revoked, the descriptors
  // are checked against it without the table's lock; a transfer resolved
  // against exactly one region leaves that region in *hint.
  Status Resolve(TransferOp op, const std::vector<TransferOpDesc>& descs,
                 std::vector<Slice>& slices, std::vector<RegionRef>& pinned,
                 RegionHint* hint = nullptr) const;

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, RegionRef> by_addr_;
  std::unordered_map<uint64_t, uintptr_t> by_id_;
};

// Drops the pins Resolve took.
inline void Unpin(std::vector<RegionRef>& pinned) { pinned.clear(); }

}  // namespace hixl::memory

#endif  // HIXL_MEMORY_REMOTE_REGIONS_H_
