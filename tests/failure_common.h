// tests/failure_common.h — what the failure suites share (failure_test.cc,
// failure_fence_test.cc): helpers (timing, hashes, process state, polling),
// the FailureBase fixture (any number of peers, two engines here,
// stopped-peer bookkeeping) and the per-transport fixtures. Included by one
// test executable's translation units; everything is in namespace
// failure_test (functions inline).
#ifndef HIXL_TESTS_FAILURE_COMMON_H_
#define HIXL_TESTS_FAILURE_COMMON_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "hixl/hixl.h"
#include "peer_process.h"

namespace hixl {
inline void PrintTo(ConnectStatus s, std::ostream* os) {
  switch (s) {
    case ConnectStatus::NOT_CONNECTED: *os << "NOT_CONNECTED"; return;
    case ConnectStatus::CONNECTING: *os << "CONNECTING"; return;
    case ConnectStatus::CONNECTED: *os << "CONNECTED"; return;
    case ConnectStatus::FAILED: *os << "FAILED"; return;
  }
  *os << "ConnectStatus(" << static_cast<uint32_t>(s) << ")";
}
}  // namespace hixl

// A named namespace: gtest needs each fixture to be one class across the
// executable's translation units.
namespace failure_test {

using hixl::ConnectStatus;
using hixl::Hixl;
using hixl::LinkType;
using hixl::NotifyDesc;
using hixl::Status;
using hixl::StatusCode;
using hixl::TransferArgs;
using hixl::TransferOp;
using hixl::TransferOpDesc;
using hixl::TransferReq;
using hixl::TransferStatus;
using hixl_test::Buffer;
using hixl_test::PeerLaunch;
using hixl_test::PeerProcess;
using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;
using Clock = std::chrono::steady_clock;

namespace opt = hixl::options;

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;
constexpr size_t kDiv = hixl_test::kSanitizerDivisor;
constexpr int kConnectMs = 5000;

// Sanitizer builds run everything several times slower: bounds grow.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kSlow = 3;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int kSlow = 3;
#else
constexpr int kSlow = kDiv > 1 ? 3 : 1;
#endif
#else
constexpr int kSlow = kDiv > 1 ? 3 : 1;
#endif

// A dead or hung peer must be noticed within this (the initiators of the
// detection tests use HeartbeatIntervalMs=100, HeartbeatMisses=3: ~400 ms).
constexpr int kDetectBoundMs = 5000 * kSlow;
const std::map<std::string, std::string> kFastHeartbeats = {{opt::kHeartbeatIntervalMs, "100"},
                                                            {opt::kHeartbeatMisses, "3"}};

inline long ElapsedMs(Clock::time_point since) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

inline void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

inline const char* Name(TransferStatus s) {
  switch (s) {
    case TransferStatus::WAITING: return "WAITING";
    case TransferStatus::COMPLETED: return "COMPLETED";
    case TransferStatus::TIMEOUT: return "TIMEOUT";
    case TransferStatus::FAILED: return "FAILED";
    case TransferStatus::CANCELLED: return "CANCELLED";
  }
  return "UNKNOWN";
}

inline const char* Name(ConnectStatus s) {
  switch (s) {
    case ConnectStatus::NOT_CONNECTED: return "NOT_CONNECTED";
    case ConnectStatus::CONNECTING: return "CONNECTING";
    case ConnectStatus::CONNECTED: return "CONNECTED";
    case ConnectStatus::FAILED: return "FAILED";
  }
  return "UNKNOWN";
}

inline void Measured(const std::string& what, long ms) {
  std::cout << "[ measured ] " << what << ": " << ms << " ms" << std::endl;
  ::testing::Test::RecordProperty(what, std::to_string(ms));
}

// hixl_test::Fnv1a64 of `len` bytes all equal to `b`, without the memory
// (checked against Fnv1a64 itself by FailureHelpers.ConstHashMatchesFnv1a64).
inline std::string ConstHashHex(unsigned char b, size_t len) {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  unsigned char bytes[8];
  std::memset(bytes, b, sizeof(bytes));
  uint64_t w = 0;
  std::memcpy(&w, bytes, 8);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t k = 0; k < len / 8; ++k) {
    h ^= w;
    h *= kPrime;
  }
  for (size_t i = 0; i < len % 8; ++i) {
    h ^= b;
    h *= kPrime;
  }
  return hixl_test::HashHex(h);
}

// Process state letter from /proc/PID/stat ('T': stopped), or 0.
inline char ProcState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t p = s.rfind(')');
  if (p == std::string::npos || p + 2 >= s.size()) return 0;
  return s[p + 2];
}

// Polls pred every step_ms until it holds or timeout_ms passes.
inline bool PollUntil(const std::function<bool()>& pred, int timeout_ms, int step_ms = 2) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (pred()) return true;
    if (Clock::now() >= deadline) return false;
    SleepMs(step_ms);
  }
}

// Polls GetLinkType(remote) every 5 ms until it reports NOT_CONNECTED (the
// link was dropped) or timeout_ms passes; returns its last answer.
inline Status WaitLinkLost(const Hixl& e, const std::string& remote, int timeout_ms) {
  Status lt;
  PollUntil(
      [&] {
        LinkType t{};
        lt = e.GetLinkType(remote, t);
        return lt.code() == StatusCode::kNotConnected;
      },
      timeout_ms, 5);
  return lt;
}

inline ConnectStatus GetCs(const Hixl& e, const std::string& remote, Status* reason = nullptr) {
  ConnectStatus cs = ConnectStatus::FAILED;
  Status r;
  Status s = e.GetConnectStatus(remote, cs, &r);
  EXPECT_TRUE(s.ok()) << "GetConnectStatus(" << remote << ") -> " << s.ToString();
  if (reason) *reason = r;
  return cs;
}

inline std::string LinkParamName(const ::testing::TestParamInfo<std::string>& i) { return i.param; }


// ---------------------------------------------------------------------------
// Fixture: any number of peers, two engines here, stopped-peer bookkeeping.

class FailureBase : public ::testing::Test {
 protected:
  PeerProcess* StartPeer(const std::vector<std::string>& peer_opts = {},
                         const std::string& listen = "") {
    PeerLaunch l;
    l.options = peer_opts;
    l.listen = listen;
    peers_.push_back(std::make_unique<PeerProcess>(l));
    if (!peers_.back()->Start()) return nullptr;
    return peers_.back().get();
  }

  std::map<std::string, std::string> Opts(std::map<std::string, std::string> extra = {}) const {
    if (!link_.empty()) extra.emplace(opt::kLinkType, link_);
    return extra;
  }
  // Initialize with LinkType=link_ plus `extra`.
  Status Init(Hixl& e, const std::map<std::string, std::string>& extra = {}) {
    return e.Initialize("127.0.0.1:0", Opts(extra));
  }
  // Checks the link to `remote` uses this fixture's transport.
  void ExpectLinkType(const Hixl& e, const std::string& remote) {
    if (link_.empty()) return;
    LinkType t = LinkType::AUTO;
    Status s = e.GetLinkType(remote, t);
    ASSERT_TRUE(s.ok()) << "GetLinkType -> " << s.ToString();
    ASSERT_EQ(t, hixl_test::LinkTypeOf(link_)) << "LinkType=" << link_;
  }
  void ConnectTo(Hixl& e, const PeerProcess& p) {
    HIXL_ASSERT_OK(e.Connect(p.engine(), kConnectMs));
    ASSERT_NO_FATAL_FAILURE(ExpectLinkType(e, p.engine()));
  }

  // SIGSTOP, and wait (bounded) until the kernel reports it stopped.
  void Stop(PeerProcess& p) {
    ASSERT_TRUE(p.running());
    stopped_.insert(p.pid());
    ASSERT_EQ(kill(p.pid(), SIGSTOP), 0) << strerror(errno);
    ASSERT_TRUE(PollUntil([&] { return ProcState(p.pid()) == 'T'; }, 5000))
        << "peer " << p.pid() << " did not stop";
  }
  void Cont(PeerProcess& p) {
    if (p.running()) kill(p.pid(), SIGCONT);
  }
  // A thread that SIGCONTs the peer after `ms` (joined by JoinConts/TearDown).
  void ContAfter(PeerProcess& p, int ms) {
    const pid_t pid = p.pid();
    conts_.emplace_back([pid, ms] {
      SleepMs(ms);
      kill(pid, SIGCONT);
    });
  }
  void JoinConts() {
    for (auto& t : conts_) t.join();
    conts_.clear();
  }

  // A buffer that outlives TearDown's Finalize (async requests may use it).
  Buffer& KeptBuffer(size_t size, int fill = 0) {
    kept_.push_back(std::make_unique<Buffer>(size, fill));
    return *kept_.back();
  }

  Status Write(Hixl& e, const PeerProcess& p, uintptr_t local, uintptr_t remote, size_t len,
               int timeout_ms = 30000) {
    return e.TransferSync(p.engine(), TransferOp::WRITE, {{local, remote, len}}, timeout_ms);
  }
  Status Read(Hixl& e, const PeerProcess& p, uintptr_t local, uintptr_t remote, size_t len,
              int timeout_ms = 30000) {
    return e.TransferSync(p.engine(), TransferOp::READ, {{local, remote, len}}, timeout_ms);
  }

  void TearDown() override {
    JoinConts();
    for (auto& p : peers_) {
      if (p->running() && stopped_.count(p->pid())) kill(p->pid(), SIGCONT);
    }
    engine_.Finalize();
    engine2_.Finalize();
    peers_.clear();
  }

  std::string link_;                           // the initiators' LinkType option; empty: AUTO
  std::vector<std::unique_ptr<Buffer>> kept_;  // destroyed after TearDown
  std::vector<std::unique_ptr<PeerProcess>> peers_;
  std::set<pid_t> stopped_;
  std::vector<std::thread> conts_;
  Hixl engine_;
  Hixl engine2_;
};

class FailureTest : public FailureBase, public ::testing::WithParamInterface<std::string> {
 protected:
  FailureTest() { link_ = GetParam(); }
  bool tcp() const { return link_ == "TCP"; }
};

// Tests that need a target that cannot make progress (SIGSTOP) to hold a
// transfer up: tcp only.
class TcpFailureTest : public FailureBase {
 protected:
  TcpFailureTest() { link_ = "TCP"; }
};

}  // namespace failure_test

#endif  // HIXL_TESTS_FAILURE_COMMON_H_
