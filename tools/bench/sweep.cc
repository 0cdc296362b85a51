#include "bench/sweep.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "bench/cpu.h"

namespace hixl_bench {

namespace {
constexpr int kPerftestTimeoutMs = 120000;  // one ucx_perftest run, server and client
}  // namespace

void Transfer(Context& c, hixl::TransferOp op, const std::vector<hixl::TransferOpDesc>& descs) {
  const hixl::Status st = c.engine->TransferSync(c.target.engine, op, descs, kTransferTimeoutMs);
  if (!st.ok())
    Fail(std::string("TransferSync ") + (op == hixl::TransferOp::WRITE ? "WRITE" : "READ") +
         " of " + std::to_string(descs.size()) + " descriptor(s) failed: " + st.ToString());
}

std::vector<hixl::TransferOpDesc> MakeDescs(uintptr_t local, uintptr_t remote, uint64_t block,
                                            uint64_t batch) {
  std::vector<hixl::TransferOpDesc> d(batch);
  for (uint64_t i = 0; i < batch; ++i) d[i] = {local + i * block, remote + i * block, block};
  return d;
}

const char* OpName(hixl::TransferOp op) { return op == hixl::TransferOp::WRITE ? "write" : "read"; }

int SharedMemfdMappings(size_t min_len) {
  std::ifstream in("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    // "start-end perms offset dev inode path"
    std::istringstream ss(line);
    std::string range, perms, offset, dev, inode, path;
    if (!(ss >> range >> perms >> offset >> dev >> inode)) continue;
    std::getline(ss, path);
    const size_t dash = range.find('-');
    if (dash == std::string::npos || perms.size() < 4 || perms[3] != 's') continue;
    if (path.find("/memfd:") == std::string::npos) continue;
    const uint64_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const uint64_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (hi - lo >= min_len) ++n;
  }
  return n;
}

namespace {

// The cma reference moves the right bytes too: the same check as hixl's,
// through bare process_vm_writev/readv.
void VerifyCma(Context& c, hixl::TransferOp op, uint64_t block, uint64_t batch, uint64_t seed) {
  const uint64_t total = block * batch;
  const bool write = op == hixl::TransferOp::WRITE;
  std::vector<CopyOp> copies(batch);
  for (uint64_t i = 0; i < batch; ++i) {
    uint8_t* l = c.local->data() + i * block;
    uint8_t* r = reinterpret_cast<uint8_t*>(c.target.addr + i * block);
    copies[i] = write ? CopyOp{r, l, block} : CopyOp{l, r, block};
  }
  const Mover how{write ? Mover::kCmaWrite : Mover::kCmaRead, c.child->pid()};
  const std::string where =
      "cma, block " + std::to_string(block) + " batch " + std::to_string(batch) + " mem " + c.mem;
  if (write) {
    FillPattern(c.local->data(), total, seed);
    c.pool->Run(copies, total, c.opt->baseline_min_part, how);
    const std::string reply =
        c.child->Request("check " + std::to_string(seed) + " " + std::to_string(total));
    if (reply != "OK") Fail("VERIFY FAILED (write, " + where + "): " + reply);
  } else {
    const std::string reply =
        c.child->Request("fill " + std::to_string(seed) + " " + std::to_string(total));
    if (reply != "OK") Fail("target could not fill its region: " + reply);
    std::memset(c.local->data(), 0, total);
    c.pool->Run(copies, total, c.opt->baseline_min_part, how);
    const size_t bad = FindPatternMismatch(c.local->data(), total, seed);
    if (bad != SIZE_MAX)
      Fail("VERIFY FAILED (read, " + where + "): bytes differ at offset " + std::to_string(bad));
  }
}

}  // namespace

void VerifyOnce(Context& c, hixl::TransferOp op, uint64_t block, uint64_t batch, uint64_t seed) {
  const uint64_t total = block * batch;
  const auto remote =
      MakeDescs(reinterpret_cast<uintptr_t>(c.local->data()), c.target.addr, block, batch);
  const auto back =
      MakeDescs(reinterpret_cast<uintptr_t>(c.scratch->data()), c.target.addr, block, batch);
  const std::string where = "block " + std::to_string(block) + " batch " + std::to_string(batch) +
                            " threads " + std::to_string(c.threads) + " mem " + c.mem;
  if (op == hixl::TransferOp::WRITE) {
    // WRITE the pattern, let the target check its own memory, READ it back.
    FillPattern(c.local->data(), total, seed);
    Transfer(c, hixl::TransferOp::WRITE, remote);
    const std::string reply =
        c.child->Request("check " + std::to_string(seed) + " " + std::to_string(total));
    if (reply != "OK")
      Fail("VERIFY FAILED (write, " + where +
           "): target region does not hold the written bytes: " + reply);
    std::memset(c.scratch->data(), 0, total);
    Transfer(c, hixl::TransferOp::READ, back);
    const size_t bad = FindPatternMismatch(c.scratch->data(), total, seed);
    if (bad != SIZE_MAX)
      Fail("VERIFY FAILED (write, " + where + "): read-back differs at byte offset " +
           std::to_string(bad));
  } else {
    // The target fills its region; READ it into a zeroed buffer and compare.
    const std::string reply =
        c.child->Request("fill " + std::to_string(seed) + " " + std::to_string(total));
    if (reply != "OK") Fail("target could not fill its region: " + reply);
    std::memset(c.local->data(), 0, total);
    Transfer(c, hixl::TransferOp::READ, remote);
    const size_t bad = FindPatternMismatch(c.local->data(), total, seed);
    if (bad != SIZE_MAX)
      Fail("VERIFY FAILED (read, " + where + "): local bytes differ at byte offset " +
           std::to_string(bad));
  }
  if (c.cma) VerifyCma(c, op, block, batch, Mix(seed));
}

Measurement Measure(Context& c, hixl::TransferOp op, uint64_t block, uint64_t batch, uint64_t iters,
                    const std::string& mode) {
  const Options& o = *c.opt;
  const uint64_t total = block * batch;
  const bool write = op == hixl::TransferOp::WRITE;
  const auto descs =
      MakeDescs(reinterpret_cast<uintptr_t>(c.local->data()), c.target.addr, block, batch);
  // B copies between two private buffers; C between local and the target's
  // region, the same descriptors hixl moves.
  std::vector<CopyOp> copies(batch), cma_copies(batch);
  for (uint64_t i = 0; i < batch; ++i) {
    uint8_t* l = c.local->data() + i * block;
    uint8_t* s = c.scratch->data() + i * block;
    uint8_t* r = reinterpret_cast<uint8_t*>(c.target.addr + i * block);
    copies[i] = write ? CopyOp{s, l, block} : CopyOp{l, s, block};
    cma_copies[i] = write ? CopyOp{r, l, block} : CopyOp{l, r, block};
  }
  const Mover cma_how{write ? Mover::kCmaWrite : Mover::kCmaRead, c.child->pid()};

  // The baseline for this transport: memcpy (shm) or a plain socket (tcp).
  auto baseline = [&]() -> int {
    if (c.sock != nullptr) {
      c.sock->Run(copies, total, /*staged=*/false);
      return 1;
    }
    return c.pool->Run(copies, total, o.baseline_min_part);
  };
  const uint64_t warmup = std::clamp<uint64_t>(iters / 20, 2, 200);
  for (uint64_t i = 0; i < warmup; ++i) {
    Transfer(c, op, descs);
    if (c.perftest == nullptr) baseline();  // perftest warms up in its own run
    if (c.sock != nullptr) c.sock->Run(copies, total, /*staged=*/true);
    if (c.cma) c.pool->Run(cma_copies, total, o.baseline_min_part, cma_how);
  }
  // ucx: one ucx_perftest run per rep, as many messages of `block` bytes as
  // the rep moves (iters x batch); the latency row pairs with ucp_put_lat.
  const bool latency_row = mode == "latency";
  // tcp latency: the reference is a ping-pong (4 KiB out, 16 B back).
  const bool ping_row = latency_row && c.ping != nullptr;
  const bool spin_row = ping_row && c.ping_spin != nullptr;
  if (ping_row)
    for (uint64_t i = 0; i < warmup; ++i) c.ping->RoundTrip();
  if (spin_row)
    for (uint64_t i = 0; i < warmup; ++i) c.ping_spin->RoundTrip();
  const std::string pt_test = c.perftest ? c.perftest->TestFor(!write, latency_row) : "";
  std::vector<double> pt_gbps, pt_p50_us;
  std::string pt_error =
      c.perftest && !c.perftest->available() ? c.perftest->why_not() : std::string();

  const CpuClock cpu(c.child->pid());
  std::vector<CpuSpan> cpu_hixl, cpu_base, cpu_cma;
  std::vector<double> gbps, avg_us, lat_us, base_gbps, base_lat_us, before_gbps, cma_gbps,
      cma_lat_us, spin_lat_us;
  lat_us.reserve(iters * o.reps);
  base_lat_us.reserve(iters * o.reps);
  if (c.cma) cma_lat_us.reserve(iters * o.reps);
  const double bytes = static_cast<double>(total) * static_cast<double>(iters);
  const double n = static_cast<double>(iters);
  bool verified = false;
  int base_threads = 1, cma_threads = 1;
  for (uint64_t r = 0; r < o.reps; ++r) {
    // A: hixl
    CpuClock::Sample c0 = cpu.Now();
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < iters; ++i) {
      const auto a = Clock::now();
      Transfer(c, op, descs);
      lat_us.push_back(Seconds(a, Clock::now()) * 1e6);
    }
    double secs = Seconds(t0, Clock::now());
    cpu_hixl.push_back(Span(c0, cpu.Now(), bytes, n));
    gbps.push_back(bytes / secs / 1e9);
    avg_us.push_back(secs * 1e6 / n);
    if (c.perftest != nullptr) {
      // B: ucx_perftest, same message size and count (stops at its first failure)
      if (pt_error.empty()) {
        const UcxPerftest::Result pr =
            c.perftest->Run(pt_test, block, iters * batch, warmup * batch, kPerftestTimeoutMs);
        if (pr.ok) {
          pt_gbps.push_back(pr.gbps);
          pt_p50_us.push_back(pr.p50_us);
        } else {
          pt_error = pr.error;
        }
      }
    } else {
      // B: memcpy (or socket) baseline, same bytes, same layout, same thread count
      c0 = cpu.Now();
      t0 = Clock::now();
      for (uint64_t i = 0; i < iters; ++i) {
        const auto a = Clock::now();
        if (ping_row) {
          c.ping->RoundTrip();
        } else {
          base_threads = baseline();
        }
        base_lat_us.push_back(Seconds(a, Clock::now()) * 1e6);
      }
      secs = Seconds(t0, Clock::now());
      cpu_base.push_back(Span(c0, cpu.Now(), bytes, n));
      base_gbps.push_back(bytes / secs / 1e9);
    }
    if (c.cma) {  // C: bare cross-memory attach into the target's region
      c0 = cpu.Now();
      t0 = Clock::now();
      for (uint64_t i = 0; i < iters; ++i) {
        const auto a = Clock::now();
        cma_threads = c.pool->Run(cma_copies, total, o.baseline_min_part, cma_how);
        cma_lat_us.push_back(Seconds(a, Clock::now()) * 1e6);
      }
      secs = Seconds(t0, Clock::now());
      cpu_cma.push_back(Span(c0, cpu.Now(), bytes, n));
      cma_gbps.push_back(bytes / secs / 1e9);
    }
    if (spin_row) {  // D: the ping-pong with both sides polling
      for (uint64_t i = 0; i < iters; ++i) {
        const auto a = Clock::now();
        c.ping_spin->RoundTrip();
        spin_lat_us.push_back(Seconds(a, Clock::now()) * 1e6);
      }
    }
    if (c.sock != nullptr) {  // the staged "before" path
      t0 = Clock::now();
      for (uint64_t i = 0; i < iters; ++i) c.sock->Run(copies, total, /*staged=*/true);
      before_gbps.push_back(bytes / Seconds(t0, Clock::now()) / 1e9);
    }
    if (o.verify) {
      VerifyOnce(c, op, block, batch, PatternSeed(block, batch, r, static_cast<int>(op)));
      verified = true;
    }
  }
  std::sort(lat_us.begin(), lat_us.end());
  std::sort(base_lat_us.begin(), base_lat_us.end());
  std::sort(cma_lat_us.begin(), cma_lat_us.end());
  std::sort(spin_lat_us.begin(), spin_lat_us.end());

  Measurement m;
  m.mode = mode;
  m.transport = c.transport;
  m.mem = c.mem;
  m.op = OpName(op);
  m.block = block;
  m.batch = batch;
  m.threads = c.threads;
  m.iters = iters;
  m.gbps = Median(gbps);
  m.avg_us = Median(avg_us);
  m.p50_us = Percentile(lat_us, 0.50);
  m.p99_us = Percentile(lat_us, 0.99);
  m.base_gbps = Median(base_gbps);
  m.base_p50_us = Percentile(base_lat_us, 0.50);
  m.base_threads = static_cast<uint64_t>(base_threads);
  m.cpu = MedianCpu(cpu_hixl);
  m.base_cpu = MedianCpu(cpu_base);
  if (c.cma) {
    m.has_cma = true;
    m.cma_gbps = Median(cma_gbps);
    m.cma_p50_us = Percentile(cma_lat_us, 0.50);
    m.cma_threads = static_cast<uint64_t>(cma_threads);
    m.cma_cpu = MedianCpu(cpu_cma);
  }
  if (c.maps_before >= 0)
    m.remote_mapped = SharedMemfdMappings(c.target.len) > c.maps_before ? 1 : 0;
  if (c.sock != nullptr) {
    m.baseline = "socket";
    m.before_gbps = Median(before_gbps);
  }
  if (ping_row) {
    // p50 against p50: > 1 means hixl's acknowledged WRITE is faster than
    // the bare round trip (it cannot be).
    m.baseline = "pingpong";
    m.ratio = m.p50_us > 0 ? m.base_p50_us / m.p50_us : 0;
    m.ratio_of = "p50_us";
    if (spin_row) m.spin_p50_us = Percentile(spin_lat_us, 0.50);
  }
  if (c.perftest != nullptr) {
    m.baseline = "ucx_perftest:" + pt_test;
    m.baseline_note = pt_error;
    m.has_baseline = !pt_gbps.empty();
    m.base_gbps = Median(pt_gbps);
    if (latency_row) {
      // perftest's one-way put ping-pong p50 against our TransferSync p50
      // (which includes the flush): > 1 means hixl is faster.
      m.base_p50_us = Median(pt_p50_us);
      m.ratio = m.has_baseline && m.p50_us > 0 ? m.base_p50_us / m.p50_us : 0;
      m.ratio_of = "p50_us";
    } else {
      // the time one transfer's bytes take at perftest's bandwidth
      m.base_p50_us = m.base_gbps > 0 ? static_cast<double>(total) / (m.base_gbps * 1e3) : 0;
    }
  }
  m.verified = o.verify ? (verified ? 1 : 0) : -1;
  return m;
}

void WarnBaseline(const Measurement& m, const UcxPerftest* perftest) {
  if (perftest != nullptr && perftest->available() && !m.baseline_note.empty())
    std::fprintf(stderr, "hixl-bench: warning: %s %s %s: %s\n", m.baseline.c_str(), m.op.c_str(),
                 HumanSize(m.block).c_str(), m.baseline_note.c_str());
}

}  // namespace hixl_bench
