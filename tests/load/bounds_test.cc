// tests/load/bounds_test.cc — resources stay bounded under load: the file
// descriptors (/proc/PID/fd), threads (/proc/PID/status Threads), resident
// memory (VmRSS) and mappings (/proc/PID/maps; not under TSan) of targets
// and initiators return to (within a small constant of) their warm-up
// values after
//   - 10^4 Connect / transfer / Disconnect cycles: one initiator against one
//     target (Disconnect(remote, timeout) then Connect again), one initiator
//     against four targets, four initiators at once against one target;
//   - 10^5 transfers with notifications from one initiator into one target
//     (every notification checked by the target as in load_test.cc).
// Each test runs over shm and over tcp (the initiators' LinkType option).
// Sanitizer builds do a tenth of the cycles and transfers; the assertions
// stay. Values are read after a warm-up and at the end (polled for a few
// seconds, since the target tears a link down after the initiator has
// left), and only bounded, never compared exactly.
//
// Environment: HIXL_LOAD_CYCLES and HIXL_LOAD_TRANSFERS replace the counts
// (e.g. for a longer soak of the same checks).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "load_test_util.h"

namespace {

using namespace hixl_load;  // NOLINT(build/namespaces): test-local helpers

constexpr long kFdSlack = 4;
constexpr long kThreadSlack = 2;
// Mappings: TSan's runtime maps its metadata lazily as memory is touched,
// so /proc/PID/maps is bounded only in the other builds.
constexpr bool kCheckMaps = ThisBuild() != Build::kTsan;
constexpr long kMapsSlack = Sanitized() ? 64 : 16;  // ASan's allocator maps more
// RSS may grow this much (KiB) between warm-up and end: a leak of 200 bytes
// per transfer or 2 KiB per connect cycle is larger.
constexpr long kRssSlackKiB = Sanitized() ? 48 * 1024 : 16 * 1024;

uint64_t Cycles() { return EnvU64("HIXL_LOAD_CYCLES", Sanitized() ? 1000 : 10000); }
uint64_t Transfers() { return EnvU64("HIXL_LOAD_TRANSFERS", Sanitized() ? 10000 : 100000); }
constexpr int kSlow = Sanitized() ? 4 : 1;

struct Watched {
  std::string name;
  pid_t pid = 0;
  Usage base;
};

bool Within(const Usage& base, const Usage& now) {
  return now.fds <= base.fds + kFdSlack && now.threads <= base.threads + kThreadSlack &&
         (!kCheckMaps || now.maps <= base.maps + kMapsSlack) &&
         now.rss_kib <= base.rss_kib + kRssSlackKiB;
}

void TakeBaseline(std::vector<Watched>& w) {
  // Let the warm-up's last links finish closing on the target side.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (auto& x : w) x.base = ReadUsage(x.pid);
}

// Polls (up to 10 s) until every process is back within bounds of its
// baseline, then asserts on the last reading and prints both.
void ExpectFlat(const std::vector<Watched>& w, const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::seconds(10 * kSlow);
  std::vector<Usage> now(w.size());
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < w.size(); ++i) {
      now[i] = ReadUsage(w[i].pid);
      all = all && Within(w[i].base, now[i]);
    }
    if (all || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (size_t i = 0; i < w.size(); ++i) {
    const Usage& b = w[i].base;
    const Usage& n = now[i];
    std::cout << "[ bounds ] " << what << " " << w[i].name << ": after warm-up " << UsageString(b)
              << "\n[ bounds ] " << what << " " << w[i].name << ": at the end     "
              << UsageString(n) << std::endl;
    ASSERT_GT(b.fds, 0) << "could not read /proc/" << w[i].pid;
    EXPECT_LE(n.fds, b.fds + kFdSlack) << w[i].name << ": file descriptors grew";
    EXPECT_LE(n.threads, b.threads + kThreadSlack) << w[i].name << ": threads grew";
    if (kCheckMaps) {
      EXPECT_LE(n.maps, b.maps + kMapsSlack) << w[i].name << ": mappings grew";
    }
    EXPECT_LE(n.rss_kib, b.rss_kib + kRssSlackKiB) << w[i].name << ": resident memory grew";
  }
}

// ---------------------------------------------------------------------------
// Connect / Disconnect cycles.

struct Shape {
  const char* name;
  size_t initiators;
  size_t targets;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }
const Shape kShapes[] = {{"OneToOne", 1, 1}, {"OneToFour", 1, 4}, {"FourToOne", 4, 1}};

class ConnectCycles : public ::testing::TestWithParam<std::tuple<std::string, Shape>> {};

TEST_P(ConnectCycles, ResourcesStayFlat) {
  const std::string link = std::get<0>(GetParam());
  const Shape shape = std::get<1>(GetParam());
  const uint64_t total = Cycles();
  const uint64_t per_init = std::max<uint64_t>(1, total / shape.initiators);
  const uint64_t rounds = std::max<uint64_t>(1, per_init / shape.targets);
  const uint64_t warm = std::max<uint64_t>(1, rounds / 50);
  Fleet fleet;
  std::vector<Watched> watched;
  std::string targets, remotes;
  for (size_t j = 0; j < shape.targets; ++j) {
    PeerProcess* t = fleet.Start();
    ASSERT_NE(t, nullptr);
    TargetRegions r;
    ASSERT_TRUE(SetUpTarget(*t, shape.initiators, 64 * kKiB, 64 * kKiB, 5, r));
    targets += (j ? "," : "") + t->engine();
    // Initiator i uses bytes [4096*i, 4096*(i+1)) of the first slice.
    remotes += (j ? "," : "") + std::to_string(r.SliceOf(0));
    watched.push_back({"target " + std::to_string(j), t->pid(), {}});
  }
  std::vector<PeerProcess*> inits;
  for (size_t i = 0; i < shape.initiators; ++i) {
    PeerProcess* p = fleet.Start({"LinkType=" + link});
    ASSERT_NE(p, nullptr);
    inits.push_back(p);
    watched.push_back({"initiator " + std::to_string(i), p->pid(), {}});
  }
  auto run_all = [&](uint64_t n) {
    std::vector<std::string> replies(inits.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < inits.size(); ++i) {
      std::string rem;
      for (const auto& a : SplitList(remotes))
        rem += (rem.empty() ? "" : ",") + std::to_string(std::stoull(a) + 4096 * i);
      const std::string cmd =
          "cycles targets=" + targets + " remotes=" + rem + " n=" + std::to_string(n) + " len=4096";
      const int timeout =
          static_cast<int>(std::min<uint64_t>(60000 + n * shape.targets * 50 * kSlow, 590000));
      threads.emplace_back([&, i, cmd, timeout] { replies[i] = inits[i]->Send(cmd, timeout); });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < inits.size(); ++i)
      EXPECT_TRUE(hixl_test::IsOk(replies[i])) << "initiator " << i << ": " << replies[i];
  };
  run_all(warm);
  ASSERT_FALSE(::testing::Test::HasFailure());
  TakeBaseline(watched);
  const auto t0 = Clock::now();
  run_all(rounds);
  const long long ms = MsSince(t0);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const uint64_t connects = rounds * shape.targets * shape.initiators;
  std::cout << "[ bounds ] " << link << " " << shape.name << ": " << connects
            << " connect/transfer/disconnect cycles in " << ms << " ms ("
            << (ms > 0 ? connects * 1000 / static_cast<uint64_t>(ms) : 0) << "/s)" << std::endl;
  ::testing::Test::RecordProperty("cycles", std::to_string(connects));
  ASSERT_NO_FATAL_FAILURE(ExpectFlat(watched, link + " " + shape.name));
  // The links still work after all that.
  for (PeerProcess* p : inits) {
    const std::string first = SplitList(targets).front();
    EXPECT_TRUE(hixl_test::IsOk(MustOk(*p, "connect " + first, 10000)));
    EXPECT_EQ(MustOk(*p, "linktype " + first, 10000), "OK " + link);
  }
  fleet.End();
}

std::string CyclesName(const ::testing::TestParamInfo<std::tuple<std::string, Shape>>& i) {
  return std::get<0>(i.param) + "_" + std::get<1>(i.param).name;
}
INSTANTIATE_TEST_SUITE_P(Transports, ConnectCycles,
                         ::testing::Combine(::testing::ValuesIn(hixl_test::LoadLinkTypes()),
                                            ::testing::ValuesIn(kShapes)),
                         CyclesName);

// ---------------------------------------------------------------------------
// 10^5 transfers with notifications.

class ManyTransfers : public ::testing::TestWithParam<std::string> {};

TEST_P(ManyTransfers, ResourcesStayFlat) {
  const std::string link = GetParam();
  const uint64_t count = Transfers();
  const uint64_t warm = std::max<uint64_t>(1, count / 10);
  Fleet fleet;
  PeerProcess* target = fleet.Start();
  ASSERT_NE(target, nullptr);
  TargetRegions r;
  ASSERT_TRUE(SetUpTarget(*target, 1, 4 * kMiB, 1 * kMiB, 9, r));
  PeerProcess* init = fleet.Start({"LinkType=" + link});
  ASSERT_NE(init, nullptr);
  ASSERT_TRUE(hixl_test::IsOk(MustOk(*init, "connect " + target->engine(), 10000)));
  std::vector<Watched> watched = {{"target", target->pid(), {}}, {"initiator", init->pid(), {}}};
  std::vector<uint64_t> issued(1, 0);
  auto run = [&](uint64_t n, uint64_t seed) {
    const int64_t deadline = static_cast<int64_t>(std::min<uint64_t>(60000 + n * kSlow, 540000));
    const std::string reply =
        init->Send(RunCommand(target->engine(), r, 0, n, 64, 64 * kKiB, 8, seed, deadline),
                   static_cast<int>(deadline) + 30000);
    const RunResult x = ParseRun(reply);
    ExpectCleanRun(x, reply, 0, link);
    issued[0] += x.issued;
    return x;
  };
  run(warm, 1);
  ExpectAllNotificationsAccounted(*target, issued, 30000);
  ASSERT_FALSE(::testing::Test::HasFailure());
  TakeBaseline(watched);
  const RunResult x = run(count, 2);
  const TargetStats s = ExpectAllNotificationsAccounted(*target, issued, 60000);
  std::cout << "[ bounds ] " << link << " transfers: " << x.sent << " (" << x.writes << " writes, "
            << x.readbacks << " read-backs, " << x.preads << " pattern reads, " << x.bytes / kMiB
            << " MiB) in " << x.ms << " ms (" << (x.ms > 0 ? x.sent * 1000 / x.ms : 0)
            << "/s); target received " << s.recv << " lost " << s.lost << " duplicates " << s.dup
            << " early " << s.early << " corrupt " << s.corrupt << std::endl;
  ::testing::Test::RecordProperty("transfers", std::to_string(x.sent));
  ASSERT_FALSE(::testing::Test::HasFailure());
  ASSERT_NO_FATAL_FAILURE(ExpectFlat(watched, link + " transfers"));
  fleet.End();
}

INSTANTIATE_TEST_SUITE_P(Transports, ManyTransfers, ::testing::ValuesIn(hixl_test::LoadLinkTypes()),
                         LinkParamName);

}  // namespace
