// tests/fault/net_fault_test.cc — kernel-level faults on the path between an
// initiator A and a target B in other network namespaces (topology:
// fault_env.h), injected in the router R while a transfer of kBig bytes is
// in flight over tcp: a slow link (tbf), a lossy link (nftables random
// drop), a partition (every forwarded packet silently dropped) and a link
// taken down, each healed afterwards; the target frozen (SIGSTOP, then
// SIGCONT) and killed (SIGKILL, then restarted at the same address).
//
// Every scenario runs as WRITE (A -> B) and READ (B -> A) and asserts:
//   - the transfer either completes with every byte correct (hashes on both
//     sides), or ends with an error within the heartbeat bound
//     (kDetectBoundMs, generous; the measured time is printed);
//   - no byte of a failed transfer lands after it reported its end (the
//     destination is hashed at the end and again after the fault healed);
//   - no byte lands outside the descriptors (canary guards of every
//     registered region intact, regions no transfer names unchanged);
//   - B keeps serving another initiator (C, on its own link);
//   - after healing a new transfer works (after a reconnect where the link
//     was declared dead).
// Every wait is bounded; the fixture stops every process it started and
// deletes the namespaces, also when a test fails.
#include <gtest/gtest.h>

#include <functional>
#include <iostream>

#include "fault/fault_fixture.h"

namespace hixl_fault {
namespace {

// A rate at which kBig takes over a second, so faults hit it mid-flight.
constexpr const char* kSlowRate = "80mbit";
constexpr double kSlowRateBits = 80e6;

class NetFaultTest : public FaultTest, public ::testing::WithParamInterface<Op> {
 protected:
  // Starts op's transfer over the rate-limited link, waits until it is
  // partly done, calls inject, and expects the transfer to fail within the
  // heartbeat bound. Then checks B serves C, calls heal, and expects the
  // destination unchanged since the failure, nothing outside, and that a
  // reconnect works.
  void FailAndHeal(const std::string& what, const std::function<bool(std::string*)>& inject,
                   const std::function<bool(std::string*)>& heal) {
    const Op op = GetParam();
    FAULT_START_TRIO(kBig, FastHeartbeats(), FastHeartbeats());
    std::string err;
    ASSERT_TRUE(net_->RateLimit(kSlowRate, &err)) << err;
    ASSERT_NO_FATAL_FAILURE(ConnectAB());
    ASSERT_NO_FATAL_FAILURE(ClearDestination(op));
    auto tr = std::make_unique<Background>(a_, TransferCmd(op, 60000 * kSlow), 90000 * kSlow);
    const long seen = WaitProgress(op, 2, 10000 * kSlow);
    ASSERT_GE(seen, 2) << "the transfer did not get going";
    ASSERT_FALSE(tr->done()) << "the transfer ended before the fault: " << tr->Join();
    ASSERT_TRUE(inject(&err)) << err;
    const auto t_fault = Clock::now();
    const std::string r = tr->Join();
    const long ms = MsSince(t_fault);
    Measured(what + ": " + OpName(op) + " failed after", ms);
    std::cout << "[ info ] " << what << ": the transfer ended with: " << r << std::endl;
    EXPECT_TRUE(IsErr(r)) << "a transfer across a dead path cannot succeed: " << r;
    EXPECT_LT(ms, kDetectBoundMs) << "the failure was not noticed within the heartbeat bound";
    const std::string at_end = DestHash(op);
    EXPECT_NE(at_end, op == Op::kWrite ? a_src_hash_ : b_src_hash_);
    ASSERT_TRUE(a_->Ok("ping"));
    ExpectTargetServesOthers();
    ASSERT_TRUE(heal(&err)) << err;
    ASSERT_TRUE(net_->RateLimit("", &err)) << err;
    // Old lanes see their resets and B's heartbeat drops the dead link.
    SleepMs(1000);
    EXPECT_EQ(DestHash(op), at_end) << "bytes of the failed transfer landed after it ended";
    ExpectNothingOutside();
    ExpectReconnectWorks(op);
    ExpectTargetServesOthers();
  }
};

// A slow link (tbf, 80 Mbit/s both ways in R): the transfer is slowed down,
// nothing else: it completes with every byte correct, the heartbeats keep
// the link alive, and C is served meanwhile.
TEST_P(NetFaultTest, SlowLinkCompletes) {
  const Op op = GetParam();
  FAULT_START_TRIO(kBig, TolerantHeartbeats(), TolerantHeartbeats());
  std::string err;
  ASSERT_TRUE(net_->RateLimit(kSlowRate, &err)) << err;
  ASSERT_NO_FATAL_FAILURE(ConnectAB());
  ASSERT_NO_FATAL_FAILURE(ClearDestination(op));
  Background tr(a_, TransferCmd(op, 60000 * kSlow), 90000 * kSlow);
  EXPECT_GE(WaitProgress(op, 1, 10000 * kSlow), 1);
  if (!tr.done()) ExpectTargetServesOthers();  // while A's transfer crawls
  EXPECT_EQ(tr.Join(), "OK");
  Measured(std::string("slow link: ") + OpName(op), tr.ms());
  const double wire_ms = static_cast<double>(n_) * 8.0 / kSlowRateBits * 1000.0;
  EXPECT_GE(tr.ms(), static_cast<long>(wire_ms * 0.5))
      << "faster than the link allows: the rate limit was not in effect";
  ExpectDelivered(op);
  ExpectNothingOutside();
  EXPECT_EQ(a_->Send("connstatus " + b_->engine()), "OK CONNECTED");
}

// A lossy link (5% of the packets R forwards dropped, both ways): tcp
// retransmits; two transfers in a row complete with every byte correct.
TEST_P(NetFaultTest, LossyLinkCompletes) {
  const Op op = GetParam();
  FAULT_START_TRIO(kBig, TolerantHeartbeats(), TolerantHeartbeats());
  ASSERT_NO_FATAL_FAILURE(ConnectAB());
  std::string err;
  ASSERT_TRUE(net_->Loss(5, &err)) << err;
  for (int round = 0; round < 2; ++round) {
    ASSERT_NO_FATAL_FAILURE(ClearDestination(op));
    const auto t0 = Clock::now();
    EXPECT_EQ(a_->Send(TransferCmd(op, 60000 * kSlow), 90000 * kSlow), "OK");
    Measured(std::string("lossy link: ") + OpName(op), MsSince(t0));
    ExpectDelivered(op);
  }
  const long dropped = net_->LossDropped();
  std::cout << "[ info ] packets dropped by the loss rule: " << dropped << std::endl;
  EXPECT_GT(dropped, 0) << "the loss rule dropped nothing: the fault was not injected";
  ExpectTargetServesOthers();
  ASSERT_TRUE(net_->Loss(0, &err)) << err;
  ExpectNothingOutside();
  EXPECT_EQ(a_->Send("connstatus " + b_->engine()), "OK CONNECTED");
}

// A partition: every packet between A and B silently dropped (no RST, no
// ICMP) mid-transfer. A's heartbeats declare B dead and the transfer fails;
// after the partition heals, nothing stale lands and a reconnect works.
TEST_P(NetFaultTest, PartitionFailsBoundedThenHeals) {
  FailAndHeal(
      "partition", [&](std::string* err) { return net_->Partition(true, err); },
      [&](std::string* err) { return net_->Partition(false, err); });
}

// R's link towards B taken down mid-transfer, then brought back up (routes
// restored): as a partition, with the kernel's unreachable errors on top.
TEST_P(NetFaultTest, LinkDownFailsBoundedThenUp) {
  FailAndHeal(
      "link down", [&](std::string* err) { return net_->LinkRB(false, err); },
      [&](std::string* err) { return net_->LinkRB(true, err); });
}

// The target frozen mid-transfer, as a paused host: SIGSTOP, and at once
// the path goes dark (R drops every packet), so what B's kernel has
// buffered for the lanes stays buffered and what A sends later (the resets
// when it gives B up) is lost, as it is for a paused VM (a RST is never
// retransmitted). A's heartbeats declare B dead and the transfer fails. What
// the failed transfer left in the destination is read while B is still
// stopped (process_vm_readv for B.dst); then B resumes (SIGCONT) with the
// path still dark: B must not apply what its kernel buffered for the lanes A
// abandoned (no byte of a failed request lands afterwards). Once the path is
// back B serves C and A reconnects.
TEST_P(NetFaultTest, FrozenTargetFailsBoundedThenResumes) {
  const Op op = GetParam();
  FAULT_START_TRIO(kBig, FastHeartbeats(), FastHeartbeats());
  std::string err;
  ASSERT_TRUE(net_->RateLimit(kSlowRate, &err)) << err;
  ASSERT_NO_FATAL_FAILURE(ConnectAB());
  ASSERT_NO_FATAL_FAILURE(ClearDestination(op));
  auto tr = std::make_unique<Background>(a_, TransferCmd(op, 60000 * kSlow), 90000 * kSlow);
  ASSERT_GE(WaitProgress(op, 2, 10000 * kSlow), 2) << "the transfer did not get going";
  ASSERT_FALSE(tr->done()) << "the transfer ended before the fault: " << tr->Join();
  ASSERT_NO_FATAL_FAILURE(Freeze(*b_));
  ASSERT_TRUE(net_->Partition(true, &err)) << err;
  const auto t_fault = Clock::now();
  const std::string r = tr->Join();
  const long ms = MsSince(t_fault);
  Measured(std::string("frozen target: ") + OpName(op) + " failed after", ms);
  std::cout << "[ info ] frozen target: the transfer ended with: " << r << std::endl;
  EXPECT_TRUE(IsErr(r)) << r;
  EXPECT_LT(ms, kDetectBoundMs) << "a hung target was not noticed within the heartbeat bound";
  const std::string at_end =
      op == Op::kWrite ? PeerMemoryHash(b_->pid(), b_dst_, n_) : a_->Hash("in", 0, n_);
  ASSERT_NE(at_end, "") << "cannot read the stopped target's memory";
  const long queued = net_->ReceiveQueued(op == Op::kWrite ? net_->b() : net_->a());
  std::cout << "[ info ] frozen target: bytes buffered in the destination's kernel: " << queued
            << std::endl;
  ASSERT_TRUE(a_->Ok("ping"));
  Thaw(*b_);
  ASSERT_TRUE(b_->Ok("ping"));
  SleepMs(500);
  EXPECT_EQ(DestHash(op), at_end)
      << "bytes of the failed transfer landed after it ended: B applied, when it resumed, what "
         "its kernel had buffered for lanes A had abandoned ("
      << queued << " bytes were buffered)";
  ASSERT_TRUE(net_->Partition(false, &err)) << err;
  ASSERT_TRUE(net_->RateLimit("", &err)) << err;
  ExpectNothingOutside();
  ExpectTargetServesOthers();
  ExpectReconnectWorks(op);
}

// The target killed (SIGKILL) mid-transfer: the transfer fails (its kernel
// resets the connections), A's engine survives, and B restarted at the same
// address is a new incarnation (new generation) that A and C reconnect to.
TEST_P(NetFaultTest, KilledTargetFailsBoundedThenRestarts) {
  const Op op = GetParam();
  const std::string listen = std::string(kAddrB) + ":24680";
  FAULT_START_TRIO(kBig, FastHeartbeats(), FastHeartbeats(), listen);
  std::string err;
  ASSERT_TRUE(net_->RateLimit(kSlowRate, &err)) << err;
  ASSERT_NO_FATAL_FAILURE(ConnectAB());
  const std::string eng = b_->engine();
  const std::string gen0 = a_->Send("peergen " + eng);
  ASSERT_TRUE(hixl_test::IsOk(gen0)) << gen0;
  ASSERT_NO_FATAL_FAILURE(ClearDestination(op));
  auto tr = std::make_unique<Background>(a_, TransferCmd(op, 60000 * kSlow), 90000 * kSlow);
  ASSERT_GE(WaitProgress(op, 2, 10000 * kSlow), 2) << "the transfer did not get going";
  ASSERT_FALSE(tr->done()) << "the transfer ended before the fault: " << tr->Join();
  b_->Kill();
  const auto t_fault = Clock::now();
  const std::string r = tr->Join();
  const long ms = MsSince(t_fault);
  Measured(std::string("killed target: ") + OpName(op) + " failed after", ms);
  std::cout << "[ info ] killed target: the transfer ended with: " << r << std::endl;
  EXPECT_TRUE(IsErr(r)) << r;
  EXPECT_LT(ms, kDetectBoundMs);
  ASSERT_TRUE(a_->Ok("ping"));
  if (op == Op::kRead) {
    const std::string at_end = a_->Hash("in", 0, n_);
    SleepMs(300);
    EXPECT_EQ(a_->Hash("in", 0, n_), at_end) << "bytes landed after the READ failed";
    EXPECT_EQ(a_->Send("canary in"), "OK intact");
  }
  ASSERT_TRUE(net_->RateLimit("", &err)) << err;
  // A new incarnation at the same address.
  b_ = StartPeer(net_->b(), listen, FastHeartbeats());
  ASSERT_NE(b_, nullptr);
  ASSERT_EQ(b_->engine(), eng);
  ASSERT_NO_FATAL_FAILURE(SetUpTargetRegions());
  ExpectReconnectWorks(op);
  const std::string gen1 = a_->Send("peergen " + eng);
  EXPECT_TRUE(hixl_test::IsOk(gen1)) << gen1;
  EXPECT_NE(gen1, gen0) << "the restarted target must have a new generation";
  ExpectNothingOutside();
  ExpectTargetServesOthers();
}

INSTANTIATE_TEST_SUITE_P(Ops, NetFaultTest, ::testing::Values(Op::kWrite, Op::kRead), OpParamName);

}  // namespace
}  // namespace hixl_fault
