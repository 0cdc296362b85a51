// hixl-bench: CPU cost of a timed loop — user+sys time of this (initiator)
// process and of the target process, all threads of each, so a figure counts
// the engine's copy and event threads on both sides, not just the caller.
//
// This process: CLOCK_PROCESS_CPUTIME_ID. The target: its process CPU clock
// (clock_getcpuclockid, nanoseconds, readable for our own child), else the
// utime+stime ticks of /proc/<pid>/stat (coarse: 1/CLK_TCK s).
#pragma once

#include <sys/types.h>
#include <time.h>

#include <cstdint>
#include <vector>

namespace hixl_bench {

class CpuClock {
 public:
  struct Sample {
    int64_t self_ns = 0, target_ns = 0;
  };
  // target <= 0: only this process is counted.
  explicit CpuClock(pid_t target = -1);
  Sample Now() const;

 private:
  pid_t target_ = -1;
  bool has_clock_ = false;
  clockid_t clock_{};
};

// The CPU cost of one timed loop: what it moved and how long both processes ran.
struct CpuSpan {
  double self_ms = 0, target_ms = 0;
  double bytes = 0, transfers = 0;
  double MsPerGb() const { return bytes > 0 ? (self_ms + target_ms) / (bytes / 1e9) : 0; }
  double TargetMsPerGb() const { return bytes > 0 ? target_ms / (bytes / 1e9) : 0; }
  double MsPer10k() const { return transfers > 0 ? (self_ms + target_ms) / (transfers / 1e4) : 0; }
};

CpuSpan Span(const CpuClock::Sample& a, const CpuClock::Sample& b, double bytes, double transfers);

// Medians over reps of one leg's CPU figures; empty: not measured.
struct CpuFigures {
  bool measured = false;
  double ms_per_gb = 0, target_ms_per_gb = 0, ms_per_10k = 0;
};
CpuFigures MedianCpu(const std::vector<CpuSpan>& spans);

}  // namespace hixl_bench
