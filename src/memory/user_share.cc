#include "memory/user_share.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace hixl::memory {
namespace {

size_t PageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

Status Errno(const std::string& what, int err) {
  return Status::Failed(what + ": " + std::strerror(err));
}

bool SameFile(const struct stat& st, const Vma& v) {
  return S_ISREG(st.st_mode) && st.st_ino == v.inode && major(st.st_dev) == v.dev_major &&
         minor(st.st_dev) == v.dev_minor;
}

// The VMAs cover [lo, hi) without a gap.
bool Covers(const std::vector<Vma>& vmas, uintptr_t lo, uintptr_t hi) {
  if (vmas.empty() || vmas.front().lo > lo || vmas.back().hi < hi) return false;
  for (size_t i = 1; i < vmas.size(); ++i) {
    if (vmas[i].lo != vmas[i - 1].hi) return false;
  }
  return true;
}

// Every VMA maps the same file, shared, with offsets following addresses.
bool OneSharedFile(const std::vector<Vma>& vmas) {
  const Vma& f = vmas.front();
  for (const Vma& v : vmas) {
    if (!v.shared || v.inode == 0 || v.inode != f.inode || v.dev_major != f.dev_major ||
        v.dev_minor != f.dev_minor || v.offset != f.offset + (v.lo - f.lo)) {
      return false;
    }
  }
  return true;
}

// A read-write descriptor of the file v maps: one this process holds, else
// /proc/self/map_files (needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), else
// its path when it still has one. -1 when none works.
int OpenMappedFile(const Vma& v) {
  auto verify = [&](int fd) {
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !SameFile(st, v))) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
  if (DIR* d = opendir("/proc/self/fd")) {
    int found = -1;
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      long n = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || n == dirfd(d)) continue;
      struct stat st;
      if (fstat(static_cast<int>(n), &st) != 0 || !SameFile(st, v)) continue;
      // Open it anew (read-write, close-on-exec) rather than dup: the
      // application's descriptor may be read-only or have its own flags.
      std::string p = "/proc/self/fd/" + std::to_string(n);
      found = verify(::open(p.c_str(), O_RDWR | O_CLOEXEC));
      if (found >= 0) break;
    }
    closedir(d);
    if (found >= 0) return found;
  }
  char p[64];
  std::snprintf(p, sizeof(p), "/proc/self/map_files/%" PRIxPTR "-%" PRIxPTR, v.lo, v.hi);
  if (int fd = verify(::open(p, O_RDWR | O_CLOEXEC)); fd >= 0) return fd;
  static constexpr char kDeleted[] = " (deleted)";
  const size_t dl = sizeof(kDeleted) - 1;
  if (!v.path.empty() && v.path[0] == '/' &&
      !(v.path.size() >= dl && v.path.compare(v.path.size() - dl, dl, kDeleted) == 0)) {
    if (int fd = verify(::open(v.path.c_str(), O_RDWR | O_CLOEXEC)); fd >= 0) return fd;
  }
  return -1;
}

int ProtOf(const Vma& v) {
  return (v.read ? PROT_READ : 0) | (v.write ? PROT_WRITE : 0) | (v.exec ? PROT_EXEC : 0);
}

}  // namespace

Status ReadMappings(uintptr_t lo, uintptr_t hi, std::vector<Vma>& out) {
  out.clear();
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return Errno("reading /proc/self/maps", errno);
  char* line = nullptr;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    Vma v;
    char perms[5] = {};
    unsigned long long vlo = 0, vhi = 0, off = 0, ino = 0;
    int name_at = 0;
    if (std::sscanf(line, "%llx-%llx %4s %llx %x:%x %llu %n", &vlo, &vhi, perms, &off, &v.dev_major,
                    &v.dev_minor, &ino, &name_at) < 7) {
      continue;
    }
    if (vhi <= lo) continue;
    if (vlo >= hi) break;  // the file lists mappings in address order
    v.lo = static_cast<uintptr_t>(vlo);
    v.hi = static_cast<uintptr_t>(vhi);
    v.read = perms[0] == 'r';
    v.write = perms[1] == 'w';
    v.exec = perms[2] == 'x';
    v.shared = perms[3] == 's';
    v.offset = off;
    v.inode = ino;
    v.path = line + name_at;
    while (!v.path.empty() && (v.path.back() == '\n' || v.path.back() == ' ')) v.path.pop_back();
    out.push_back(std::move(v));
  }
  std::free(line);
  std::fclose(f);
  return Status::Ok();
}

Status UserShare::Make(uintptr_t addr, size_t len, bool by_mapping,
                       std::unique_ptr<UserShare>& out) {
  out.reset();
  std::vector<Vma> vmas;
  if (Status s = ReadMappings(addr, addr + len, vmas); !s.ok()) {
    return by_mapping ? s : Status::Ok();
  }
  if (!Covers(vmas, addr, addr + len)) {
    // Unmapped memory: cross-memory attach reports it (EFAULT) per transfer.
    return by_mapping ? Status::ParamInvalid(
                            "RegisterMem: REGISTER_SHARE_BY_MAPPING: part of the region is not "
                            "mapped in this process")
                      : Status::Ok();
  }
  if (vmas.front().shared) return ShareFile(addr, len, by_mapping, vmas, out);
  if (!by_mapping) return Status::Ok();
  return MoveAnonymous(addr, len, vmas, out);
}

Status UserShare::ShareFile(uintptr_t addr, size_t len, bool by_mapping,
                            const std::vector<Vma>& vmas, std::unique_ptr<UserShare>& out) {
  auto refuse = [&](const std::string& why) {
    return by_mapping ? Status::ParamInvalid("RegisterMem: REGISTER_SHARE_BY_MAPPING: " + why)
                      : Status::Ok();
  };
  if (!OneSharedFile(vmas)) {
    return refuse("the region spans mappings that are not one shared file");
  }
  for (const Vma& v : vmas) {
    if (!v.read || !v.write) return refuse("the region's shared mapping is not read-write");
  }
  const Vma& f = vmas.front();
  int fd = OpenMappedFile(f);
  if (fd < 0) {
    return refuse("cannot open the file the region maps (" + f.path +
                  "): keep a descriptor of it open while registering");
  }
  auto share = std::unique_ptr<UserShare>(new UserShare);
  share->part_.fd = fd;  // owned from here
  int seals = fcntl(fd, F_GET_SEALS);
  share->part_.sealed = seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
  if (!share->part_.sealed && !by_mapping) return Status::Ok();  // CMA; closes fd
  share->part_.region_off = 0;
  share->part_.len = len;
  share->part_.file_off = f.offset + (addr - f.lo);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < share->part_.file_off + len) {
    return refuse("the region reaches past the end of the file it maps");
  }
  out = std::move(share);
  return Status::Ok();
}

Status UserShare::MoveAnonymous(uintptr_t addr, size_t len, const std::vector<Vma>& all,
                                std::unique_ptr<UserShare>& out) {
  const size_t pg = PageSize();
  const uintptr_t lo = (addr + pg - 1) / pg * pg;
  const uintptr_t hi = (addr + len) / pg * pg;
  if (hi <= lo) return Status::Ok();  // no whole page inside: nothing to move
  std::vector<Vma> vmas;
  for (const Vma& v : all) {
    if (v.hi > lo && v.lo < hi) vmas.push_back(v);
  }
  if (!Covers(vmas, lo, hi)) {
    return Status::ParamInvalid(
        "RegisterMem: REGISTER_SHARE_BY_MAPPING: part of the region is not mapped");
  }
  const int prot = ProtOf(vmas.front());
  for (const Vma& v : vmas) {
    if (v.shared || v.inode != 0 ||
        (!v.path.empty() && v.path != "[heap]" && v.path.rfind("[anon:", 0) != 0)) {
      return Status::ParamInvalid(
          "RegisterMem: REGISTER_SHARE_BY_MAPPING: the region is neither one shared file mapping "
          "nor private anonymous memory (" +
          (v.path.empty() ? std::string("a private file mapping") : v.path) + ")");
    }
    if (ProtOf(v) != prot || !v.read) {
      return Status::ParamInvalid(
          "RegisterMem: REGISTER_SHARE_BY_MAPPING: the region's pages are not all readable with "
          "one protection");
    }
  }
  const size_t n = hi - lo;
  int fd = memfd_create("hixl-user", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("RegisterMem: memfd_create", errno);
  auto share = std::unique_ptr<UserShare>(new UserShare);
  share->part_.fd = fd;
  if (ftruncate(fd, static_cast<off_t>(n)) != 0) return Errno("RegisterMem: ftruncate", errno);
  void* tmp = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (tmp == MAP_FAILED) return Errno("RegisterMem: mmap of memfd", errno);
  // Commit the pages first (ENOMEM shows here, not as SIGBUS later); kernels
  // before 5.14 lack MADV_POPULATE_WRITE and fault them in during the copy.
  if (madvise(tmp, n, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
    int err = errno;
    munmap(tmp, n);
    return Errno("RegisterMem: committing memory for the region", err);
  }
  std::memcpy(tmp, reinterpret_cast<void*>(lo), n);
  munmap(tmp, n);
  // The commit point: one call replaces the private pages by the memfd's
  // (mmap with MAP_FIXED, not mremap: memory hooks such as UCX's may drop
  // mremap's new-address argument).
  if (mmap(reinterpret_cast<void*>(lo), n, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    return Errno("RegisterMem: moving the region into shared memory", errno);
  }
  share->moved_lo_ = lo;
  share->moved_len_ = n;
  share->moved_prot_ = prot;
  struct stat st;
  if (fstat(fd, &st) == 0) {
    share->dev_ = st.st_dev;
    share->ino_ = st.st_ino;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Errno("RegisterMem: sealing the region's memfd", errno);  // moves back
  }
  share->part_.region_off = lo - addr;
  share->part_.len = n;
  share->part_.file_off = 0;
  share->part_.sealed = true;
  out = std::move(share);
  return Status::Ok();
}

void UserShare::MoveBack() {
  const uintptr_t lo = moved_lo_, hi = moved_lo_ + moved_len_;
  // Only pages that still map our memfd go back: if the application unmapped
  // or replaced them while registered, whatever is there now is not ours.
  std::vector<Vma> vmas;
  bool ours = ReadMappings(lo, hi, vmas).ok() && Covers(vmas, lo, hi);
  for (const Vma& v : vmas) {
    ours = ours && v.shared && v.inode == ino_ && v.dev_major == major(dev_) &&
           v.dev_minor == minor(dev_) && v.offset == v.lo - lo;
  }
  if (!ours) {
    HIXL_LOG(WARN) << "DeregisterMem: the pages of a region registered with "
                      "REGISTER_SHARE_BY_MAPPING were unmapped or replaced while registered; "
                      "leaving that memory as it is";
    return;
  }
  // The memfd keeps the bytes while private pages replace its mapping; then
  // they are copied in.
  void* from = mmap(nullptr, moved_len_, PROT_READ, MAP_SHARED, part_.fd, 0);
  if (from == MAP_FAILED) {
    HIXL_LOG(WARN) << "DeregisterMem: cannot map a region's memfd to move it back ("
                   << std::strerror(errno) << "); it stays in shared memory, contents intact";
    return;
  }
  void* to = mmap(reinterpret_cast<void*>(lo), moved_len_, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (to == MAP_FAILED) {
    // MAP_FIXED may have unmapped the range before failing: put the memfd back.
    int err = errno;
    mmap(reinterpret_cast<void*>(lo), moved_len_, moved_prot_, MAP_SHARED | MAP_FIXED, part_.fd, 0);
    HIXL_LOG(WARN) << "DeregisterMem: cannot allocate private pages to move a region back ("
                   << std::strerror(err) << "); it stays in shared memory, contents intact";
  } else {
    (void)madvise(to, moved_len_, MADV_POPULATE_WRITE);  // faster than a fault per page
    std::memcpy(to, from, moved_len_);
    if (moved_prot_ != (PROT_READ | PROT_WRITE)) mprotect(to, moved_len_, moved_prot_);
  }
  munmap(from, moved_len_);
}

UserShare::~UserShare() {
  if (moved()) MoveBack();
  if (part_.fd >= 0) ::close(part_.fd);
}

}  // namespace hixl::memory
