// tests/datadist/dd_harness.h — the test side of the LLM-DataDist behaviour
// tests: DdPeer drives one llm_datadist_test_peer process (see
// datadist_peer.cc for its commands) through hixl_test::PeerProcess, and
// DdTest is the fixture that spawns peers for one link type (SHM or TCP),
// stops/continues them and never leaves one behind.
#ifndef HIXL_TESTS_DATADIST_DD_HARNESS_H_
#define HIXL_TESTS_DATADIST_DD_HARNESS_H_

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "dd_common.h"
#include "llm_datadist/llm_datadist.h"
#include "peer_process.h"

namespace dd_test {

// llm.SyncKvCacheWaitTime of every instance a test does not set one for:
// generous, so that a transfer on a loaded machine is not cut short by the
// library's 1 s default. Tests of that wait set their own (wait_ms).
inline constexpr int kHarnessWaitMs = 30000;

// llm.GlobalResourceConfig JSON carrying hixl engine options.
std::string ResourceConfig(const std::string& link, int heartbeat_ms = 0);
// Initialize options of an in-process instance: link type, optional
// heartbeat, optional listen address ("" = link out only).
std::map<std::string, std::string> InstanceOptions(const std::string& link,
                                                   const std::string& listen, int heartbeat_ms = 0,
                                                   int wait_ms = 0);

// One peer reply: "OK <value>" or "ERR <code> <msg>".
struct Res {
  bool ok = false;
  std::string code;   // "LLM_..." for failures ("" when ok)
  std::string msg;    // failure message
  std::string value;  // text after "OK "
  std::string raw;
};
Res ParseReply(const std::string& line);
std::ostream& operator<<(std::ostream& os, const Res& r);

struct PeerSpec {
  uint64_t cluster = 1;
  std::string role = "prompt";
  std::string link;            // "SHM" / "TCP"
  bool listen = true;          // false: llm.ListenIpInfo not set
  int heartbeat_ms = 0;        // HeartbeatIntervalMs (0: default)
  int wait_ms = 0;             // llm.SyncKvCacheWaitTime (0: kHarnessWaitMs)
  std::vector<std::string> extra;  // further "Key=Value" Initialize options
};

struct CacheRef {
  int64_t id = 0;
  std::vector<uint64_t> addrs;
};

struct Event {
  std::string kind;  // pulled / pushed / lease_expired
  uint64_t peer = 0;
  int64_t cache = 0;
  std::string key;  // "c:r:m" or "none"
  std::vector<uint64_t> blocks;
  int64_t batch = -1;
  std::string layers;  // "a:b"
  std::string tag;
};
std::ostream& operator<<(std::ostream& os, const Event& e);

class DdPeer {
 public:
  explicit DdPeer(PeerSpec spec);
  bool Start();
  const std::string& addr() const { return proc_->engine(); }
  uint64_t cluster() const { return spec_.cluster; }
  pid_t pid() const { return proc_->pid(); }
  bool running() const { return proc_->running(); }
  hixl_test::PeerProcess& proc() { return *proc_; }

  // Raw command; the reply parsed.
  Res Cmd(const std::string& line, int timeout_ms = 20000);
  // Helpers below add a gtest failure when the peer answers ERR.
  CacheRef Cache(const std::string& name, uint32_t num_tensors, const std::string& dtype,
                 const std::vector<int64_t>& shape, const std::string& opts = "");
  void Fill(const std::string& name, uint64_t seed);
  void Fill(const std::string& name, uint64_t seed, size_t t0, size_t t1);
  std::vector<std::string> HashTensors(const std::string& name);
  std::string HashBlocks(const std::string& name, size_t t0, size_t t1,
                         const std::vector<uint64_t>& blocks);
  std::string HashEntry(const std::string& name, size_t t0, size_t t1, size_t entry,
                        int64_t size = -1);
  std::string HashRange(const std::string& name, size_t t0, size_t t1, size_t off, size_t len);
  Res Link(const DdPeer& to, int timeout_ms = 3000);
  Res Link(uint64_t cluster, const std::string& addr, int timeout_ms = 3000);
  Res Unlink(const DdPeer& to, bool force = false);
  // "xfer OP NAME ARGS"
  Res Xfer(const std::string& op, const std::string& name, const std::string& args,
           int timeout_ms = 20000);
  // Drains events, waiting (bounded) until at least min_count arrived.
  std::vector<Event> Events(size_t min_count = 0, int wait_ms = 0);

 private:
  PeerSpec spec_;
  std::unique_ptr<hixl_test::PeerProcess> proc_;
};

// "pulled"/"pushed" events that name `cache`.
std::vector<Event> EventsOf(const std::vector<Event>& evs, const std::string& kind, int64_t cache);

// An event's block list names `moved`: in the mover's order, or ascending
// (the header allows a long scattered list to arrive as a bitmap).
bool SameBlocks(const std::vector<uint64_t>& event_blocks, const std::vector<uint64_t>& moved);

// Distinct random values from [0, n), shuffled (deterministic in seed).
std::vector<uint64_t> RandomBlocks(uint64_t seed, size_t count, uint64_t n);
// Values of [0, n) not in `used`, ascending.
std::vector<uint64_t> Complement(const std::vector<uint64_t>& used, uint64_t n);
std::vector<uint64_t> Range(uint64_t first, uint64_t count);
std::vector<uint64_t> Concat(std::vector<uint64_t> a, const std::vector<uint64_t>& b);

long long ElapsedMs(std::chrono::steady_clock::time_point t0);
void SleepMs(int ms);
// /proc/<pid>/stat state letter ('T' when stopped), '?' when unknown.
char ProcState(pid_t pid);

// Fixture: the parameter is the link type ("SHM" / "TCP").
class DdTest : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& link() const { return link_; }
  // Spawns a peer with spec.link = this test's link type.
  DdPeer* Spawn(uint64_t cluster, const std::string& role, PeerSpec spec = {});
  void Stop(DdPeer& p);  // SIGSTOP and wait until stopped
  void Cont(DdPeer& p);  // SIGCONT
  void TearDown() override;

  std::string link_ = GetParam();
  std::vector<std::unique_ptr<DdPeer>> peers_;
  std::set<pid_t> stopped_;
};

std::string LinkParamName(const ::testing::TestParamInfo<std::string>& i);

}  // namespace dd_test

// Assertions on peer replies and in-process statuses, printing the whole text.
#define DD_EXPECT_OK(res_expr)                                              \
  do {                                                                      \
    const ::dd_test::Res dd_r_ = (res_expr);                                \
    EXPECT_TRUE(dd_r_.ok) << #res_expr << " -> " << dd_r_.raw;             \
  } while (0)
#define DD_ASSERT_OK(res_expr)                                              \
  do {                                                                      \
    const ::dd_test::Res dd_r_ = (res_expr);                                \
    ASSERT_TRUE(dd_r_.ok) << #res_expr << " -> " << dd_r_.raw;             \
  } while (0)
#define DD_EXPECT_ERR(code_name, res_expr)                                   \
  do {                                                                       \
    const ::dd_test::Res dd_r_ = (res_expr);                                 \
    EXPECT_EQ(dd_r_.code, (code_name)) << #res_expr << " -> " << dd_r_.raw; \
    EXPECT_FALSE(dd_r_.msg.empty()) << #res_expr << ": no message";          \
  } while (0)
#define DD_EXPECT_NOT_OK_MSG(res_expr)                                       \
  do {                                                                       \
    const ::dd_test::Res dd_r_ = (res_expr);                                 \
    EXPECT_FALSE(dd_r_.ok) << #res_expr << " unexpectedly succeeded";        \
    EXPECT_FALSE(dd_r_.msg.empty()) << #res_expr << ": no message";          \
  } while (0)
#define LLM_EXPECT_OK(expr)                                                   \
  do {                                                                        \
    const ::llm_datadist::Status llm_s_ = (expr);                             \
    EXPECT_TRUE(llm_s_.ok()) << #expr << " -> " << llm_s_.ToString();       \
  } while (0)
#define LLM_ASSERT_OK(expr)                                                   \
  do {                                                                        \
    const ::llm_datadist::Status llm_s_ = (expr);                             \
    ASSERT_TRUE(llm_s_.ok()) << #expr << " -> " << llm_s_.ToString();       \
  } while (0)
#define LLM_EXPECT_CODE(code_, expr)                                                 \
  do {                                                                               \
    const ::llm_datadist::Status llm_s_ = (expr);                                    \
    EXPECT_EQ(::llm_datadist::StatusCodeName(llm_s_.code()),                         \
              std::string(::llm_datadist::StatusCodeName(code_)))                    \
        << #expr << " -> " << llm_s_.ToString();                                     \
  } while (0)

#endif  // HIXL_TESTS_DATADIST_DD_HARNESS_H_
