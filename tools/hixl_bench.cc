// hixl-bench — bandwidth and latency of hixl transports (shm, tcp, ucx)
// between two processes on this host, each figure beside a baseline measured
// in the same run (interleaved A B A B, as BENCHMARKING.md asks): memcpy (shm),
// a plain socket pair (tcp), ucx_perftest in the same UCX environment (ucx,
// bench/ucx_perftest.h; docs/UCX.md has the numbers).
//
// The initiator re-executes itself (/proc/self/exe --serve) as the target
// (bench/process.h has its line protocol). This file holds main and the
// bandwidth/latency sweep; the other modes are in bench/modes.cc (--control,
// --notify, --failover, --kv) and bench/many.cc (--many); the references in
// bench/baselines.cc; options, output and the shared helpers in
// bench/options.cc and bench/common.cc.
//
// Output: one JSON object per measurement on stdout; --table adds a human
// table on stderr. Exit status is non-zero on any hixl error or verify mismatch.
#include <hixl/hixl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/baselines.h"
#include "bench/common.h"
#include "bench/modes.h"
#include "bench/options.h"
#include "bench/process.h"
#include "bench/ucx_perftest.h"

namespace {

using namespace hixl_bench;

// Everything one (mem, threads) pass needs.
struct Context {
  const Options* opt;
  hixl::Hixl* engine;
  Child* child;
  Target target;
  Buffer* local;    // the transfer's local buffer
  Buffer* scratch;  // second private buffer: memcpy partner, verify read-back
  CopyPool* pool;
  std::string transport, mem;
  uint64_t threads;
  SocketBaseline* sock = nullptr;  // tcp: the wire's practical limit
  const UcxPerftest* perftest = nullptr;  // ucx: UCX's own benchmark, same environment
};

constexpr int kPerftestTimeoutMs = 120000;  // one ucx_perftest run, server and client

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

// Checks the bytes one transfer of this shape moves; throws on a mismatch.
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
}

// One (op, block, batch) point: warm-up, then reps of [hixl, memcpy] interleaved.
Measurement Measure(Context& c, hixl::TransferOp op, uint64_t block, uint64_t batch, uint64_t iters,
                    const std::string& mode) {
  const Options& o = *c.opt;
  const uint64_t total = block * batch;
  const auto descs =
      MakeDescs(reinterpret_cast<uintptr_t>(c.local->data()), c.target.addr, block, batch);
  std::vector<CopyOp> copies(batch);
  for (uint64_t i = 0; i < batch; ++i) {
    uint8_t* l = c.local->data() + i * block;
    uint8_t* s = c.scratch->data() + i * block;
    copies[i] = op == hixl::TransferOp::WRITE ? CopyOp{s, l, block} : CopyOp{l, s, block};
  }

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
  }
  // ucx: one ucx_perftest run per rep, as many messages of `block` bytes as
  // the rep moves (iters x batch); the latency row pairs with ucp_put_lat.
  const bool latency_row = mode == "latency";
  const std::string pt_test =
      c.perftest ? c.perftest->TestFor(op == hixl::TransferOp::READ, latency_row) : "";
  std::vector<double> pt_gbps, pt_p50_us;
  std::string pt_error =
      c.perftest && !c.perftest->available() ? c.perftest->why_not() : std::string();

  std::vector<double> gbps, avg_us, lat_us, base_gbps, base_lat_us, before_gbps;
  lat_us.reserve(iters * o.reps);
  base_lat_us.reserve(iters * o.reps);
  const double bytes = static_cast<double>(total) * static_cast<double>(iters);
  bool verified = false;
  int base_threads = 1;
  for (uint64_t r = 0; r < o.reps; ++r) {
    // A: hixl
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < iters; ++i) {
      const auto a = Clock::now();
      Transfer(c, op, descs);
      lat_us.push_back(Seconds(a, Clock::now()) * 1e6);
    }
    double secs = Seconds(t0, Clock::now());
    gbps.push_back(bytes / secs / 1e9);
    avg_us.push_back(secs * 1e6 / static_cast<double>(iters));
    if (c.perftest != nullptr) {
      // B: ucx_perftest, same message size and count (stops at its first failure)
      if (pt_error.empty()) {
        const UcxPerftest::Result r =
            c.perftest->Run(pt_test, block, iters * batch, warmup * batch, kPerftestTimeoutMs);
        if (r.ok) {
          pt_gbps.push_back(r.gbps);
          pt_p50_us.push_back(r.p50_us);
        } else {
          pt_error = r.error;
        }
      }
    } else {
      // B: memcpy baseline, same bytes, same layout, same thread count
      t0 = Clock::now();
      for (uint64_t i = 0; i < iters; ++i) {
        const auto a = Clock::now();
        base_threads = baseline();
        base_lat_us.push_back(Seconds(a, Clock::now()) * 1e6);
      }
      secs = Seconds(t0, Clock::now());
      base_gbps.push_back(bytes / secs / 1e9);
    }
    if (c.sock != nullptr) {  // C: the staged "before" path
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

  Measurement m;
  m.mode = mode;
  m.transport = c.transport;
  m.mem = c.mem;
  m.op = op == hixl::TransferOp::WRITE ? "write" : "read";
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
  if (c.sock != nullptr) {
    m.baseline = "socket";
    m.before_gbps = Median(before_gbps);
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

// A ucx_perftest run that failed for a row (not the missing binary: said once).
void WarnBaseline(const Measurement& m, const UcxPerftest* perftest) {
  if (perftest != nullptr && perftest->available() && !m.baseline_note.empty())
    std::fprintf(stderr, "hixl-bench: warning: %s %s %s: %s\n", m.baseline.c_str(), m.op.c_str(),
                 HumanSize(m.block).c_str(), m.baseline_note.c_str());
}

int RunInitiator(const Options& o) {
  if (o.control) return RunControl(o);
  if (o.notify) return RunNotify(o);
  if (o.failover) return RunFailover(o);
  if (o.kv) return RunKv(o);
  if (!o.many.empty()) return RunMany(o);
  // The shapes to run, and the largest transfer among them.
  struct Shape {
    uint64_t block, batch;
  };
  std::vector<Shape> shapes;
  uint64_t skipped = 0, largest = 4 * KiB;
  const bool run_sweep = !o.latency || o.sweep;
  if (run_sweep) {
    for (uint64_t batch : o.batches)
      for (uint64_t block : o.blocks) {
        const uint64_t total = block * batch;
        if (total > o.max_total || total > o.region_size) {
          ++skipped;
          continue;
        }
        shapes.push_back({block, batch});
        largest = std::max(largest, total);
      }
  }
  if (o.region_size < 4 * KiB) Fail("--region-size must be at least 4K");
  if (skipped)
    std::fprintf(stderr,
                 "hixl-bench: skipped %" PRIu64
                 " block x batch combination(s) larger than --max-total or --region-size\n",
                 skipped);
  if (run_sweep && shapes.empty()) Fail("nothing to run: every combination was skipped");

  Buffer local(largest), scratch(largest);
  std::unique_ptr<UcxPerftest> perftest;
  if (o.transport == "ucx") {
    perftest = std::make_unique<UcxPerftest>();
    std::string env;  // the UCX settings both hixl and perftest run under
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "UCX_", 4) == 0) env += std::string(" ") + *e;
    if (perftest->available())
      std::fprintf(stderr, "hixl-bench: baseline: %s, same run and environment:%s\n",
                   perftest->path().c_str(), env.empty() ? " (no UCX_* set)" : env.c_str());
    else
      std::fprintf(stderr, "hixl-bench: %s: no ucx baseline, no ratio\n",
                   perftest->why_not().c_str());
  }
  if (o.table) PrintTableHeader(o.transport);
  std::vector<hixl::TransferOp> ops;
  if (o.do_write) ops.push_back(hixl::TransferOp::WRITE);
  if (o.do_read) ops.push_back(hixl::TransferOp::READ);
  Progress progress(o.mems.size() * o.threads.size() *
                    (ops.size() * shapes.size() + (o.latency ? 1 : 0)));
  auto step = [&](const std::string& mem, const char* what, uint64_t block, uint64_t batch,
                  uint64_t threads) {
    std::string s =
        o.transport + (o.mems.size() > 1 ? " " + mem : "") + " " + what + " " + HumanSize(block);
    if (batch > 1) s += " batch " + std::to_string(batch);
    progress.Step(s + " threads " + std::to_string(threads));
  };

  for (const std::string& mem : o.mems) {
    Child child;
    const Target target = StartTarget(child, o, mem);
    for (uint64_t threads : o.threads) {
      // A fresh engine per CopyThreads value.
      auto engine = std::make_unique<hixl::Hixl>();
      std::map<std::string, std::string> opts;
      if (o.transport == "tcp") {
        opts[hixl::options::kLinkType] = "TCP";
        opts[hixl::options::kTcpLanes] = std::to_string(threads);
        if (o.slice != 0) opts[hixl::options::kTcpSliceSize] = std::to_string(o.slice);
      } else if (o.transport == "ucx") {
        opts[hixl::options::kLinkType] = "UCX";  // builds without UCX answer UNSUPPORTED
      } else {
        opts[hixl::options::kLinkType] = "SHM";
        opts[hixl::options::kCopyThreads] = std::to_string(threads);
      }
      Check(engine->Initialize("127.0.0.1", opts),
            "Initialize(127.0.0.1, " + o.transport + ", threads/lanes=" + std::to_string(threads) +
                ")");
      Check(engine->Connect(target.engine, kConnectTimeoutMs), "Connect(" + target.engine + ")");
      hixl::LinkType lt = hixl::LinkType::AUTO;
      Check(engine->GetLinkType(target.engine, lt), "GetLinkType");
      const std::string transport = Lower(hixl::LinkTypeName(lt));
      if (transport != o.transport) Fail("link type is " + transport + ", not " + o.transport);

      CopyPool pool(static_cast<int>(threads));
      std::unique_ptr<SocketBaseline> sock;
      if (o.transport == "tcp") sock = std::make_unique<SocketBaseline>();
      Context c{&o,    engine.get(), &child, target,  &local,    &scratch,
                &pool, transport,    mem,    threads, sock.get(), perftest.get()};
      for (const auto op : ops)
        for (const Shape& s : shapes) {
          const uint64_t total = s.block * s.batch;
          const uint64_t iters =
              o.iters ? o.iters : std::max<uint64_t>(5, (256 * MiB + total - 1) / total);
          step(mem, op == hixl::TransferOp::WRITE ? "write" : "read", s.block, s.batch, threads);
          const Measurement m = Measure(c, op, s.block, s.batch, iters, "bandwidth");
          progress.Clear();
          WarnBaseline(m, perftest.get());
          PrintJson(m);
          if (o.table) PrintTableRow(m);
        }
      if (o.latency) {
        step(mem, "latency write", 4 * KiB, 1, threads);
        const Measurement m = Measure(c, hixl::TransferOp::WRITE, 4 * KiB, 1, 10000, "latency");
        progress.Clear();
        WarnBaseline(m, perftest.get());
        PrintJson(m);
        if (o.table) PrintTableRow(m);
      }
      engine->Finalize();
    }
    const std::string how = child.Stop();
    if (how != "exit status 0")
      std::fprintf(stderr, "hixl-bench: warning: target process (mem %s) ended: %s\n", mem.c_str(),
                   how.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // a dead target must give an error, not kill us
  try {
    const Options o = ParseArgs(argc, argv);
    if (o.serve) return Serve(o);
    if (!o.worker_of.empty()) return RunManyWorker(o);
    return RunInitiator(o);
  } catch (const std::exception& e) {
    const std::string role = argc > 1 ? argv[1] : "";
    std::fprintf(stderr, "hixl-bench%s: error: %s\n",
                 role == "--serve"         ? " (target)"
                 : role == "--many-worker" ? " (initiator)"
                                           : "",
                 e.what());
    return 1;
  }
}
