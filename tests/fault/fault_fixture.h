// tests/fault/fault_fixture.h — the fixture every fault test uses: the
// namespaces of fault_env.h, three hixl_test_peer processes in them (A the
// initiator, B the target, C a second initiator of B on its own link), the
// regions a scenario moves and checks, and bounded helpers to run a
// transfer in the background while a fault is injected.
//
// Regions (n bytes unless said otherwise):
//   A: src (buf, pattern), in (reg rw, zero: READ lands here)
//   B: dst (reg rw, zero: WRITE lands here), src (reg rw, pattern: READ reads
//      it), other (reg rw, 1 MiB pattern: no transfer names it), cdst (reg
//      rw, 1 MiB: C writes it)
//   C: src (buf, 1 MiB)
// `reg` regions have 4 KiB canary guards on both sides (test_peer.cc).
//
// Sizes and time bounds scale with the build: sanitizer builds (the CMake
// sets HIXL_FAULT_SANITIZE to 1 for address, 2 for thread) move less data
// and allow more time.
#ifndef HIXL_TESTS_FAULT_FAULT_FIXTURE_H_
#define HIXL_TESTS_FAULT_FAULT_FIXTURE_H_

#include <gtest/gtest.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fault/fault_env.h"
#include "peer_process.h"

#ifndef HIXL_FAULT_SANITIZE
#define HIXL_FAULT_SANITIZE 0
#endif

namespace hixl_fault {

using Clock = std::chrono::steady_clock;

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;
// Sanitizer builds: less data (TSan makes first touches of memory slow), more time.
constexpr size_t kDiv = HIXL_FAULT_SANITIZE == 2 ? 4 : HIXL_FAULT_SANITIZE == 1 ? 2 : 1;
constexpr int kSlow = HIXL_FAULT_SANITIZE == 0 ? 1 : 4;
// The transfer each scenario puts in flight.
constexpr size_t kBig = 16 * kMiB / kDiv;
constexpr int kConnectMs = 5000 * kSlow;
// Fast heartbeats (both ends), for scenarios that measure how soon a dead
// or hung peer is noticed: after ~500 ms (~1.5 s in sanitizer builds).
inline std::vector<std::string> FastHeartbeats() {
  return {"HeartbeatIntervalMs=100",
          "HeartbeatMisses=" + std::to_string(HIXL_FAULT_SANITIZE == 0 ? 5 : 15)};
}
// Heartbeats for scenarios in which the link must stay alive through the
// fault (a loaded machine must not make it look dead): 2 s (5 s).
inline std::vector<std::string> TolerantHeartbeats() {
  return {"HeartbeatIntervalMs=200",
          "HeartbeatMisses=" + std::to_string(HIXL_FAULT_SANITIZE == 0 ? 10 : 25)};
}
// What "noticed within the heartbeat bound" allows: generous, never tight.
constexpr int kDetectBoundMs = 5000 * kSlow;

inline long MsSince(Clock::time_point t) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}
inline void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
inline std::string Num(uint64_t v) { return std::to_string(v); }
inline bool IsErr(const std::string& reply) { return reply.rfind("ERR", 0) == 0; }
// Prints a measured time (and records it as a test property).
void Measured(const std::string& what, long ms);

// Both directions a scenario runs: WRITE (A -> B) and READ (B -> A).
enum class Op { kWrite, kRead };
inline const char* OpName(Op op) { return op == Op::kWrite ? "Write" : "Read"; }
inline std::string OpParamName(const ::testing::TestParamInfo<Op>& i) { return OpName(i.param); }
inline void PrintTo(Op op, std::ostream* os) { *os << OpName(op); }

// One peer command run on its own thread (the peer's TransferSync blocks its
// command loop), timed from just before it is sent until its reply.
class Background {
 public:
  Background(hixl_test::PeerProcess* p, std::string cmd, int timeout_ms);
  ~Background() { Join(); }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  bool done() const { return done_.load(); }
  // Waits for the reply (bounded by the command's own timeout).
  const std::string& Join();
  long ms() const { return ms_; }

 private:
  std::thread th_;
  std::atomic<bool> done_{false};
  std::string reply_;
  long ms_ = -1;
};

class FaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  void SetUp() override;
  void TearDown() override;

  // A peer in ns listening on addr (":0" for any port); nullptr on failure.
  hixl_test::PeerProcess* StartPeer(const std::string& ns, const std::string& addr,
                                    std::vector<std::string> opts = {});
  // Starts A, B and C with their regions (n bytes each, see above).
  void StartTrio(size_t n, std::vector<std::string> a_opts, std::vector<std::string> b_opts,
                 const std::string& b_listen = std::string(kAddrB) + ":0");
  // (Re)creates B's regions (after B was restarted too).
  void SetUpTargetRegions();
  // The transfer of the scenario: WRITE A.src -> B.dst or READ B.src -> A.in,
  // all n bytes, as a peer command with a TransferSync timeout.
  std::string TransferCmd(Op op, int timeout_ms) const;
  // Zeroes the destination of op (B.dst or A.in).
  void ClearDestination(Op op);
  // Expects the destination of op to hold exactly the source's bytes.
  void ExpectDelivered(Op op);
  // The process and address of op's destination region.
  pid_t DestPid(Op op) const;
  uintptr_t DestAddr(Op op) const { return op == Op::kWrite ? b_dst_ : a_in_; }
  // Hash of the destination region, read through its peer's command.
  std::string DestHash(Op op);
  // Connects A to B (bounded) and checks the link is tcp.
  void ConnectAB();
  // Polls (every 2 ms, at most timeout_ms) until at least `blocks` blocks of
  // 64 KiB of op's destination are written; returns how many there were.
  long WaitProgress(Op op, long blocks, int timeout_ms);
  // Canary guards of every `reg` region intact, B.src and B.other unchanged.
  void ExpectNothingOutside();
  // C writes 1 MiB of fresh data into B.cdst (connecting first if needed):
  // B keeps serving another initiator.
  void ExpectTargetServesOthers();
  // A drops the link if it still has one and connects again; a full
  // transfer of op then delivers every byte.
  void ExpectReconnectWorks(Op op);
  // Expects that a transfer over A's existing link to B works, unless that
  // link is no longer reported CONNECTED (then the application knows it must
  // reconnect, and a reconnect must work).
  void ExpectLinkUsableOrReported(Op op);

  // SIGSTOP / SIGCONT a peer (TearDown resumes every stopped one).
  void Freeze(hixl_test::PeerProcess& p);
  void Thaw(hixl_test::PeerProcess& p);

  static Tools tools_;
  static std::string skip_;
  std::unique_ptr<FaultNet> net_;
  std::vector<std::unique_ptr<hixl_test::PeerProcess>> peers_;
  std::set<pid_t> frozen_;
  std::vector<std::unique_ptr<Background>> bg_;  // joined before the peers end

  hixl_test::PeerProcess* a_ = nullptr;
  hixl_test::PeerProcess* b_ = nullptr;
  hixl_test::PeerProcess* c_ = nullptr;
  size_t n_ = 0;
  uint64_t seed_ = 1000;  // fresh pattern seeds
  uint64_t a_src_seed_ = 0, b_src_seed_ = 0;
  uintptr_t a_in_ = 0, b_dst_ = 0, b_src_ = 0, b_other_ = 0, b_cdst_ = 0;
  std::string a_src_hash_, b_src_hash_, b_other_hash_;
};

// The fixture's SetUp skips when the environment cannot host the tests, and
// StartTrio stops the test on failure; test bodies call this after it.
#define FAULT_START_TRIO(...)                     \
  do {                                            \
    StartTrio(__VA_ARGS__);                       \
    if (HasFatalFailure() || IsSkipped()) return; \
  } while (0)

}  // namespace hixl_fault

#endif  // HIXL_TESTS_FAULT_FAULT_FIXTURE_H_
