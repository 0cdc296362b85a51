// Sharing registered application memory with local peers by mapping.
//
// Peers on this host reach a region either by cross-memory attach
// (process_vm_writev/readv: one system call per transfer, about half of
// memcpy speed) or, when they can map the same pages, by plain memory
// copies. UserShare decides, at RegisterMem, whether and how the region's
// pages can be mapped by a peer, by reading this process's own mappings
// (/proc/self/maps):
//   - a shared file mapping sealed against shrinking (a memfd the
//     application sealed): shared as it is, always;
//   - any other shared file mapping (/dev/shm, an unsealed memfd, a torch
//     shared-memory tensor): shared only with REGISTER_SHARE_BY_MAPPING, the
//     application promising not to truncate the file while registered;
//   - private anonymous memory (malloc, numpy, torch CPU tensors): with
//     REGISTER_SHARE_BY_MAPPING, the whole pages inside the region are moved
//     in place into a new sealed memfd (same addresses, contents kept) and
//     moved back when the UserShare is destroyed. Bytes of the region in a
//     page it shares with other memory stay where they are and are reached
//     by cross-memory attach, so neighbouring data is never touched.
// Thread safety: a UserShare is not shared between threads; Make and the
// destructor must not run concurrently with writes to the region or with
// another Make/destructor on overlapping pages (the engine serializes them).
// Ownership: a UserShare owns its file descriptor.
#ifndef HIXL_MEMORY_USER_SHARE_H_
#define HIXL_MEMORY_USER_SHARE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hixl/status.h"
#include "memory/local_regions.h"

namespace hixl::memory {

// One line of /proc/self/maps.
struct Vma {
  uintptr_t lo = 0, hi = 0;
  bool read = false, write = false, exec = false, shared = false;
  uint64_t offset = 0;  // in the file
  unsigned dev_major = 0, dev_minor = 0;
  uint64_t inode = 0;
  std::string path;  // may end in " (deleted)"; "[heap]" etc. for special ones
};

// The mappings intersecting [lo, hi), in address order.
Status ReadMappings(uintptr_t lo, uintptr_t hi, std::vector<Vma>& out);

class UserShare {
 public:
  // Sets out to how [addr, addr+len) is shared, or to null when it is not
  // (peers then use cross-memory attach). by_mapping: the region was
  // registered with REGISTER_SHARE_BY_MAPPING; then memory that cannot be
  // shared is an error (PARAM_INVALID, saying why) instead of a fallback.
  static Status Make(uintptr_t addr, size_t len, bool by_mapping, std::unique_ptr<UserShare>& out);
  ~UserShare();
  UserShare(const UserShare&) = delete;
  UserShare& operator=(const UserShare&) = delete;

  const SharedPart& part() const { return part_; }
  // The pages were moved into an engine memfd (and go back on destruction).
  bool moved() const { return moved_len_ != 0; }

 private:
  UserShare() = default;
  static Status ShareFile(uintptr_t addr, size_t len, bool by_mapping, const std::vector<Vma>& vmas,
                          std::unique_ptr<UserShare>& out);
  static Status MoveAnonymous(uintptr_t addr, size_t len, const std::vector<Vma>& vmas,
                              std::unique_ptr<UserShare>& out);
  void MoveBack();

  SharedPart part_;
  // For a move: the pages [moved_lo, moved_lo + moved_len) now map the memfd
  // (dev/inode kept to check they still do before moving them back).
  uintptr_t moved_lo_ = 0;
  size_t moved_len_ = 0;
  int moved_prot_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace hixl::memory

#endif  // HIXL_MEMORY_USER_SHARE_H_
