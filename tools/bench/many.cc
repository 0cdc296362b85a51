// --many N,M,...: many-to-one. N initiator processes (this binary re-executed
// with --many-worker) connect to ONE target and each WRITEs (or READs) its own
// disjoint slice of the target's region — initiator i owns
// [addr + i*block, addr + (i+1)*block) — all started together: every
// initiator, ready, blocks on one shared pipe (its fd 3) and the coordinator
// releases them all with a single write of N bytes.
//
// Per rep, interleaved: A) the hixl round, B) the baseline round, in which
// the same N processes, started the same way, move the same bytes between two
// private buffers of their own: memcpy for shm, one plain loopback socket pair
// each for tcp. Each round reports
//   aggregate GB/s = N * block * iters / (last finish - common start)
// and per initiator block * iters / (its finish - its own start), whose
// min / max / mean and Jain's index (sum x)^2 / (n sum x^2) are reported,
// with how late the last initiator started (start_spread_us).
// Medians over --reps. With --verify every slice is checked after each hixl
// round: WRITE by the target against the pattern, READ by the initiator.
//
// The initiator's line protocol (stdin -> stdout):
//   READY                                   printed once connected
//   warm <op> <block> <addr> <n>            n transfers and n baseline copies -> "OK"
//   run <hixl|base> <op> <block> <addr> <iters> <seed>
//        -> "SET" once prepared (seed != 0: WRITE fills its buffer with the
//           pattern, READ zeroes it), then waits for the start byte on fd 3,
//        -> "DONE <start_ns> <end_ns> <OK|BAD off|->" (READ with a seed: its
//           buffer checked against the pattern)
//   quit (or EOF)
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/baselines.h"
#include "bench/common.h"
#include "bench/modes.h"
#include "bench/process.h"

namespace hixl_bench {
namespace {

constexpr int kBarrierFd = 3;
constexpr int kBarrierTimeoutMs = 60000;

std::map<std::string, std::string> EngineOptions(const Options& o, const std::string& transport,
                                                 uint64_t threads) {
  std::map<std::string, std::string> opts;
  if (transport == "tcp") {
    opts[hixl::options::kLinkType] = "TCP";
    opts[hixl::options::kTcpLanes] = std::to_string(threads);
    if (o.slice != 0) opts[hixl::options::kTcpSliceSize] = std::to_string(o.slice);
  } else if (transport == "ucx") {
    opts[hixl::options::kLinkType] = "UCX";  // no thread option; memcpy stays the baseline
  } else {
    opts[hixl::options::kLinkType] = "SHM";
    opts[hixl::options::kCopyThreads] = std::to_string(threads);
  }
  return WithEngineOpts(o, std::move(opts));
}

hixl::TransferOp ParseOp(const std::string& s) {
  if (s == "write") return hixl::TransferOp::WRITE;
  if (s == "read") return hixl::TransferOp::READ;
  Fail("bad op '" + s + "'");
}

const char* OpName(hixl::TransferOp op) { return op == hixl::TransferOp::WRITE ? "write" : "read"; }

// ------------------------------------------------------------- initiator ---

// Blocks until the coordinator's start byte arrives on fd 3 (non-blocking:
// a reader that finds the pipe empty polls again), at most 60 s.
void WaitForStart() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(kBarrierTimeoutMs);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) Fail("no start signal within 60 s");
    pollfd pfd{kBarrierFd, POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) Fail(std::string("poll(start pipe) failed: ") + std::strerror(errno));
    if (r == 0) continue;
    char c = 0;
    const ssize_t n = read(kBarrierFd, &c, 1);
    if (n == 1) return;
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    Fail("the start pipe was closed");
  }
}

}  // namespace

int RunManyWorker(const Options& o) {
  const std::string& target = o.worker_of;
  const uint64_t threads = o.threads.front();
  const uint64_t max_block = *std::max_element(o.blocks.begin(), o.blocks.end());
  hixl::Hixl engine;
  Check(engine.Initialize("127.0.0.1", EngineOptions(o, o.transport, threads)),
        "Initialize(127.0.0.1, " + o.transport + ")");
  Check(engine.Connect(target, kConnectTimeoutMs), "Connect(" + target + ")");
  hixl::LinkType lt = hixl::LinkType::AUTO;
  Check(engine.GetLinkType(target, lt), "GetLinkType");
  if (Lower(hixl::LinkTypeName(lt)) != o.transport)
    Fail(std::string("link type is ") + hixl::LinkTypeName(lt) + ", not " + o.transport);
  Buffer local(max_block), scratch(max_block);
  CopyPool pool(static_cast<int>(threads));
  std::unique_ptr<SocketBaseline> sock;
  if (o.transport == "tcp") sock = std::make_unique<SocketBaseline>();
  std::printf("READY\n");
  std::fflush(stdout);

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, kind, op_name;
    uint64_t block = 0, addr = 0, n = 0, seed = 0;
    in >> cmd;
    if (cmd == "quit") break;
    if (cmd == "warm")
      in >> op_name >> block >> addr >> n;
    else if (cmd == "run")
      in >> kind >> op_name >> block >> addr >> n >> seed;
    if (!in || (cmd != "warm" && cmd != "run") || block == 0 || block > max_block)
      Fail("bad command '" + line + "'");
    const hixl::TransferOp op = ParseOp(op_name);
    const std::vector<hixl::TransferOpDesc> descs = {
        {reinterpret_cast<uintptr_t>(local.data()), addr, block}};
    const std::vector<CopyOp> copies = {op == hixl::TransferOp::WRITE
                                            ? CopyOp{scratch.data(), local.data(), block}
                                            : CopyOp{local.data(), scratch.data(), block}};
    auto transfer = [&] {
      const hixl::Status st = engine.TransferSync(target, op, descs, kTransferTimeoutMs);
      if (!st.ok()) Fail(std::string("TransferSync ") + OpName(op) + " failed: " + st.ToString());
    };
    auto baseline = [&] {
      if (sock)
        sock->Run(copies, block, /*staged=*/false);
      else
        pool.Run(copies, block, o.baseline_min_part);
    };
    if (cmd == "warm") {
      for (uint64_t i = 0; i < n; ++i) transfer(), baseline();
      std::printf("OK\n");
      std::fflush(stdout);
      continue;
    }
    const bool hixl_round = kind == "hixl";
    if (!hixl_round && kind != "base") Fail("bad round kind '" + kind + "'");
    if (hixl_round && seed != 0) {
      if (op == hixl::TransferOp::WRITE)
        FillPattern(local.data(), block, seed);
      else
        std::memset(local.data(), 0, block);
    }
    std::printf("SET\n");
    std::fflush(stdout);
    WaitForStart();
    const int64_t start = NowNs();
    for (uint64_t i = 0; i < n; ++i) hixl_round ? transfer() : baseline();
    const int64_t end = NowNs();
    std::string verdict = "-";
    if (hixl_round && seed != 0 && op == hixl::TransferOp::READ) {
      const size_t bad = FindPatternMismatch(local.data(), block, seed);
      verdict = bad == SIZE_MAX ? "OK" : "BAD " + std::to_string(bad);
    }
    std::printf("DONE %" PRId64 " %" PRId64 " %s\n", start, end, verdict.c_str());
    std::fflush(stdout);
  }
  sock.reset();
  engine.Finalize();
  return 0;
}

// ----------------------------------------------------------- coordinator ---

namespace {

// The N initiators of one (transport, threads, N) group and their start pipe.
struct Group {
  std::vector<std::unique_ptr<Child>> workers;
  int start_rd = -1, start_wr = -1;

  ~Group() {
    Stop();
    if (start_rd >= 0) close(start_rd);
    if (start_wr >= 0) close(start_wr);
  }

  // Asks every initiator to quit (so they finalize at once), then reaps each
  // (SIGKILL by pid after 10 s); says which did not end with status 0.
  std::string Stop() {
    for (auto& w : workers) w->RequestQuit();
    std::string bad;
    for (size_t i = 0; i < workers.size(); ++i) {
      const std::string how = workers[i]->Stop();
      if (how != "exit status 0") bad += " initiator " + std::to_string(i) + ": " + how + ";";
    }
    workers.clear();
    return bad;
  }

  // Releases every initiator waiting in WaitForStart.
  void Start() {
    const std::string bytes(workers.size(), 'g');
    ssize_t n = -1;
    do n = write(start_wr, bytes.data(), bytes.size());
    while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(bytes.size()))
      Fail(std::string("cannot write the start pipe: ") + std::strerror(errno));
  }
};

struct Round {
  double agg_gbps = 0, min_gbps = 0, max_gbps = 0, mean_gbps = 0, jain = 0;
  double spread_us = 0;  // last initiator's start after the common start
  double avg_us = 0;     // per transfer, from each initiator's own start, mean over initiators
  std::vector<std::string> verdicts;
};

// One round: every initiator prepares ("SET"), all start together, each
// reports its start and finish.
Round RunRound(Group& g, const std::string& kind, hixl::TransferOp op, uint64_t block,
               const std::vector<uint64_t>& addrs, uint64_t iters,
               const std::vector<uint64_t>& seeds) {
  const size_t n = g.workers.size();
  for (size_t i = 0; i < n; ++i)
    g.workers[i]->WriteLine("run " + kind + " " + OpName(op) + " " + std::to_string(block) + " " +
                            std::to_string(addrs[i]) + " " + std::to_string(iters) + " " +
                            std::to_string(seeds[i]));
  for (size_t i = 0; i < n; ++i) {
    const std::string r = g.workers[i]->ReadLine(kReplyTimeoutMs);
    if (r != "SET") Fail("initiator " + std::to_string(i) + ": unexpected reply '" + r + "'");
  }
  const int64_t t0 = NowNs();
  g.Start();
  Round out;
  std::vector<double> rate;
  int64_t last_end = t0, last_start = t0;
  double avg_sum = 0;
  const double bytes = static_cast<double>(block) * static_cast<double>(iters);
  for (size_t i = 0; i < n; ++i) {
    const std::string r = g.workers[i]->ReadLine(kReplyTimeoutMs);
    std::istringstream in(r);
    std::string word, verdict;
    int64_t s = 0, e = 0;
    if (!(in >> word >> s >> e) || word != "DONE")
      Fail("initiator " + std::to_string(i) + ": unexpected reply '" + r + "'");
    std::getline(in >> std::ws, verdict);
    out.verdicts.push_back(verdict);
    last_end = std::max(last_end, e);
    last_start = std::max(last_start, s);
    // Its own rate, from its own start (woken by the start byte) to its finish.
    rate.push_back(bytes / static_cast<double>(std::max<int64_t>(1, e - s)));  // bytes/ns = GB/s
    avg_sum += static_cast<double>(e - s) / 1e3 / static_cast<double>(iters);
  }
  out.agg_gbps =
      bytes * static_cast<double>(n) / static_cast<double>(std::max<int64_t>(1, last_end - t0));
  out.min_gbps = *std::min_element(rate.begin(), rate.end());
  out.max_gbps = *std::max_element(rate.begin(), rate.end());
  double sum = 0;
  for (double x : rate) sum += x;
  out.mean_gbps = sum / static_cast<double>(n);
  out.jain = JainIndex(rate);
  out.spread_us = static_cast<double>(last_start - t0) / 1e3;
  out.avg_us = avg_sum / static_cast<double>(n);
  return out;
}

struct ManyResult {
  std::string transport, mem, op, baseline;
  uint64_t initiators = 0, block = 0, threads = 0, iters = 0, reps = 0;
  double gbps = 0, min_gbps = 0, max_gbps = 0, mean_gbps = 0, jain = 0, spread_us = 0, avg_us = 0;
  double base_gbps = 0, base_jain = 0;
  int verified = -1;
};

ManyResult MeasureMany(const Options& o, Group& g, Child& target_proc, const Target& target,
                       hixl::TransferOp op, uint64_t block, uint64_t iters) {
  const size_t n = g.workers.size();
  std::vector<uint64_t> addrs(n), offs(n), no_seeds(n, 0);
  for (size_t i = 0; i < n; ++i) offs[i] = i * block, addrs[i] = target.addr + offs[i];
  const uint64_t warmup = std::clamp<uint64_t>(iters / 20, 2, 200);
  for (size_t i = 0; i < n; ++i)
    g.workers[i]->WriteLine(std::string("warm ") + OpName(op) + " " + std::to_string(block) + " " +
                            std::to_string(addrs[i]) + " " + std::to_string(warmup));
  for (size_t i = 0; i < n; ++i) {
    const std::string r = g.workers[i]->ReadLine(kReplyTimeoutMs);
    if (r != "OK") Fail("initiator " + std::to_string(i) + " warm-up: '" + r + "'");
  }
  std::vector<double> agg, mn, mx, mean, jain, spread, avg, base_agg, base_jain;
  const std::string where = std::string(OpName(op)) + ", " + std::to_string(n) +
                            " initiators, block " + std::to_string(block);
  for (uint64_t r = 0; r < o.reps; ++r) {
    std::vector<uint64_t> seeds(n, 0);
    if (o.verify)
      for (size_t i = 0; i < n; ++i)
        seeds[i] = Mix(PatternSeed(block, n, r, static_cast<int>(op)) ^ (i + 1)) | 1;  // != 0
    if (o.verify && op == hixl::TransferOp::READ)
      for (size_t i = 0; i < n; ++i) {
        const std::string rep =
            target_proc.Request("fill " + std::to_string(seeds[i]) + " " + std::to_string(block) +
                                " " + std::to_string(offs[i]));
        if (rep != "OK") Fail("target could not fill its region: " + rep);
      }
    // A: hixl, N initiators into one target
    const Round a = RunRound(g, "hixl", op, block, addrs, iters, seeds);
    if (o.verify)
      for (size_t i = 0; i < n; ++i) {
        std::string verdict = a.verdicts[i];
        if (op == hixl::TransferOp::WRITE)
          verdict = target_proc.Request("check " + std::to_string(seeds[i]) + " " +
                                        std::to_string(block) + " " + std::to_string(offs[i]));
        if (verdict != "OK")
          Fail("VERIFY FAILED (" + where + "): initiator " + std::to_string(i) +
               "'s slice: " + verdict);
      }
    // B: the baseline, N processes at once, same bytes
    const Round b = RunRound(g, "base", op, block, addrs, iters, no_seeds);
    agg.push_back(a.agg_gbps), mn.push_back(a.min_gbps), mx.push_back(a.max_gbps);
    mean.push_back(a.mean_gbps), jain.push_back(a.jain), spread.push_back(a.spread_us);
    avg.push_back(a.avg_us), base_agg.push_back(b.agg_gbps), base_jain.push_back(b.jain);
  }
  ManyResult m;
  m.op = OpName(op);
  m.initiators = n;
  m.block = block;
  m.iters = iters;
  m.reps = o.reps;
  m.gbps = Median(agg);
  m.min_gbps = Median(mn);
  m.max_gbps = Median(mx);
  m.mean_gbps = Median(mean);
  m.jain = Median(jain);
  m.spread_us = Median(spread);
  m.avg_us = Median(avg);
  m.base_gbps = Median(base_agg);
  m.base_jain = Median(base_jain);
  m.verified = o.verify ? 1 : -1;
  return m;
}

void PrintManyJson(const ManyResult& m) {
  std::printf(
      "{\"transport\":\"%s\",\"mem\":\"%s\",\"mode\":\"many\",\"op\":\"%s\","
      "\"initiators\":%" PRIu64 ",\"block_size\":%" PRIu64
      ",\"batch_size\":1,"
      "\"threads\":%" PRIu64 ",\"iters\":%" PRIu64 ",\"reps\":%" PRIu64
      ",\"gbps\":%.4f,\"min_gbps\":%.4f,\"max_gbps\":%.4f,\"mean_gbps\":%.4f,"
      "\"jain\":%.4f,\"start_spread_us\":%.1f,\"avg_us\":%.3f,\"baseline\":\"%s\","
      "\"baseline_gbps\":%.4f,\"baseline_jain\":%.4f,\"ratio\":%.4f,\"verified\":%s}\n",
      m.transport.c_str(), m.mem.c_str(), m.op.c_str(), m.initiators, m.block, m.threads, m.iters,
      m.reps, m.gbps, m.min_gbps, m.max_gbps, m.mean_gbps, m.jain, m.spread_us, m.avg_us,
      m.baseline.c_str(), m.base_gbps, m.base_jain, m.base_gbps > 0 ? m.gbps / m.base_gbps : 0.0,
      m.verified < 0 ? "null" : (m.verified ? "true" : "false"));
  std::fflush(stdout);
}

void PrintManyHeader() {
  std::fprintf(stderr, "%-4s %-6s %-5s %4s %6s %3s %6s %8s %8s %8s %8s %6s %9s %6s %7s %s\n",
               "link", "mem", "op", "init", "block", "thr", "iters", "GB/s", "min", "max", "mean",
               "jain", "baseline", "bjain", "ratio", "verified");
}

void PrintManyRow(const ManyResult& m) {
  std::fprintf(stderr,
               "%-4s %-6s %-5s %4" PRIu64 " %6s %3" PRIu64 " %6" PRIu64
               " %8.3f %8.3f %8.3f %8.3f %6.3f %9.3f %6.3f %7.3f %s\n",
               m.transport.c_str(), m.mem.c_str(), m.op.c_str(), m.initiators,
               HumanSize(m.block).c_str(), m.threads, m.iters, m.gbps, m.min_gbps, m.max_gbps,
               m.mean_gbps, m.jain, m.base_gbps, m.base_jain,
               m.base_gbps > 0 ? m.gbps / m.base_gbps : 0.0,
               m.verified < 0 ? "-" : (m.verified ? "yes" : "NO"));
}

}  // namespace

int RunMany(const Options& o) {
  const std::vector<uint64_t> blocks =
      o.blocks_given ? o.blocks : std::vector<uint64_t>{64 * KiB, 1 * MiB, 16 * MiB};
  const std::vector<uint64_t> threads = o.threads_given ? o.threads : std::vector<uint64_t>{1};
  const std::string& transport = o.transport;
  std::vector<hixl::TransferOp> ops;
  if (o.do_write) ops.push_back(hixl::TransferOp::WRITE);
  if (o.do_read) ops.push_back(hixl::TransferOp::READ);
  if (o.region_size < 4 * KiB) Fail("--region-size must be at least 4K");

  // Which (N, block) points fit: N slices of one block in the region.
  auto fits = [&](uint64_t n, uint64_t block) {
    return block <= o.max_total && n * block <= o.region_size;
  };
  uint64_t points = 0, skipped = 0;
  for (uint64_t n : o.many)
    for (uint64_t block : blocks) {
      if (fits(n, block))
        ++points;
      else
        ++skipped;
    }
  if (skipped)
    std::fprintf(stderr,
                 "hixl-bench: skipped %" PRIu64
                 " initiators x block combination(s) larger than --max-total or --region-size\n",
                 skipped);
  if (points == 0) Fail("nothing to run: every combination was skipped");

  if (o.table) PrintManyHeader();
  Progress progress(o.mems.size() * threads.size() * ops.size() * points);
  for (const std::string& mem : o.mems) {
    Child target_proc;
    const Target target = StartTarget(target_proc, o, mem);
    for (uint64_t thr : threads)
      for (uint64_t n : o.many) {
        std::vector<uint64_t> sizes;
        for (uint64_t block : blocks)
          if (fits(n, block)) sizes.push_back(block);
        if (sizes.empty()) continue;
        const uint64_t max_block = *std::max_element(sizes.begin(), sizes.end());
        Group g;
        int fds[2];
        if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
          Fail(std::string("pipe2 failed: ") + std::strerror(errno));
        g.start_rd = fds[0], g.start_wr = fds[1];
        std::vector<std::string> args = {"hixl-bench",
                                         "--many-worker",
                                         target.engine,
                                         "--transport",
                                         transport,
                                         "--threads",
                                         std::to_string(thr),
                                         "--blocks",
                                         std::to_string(max_block),
                                         "--baseline-min-part",
                                         std::to_string(o.baseline_min_part)};
        if (o.slice != 0) args.insert(args.end(), {"--slice", std::to_string(o.slice)});
        for (uint64_t i = 0; i < n; ++i) {
          g.workers.push_back(std::make_unique<Child>("initiator " + std::to_string(i)));
          g.workers.back()->Spawn(args, g.start_rd);
        }
        for (auto& w : g.workers) {
          const std::string r = w->ReadLine(kReadyTimeoutMs);
          if (r != "READY") Fail("unexpected line from an initiator: '" + r + "'");
        }
        for (const auto op : ops)
          for (uint64_t block : sizes) {
            // Each initiator moves >= 256 MiB per round (min 5 transfers), so a
            // round outlasts the spread of the initiators' wake-ups.
            const uint64_t iters =
                o.iters ? o.iters : std::max<uint64_t>(5, (256 * MiB + block - 1) / block);
            progress.Step(transport + (o.mems.size() > 1 ? " " + mem : "") + " " + OpName(op) +
                          " " + HumanSize(block) + " initiators " + std::to_string(n) +
                          " threads " + std::to_string(thr));
            ManyResult m = MeasureMany(o, g, target_proc, target, op, block, iters);
            m.transport = transport;
            m.mem = mem;
            m.threads = thr;
            m.baseline = transport == "tcp" ? "socket" : "memcpy";
            progress.Clear();
            PrintManyJson(m);
            if (o.table) PrintManyRow(m);
          }
        const std::string bad = g.Stop();
        if (!bad.empty())
          std::fprintf(stderr, "hixl-bench: warning: initiator processes ended:%s\n", bad.c_str());
      }
    const std::string how = target_proc.Stop();
    if (how != "exit status 0")
      std::fprintf(stderr, "hixl-bench: warning: target process (mem %s) ended: %s\n", mem.c_str(),
                   how.c_str());
  }
  return 0;
}

}  // namespace hixl_bench
