// tests/unit/user_share_test.cc — memory/user_share.h in one process: which
// memory is found shareable, the in-place move into a memfd and back
// (addresses, contents and neighbouring bytes kept), and the refusals.
#include "memory/user_share.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using hixl::StatusCode;
using hixl::memory::ReadMappings;
using hixl::memory::UserShare;
using hixl::memory::Vma;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// An anonymous private mapping, unmapped at the end of the test.
struct Anon {
  explicit Anon(size_t n) : len(n) {
    p = static_cast<unsigned char*>(
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~Anon() {
    if (p != MAP_FAILED && p != nullptr) munmap(p, len);
  }
  uintptr_t at(size_t off) const { return reinterpret_cast<uintptr_t>(p) + off; }
  unsigned char* p;
  size_t len;
};

Vma MappingAt(uintptr_t addr) {
  std::vector<Vma> v;
  EXPECT_TRUE(ReadMappings(addr, addr + 1, v).ok());
  return v.empty() ? Vma{} : v.front();
}

void Fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
}
bool Same(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<unsigned char>((i * 131 + seed) >> 3)) return false;
  }
  return true;
}

TEST(UserShare, PlainAnonymousMemoryIsNotSharedWithoutTheFlag) {
  Anon a(16 * kPage);
  std::unique_ptr<UserShare> s;
  ASSERT_TRUE(UserShare::Make(a.at(0), a.len, false, s).ok());
  EXPECT_EQ(s, nullptr);
  EXPECT_FALSE(MappingAt(a.at(0)).shared);
}

TEST(UserShare, MoveKeepsAddressesAndContentsAndGoesBack) {
  Anon a(64 * kPage);
  ASSERT_NE(a.p, MAP_FAILED);
  Fill(a.p, a.len, 7);
  std::unique_ptr<UserShare> s;
  ASSERT_TRUE(UserShare::Make(a.at(0), a.len, true, s).ok());
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->moved());
  EXPECT_EQ(s->part().region_off, 0u);
  EXPECT_EQ(s->part().len, a.len);
  EXPECT_TRUE(s->part().sealed);
  EXPECT_TRUE(MappingAt(a.at(0)).shared);
  EXPECT_TRUE(Same(a.p, a.len, 7));
  // Another mapping of the memfd sees the same bytes both ways.
  void* peer = mmap(nullptr, a.len, PROT_READ | PROT_WRITE, MAP_SHARED, s->part().fd, 0);
  ASSERT_NE(peer, MAP_FAILED);
  Fill(static_cast<unsigned char*>(peer), a.len, 9);
  EXPECT_TRUE(Same(a.p, a.len, 9));
  s.reset();  // moved back to private pages
  EXPECT_FALSE(MappingAt(a.at(0)).shared);
  EXPECT_TRUE(Same(a.p, a.len, 9));
  // The peer's stale mapping no longer reaches this memory.
  std::memset(peer, 0, a.len);
  EXPECT_TRUE(Same(a.p, a.len, 9));
  munmap(peer, a.len);
}

TEST(UserShare, UnalignedRegionMovesOnlyItsWholePages) {
  Anon a(32 * kPage);
  Fill(a.p, a.len, 3);
  const size_t off = kPage + 100, len = 20 * kPage + 300;  // partial pages at both ends
  std::unique_ptr<UserShare> s;
  ASSERT_TRUE(UserShare::Make(a.at(off), len, true, s).ok());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->part().region_off, kPage - 100);
  EXPECT_EQ(s->part().len, 19 * kPage);         // [2, 21) pages; the region ends in page 21
  EXPECT_FALSE(MappingAt(a.at(kPage)).shared);  // the partial head page stays private
  EXPECT_TRUE(MappingAt(a.at(2 * kPage)).shared);
  EXPECT_TRUE(MappingAt(a.at(20 * kPage)).shared);
  EXPECT_FALSE(MappingAt(a.at(21 * kPage)).shared);  // the partial tail page
  EXPECT_TRUE(Same(a.p, a.len, 3));
  s.reset();
  EXPECT_FALSE(MappingAt(a.at(2 * kPage)).shared);
  EXPECT_TRUE(Same(a.p, a.len, 3));
}

TEST(UserShare, RegionWithoutAWholePageIsLeftAlone) {
  Anon a(4 * kPage);
  std::unique_ptr<UserShare> s;
  ASSERT_TRUE(UserShare::Make(a.at(100), kPage, true, s).ok());
  EXPECT_EQ(s, nullptr);
}

TEST(UserShare, SealedMemfdIsSharedWithoutTheFlagUnsealedOnlyWithIt) {
  for (bool sealed : {true, false}) {
    SCOPED_TRACE(sealed ? "sealed" : "unsealed");
    int fd = memfd_create("user-share-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT_GE(fd, 0);
    const size_t n = 8 * kPage;
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(n)), 0);
    if (sealed) {
      ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    auto* p =
        static_cast<unsigned char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ASSERT_NE(p, MAP_FAILED);
    std::unique_ptr<UserShare> s;
    const uintptr_t at = reinterpret_cast<uintptr_t>(p) + 3 * kPage + 8;
    ASSERT_TRUE(UserShare::Make(at, 2 * kPage, false, s).ok());
    EXPECT_EQ(s != nullptr, sealed);
    ASSERT_TRUE(UserShare::Make(at, 2 * kPage, true, s).ok());
    ASSERT_NE(s, nullptr);
    EXPECT_FALSE(s->moved());
    EXPECT_EQ(s->part().sealed, sealed);
    EXPECT_EQ(s->part().region_off, 0u);
    EXPECT_EQ(s->part().len, 2 * kPage);
    EXPECT_EQ(s->part().file_off, 3 * kPage + 8);
    // The descriptor found is the same file, opened anew.
    p[3 * kPage + 8] = 0x5a;
    unsigned char b = 0;
    ASSERT_EQ(pread(s->part().fd, &b, 1, static_cast<off_t>(s->part().file_off)), 1);
    EXPECT_EQ(b, 0x5a);
    s.reset();
    munmap(p, n);
    close(fd);
  }
}

TEST(UserShare, FileWhoseDescriptorIsClosedIsFoundOrRefusedClearly) {
  int fd = memfd_create("user-share-closed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  const size_t n = 4 * kPage;
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(n)), 0);
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  close(fd);  // only the mapping is left: /proc/self/map_files needs privileges
  std::unique_ptr<UserShare> s;
  hixl::Status st = UserShare::Make(reinterpret_cast<uintptr_t>(p), n, true, s);
  if (st.ok()) {
    ASSERT_NE(s, nullptr);  // privileged: reopened through /proc/self/map_files
  } else {
    EXPECT_EQ(st.code(), StatusCode::kParamInvalid);
    EXPECT_NE(st.message().find("descriptor"), std::string::npos) << st.ToString();
  }
  s.reset();
  munmap(p, n);
}

TEST(UserShare, UnshareableMemoryIsAClearErrorWithTheFlag) {
  std::unique_ptr<UserShare> s;
  // The stack.
  char local[3 * 4096];
  hixl::Status st = UserShare::Make(reinterpret_cast<uintptr_t>(local), sizeof(local), true, s);
  EXPECT_EQ(st.code(), StatusCode::kParamInvalid) << st.ToString();
  // Unmapped memory.
  Anon a(8 * kPage);
  ASSERT_EQ(munmap(a.p + 4 * kPage, 4 * kPage), 0);
  st = UserShare::Make(a.at(0), 8 * kPage, true, s);
  EXPECT_EQ(st.code(), StatusCode::kParamInvalid) << st.ToString();
  EXPECT_TRUE(UserShare::Make(a.at(0), 8 * kPage, false, s).ok());  // no flag: CMA decides later
  EXPECT_EQ(s, nullptr);
  a.len = 4 * kPage;
  // A read-only page in the middle: not one protection.
  Anon b(8 * kPage);
  ASSERT_EQ(mprotect(b.p + 2 * kPage, kPage, PROT_READ), 0);
  st = UserShare::Make(b.at(0), 8 * kPage, true, s);
  EXPECT_EQ(st.code(), StatusCode::kParamInvalid) << st.ToString();
  EXPECT_FALSE(MappingAt(b.at(0)).shared);  // nothing was moved
}

TEST(UserShare, PagesUnmappedWhileRegisteredAreNotTouchedOnTheWayBack) {
  Anon a(8 * kPage);
  std::unique_ptr<UserShare> s;
  ASSERT_TRUE(UserShare::Make(a.at(0), a.len, true, s).ok());
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(munmap(a.p, a.len), 0);  // the application freed registered memory
  s.reset();                         // warns, maps nothing there
  std::vector<Vma> v;
  ASSERT_TRUE(ReadMappings(a.at(0), a.at(a.len), v).ok());
  EXPECT_TRUE(v.empty());
  a.p = nullptr;
}

}  // namespace
