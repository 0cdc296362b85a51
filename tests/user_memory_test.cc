// tests/user_memory_test.cc — registered application memory reached by
// mapping over shm (memory/user_share.h): a hixl_test_peer registers its own
// memory (anonymous with REGISTER_SHARE_BY_MAPPING, memfds sealed or not,
// /dev/shm files) and this process writes and reads it. Each test checks the
// bytes on both sides, that the guard bytes around (and in the same pages as)
// a region are intact, and whether this process really mapped the peer's
// file (its /proc/self/maps) or fell back to cross-memory attach.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"
#include "peer_process.h"

namespace {

using hixl::Hixl;
using hixl::Status;
using hixl::StatusCode;
using hixl::TransferOp;
using hixl_test::Buffer;
using hixl_test::PeerProcess;
using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = 1024 * 1024;
constexpr size_t kPage = 4096;

// Whether a mapping whose path contains needle exists in this process.
bool SelfMaps(const std::string& needle) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

// Waits (bounded) until SelfMaps(needle) == want.
bool SelfMapsBecomes(const std::string& needle, bool want) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (SelfMaps(needle) != want) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

class UserMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    peer_ = std::make_unique<PeerProcess>();
    ASSERT_TRUE(peer_->Start());
  }
  void Connect() {
    HIXL_ASSERT_OK(engine_.Initialize("127.0.0.1:0", {{hixl::options::kLinkType, "SHM"}}));
    HIXL_ASSERT_OK(engine_.Connect(peer_->engine(), 5000));
  }
  void TearDown() override {
    engine_.Finalize();
    peer_.reset();
  }
  Status Xfer(TransferOp op, uintptr_t local, uintptr_t remote, size_t n) {
    return engine_.TransferSync(peer_->engine(), op, {{local, remote, n}}, 10000);
  }
  uintptr_t Addr(const std::string& reply) { return std::stoull(hixl_test::OkValue(reply)); }
  // Writes a pattern over [0, n) of the peer's region at remote, in one
  // descriptor and then again in 4 KiB descriptors offset by 1000 bytes
  // (crossing every page boundary), and reads it back both ways.
  void WriteReadCheck(const std::string& name, uintptr_t remote, size_t n, uint64_t seed) {
    Buffer src(n);
    hixl_test::FillPattern(src.data(), n, seed);
    HIXL_ASSERT_OK(Xfer(TransferOp::WRITE, src.addr(), remote, n));
    ASSERT_EQ(peer_->Hash(name, 0, n), src.HashHex());
    hixl_test::FillPattern(src.data(), n, seed + 1);
    std::vector<hixl::TransferOpDesc> descs;
    for (size_t off = 1000; off < n; off += kPage) {
      descs.push_back({src.addr(off), remote + off, std::min(kPage, n - off)});
    }
    descs.push_back({src.addr(0), remote, 1000});
    HIXL_ASSERT_OK(engine_.TransferSync(peer_->engine(), TransferOp::WRITE, descs, 10000));
    ASSERT_EQ(peer_->Hash(name, 0, n), src.HashHex());
    Buffer back(n, 0x11);
    HIXL_ASSERT_OK(Xfer(TransferOp::READ, back.addr(), remote, n));
    EXPECT_EQ(back.HashHex(), src.HashHex());
    Buffer back2(n, 0x22);
    for (auto& d : descs) d.local_addr = back2.addr(d.local_addr - src.addr());
    HIXL_ASSERT_OK(engine_.TransferSync(peer_->engine(), TransferOp::READ, descs, 10000));
    EXPECT_EQ(back2.HashHex(), src.HashHex());
    EXPECT_EQ(peer_->Send("canary " + name), "OK intact");
  }

  Hixl engine_;
  std::unique_ptr<PeerProcess> peer_;
};

TEST_F(UserMemoryTest, AnonymousMemoryMovedInPlaceIsMappedAndMovedBack) {
  const size_t n = 4 * kMiB;
  const std::string reply = peer_->Send("regshare r " + std::to_string(n) + " rw 0");
  ASSERT_TRUE(hixl_test::IsOk(reply)) << reply;
  const uintptr_t remote = Addr(reply);
  EXPECT_EQ(peer_->Send("mapstate r"), "OK shared /memfd:hixl-user (deleted)");
  ASSERT_NO_FATAL_FAILURE(Connect());
  EXPECT_TRUE(SelfMaps("memfd:hixl-user")) << "the peer's region was not mapped here";
  ASSERT_NO_FATAL_FAILURE(WriteReadCheck("r", remote, n, 41));
  const std::string written = peer_->Hash("r", 0, n);
  ASSERT_TRUE(peer_->Ok("dereg r"));
  // Back in private memory with its contents; our mapping of it is gone and
  // nothing reaches the region any more.
  EXPECT_EQ(peer_->Send("mapstate r"), "OK private");
  EXPECT_EQ(peer_->Hash("r", 0, n), written);
  EXPECT_TRUE(SelfMapsBecomes("memfd:hixl-user", false));
  Buffer src(n, 0x77);
  HIXL_EXPECT_NOT_OK(Xfer(TransferOp::WRITE, src.addr(), remote, n));
  EXPECT_EQ(peer_->Hash("r", 0, n), written);
  EXPECT_EQ(peer_->Send("canary r"), "OK intact");
}

// A region starting and ending inside pages it shares with guard bytes: the
// whole pages are mapped, the partial ones go by cross-memory attach, and no
// neighbouring byte changes.
TEST_F(UserMemoryTest, UnalignedRegionKeepsTheBytesItSharesPagesWith) {
  const size_t n = 3 * kMiB + 100;
  const std::string reply = peer_->Send("regshare u " + std::to_string(n) + " rw 1000");
  ASSERT_TRUE(hixl_test::IsOk(reply)) << reply;
  const uintptr_t remote = Addr(reply);
  ASSERT_NE(remote % kPage, 0u);
  ASSERT_NO_FATAL_FAILURE(Connect());
  EXPECT_TRUE(SelfMaps("memfd:hixl-user"));
  ASSERT_NO_FATAL_FAILURE(WriteReadCheck("u", remote, n, 51));
  // Small pieces at the very edges.
  Buffer one(16, 0x42);
  HIXL_ASSERT_OK(Xfer(TransferOp::WRITE, one.addr(), remote, 16));
  HIXL_ASSERT_OK(Xfer(TransferOp::WRITE, one.addr(), remote + n - 16, 16));
  EXPECT_EQ(peer_->Hash("u", 0, 16), one.HashHex());
  EXPECT_EQ(peer_->Hash("u", n - 16, 16), one.HashHex());
  // One byte past either end is refused and touches nothing.
  HIXL_EXPECT_NOT_OK(Xfer(TransferOp::WRITE, one.addr(), remote - 1, 16));
  HIXL_EXPECT_NOT_OK(Xfer(TransferOp::WRITE, one.addr(), remote + n - 15, 16));
  EXPECT_EQ(peer_->Send("canary u"), "OK intact");
  ASSERT_TRUE(peer_->Ok("dereg u"));
  EXPECT_EQ(peer_->Send("canary u"), "OK intact");
}

TEST_F(UserMemoryTest, ReadOnlyRegionSharedByMappingRefusesWrites) {
  const size_t n = 1 * kMiB;
  const std::string reply = peer_->Send("regshare ro " + std::to_string(n) + " r 0");
  ASSERT_TRUE(hixl_test::IsOk(reply)) << reply;
  const uintptr_t remote = Addr(reply);
  ASSERT_TRUE(peer_->Ok("fillpat ro 5"));
  const std::string before = peer_->Hash("ro", 0, n);
  ASSERT_NO_FATAL_FAILURE(Connect());
  Buffer src(n, 0x66);
  Status s = Xfer(TransferOp::WRITE, src.addr(), remote, n);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_EQ(peer_->Hash("ro", 0, n), before);
  Buffer back(n);
  HIXL_ASSERT_OK(Xfer(TransferOp::READ, back.addr(), remote, n));
  EXPECT_EQ(back.HashHex(), before);
}

TEST_F(UserMemoryTest, SealedMemfdIsMappedWithoutTheFlag) {
  const size_t n = 2 * kMiB;
  const std::string reply = peer_->Send("filereg m " + std::to_string(n) + " sealed 0");
  ASSERT_TRUE(hixl_test::IsOk(reply)) << reply;
  ASSERT_NO_FATAL_FAILURE(Connect());
  EXPECT_TRUE(SelfMaps("memfd:hixl-test-memfd"));
  ASSERT_NO_FATAL_FAILURE(WriteReadCheck("m", Addr(reply), n, 61));
}

TEST_F(UserMemoryTest, UnsealedMemfdIsMappedOnlyWithTheFlag) {
  const size_t n = 1 * kMiB;
  const std::string plain = peer_->Send("filereg p " + std::to_string(n) + " unsealed 0");
  ASSERT_TRUE(hixl_test::IsOk(plain)) << plain;
  ASSERT_NO_FATAL_FAILURE(Connect());
  EXPECT_FALSE(SelfMaps("memfd:hixl-test-memfd")) << "an unsealed memfd was mapped unasked";
  ASSERT_NO_FATAL_FAILURE(WriteReadCheck("p", Addr(plain), n, 71));  // cross-memory attach
  const std::string flagged = peer_->Send("filereg f " + std::to_string(n) + " unsealed 1");
  ASSERT_TRUE(hixl_test::IsOk(flagged)) << flagged;
  EXPECT_TRUE(SelfMapsBecomes("memfd:hixl-test-memfd", true));
  ASSERT_NO_FATAL_FAILURE(WriteReadCheck("f", Addr(flagged), n, 81));
}

TEST_F(UserMemoryTest, DevShmFileIsMappedWithTheFlag) {
  const size_t n = 1 * kMiB;
  const std::string reply = peer_->Send("filereg s " + std::to_string(n) + " shm 1");
  ASSERT_TRUE(hixl_test::IsOk(reply)) << reply;
  ASSERT_NO_FATAL_FAILURE(Connect());
  EXPECT_TRUE(SelfMaps("/dev/shm/hixl-test-" + std::to_string(peer_->pid())));
  ASSERT_NO_FATAL_FAILURE(WriteReadCheck("s", Addr(reply), n, 91));
}

// In one process: what RegisterMem refuses, and registering twice.
TEST(UserMemoryRegister, FlagsAreCheckedAndRegisteringTwiceMovesNothingAgain) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  Buffer b(1 * kMiB, 0x5c);
  hixl::MemHandle h1 = 0, h2 = 0;
  Status s = e.RegisterMem({b.addr(), b.size()}, hixl::MemType::MEM_HOST, h1,
                           hixl::MEM_PERM_READ_WRITE, 1u << 7);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  HIXL_ASSERT_OK(e.RegisterMem({b.addr(), b.size()}, hixl::MemType::MEM_HOST, h1,
                               hixl::MEM_PERM_READ_WRITE, hixl::REGISTER_SHARE_BY_MAPPING));
  HIXL_ASSERT_OK(e.RegisterMem({b.addr(), b.size()}, hixl::MemType::MEM_HOST, h2,
                               hixl::MEM_PERM_READ_WRITE, hixl::REGISTER_SHARE_BY_MAPPING));
  EXPECT_EQ(h1, h2);
  EXPECT_EQ(b.HashHex(), Buffer(1 * kMiB, 0x5c).HashHex());
  HIXL_EXPECT_OK(e.DeregisterMem(h1));
  EXPECT_EQ(b.HashHex(), Buffer(1 * kMiB, 0x5c).HashHex());
  // The stack cannot be shared by mapping: a clear error, nothing registered.
  char stack_buf[3 * kPage];
  s = e.RegisterMem({reinterpret_cast<uintptr_t>(stack_buf), sizeof(stack_buf)},
                    hixl::MemType::MEM_HOST, h1, hixl::MEM_PERM_READ_WRITE,
                    hixl::REGISTER_SHARE_BY_MAPPING);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_NE(s.message().find("REGISTER_SHARE_BY_MAPPING"), std::string::npos) << s.ToString();
  e.Finalize();
}

// A region overlapping another registration is refused before any page
// moves: the other region's bytes and mapping stay as they were.
TEST(UserMemoryRegister, OverlapIsRefusedBeforeAnythingMoves) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  Buffer b(4 * kMiB);
  hixl_test::FillPattern(b.data(), b.size(), 8);
  const std::string want = b.HashHex();
  hixl::MemHandle first = 0, second = 0;
  HIXL_ASSERT_OK(e.RegisterMem({b.addr(kMiB), kMiB}, hixl::MemType::MEM_HOST, first));
  Status s = e.RegisterMem({b.addr(), 3 * kMiB}, hixl::MemType::MEM_HOST, second,
                           hixl::MEM_PERM_READ_WRITE, hixl::REGISTER_SHARE_BY_MAPPING);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_NE(s.message().find("overlaps"), std::string::npos) << s.ToString();
  EXPECT_FALSE(SelfMaps("memfd:hixl-user")) << "pages were moved for a refused registration";
  EXPECT_EQ(b.HashHex(), want);
  HIXL_EXPECT_OK(e.DeregisterMem(first));
  e.Finalize();
}

// Finalize ends every registration: moved pages go back with their contents.
TEST(UserMemoryRegister, FinalizeMovesRegisteredPagesBack) {
  Buffer b(2 * kMiB);
  hixl_test::FillPattern(b.data(), b.size(), 3);
  const std::string want = b.HashHex();
  {
    Hixl e;
    HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
    hixl::MemHandle h = 0;
    HIXL_ASSERT_OK(e.RegisterMem({b.addr(), b.size()}, hixl::MemType::MEM_HOST, h,
                                 hixl::MEM_PERM_READ_WRITE, hixl::REGISTER_SHARE_BY_MAPPING));
    EXPECT_TRUE(SelfMaps("memfd:hixl-user"));
    e.Finalize();
  }
  EXPECT_FALSE(SelfMaps("memfd:hixl-user"));
  EXPECT_EQ(b.HashHex(), want);
}

}  // namespace
