// hixl-bench: the command line.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench/common.h"

namespace hixl_bench {

struct Options {
  bool serve = false;
  std::string transport = "shm";  // shm | tcp | ucx
  uint64_t slice = 0;             // tcp: TcpSliceSize (0: engine default)
  bool do_write = true, do_read = true;
  std::vector<uint64_t> blocks = {4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB,
                                  4 * MiB, 16 * MiB, 64 * MiB, 128 * MiB};
  std::vector<uint64_t> batches = {1};
  std::vector<uint64_t> threads = {1, 2};
  std::vector<std::string> mems = {"alloc"};  // alloc | malloc | memfd | inplace
  uint64_t iters = 0;                         // 0: auto
  uint64_t reps = 5;
  bool verify = false;
  bool latency = false;
  bool sweep = false;     // with --latency: run the bandwidth sweep as well
  bool control = false;   // --control: Connect and RegisterMem timings instead
  bool notify = false;    // --notify: notification latency after a 4 KiB write
  uint64_t notify_gap_us = 0;  // --notify-gap-us: idle time between two notifications
  bool notify_poll = false;    // --notify-poll: the target polls GetNotifies
  bool failover = false;  // --failover: time from a peer's death or hang to FAILED
  bool table = false;
  bool cma = true;       // shm rows: the bare process_vm_writev/readv leg
  bool stream = false;   // --stream: async single-block transfers, a window in flight
  uint64_t window = 64;  // --window: requests in flight in --stream
  uint64_t slots = 0;    // --slots: blocks the stream cycles through (0: the window)
  uint64_t max_total = 256 * MiB;
  uint64_t region_size = 256 * MiB;
  uint64_t baseline_min_part = 1 * MiB;  // 0: always split the memcpy into T parts
  // --engine-opt KEY=VALUE: extra Initialize options of every engine the
  // bench starts (the target's too), e.g. PollSpinUs=0.
  std::vector<std::pair<std::string, std::string>> engine_opts;

  std::vector<uint64_t> many;  // --many N,M: initiator counts (empty: not this mode)
  bool kv = false;             // --kv: exec hixl-kv-bench
  bool device = false;         // --device: CUDA device memory rows (bench/device.cc)
  std::string worker_of;       // --many-worker ENGINE: an initiator process of --many
  // Which options the command line gave (--many has defaults of its own,
  // --kv passes through only what was given).
  bool transport_given = false, reps_given = false, blocks_given = false, threads_given = false;
  bool op_given = false;
};

void Usage();
// opts plus o's --engine-opt values (which win).
std::map<std::string, std::string> WithEngineOpts(const Options& o,
                                                  std::map<std::string, std::string> opts);
Options ParseArgs(int argc, char** argv);

}  // namespace hixl_bench
