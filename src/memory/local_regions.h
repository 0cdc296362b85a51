// The table of regions this engine registered for remote access.
// Regions never overlap; each has a non-zero id that is never reused within
// one engine's life. A region local peers may map carries the file that
// backs it (AllocMem's memfd, or one found or made by memory/user_share.h);
// the table does not own that descriptor, the engine does.
// Thread safety: all methods are thread-safe (one internal mutex).
#ifndef HIXL_MEMORY_LOCAL_REGIONS_H_
#define HIXL_MEMORY_LOCAL_REGIONS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "device/cuda.h"
#include "hixl/hixl.h"

namespace hixl::memory {

// What a peer maps: [region_off, region_off+len) of the region is the file's
// bytes from file_off.
struct SharedPart {
  int fd = -1;  // -1: not shareable (peers use cross-memory attach)
  size_t region_off = 0;
  size_t len = 0;
  uint64_t file_off = 0;
  bool sealed = true;  // the file cannot shrink; else its owner promised not to
};

struct LocalRegion {
  uint64_t id = 0;
  uintptr_t addr = 0;
  size_t len = 0;
  uint32_t perms = 0;
  MemType type = MemType::MEM_HOST;
  SharedPart share;          // how local peers may map it
  device::PtrInfo dev;       // MEM_DEVICE: its device and allocation
  bool retiring = false;     // being deregistered: see LocalRegions::Retire
};

class LocalRegions {
 public:
  // Adds a region. Same addr and len as an existing region: returns that
  // region's id with added=false. Partial overlap: PARAM_INVALID.
  Status Add(const LocalRegion& r, uint64_t& id, bool& added);
  // Marks a region as being deregistered and returns it (nullopt if unknown
  // or already retiring). A retiring region still serves FindContaining —
  // requests that peers checked against it before they heard of its removal
  // are answered, not treated as hostile — but is left out of Snapshot (new
  // peers never learn of it), and Add of the same range is refused. Remove
  // it once every peer confirmed.
  std::optional<LocalRegion> Retire(uint64_t id);
  // Removes and returns the region; nullopt if unknown.
  std::optional<LocalRegion> Remove(uint64_t id);
  std::optional<LocalRegion> Find(uint64_t id) const;
  std::optional<LocalRegion> FindByStart(uintptr_t addr) const;
  // A region sharing at least one byte with [addr, addr+len), or nullopt.
  std::optional<LocalRegion> FindOverlapping(uintptr_t addr, size_t len) const;
  // Finds the region that wholly contains [addr, addr+len).
  std::optional<LocalRegion> FindContaining(uintptr_t addr, size_t len) const;
  std::vector<LocalRegion> Snapshot() const;
  // A shareable region's part, its fd a dup() the caller closes; fd -1 when
  // the region is unknown or not shareable.
  SharedPart DupShared(uint64_t id) const;
  // Removes everything, returning the regions.
  std::vector<LocalRegion> Clear();

 private:
  mutable std::mutex mu_;
  uint64_t next_id_ = 1;
  std::map<uintptr_t, LocalRegion> by_addr_;  // key: start address
  std::unordered_map<uint64_t, uintptr_t> by_id_;
};

}  // namespace hixl::memory

#endif  // HIXL_MEMORY_LOCAL_REGIONS_H_
