// tests/failure_test.cc — failure handling across processes. The engine in
// this test process is the initiator; hixl_test_peer processes are the
// targets, and they are SIGSTOPped (hung), SIGKILLed (dead) and restarted on
// purpose. Covered: notifications (ordering against the data under load, the
// per-sender queue limit, size limits), a target killed mid-transfer, a hung
// target detected by heartbeats, restarts (generations), the timeout fence
// (no byte of a TIMEOUT request lands afterwards), async deadlines and
// cancellation, AutoConnect, ConnectAsync and the MaxPeers limit.
//
// Transport conformance: tests that make sense on both transports are TEST_P
// over the initiator's LinkType option (hixl_test::AllLinkTypes()); tests
// that need a target that cannot make progress use TCP only (on shm the
// initiator copies by itself, so a stopped target does not stop a transfer).
//
// Timing: every wait is bounded. Detection times are measured and printed
// ("[ measured ]" lines, and RecordProperty), and are only checked against
// generous bounds (kDetectBoundMs), never tight ones.
//
// Cleanup: the fixture's TearDown joins the delayed-SIGCONT threads, sends
// SIGCONT to every peer it stopped, finalizes the engines, then ends the
// peers; buffers used by async requests outlive all of that (KeptBuffer).
#include "failure_common.h"

namespace {

using namespace failure_test;  // NOLINT: the suite's shared fixtures and helpers

TEST(FailureHelpers, ConstHashMatchesFnv1a64) {
  for (size_t len : {0ul, 1ul, 7ul, 8ul, 4099ul, 65536ul}) {
    Buffer b(len, 0xAB);
    EXPECT_EQ(ConstHashHex(0xAB, len), b.HashHex()) << len;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, FailureTest, ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);


// ---------------------------------------------------------------------------
// a. A notification attached to a transfer is queued at the target only after
// all of the transfer's data is in the target's memory: the peer hashes the
// bytes the moment it sees the notification. ~300 concurrent writes of
// varied sizes, to an AllocMem region and to a plain registered one.

class FailureNotifyLoadTest
    : public FailureBase,
      public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {
 protected:
  FailureNotifyLoadTest() { link_ = std::get<0>(GetParam()); }
};

TEST_P(FailureNotifyLoadTest, NotificationNeverOvertakesItsData) {
  const std::string kind = std::get<1>(GetParam());  // "alloc" | "reg"
  constexpr size_t kCount = 300;
  // Varied sizes: every 25th 1 MiB, the others 4 KiB .. 4 KiB + 128 KiB
  // with odd lengths; disjoint offsets in one region (~32 MiB in all).
  const size_t big = 1 * kMiB / kDiv;
  const size_t small_span = 128 * kKiB / kDiv;
  struct Piece {
    size_t off, len;
  };
  std::vector<Piece> plan;
  size_t total = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const uint64_t r = hixl_test::SplitMix64(i + 1000);
    const size_t len = i % 25 == 0 ? big : 4 * kKiB + static_cast<size_t>(r % small_span);
    plan.push_back({total, len});
    total += len + static_cast<size_t>((r >> 40) % 64);  // small gaps too
  }
  const size_t region = (total + 4095) / 4096 * 4096;

  PeerProcess* peer = StartPeer();
  ASSERT_NE(peer, nullptr);
  const uintptr_t remote = kind == "alloc" ? peer->Alloc("R", region) : peer->Reg("R", region);
  ASSERT_NE(remote, 0u);
  HIXL_ASSERT_OK(Init(engine_));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *peer));

  Buffer& src = KeptBuffer(region);
  hixl_test::FillPattern(src.data(), region, 0xA11CE);
  std::vector<TransferArgs> args(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    args[i].user_data = i;
    // (Built with += : GCC 12 warns falsely (-Wrestrict) on "x" + std::string.)
    NotifyDesc d;
    d.name = "n";
    d.name += std::to_string(i);
    d.notify_msg = std::to_string(plan[i].off);
    d.notify_msg += ':';
    d.notify_msg += std::to_string(plan[i].len);
    d.notify_msg += ':';
    d.notify_msg += src.HashHex(plan[i].off, plan[i].len);
    args[i].notify = std::move(d);
  }

  std::vector<TransferReq> reqs(kCount, 0);
  std::vector<std::string> post_errors;
  std::thread poster([&] {
    for (size_t i = 0; i < kCount; ++i) {
      Status s = engine_.TransferAsync(peer->engine(), TransferOp::WRITE,
                                       {{src.addr(plan[i].off), remote + plan[i].off, plan[i].len}},
                                       args[i], reqs[i]);
      if (!s.ok()) post_errors.push_back("req " + std::to_string(i) + ": " + s.ToString());
    }
  });
  const auto t0 = Clock::now();
  const std::string watch = peer->Send("watchnotify R " + std::to_string(kCount) + " 20000", 30000);
  poster.join();
  Measured("watch_" + std::to_string(kCount) + "_notifications_ms", ElapsedMs(t0));
  EXPECT_TRUE(post_errors.empty()) << post_errors.front();
  EXPECT_EQ(watch, "OK " + std::to_string(kCount));

  size_t completed = 0;
  for (size_t i = 0; i < kCount; ++i) {
    if (reqs[i] == 0) continue;
    Status call, reason;
    TransferStatus st = hixl_test::WaitForEnd(engine_, reqs[i], 20000, &call, &reason);
    EXPECT_TRUE(call.ok()) << "req " << i << ": " << call.ToString();
    EXPECT_EQ(st, TransferStatus::COMPLETED)
        << "req " << i << " ended " << Name(st) << ": " << reason.ToString();
    if (st == TransferStatus::COMPLETED) ++completed;
  }
  EXPECT_EQ(completed, kCount);
  // Every notification was taken by watchnotify; none is left or repeated.
  EXPECT_EQ(peer->Send("getnotifies"), "OK 0");
  for (size_t i = 0; i < kCount; i += 37) {
    EXPECT_EQ(peer->Hash("R", plan[i].off, plan[i].len), src.HashHex(plan[i].off, plan[i].len))
        << "piece " << i;
  }
  EXPECT_EQ(peer->Send("canary R"), "OK intact");
}

std::string NotifyLoadName(
    const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& i) {
  return std::get<0>(i.param) + "_" + std::get<1>(i.param);
}
INSTANTIATE_TEST_SUITE_P(Transports, FailureNotifyLoadTest,
                         Combine(ValuesIn(hixl_test::AllLinkTypes()), Values("alloc", "reg")),
                         NotifyLoadName);

// ---------------------------------------------------------------------------
// b. SendNotify: the per-sender queue limit, size limits, unconnected peers,
// and a transfer whose attached notification finds the queue full.

TEST_P(FailureTest, SendNotifyQueueDepthSizesAndFullQueue) {
  PeerProcess* peer = StartPeer({"NotifyQueueDepth=4"});
  ASSERT_NE(peer, nullptr);
  PeerProcess* other = StartPeer();
  ASSERT_NE(other, nullptr);
  const size_t n = 1 * kMiB + 13;
  const uintptr_t remote = peer->Alloc("m", n);
  ASSERT_NE(remote, 0u);
  HIXL_ASSERT_OK(Init(engine_));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *peer));
  const std::string to = peer->engine();
  const std::string me = engine_.LocalEngine();

  // Four fit, the fifth is refused, none is lost; `from` names this engine.
  for (int i = 0; i < 4; ++i) {
    HIXL_EXPECT_OK(engine_.SendNotify(
        to, NotifyDesc{"a" + std::to_string(i), "m" + std::to_string(i), ""}, 5000));
  }
  HIXL_EXPECT_CODE(StatusCode::kResourceExhausted,
                   engine_.SendNotify(to, NotifyDesc{"a4", "m4", ""}, 5000));
  EXPECT_EQ(peer->Send("getnotifies from"),
            "OK 4 a0=m0@" + me + " a1=m1@" + me + " a2=m2@" + me + " a3=m3@" + me);
  // Drained: there is room again.
  HIXL_EXPECT_OK(engine_.SendNotify(to, NotifyDesc{"a5", "m5", ""}, 5000));
  EXPECT_EQ(peer->Send("getnotifies"), "OK 1 a5=m5");
  EXPECT_EQ(peer->Send("getnotifies"), "OK 0");

  // Size limits: 1024 bytes are fine, 1025 are not.
  const std::string name1024(hixl::kMaxNotifyNameLen, 'N');
  const std::string msg1024(hixl::kMaxNotifyMsgLen, 'M');
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                   engine_.SendNotify(to, NotifyDesc{name1024 + "N", "x", ""}, 5000));
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid,
                   engine_.SendNotify(to, NotifyDesc{"x", msg1024 + "M", ""}, 5000));
  HIXL_EXPECT_OK(engine_.SendNotify(to, NotifyDesc{name1024, msg1024, ""}, 5000));
  EXPECT_EQ(peer->Send("getnotifies"), "OK 1 " + name1024 + "=" + msg1024);

  // A live peer this engine never connected to.
  HIXL_EXPECT_CODE(StatusCode::kNotConnected,
                   engine_.SendNotify(other->engine(), NotifyDesc{"u", "v", ""}, 2000));
  EXPECT_EQ(other->Send("getnotifies"), "OK 0");

  // A transfer reports COMPLETED only once the target has queued its
  // notification: it is there right after TransferSync returns.
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 501);
  TransferArgs args;
  args.notify = NotifyDesc{"t1", "done1", ""};
  HIXL_EXPECT_OK(
      engine_.TransferSync(to, TransferOp::WRITE, {{src.addr(), remote, n}}, args, 10000));
  EXPECT_EQ(peer->Send("getnotifies"), "OK 1 t1=done1");
  EXPECT_EQ(peer->Hash("m", 0, n), src.HashHex());

  // Queue full: the transfer's data is written, its notification refused,
  // the request ends FAILED with RESOURCE_EXHAUSTED. The queue is per
  // sender: another engine can still notify.
  for (int i = 0; i < 4; ++i) {
    HIXL_EXPECT_OK(engine_.SendNotify(
        to, NotifyDesc{"b" + std::to_string(i), "q" + std::to_string(i), ""}, 5000));
  }
  ASSERT_TRUE(other->Ok("connect " + to + " 5000"));
  EXPECT_EQ(other->Send("sendnotify " + to + " o1 p1 5000"), "OK");
  Buffer& src2 = KeptBuffer(n);
  hixl_test::FillPattern(src2.data(), n, 502);
  TransferArgs args2;
  args2.notify = NotifyDesc{"t2", "done2", ""};
  TransferReq req = 0;
  HIXL_ASSERT_OK(
      engine_.TransferAsync(to, TransferOp::WRITE, {{src2.addr(), remote, n}}, args2, req));
  Status call, reason;
  TransferStatus st = hixl_test::WaitForEnd(engine_, req, 10000, &call, &reason);
  ASSERT_TRUE(call.ok()) << call.ToString();
  EXPECT_EQ(st, TransferStatus::FAILED) << Name(st) << " " << reason.ToString();
  EXPECT_EQ(reason.code(), StatusCode::kResourceExhausted) << reason.ToString();
  EXPECT_EQ(peer->Hash("m", 0, n), src2.HashHex()) << "the data must be written anyway";
  EXPECT_EQ(peer->Send("getnotifies from"), "OK 5 b0=q0@" + me + " b1=q1@" + me + " b2=q2@" + me +
                                                " b3=q3@" + me + " o1=p1@" + other->engine());
  // And after draining, an attached notification works again.
  args.notify = NotifyDesc{"t3", "done3", ""};
  HIXL_EXPECT_OK(
      engine_.TransferSync(to, TransferOp::WRITE, {{src.addr(), remote, n}}, args, 10000));
  EXPECT_EQ(peer->Send("getnotifies"), "OK 1 t3=done3");
}

// The peer's writenotify and sendnotify commands, the other way round:
// notifications arrive at this engine (GetNotifies), carrying the sender.
TEST_P(FailureTest, NotificationsArriveHereFromAPeer) {
  if (const std::string why = hixl_test::SkipUcxTargetHere(link_); !why.empty()) GTEST_SKIP() << why;
  PeerProcess* peer = StartPeer({"LinkType=" + link_});
  ASSERT_NE(peer, nullptr);
  const size_t n = 256 * kKiB + 5;
  ASSERT_NE(peer->Reg("b", n), 0u);
  ASSERT_TRUE(peer->Ok("fillpat b 77"));
  HIXL_ASSERT_OK(Init(engine_));
  void* mine = nullptr;
  HIXL_ASSERT_OK(engine_.AllocMem(n, hixl::MemType::MEM_HOST, &mine));
  ASSERT_TRUE(peer->Ok("connect " + engine_.LocalEngine() + " 5000"));
  EXPECT_EQ(peer->Send("linktype " + engine_.LocalEngine()),
            std::string("OK ") + hixl::LinkTypeName(hixl_test::LinkTypeOf(link_)));
  EXPECT_EQ(peer->Send("sendnotify " + engine_.LocalEngine() + " hello world 5000"), "OK");
  EXPECT_EQ(peer->Send("writenotify b 0 " + engine_.LocalEngine() + " " +
                       std::to_string(reinterpret_cast<uintptr_t>(mine)) + " " + std::to_string(n) +
                       " wn data 10000"),
            "OK");
  // writenotify returned: the notification is queued here already.
  std::vector<NotifyDesc> got;
  HIXL_ASSERT_OK(engine_.GetNotifies(got));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].name, "hello");
  EXPECT_EQ(got[0].notify_msg, "world");
  EXPECT_EQ(got[0].from, peer->engine());
  EXPECT_EQ(got[1].name, "wn");
  EXPECT_EQ(got[1].notify_msg, "data");
  EXPECT_EQ(got[1].from, peer->engine());
  EXPECT_EQ(hixl_test::HashHex(hixl_test::Fnv1a64(mine, n)), peer->Hash("b", 0, n));
  got.clear();
  HIXL_EXPECT_OK(engine_.GetNotifies(got));
  EXPECT_TRUE(got.empty());
}

// ---------------------------------------------------------------------------
// c. The target is SIGKILLed while a large write to it is under way. The
// request ends within the detection bound; another peer is unaffected.

TEST_P(FailureTest, TargetKilledMidTransferEndsTheRequest) {
  PeerProcess* other = StartPeer();
  ASSERT_NE(other, nullptr);
  const size_t on = 1 * kMiB + 3;
  const uintptr_t oremote = other->Alloc("m", on);
  ASSERT_NE(oremote, 0u);
  PeerProcess* victim = StartPeer();
  ASSERT_NE(victim, nullptr);
  // shm: a plain registered region, so the initiator copies into the
  // target process (CMA) and the copy depends on it being alive.
  const size_t n = (tcp() ? 256 : 512) * kMiB / kDiv;
  const uintptr_t remote = victim->Reg("R", n);
  ASSERT_NE(remote, 0u);
  HIXL_ASSERT_OK(Init(engine_, kFastHeartbeats));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *other));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *victim));
  Buffer& src = KeptBuffer(n, 0x5C);
  const std::string vengine = victim->engine();

  // tcp: stopped first, so the transfer is certainly unfinished at the kill.
  if (tcp()) {
    ASSERT_NO_FATAL_FAILURE(Stop(*victim));
  }
  TransferReq req = 0;
  HIXL_ASSERT_OK(engine_.TransferAsync(vengine, TransferOp::WRITE, {{src.addr(), remote, n}},
                                       TransferArgs{}, req));
  SleepMs(tcp() ? 50 : 5);
  const auto t0 = Clock::now();
  victim->Kill();
  Status call, reason;
  const TransferStatus st = hixl_test::WaitForEnd(engine_, req, 4 * kDetectBoundMs, &call, &reason);
  const long ms = ElapsedMs(t0);
  Measured("kill_to_end_ms", ms);
  ASSERT_TRUE(call.ok()) << call.ToString();
  std::cout << "request ended " << Name(st) << " (" << reason.ToString() << ")" << std::endl;
  if (tcp()) {
    EXPECT_EQ(st, TransferStatus::FAILED) << Name(st) << " " << reason.ToString();
  } else {
    EXPECT_TRUE(st == TransferStatus::FAILED || st == TransferStatus::COMPLETED)
        << Name(st) << " " << reason.ToString();
  }
  EXPECT_LE(ms, kDetectBoundMs) << "the request did not end within the detection bound";

  // The dead peer's link is dropped (within the detection bound).
  const auto t1 = Clock::now();
  const Status lt = WaitLinkLost(engine_, vengine, kDetectBoundMs);
  Measured("kill_to_not_connected_ms", ElapsedMs(t0));
  EXPECT_EQ(lt.code(), StatusCode::kNotConnected)
      << "GetLinkType of the killed peer -> " << lt.ToString() << " after " << ElapsedMs(t1)
      << " ms more";
  Buffer small(4096, 1);
  HIXL_EXPECT_CODE(
      StatusCode::kNotConnected,
      engine_.TransferSync(vengine, TransferOp::WRITE, {{small.addr(), remote, 4096}}, 2000));

  // The other peer is unaffected.
  Buffer osrc(on);
  hixl_test::FillPattern(osrc.data(), on, 31);
  HIXL_EXPECT_OK(Write(engine_, *other, osrc.addr(), oremote, on, 10000));
  EXPECT_EQ(other->Hash("m", 0, on), osrc.HashHex());
  Buffer odst(on);
  HIXL_EXPECT_OK(Read(engine_, *other, odst.addr(), oremote, on, 10000));
  EXPECT_EQ(odst.HashHex(), osrc.HashHex());
  EXPECT_NO_FATAL_FAILURE(ExpectLinkType(engine_, other->engine()));
}

// The detection tests give only the initiator short heartbeats; the peers
// keep the default (1000 ms). A healthy idle peer must not be declared dead
// because its engine was configured differently.
TEST_P(FailureTest, HealthyIdlePeerWithDefaultHeartbeatsStaysConnected) {
  PeerProcess* peer = StartPeer();
  ASSERT_NE(peer, nullptr);
  const size_t n = 64 * kKiB;
  const uintptr_t remote = peer->Alloc("m", n);
  ASSERT_NE(remote, 0u);
  HIXL_ASSERT_OK(Init(engine_, kFastHeartbeats));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *peer));
  SleepMs(2500);  // > 2 default heartbeat intervals of the peer
  EXPECT_EQ(GetCs(engine_, peer->engine()), ConnectStatus::CONNECTED)
      << "a healthy peer was declared dead";
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 3);
  Status s = Write(engine_, *peer, src.addr(), remote, n, 10000);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (s.ok()) {
    EXPECT_EQ(peer->Hash("m", 0, n), src.HashHex());
  }
}

// ---------------------------------------------------------------------------
// d. A hung target (SIGSTOP) is declared dead by heartbeats: a long transfer
// to it fails within the bound, and once the target resumes no byte of the
// abandoned transfer lands in its memory. tcp only: on shm the initiator
// copies by itself, a stopped target does not hold a transfer up.

TEST_F(TcpFailureTest, HungTargetIsDeclaredDeadAndNothingLandsAfterwards) {
  PeerProcess* peer = StartPeer();
  ASSERT_NE(peer, nullptr);
  const size_t n = 64 * kMiB / kDiv;
  const uintptr_t remote = peer->Reg("R", n);
  ASSERT_NE(remote, 0u);
  ASSERT_TRUE(peer->Ok("fill R 0x11"));
  HIXL_ASSERT_OK(Init(engine_, kFastHeartbeats));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *peer));
  Buffer& src = KeptBuffer(n);
  hixl_test::FillPattern(src.data(), n, 64);
  // While it runs, the peer is not declared dead (else the failure below
  // would prove nothing about detecting a hung one).
  SleepMs(1000);
  ASSERT_EQ(GetCs(engine_, peer->engine()), ConnectStatus::CONNECTED)
      << "the peer was declared dead while it was running";

  ASSERT_NO_FATAL_FAILURE(Stop(*peer));
  const auto t0 = Clock::now();
  Status s = Write(engine_, *peer, src.addr(), remote, n, 30000);
  const long ms = ElapsedMs(t0);
  Measured("hung_peer_write_failed_ms", ms);
  std::cout << "TransferSync to the hung peer -> " << s.ToString() << std::endl;
  EXPECT_TRUE(s.code() == StatusCode::kFailed || s.code() == StatusCode::kNotConnected)
      << s.ToString();
  EXPECT_LE(ms, kDetectBoundMs) << "a hung peer must be declared dead within the bound";
  {
    const Status lt = WaitLinkLost(engine_, peer->engine(), kDetectBoundMs);
    EXPECT_EQ(lt.code(), StatusCode::kNotConnected) << lt.ToString();
  }

  Cont(*peer);
  SleepMs(500);
  EXPECT_EQ(peer->Hash("R", 0, n), ConstHashHex(0x11, n))
      << "bytes of the abandoned transfer landed after the target resumed";
  EXPECT_EQ(peer->Send("canary R"), "OK intact");
  SleepMs(300);
  EXPECT_EQ(peer->Hash("R", 0, n), ConstHashHex(0x11, n));

  // The peer lives on: connecting again works.
  HIXL_EXPECT_OK(engine_.Connect(peer->engine(), kConnectMs));
  Buffer small(64 * kKiB);
  hixl_test::FillPattern(small.data(), small.size(), 65);
  HIXL_EXPECT_OK(Write(engine_, *peer, small.addr(), remote, small.size(), 10000));
  EXPECT_EQ(peer->Hash("R", 0, small.size()), small.HashHex());
}

// ---------------------------------------------------------------------------
// e. A restarted peer (same address) is a new incarnation: new generation,
// transfers naming the old generation are refused and touch nothing.

TEST_P(FailureTest, RestartedPeerHasANewGenerationAndOldOnesAreRefused) {
  const int port = hixl_test::UnusedTcpPort();
  ASSERT_GT(port, 0);
  const std::string listen = "127.0.0.1:" + std::to_string(port);
  PeerProcess* a = StartPeer({}, listen);
  ASSERT_NE(a, nullptr);
  const std::string addr = a->engine();
  EXPECT_EQ(addr, listen);
  const size_t n = 1 * kMiB + 7;
  const uintptr_t ra = a->Reg("m", n);
  ASSERT_NE(ra, 0u);
  HIXL_ASSERT_OK(Init(engine_, kFastHeartbeats));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *a));

  EXPECT_NE(engine_.Generation(), 0u);
  uint64_t g1 = 0;
  HIXL_ASSERT_OK(engine_.GetPeerGeneration(addr, g1));
  EXPECT_NE(g1, 0u);
  EXPECT_EQ(a->Send("gen"), "OK " + std::to_string(g1));
  // And the other way round.
  ASSERT_TRUE(a->Ok("connect " + engine_.LocalEngine() + " 5000"));
  EXPECT_EQ(a->Send("peergen " + engine_.LocalEngine()),
            "OK " + std::to_string(engine_.Generation()));
  uint64_t none = 0;
  HIXL_EXPECT_CODE(StatusCode::kNotConnected,
                   engine_.GetPeerGeneration("127.0.0.1:" + std::to_string(port + 1), none));

  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 1);
  TransferArgs with_g1;
  with_g1.remote_generation = g1;
  HIXL_EXPECT_OK(
      engine_.TransferSync(addr, TransferOp::WRITE, {{src.addr(), ra, n}}, with_g1, 10000));
  EXPECT_EQ(a->Hash("m", 0, n), src.HashHex());

  a->Kill();
  const auto t0 = Clock::now();
  Status last;
  Buffer small(4096, 2);
  PollUntil(
      [&] {
        last = engine_.TransferSync(addr, TransferOp::WRITE, {{small.addr(), ra, 4096}}, 1000);
        // The data lanes may report the loss a moment before the control
        // link does (which drops the peer's metadata): wait for both.
        uint64_t g = 0;
        return last.code() == StatusCode::kNotConnected &&
               engine_.GetPeerGeneration(addr, g).code() == StatusCode::kNotConnected;
      },
      kDetectBoundMs, 20);
  Measured("kill_to_not_connected_ms", ElapsedMs(t0));
  ASSERT_EQ(last.code(), StatusCode::kNotConnected) << last.ToString();
  HIXL_EXPECT_CODE(StatusCode::kNotConnected, engine_.GetPeerGeneration(addr, none));

  PeerProcess* a2 = StartPeer({}, listen);
  ASSERT_NE(a2, nullptr) << "a restarted peer could not listen on " << listen;
  EXPECT_EQ(a2->engine(), addr);
  const uintptr_t ra2 = a2->Reg("m", n);
  ASSERT_NE(ra2, 0u);
  ASSERT_TRUE(a2->Ok("fill m 0x5A"));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *a2));
  uint64_t g2 = 0;
  HIXL_ASSERT_OK(engine_.GetPeerGeneration(addr, g2));
  EXPECT_NE(g2, 0u);
  EXPECT_NE(g2, g1) << "a restarted peer must have a new generation";
  EXPECT_EQ(a2->Send("gen"), "OK " + std::to_string(g2));

  // The old generation is refused, both ways, and nothing moves.
  HIXL_EXPECT_CODE(
      StatusCode::kParamInvalid,
      engine_.TransferSync(addr, TransferOp::WRITE, {{src.addr(), ra2, n}}, with_g1, 10000));
  EXPECT_EQ(a2->Hash("m", 0, n), ConstHashHex(0x5A, n));
  Buffer dst(n, 0x77);
  HIXL_EXPECT_CODE(
      StatusCode::kParamInvalid,
      engine_.TransferSync(addr, TransferOp::READ, {{dst.addr(), ra2, n}}, with_g1, 10000));
  EXPECT_EQ(dst.HashHex(), ConstHashHex(0x77, n));
  EXPECT_EQ(a2->Send("canary m"), "OK intact");

  // The new generation, and 0 (no check), work.
  TransferArgs with_g2;
  with_g2.remote_generation = g2;
  HIXL_EXPECT_OK(
      engine_.TransferSync(addr, TransferOp::WRITE, {{src.addr(), ra2, n}}, with_g2, 10000));
  EXPECT_EQ(a2->Hash("m", 0, n), src.HashHex());
  Buffer src2(n);
  hixl_test::FillPattern(src2.data(), n, 2);
  HIXL_EXPECT_OK(engine_.TransferSync(addr, TransferOp::WRITE, {{src2.addr(), ra2, n}},
                                      TransferArgs{}, 10000));
  EXPECT_EQ(a2->Hash("m", 0, n), src2.HashHex());
  HIXL_EXPECT_OK(
      engine_.TransferSync(addr, TransferOp::READ, {{dst.addr(), ra2, n}}, with_g2, 10000));
  EXPECT_EQ(dst.HashHex(), src2.HashHex());
}

// ---------------------------------------------------------------------------
// h. AutoConnect.

TEST_P(FailureTest, AutoConnectConnectsOnDemand) {
  PeerProcess* peer = StartPeer();
  ASSERT_NE(peer, nullptr);
  PeerProcess* peer2 = StartPeer();
  ASSERT_NE(peer2, nullptr);
  const size_t n = 1 * kMiB + 9;
  const uintptr_t remote = peer->Alloc("m", n);
  ASSERT_NE(remote, 0u);
  HIXL_ASSERT_OK(Init(engine_, {{opt::kAutoConnect, "1"}}));
  EXPECT_EQ(GetCs(engine_, peer->engine()), ConnectStatus::NOT_CONNECTED);

  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 808);
  HIXL_EXPECT_OK(Write(engine_, *peer, src.addr(), remote, n, 10000));
  EXPECT_EQ(peer->Hash("m", 0, n), src.HashHex());
  EXPECT_EQ(GetCs(engine_, peer->engine()), ConnectStatus::CONNECTED);
  EXPECT_NO_FATAL_FAILURE(ExpectLinkType(engine_, peer->engine()));
  Buffer dst(n);
  HIXL_EXPECT_OK(Read(engine_, *peer, dst.addr(), remote, n, 10000));
  EXPECT_EQ(dst.HashHex(), src.HashHex());

  // A notification to another never-connected peer.
  HIXL_EXPECT_OK(engine_.SendNotify(peer2->engine(), NotifyDesc{"hi", "there", ""}, 5000));
  EXPECT_EQ(peer2->Send("getnotifies"), "OK 1 hi=there");
  EXPECT_EQ(GetCs(engine_, peer2->engine()), ConnectStatus::CONNECTED);

  // Nothing listens there: the on-demand connect fails, boundedly.
  const std::string nobody = "127.0.0.1:" + std::to_string(hixl_test::UnusedTcpPort());
  const auto t0 = Clock::now();
  Status s = engine_.TransferSync(nobody, TransferOp::WRITE, {{src.addr(), remote, 4096}}, 10000);
  Measured("autoconnect_to_nobody_ms", ElapsedMs(t0));
  EXPECT_FALSE(s.ok());
  EXPECT_LE(ElapsedMs(t0), 5000 * kSlow) << s.ToString();

  // Without the option: NOT_CONNECTED, and nothing is sent.
  HIXL_ASSERT_OK(Init(engine2_));
  HIXL_EXPECT_CODE(
      StatusCode::kNotConnected,
      engine2_.TransferSync(peer->engine(), TransferOp::WRITE, {{dst.addr(), remote, n}}, 5000));
  HIXL_EXPECT_CODE(StatusCode::kNotConnected,
                   engine2_.SendNotify(peer2->engine(), NotifyDesc{"no", "way", ""}, 2000));
  EXPECT_EQ(GetCs(engine2_, peer->engine()), ConnectStatus::NOT_CONNECTED);
  EXPECT_EQ(peer2->Send("getnotifies"), "OK 0");
  EXPECT_EQ(peer->Hash("m", 0, n), src.HashHex());
}

// ---------------------------------------------------------------------------
// i. ConnectAsync and GetConnectStatus.

TEST_P(FailureTest, ConnectAsyncReportsProgressAndFailure) {
  PeerProcess* peer = StartPeer();
  ASSERT_NE(peer, nullptr);
  PeerProcess* hung = StartPeer();
  ASSERT_NE(hung, nullptr);
  const size_t n = 256 * kKiB;
  const uintptr_t remote = peer->Alloc("m", n);
  ASSERT_NE(remote, 0u);
  HIXL_ASSERT_OK(Init(engine_));
  EXPECT_EQ(GetCs(engine_, peer->engine()), ConnectStatus::NOT_CONNECTED);

  // A live peer: CONNECTING (maybe too short to see), then CONNECTED.
  HIXL_ASSERT_OK(engine_.ConnectAsync(peer->engine(), 5000));
  std::vector<ConnectStatus> seen;
  const auto t0 = Clock::now();
  PollUntil(
      [&] {
        ConnectStatus cs = GetCs(engine_, peer->engine());
        if (seen.empty() || seen.back() != cs) seen.push_back(cs);
        return cs != ConnectStatus::CONNECTING;
      },
      10000 * kSlow, 1);
  Measured("connect_async_ms", ElapsedMs(t0));
  std::string trace;
  for (ConnectStatus cs : seen) trace += std::string(Name(cs)) + " ";
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), ConnectStatus::CONNECTED) << trace;
  for (size_t i = 0; i + 1 < seen.size(); ++i) {
    EXPECT_EQ(seen[i], ConnectStatus::CONNECTING) << trace;
  }
  std::cout << "observed: " << trace << std::endl;
  ASSERT_NO_FATAL_FAILURE(ExpectLinkType(engine_, peer->engine()));
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 9);
  HIXL_EXPECT_OK(Write(engine_, *peer, src.addr(), remote, n, 10000));
  EXPECT_EQ(peer->Hash("m", 0, n), src.HashHex());
  HIXL_EXPECT_CODE(StatusCode::kAlreadyConnected, engine_.ConnectAsync(peer->engine(), 1000));
  EXPECT_EQ(GetCs(engine_, peer->engine()), ConnectStatus::CONNECTED);

  // Nothing listens there: FAILED, with the reason.
  const std::string nobody = "127.0.0.1:" + std::to_string(hixl_test::UnusedTcpPort());
  HIXL_ASSERT_OK(engine_.ConnectAsync(nobody, 300));
  Status reason;
  ConnectStatus cs = ConnectStatus::CONNECTING;
  PollUntil(
      [&] {
        cs = GetCs(engine_, nobody, &reason);
        return cs != ConnectStatus::CONNECTING;
      },
      5000 * kSlow, 2);
  EXPECT_EQ(cs, ConnectStatus::FAILED) << Name(cs);
  EXPECT_FALSE(reason.ok()) << "a FAILED connect must say why";
  std::cout << "connect to nobody: " << Name(cs) << " (" << reason.ToString() << ")" << std::endl;

  // An attempt under way (the target is stopped, it cannot answer): a second
  // ConnectAsync is ALREADY_CONNECTED; the attempt times out FAILED; once
  // the target runs again a new attempt succeeds.
  ASSERT_NO_FATAL_FAILURE(Stop(*hung));
  HIXL_ASSERT_OK(engine_.ConnectAsync(hung->engine(), 1000));
  EXPECT_EQ(GetCs(engine_, hung->engine()), ConnectStatus::CONNECTING);
  HIXL_EXPECT_CODE(StatusCode::kAlreadyConnected, engine_.ConnectAsync(hung->engine(), 1000));
  const auto t1 = Clock::now();
  PollUntil(
      [&] {
        cs = GetCs(engine_, hung->engine(), &reason);
        return cs != ConnectStatus::CONNECTING;
      },
      10000 * kSlow, 5);
  Measured("connect_async_to_stopped_peer_failed_ms", ElapsedMs(t1));
  EXPECT_EQ(cs, ConnectStatus::FAILED) << Name(cs);
  EXPECT_FALSE(reason.ok());
  std::cout << "connect to a stopped peer: " << Name(cs) << " (" << reason.ToString() << ")"
            << std::endl;
  Cont(*hung);
  // The resumed target still holds the abandoned attempt's connection and
  // handles it now; under UCX (seen once under TSan) that can take down a
  // link made at the same moment (CONNECTED, then NOT_CONNECTED). What is
  // promised is that a new attempt succeeds once the target runs: a few
  // attempts, each bounded, and the link must then stay up.
  for (int attempt = 0; attempt < 3; ++attempt) {
    Status st = engine_.ConnectAsync(hung->engine(), 5000);
    if (st.code() != StatusCode::kAlreadyConnected) HIXL_ASSERT_OK(st);
    PollUntil(
        [&] {
          cs = GetCs(engine_, hung->engine(), &reason);
          return cs != ConnectStatus::CONNECTING;
        },
        10000 * kSlow, 2);
    if (cs == ConnectStatus::CONNECTED) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      cs = GetCs(engine_, hung->engine(), &reason);
      if (cs == ConnectStatus::CONNECTED) break;
    }
    std::cout << "reconnect attempt " << attempt << " after the resume: " << Name(cs) << " ("
              << reason.ToString() << ")" << std::endl;
  }
  EXPECT_EQ(cs, ConnectStatus::CONNECTED) << Name(cs) << " " << reason.ToString();
  EXPECT_NO_FATAL_FAILURE(ExpectLinkType(engine_, hung->engine()));
}

// ---------------------------------------------------------------------------
// j. MaxPeers: connecting beyond the limit evicts idle links, least recently
// used first, down to PeersLowWater; busy links are never evicted.

TEST_P(FailureTest, MaxPeersEvictsTheLeastRecentlyUsedIdleLink) {
  PeerProcess* p[3];
  uintptr_t r[3];
  const size_t n = 64 * kKiB;
  for (int i = 0; i < 3; ++i) {
    p[i] = StartPeer();
    ASSERT_NE(p[i], nullptr);
    r[i] = p[i]->Alloc("m", n);
    ASSERT_NE(r[i], 0u);
  }
  HIXL_ASSERT_OK(Init(engine_, {{opt::kMaxPeers, "2"}, {opt::kPeersLowWater, "1"}}));
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 5);
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *p[0]));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *p[1]));
  // Use p1, then p0: p1 is the least recently used.
  HIXL_EXPECT_OK(Write(engine_, *p[1], src.addr(), r[1], n, 10000));
  HIXL_EXPECT_OK(Write(engine_, *p[0], src.addr(), r[0], n, 10000));

  HIXL_EXPECT_OK(engine_.Connect(p[2]->engine(), kConnectMs));
  EXPECT_EQ(GetCs(engine_, p[1]->engine()), ConnectStatus::NOT_CONNECTED) << "LRU p1 evicted";
  EXPECT_EQ(GetCs(engine_, p[0]->engine()), ConnectStatus::CONNECTED)
      << "one link (PeersLowWater=1) is kept";
  EXPECT_EQ(GetCs(engine_, p[2]->engine()), ConnectStatus::CONNECTED);
  HIXL_EXPECT_CODE(StatusCode::kNotConnected, Write(engine_, *p[1], src.addr(), r[1], n, 5000));
  HIXL_EXPECT_OK(Write(engine_, *p[0], src.addr(), r[0], n, 10000));
  HIXL_EXPECT_OK(Write(engine_, *p[2], src.addr(), r[2], n, 10000));
  EXPECT_EQ(p[2]->Hash("m", 0, n), src.HashHex());

  // Now p0 (used before p2) is the least recently used.
  HIXL_EXPECT_OK(engine_.Connect(p[1]->engine(), kConnectMs));
  EXPECT_EQ(GetCs(engine_, p[0]->engine()), ConnectStatus::NOT_CONNECTED) << "LRU p0 evicted";
  EXPECT_EQ(GetCs(engine_, p[2]->engine()), ConnectStatus::CONNECTED);
  EXPECT_EQ(GetCs(engine_, p[1]->engine()), ConnectStatus::CONNECTED);
  HIXL_EXPECT_OK(Write(engine_, *p[1], src.addr(), r[1], n, 10000));
  EXPECT_EQ(p[1]->Hash("m", 0, n), src.HashHex());
}

// Transfers find their peer in the calling thread's peer cache, without
// the peer table's lock; eviction must still see each of them (a peer with a
// transfer running is never evicted) or be seen by it (a transfer that
// starts on an evicted peer backs off and reports NOT_CONNECTED). One thread
// streams small writes to p0 while the main thread connects to other peers
// with MaxPeers=1: each Connect evicts p0 if it is idle at that instant and
// is refused (RESOURCE_EXHAUSTED) if a write is running. Every write ends OK
// or NOT_CONNECTED, and once NOT_CONNECTED (no AutoConnect) stays so;
// whatever ended OK landed.
TEST_P(FailureTest, MaxPeersEvictionRacesCachedTransfers) {
  PeerProcess* p[3];
  uintptr_t r[3];
  const size_t n = 4 * kKiB;
  for (int i = 0; i < 3; ++i) {
    p[i] = StartPeer();
    ASSERT_NE(p[i], nullptr);
    r[i] = p[i]->Alloc("m", n);
    ASSERT_NE(r[i], 0u);
  }
  HIXL_ASSERT_OK(Init(engine_, {{opt::kMaxPeers, "1"}, {opt::kPeersLowWater, "0"}}));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *p[0]));
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 9);
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, gone{0}, other{0}, back{0};
  std::string first_other;
  std::thread writer([&] {
    bool lost = false;
    const auto until = Clock::now() + std::chrono::seconds(20);
    while (!stop.load() && Clock::now() < until) {
      Status s = Write(engine_, *p[0], src.addr(), r[0], n, 5000);
      if (s.ok()) {
        ++ok;
        if (lost) ++back;  // a NOT_CONNECTED peer came back by itself
      } else if (s.code() == StatusCode::kNotConnected) {
        ++gone;
        lost = true;
      } else if (other++ == 0) {
        first_other = s.ToString();
      }
    }
  });
  ASSERT_TRUE(PollUntil([&] { return ok.load() > 0 || other.load() > 0; }, 10000));
  // Links to p1 and p2 in turn until p0 is gone (or 200 tries).
  int refused = 0, made = 0;
  for (int round = 0; round < 200 && gone.load() == 0; ++round) {
    PeerProcess& q = *p[1 + round % 2];
    Status s = engine_.Connect(q.engine(), kConnectMs);
    if (s.ok()) {
      ++made;
    } else if (s.code() == StatusCode::kResourceExhausted) {
      ++refused;
    } else {
      EXPECT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop = true;
  writer.join();
  EXPECT_EQ(other.load(), 0) << first_other;
  EXPECT_EQ(back.load(), 0) << "an evicted peer served a transfer again without a Connect";
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(p[0]->Hash("m", 0, n), src.HashHex());
  RecordProperty("connects_made", made);
  RecordProperty("connects_refused", refused);
  if (made > 0) {
    EXPECT_GT(gone.load(), 0) << "a Connect evicted p0 but its writes went on";
  }
  if (gone.load() == 0) {
    EXPECT_EQ(GetCs(engine_, p[0]->engine()), ConnectStatus::CONNECTED);
  } else {
    EXPECT_EQ(GetCs(engine_, p[0]->engine()), ConnectStatus::NOT_CONNECTED);
  }
}

TEST_F(TcpFailureTest, MaxPeersNeverEvictsBusyLinks) {
  PeerProcess* p[3];
  uintptr_t r[3];
  const size_t n = 32 * kMiB / kDiv;
  for (int i = 0; i < 3; ++i) {
    p[i] = StartPeer();
    ASSERT_NE(p[i], nullptr);
    r[i] = p[i]->Reg("R", n);
    ASSERT_NE(r[i], 0u);
  }
  HIXL_ASSERT_OK(Init(engine_, {{opt::kMaxPeers, "2"}, {opt::kPeersLowWater, "1"}}));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *p[0]));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *p[1]));
  Buffer& src = KeptBuffer(n);
  hixl_test::FillPattern(src.data(), n, 6);

  // Both links busy: a transfer in flight on each (their targets stopped).
  ASSERT_NO_FATAL_FAILURE(Stop(*p[0]));
  ASSERT_NO_FATAL_FAILURE(Stop(*p[1]));
  TransferReq req[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    HIXL_ASSERT_OK(engine_.TransferAsync(p[i]->engine(), TransferOp::WRITE, {{src.addr(), r[i], n}},
                                         TransferArgs{}, req[i]));
  }
  HIXL_EXPECT_CODE(StatusCode::kResourceExhausted, engine_.Connect(p[2]->engine(), kConnectMs));
  EXPECT_EQ(GetCs(engine_, p[0]->engine()), ConnectStatus::CONNECTED);
  EXPECT_EQ(GetCs(engine_, p[1]->engine()), ConnectStatus::CONNECTED);
  EXPECT_NE(GetCs(engine_, p[2]->engine()), ConnectStatus::CONNECTED);
  Cont(*p[0]);
  Cont(*p[1]);
  for (int i = 0; i < 2; ++i) {
    Status call, reason;
    TransferStatus st = hixl_test::WaitForEnd(engine_, req[i], 20000 * kSlow, &call, &reason);
    EXPECT_TRUE(call.ok()) << call.ToString();
    EXPECT_EQ(st, TransferStatus::COMPLETED) << i << ": " << Name(st) << " " << reason.ToString();
    EXPECT_EQ(p[i]->Hash("R", 0, n), src.HashHex());
  }

  // Idle again: the third connect evicts one of them.
  HIXL_EXPECT_OK(engine_.Connect(p[2]->engine(), kConnectMs));
  const int connected = (GetCs(engine_, p[0]->engine()) == ConnectStatus::CONNECTED) +
                        (GetCs(engine_, p[1]->engine()) == ConnectStatus::CONNECTED);
  EXPECT_EQ(connected, 1);
  EXPECT_EQ(GetCs(engine_, p[2]->engine()), ConnectStatus::CONNECTED);
}

}  // namespace
