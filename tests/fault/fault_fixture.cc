// tests/fault/fault_fixture.cc — the fault tests' fixture (see
// fault_fixture.h).
#include "fault/fault_fixture.h"

#include <signal.h>

#include <fstream>
#include <iostream>
#include <iterator>

namespace hixl_fault {

using hixl_test::PeerLaunch;
using hixl_test::PeerProcess;

Tools FaultTest::tools_;
std::string FaultTest::skip_;

void Measured(const std::string& what, long ms) {
  std::cout << "[ measured ] " << what << ": " << ms << " ms" << std::endl;
  ::testing::Test::RecordProperty(what, std::to_string(ms));
}

Background::Background(PeerProcess* p, std::string cmd, int timeout_ms) {
  th_ = std::thread([this, p, cmd = std::move(cmd), timeout_ms] {
    const auto t0 = Clock::now();
    reply_ = p->Send(cmd, timeout_ms);
    ms_ = MsSince(t0);
    done_.store(true);
  });
}

const std::string& Background::Join() {
  if (th_.joinable()) th_.join();
  return reply_;
}

void FaultTest::SetUpTestSuite() {
  tools_ = Tools::Find();
  skip_ = tools_.Missing();
  if (skip_.empty()) FaultNet::RemoveStale(tools_);
}

void FaultTest::SetUp() {
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  net_ = std::make_unique<FaultNet>(tools_);
  std::string err;
  bool denied = false;
  if (!net_->Create(&err, &denied)) {
    if (denied) GTEST_SKIP() << "cannot create network namespaces here: " << err;
    FAIL() << "building the test network failed: " << err;
  }
}

void FaultTest::TearDown() {
  for (pid_t p : frozen_) kill(p, SIGCONT);
  frozen_.clear();
  bg_.clear();  // bounded: each command has its own timeout
  peers_.clear();
  a_ = b_ = c_ = nullptr;
  if (net_) {
    const std::string problems = net_->Cleanup();
    EXPECT_EQ(problems, "");
    net_.reset();
    std::string out;
    if (RunCommand({tools_.ip, "netns", "list"}, &out) == 0) {
      EXPECT_EQ(out.find(FaultNet::Prefix()), std::string::npos)
          << "namespaces of this test are left behind:\n"
          << out;
    }
  }
}

PeerProcess* FaultTest::StartPeer(const std::string& ns, const std::string& addr,
                                  std::vector<std::string> opts) {
  PeerLaunch l;
  l.options = std::move(opts);
  l.exec_prefix = {tools_.ip, "netns", "exec", ns};
  l.listen = addr;
  peers_.push_back(std::make_unique<PeerProcess>(l));
  if (!peers_.back()->Start()) return nullptr;
  return peers_.back().get();
}

void FaultTest::StartTrio(size_t n, std::vector<std::string> a_opts,
                          std::vector<std::string> b_opts, const std::string& b_listen) {
  n_ = n;
  a_ = StartPeer(net_->a(), std::string(kAddrA) + ":0", std::move(a_opts));
  ASSERT_NE(a_, nullptr);
  b_ = StartPeer(net_->b(), b_listen, std::move(b_opts));
  ASSERT_NE(b_, nullptr);
  c_ = StartPeer(net_->c(), std::string(kAddrC) + ":0");
  ASSERT_NE(c_, nullptr);
  ASSERT_TRUE(a_->Ok("buf src " + Num(n)));
  a_src_seed_ = ++seed_;
  ASSERT_TRUE(a_->Ok("fillpat src " + Num(a_src_seed_)));
  a_src_hash_ = a_->Hash("src", 0, n);
  a_in_ = a_->Reg("in", n, "rw");
  ASSERT_NE(a_in_, 0u);
  ASSERT_TRUE(c_->Ok("buf src " + Num(kMiB)));
  ASSERT_NO_FATAL_FAILURE(SetUpTargetRegions());
}

void FaultTest::SetUpTargetRegions() {
  b_dst_ = b_->Reg("dst", n_, "rw");
  b_src_ = b_->Reg("src", n_, "rw");
  b_other_ = b_->Reg("other", kMiB, "rw");
  b_cdst_ = b_->Reg("cdst", kMiB, "rw");
  ASSERT_TRUE(b_dst_ && b_src_ && b_other_ && b_cdst_);
  b_src_seed_ = ++seed_;
  ASSERT_TRUE(b_->Ok("fillpat src " + Num(b_src_seed_)));
  ASSERT_TRUE(b_->Ok("fillpat other " + Num(++seed_)));
  b_src_hash_ = b_->Hash("src", 0, n_);
  b_other_hash_ = b_->Hash("other", 0, kMiB);
}

std::string FaultTest::TransferCmd(Op op, int timeout_ms) const {
  if (op == Op::kWrite) {
    return "write src 0 " + b_->engine() + " " + Num(b_dst_) + " " + Num(n_) + " " +
           Num(static_cast<uint64_t>(timeout_ms));
  }
  return "read in 0 " + b_->engine() + " " + Num(b_src_) + " " + Num(n_) + " " +
         Num(static_cast<uint64_t>(timeout_ms));
}

void FaultTest::ClearDestination(Op op) {
  if (op == Op::kWrite) {
    ASSERT_TRUE(b_->Ok("fill dst 0"));
  } else {
    ASSERT_TRUE(a_->Ok("fill in 0"));
  }
}

void FaultTest::ExpectDelivered(Op op) {
  if (op == Op::kWrite) {
    EXPECT_EQ(b_->Hash("dst", 0, n_), a_src_hash_) << "B.dst does not hold A.src's bytes";
  } else {
    EXPECT_EQ(a_->Hash("in", 0, n_), b_src_hash_) << "A.in does not hold B.src's bytes";
  }
}

void FaultTest::ConnectAB() {
  ASSERT_EQ(a_->Send("connect " + b_->engine() + " " + Num(kConnectMs), 2 * kConnectMs), "OK");
  ASSERT_EQ(a_->Send("linktype " + b_->engine()), "OK TCP");
}

pid_t FaultTest::DestPid(Op op) const { return op == Op::kWrite ? b_->pid() : a_->pid(); }

std::string FaultTest::DestHash(Op op) {
  return op == Op::kWrite ? b_->Hash("dst", 0, n_) : a_->Hash("in", 0, n_);
}

long FaultTest::WaitProgress(Op op, long blocks, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  long got = 0;
  for (;;) {
    got = CountWrittenBlocks(DestPid(op), DestAddr(op), n_, 64 * kKiB);
    if (got < 0 || got >= blocks || Clock::now() >= deadline) return got;
    SleepMs(2);
  }
}

void FaultTest::ExpectNothingOutside() {
  for (const char* r : {"dst", "src", "other", "cdst"}) {
    EXPECT_EQ(b_->Send(std::string("canary ") + r), "OK intact") << "B." << r;
  }
  EXPECT_EQ(a_->Send("canary in"), "OK intact") << "A.in";
  EXPECT_EQ(b_->Hash("src", 0, n_), b_src_hash_) << "B.src was only read, yet it changed";
  EXPECT_EQ(b_->Hash("other", 0, kMiB), b_other_hash_) << "B.other, named by no transfer, changed";
  EXPECT_EQ(a_->Hash("src", 0, n_), a_src_hash_) << "A.src was only read, yet it changed";
}

void FaultTest::ExpectTargetServesOthers() {
  ASSERT_TRUE(c_->Ok("fillpat src " + Num(++seed_)));
  const std::string eng = b_->engine();
  if (c_->Send("connstatus " + eng) != "OK CONNECTED") {
    ASSERT_TRUE(c_->Ok("connect " + eng + " " + Num(kConnectMs), 2 * kConnectMs));
  }
  const auto t0 = Clock::now();
  EXPECT_EQ(c_->Send("write src 0 " + eng + " " + Num(b_cdst_) + " " + Num(kMiB) + " " +
                         Num(10000 * kSlow),
                     20000 * kSlow),
            "OK")
      << "B did not serve another initiator (C, on its own link)";
  Measured("C writes 1 MiB to B", MsSince(t0));
  EXPECT_EQ(b_->Hash("cdst", 0, kMiB), c_->Hash("src", 0, kMiB));
}

void FaultTest::ExpectReconnectWorks(Op op) {
  const std::string eng = b_->engine();
  (void)a_->Send("disconnect " + eng);  // OK, or NOT_CONNECTED when the link was declared dead
  ASSERT_EQ(a_->Send("connect " + eng + " " + Num(kConnectMs), 2 * kConnectMs), "OK");
  ASSERT_NO_FATAL_FAILURE(ClearDestination(op));
  const auto t0 = Clock::now();
  EXPECT_EQ(a_->Send(TransferCmd(op, 20000 * kSlow), 30000 * kSlow), "OK");
  Measured(std::string(OpName(op)) + " after reconnecting", MsSince(t0));
  ExpectDelivered(op);
}

void FaultTest::ExpectLinkUsableOrReported(Op op) {
  const std::string eng = b_->engine();
  const std::string cs = a_->Send("connstatus " + eng);
  std::cout << "[ info ] A's link to B after the fault: " << cs << std::endl;
  if (cs != "OK CONNECTED") {
    ExpectReconnectWorks(op);
    return;
  }
  ASSERT_NO_FATAL_FAILURE(ClearDestination(op));
  const std::string r = a_->Send(TransferCmd(op, 10000 * kSlow), 20000 * kSlow);
  EXPECT_EQ(r, "OK") << "A's link to B is still reported CONNECTED, so a transfer over it must "
                        "work (or the link must be reported lost so that the application "
                        "reconnects)";
  if (r == "OK") {
    ExpectDelivered(op);
  } else {
    ExpectReconnectWorks(op);  // what an application can still do
  }
}

namespace {
char ProcState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t p = s.rfind(')');
  if (p == std::string::npos || p + 2 >= s.size()) return 0;
  return s[p + 2];
}
}  // namespace

void FaultTest::Freeze(PeerProcess& p) {
  ASSERT_TRUE(p.running());
  frozen_.insert(p.pid());
  ASSERT_EQ(kill(p.pid(), SIGSTOP), 0);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (ProcState(p.pid()) != 'T') {
    ASSERT_LT(Clock::now(), deadline) << "peer " << p.pid() << " did not stop";
    SleepMs(1);
  }
}

void FaultTest::Thaw(PeerProcess& p) {
  if (p.running()) kill(p.pid(), SIGCONT);
  frozen_.erase(p.pid());
}

}  // namespace hixl_fault
