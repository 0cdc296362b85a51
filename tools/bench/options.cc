#include "bench/options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace hixl_bench {

void Usage() {
  std::fprintf(
      stderr,
      "usage: hixl-bench [options]\n"
      "  --op write|read|both        (default both)\n"
      "  --blocks 4K,64K,1M,...      block sizes (default 4K,16K,64K,256K,1M,4M,16M,64M,128M)\n"
      "  --batch 1,128,1024          descriptors per transfer (default 1)\n"
      "  --threads 1,2               CopyThreads (shm) or TcpLanes (tcp) values, one engine each\n"
      "                              (default 1,2; ucx: 1, the value is not passed on)\n"
      "  --transport shm|tcp|ucx     link to force (default shm); tcp compares with a plain\n"
      "                              blocking socket pair (1 MiB send calls) and reports the\n"
      "                              staged path (copy, send, receive, copy) as before_gbps;\n"
      "                              ucx (LinkType=UCX, UCX layers from UCX_TLS etc.) compares\n"
      "                              with ucx_perftest run in the same run and environment\n"
      "                              (ucp_put_bw/ucp_get for sweeps, ucp_put_lat for --latency;\n"
      "                              $HIXL_BENCH_UCX_PERFTEST overrides the binary)\n"
      "  --slice SIZE                tcp: TcpSliceSize (default: the engine's)\n"
      "  --mem KIND                  the target's region (default alloc); KIND is one of, or a\n"
      "                              comma list of: alloc (AllocMem: an engine memfd, mapped by\n"
      "                              local peers), malloc (malloc + RegisterMem: reached by\n"
      "                              cross-memory attach), memfd (the target's own sealed memfd:\n"
      "                              memfd_create, ftruncate, mmap MAP_SHARED, F_SEAL_SHRINK|\n"
      "                              F_SEAL_GROW, then RegisterMem), inplace (anonymous pages,\n"
      "                              RegisterMem with REGISTER_SHARE_BY_MAPPING); both = alloc,\n"
      "                              malloc; all = alloc,malloc,memfd,inplace. --control with\n"
      "                              memfd/inplace also times their RegisterMem+DeregisterMem\n"
      "  --iters N                   timed transfers per rep (default: >= 256 MiB moved, min 5)\n"
      "  --reps R                    repetitions, median reported (default 5)\n"
      "  --verify                    check the bytes after each rep\n"
      "  --latency                   4 KiB WRITE latency, 10000 iterations (replaces the sweep\n"
      "                              unless --sweep is also given)\n"
      "  --control                   time Connect+Disconnect to the target and RegisterMem+\n"
      "                              DeregisterMem of 1 GiB (200 each) instead of transfers\n"
      "  --notify                    latency of a notification attached to a 4 KiB WRITE,\n"
      "                              post to seen by the target, beside the plain WRITE\n"
      "  --notify-gap-us U           --notify: the initiator waits U us after each pair of\n"
      "                              WRITEs (default 0: back to back; past PollSpinUs the\n"
      "                              target's callback thread sleeps between notifications)\n"
      "  --notify-poll               --notify: the target polls GetNotifies in a loop instead\n"
      "                              of waiting in a notification callback\n"
      "  --failover                  time from kill -9 / SIGSTOP of the target to FAILED\n"
      "  --many N,M,...              many-to-one: N initiator processes, started together, each\n"
      "                              moving its own slice of ONE target's region; aggregate and\n"
      "                              per-initiator GB/s, Jain's fairness index, beside N memcpy\n"
      "                              (shm) or N socket pairs (tcp) at once. Defaults here:\n"
      "                              --blocks 64K,1M,16M, --threads 1\n"
      "  --kv                        run the LLM-DataDist KV benchmark instead: executes\n"
      "                              hixl-kv-bench from this program's directory, passing\n"
      "                              --transport, --reps, --verify, --table through (other\n"
      "                              options are ignored)\n"
      "  --device                    CUDA device memory (the driver HIXL_CUDA_DRIVER names,\n"
      "                              default libcuda.so.1): d2d over shm and tcp, d2h and h2d\n"
      "                              over shm, each beside an in-process cuMemcpy of the same\n"
      "                              size (tcp: beside hixl's tcp host->host); --blocks\n"
      "                              (default 1M,16M,128M), --op, --reps, --iters, --verify\n"
      "  --stream                    async transfers of one block each (--blocks, default\n"
      "                              4K; --op, default write), --window requests in flight,\n"
      "                              oldest reaped first: transfers/s and GB/s beside\n"
      "                              ucx_perftest ucp_put_bw (read: ucp_get) -O WINDOW in the\n"
      "                              same run, under UCX_TLS=posix,cma,self (shm), tcp,self\n"
      "                              (tcp) or the inherited UCX_* (ucx); --iters: transfers\n"
      "                              per rep (default: >= 256 MiB and >= 10 windows)\n"
      "  --window W                  --stream: requests in flight (default 64)\n"
      "  --slots S                   --stream: transfer k uses block slot k %% S of both\n"
      "                              buffers (default: the window). ucx_perftest puts one\n"
      "                              buffer; --slots 1 gives hixl the same working set\n"
      "  --no-cma                    shm: skip the cross-memory attach reference. By default\n"
      "                              every shm row (any --mem) also times a bare\n"
      "                              process_vm_writev/readv of the same bytes from this\n"
      "                              process into the target's region, split over the same\n"
      "                              threads (none < --baseline-min-part; <= 1024 iovecs and\n"
      "                              16 MiB a call, as the engine): cma_gbps, cma_ratio =\n"
      "                              gbps / cma_gbps. For malloc it is the engine's own path;\n"
      "                              for mapped memory, the path mapping avoids\n"
      "  --engine-opt KEY=VALUE      an Initialize option for every engine the bench starts,\n"
      "                              the target's too (repeatable), e.g. PollSpinUs=0\n"
      "  --table                     human table on stderr (JSON lines always on stdout). Every\n"
      "                              row also has the CPU time (user+sys, all threads) of this\n"
      "                              process and the target over its timed loops: cpu_ms_per_gb\n"
      "                              (ms per 10^9 bytes), cpu_ms_per_10k (ms per 10^4\n"
      "                              transfers), and the same for the memcpy/socket baseline\n"
      "                              (baseline_cpu_*) and cma (cma_cpu_*); not for ucx_perftest\n"
      "  --max-total SIZE            skip transfers larger than SIZE bytes (default 256M)\n"
      "  --region-size SIZE          target region size (default 256M)\n"
      "  --baseline-min-part SIZE    the memcpy baseline gives no thread less than SIZE,\n"
      "                              as the engine does (default 1M; 0: always T parts)\n");
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], val;
    bool has_inline = false;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_inline = true;
    }
    auto value = [&]() -> std::string {
      if (has_inline) return val;
      if (i + 1 >= argc) Fail("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--serve")
      o.serve = true;
    else if (a == "--engine-opt") {
      const std::string kv = value();
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) Fail("--engine-opt needs KEY=VALUE, got '" + kv + "'");
      o.engine_opts.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    }
    else if (a == "--transport") {
      o.transport = value();
      if (o.transport != "shm" && o.transport != "tcp" && o.transport != "ucx")
        Fail("--transport must be shm, tcp or ucx");
      o.transport_given = true;
    } else if (a == "--slice")
      o.slice = ParseSize(value());
    else if (a == "--op") {
      o.op_given = true;
      const std::string v = value();
      if (v == "write")
        o.do_write = true, o.do_read = false;
      else if (v == "read")
        o.do_write = false, o.do_read = true;
      else if (v == "both")
        o.do_write = o.do_read = true;
      else
        Fail("--op must be write, read or both");
    } else if (a == "--blocks") {
      o.blocks = ParseSizeList(value());
      o.blocks_given = true;
    } else if (a == "--batch") {
      o.batches.clear();
      for (const auto& s : SplitComma(value())) o.batches.push_back(ParseCount(s, 1, 1u << 20));
    } else if (a == "--threads") {
      o.threads.clear();
      for (const auto& s : SplitComma(value())) o.threads.push_back(ParseCount(s, 1, 64));
      o.threads_given = true;
    } else if (a == "--mem") {
      o.mems.clear();
      for (const std::string& v : SplitComma(value())) {
        std::vector<std::string> kinds = {v};
        if (v == "both") kinds = {"alloc", "malloc"};
        if (v == "all") kinds = {"alloc", "malloc", "memfd", "inplace"};
        for (const std::string& k : kinds) {
          // cuda, cuda-vmm: the target's device memory (cuMemAlloc, or
          // cuMemCreate shared as an fd), for --device (which starts its
          // targets with them); the sweep's own checks are host-only.
          if (k != "alloc" && k != "malloc" && k != "memfd" && k != "inplace" && k != "cuda" &&
              k != "cuda-vmm")
            Fail("--mem must be alloc, malloc, memfd, inplace, both or all (or a comma list)");
          if (std::find(o.mems.begin(), o.mems.end(), k) == o.mems.end()) o.mems.push_back(k);
        }
      }
    } else if (a == "--iters")
      o.iters = ParseCount(value(), 1, 100000000);
    else if (a == "--reps") {
      o.reps = ParseCount(value(), 1, 1000);
      o.reps_given = true;
    } else if (a == "--verify")
      o.verify = true;
    else if (a == "--latency")
      o.latency = true;
    else if (a == "--sweep")
      o.sweep = true;
    else if (a == "--control")
      o.control = true;
    else if (a == "--notify")
      o.notify = true;
    else if (a == "--notify-poll")
      o.notify_poll = true;
    else if (a == "--notify-gap-us")
      o.notify_gap_us = ParseCount(value(), 0, 1000000);
    else if (a == "--failover")
      o.failover = true;
    else if (a == "--many") {
      o.many.clear();
      for (const auto& s : SplitComma(value())) o.many.push_back(ParseCount(s, 1, 64));
    } else if (a == "--many-worker")  // internal: one initiator process of --many
      o.worker_of = value();
    else if (a == "--kv")
      o.kv = true;
    else if (a == "--device")
      o.device = true;
    else if (a == "--table")
      o.table = true;
    else if (a == "--no-cma")
      o.cma = false;
    else if (a == "--stream")
      o.stream = true;
    else if (a == "--window")
      o.window = ParseCount(value(), 1, 65536);
    else if (a == "--slots")
      o.slots = ParseCount(value(), 1, 65536);
    else if (a == "--max-total")
      o.max_total = ParseSize(value());
    else if (a == "--region-size")
      o.region_size = ParseSize(value());
    else if (a == "--baseline-min-part") {
      const std::string v = value();
      o.baseline_min_part = v == "0" ? 0 : ParseSize(v);
    } else if (a == "-h" || a == "--help") {
      Usage();
      std::exit(0);
    } else {
      Usage();
      Fail("unknown option '" + a + "'");
    }
  }
  if (!o.serve && (std::find(o.mems.begin(), o.mems.end(), "cuda") != o.mems.end() ||
                   std::find(o.mems.begin(), o.mems.end(), "cuda-vmm") != o.mems.end()))
    Fail("--mem cuda is the target's memory of --device; run --device for device memory");
  // ucx has no thread/lane option: one engine unless --threads asks for more.
  if (o.transport == "ucx" && !o.threads_given) o.threads = {1};
  // --stream is about small writes unless told otherwise.
  if (o.stream && !o.blocks_given) o.blocks = {4 * KiB};
  if (o.stream && !o.op_given) o.do_write = true, o.do_read = false;
  return o;
}

std::map<std::string, std::string> WithEngineOpts(const Options& o,
                                                  std::map<std::string, std::string> opts) {
  for (const auto& [k, v] : o.engine_opts) opts[k] = v;
  return opts;
}

}  // namespace hixl_bench
