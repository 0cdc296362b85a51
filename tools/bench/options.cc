#include "bench/options.h"

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
      "  --mem alloc|malloc|both     target region from AllocMem or malloc+RegisterMem (default "
      "alloc)\n"
      "  --iters N                   timed transfers per rep (default: >= 256 MiB moved, min 5)\n"
      "  --reps R                    repetitions, median reported (default 5)\n"
      "  --verify                    check the bytes after each rep\n"
      "  --latency                   4 KiB WRITE latency, 10000 iterations (replaces the sweep\n"
      "                              unless --sweep is also given)\n"
      "  --control                   time Connect+Disconnect to the target and RegisterMem+\n"
      "                              DeregisterMem of 1 GiB (200 each) instead of transfers\n"
      "  --notify                    latency of a notification attached to a 4 KiB WRITE,\n"
      "                              post to seen by the target, beside the plain WRITE\n"
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
      "  --table                     human table on stderr (JSON lines always on stdout)\n"
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
    else if (a == "--transport") {
      o.transport = value();
      if (o.transport != "shm" && o.transport != "tcp" && o.transport != "ucx")
        Fail("--transport must be shm, tcp or ucx");
      o.transport_given = true;
    } else if (a == "--slice")
      o.slice = ParseSize(value());
    else if (a == "--op") {
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
      const std::string v = value();
      if (v == "alloc" || v == "malloc")
        o.mems = {v};
      else if (v == "both")
        o.mems = {"alloc", "malloc"};
      else
        Fail("--mem must be alloc, malloc or both");
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
    else if (a == "--failover")
      o.failover = true;
    else if (a == "--many") {
      o.many.clear();
      for (const auto& s : SplitComma(value())) o.many.push_back(ParseCount(s, 1, 64));
    } else if (a == "--many-worker")  // internal: one initiator process of --many
      o.worker_of = value();
    else if (a == "--kv")
      o.kv = true;
    else if (a == "--table")
      o.table = true;
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
  // ucx has no thread/lane option: one engine unless --threads asks for more.
  if (o.transport == "ucx" && !o.threads_given) o.threads = {1};
  return o;
}

}  // namespace hixl_bench
