// hixl-bench: the modes besides the bandwidth/latency sweep (hixl_bench.cc).
#pragma once

#include "bench/options.h"

namespace hixl_bench {

// modes.cc
int RunControl(const Options& o);   // --control: Connect, RegisterMem of 1 GiB
int RunNotify(const Options& o);    // --notify: notification after a 4 KiB WRITE
int RunFailover(const Options& o);  // --failover: kill -9 / SIGSTOP -> FAILED
int RunKv(const Options& o);        // --kv: exec hixl-kv-bench (returns only on error)

// device.cc
int RunDevice(const Options& o);  // --device: CUDA device memory beside in-process copies

// many.cc
int RunMany(const Options& o);        // --many N,M: N initiators into one target
int RunManyWorker(const Options& o);  // --many-worker: one of those initiators

}  // namespace hixl_bench
