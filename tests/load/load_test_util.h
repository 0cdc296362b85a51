// tests/load/load_test_util.h — test-side helpers of the load tests
// (load_test.cc, bounds_test.cc): which build this is (the counts shrink
// under sanitizers), environment overrides, a fleet of hixl_load_peer
// processes that are all ended (and their exit status checked) when the test
// ends, and the check of a target's notification accounting.
#ifndef HIXL_TESTS_LOAD_LOAD_TEST_UTIL_H_
#define HIXL_TESTS_LOAD_LOAD_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../peer_process.h"
#include "load_common.h"

#ifndef HIXL_LOAD_SANITIZE
#error "HIXL_LOAD_SANITIZE must be the build's HIXL_SANITIZE value (\"\", address, thread)"
#endif

namespace hixl_load {

using Clock = std::chrono::steady_clock;
using hixl_test::PeerLaunch;
using hixl_test::PeerProcess;

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;

enum class Build { kRelease, kAsan, kTsan };
constexpr Build ThisBuild() {
  constexpr std::string_view s = HIXL_LOAD_SANITIZE;
  return s == "address" ? Build::kAsan : s == "thread" ? Build::kTsan : Build::kRelease;
}
constexpr bool Sanitized() { return ThisBuild() != Build::kRelease; }
inline const char* BuildName() {
  return ThisBuild() == Build::kAsan ? "asan" : ThisBuild() == Build::kTsan ? "tsan" : "release";
}

// An unsigned number from the environment, or def when unset or malformed.
inline uint64_t EnvU64(const char* name, uint64_t def) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  uint64_t x = std::strtoull(v, &end, 10);
  return *end == '\0' ? x : def;
}

inline long long MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

inline std::string LinkParamName(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

// Processes of one test. End() (also run by the destructor) ends them in
// reverse start order (initiators before their target) and expects each to
// exit 0: a sanitizer report or a crash in any of them fails the test.
class Fleet {
 public:
  ~Fleet() { End(); }

  // A hixl_load_peer listening on 127.0.0.1:0 with `options` (Key=Value).
  PeerProcess* Start(const std::vector<std::string>& options = {}) {
    PeerLaunch l;
    l.options = options;
    procs_.push_back(std::make_unique<PeerProcess>(l));
    if (!procs_.back()->Start()) return nullptr;
    return procs_.back().get();
  }

  void End() {
    for (auto it = procs_.rbegin(); it != procs_.rend(); ++it) {
      PeerProcess& p = **it;
      if (!p.running()) continue;
      const pid_t pid = p.pid();
      const int st = p.CloseAndWait(60000);
      EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
          << "hixl_load_peer pid " << pid << " (" << p.engine() << ") did not exit cleanly: "
          << (st == -1          ? std::string("killed after 60 s")
              : WIFEXITED(st)   ? "exit status " + std::to_string(WEXITSTATUS(st))
              : WIFSIGNALED(st) ? "signal " + std::to_string(WTERMSIG(st))
                                : "status " + std::to_string(st))
          << " (its stderr, above, says why)";
    }
    procs_.clear();
  }

 private:
  std::vector<std::unique_ptr<PeerProcess>> procs_;
};

// Sends a command that must answer OK; returns the reply.
inline std::string MustOk(PeerProcess& p, const std::string& cmd, int timeout_ms) {
  std::string r = p.Send(cmd, timeout_ms);
  EXPECT_TRUE(hixl_test::IsOk(r)) << "\"" << cmd << "\" -> " << r;
  return r;
}

// "target" command; fills the region addresses. False (with a failure) on error.
struct TargetRegions {
  uintptr_t wa = 0, wr = 0, pat = 0, ack = 0;
  size_t slice = 0, pat_size = 0;
  uint64_t pat_seed = 0;
  // Start of initiator i's slice.
  uintptr_t SliceOf(size_t i) const { return (i % 2 == 0 ? wa : wr) + i / 2 * slice; }
};
inline bool SetUpTarget(PeerProcess& target, size_t initiators, size_t slice, size_t pat_size,
                        uint64_t pat_seed, TargetRegions& out) {
  std::ostringstream cmd;
  cmd << "target n=" << initiators << " slice=" << slice << " pat=" << pat_size
      << " patseed=" << pat_seed;
  const std::string r = target.Send(cmd.str(), 120000);
  if (!hixl_test::IsOk(r)) {
    ADD_FAILURE() << cmd.str() << " -> " << r;
    return false;
  }
  out.wa = FieldU64(r, "wa");
  out.wr = FieldU64(r, "wr");
  out.pat = FieldU64(r, "pat");
  out.ack = FieldU64(r, "ack");
  out.slice = slice;
  out.pat_size = pat_size;
  out.pat_seed = pat_seed;
  return out.wa != 0 && out.pat != 0 && out.ack != 0;
}

// The "run" command line for initiator `id` of a target set up as `t`.
inline std::string RunCommand(const std::string& target_engine, const TargetRegions& t, size_t id,
                              uint64_t count, size_t minlen, size_t maxlen, int window,
                              uint64_t seed, int64_t deadline_ms) {
  std::ostringstream o;
  o << "run id=" << id << " target=" << target_engine << " base=" << t.SliceOf(id)
    << " slice=" << t.slice << " pat=" << t.pat << " patsize=" << t.pat_size
    << " patseed=" << t.pat_seed << " ack=" << t.ack << " count=" << count << " minlen=" << minlen
    << " maxlen=" << maxlen << " window=" << window << " seed=" << seed
    << " deadline=" << deadline_ms;
  return o.str();
}

// What a "run" reply says.
struct RunResult {
  bool ok = false;
  std::string link, first;
  uint64_t issued = 0, sent = 0, writes = 0, readbacks = 0, preads = 0, bytes = 0, errors = 0;
  uint64_t ackreads = 0, ms = 0;
};
inline RunResult ParseRun(const std::string& r) {
  RunResult x;
  x.ok = hixl_test::IsOk(r);
  x.link = Field(r, "link");
  x.first = Field(r, "first");
  x.issued = FieldU64(r, "issued");
  x.sent = FieldU64(r, "sent");
  x.writes = FieldU64(r, "writes");
  x.readbacks = FieldU64(r, "readbacks");
  x.preads = FieldU64(r, "preads");
  x.bytes = FieldU64(r, "bytes");
  x.errors = FieldU64(r, "errors");
  x.ackreads = FieldU64(r, "ackreads");
  x.ms = FieldU64(r, "ms");
  return x;
}
// Expects a run to have ended with every transfer COMPLETED and checked.
inline void ExpectCleanRun(const RunResult& x, const std::string& reply, size_t id,
                           const std::string& link) {
  EXPECT_TRUE(x.ok) << "initiator " << id << ": " << reply;
  EXPECT_EQ(x.errors, 0u) << "initiator " << id << ": " << x.first;
  EXPECT_EQ(x.sent, x.issued) << "initiator " << id << ": " << reply;
  EXPECT_EQ(x.link, link.empty() ? "SHM" : link) << "initiator " << id;
}

// The target's accounting.
struct TargetStats {
  uint64_t recv = 0, distinct = 0, dup = 0, early = 0, corrupt = 0, bad = 0, bytes = 0;
  uint64_t lost = 0;  // issued by the initiators, never received
  std::string first;
};
inline TargetStats ParseStats(const std::string& r) {
  TargetStats s;
  s.recv = FieldU64(r, "recv");
  s.distinct = FieldU64(r, "distinct");
  s.dup = FieldU64(r, "dup");
  s.early = FieldU64(r, "early");
  s.corrupt = FieldU64(r, "corrupt");
  s.bad = FieldU64(r, "bad");
  s.bytes = FieldU64(r, "bytes");
  s.first = Field(r, "first");
  return s;
}

// Waits (bounded) until the target has every notification the initiators
// issued (issued[i]: all seqs initiator i ever issued to it), then expects
// none lost, none twice, none early, every hash right, and per initiator
// exactly the seqs 0..issued[i]-1.
inline TargetStats ExpectAllNotificationsAccounted(PeerProcess& target,
                                                   const std::vector<uint64_t>& issued,
                                                   int timeout_ms) {
  uint64_t total = 0;
  for (uint64_t n : issued) total += n;
  const std::string r = target.Send(
      "waitcount " + std::to_string(total) + " " + std::to_string(timeout_ms), timeout_ms + 30000);
  EXPECT_TRUE(hixl_test::IsOk(r)) << r;
  TargetStats s = ParseStats(r);
  const std::string c = target.Send("counts", 30000);
  EXPECT_TRUE(hixl_test::IsOk(c)) << c;
  std::istringstream in(hixl_test::OkValue(c));
  for (size_t i = 0; i < issued.size(); ++i) {
    std::string word;
    in >> word;
    const uint64_t distinct = std::strtoull(word.c_str(), nullptr, 10);
    const size_t slash = word.find('/');
    const uint64_t gapless =
        slash == std::string::npos ? 0 : std::strtoull(word.c_str() + slash + 1, nullptr, 10);
    if (distinct < issued[i]) s.lost += issued[i] - distinct;
    EXPECT_EQ(distinct, issued[i]) << "initiator " << i << ": notifications received (distinct)";
    EXPECT_EQ(gapless, issued[i]) << "initiator " << i << ": seqs received without a gap";
  }
  EXPECT_EQ(s.distinct, total) << r;
  EXPECT_EQ(s.lost, 0u) << r;
  EXPECT_EQ(s.dup, 0u) << s.first;
  EXPECT_EQ(s.early, 0u) << s.first;
  EXPECT_EQ(s.corrupt, 0u) << s.first;
  EXPECT_EQ(s.bad, 0u) << s.first;
  EXPECT_EQ(s.recv, s.distinct) << r;
  return s;
}

}  // namespace hixl_load

#endif  // HIXL_TESTS_LOAD_LOAD_TEST_UTIL_H_
