// tests/bad_input_test.cc — wrong calls, hostile peers and failures: every one
// must give a clear non-OK Status (no crash, no hang), and where a peer
// process is involved its canaries AND region contents must be unchanged.
//
// The descriptor, permission and in-flight tests run once per transport
// (TEST_P over the initiator's LinkType option, hixl_test::AllLinkTypes()).
// Hostile clients of the tcp data lanes are in tcp_hostile_test.cc.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "hixl/hixl.h"
#include "peer_process.h"

namespace {

using hixl::Hixl;
using hixl::MemDesc;
using hixl::MemHandle;
using hixl::MemType;
using hixl::Status;
using hixl::StatusCode;
using hixl::TransferOp;
using hixl::TransferOpDesc;
using hixl::TransferReq;
using hixl::TransferStatus;
using hixl_test::Buffer;
using hixl_test::PeerProcess;
using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;
using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = 1024 * 1024;
constexpr int kConnectMs = 5000;

long ElapsedMs(Clock::time_point since) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

bool IsEndState(TransferStatus s) {
  return s == TransferStatus::COMPLETED || s == TransferStatus::FAILED ||
         s == TransferStatus::TIMEOUT;
}

// A peer process plus an engine here. Tests create the peer's regions
// between StartPeer() and ConnectEngine(): regions registered before Connect
// are part of the handshake, later ones arrive asynchronously.
class BadPeerTest : public ::testing::Test {
 protected:
  void StartPeer(const std::vector<std::string>& peer_opts = {}) {
    peer_ = std::make_unique<PeerProcess>(peer_opts);
    ASSERT_TRUE(peer_->Start());
  }
  // Adds LinkType=link_ (when set) and checks the link uses that transport.
  void ConnectEngine(const std::map<std::string, std::string>& local_opts = {}) {
    std::map<std::string, std::string> opts = local_opts;
    if (!link_.empty()) opts.emplace(hixl::options::kLinkType, link_);
    HIXL_ASSERT_OK(engine_.Initialize("127.0.0.1:0", opts));
    HIXL_ASSERT_OK(engine_.Connect(peer_->engine(), kConnectMs));
    if (!link_.empty()) {
      hixl::LinkType t = hixl::LinkType::AUTO;
      HIXL_ASSERT_OK(engine_.GetLinkType(peer_->engine(), t));
      ASSERT_EQ(t, hixl_test::LinkTypeOf(link_)) << "LinkType=" << link_;
    }
  }
  // Outlives TearDown's Finalize: safe as the local side of async requests
  // even when an assertion ends the test early.
  Buffer& KeptBuffer(size_t size, int fill = 0) {
    kept_.push_back(std::make_unique<Buffer>(size, fill));
    return *kept_.back();
  }
  void TearDown() override {
    engine_.Finalize();
    peer_.reset();
  }
  Status Sync(TransferOp op, const std::vector<TransferOpDesc>& d, int timeout_ms = 5000) {
    return engine_.TransferSync(peer_->engine(), op, d, timeout_ms);
  }
  // TransferAsync: a request that is accepted is waited for (bounded) and its
  // end state is turned into a Status, so a rejection surfaces either way.
  Status Async(TransferOp op, const std::vector<TransferOpDesc>& d, bool* rejected_at_post) {
    TransferReq req = 0;
    Status s = engine_.TransferAsync(peer_->engine(), op, d, {}, req);
    *rejected_at_post = !s.ok();
    if (!s.ok()) return s;
    Status call, reason;
    TransferStatus st = hixl_test::WaitForEnd(engine_, req, 10000, &call, &reason);
    if (!call.ok()) return call;
    if (st == TransferStatus::COMPLETED) return Status::Ok();
    if (st == TransferStatus::WAITING) return Status(StatusCode::kTimeout, "still WAITING after 10 s");
    return reason.ok() ? Status(StatusCode::kFailed, "ended without reason") : reason;
  }

  std::string link_;  // this engine's LinkType option; empty: default (AUTO)
  std::vector<std::unique_ptr<Buffer>> kept_;  // destroyed after TearDown
  std::unique_ptr<PeerProcess> peer_;
  Hixl engine_;
};

// BadPeerTest once per transport (the param is the LinkType option).
class BadTransportTest : public BadPeerTest, public ::testing::WithParamInterface<std::string> {
 protected:
  BadTransportTest() { link_ = GetParam(); }
};

std::string LinkParamName(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

INSTANTIATE_TEST_SUITE_P(Transports, BadTransportTest, ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);

// ---------------------------------------------------------------------------
// Registration.

TEST(BadRegistration, ZeroAddressOrLengthIsParamInvalid) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1"));
  Buffer buf(8192);
  MemHandle h = 0;
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, e.RegisterMem(MemDesc{0, 4096}, MemType::MEM_HOST, h));
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                   e.RegisterMem(MemDesc{buf.addr(), 0}, MemType::MEM_HOST, h));
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, e.RegisterMem(MemDesc{0, 0}, MemType::MEM_HOST, h));
  // addr + len wraps around the address space.
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                   e.RegisterMem(MemDesc{UINTPTR_MAX - 10, 100}, MemType::MEM_HOST, h));
  // Unknown permission bits.
  HIXL_EXPECT_NOT_OK(e.RegisterMem(MemDesc{buf.addr(), 4096}, MemType::MEM_HOST, h, 0x80));
  // The buffer itself is still registrable afterwards.
  HIXL_EXPECT_OK(e.RegisterMem(MemDesc{buf.addr(), 4096}, MemType::MEM_HOST, h));
  EXPECT_NE(h, 0u);
}

TEST(BadRegistration, OverlapRejectedIdenticalReturnsSameHandle) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1"));
  Buffer buf(64 * 1024);
  MemHandle h1 = 0, h2 = 0, h3 = 0;
  HIXL_ASSERT_OK(e.RegisterMem(MemDesc{buf.addr(16384), 16384}, MemType::MEM_HOST, h1));
  EXPECT_NE(h1, 0u);
  // Same addr and len: the same handle.
  HIXL_EXPECT_OK(e.RegisterMem(MemDesc{buf.addr(16384), 16384}, MemType::MEM_HOST, h2));
  EXPECT_EQ(h2, h1);
  // Partial overlaps at either end are rejected.
  MemHandle bad = 0;
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                   e.RegisterMem(MemDesc{buf.addr(8192), 16384}, MemType::MEM_HOST, bad));
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                   e.RegisterMem(MemDesc{buf.addr(24576), 16384}, MemType::MEM_HOST, bad));
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                   e.RegisterMem(MemDesc{buf.addr(32767), 2}, MemType::MEM_HOST, bad));
  // Same start, different length overlaps too.
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                   e.RegisterMem(MemDesc{buf.addr(16384), 8192}, MemType::MEM_HOST, bad));
  // Adjacent, non-overlapping regions are fine.
  HIXL_EXPECT_OK(e.RegisterMem(MemDesc{buf.addr(32768), 16384}, MemType::MEM_HOST, h3));
  EXPECT_NE(h3, 0u);
  EXPECT_NE(h3, h1);
}

TEST(BadRegistration, DeregisterTwiceUnknownAndZero) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1"));
  Buffer buf(16384);
  MemHandle h = 0;
  HIXL_ASSERT_OK(e.RegisterMem(MemDesc{buf.addr(), 16384}, MemType::MEM_HOST, h));
  HIXL_EXPECT_OK(e.DeregisterMem(h));
  HIXL_EXPECT_OK(e.DeregisterMem(h));  // already removed: no-op success
  HIXL_EXPECT_OK(e.DeregisterMem(0xdeadbeefull));  // unknown: no-op
  // 0 is never a valid handle: a no-op success or PARAM_INVALID, never a crash.
  Status s0 = e.DeregisterMem(0);
  EXPECT_TRUE(s0.ok() || s0.code() == StatusCode::kParamInvalid) << s0.ToString();
  // The range can be registered again after the deregistration.
  MemHandle h2 = 0;
  HIXL_EXPECT_OK(e.RegisterMem(MemDesc{buf.addr(), 16384}, MemType::MEM_HOST, h2));
}

TEST(BadRegistration, FreeMemAndGetMemHandleOfForeignPointer) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1"));
  Buffer buf(4096);
  HIXL_EXPECT_NOT_OK(e.FreeMem(buf.data()));
  MemHandle h = 0;
  HIXL_EXPECT_NOT_OK(e.GetMemHandle(buf.data(), h));
  void* p = nullptr;
  HIXL_ASSERT_OK(e.AllocMem(8192, MemType::MEM_HOST, &p));
  // Not the region's start address.
  HIXL_EXPECT_NOT_OK(e.GetMemHandle(static_cast<char*>(p) + 4096, h));
  HIXL_EXPECT_OK(e.FreeMem(p));
}

TEST(BadCalls, CallsBeforeInitializeFailCleanly) {
  Hixl e;
  Buffer buf(4096);
  MemHandle h = 0;
  HIXL_EXPECT_NOT_OK(e.RegisterMem(MemDesc{buf.addr(), 4096}, MemType::MEM_HOST, h));
  void* p = nullptr;
  HIXL_EXPECT_NOT_OK(e.AllocMem(4096, MemType::MEM_HOST, &p));
  HIXL_EXPECT_NOT_OK(e.Connect("127.0.0.1:1", 200));
  HIXL_EXPECT_NOT_OK(
      e.TransferSync("127.0.0.1:1", TransferOp::WRITE, {{buf.addr(), 0x1000, 16}}, 200));
  TransferStatus st;
  HIXL_EXPECT_NOT_OK(e.GetTransferStatus(1, st));
}

TEST(BadCalls, GetTransferStatusOfNeverIssuedRequest) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1"));
  TransferStatus st = TransferStatus::WAITING;
  Status reason;
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, e.GetTransferStatus(12345, st));
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, e.GetTransferStatus(12345, st, reason));
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, e.GetTransferStatus(0, st));
}

// ---------------------------------------------------------------------------
// Transfers without a link.

TEST(BadCalls, TransferToUnknownPeerIsNotConnected) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  Buffer buf(4096);
  std::vector<TransferOpDesc> d = {{buf.addr(), 0x10000, 64}};
  for (const std::string peer : {"127.0.0.1:1", "10.255.255.1:5000"}) {
    HIXL_EXPECT_CODE(StatusCode::kNotConnected, e.TransferSync(peer, TransferOp::WRITE, d, 500));
    HIXL_EXPECT_CODE(StatusCode::kNotConnected, e.TransferSync(peer, TransferOp::READ, d, 500));
    TransferReq req = 0;
    HIXL_EXPECT_CODE(StatusCode::kNotConnected,
                     e.TransferAsync(peer, TransferOp::WRITE, d, {}, req));
  }
  // A live peer we never connected to.
  PeerProcess peer;
  ASSERT_TRUE(peer.Start());
  uintptr_t remote = peer.Reg("r", 4096, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_TRUE(peer.Ok("fill r 7"));
  const std::string before = peer.Hash("r", 0, 4096);
  d = {{buf.addr(), remote, 4096}};
  HIXL_EXPECT_CODE(StatusCode::kNotConnected,
                   e.TransferSync(peer.engine(), TransferOp::WRITE, d, 500));
  TransferReq req = 0;
  HIXL_EXPECT_CODE(StatusCode::kNotConnected,
                   e.TransferAsync(peer.engine(), TransferOp::WRITE, d, {}, req));
  EXPECT_EQ(peer.Hash("r", 0, 4096), before);
  EXPECT_TRUE(peer.Ok("canary r"));
}

// ---------------------------------------------------------------------------
// Descriptor validation against the peer's region table. The peer registers
// two ADJACENT regions A and B (one malloc block with guards around both).

class DescriptorTest : public BadPeerTest, public ::testing::WithParamInterface<std::string> {
 protected:
  DescriptorTest() { link_ = GetParam(); }
  static constexpr size_t kSize = 64 * 1024;
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartPeer());
    std::string r = peer_->Send("regsplit A B " + std::to_string(kSize) + " rw");
    ASSERT_TRUE(hixl_test::IsOk(r)) << r;
    ASSERT_EQ(std::sscanf(r.c_str(), "OK %zu %zu", &a_, &b_), 2) << r;
    ASSERT_EQ(b_, a_ + kSize);
    ASSERT_NO_FATAL_FAILURE(ConnectEngine());
    ASSERT_TRUE(peer_->Ok("fillpat A 1"));
    ASSERT_TRUE(peer_->Ok("fillpat B 2"));
    hash_a_ = peer_->Hash("A", 0, kSize);
    hash_b_ = peer_->Hash("B", 0, kSize);
    hixl_test::FillPattern(src_.data(), src_.size(), 3);
  }
  // Peer memory and our READ destination must be exactly as before.
  void ExpectNothingTouched() {
    EXPECT_EQ(peer_->Hash("A", 0, kSize), hash_a_) << "region A was modified";
    EXPECT_EQ(peer_->Hash("B", 0, kSize), hash_b_) << "region B was modified";
    EXPECT_TRUE(peer_->Ok("canary A"));
    EXPECT_EQ(dst_.HashHex(), Buffer(dst_.size(), 0x5A).HashHex()) << "READ destination modified";
  }
  // Every way of posting `d` must be rejected with PARAM_INVALID.
  void ExpectRejected(const std::string& what, TransferOpDesc write_desc) {
    SCOPED_TRACE(what);
    TransferOpDesc read_desc = write_desc;
    if (read_desc.local_addr == src_.addr()) read_desc.local_addr = dst_.addr();
    HIXL_EXPECT_CODE(StatusCode::kParamInvalid, Sync(TransferOp::WRITE, {write_desc}));
    HIXL_EXPECT_CODE(StatusCode::kParamInvalid, Sync(TransferOp::READ, {read_desc}));
    for (TransferOp op : {TransferOp::WRITE, TransferOp::READ}) {
      TransferReq req = 0;
      Status s = engine_.TransferAsync(peer_->engine(), op,
                                       {op == TransferOp::WRITE ? write_desc : read_desc}, {}, req);
      EXPECT_EQ(s.code(), StatusCode::kParamInvalid)
          << "TransferAsync must validate before posting: " << s.ToString();
      if (s.ok()) (void)hixl_test::WaitForEnd(engine_, req, 5000);
    }
  }

  uintptr_t a_ = 0, b_ = 0;
  std::string hash_a_, hash_b_;
  Buffer src_{256 * 1024};
  Buffer dst_{256 * 1024, 0x5A};
};

TEST_P(DescriptorTest, OutOfBoundsAndMalformedDescriptorsAreParamInvalid) {
  ExpectRejected("past the end of B", {src_.addr(), b_ + kSize - 100, 200});
  ExpectRejected("starting before A", {src_.addr(), a_ - 100, 200});
  ExpectRejected("entirely after B (guard area)", {src_.addr(), b_ + kSize + 16, 16});
  ExpectRejected("entirely before A (guard area)", {src_.addr(), a_ - 4096, 16});
  ExpectRejected("spanning A and B", {src_.addr(), a_ + kSize - 100, 200});
  ExpectRejected("len 0", {src_.addr(), a_, 0});
  ExpectRejected("remote overflow", {src_.addr(), UINTPTR_MAX - 10, 100});
  ExpectRejected("remote+len wraps into A", {src_.addr(), a_ + 16, SIZE_MAX - 8});
  ExpectRejected("local_addr 0", {0, a_, 100});
  ExpectRejected("local overflow", {UINTPTR_MAX - 10, a_, 100});
  ExpectRejected("remote 0", {src_.addr(), 0, 100});
  ExpectNothingTouched();

  // Positive control: the same regions accept a valid descriptor.
  HIXL_EXPECT_OK(Sync(TransferOp::READ, {{dst_.addr(), a_ + kSize - 100, 100}}));
  HIXL_EXPECT_OK(Sync(TransferOp::READ, {{dst_.addr(100), b_, 100}}));
}

TEST_P(DescriptorTest, BatchWithOnlyTheLastDescriptorBadTouchesNothing) {
  std::vector<TransferOpDesc> w, r;
  for (size_t i = 0; i < 15; ++i) {
    w.push_back({src_.addr(i * 4096), (i % 2 ? b_ : a_) + i * 2048, 1024});
    r.push_back({dst_.addr(i * 4096), (i % 2 ? b_ : a_) + i * 2048, 1024});
  }
  w.push_back({src_.addr(), b_ + kSize - 10, 100});  // last: past the end
  r.push_back({dst_.addr(200000), b_ + kSize - 10, 100});
  const std::string first_before = peer_->Hash("A", 0, 1024);

  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, Sync(TransferOp::WRITE, w));
  EXPECT_EQ(peer_->Hash("A", 0, 1024), first_before) << "first descriptor's bytes were written";
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, Sync(TransferOp::READ, r));
  for (TransferOp op : {TransferOp::WRITE, TransferOp::READ}) {
    TransferReq req = 0;
    Status s = engine_.TransferAsync(peer_->engine(), op, op == TransferOp::WRITE ? w : r, {}, req);
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
    if (s.ok()) (void)hixl_test::WaitForEnd(engine_, req, 5000);
  }
  // The same with the bad descriptor being a zero length one.
  w.back() = {src_.addr(), a_, 0};
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, Sync(TransferOp::WRITE, w));
  ExpectNothingTouched();

  // Without the bad descriptor the batch goes through.
  w.pop_back();
  HIXL_EXPECT_OK(Sync(TransferOp::WRITE, w));
  EXPECT_EQ(peer_->Hash("A", 0, 1024), src_.HashHex(0, 1024));
}

INSTANTIATE_TEST_SUITE_P(Transports, DescriptorTest, ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);

// ---------------------------------------------------------------------------
// Permissions.

TEST_P(BadTransportTest, PermissionsAreEnforced) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 64 * 1024;
  uintptr_t ro = peer_->Reg("ro", n, "r");
  uintptr_t wo = peer_->Reg("wo", n, "w");
  uintptr_t no = peer_->Reg("no", n, "none");
  ASSERT_NE(ro, 0u);
  ASSERT_NE(wo, 0u);
  ASSERT_NE(no, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  ASSERT_TRUE(peer_->Ok("fillpat ro 11"));
  ASSERT_TRUE(peer_->Ok("fillpat wo 12"));
  ASSERT_TRUE(peer_->Ok("fillpat no 13"));
  const std::string h_ro = peer_->Hash("ro", 0, n), h_wo = peer_->Hash("wo", 0, n),
                    h_no = peer_->Hash("no", 0, n);
  Buffer& src = KeptBuffer(n);
  hixl_test::FillPattern(src.data(), n, 14);
  Buffer& dst = KeptBuffer(n, 0x77);
  const std::string untouched = Buffer(n, 0x77).HashHex();
  bool at_post = false;

  // WRITE into read-only, READ from write-only, anything on "none": rejected.
  HIXL_EXPECT_NOT_OK(Sync(TransferOp::WRITE, {{src.addr(), ro, n}}));
  HIXL_EXPECT_NOT_OK(Sync(TransferOp::WRITE, {{src.addr(), ro + 100, 1}}));
  HIXL_EXPECT_NOT_OK(Async(TransferOp::WRITE, {{src.addr(), ro, n}}, &at_post));
  HIXL_EXPECT_NOT_OK(Sync(TransferOp::READ, {{dst.addr(), wo, n}}));
  HIXL_EXPECT_NOT_OK(Async(TransferOp::READ, {{dst.addr(), wo, n}}, &at_post));
  HIXL_EXPECT_NOT_OK(Sync(TransferOp::WRITE, {{src.addr(), no, n}}));
  HIXL_EXPECT_NOT_OK(Sync(TransferOp::READ, {{dst.addr(), no, n}}));
  // A batch whose only forbidden descriptor is the last one.
  HIXL_EXPECT_NOT_OK(Sync(TransferOp::WRITE, {{src.addr(), wo, 4096}, {src.addr(), ro, 4096}}));
  EXPECT_EQ(peer_->Hash("ro", 0, n), h_ro) << "read-only region was written";
  EXPECT_EQ(peer_->Hash("wo", 0, n), h_wo) << "write-only region was written by a rejected batch";
  EXPECT_EQ(peer_->Hash("no", 0, n), h_no);
  EXPECT_EQ(dst.HashHex(), untouched) << "READ from a write-only region delivered data";
  for (const char* name : {"ro", "wo", "no"}) EXPECT_TRUE(peer_->Ok(std::string("canary ") + name));

  // The allowed directions work.
  HIXL_EXPECT_OK(Sync(TransferOp::READ, {{dst.addr(), ro, n}}));
  EXPECT_EQ(dst.HashHex(), h_ro);
  HIXL_EXPECT_OK(Sync(TransferOp::WRITE, {{src.addr(), wo, n}}));
  EXPECT_EQ(peer_->Hash("wo", 0, n), src.HashHex());
}

// ---------------------------------------------------------------------------
// Connect failures and hostile TCP endpoints.

// A raw TCP server on 127.0.0.1:0 that misbehaves in a chosen way.
class RawServer {
 public:
  enum class Mode { kCloseImmediately, kReadThenClose, kSilent, kGarbage };
  explicit RawServer(Mode mode) : mode_(mode) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(fd_, 16) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "raw server setup failed: " << strerror(errno);
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~RawServer() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
  }
  std::string engine() const { return "127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return accepted_.load(); }

 private:
  void Run() {
    std::vector<int> held;
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      accepted_.fetch_add(1);
      switch (mode_) {
        case Mode::kCloseImmediately:
          close(c);
          break;
        case Mode::kReadThenClose: {
          pollfd q{c, POLLIN, 0};
          char buf[4096];
          if (poll(&q, 1, 500) > 0) (void)!read(c, buf, sizeof(buf));
          close(c);
          break;
        }
        case Mode::kSilent:
          held.push_back(c);
          break;
        case Mode::kGarbage: {
          unsigned char junk[64];
          for (size_t i = 0; i < sizeof(junk); ++i) junk[i] = static_cast<unsigned char>(i * 37 + 0xF1);
          (void)!send(c, junk, sizeof(junk), MSG_NOSIGNAL);
          held.push_back(c);
          break;
        }
      }
    }
    for (int c : held) close(c);
  }

  Mode mode_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

TEST(BadConnect, NothingListeningFailsWithinTheTimeout) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  const int port = hixl_test::UnusedTcpPort();
  ASSERT_GT(port, 0);
  auto t0 = Clock::now();
  HIXL_EXPECT_NOT_OK(e.Connect("127.0.0.1:" + std::to_string(port), 1000));
  EXPECT_LT(ElapsedMs(t0), 3000);
  // Still no link afterwards.
  Buffer b(64);
  HIXL_EXPECT_CODE(StatusCode::kNotConnected,
                   e.TransferSync("127.0.0.1:" + std::to_string(port), TransferOp::WRITE,
                                  {{b.addr(), 0x1000, 64}}, 500));
}

TEST(BadConnect, MalformedRemoteEngineIsRejected) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1"));
  for (const std::string r : {"", "nonsense", "127.0.0.1", "127.0.0.1:", "127.0.0.1:notaport",
                              "127.0.0.1:99999", "127.0.0.1:0"}) {
    auto t0 = Clock::now();
    HIXL_EXPECT_NOT_OK(e.Connect(r, 500)) ;
    EXPECT_LT(ElapsedMs(t0), 2500) << "\"" << r << "\"";
  }
}

TEST_P(BadTransportTest, ConnectTwiceIsAlreadyConnected) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  uintptr_t remote = peer_->Alloc("m", 4096);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  HIXL_EXPECT_CODE(StatusCode::kAlreadyConnected, engine_.Connect(peer_->engine(), kConnectMs));
  // The existing link still works.
  Buffer src(4096);
  hixl_test::FillPattern(src.data(), 4096, 8);
  HIXL_EXPECT_OK(Sync(TransferOp::WRITE, {{src.addr(), remote, 4096}}));
  EXPECT_EQ(peer_->Hash("m", 0, 4096), src.HashHex());
}

struct HostileServerCase {
  RawServer::Mode mode;
  const char* name;
  friend void PrintTo(const HostileServerCase& c, std::ostream* os) { *os << c.name; }
};

class HostileServerTest : public ::testing::TestWithParam<HostileServerCase> {};

TEST_P(HostileServerTest, ConnectFailsWithoutHanging) {
  RawServer server(GetParam().mode);
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  auto t0 = Clock::now();
  HIXL_EXPECT_NOT_OK(e.Connect(server.engine(), 1000));
  const long ms = ElapsedMs(t0);
  EXPECT_LT(ms, 3000) << "Connect(timeout 1000 ms) took " << ms << " ms";
  EXPECT_GE(server.accepted(), 1) << "the engine never reached the server";
  Buffer b(64);
  HIXL_EXPECT_CODE(StatusCode::kNotConnected,
                   e.TransferSync(server.engine(), TransferOp::WRITE, {{b.addr(), 0x1000, 64}}, 500));
  // Finalize must not hang on the half-open link either.
  t0 = Clock::now();
  e.Finalize();
  EXPECT_LT(ElapsedMs(t0), 3000);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, HostileServerTest,
    ::testing::Values(HostileServerCase{RawServer::Mode::kCloseImmediately, "CloseImmediately"},
                      HostileServerCase{RawServer::Mode::kReadThenClose, "ReadThenClose"},
                      HostileServerCase{RawServer::Mode::kSilent, "Silent"},
                      HostileServerCase{RawServer::Mode::kGarbage, "Garbage"}),
    [](const ::testing::TestParamInfo<HostileServerCase>& i) { return std::string(i.param.name); });

int ConnectRaw(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Garbage from a raw client must not take the peer's engine down, and a
// silent client holding a connection open must not block other clients.
TEST(HostileClient, PeerKeepsServingAfterGarbage) {
  PeerProcess peer({"HandshakeTimeoutMs=1000"});
  ASSERT_TRUE(peer.Start());
  const int port = hixl_test::PortOf(peer.engine());
  ASSERT_GT(port, 0);

  unsigned char junk[64];
  for (size_t i = 0; i < sizeof(junk); ++i) junk[i] = static_cast<unsigned char>(i * 73 + 5);
  unsigned char ones[64];
  std::memset(ones, 0xFF, sizeof(ones));  // e.g. a huge length field
  for (const unsigned char* payload : {junk, ones}) {
    int fd = ConnectRaw(port);
    ASSERT_GE(fd, 0) << strerror(errno);
    EXPECT_EQ(send(fd, payload, 64, MSG_NOSIGNAL), 64);
    close(fd);
  }
  int silent = ConnectRaw(port);  // stays open, sends nothing
  ASSERT_GE(silent, 0);
  int half = ConnectRaw(port);  // sends part of something, then waits
  ASSERT_GE(half, 0);
  EXPECT_EQ(send(half, junk, 3, MSG_NOSIGNAL), 3);

  EXPECT_TRUE(peer.Ok("ping"));
  uintptr_t remote = peer.Reg("r", 1 * kMiB, "rw");
  ASSERT_NE(remote, 0u);
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  auto t0 = Clock::now();
  HIXL_ASSERT_OK(e.Connect(peer.engine(), kConnectMs));
  EXPECT_LT(ElapsedMs(t0), 2000) << "a silent client delayed the handshake of a real one";
  Buffer src(1 * kMiB);
  hixl_test::FillPattern(src.data(), src.size(), 6);
  HIXL_EXPECT_OK(e.TransferSync(peer.engine(), TransferOp::WRITE, {{src.addr(), remote, 1 * kMiB}},
                                5000));
  EXPECT_EQ(peer.Hash("r", 0, 1 * kMiB), src.HashHex());
  EXPECT_TRUE(peer.Ok("canary r"));
  close(silent);
  close(half);
  e.Finalize();
  EXPECT_TRUE(peer.Ok("ping"));
  EXPECT_EQ(peer.CloseAndWait(5000), 0) << "peer did not exit cleanly";
}

// ---------------------------------------------------------------------------
// Teardown races.

// Param: (region kind "alloc" | "reg", LinkType option).
class InFlightTest : public BadPeerTest,
                     public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {
 protected:
  InFlightTest() { link_ = std::get<1>(GetParam()); }
};

// Finalize fails every unfinished request: afterwards each one reports an end
// state (COMPLETED or FAILED), none stays WAITING, nothing crashes.
TEST_P(InFlightTest, FinalizeWithAsyncRequestsInFlight) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  // 64 MiB each (16 MiB under TSan, whose first touch of memory is slow).
  constexpr size_t kReqs = 6, kLen = 64 * kMiB / hixl_test::kSanitizerDivisor;
  const std::string kind = std::get<0>(GetParam());
  uintptr_t remote = kind == "alloc" ? peer_->Alloc("big", kReqs * kLen)
                                     : peer_->Reg("big", kReqs * kLen, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine({{"CopyThreads", "2"}}));
  Buffer* src = &KeptBuffer(kLen);
  hixl_test::FillPattern(src->data(), kLen, 51);
  const std::string src_hash = src->HashHex();
  std::vector<TransferReq> reqs(kReqs, 0);
  for (size_t i = 0; i < kReqs; ++i) {
    HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                         {{src->addr(), remote + i * kLen, kLen}}, {}, reqs[i]));
  }
  auto t0 = Clock::now();
  engine_.Finalize();
  EXPECT_LT(ElapsedMs(t0), 10000) << "Finalize took too long";
  int completed = 0;
  for (size_t i = 0; i < kReqs; ++i) {
    TransferStatus st = TransferStatus::WAITING;
    Status s = engine_.GetTransferStatus(reqs[i], st);
    EXPECT_TRUE(s.ok()) << "req " << i << ": GetTransferStatus after Finalize -> " << s.ToString();
    if (!s.ok()) continue;
    EXPECT_TRUE(st == TransferStatus::COMPLETED || st == TransferStatus::FAILED)
        << "req " << i << " is " << hixl_test::TransferStatusName(st) << " after Finalize";
    if (st == TransferStatus::COMPLETED) {
      ++completed;
      EXPECT_EQ(peer_->Hash("big", i * kLen, kLen), src_hash) << "COMPLETED req " << i;
    }
  }
  std::printf("[ info ] %d of %zu requests completed before Finalize\n", completed, kReqs);
  // Finalize stopped all threads: nothing reaches the peer any more.
  ASSERT_TRUE(peer_->Ok("fill big 0x42"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(peer_->Hash("big", 0, kReqs * kLen), Buffer(kReqs * kLen, 0x42).HashHex())
      << "the peer's region was written after Finalize returned";
  EXPECT_TRUE(peer_->Ok("ping"));
  EXPECT_TRUE(peer_->Ok("canary big"));
}

// The peer deregisters (or frees) a region while this process has large
// async transfers into it in flight: each request ends, COMPLETED ones have
// their bytes in place, and after the peer's call returned nothing reaches it.
TEST_P(BadTransportTest, PeerDeregistersRegionWithTransfersInFlight) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  constexpr size_t kReqs = 16, kLen = 16 * kMiB / hixl_test::kSanitizerDivisor;
  uintptr_t remote = peer_->Reg("big", kReqs * kLen, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine({{"CopyThreads", "2"}}));
  Buffer& src = KeptBuffer(kLen);
  hixl_test::FillPattern(src.data(), kLen, 52);
  const std::string src_hash = src.HashHex();
  std::vector<TransferReq> reqs(kReqs, 0);
  for (size_t i = 0; i < kReqs; ++i) {
    HIXL_EXPECT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                         {{src.addr(), remote + i * kLen, kLen}}, {}, reqs[i]));
  }
  // DeregisterMem is only for RegisterMem'd memory here: the engine reserves
  // AllocMem memory to FreeMem (see PeerFreesAllocMemWithTransfersInFlight).
  // TIMEOUT: this process did not confirm within DeregisterTimeoutMs (a
  // loaded machine), lost its link, and may still write (hixl.h): the region
  // is no longer checked for late bytes then.
  const std::string dereg = peer_->Send("dereg big", 15000);
  const bool warned = dereg.rfind("ERR TIMEOUT", 0) == 0;
  ASSERT_TRUE(dereg == "OK" || warned) << dereg;
  if (warned) std::printf("[ info ] %s\n", dereg.c_str());
  // DeregisterMem has returned on the peer: no copy may touch the region any
  // more. So the region's content right now is final: take it now, then
  // overwrite it with 0x42 and check nothing arrives later.
  std::vector<std::string> at_dereg(kReqs);
  for (size_t i = 0; i < kReqs; ++i) at_dereg[i] = peer_->Hash("big", i * kLen, kLen);
  ASSERT_TRUE(peer_->Ok("fill big 0x42"));
  const std::string filled = Buffer(kReqs * kLen, 0x42).HashHex();
  // New transfers fail at once.
  HIXL_EXPECT_NOT_OK(engine_.TransferSync(peer_->engine(), TransferOp::WRITE,
                                          {{src.addr(), remote, 4096}}, 2000));
  std::vector<TransferStatus> end(kReqs, TransferStatus::WAITING);
  for (size_t i = 0; i < kReqs; ++i) {
    Status call;
    end[i] = hixl_test::WaitForEnd(engine_, reqs[i], 10000, &call);
    EXPECT_TRUE(call.ok()) << "req " << i << ": " << call.ToString();
    EXPECT_TRUE(IsEndState(end[i])) << "req " << i << " never ended";
  }
  int completed = 0;
  for (size_t i = 0; i < kReqs; ++i) {
    if (end[i] != TransferStatus::COMPLETED) continue;
    ++completed;
    if (warned) continue;
    EXPECT_EQ(at_dereg[i], src_hash)
        << "req " << i << " reports COMPLETED but its bytes were not in place when the peer's "
        << "DeregisterMem returned";
  }
  std::printf("[ info ] %d of %zu requests completed\n", completed, kReqs);
  HIXL_EXPECT_NOT_OK(engine_.TransferSync(peer_->engine(), TransferOp::WRITE,
                                          {{src.addr(), remote, kLen}}, 2000));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!warned) {
    EXPECT_EQ(peer_->Hash("big", 0, kReqs * kLen), filled)
        << "the region was written after the peer's DeregisterMem returned";
  }
  EXPECT_TRUE(peer_->Ok("canary big"));
  EXPECT_TRUE(peer_->Ok("ping"));
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, InFlightTest,
    Combine(Values(std::string("alloc"), std::string("reg")), ValuesIn(hixl_test::AllLinkTypes())),
    [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& i) {
      return std::get<0>(i.param) + "_" + std::get<1>(i.param);
    });

TEST_P(BadTransportTest, PeerFreesAllocMemWithTransfersInFlight) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  constexpr size_t kReqs = 16, kLen = 16 * kMiB / hixl_test::kSanitizerDivisor;
  uintptr_t remote = peer_->Alloc("big", kReqs * kLen);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine({{"CopyThreads", "2"}}));
  Buffer& src = KeptBuffer(kLen);
  hixl_test::FillPattern(src.data(), kLen, 53);
  std::vector<TransferReq> reqs(kReqs, 0);
  for (size_t i = 0; i < kReqs; ++i) {
    HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                         {{src.addr(), remote + i * kLen, kLen}}, {}, reqs[i]));
  }
  ASSERT_TRUE(peer_->Ok("free big", 15000));
  for (size_t i = 0; i < kReqs; ++i) {
    Status call;
    TransferStatus st = hixl_test::WaitForEnd(engine_, reqs[i], 10000, &call);
    EXPECT_TRUE(call.ok()) << "req " << i << ": " << call.ToString();
    EXPECT_TRUE(IsEndState(st)) << "req " << i << " never ended";
  }
  HIXL_EXPECT_NOT_OK(engine_.TransferSync(peer_->engine(), TransferOp::WRITE,
                                          {{src.addr(), remote, 4096}}, 2000));
  EXPECT_TRUE(peer_->Ok("ping"));
}

// kill -9 of the peer: transfers fail (non-OK) within bounded time. The shm
// transport may still hold the dead peer's AllocMem mapping; the engine
// notices the death through its control connection, which is asynchronous,
// so a short grace period (2 s) is allowed before the first failure.
TEST_P(BadTransportTest, KilledPeerTransfersFailWithoutHanging) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 1 * kMiB;
  uintptr_t a = peer_->Alloc("a", n);
  uintptr_t r = peer_->Reg("r", n, "rw");
  ASSERT_NE(a, 0u);
  ASSERT_NE(r, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  Buffer& src = KeptBuffer(n);
  hixl_test::FillPattern(src.data(), n, 44);
  HIXL_ASSERT_OK(Sync(TransferOp::WRITE, {{src.addr(), a, n}}));
  HIXL_ASSERT_OK(Sync(TransferOp::WRITE, {{src.addr(), r, n}}));
  const std::string eng = peer_->engine();
  peer_->Kill();

  // Cross-memory attach into a dead process cannot succeed.
  auto t0 = Clock::now();
  HIXL_EXPECT_NOT_OK(engine_.TransferSync(eng, TransferOp::WRITE, {{src.addr(), r, n}}, 1000));
  EXPECT_LT(ElapsedMs(t0), 3000);

  for (uintptr_t remote : {a, r}) {
    for (TransferOp op : {TransferOp::WRITE, TransferOp::READ}) {
      const auto deadline = Clock::now() + std::chrono::milliseconds(2000);
      Status s;
      do {
        auto t1 = Clock::now();
        s = engine_.TransferSync(eng, op, {{src.addr(), remote, n}}, 1000);
        EXPECT_LT(ElapsedMs(t1), 3000) << "a transfer to a dead peer hung";
        if (!s.ok()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      } while (Clock::now() < deadline);
      EXPECT_FALSE(s.ok()) << (remote == a ? "alloc" : "reg") << " region, "
                           << (op == TransferOp::WRITE ? "WRITE" : "READ")
                           << ": still succeeding 2 s after the peer was killed";
    }
  }
  // Async as well: rejected at post or ends non-COMPLETED, bounded.
  TransferReq req = 0;
  Status s = engine_.TransferAsync(eng, TransferOp::WRITE, {{src.addr(), r, n}}, {}, req);
  if (s.ok()) {
    TransferStatus st = hixl_test::WaitForEnd(engine_, req, 5000);
    EXPECT_TRUE(st == TransferStatus::FAILED || st == TransferStatus::TIMEOUT)
        << hixl_test::TransferStatusName(st);
  }
  t0 = Clock::now();
  engine_.Finalize();
  EXPECT_LT(ElapsedMs(t0), 5000);
}

}  // namespace
