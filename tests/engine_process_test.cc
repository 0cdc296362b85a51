// tests/engine_process_test.cc — engine basics and transfers between this test
// process and real hixl_test_peer processes. Every byte moved is checked by
// hashing it on both sides (hixl_test::Fnv1a64).
//
// Transport conformance: every transfer test is a TEST_P over the initiator's
// LinkType option (hixl_test::AllLinkTypes(): SHM and TCP; the peer needs no
// option, a target always offers every transport), so the same body runs on
// each transport; ConnectEngine checks that the link really uses it.
// Transport-specific tests (LinkTypeIsShm, Tcp*) follow the shared ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "hixl/hixl.h"
#include "peer_process.h"

namespace {

using hixl::Hixl;
using hixl::LinkType;
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
constexpr int kBigTransferMs = 60000;

// A peer process plus an engine in this process connected to it.
class PeerTest : public ::testing::Test {
 protected:
  // Regions the peer registers before ConnectEngine() are part of the
  // handshake; ones registered later reach us asynchronously (see
  // RegionRegisteredAfterConnectIsUsable), so tests create them first.
  void StartPeer(const std::vector<std::string>& peer_opts = {}) {
    peer_ = std::make_unique<PeerProcess>(peer_opts);
    ASSERT_TRUE(peer_->Start());
  }
  // Adds LinkType=link_ (when set) to the options and checks that the link
  // uses that transport.
  void ConnectEngine(const std::map<std::string, std::string>& local_opts = {}) {
    std::map<std::string, std::string> opts = local_opts;
    if (!link_.empty()) opts.emplace(hixl::options::kLinkType, link_);
    HIXL_ASSERT_OK(engine_.Initialize("127.0.0.1:0", opts));
    HIXL_ASSERT_OK(engine_.Connect(peer_->engine(), kConnectMs));
    if (!link_.empty()) {
      LinkType t = LinkType::AUTO;
      HIXL_ASSERT_OK(engine_.GetLinkType(peer_->engine(), t));
      ASSERT_EQ(t, hixl_test::LinkTypeOf(link_)) << "LinkType=" << link_;
    }
  }
  // A buffer that outlives TearDown's Finalize: safe as the local side of
  // async requests even when an assertion ends the test early.
  Buffer& KeptBuffer(size_t size, int fill = 0) {
    kept_.push_back(std::make_unique<Buffer>(size, fill));
    return *kept_.back();
  }
  void TearDown() override {
    engine_.Finalize();  // before the peer goes: no transfer may outlive it
    peer_.reset();
  }

  Status Write(uintptr_t local, uintptr_t remote, size_t len, int timeout_ms = kBigTransferMs) {
    return engine_.TransferSync(peer_->engine(), TransferOp::WRITE, {{local, remote, len}},
                                timeout_ms);
  }
  Status Read(uintptr_t local, uintptr_t remote, size_t len, int timeout_ms = kBigTransferMs) {
    return engine_.TransferSync(peer_->engine(), TransferOp::READ, {{local, remote, len}},
                                timeout_ms);
  }

  std::string link_;  // this engine's LinkType option; empty: default (AUTO)
  std::vector<std::unique_ptr<Buffer>> kept_;  // destroyed after TearDown
  std::unique_ptr<PeerProcess> peer_;
  Hixl engine_;
};

// PeerTest run once per transport (the param is the LinkType option).
class TransportTest : public PeerTest, public ::testing::WithParamInterface<std::string> {
 protected:
  TransportTest() { link_ = GetParam(); }
  // Writes and reads the kMixed batch from an engine made with `opts`.
  void RunMixed(const std::map<std::string, std::string>& opts);
};

std::string LinkParamName(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest, ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);

// ---------------------------------------------------------------------------
// Engine basics.

TEST(EngineBasics, LocalEngineEmptyBeforeInitialize) {
  Hixl e;
  EXPECT_EQ(e.LocalEngine(), "");
}

TEST(EngineBasics, PortZeroReportsARealListeningPort) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  const std::string le = e.LocalEngine();
  ASSERT_EQ(le.rfind("127.0.0.1:", 0), 0u) << le;
  const int port = hixl_test::PortOf(le);
  EXPECT_GT(port, 0) << le;
  EXPECT_LT(port, 65536) << le;

  // A second engine gets a different port.
  Hixl e2;
  HIXL_ASSERT_OK(e2.Initialize("127.0.0.1:0"));
  EXPECT_NE(hixl_test::PortOf(e2.LocalEngine()), port);

  // Another process can connect to the reported address.
  PeerProcess peer;
  ASSERT_TRUE(peer.Start());
  EXPECT_TRUE(peer.Ok("connect " + le + " 5000"));
  EXPECT_TRUE(peer.Ok("linktype " + le));
}

class ClientOnlyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ClientOnlyTest, ClientOnlyEngineConnectsAndTransfers) {
  PeerProcess peer;
  ASSERT_TRUE(peer.Start());
  const size_t n = 1 * kMiB + 123;
  uintptr_t remote = peer.Alloc("m", n);
  ASSERT_NE(remote, 0u);
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1", {{hixl::options::kLinkType, GetParam()}}));
  EXPECT_EQ(e.LocalEngine(), "127.0.0.1");
  HIXL_ASSERT_OK(e.Connect(peer.engine(), kConnectMs));
  LinkType lt = LinkType::AUTO;
  HIXL_ASSERT_OK(e.GetLinkType(peer.engine(), lt));
  EXPECT_EQ(lt, hixl_test::LinkTypeOf(GetParam()));
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 77);
  HIXL_ASSERT_OK(
      e.TransferSync(peer.engine(), TransferOp::WRITE, {{src.addr(), remote, n}}, 10000));
  EXPECT_EQ(peer.Hash("m", 0, n), src.HashHex());
  ASSERT_TRUE(peer.Ok("fillpat m 78"));
  Buffer dst(n);
  HIXL_ASSERT_OK(e.TransferSync(peer.engine(), TransferOp::READ, {{dst.addr(), remote, n}}, 10000));
  EXPECT_EQ(dst.HashHex(), peer.Hash("m", 0, n));
  e.Finalize();
}

INSTANTIATE_TEST_SUITE_P(Transports, ClientOnlyTest, ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);

TEST(EngineBasics, InitializeTwiceFailsAndKeepsTheFirst) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  const std::string le = e.LocalEngine();
  HIXL_EXPECT_NOT_OK(e.Initialize("127.0.0.1:0"));
  HIXL_EXPECT_NOT_OK(e.Initialize("127.0.0.1"));
  EXPECT_EQ(e.LocalEngine(), le);
  // Still serving on the first address.
  PeerProcess peer;
  ASSERT_TRUE(peer.Start());
  EXPECT_TRUE(peer.Ok("connect " + le + " 5000"));
}

TEST(EngineBasics, UnknownOptionKeyIsParamInvalid) {
  Hixl e;
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, e.Initialize("127.0.0.1:0", {{"NoSuchOption", "1"}}));
  EXPECT_EQ(e.LocalEngine(), "") << "a failed Initialize must leave the engine uninitialized";
  Hixl e2;
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                   e2.Initialize("127.0.0.1:0", {{"CopyThreads", "2"}, {"NoSuchOption", "2"}}));
}

TEST(EngineBasics, BadOptionValuesAreParamInvalid) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"CopyThreads", "0"},
      {"CopyThreads", "65"},
      {"CopyThreads", "abc"},
      {"CopyThreads", ""},
      {"CopyThreads", "-1"},
      {"CopyThreads", "2x"},
      {"CopyThreads", "99999999999999999999"},
      {"LinkType", "FOO"},
      {"LinkType", ""},
      {"EnableUseFabricMem", "yes"},
      {"EnableUseFabricMem", "2"},
      {"DeregisterTimeoutMs", "abc"},
      {"HandshakeTimeoutMs", "x"},
      {"PollSpinUs", "-1"},
      {"PollSpinUs", "1001"},
      {"ShmNotifyRing", "2"},
      {"ShmNotifyRing", "on"},
      {"ShmStreamCopyBytes", "-2"},
      {"ShmStreamCopyBytes", "16M"},
  };
  for (const auto& [k, v] : bad) {
    Hixl e;
    Status s = e.Initialize("127.0.0.1:0", {{k, v}});
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << k << "=\"" << v << "\" -> " << s.ToString();
    e.Finalize();
  }
}

TEST(EngineBasics, GoodOptionValuesAreAccepted) {
  const std::vector<std::map<std::string, std::string>> good = {
      {{"CopyThreads", "1"}},
      {{"CopyThreads", "64"}},
      {{"LinkType", "AUTO"}},
      {{"LinkType", "SHM"}},
      {{"LinkType", "HCCS"}},
      {{"EnableUseFabricMem", "0"}},
      {{"EnableUseFabricMem", "1"}},
      {{"DeregisterTimeoutMs", "100"}, {"HandshakeTimeoutMs", "100"}},
      {{"PollSpinUs", "0"}},
      {{"PollSpinUs", "1000"}},
      {{"ShmNotifyRing", "0"}},
      {{"ShmNotifyRing", "1"}},
      {{"ShmStreamCopyBytes", "-1"}},
      {{"ShmStreamCopyBytes", "0"}},
      {{"ShmStreamCopyBytes", "1048576"}},
  };
  for (const auto& opts : good) {
    Hixl e;
    Status s = e.Initialize("127.0.0.1:0", opts);
    EXPECT_TRUE(s.ok()) << opts.begin()->first << "=" << opts.begin()->second << " -> "
                        << s.ToString();
  }
}

TEST(EngineBasics, InvalidLocalEngineIsRejected) {
  for (const std::string addr :
       {"", "not-an-address:1", "127.0.0.1:70000", "127.0.0.1:x", "999.1.1.1:0", "[::1:0"}) {
    Hixl e;
    HIXL_EXPECT_NOT_OK(e.Initialize(addr));
  }
}

TEST(EngineBasics, FinalizeTwiceIsFine) {
  Hixl never_initialized;
  never_initialized.Finalize();
  never_initialized.Finalize();

  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  void* p = nullptr;
  HIXL_ASSERT_OK(e.AllocMem(1 * kMiB, hixl::MemType::MEM_HOST, &p));
  e.Finalize();
  e.Finalize();
  // The destructor finalizes a third time.
}

TEST(EngineBasics, AllocMemIsPageAlignedWithAHandle) {
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1"));
  void* p = nullptr;
  HIXL_ASSERT_OK(e.AllocMem(3 * 4096 + 5, hixl::MemType::MEM_HOST, &p));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  std::memset(p, 0xAB, 3 * 4096 + 5);  // usable memory
  hixl::MemHandle h = 0;
  HIXL_EXPECT_OK(e.GetMemHandle(p, h));
  EXPECT_NE(h, 0u);
  HIXL_EXPECT_OK(e.FreeMem(p));
}

// ---------------------------------------------------------------------------
// Large single-descriptor transfers: {AllocMem (memfd map), reg (malloc,
// cross-memory attach)} x CopyThreads {1, 2} x transport. Over TCP these are
// the 128 MiB tcp write/read checks (CopyThreads does not matter there).
// 32 MiB under ThreadSanitizer (kSanitizerDivisor), where the eight cases of
// 128 MiB took 160 test-seconds of hashing and first touches; the copy threads
// still split every transfer.

struct LargeParam {
  const char* kind;  // "alloc" or "reg"
  const char* copy_threads;
  const char* link;  // LinkType option
  friend void PrintTo(const LargeParam& p, std::ostream* os) {
    *os << p.kind << "/CopyThreads=" << p.copy_threads << "/" << p.link;
  }
};

class LargeTransferTest : public PeerTest, public ::testing::WithParamInterface<LargeParam> {
 protected:
  LargeTransferTest() { link_ = GetParam().link; }
};

TEST_P(LargeTransferTest, WriteThenReadLarge) {
  const LargeParam p = GetParam();
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 128 * kMiB / hixl_test::kSanitizerDivisor;
  uintptr_t remote =
      std::string(p.kind) == "alloc" ? peer_->Alloc("big", n) : peer_->Reg("big", n, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine({{"CopyThreads", p.copy_threads}}));

  Buffer buf(n);
  hixl_test::FillPattern(buf.data(), n, 1001);
  const std::string src_hash = buf.HashHex();
  HIXL_ASSERT_OK(Write(buf.addr(), remote, n));
  EXPECT_EQ(peer_->Hash("big", 0, n), src_hash);

  ASSERT_TRUE(peer_->Ok("fillpat big 1002"));
  const std::string peer_hash = peer_->Hash("big", 0, n);
  EXPECT_NE(peer_hash, src_hash);
  std::memset(buf.data(), 0, n);
  HIXL_ASSERT_OK(Read(buf.addr(), remote, n));
  EXPECT_EQ(buf.HashHex(), peer_hash);
  // And the content is exactly the pattern the peer wrote.
  Buffer expect(n);
  hixl_test::FillPattern(expect.data(), n, 1002);
  EXPECT_EQ(expect.HashHex(), peer_hash);
  EXPECT_TRUE(peer_->Ok("canary big"));
}

INSTANTIATE_TEST_SUITE_P(KindsAndThreads, LargeTransferTest,
                         Values(LargeParam{"alloc", "1", "SHM"}, LargeParam{"alloc", "2", "SHM"},
                                LargeParam{"reg", "1", "SHM"}, LargeParam{"reg", "2", "SHM"},
                                LargeParam{"alloc", "1", "TCP"}, LargeParam{"alloc", "2", "TCP"},
                                LargeParam{"reg", "1", "TCP"}, LargeParam{"reg", "2", "TCP"}),
                         [](const ::testing::TestParamInfo<LargeParam>& i) {
                           return std::string(i.param.kind) + "_CopyThreads" +
                                  i.param.copy_threads + "_" + i.param.link;
                         });

// ---------------------------------------------------------------------------
// Many small descriptors at scattered, non-contiguous, unordered offsets.

// Param: (region kind "alloc" | "reg", LinkType option).
class ScatterTest : public PeerTest,
                    public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {
 protected:
  ScatterTest() { link_ = std::get<1>(GetParam()); }
  std::string kind() const { return std::get<0>(GetParam()); }
};

TEST_P(ScatterTest, Write1024ScatteredDescriptorsOf4KiB) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  constexpr size_t kCount = 1024, kLen = 4096, kSlot = 16384;
  const size_t region = kCount * kSlot;
  uintptr_t remote = kind() == "alloc" ? peer_->Alloc("s", region) : peer_->Reg("s", region, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  ASSERT_TRUE(peer_->Ok("fill s 0"));

  const size_t local_size = kCount * 5000 + kLen;
  Buffer src(local_size);
  hixl_test::FillPattern(src.data(), local_size, 4242);
  Buffer expect(region, 0);
  std::vector<TransferOpDesc> descs;
  for (size_t i = 0; i < kCount; ++i) {
    size_t slot = (i * 379) % kCount;  // a permutation: unordered
    size_t roff = slot * kSlot + (i % 13) * 8 + 1;
    size_t loff = i * 5000 + (i % 7);
    descs.push_back({src.addr(loff), remote + roff, kLen});
    std::memcpy(expect.data() + roff, src.data() + loff, kLen);
  }
  HIXL_ASSERT_OK(engine_.TransferSync(peer_->engine(), TransferOp::WRITE, descs, 30000));
  EXPECT_EQ(peer_->Hash("s", 0, region), expect.HashHex()) << "scattered write mismatch";
  EXPECT_TRUE(peer_->Ok("canary s"));
}

TEST_P(ScatterTest, Read1024ScatteredDescriptorsOf4KiB) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  constexpr size_t kCount = 1024, kLen = 4096, kSlot = 16384;
  const size_t region = kCount * kSlot;
  uintptr_t remote = kind() == "alloc" ? peer_->Alloc("s", region) : peer_->Reg("s", region, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  ASSERT_TRUE(peer_->Ok("fillpat s 9"));
  Buffer image(region);
  hixl_test::FillPattern(image.data(), region, 9);
  ASSERT_EQ(peer_->Hash("s", 0, region), image.HashHex());

  const size_t local_size = kCount * 5000 + kLen;
  Buffer dst(local_size, 0xEE);
  Buffer expect(local_size, 0xEE);
  std::vector<TransferOpDesc> descs;
  for (size_t i = 0; i < kCount; ++i) {
    size_t slot = (i * 379) % kCount;
    size_t roff = slot * kSlot + (i % 13) * 8 + 1;
    size_t loff = i * 5000 + (i % 7);
    descs.push_back({dst.addr(loff), remote + roff, kLen});
    std::memcpy(expect.data() + loff, image.data() + roff, kLen);
  }
  HIXL_ASSERT_OK(engine_.TransferSync(peer_->engine(), TransferOp::READ, descs, 30000));
  EXPECT_EQ(dst.HashHex(), expect.HashHex()) << "scattered read mismatch";
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, ScatterTest,
    Combine(Values(std::string("alloc"), std::string("reg")), ValuesIn(hixl_test::AllLinkTypes())),
    [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& i) {
      return std::get<0>(i.param) + "_" + std::get<1>(i.param);
    });

// ---------------------------------------------------------------------------
// One batch mixing sizes (1 byte .. 1 MiB+13), alignments and two regions of
// different kinds (AllocMem and malloc) of the same peer.

struct MixedDesc {
  bool in_a;  // region "a" (AllocMem) or "b" (reg)
  size_t roff, loff, len;
};
const std::vector<MixedDesc> kMixed = {
    {true, 0, 0, 1},
    {false, 1, 7, 3},
    {true, 4095, 100, 4097},
    {false, 8191, 20000, 65537},
    {true, 1 * kMiB + 3, 200000, 1 * kMiB + 13},
    {false, 2 * kMiB + 5, 1500000, 1 * kMiB},
    {true, 4 * kMiB - 1, 3000000, 1},
    {false, 4 * kMiB - 4096, 3100000, 4096},
    {false, 0, 3200000, 1},
    {true, 3 * kMiB, 3300000, 777},
};
constexpr size_t kMixedRegion = 4 * kMiB;

TEST_P(TransportTest, MixedDescriptorsWriteAndRead) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  ASSERT_NO_FATAL_FAILURE(RunMixed({}));
}

// The same batch with every shm copy made by non-temporal stores (a transfer
// this small normally uses memcpy): heads, tails and 1-byte pieces.
TEST_P(TransportTest, MixedDescriptorsStreamedPastTheCache) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  ASSERT_NO_FATAL_FAILURE(RunMixed({{hixl::options::kShmStreamCopyBytes, "1"}}));
}

void TransportTest::RunMixed(const std::map<std::string, std::string>& opts) {
  uintptr_t a = peer_->Alloc("a", kMixedRegion);
  uintptr_t b = peer_->Reg("b", kMixedRegion, "rw");
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine(opts));

  // WRITE
  ASSERT_TRUE(peer_->Ok("fill a 0"));
  ASSERT_TRUE(peer_->Ok("fill b 0"));
  Buffer src(4 * kMiB);
  hixl_test::FillPattern(src.data(), src.size(), 555);
  Buffer ea(kMixedRegion, 0), eb(kMixedRegion, 0);
  std::vector<TransferOpDesc> descs;
  for (const auto& d : kMixed) {
    descs.push_back({src.addr(d.loff), (d.in_a ? a : b) + d.roff, d.len});
    std::memcpy((d.in_a ? ea : eb).data() + d.roff, src.data() + d.loff, d.len);
  }
  HIXL_ASSERT_OK(engine_.TransferSync(peer_->engine(), TransferOp::WRITE, descs, 10000));
  EXPECT_EQ(peer_->Hash("a", 0, kMixedRegion), ea.HashHex());
  EXPECT_EQ(peer_->Hash("b", 0, kMixedRegion), eb.HashHex());
  EXPECT_TRUE(peer_->Ok("canary b"));

  // READ
  ASSERT_TRUE(peer_->Ok("fillpat a 31"));
  ASSERT_TRUE(peer_->Ok("fillpat b 32"));
  Buffer ia(kMixedRegion), ib(kMixedRegion);
  hixl_test::FillPattern(ia.data(), kMixedRegion, 31);
  hixl_test::FillPattern(ib.data(), kMixedRegion, 32);
  Buffer dst(4 * kMiB, 0x11), expect(4 * kMiB, 0x11);
  descs.clear();
  for (const auto& d : kMixed) {
    descs.push_back({dst.addr(d.loff), (d.in_a ? a : b) + d.roff, d.len});
    std::memcpy(expect.data() + d.loff, (d.in_a ? ia : ib).data() + d.roff, d.len);
  }
  HIXL_ASSERT_OK(engine_.TransferSync(peer_->engine(), TransferOp::READ, descs, 10000));
  EXPECT_EQ(dst.HashHex(), expect.HashHex());
}

// ---------------------------------------------------------------------------
// Async contract.

TEST_P(TransportTest, AsyncWriteAndReadCompleteAndReleaseTheRequest) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 8 * kMiB;
  uintptr_t remote = peer_->Alloc("m", n);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  Buffer& src = KeptBuffer(n);
  hixl_test::FillPattern(src.data(), n, 123);

  TransferReq req = 0;
  hixl::TransferArgs args;
  args.user_data = 42;
  HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                       {{src.addr(), remote, n}}, args, req));
  EXPECT_NE(req, 0u);
  Status call;
  TransferStatus st = hixl_test::WaitForEnd(engine_, req, 10000, &call);
  ASSERT_TRUE(call.ok()) << call.ToString();
  ASSERT_EQ(st, TransferStatus::COMPLETED);
  // Once an end state was reported the request is released.
  TransferStatus again = TransferStatus::WAITING;
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, engine_.GetTransferStatus(req, again));
  EXPECT_EQ(peer_->Hash("m", 0, n), src.HashHex());

  // READ, polled through the overload that also reports the reason.
  ASSERT_TRUE(peer_->Ok("fillpat m 124"));
  Buffer& dst = KeptBuffer(n);
  TransferReq req2 = 0;
  HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::READ, {{dst.addr(), remote, n}},
                                       hixl::TransferArgs{}, req2));
  EXPECT_NE(req2, 0u);
  EXPECT_NE(req2, req);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  TransferStatus st2 = TransferStatus::WAITING;
  Status reason;
  while (Clock::now() < deadline) {
    HIXL_ASSERT_OK(engine_.GetTransferStatus(req2, st2, reason));
    if (st2 != TransferStatus::WAITING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(st2, TransferStatus::COMPLETED) << reason.ToString();
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, engine_.GetTransferStatus(req2, st2, reason));
  EXPECT_EQ(dst.HashHex(), peer_->Hash("m", 0, n));
}

TEST_P(TransportTest, ManyConcurrentAsyncRequestsAllComplete) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  constexpr size_t kReqs = 32, kLen = 512 * 1024;
  const size_t n = kReqs * kLen;
  uintptr_t remote = peer_->Reg("m", n, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  Buffer& src = KeptBuffer(n);
  hixl_test::FillPattern(src.data(), n, 321);
  std::vector<TransferReq> reqs(kReqs, 0);
  for (size_t i = 0; i < kReqs; ++i) {
    // Reverse order, so the remote layout differs from the posting order.
    size_t off = (kReqs - 1 - i) * kLen;
    HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                         {{src.addr(off), remote + off, kLen}}, {}, reqs[i]));
  }
  std::vector<TransferReq> sorted = reqs;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "duplicate req";
  for (size_t i = 0; i < kReqs; ++i) {
    Status call;
    EXPECT_EQ(hixl_test::WaitForEnd(engine_, reqs[i], 10000, &call), TransferStatus::COMPLETED)
        << "req " << i << " " << call.ToString();
  }
  EXPECT_EQ(peer_->Hash("m", 0, n), src.HashHex());
  EXPECT_TRUE(peer_->Ok("canary m"));
}

// Every method may be called from any thread concurrently.
TEST_P(TransportTest, ConcurrentSyncTransfersFromSeveralThreads) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  constexpr size_t kThreads = 4, kIters = 16, kLen = 256 * 1024;
  const size_t n = kThreads * kIters * kLen;
  uintptr_t a = peer_->Alloc("a", n);
  uintptr_t b = peer_->Reg("b", n, "rw");
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 2024);
  std::vector<std::vector<std::string>> errors(kThreads);
  std::vector<std::thread> threads;
  const std::string eng = peer_->engine();
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < kIters; ++i) {
        size_t off = (t * kIters + i) * kLen;
        uintptr_t remote = ((i % 2) ? a : b) + off;
        Status s =
            engine_.TransferSync(eng, TransferOp::WRITE, {{src.addr(off), remote, kLen}}, 10000);
        if (!s.ok()) errors[t].push_back(s.ToString());
        uintptr_t other = ((i % 2) ? b : a) + off;
        s = engine_.TransferSync(eng, TransferOp::WRITE, {{src.addr(off), other, kLen}}, 10000);
        if (!s.ok()) errors[t].push_back(s.ToString());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(errors[t].empty()) << "thread " << t << ": " << errors[t].front();
  }
  EXPECT_EQ(peer_->Hash("a", 0, n), src.HashHex());
  EXPECT_EQ(peer_->Hash("b", 0, n), src.HashHex());
}

// ---------------------------------------------------------------------------
// Links.

TEST_F(PeerTest, LinkTypeIsShm) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  LinkType t = LinkType::AUTO;
  HIXL_ASSERT_OK(engine_.GetLinkType(peer_->engine(), t));
  EXPECT_EQ(t, LinkType::SHM);
  const char* name = hixl::LinkTypeName(LinkType::SHM);
  ASSERT_NE(name, nullptr);
  EXPECT_EQ(strcasecmp(name, "shm"), 0) << name;
  // No link, no link type.
  LinkType t2 = LinkType::AUTO;
  HIXL_EXPECT_NOT_OK(engine_.GetLinkType("127.0.0.1:1", t2));
}

TEST(Links, LinkTypeOptionShmAndHccsGiveShm) {
  for (const char* lt : {"SHM", "HCCS"}) {
    PeerProcess peer({std::string("LinkType=") + lt});
    ASSERT_TRUE(peer.Start());
    Hixl e;
    HIXL_ASSERT_OK(e.Initialize("127.0.0.1:0", {{"LinkType", lt}}));
    HIXL_ASSERT_OK(e.Connect(peer.engine(), kConnectMs));
    LinkType t = LinkType::AUTO;
    HIXL_EXPECT_OK(e.GetLinkType(peer.engine(), t));
    EXPECT_EQ(t, LinkType::SHM) << lt;
    e.Finalize();
  }
}

TEST_P(TransportTest, DisconnectThenTransferIsNotConnectedAndReconnectWorks) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 64 * 1024;
  uintptr_t remote = peer_->Alloc("m", n);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 5);
  HIXL_ASSERT_OK(Write(src.addr(), remote, n, 5000));
  HIXL_ASSERT_OK(engine_.Disconnect(peer_->engine(), 2000));
  ASSERT_TRUE(peer_->Ok("fill m 0"));
  HIXL_EXPECT_CODE(StatusCode::kNotConnected, Write(src.addr(), remote, n, 2000));
  EXPECT_EQ(peer_->Hash("m", 0, n), Buffer(n, 0).HashHex());
  HIXL_ASSERT_OK(engine_.Connect(peer_->engine(), kConnectMs));
  LinkType t = LinkType::AUTO;
  HIXL_ASSERT_OK(engine_.GetLinkType(peer_->engine(), t));
  EXPECT_EQ(t, hixl_test::LinkTypeOf(link_)) << "the new link uses another transport";
  HIXL_ASSERT_OK(Write(src.addr(), remote, n, 5000));
  EXPECT_EQ(peer_->Hash("m", 0, n), src.HashHex());
}

// ---------------------------------------------------------------------------
// Region updates after Connect.

// A region the peer registers after our Connect reaches us without
// reconnecting. The update travels asynchronously over the control link, so
// the first attempts may still fail (non-OK, nothing written): retry for at
// most 2 s.
TEST_P(TransportTest, RegionRegisteredAfterConnectIsUsable) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  const size_t n = 1 * kMiB;
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 888);
  for (const char* kind : {"alloc", "reg"}) {
    const std::string name = std::string("late_") + kind;
    uintptr_t remote =
        std::string(kind) == "alloc" ? peer_->Alloc(name, n) : peer_->Reg(name, n, "rw");
    ASSERT_NE(remote, 0u);
    const auto deadline = Clock::now() + std::chrono::milliseconds(2000);
    Status s;
    int attempts = 0;
    do {
      ++attempts;
      s = Write(src.addr(), remote, n, 2000);
      if (s.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } while (Clock::now() < deadline);
    ASSERT_TRUE(s.ok()) << kind << ": still failing after 2 s (" << attempts
                        << " attempts): " << s.ToString();
    EXPECT_EQ(peer_->Hash(name, 0, n), src.HashHex()) << kind;
    Buffer back(n);
    HIXL_EXPECT_OK(Read(back.addr(), remote, n, 5000));
    EXPECT_EQ(back.HashHex(), src.HashHex()) << kind;
  }
}

// DeregisterMem on the peer returns only after we stopped using the region:
// transfers right after it fail and touch nothing.
TEST_P(TransportTest, RegionDeregisteredByPeerBecomesUnusable) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 1 * kMiB;
  uintptr_t remote = peer_->Reg("r", n, "rw");
  uintptr_t other = peer_->Reg("other", n, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NE(other, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  Buffer& src = KeptBuffer(n);
  hixl_test::FillPattern(src.data(), n, 61);
  HIXL_ASSERT_OK(Write(src.addr(), remote, n, 5000));  // usable before
  ASSERT_EQ(peer_->Hash("r", 0, n), src.HashHex());

  ASSERT_TRUE(peer_->Ok("fillpat r 62"));
  const std::string before = peer_->Hash("r", 0, n);
  ASSERT_TRUE(peer_->Ok("dereg r"));
  // DeregisterMem returned on the peer: from now on nothing may reach it.
  HIXL_EXPECT_NOT_OK(Write(src.addr(), remote, n, 2000));
  HIXL_EXPECT_NOT_OK(Write(src.addr(), remote + 4096, 100, 2000));
  Buffer& dst = KeptBuffer(n, 0x3C);
  HIXL_EXPECT_NOT_OK(Read(dst.addr(), remote, n, 2000));
  TransferReq req = 0;
  Status as =
      engine_.TransferAsync(peer_->engine(), TransferOp::WRITE, {{src.addr(), remote, n}}, {}, req);
  if (as.ok()) {
    EXPECT_NE(hixl_test::WaitForEnd(engine_, req, 5000), TransferStatus::COMPLETED)
        << "an async WRITE into a deregistered region completed";
  }
  EXPECT_EQ(dst.HashHex(), Buffer(n, 0x3C).HashHex()) << "READ from a deregistered region wrote";
  EXPECT_EQ(peer_->Hash("r", 0, n), before) << "a deregistered region was written";
  EXPECT_TRUE(peer_->Ok("canary r"));
  // The peer's other region is unaffected.
  HIXL_EXPECT_OK(Write(src.addr(), other, n, 5000));
  EXPECT_EQ(peer_->Hash("other", 0, n), src.HashHex());
}

TEST_P(TransportTest, RegionFreedByPeerBecomesUnusable) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 1 * kMiB;
  uintptr_t remote = peer_->Alloc("f", n);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 71);
  HIXL_ASSERT_OK(Write(src.addr(), remote, n, 5000));
  ASSERT_TRUE(peer_->Ok("free f"));
  HIXL_EXPECT_NOT_OK(Write(src.addr(), remote, n, 2000));
  Buffer dst(n, 0x3C);
  HIXL_EXPECT_NOT_OK(Read(dst.addr(), remote, n, 2000));
  EXPECT_EQ(dst.HashHex(), Buffer(n, 0x3C).HashHex());
  EXPECT_TRUE(peer_->Ok("ping"));
}

// ---------------------------------------------------------------------------
// tcp-specific.

TEST_F(PeerTest, LinkTypeIsTcpWhenForced) {
  link_ = "TCP";  // same host: AUTO would pick shm (LinkTypeIsShm)
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  ASSERT_NO_FATAL_FAILURE(ConnectEngine());
  LinkType t = LinkType::AUTO;
  HIXL_ASSERT_OK(engine_.GetLinkType(peer_->engine(), t));
  EXPECT_EQ(t, LinkType::TCP);
  const char* name = hixl::LinkTypeName(LinkType::TCP);
  ASSERT_NE(name, nullptr);
  EXPECT_EQ(strcasecmp(name, "tcp"), 0) << name;
  // The peer reports the same through its own API when it forces TCP.
  PeerProcess other({"LinkType=TCP"});
  ASSERT_TRUE(other.Start());
  ASSERT_TRUE(other.Ok("connect " + peer_->engine() + " 5000"));
  EXPECT_EQ(other.Send("linktype " + peer_->engine()), std::string("OK ") + name);
}

// PollSpinUs=0 on both sides: every I/O thread and the waiting caller sleep
// at once; small and large transfers still complete (and are answered).
TEST_F(PeerTest, TcpTransfersWithoutPolling) {
  link_ = "TCP";
  ASSERT_NO_FATAL_FAILURE(StartPeer({"PollSpinUs=0"}));
  const size_t n = 2 * kMiB;
  uintptr_t remote = peer_->Reg("r", n, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine({{hixl::options::kPollSpinUs, "0"}}));
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 17);
  for (int i = 0; i < 50; ++i)
    HIXL_ASSERT_OK(Write(src.addr(i * 4096), remote + i * 4096, 4096, 5000));
  HIXL_ASSERT_OK(Write(src.addr(), remote, n, 10000));
  EXPECT_EQ(peer_->Hash("r", 0, n), src.HashHex());
  Buffer back(n);
  HIXL_ASSERT_OK(Read(back.addr(), remote, n, 10000));
  EXPECT_EQ(back.HashHex(), src.HashHex());
}

TEST(TcpOptions, BadValuesAreParamInvalid) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"TcpLanes", "0"},     {"TcpLanes", "65"},           {"TcpLanes", "x"},
      {"TcpLanes", ""},      {"TcpLanes", "-1"},           {"TcpSliceSize", "4095"},
      {"TcpSliceSize", "0"}, {"TcpSliceSize", "67108865"}, {"TcpSliceSize", "1M"},
      {"TcpIoThreads", "0"}, {"TcpIoThreads", "17"},       {"TcpIoThreads", "two"},
      {"LinkType", "tcpx"},
  };
  for (const auto& [k, v] : bad) {
    Hixl e;
    Status s = e.Initialize("127.0.0.1:0", {{k, v}});
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << k << "=\"" << v << "\" -> " << s.ToString();
    EXPECT_EQ(e.LocalEngine(), "") << k << "=\"" << v << "\" left the engine initialized";
  }
}

TEST(TcpOptions, GoodValuesAreAccepted) {
  const std::vector<std::map<std::string, std::string>> good = {
      {{"LinkType", "TCP"}},
      {{"TcpLanes", "1"}},
      {{"TcpLanes", "64"}},
      {{"TcpSliceSize", "4096"}},
      {{"TcpSliceSize", "67108864"}},
      {{"TcpIoThreads", "1"}},
      {{"TcpIoThreads", "16"}},
      {{"LinkType", "TCP"}, {"TcpLanes", "3"}, {"TcpSliceSize", "65536"}, {"TcpIoThreads", "3"}},
  };
  for (const auto& opts : good) {
    Hixl e;
    Status s = e.Initialize("127.0.0.1:0", opts);
    EXPECT_TRUE(s.ok()) << opts.begin()->first << "=" << opts.begin()->second << " -> "
                        << s.ToString();
  }
}

// TcpLanes: a transfer is striped over the lanes; each lane keeps many
// slices in flight. Param: the lane count.
class TcpLanesTest : public PeerTest, public ::testing::WithParamInterface<int> {
 protected:
  TcpLanesTest() { link_ = "TCP"; }
};

TEST_P(TcpLanesTest, StripedTransfersAndConcurrentRequests) {
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 16 * kMiB;
  uintptr_t m = peer_->Reg("m", n, "rw");
  uintptr_t a = peer_->Alloc("a", n);
  ASSERT_NE(m, 0u);
  ASSERT_NE(a, 0u);
  // 256 KiB slices: 64 per 16 MiB transfer, spread over the lanes.
  ASSERT_NO_FATAL_FAILURE(ConnectEngine(
      {{"TcpLanes", std::to_string(GetParam())}, {"TcpSliceSize", std::to_string(256 * 1024)}}));
  Buffer& src = KeptBuffer(n);
  hixl_test::FillPattern(src.data(), n, 700 + GetParam());
  HIXL_ASSERT_OK(Write(src.addr(), m, n, 30000));
  EXPECT_EQ(peer_->Hash("m", 0, n), src.HashHex());
  ASSERT_TRUE(peer_->Ok("fillpat m 703"));
  Buffer& dst = KeptBuffer(n);
  HIXL_ASSERT_OK(Read(dst.addr(), m, n, 30000));
  EXPECT_EQ(dst.HashHex(), peer_->Hash("m", 0, n));

  // 24 async requests at once, odd sizes and offsets, into the AllocMem region.
  ASSERT_TRUE(peer_->Ok("fill a 0"));
  Buffer expect(n, 0);
  constexpr size_t kReqs = 24, kSlot = 640 * 1024;
  std::vector<TransferReq> reqs(kReqs, 0);
  for (size_t i = 0; i < kReqs; ++i) {
    const size_t roff = ((i * 7) % kReqs) * kSlot + i, loff = i * 333, len = 300 * 1024 + i * 77;
    std::memcpy(expect.data() + roff, src.data() + loff, len);
    HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                         {{src.addr(loff), a + roff, len}}, {}, reqs[i]));
  }
  for (size_t i = 0; i < kReqs; ++i) {
    Status call, reason;
    EXPECT_EQ(hixl_test::WaitForEnd(engine_, reqs[i], 20000, &call, &reason),
              TransferStatus::COMPLETED)
        << "req " << i << " " << call.ToString() << " " << reason.ToString();
  }
  EXPECT_EQ(peer_->Hash("a", 0, n), expect.HashHex());
  EXPECT_TRUE(peer_->Ok("canary m"));
}

INSTANTIATE_TEST_SUITE_P(Lanes, TcpLanesTest, Values(1, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "TcpLanes" + std::to_string(i.param);
                         });

// TcpSliceSize=4096: a 1 MiB transfer goes as 256 slices (here over 4 lanes,
// so they are reassembled from interleaved lanes); an unaligned 1 MiB + 5
// descriptor as 257, the last one short.
TEST_F(PeerTest, TcpSliceSize4096Splits1MiBInto256Slices) {
  link_ = "TCP";
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t region = 3 * kMiB;
  uintptr_t m = peer_->Reg("m", region, "rw");
  ASSERT_NE(m, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine({{"TcpSliceSize", "4096"}, {"TcpLanes", "4"}}));
  ASSERT_TRUE(peer_->Ok("fill m 0"));
  Buffer src(4 * kMiB);
  hixl_test::FillPattern(src.data(), src.size(), 4096);
  Buffer expect(region, 0);

  HIXL_ASSERT_OK(Write(src.addr(), m, 1 * kMiB, 20000));  // 256 slices
  std::memcpy(expect.data(), src.data(), 1 * kMiB);
  EXPECT_EQ(peer_->Hash("m", 0, region), expect.HashHex());

  // One batch: the 257-slice unaligned descriptor plus a 1-byte one.
  const size_t roff = 1 * kMiB + 3, loff = 1 * kMiB + 5, len = 1 * kMiB + 5;
  HIXL_ASSERT_OK(engine_.TransferSync(
      peer_->engine(), TransferOp::WRITE,
      {{src.addr(loff), m + roff, len}, {src.addr(7), m + region - 1, 1}}, 20000));
  std::memcpy(expect.data() + roff, src.data() + loff, len);
  expect.data()[region - 1] = src.data()[7];
  EXPECT_EQ(peer_->Hash("m", 0, region), expect.HashHex());
  EXPECT_TRUE(peer_->Ok("canary m"));

  // READ the same way back.
  ASSERT_TRUE(peer_->Ok("fillpat m 4097"));
  Buffer image(region);
  hixl_test::FillPattern(image.data(), region, 4097);
  Buffer dst(2 * kMiB + 64, 0xA5), dexpect(2 * kMiB + 64, 0xA5);
  HIXL_ASSERT_OK(engine_.TransferSync(
      peer_->engine(), TransferOp::READ,
      {{dst.addr(), m, 1 * kMiB}, {dst.addr(1 * kMiB + 9), m + roff, len}}, 20000));
  std::memcpy(dexpect.data(), image.data(), 1 * kMiB);
  std::memcpy(dexpect.data() + 1 * kMiB + 9, image.data() + roff, len);
  EXPECT_EQ(dst.HashHex(), dexpect.HashHex());
}

// One lane, one large READ: 128 slices of 1 MiB are requested at once on a
// single lane, more than the target queues (it applies back-pressure at
// 64 MiB of pending replies). The target must resume reading the requests it
// already buffered once its queue drains: the READ completes.
TEST_F(PeerTest, TcpSingleLaneRead128MiB) {
  link_ = "TCP";
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 128 * kMiB;
  uintptr_t remote = peer_->Reg("big", n, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(ConnectEngine({{"TcpLanes", "1"}}));
  ASSERT_TRUE(peer_->Ok("fillpat big 1281"));
  Buffer& dst = KeptBuffer(n);
  const auto t0 = Clock::now();
  HIXL_EXPECT_OK(Read(dst.addr(), remote, n, 20000));
  std::printf(
      "[ info ] 128 MiB READ over one lane: %lld ms\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()));
  EXPECT_EQ(dst.HashHex(), peer_->Hash("big", 0, n));
  // And the lane still works afterwards.
  Buffer small(4096);
  hixl_test::FillPattern(small.data(), 4096, 5);
  HIXL_EXPECT_OK(Write(small.addr(), remote, 4096, 5000));
  EXPECT_EQ(peer_->Hash("big", 0, 4096), small.HashHex());
}

// READs whose replies pass the target's queued-reply limit (64 MiB) while
// more requests wait in its input buffer: every reply still arrives (the
// target serves the buffered requests once its sends made room, though no
// socket event announces them).
TEST_F(PeerTest, TcpReadRepliesBeyondTheQueueLimitAllArrive) {
  link_ = "TCP";
  ASSERT_NO_FATAL_FAILURE(StartPeer());
  const size_t n = 128 * kMiB;
  uintptr_t remote = peer_->Reg("big", n, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(
      ConnectEngine({{"TcpLanes", "1"}, {"TcpSliceSize", std::to_string(128 * 1024)}}));
  ASSERT_TRUE(peer_->Ok("fillpat big 1291"));
  const std::string want = peer_->Hash("big", 0, n);
  Buffer& dst = KeptBuffer(n);
  for (int i = 0; i < 4; ++i) {
    std::memset(dst.data(), 0, n);
    SCOPED_TRACE("round " + std::to_string(i));
    HIXL_ASSERT_OK(Read(dst.addr(), remote, n, 30000));
    ASSERT_EQ(dst.HashHex(), want);
  }
}

// ---------------------------------------------------------------------------
// Two peer processes: A connects to B and moves bytes; this process only
// gives the commands and compares hashes.

class TwoPeersTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TwoPeersTest, PeerAWritesAndReadsPeerBMemory) {
  PeerProcess a({std::string(hixl::options::kLinkType) + "=" + GetParam()}), b;
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  const size_t n = 8 * kMiB + 3;
  uintptr_t b_alloc = b.Alloc("dst", n);
  uintptr_t b_reg = b.Reg("dstr", n, "rw");
  ASSERT_NE(b_alloc, 0u);
  ASSERT_NE(b_reg, 0u);
  ASSERT_TRUE(a.Ok("buf src " + std::to_string(n)));
  ASSERT_TRUE(a.Ok("buf in " + std::to_string(n)));
  ASSERT_TRUE(a.Ok("fillpat src 99"));
  const std::string src_hash = a.Hash("src", 0, n);
  ASSERT_TRUE(a.Ok("connect " + b.engine() + " 5000"));
  EXPECT_EQ(a.Send("linktype " + b.engine()), "OK " + GetParam());

  const std::string ns = std::to_string(n);
  for (const auto& [name, addr] :
       std::vector<std::pair<std::string, uintptr_t>>{{"dst", b_alloc}, {"dstr", b_reg}}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(a.Ok("write src 0 " + b.engine() + " " + std::to_string(addr) + " " + ns));
    EXPECT_EQ(b.Hash(name, 0, n), src_hash);
    ASSERT_TRUE(b.Ok("fillpat " + name + " 100"));
    EXPECT_TRUE(a.Ok("fill in 0"));
    EXPECT_TRUE(a.Ok("read in 0 " + b.engine() + " " + std::to_string(addr) + " " + ns));
    EXPECT_EQ(a.Hash("in", 0, n), b.Hash(name, 0, n));
    EXPECT_NE(a.Hash("in", 0, n), src_hash);
  }
  EXPECT_TRUE(b.Ok("canary dstr"));

  // Links are directional: B has not connected to A.
  uintptr_t a_reg = a.Reg("areg", 4096, "rw");
  ASSERT_NE(a_reg, 0u);
  ASSERT_TRUE(b.Ok("fill dst 1"));
  std::string r = b.Send("write dst 0 " + a.engine() + " " + std::to_string(a_reg) + " 4096");
  EXPECT_EQ(r.rfind("ERR NOT_CONNECTED", 0), 0u) << r;
  // Nor has this process: it cannot drive B's memory without a Connect.
  Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1"));
  Buffer tmp(4096);
  HIXL_EXPECT_CODE(StatusCode::kNotConnected,
                   e.TransferSync(b.engine(), TransferOp::WRITE, {{tmp.addr(), b_alloc, 4096}}));
}

INSTANTIATE_TEST_SUITE_P(Transports, TwoPeersTest, ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);

}  // namespace
