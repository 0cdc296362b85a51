// --stream: many small async transfers in flight, the way a KV producer
// streams blocks. Transfer k moves one block between slot k % S of the local
// buffer and slot k % S of the target's region (S = StreamSlots: --slots or
// else the window, fewer when the region cannot hold that many blocks). Up to --window
// requests are posted and not yet reaped; the oldest is reaped first
// (GetTransferStatus on it until it ends, then the next is posted), as a
// caller that needs its blocks in order would. p50/p99 are post-to-reaped
// times, queueing in the window included, of every kLatencyEvery-th
// transfer (reading the clock for each would add a sizeable share of a
// small transfer's cost to the rate).
//
// Beside it, rep by rep in the same run: ucx_perftest ucp_put_bw (READ:
// ucp_get) with the same message size and count and -O window outstanding,
// under UCX_TLS=posix,cma,self for --transport shm (tcp,self for tcp; ucx:
// the inherited UCX_* settings). perftest puts into a single buffer, so its
// working set is one block; ours is S blocks (--slots 1: the same as its).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "bench/cpu.h"
#include "bench/sweep.h"

namespace hixl_bench {

uint64_t StreamSlots(const Options& o, uint64_t block) {
  const uint64_t room = std::min(o.region_size, o.max_total) / block;
  return std::max<uint64_t>(1, std::min<uint64_t>(o.slots > 0 ? o.slots : o.window, room));
}

namespace {

constexpr int kPerftestTimeoutMs = 120000;
constexpr uint64_t kLatencyEvery = 16;

const char* StatusName(hixl::TransferStatus st) {
  switch (st) {
    case hixl::TransferStatus::WAITING: return "WAITING";
    case hixl::TransferStatus::COMPLETED: return "COMPLETED";
    case hixl::TransferStatus::TIMEOUT: return "TIMEOUT";
    case hixl::TransferStatus::FAILED: return "FAILED";
    case hixl::TransferStatus::CANCELLED: return "CANCELLED";
  }
  return "?";
}

// Streams n transfers (see the file comment); returns the seconds from the
// first post to the last reap. lat_us (optional) gets each post-to-reap time.
double Stream(Context& c, hixl::TransferOp op, uint64_t block, uint64_t slots, uint64_t n,
              std::vector<double>* lat_us) {
  const uint64_t window = c.opt->window;
  std::vector<hixl::TransferReq> reqs(window);
  std::vector<Clock::time_point> posted_at(window);
  std::vector<hixl::TransferOpDesc> desc(1);
  const hixl::TransferArgs args;
  const uintptr_t local = reinterpret_cast<uintptr_t>(c.local->data());
  uint64_t reaped = 0, posted = 0;
  const auto t0 = Clock::now();
  while (reaped < n) {
    for (; posted < n && posted - reaped < window; ++posted) {
      const uint64_t s = posted % slots;
      desc[0] = {local + s * block, c.target.addr + s * block, block};
      if (lat_us && posted % kLatencyEvery == 0) posted_at[posted % window] = Clock::now();
      const hixl::Status st =
          c.engine->TransferAsync(c.target.engine, op, desc, args, reqs[posted % window]);
      if (!st.ok()) Fail(std::string("TransferAsync ") + OpName(op) + " failed: " + st.ToString());
    }
    hixl::TransferStatus st = hixl::TransferStatus::WAITING;
    hixl::Status reason;
    const hixl::Status s = c.engine->GetTransferStatus(reqs[reaped % window], st, reason);
    if (!s.ok()) Fail("GetTransferStatus failed: " + s.ToString());
    if (st == hixl::TransferStatus::WAITING) continue;
    if (st != hixl::TransferStatus::COMPLETED)
      Fail(std::string("async ") + OpName(op) + " of " + HumanSize(block) + " ended " +
           StatusName(st) + ": " + reason.ToString());
    if (lat_us && reaped % kLatencyEvery == 0)
      lat_us->push_back(Seconds(posted_at[reaped % window], Clock::now()) * 1e6);
    ++reaped;
  }
  return Seconds(t0, Clock::now());
}

// One stream pass over every slot with the pattern, checked on the far side.
void VerifyStream(Context& c, hixl::TransferOp op, uint64_t block, uint64_t slots, uint64_t seed) {
  const uint64_t total = block * slots;
  const std::string where = "stream block " + std::to_string(block) + " slots " +
                            std::to_string(slots) + " threads " + std::to_string(c.threads) +
                            " mem " + c.mem;
  if (op == hixl::TransferOp::WRITE) {
    FillPattern(c.local->data(), total, seed);
    Stream(c, op, block, slots, slots, nullptr);
    const std::string reply =
        c.child->Request("check " + std::to_string(seed) + " " + std::to_string(total));
    if (reply != "OK")
      Fail("VERIFY FAILED (write, " + where + "): target region does not hold the bytes: " + reply);
  } else {
    const std::string reply =
        c.child->Request("fill " + std::to_string(seed) + " " + std::to_string(total));
    if (reply != "OK") Fail("target could not fill its region: " + reply);
    std::memset(c.local->data(), 0, total);
    Stream(c, op, block, slots, slots, nullptr);
    const size_t bad = FindPatternMismatch(c.local->data(), total, seed);
    if (bad != SIZE_MAX)
      Fail("VERIFY FAILED (read, " + where + "): local bytes differ at byte offset " +
           std::to_string(bad));
  }
}

}  // namespace

Measurement MeasureStream(Context& c, hixl::TransferOp op, uint64_t block, uint64_t transfers) {
  const Options& o = *c.opt;
  const uint64_t slots = StreamSlots(o, block);
  const uint64_t warmup = std::min(transfers, std::max<uint64_t>(2 * o.window, transfers / 20));
  Stream(c, op, block, slots, warmup, nullptr);

  const UcxPerftest* pt = c.stream_perftest;
  const std::string pt_test = pt ? pt->TestFor(op == hixl::TransferOp::READ, false) : "";
  std::string pt_error = !pt ? "no ucx_perftest" : (!pt->available() ? pt->why_not() : "");
  const std::vector<std::string> pt_extra = {"-O", std::to_string(o.window)};

  const CpuClock cpu(c.child->pid());
  std::vector<CpuSpan> cpu_hixl;
  std::vector<double> tps, gbps, avg_us, lat_us, pt_tps, pt_gbps, pt_p50_us;
  lat_us.reserve(transfers * o.reps / kLatencyEvery + o.reps);
  const double n = static_cast<double>(transfers);
  const double bytes = n * static_cast<double>(block);
  bool verified = false;
  for (uint64_t r = 0; r < o.reps; ++r) {
    // A: hixl, a window of async requests
    const CpuClock::Sample c0 = cpu.Now();
    const double secs = Stream(c, op, block, slots, transfers, &lat_us);
    cpu_hixl.push_back(Span(c0, cpu.Now(), bytes, n));
    tps.push_back(n / secs);
    gbps.push_back(bytes / secs / 1e9);
    avg_us.push_back(secs * 1e6 / n);
    // B: ucx_perftest, same message size, count and outstanding window
    if (pt_error.empty()) {
      const UcxPerftest::Result pr =
          pt->Run(pt_test, block, transfers, warmup, kPerftestTimeoutMs, pt_extra);
      if (pr.ok) {
        pt_tps.push_back(pr.msg_rate);
        pt_gbps.push_back(pr.gbps);
        pt_p50_us.push_back(pr.p50_us);
      } else {
        pt_error = pr.error;
      }
    }
    if (o.verify) {
      VerifyStream(c, op, block, slots, PatternSeed(block, slots, r, 16 + static_cast<int>(op)));
      verified = true;
    }
  }
  std::sort(lat_us.begin(), lat_us.end());

  Measurement m;
  m.mode = "stream";
  m.transport = c.transport;
  m.mem = c.mem;
  m.op = OpName(op);
  m.block = block;
  m.batch = 1;
  m.threads = c.threads;
  m.iters = transfers;
  m.window = o.window;
  m.slots = slots;
  m.tps = Median(tps);
  m.gbps = Median(gbps);
  m.avg_us = Median(avg_us);
  m.p50_us = Percentile(lat_us, 0.50);
  m.p99_us = Percentile(lat_us, 0.99);
  m.cpu = MedianCpu(cpu_hixl);
  if (c.maps_before >= 0)
    m.remote_mapped = SharedMemfdMappings(c.target.len) > c.maps_before ? 1 : 0;
  m.baseline = "ucx_perftest:" + pt_test;
  m.has_baseline = !pt_gbps.empty();
  m.baseline_note = pt_error;
  m.base_tps = Median(pt_tps);
  m.base_gbps = Median(pt_gbps);
  m.base_p50_us = Median(pt_p50_us);  // perftest's per-message post overhead, p50
  if (pt)
    for (const auto& e : pt->env()) m.baseline_env += (m.baseline_env.empty() ? "" : " ") + e;
  m.verified = o.verify ? (verified ? 1 : 0) : -1;
  return m;
}

void PrintStreamHeader() {
  std::fprintf(stderr,
               "%-7s %-6s %-5s %6s %6s %3s %8s %10s %8s %9s %9s %10s %8s %7s %7s %7s %3s %s\n",
               "mem", "mode", "op", "block", "window", "thr", "xfers", "xfer/s", "GB/s", "p50_us",
               "p99_us", "pt_xfer/s", "pt_GB/s", "ratio", "cpu/GB", "cpu/10k", "map", "verified");
}

void PrintStreamRow(const Measurement& m) {
  const char* verified = m.verified < 0 ? "-" : (m.verified ? "yes" : "NO");
  const char* map = m.remote_mapped < 0 ? "-" : (m.remote_mapped ? "yes" : "no");
  char pt_tps[32] = "-", pt_gbps[32] = "-", ratio[32] = "-";
  if (m.has_baseline) {
    std::snprintf(pt_tps, sizeof pt_tps, "%.0f", m.base_tps);
    std::snprintf(pt_gbps, sizeof pt_gbps, "%.3f", m.base_gbps);
    std::snprintf(ratio, sizeof ratio, "%.3f", m.Ratio());
  }
  std::fprintf(stderr,
               "%-7s %-6s %-5s %6s %6" PRIu64 " %3" PRIu64 " %8" PRIu64
               " %10.0f %8.3f %9.2f %9.2f %10s %8s %7s %7s %7s %3s %s\n",
               m.mem.c_str(), m.mode.c_str(), m.op.c_str(), HumanSize(m.block).c_str(), m.window,
               m.threads, m.iters, m.tps, m.gbps, m.p50_us, m.p99_us, pt_tps, pt_gbps, ratio,
               CpuCell(m.cpu, true).c_str(), CpuCell(m.cpu, false).c_str(), map, verified);
}

}  // namespace hixl_bench
