// hixl-bench: what every part of the tool shares — errors, clocks, size
// parsing, the verify pattern, private buffers, medians and percentiles, the
// bandwidth/latency result line (JSON + table) and the progress line.
#pragma once

#include <hixl/hixl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/cpu.h"

namespace hixl_bench {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t GiB = 1024 * MiB;
constexpr int32_t kTransferTimeoutMs = 60000;
constexpr int32_t kConnectTimeoutMs = 5000;
constexpr int kReadyTimeoutMs = 30000;
constexpr int kReplyTimeoutMs = 60000;

struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void Fail(const std::string& msg);
void Check(const hixl::Status& st, const std::string& what);

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b);
// The steady clock in ns; CLOCK_MONOTONIC, so the same in every process here.
int64_t NowNs();

// ---------------------------------------------------------------- parsing ---

// "4K", "64k", "1M", "2G", "4096", "128MiB": binary units.
uint64_t ParseSize(const std::string& text);
std::vector<std::string> SplitComma(const std::string& s);
std::vector<uint64_t> ParseSizeList(const std::string& s);
uint64_t ParseCount(const std::string& s, uint64_t lo, uint64_t hi);
std::string HumanSize(uint64_t n);
std::string Lower(std::string s);

// ---------------------------------------------------------------- pattern ---

// splitmix64: the byte at offset o of a pattern is byte o%8 of Mix(seed + o/8),
// so initiator and target can produce and check it independently.
inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void FillPattern(uint8_t* p, size_t len, uint64_t seed);
// Offset of the first byte that differs from the pattern, or SIZE_MAX.
size_t FindPatternMismatch(const uint8_t* p, size_t len, uint64_t seed);
uint64_t PatternSeed(uint64_t block, uint64_t batch, uint64_t rep, int op);

// --------------------------------------------------------- private buffer ---

// Anonymous private mapping, touched page by page so timing sees no page faults.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t len);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : ptr_(o.ptr_), len_(o.len_) {
    o.ptr_ = nullptr;
    o.len_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(len_, o.len_);
    return *this;
  }
  uint8_t* data() const { return ptr_; }
  size_t size() const { return len_; }

 private:
  uint8_t* ptr_ = nullptr;
  size_t len_ = 0;
};

// ------------------------------------------------------------- statistics ---

double Median(std::vector<double> v);
double Percentile(const std::vector<double>& sorted, double q);
// Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when
// one takes everything.
double JainIndex(const std::vector<double>& x);

// ----------------------------------------------------------------- output ---

// One bandwidth, latency or stream point.
struct Measurement {
  std::string mode;  // "bandwidth" | "latency" | "stream"
  std::string transport, mem, op;
  uint64_t block = 0, batch = 0, threads = 0, iters = 0;
  double gbps = 0, avg_us = 0, p50_us = 0, p99_us = 0;
  double base_gbps = 0, base_p50_us = 0;
  uint64_t base_threads = 1;
  std::string baseline = "memcpy";
  double before_gbps = 0;  // tcp: the staged socket path, same run
  double spin_p50_us = 0;  // tcp latency: the busy-polling ping-pong's p50 (0: none)
  int verified = -1;       // -1: not checked
  // ucx: the baseline is an external ucx_perftest run, which may be missing.
  bool has_baseline = true;   // false: "baseline":"none", no ratio
  std::string baseline_note;  // why there is none (or which perftest test ran)
  // ratio < 0: gbps / base_gbps. Latency rows against ucp_put_lat set it to
  // base_p50_us / p50_us, so > 1 means hixl is faster in both cases.
  double ratio = -1;
  std::string ratio_of = "gbps";  // "gbps" | "p50_us"
  std::string baseline_env;       // UCX_* settings the baseline ran under, if its own
  // shm: bare process_vm_writev/readv of the same bytes into the target's
  // region, split over the same threads (cma_ratio = gbps / cma_gbps).
  bool has_cma = false;
  double cma_gbps = 0, cma_p50_us = 0;
  uint64_t cma_threads = 1;
  // CPU (user+sys) of initiator + target over each leg's timed loops.
  CpuFigures cpu, base_cpu, cma_cpu;
  int remote_mapped = -1;  // shm: 1 the engine mapped the target's region, 0 not, -1 unknown
  // --stream: transfers in flight, transfers per second (ours and perftest's)
  uint64_t window = 0;
  uint64_t slots = 0;  // --stream: block slots cycled through
  double tps = 0, base_tps = 0;
  double Ratio() const {
    if (!has_baseline) return 0;
    if (ratio >= 0) return ratio;
    return base_gbps > 0 ? gbps / base_gbps : 0.0;
  }
};

// The Initialize LinkType value for a --transport name (shm, tcp, ucx).
std::string LinkTypeOption(const std::string& transport);

void PrintJson(const Measurement& m);
// JSON string contents: quotes and backslashes escaped, control characters blanked.
std::string JsonEscape(const std::string& s);
// A CPU figure for a table cell: ms per GB (per_gb) or per 10k transfers; "-" if not measured.
std::string CpuCell(const CpuFigures& f, bool per_gb);
// transport "ucx": the ucx_perftest columns.
void PrintTableHeader(const std::string& transport = "");
void PrintTableRow(const Measurement& m);

// A line on stderr redrawn in place ("  [12/54] shm write 1M threads 2"), only
// when stderr is a terminal, so logs stay clean. Clear() before printing
// anything else to stderr.
class Progress {
 public:
  explicit Progress(uint64_t total);
  ~Progress() { Clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void Step(const std::string& what);  // the next point starts
  void Clear();

 private:
  const bool on_;
  const uint64_t total_;
  uint64_t done_ = 0;
  bool shown_ = false;
};

}  // namespace hixl_bench
