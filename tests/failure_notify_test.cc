// tests/failure_notify_test.cc — the two paths a notification takes: the
// link's control connection (every transport) and, between engines on one
// host over shm, a ring in memory both processes map (transport/
// notify_ring.h). Covered, across processes:
// - per-link order holds when the ring overflows and notifications fall back
//   to the control link and back again (every transport: on tcp/ucx all of
//   them take the control link);
// - shm: a ring notification is in the target's memory when SendNotify
//   returns, so it succeeds while the target is SIGSTOPped, and the target's
//   NotifyQueueDepth still bounds what waits (the ring's credit; the next
//   one falls back to the control link, which a stopped target cannot answer);
// - ShmNotifyRing=0 sends them over the control link;
// - what a ring holds when its link closes is delivered;
// - notifications from a peer reach this engine's callback in order, after
//   their data.
#include "failure_common.h"

namespace {

using namespace failure_test;  // NOLINT: the suite's shared fixtures and helpers

std::string Names(const std::string& prefix, int from, int to) {
  std::string out;
  for (int i = from; i < to; ++i) out += " " + prefix + std::to_string(i);
  return out;
}

// 1 KiB messages: the shm ring (256 KiB) holds about 250, so 400 overflow it.
TEST_P(FailureTest, NotificationOrderHoldsWhenTheRingOverflows) {
  PeerProcess* peer = StartPeer({"NotifyQueueDepth=100000"});
  ASSERT_NE(peer, nullptr);
  const size_t n = 64 * kKiB + 7;
  const uintptr_t remote = peer->Alloc("m", n);
  ASSERT_NE(remote, 0u);
  HIXL_ASSERT_OK(Init(engine_));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *peer));
  const std::string to = peer->engine();
  const std::string msg(hixl::kMaxNotifyMsgLen, 'x');
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 77);

  // Every 16th rides on a transfer; the target reads nothing meanwhile.
  auto send = [&](int i) {
    NotifyDesc d{"n" + std::to_string(i), msg, ""};
    if (i % 16 != 0) return engine_.SendNotify(to, d, 5000);
    TransferArgs args;
    args.notify = d;
    return engine_.TransferSync(to, TransferOp::WRITE, {{src.addr(), remote, n}}, args, 10000);
  };
  for (int i = 0; i < 400; ++i) {
    const Status s = send(i);
    ASSERT_TRUE(s.ok()) << "notification " << i << ": " << s.ToString();
  }
  EXPECT_EQ(peer->Send("getnotifies names"), "OK 400" + Names("n", 0, 400));
  // Drained: the ring has room again; order still holds.
  for (int i = 400; i < 460; ++i) {
    const Status s = send(i);
    ASSERT_TRUE(s.ok()) << "notification " << i << ": " << s.ToString();
  }
  EXPECT_EQ(peer->Send("getnotifies names"), "OK 60" + Names("n", 400, 460));
  EXPECT_EQ(peer->Hash("m", 0, n), src.HashHex());
}

// Notifications from the peer (its engine initiates) reach this engine's
// callback one at a time, in order, each after its data (every write goes to
// its own slice of this engine's buffer; the callback hashes that slice).
TEST_P(FailureTest, CallbackGetsAPeersNotificationsInOrderAfterTheirData) {
  if (const std::string why = hixl_test::SkipUcxTargetHere(link_); !why.empty())
    GTEST_SKIP() << why;
  PeerProcess* peer = StartPeer({"LinkType=" + link_});
  ASSERT_NE(peer, nullptr);
  constexpr int kWrites = 6;
  const size_t chunk = 16 * kKiB + 8;
  ASSERT_NE(peer->Reg("b", chunk), 0u);
  HIXL_ASSERT_OK(Init(engine_));
  void* mine = nullptr;
  HIXL_ASSERT_OK(engine_.AllocMem(chunk * kWrites, hixl::MemType::MEM_HOST, &mine));
  const auto base = reinterpret_cast<uintptr_t>(mine);
  struct Seen {
    std::mutex mu;
    std::vector<std::string> names;
    std::vector<std::string> hashes;  // of the slice a "w" notification names
  };
  auto seen = std::make_shared<Seen>();
  HIXL_ASSERT_OK(engine_.SetNotifyCallback([seen, base, chunk](const NotifyDesc& d) {
    std::lock_guard<std::mutex> lock(seen->mu);
    seen->names.push_back(d.name + "@" + d.from);
    if (d.name[0] != 'w') return;
    const size_t k = std::stoul(d.notify_msg);
    seen->hashes.push_back(
        hixl_test::HashHex(hixl_test::Fnv1a64(reinterpret_cast<void*>(base + k * chunk), chunk)));
  }));
  ASSERT_TRUE(peer->Ok("connect " + engine_.LocalEngine() + " 5000"));
  std::vector<std::string> want, want_hashes;
  int k = 0;
  for (int i = 0; i < 30; ++i) {
    if (i % 5 == 4) {
      ASSERT_TRUE(peer->Ok("fillpat b " + std::to_string(100 + i)));
      want_hashes.push_back(peer->Hash("b", 0, chunk));
      EXPECT_EQ(peer->Send("writenotify b 0 " + engine_.LocalEngine() + " " +
                           std::to_string(base + k * chunk) + " " + std::to_string(chunk) + " w" +
                           std::to_string(i) + " " + std::to_string(k) + " 10000"),
                "OK");
      ++k;
      want.push_back("w" + std::to_string(i) + "@" + peer->engine());
    } else {
      EXPECT_EQ(
          peer->Send("sendnotify " + engine_.LocalEngine() + " s" + std::to_string(i) + " m 5000"),
          "OK");
      want.push_back("s" + std::to_string(i) + "@" + peer->engine());
    }
  }
  ASSERT_TRUE(PollUntil(
      [&] {
        std::lock_guard<std::mutex> lock(seen->mu);
        return seen->names.size() >= want.size();
      },
      10000));
  HIXL_EXPECT_OK(engine_.SetNotifyCallback(nullptr));
  std::lock_guard<std::mutex> lock(seen->mu);
  EXPECT_EQ(seen->names, want);
  EXPECT_EQ(seen->hashes, want_hashes);  // each write's data was there at its notification
  std::vector<NotifyDesc> left;
  HIXL_EXPECT_OK(engine_.GetNotifies(left));
  EXPECT_TRUE(left.empty()) << left.size() << " went to the queue instead of the callback";
}

class ShmNotifyTest : public FailureBase {
 protected:
  ShmNotifyTest() { link_ = "SHM"; }
};

TEST_F(ShmNotifyTest, RingNotificationsNeedNoAnswerFromTheTarget) {
  PeerProcess* peer = StartPeer({"NotifyQueueDepth=4"});
  ASSERT_NE(peer, nullptr);
  const size_t n = 4 * kKiB;
  const uintptr_t remote = peer->Alloc("m", n);
  ASSERT_NE(remote, 0u);
  HIXL_ASSERT_OK(Init(engine_));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *peer));
  const std::string to = peer->engine();
  Buffer src(n);
  hixl_test::FillPattern(src.data(), n, 5);

  // Stopped, the target cannot answer a frame; a ring record needs nothing
  // from it. Its queue depth (4) still bounds them.
  ASSERT_NO_FATAL_FAILURE(Stop(*peer));
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) {
    HIXL_EXPECT_OK(engine_.SendNotify(to, NotifyDesc{"r" + std::to_string(i), "m", ""}, 2000));
  }
  TransferArgs args;
  args.notify = NotifyDesc{"r3", "data", ""};
  HIXL_EXPECT_OK(
      engine_.TransferSync(to, TransferOp::WRITE, {{src.addr(), remote, n}}, args, 2000));
  Measured("four_ring_notifications_to_a_stopped_target_ms", ElapsedMs(t0));
  // The fifth finds no credit, goes over the control link and gets no answer.
  HIXL_EXPECT_CODE(StatusCode::kTimeout, engine_.SendNotify(to, NotifyDesc{"r4", "m", ""}, 300));
  Cont(*peer);
  // Once it runs, the target takes the fifth's frame only after the ring's
  // four: refused while they wait, queued after them if they were taken first.
  EXPECT_EQ(peer->Send("getnotifies names"), "OK 4 r0 r1 r2 r3");
  EXPECT_EQ(peer->Hash("m", 0, n), src.HashHex());
  HIXL_EXPECT_OK(engine_.SendNotify(to, NotifyDesc{"r5", "m", ""}, 2000));
  const std::string rest = peer->Send("getnotifies names");
  EXPECT_TRUE(rest == "OK 1 r5" || rest == "OK 2 r4 r5") << rest;

  // ShmNotifyRing=0: the control link, which a stopped target cannot answer.
  HIXL_ASSERT_OK(Init(engine2_, {{opt::kShmNotifyRing, "0"}}));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine2_, *peer));
  HIXL_EXPECT_OK(engine2_.SendNotify(to, NotifyDesc{"c0", "m", ""}, 2000));
  ASSERT_NO_FATAL_FAILURE(Stop(*peer));
  HIXL_EXPECT_CODE(StatusCode::kTimeout, engine2_.SendNotify(to, NotifyDesc{"c1", "m", ""}, 300));
  Cont(*peer);
  // c1 is queued once the target runs again (it answers late); c2's answer
  // comes after c1 was handled.
  HIXL_EXPECT_OK(engine2_.SendNotify(to, NotifyDesc{"c2", "m", ""}, 2000));
  EXPECT_EQ(peer->Send("getnotifies names"), "OK 3 c0 c1 c2");
}

TEST_F(ShmNotifyTest, WhatTheRingHoldsWhenTheLinkClosesIsDelivered) {
  PeerProcess* peer = StartPeer();
  ASSERT_NE(peer, nullptr);
  HIXL_ASSERT_OK(Init(engine_));
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *peer));
  const std::string to = peer->engine();
  for (int i = 0; i < 5; ++i) {
    HIXL_EXPECT_OK(engine_.SendNotify(to, NotifyDesc{"k" + std::to_string(i), "m", ""}, 2000));
  }
  HIXL_EXPECT_OK(engine_.Disconnect(to, 2000));
  SleepMs(200);  // the target closes its end of the link
  EXPECT_EQ(peer->Send("getnotifies from"),
            "OK 5 k0=m@" + engine_.LocalEngine() + " k1=m@" + engine_.LocalEngine() + " k2=m@" +
                engine_.LocalEngine() + " k3=m@" + engine_.LocalEngine() + " k4=m@" +
                engine_.LocalEngine());
  // A new link gets a new ring.
  ASSERT_NO_FATAL_FAILURE(ConnectTo(engine_, *peer));
  HIXL_EXPECT_OK(engine_.SendNotify(to, NotifyDesc{"k5", "m", ""}, 2000));
  EXPECT_EQ(peer->Send("getnotifies names"), "OK 1 k5");
}

}  // namespace
