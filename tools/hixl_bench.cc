// hixl-bench — bandwidth and latency of hixl transports (shm, tcp, ucx)
// between two processes on this host, each figure beside a baseline measured
// in the same run (interleaved A B A B, as BENCHMARKING.md asks): memcpy (shm),
// a plain socket pair (tcp), ucx_perftest in the same UCX environment (ucx,
// bench/ucx_perftest.h; docs/UCX.md has the numbers); shm rows also beside a
// bare process_vm_writev/readv into the target (cma). Every row carries the
// CPU time of both processes per GB and per 10^4 transfers.
//
// The initiator re-executes itself (/proc/self/exe --serve) as the target
// (bench/process.h has its line protocol). This file holds main and the
// loop over --mem, --threads and the shapes of the bandwidth/latency sweep
// and of --stream; one point is measured in bench/sweep.cc (bench/stream.cc
// for --stream); the other modes are in bench/modes.cc (--control, --notify,
// --failover, --kv) and bench/many.cc (--many); the references in
// bench/baselines.cc; CPU accounting in bench/cpu.cc; options, output and
// the shared helpers in bench/options.cc and bench/common.cc.
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
#include "bench/sweep.h"
#include "bench/ucx_perftest.h"

namespace {

using namespace hixl_bench;

int RunInitiator(const Options& o) {
  if (o.control) return RunControl(o);
  if (o.notify) return RunNotify(o);
  if (o.failover) return RunFailover(o);
  if (o.kv) return RunKv(o);
  if (o.device) return RunDevice(o);
  if (!o.many.empty()) return RunMany(o);
  // The shapes to run, and the largest transfer among them.
  struct Shape {
    uint64_t block, batch;
  };
  std::vector<Shape> shapes;
  uint64_t skipped = 0, largest = 4 * KiB;
  const bool run_sweep = o.stream || !o.latency || o.sweep;
  if (o.stream) {  // one block per transfer; the local buffer holds a slot per window entry
    for (uint64_t block : o.blocks) {
      if (block > o.max_total || block > o.region_size) {
        ++skipped;
        continue;
      }
      shapes.push_back({block, 1});
      largest = std::max(largest, block * StreamSlots(o, block));
    }
  } else if (run_sweep) {
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
  // --stream: ucx_perftest under the UCX layers that match the transport.
  std::unique_ptr<UcxPerftest> stream_perftest;
  if (o.stream && o.transport != "ucx") {
    stream_perftest = std::make_unique<UcxPerftest>();
    stream_perftest->SetEnv({o.transport == "tcp" ? "UCX_TLS=tcp,self" : "UCX_TLS=posix,cma,self"});
    if (stream_perftest->available())
      std::fprintf(stderr, "hixl-bench: stream baseline: %s, same run, %s\n",
                   stream_perftest->path().c_str(), stream_perftest->env().front().c_str());
    else
      std::fprintf(stderr, "hixl-bench: %s: no stream baseline, no ratio\n",
                   stream_perftest->why_not().c_str());
  }
  const UcxPerftest* stream_pt = o.transport == "ucx" ? perftest.get() : stream_perftest.get();
  if (o.table) {
    if (o.stream)
      PrintStreamHeader();
    else
      PrintTableHeader(o.transport);
  }
  std::vector<hixl::TransferOp> ops;
  if (o.do_write) ops.push_back(hixl::TransferOp::WRITE);
  if (o.do_read) ops.push_back(hixl::TransferOp::READ);
  Progress progress(o.mems.size() * o.threads.size() *
                    (ops.size() * shapes.size() + (o.latency && !o.stream ? 1 : 0)));
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
      // shm: whether the engine maps the target's region shows as a new memfd
      // mapping of its size here, once this engine has connected.
      const int maps_before = o.transport == "shm" ? SharedMemfdMappings(target.len) : -1;
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
      Check(engine->Initialize("127.0.0.1", WithEngineOpts(o, opts)),
            "Initialize(127.0.0.1, " + o.transport + ", threads/lanes=" + std::to_string(threads) +
                ")");
      Check(engine->Connect(target.engine, kConnectTimeoutMs), "Connect(" + target.engine + ")");
      hixl::LinkType lt = hixl::LinkType::AUTO;
      Check(engine->GetLinkType(target.engine, lt), "GetLinkType");
      const std::string transport = Lower(hixl::LinkTypeName(lt));
      if (transport != o.transport) Fail("link type is " + transport + ", not " + o.transport);

      CopyPool pool(static_cast<int>(threads));
      std::unique_ptr<SocketBaseline> sock;
      if (o.transport == "tcp" && !o.stream) sock = std::make_unique<SocketBaseline>();
      std::unique_ptr<PingPong> ping, ping_spin;
      if (o.transport == "tcp" && o.latency && !o.stream) {
        ping = std::make_unique<PingPong>(4 * KiB);
        ping_spin = std::make_unique<PingPong>(4 * KiB, /*busy_poll=*/true);
      }
      Context c{&o,    engine.get(), &child, target,  &local,     &scratch,
                &pool, transport,    mem,    threads, sock.get(), perftest.get()};
      c.cma = transport == "shm" && o.cma && !o.stream;
      c.ping = ping.get();
      c.ping_spin = ping_spin.get();
      c.maps_before = maps_before;
      c.stream_perftest = stream_pt;
      if (o.stream) {
        c.perftest = nullptr;  // the stream's own baseline is stream_perftest
        for (const auto op : ops)
          for (const Shape& s : shapes) {
            const uint64_t transfers =
                o.iters ? o.iters : std::max<uint64_t>(10 * o.window, 256 * MiB / s.block);
            step(mem, op == hixl::TransferOp::WRITE ? "stream write" : "stream read", s.block, 1,
                 threads);
            const Measurement m = MeasureStream(c, op, s.block, transfers);
            progress.Clear();
            WarnBaseline(m, stream_pt);
            PrintJson(m);
            if (o.table) PrintStreamRow(m);
          }
        engine->Finalize();
        continue;
      }
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
