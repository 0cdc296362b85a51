// tests/load/load_test.cc — many-to-one load: 16 initiator processes drive
// transfers with notifications into ONE target process at once, over shm and
// over tcp (the initiators' LinkType option), and every byte and every
// notification is accounted for.
//
// Each initiator (hixl_load_peer, see load_peer.cc) keeps a few
// TransferAsync requests in flight, sizes 4 KiB .. 16 MiB (log-uniform, one in
// 16 exactly 16 MiB, one in 4 of odd length): WRITEs of fresh patterns into
// its own slice of the target's memory (half the initiators in AllocMem
// memory, half in plain registered memory), READs back of some of them, and
// READs of a pattern region the target filled; every READ is checked against
// the pattern by the initiator. Every transfer carries a notification naming
// its bytes and their hash; the target hashes the bytes the moment the
// notification appears. At the end of each round the test requires: every
// request COMPLETED; per initiator, the target received exactly the seqs it
// issued (none lost, none twice, none unknown); no notification seen before
// its data (early) and no wrong bytes (corrupt). Across rounds the target's
// and an initiator's file descriptors, threads and memory stay flat.
//
// CI mode: the counts below, scaled down under sanitizers; a release run
// stays well under a minute per transport. Soak mode, longer rounds until a
// time is up (not run in CI; the fd/thread/RSS check then spans the soak):
//
//   HIXL_LOAD_SOAK_SECONDS=3600 build/tests/load/hixl_load_tests --gtest_filter='*ManyToOne*'
//
// Other knobs (environment): HIXL_LOAD_INITIATORS (16), HIXL_LOAD_OPS
// (operations per initiator per round), HIXL_LOAD_ROUNDS (2; a soak runs at
// least this many), HIXL_LOAD_MAXLEN (largest transfer, bytes).
//
// Also here: LoadChecker.*, which feeds the target's checker wrong
// notifications on purpose and expects it to count each kind of violation —
// the many-to-one test relies on those counters.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "load_test_util.h"

namespace {

using namespace hixl_load;  // NOLINT(build/namespaces): test-local helpers

struct StressScale {
  size_t initiators = 16;
  uint64_t ops = 150;  // per initiator per round
  uint64_t rounds = 2;
  size_t maxlen = 16 * kMiB;
  size_t slice = 32 * kMiB;
  size_t pat = 32 * kMiB;
  int window = 4;
  int64_t run_deadline_ms = 120000;
  uint64_t soak_seconds = 0;
};

StressScale Scale(const std::string& link) {
  StressScale s;
  if (link == "UCX") {
    // The same operations in a quarter of the bytes: the UCX transport moves
    // 0.17 GiB/s under this load (docs/UCX.md), so 16 GiB took 95 s of the
    // suite for no more accounting than 4 GiB checks.
    s.maxlen = 4 * kMiB;
    s.slice = 8 * kMiB;
    s.pat = 8 * kMiB;
  }
  if (ThisBuild() == Build::kAsan) {
    // Every path of the release run, in fewer and smaller transfers: ASan
    // checks each access, not how many there are (this test was 160 of the
    // stage's 1,300 test-seconds at 60 operations of up to 16 MiB).
    s.ops = 32;
    s.maxlen = 4 * kMiB;
    s.slice = 8 * kMiB;
    s.pat = 8 * kMiB;
    s.run_deadline_ms = 240000;
  } else if (ThisBuild() == Build::kTsan) {
    // The same initiators at once (the races TSan looks for), in fewer
    // operations: at 40 this test was 87 of the stage's 1,000 test-seconds.
    s.ops = 24;
    s.maxlen = 4 * kMiB;
    s.slice = 8 * kMiB;
    s.pat = 8 * kMiB;
    s.run_deadline_ms = 240000;
  }
  s.initiators = std::clamp<uint64_t>(EnvU64("HIXL_LOAD_INITIATORS", s.initiators), 1, 256);
  s.ops = EnvU64("HIXL_LOAD_OPS", s.ops);
  s.rounds = std::max<uint64_t>(1, EnvU64("HIXL_LOAD_ROUNDS", s.rounds));
  s.maxlen = std::clamp<uint64_t>(EnvU64("HIXL_LOAD_MAXLEN", s.maxlen), 4 * kKiB, 64 * kMiB);
  s.slice = std::max(s.slice, 2 * s.maxlen);
  s.pat = std::max(s.pat, s.maxlen);
  s.soak_seconds = EnvU64("HIXL_LOAD_SOAK_SECONDS", 0);
  return s;
}

double GiB(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

class ManyToOne : public ::testing::TestWithParam<std::string> {};

TEST_P(ManyToOne, EveryByteAndEveryNotificationAccountedFor) {
  const std::string link = GetParam();
  const StressScale sc = Scale(link);
  // Sanitizer builds of 17 busy processes on two cores can leave a process
  // unscheduled for seconds: heartbeats there tolerate 10 s of silence
  // instead of 3 s (this test checks data and notifications, not liveness).
  std::vector<std::string> hb;
  if (Sanitized()) hb = {"HeartbeatMisses=10"};
  Fleet fleet;
  PeerProcess* target = fleet.Start(hb);
  ASSERT_NE(target, nullptr);
  TargetRegions regions;
  ASSERT_TRUE(SetUpTarget(*target, sc.initiators, sc.slice, sc.pat, 0xFEED, regions));
  std::vector<PeerProcess*> inits;
  for (size_t i = 0; i < sc.initiators; ++i) {
    std::vector<std::string> opts = hb;
    opts.push_back("LinkType=" + link);
    PeerProcess* p = fleet.Start(opts);
    ASSERT_NE(p, nullptr) << "initiator " << i;
    ASSERT_TRUE(hixl_test::IsOk(MustOk(*p, "connect " + target->engine() + " 10000", 30000)));
    ASSERT_EQ(MustOk(*p, "linktype " + target->engine(), 10000), "OK " + link);
    inits.push_back(p);
  }
  std::cout << "[ load ] " << link << " (" << BuildName() << "): " << sc.initiators
            << " initiators -> 1 target, " << sc.ops << " operations each per round, sizes 4 KiB.."
            << sc.maxlen / kKiB << " KiB, window " << sc.window
            << (sc.soak_seconds ? ", soak " + std::to_string(sc.soak_seconds) + " s" : "")
            << std::endl;

  std::vector<uint64_t> issued(sc.initiators, 0);
  Usage target_base, init_base;
  uint64_t total_bytes = 0, total_sent = 0, total_ms = 0;
  TargetStats last;
  const auto t_start = Clock::now();
  for (uint64_t round = 0;; ++round) {
    if (round >= sc.rounds && (sc.soak_seconds == 0 ||
                               MsSince(t_start) >= static_cast<long long>(sc.soak_seconds) * 1000))
      break;
    std::vector<std::string> replies(sc.initiators);
    std::vector<std::thread> threads;
    const auto t0 = Clock::now();
    for (size_t i = 0; i < sc.initiators; ++i) {
      const std::string cmd = RunCommand(target->engine(), regions, i, sc.ops, 4 * kKiB, sc.maxlen,
                                         sc.window, round * 1000 + 7, sc.run_deadline_ms);
      threads.emplace_back([&, i, cmd] {
        replies[i] = inits[i]->Send(cmd, static_cast<int>(sc.run_deadline_ms) + 60000);
      });
    }
    for (auto& t : threads) t.join();
    const long long ms = MsSince(t0);
    uint64_t bytes = 0, sent = 0, writes = 0, rbs = 0, prs = 0, ackreads = 0;
    for (size_t i = 0; i < sc.initiators; ++i) {
      const RunResult x = ParseRun(replies[i]);
      ExpectCleanRun(x, replies[i], i, link);
      issued[i] += x.issued;
      bytes += x.bytes;
      sent += x.sent;
      writes += x.writes;
      rbs += x.readbacks;
      prs += x.preads;
      ackreads += x.ackreads;
    }
    last = ExpectAllNotificationsAccounted(*target, issued, 60000);
    total_bytes += bytes;
    total_sent += sent;
    total_ms += static_cast<uint64_t>(ms);
    std::cout << "[ load ] " << link << " round " << round << ": " << sent << " transfers ("
              << writes << " writes, " << rbs << " read-backs, " << prs << " pattern reads), "
              << std::fixed << std::setprecision(2) << GiB(bytes) << " GiB in " << ms << " ms ("
              << GiB(bytes) / (static_cast<double>(ms) / 1000.0) << " GiB/s), " << ackreads
              << " ack reads; target: received " << last.recv << " distinct " << last.distinct
              << " lost " << last.lost << " duplicates " << last.dup << " early " << last.early
              << " corrupt " << last.corrupt << " bad " << last.bad << std::endl;
    if (::testing::Test::HasFailure()) break;
    if (round == 0) {
      target_base = ReadUsage(target->pid());
      init_base = ReadUsage(inits[0]->pid());
    }
  }
  ASSERT_FALSE(::testing::Test::HasFailure());

  // Nothing arrives late or twice once the load has stopped.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const TargetStats after = ParseStats(MustOk(*target, "stats", 10000));
  EXPECT_EQ(after.recv, last.recv) << "notifications arrived after the load ended";
  EXPECT_EQ(after.dup, 0u) << after.first;

  // Resources after the last round against after the first one.
  const Usage target_end = ReadUsage(target->pid());
  const Usage init_end = ReadUsage(inits[0]->pid());
  std::cout << "[ load ] " << link << " target    after round 0: " << UsageString(target_base)
            << "\n[ load ] " << link << " target    at the end:    " << UsageString(target_end)
            << "\n[ load ] " << link << " initiator after round 0: " << UsageString(init_base)
            << "\n[ load ] " << link << " initiator at the end:    " << UsageString(init_end)
            << std::endl;
  if (sc.rounds > 1 || sc.soak_seconds > 0) {
    for (const auto& [name, base, end] : {std::tuple{"target", target_base, target_end},
                                          std::tuple{"initiator", init_base, init_end}}) {
      EXPECT_LE(end.fds, base.fds + 8) << name;
      EXPECT_LE(end.threads, base.threads + 4) << name;
      // Transfer buffers of up to maxlen come and go in every initiator; the
      // target's registered memory is all touched in round 0.
      EXPECT_LE(end.rss_kib, base.rss_kib + static_cast<long>((64 * kMiB + 4 * sc.maxlen) / 1024))
          << name;
    }
  }

  std::cout << "[ load ] " << link << " total: " << sc.initiators << " initiators, " << total_sent
            << " transfers, " << std::fixed << std::setprecision(2) << GiB(total_bytes)
            << " GiB, notifications sent " << total_sent << " received " << after.recv << " lost "
            << last.lost << " duplicates " << after.dup << " early " << after.early << " corrupt "
            << after.corrupt << "; " << total_ms << " ms under load ("
            << GiB(total_bytes) / (static_cast<double>(std::max<uint64_t>(total_ms, 1)) / 1000.0)
            << " GiB/s)" << std::endl;
  ::testing::Test::RecordProperty("initiators", std::to_string(sc.initiators));
  ::testing::Test::RecordProperty("transfers", std::to_string(total_sent));
  ::testing::Test::RecordProperty("bytes", std::to_string(total_bytes));
  ::testing::Test::RecordProperty("notifications_received", std::to_string(after.recv));
  ::testing::Test::RecordProperty("load_ms", std::to_string(total_ms));
  EXPECT_EQ(after.recv, total_sent);
  fleet.End();
}

INSTANTIATE_TEST_SUITE_P(Transports, ManyToOne, ::testing::ValuesIn(hixl_test::LoadLinkTypes()),
                         LinkParamName);

// ---------------------------------------------------------------------------
// The checker itself: each kind of violation the many-to-one test asserts
// is absent is counted when it does happen.

TEST(LoadChecker, CountsEveryKindOfViolation) {
  Fleet fleet;
  PeerProcess* target = fleet.Start();
  ASSERT_NE(target, nullptr);
  TargetRegions t;
  ASSERT_TRUE(SetUpTarget(*target, 2, 256 * kKiB, 64 * kKiB, 0xC0DE, t));
  PeerProcess* init = fleet.Start({"LinkType=TCP"});
  ASSERT_NE(init, nullptr);
  const std::string te = target->engine();
  ASSERT_TRUE(hixl_test::IsOk(MustOk(*init, "connect " + te, 10000)));

  // A clean run first: all accounted for.
  const std::string r =
      MustOk(*init, RunCommand(te, t, 0, 40, 4 * kKiB, 64 * kKiB, 4, 1, 60000), 90000);
  const RunResult x = ParseRun(r);
  ExpectCleanRun(x, r, 0, "TCP");
  ExpectAllNotificationsAccounted(*target, {x.issued, 0}, 30000);
  ASSERT_FALSE(::testing::Test::HasFailure());

  auto notify = [&](const std::string& name, const std::string& msg, const std::string& extra) {
    MustOk(*init, "notify target=" + te + " name=" + name + " msg=" + msg + extra, 20000);
  };
  auto stats = [&] { return ParseStats(MustOk(*target, "stats", 10000)); };
  auto wait_recv = [&](uint64_t n) {
    return ParseStats(MustOk(*target, "waitcount " + std::to_string(n) + " 10000", 20000));
  };
  const uint64_t base = stats().recv;

  // A repeated seq of initiator 0.
  notify("w.0.3", "0:8:0000000000000000", "");
  TargetStats s = wait_recv(base);  // received counts duplicates too
  for (int i = 0; i < 1000 && s.recv < base + 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = stats();
  }
  EXPECT_EQ(s.dup, 1u) << s.first;

  // Bytes that never match their hash (initiator 1's slice holds zeros).
  const std::string wrong = hixl_test::HashHex(PatternRangeHash(77, 0, 4096));
  notify("w.1.0", "0:4096:" + wrong, "");
  s = wait_recv(s.distinct + 1);
  EXPECT_EQ(s.corrupt, 1u) << s.first;
  EXPECT_EQ(s.early, 0u) << s.first;

  // Data that lands 100 ms after its notification was queued.
  const std::string h = hixl_test::HashHex(PatternRangeHash(88, 0, 4096));
  notify("w.1.1", "4096:4096:" + h,
         " remote=" + std::to_string(t.SliceOf(1) + 4096) + " len=4096 seed=88 delay=100");
  s = wait_recv(s.distinct + 1);
  EXPECT_EQ(s.early, 1u) << s.first;

  // Not in the load format, an unknown initiator, bytes outside the region.
  const uint64_t bad_before = s.bad;
  notify("hello", "0:1:0000000000000000", "");
  notify("w.9.0", "0:1:0000000000000000", "");
  notify("w.0.999", "0:" + std::to_string(1 * kMiB) + ":0000000000000000", "");
  for (int i = 0; i < 1000 && s.bad < bad_before + 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = stats();
  }
  EXPECT_EQ(s.bad, bad_before + 3) << s.first;

  // A gap: initiator 1 sent seqs 0 and 1 only (above); seq 5 leaves 2..4 lost.
  const uint64_t zero = 0;  // bytes [0, 8) of initiator 1's slice were never written
  notify("w.1.5", "0:8:" + hixl_test::HashHex(hixl_test::Fnv1a64(&zero, 8)), "");
  s = wait_recv(s.distinct + 1);
  const std::string c = MustOk(*target, "counts", 10000);
  EXPECT_EQ(c, "OK " + std::to_string(x.issued) + "/" + std::to_string(x.issued) + " 3/2") << c;
  fleet.End();
}

}  // namespace
