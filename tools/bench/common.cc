#include "bench/common.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace hixl_bench {

void Fail(const std::string& msg) { throw BenchError(msg); }

void Check(const hixl::Status& st, const std::string& what) {
  if (!st.ok()) Fail(what + " failed: " + st.ToString());
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------- parsing ---

uint64_t ParseSize(const std::string& text) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos, 10);
  } catch (const std::exception&) {
    Fail("bad size '" + text + "'");
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  uint64_t mult = 1;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB")
    mult = KiB;
  else if (unit == "M" || unit == "MB" || unit == "MIB")
    mult = MiB;
  else if (unit == "G" || unit == "GB" || unit == "GIB")
    mult = GiB;
  else
    Fail("bad size unit in '" + text + "'");
  if (v == 0) Fail("size must be > 0: '" + text + "'");
  return v * mult;
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  if (out.empty()) Fail("empty list '" + s + "'");
  return out;
}

std::vector<uint64_t> ParseSizeList(const std::string& s) {
  std::vector<uint64_t> out;
  for (const auto& item : SplitComma(s)) out.push_back(ParseSize(item));
  return out;
}

uint64_t ParseCount(const std::string& s, uint64_t lo, uint64_t hi) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos, 10);
  } catch (const std::exception&) {
    Fail("bad number '" + s + "'");
  }
  if (pos != s.size() || v < lo || v > hi)
    Fail("number '" + s + "' out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
         "]");
  return v;
}

std::string HumanSize(uint64_t n) {
  if (n >= GiB && n % GiB == 0) return std::to_string(n / GiB) + "G";
  if (n >= MiB && n % MiB == 0) return std::to_string(n / MiB) + "M";
  if (n >= KiB && n % KiB == 0) return std::to_string(n / KiB) + "K";
  return std::to_string(n);
}

std::string Lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// ---------------------------------------------------------------- pattern ---

void FillPattern(uint8_t* p, size_t len, uint64_t seed) {
  const size_t words = len / 8;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t w = Mix(seed + i);
    std::memcpy(p + 8 * i, &w, 8);
  }
  if (len % 8) {
    const uint64_t w = Mix(seed + words);
    std::memcpy(p + 8 * words, &w, len % 8);
  }
}

size_t FindPatternMismatch(const uint8_t* p, size_t len, uint64_t seed) {
  const size_t words = len / 8;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t w = Mix(seed + i);
    if (std::memcmp(p + 8 * i, &w, 8) != 0) {
      for (size_t b = 0; b < 8; ++b)
        if (p[8 * i + b] != reinterpret_cast<const uint8_t*>(&w)[b]) return 8 * i + b;
    }
  }
  if (len % 8) {
    const uint64_t w = Mix(seed + words);
    for (size_t b = 0; b < len % 8; ++b)
      if (p[8 * words + b] != reinterpret_cast<const uint8_t*>(&w)[b]) return 8 * words + b;
  }
  return SIZE_MAX;
}

uint64_t PatternSeed(uint64_t block, uint64_t batch, uint64_t rep, int op) {
  return Mix(Mix(Mix(block) ^ batch) ^ (rep << 8) ^ static_cast<uint64_t>(op));
}

// --------------------------------------------------------- private buffer ---

Buffer::Buffer(size_t len) : len_(len) {
  if (len == 0) return;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Fail("mmap(" + std::to_string(len) + ") failed: " + std::strerror(errno));
  madvise(p, len, MADV_HUGEPAGE);  // best effort, same treatment for every private buffer
  std::memset(p, 0x5a, len);
  ptr_ = static_cast<uint8_t*>(p);
}

Buffer::~Buffer() {
  if (ptr_) munmap(ptr_, len_);
}

// ------------------------------------------------------------- statistics ---

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t idx = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(idx, sorted.size() - 1)];
}

double JainIndex(const std::vector<double>& x) {
  double sum = 0, sq = 0;
  for (double v : x) sum += v, sq += v * v;
  if (x.empty() || sq <= 0) return 0;
  return sum * sum / (static_cast<double>(x.size()) * sq);
}

// ----------------------------------------------------------------- output ---

std::string LinkTypeOption(const std::string& transport) {
  if (transport == "tcp") return "TCP";
  if (transport == "ucx") return "UCX";
  return "SHM";
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += ' ';
    } else {
      out += ch;
    }
  }
  return out;
}

void PrintJson(const Measurement& m) {
  std::printf(
      "{\"transport\":\"%s\",\"mem\":\"%s\",\"mode\":\"%s\",\"op\":\"%s\",\"block_size\":%" PRIu64
      ",\"batch_size\":%" PRIu64 ",\"threads\":%" PRIu64 ",\"iters\":%" PRIu64
      ",\"gbps\":%.4f,\"avg_us\":%.3f,\"p50_us\":%.3f,\"p99_us\":%.3f",
      m.transport.c_str(), m.mem.c_str(), m.mode.c_str(), m.op.c_str(), m.block, m.batch, m.threads,
      m.iters, m.gbps, m.avg_us, m.p50_us, m.p99_us);
  if (m.window > 0)
    std::printf(",\"window\":%" PRIu64 ",\"slots\":%" PRIu64 ",\"tps\":%.1f", m.window, m.slots,
                m.tps);
  if (!m.has_baseline) {
    // No baseline ran (ucx_perftest missing or failed): no ratio either.
    std::printf(",\"baseline\":\"none\"");
  } else {
    std::printf(",\"baseline\":\"%s\",\"baseline_gbps\":%.4f,\"baseline_p50_us\":%.3f"
                ",\"baseline_threads\":%" PRIu64 ",\"ratio\":%.4f",
                m.baseline.c_str(), m.base_gbps, m.base_p50_us, m.base_threads, m.Ratio());
    if (m.ratio_of != "gbps") std::printf(",\"ratio_of\":\"%s\"", m.ratio_of.c_str());
    if (m.window > 0) std::printf(",\"baseline_tps\":%.1f", m.base_tps);
  }
  if (!m.baseline_env.empty())
    std::printf(",\"baseline_env\":\"%s\"", JsonEscape(m.baseline_env).c_str());
  if (!m.baseline_note.empty())
    std::printf(",\"baseline_note\":\"%s\"", JsonEscape(m.baseline_note).c_str());
  if (m.spin_p50_us > 0) {
    std::printf(",\"pingpong_spin_p50_us\":%.3f,\"spin_ratio\":%.4f", m.spin_p50_us,
                m.p50_us > 0 ? m.spin_p50_us / m.p50_us : 0.0);
  }
  if (m.before_gbps > 0) {
    std::printf(",\"before\":\"staged_socket\",\"before_gbps\":%.4f,\"before_ratio\":%.4f",
                m.before_gbps, m.gbps / m.before_gbps);
  }
  if (m.has_cma) {
    std::printf(",\"cma\":\"%s\",\"cma_gbps\":%.4f,\"cma_p50_us\":%.3f,\"cma_threads\":%" PRIu64
                ",\"cma_ratio\":%.4f",
                m.op == "read" ? "process_vm_readv" : "process_vm_writev", m.cma_gbps, m.cma_p50_us,
                m.cma_threads, m.cma_gbps > 0 ? m.gbps / m.cma_gbps : 0.0);
  }
  // CPU ms (initiator + target, user + sys) per 10^9 bytes and per 10^4 transfers.
  if (m.cpu.measured)
    std::printf(",\"cpu_ms_per_gb\":%.3f,\"cpu_ms_per_10k\":%.3f,\"target_cpu_ms_per_gb\":%.3f",
                m.cpu.ms_per_gb, m.cpu.ms_per_10k, m.cpu.target_ms_per_gb);
  if (m.base_cpu.measured && m.has_baseline)
    std::printf(",\"baseline_cpu_ms_per_gb\":%.3f,\"baseline_cpu_ms_per_10k\":%.3f",
                m.base_cpu.ms_per_gb, m.base_cpu.ms_per_10k);
  if (m.cma_cpu.measured)
    std::printf(",\"cma_cpu_ms_per_gb\":%.3f,\"cma_cpu_ms_per_10k\":%.3f", m.cma_cpu.ms_per_gb,
                m.cma_cpu.ms_per_10k);
  if (m.remote_mapped >= 0)
    std::printf(",\"remote_mapped\":%s", m.remote_mapped ? "true" : "false");
  std::printf(",\"verified\":%s}\n", m.verified < 0 ? "null" : (m.verified ? "true" : "false"));
  std::fflush(stdout);
}

std::string CpuCell(const CpuFigures& f, bool per_gb) {
  if (!f.measured) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", per_gb ? f.ms_per_gb : f.ms_per_10k);
  return b;
}

// The columns after ratio: cma (shm), CPU, mapping.
//   cma_GB/s cma_r  bare cross-memory attach into the target, ours / it
//   cpu/GB          CPU ms (both processes) per 10^9 bytes: hixl, baseline (b), cma (c)
//   cpu/10k         CPU ms (both processes) per 10^4 transfers, hixl
//   map             shm: whether the engine mapped the target's region
void PrintTableHeader(const std::string& transport) {
  if (transport == "ucx") {
    // ratio: GB/s over perftest's for bandwidth rows, perftest p50 over ours for
    // the latency row: > 1 means hixl is faster either way.
    std::fprintf(stderr,
                 "%-7s %-9s %-5s %6s %5s %7s %9s %9s %9s %9s %-12s %9s %9s %7s %7s %7s %s\n", "mem",
                 "mode", "op", "block", "batch", "iters", "GB/s", "avg_us", "p50_us", "p99_us",
                 "perftest", "pt_GB/s", "pt_p50_us", "ratio", "cpu/GB", "cpu/10k", "verified");
    return;
  }
  std::fprintf(stderr,
               "%-7s %-9s %-5s %6s %5s %3s %7s %9s %9s %9s %9s %9s %4s %7s %9s %6s %7s %7s %7s %7s "
               "%3s %s\n",
               "mem", "mode", "op", "block", "batch", "thr", "iters", "GB/s", "avg_us", "p50_us",
               "p99_us", "baseline", "bthr", "ratio", "cma_GB/s", "cma_r", "cpu/GB", "bcpu/GB",
               "ccpu/GB", "cpu/10k", "map", "verified");
}

void PrintTableRow(const Measurement& m) {
  const char* verified = m.verified < 0 ? "-" : (m.verified ? "yes" : "NO");
  const std::string cpu_gb = CpuCell(m.cpu, true), cpu_10k = CpuCell(m.cpu, false);
  if (m.transport == "ucx") {
    std::string test = m.has_baseline ? m.baseline : "none";
    if (test.rfind("ucx_perftest:", 0) == 0) test = test.substr(13);
    char ratio[32] = "-";
    if (m.has_baseline) std::snprintf(ratio, sizeof ratio, "%.3f", m.Ratio());
    std::fprintf(stderr,
                 "%-7s %-9s %-5s %6s %5" PRIu64 " %7" PRIu64
                 " %9.3f %9.2f %9.2f %9.2f %-12s %9.3f %9.2f %7s %7s %7s %s\n",
                 m.mem.c_str(), m.mode.c_str(), m.op.c_str(), HumanSize(m.block).c_str(), m.batch,
                 m.iters, m.gbps, m.avg_us, m.p50_us, m.p99_us, test.c_str(), m.base_gbps,
                 m.base_p50_us, ratio, cpu_gb.c_str(), cpu_10k.c_str(), verified);
    return;
  }
  char cma[32] = "-", cma_r[32] = "-";
  if (m.has_cma) {
    std::snprintf(cma, sizeof cma, "%.3f", m.cma_gbps);
    std::snprintf(cma_r, sizeof cma_r, "%.3f", m.cma_gbps > 0 ? m.gbps / m.cma_gbps : 0.0);
  }
  const char* map = m.remote_mapped < 0 ? "-" : (m.remote_mapped ? "yes" : "no");
  std::fprintf(stderr,
               "%-7s %-9s %-5s %6s %5" PRIu64 " %3" PRIu64 " %7" PRIu64
               " %9.3f %9.2f %9.2f %9.2f %9.3f %4" PRIu64 " %7.3f %9s %6s %7s %7s %7s %7s %3s %s\n",
               m.mem.c_str(), m.mode.c_str(), m.op.c_str(), HumanSize(m.block).c_str(), m.batch,
               m.threads, m.iters, m.gbps, m.avg_us, m.p50_us, m.p99_us, m.base_gbps,
               m.base_threads, m.Ratio(), cma, cma_r, cpu_gb.c_str(),
               CpuCell(m.base_cpu, true).c_str(), CpuCell(m.cma_cpu, true).c_str(), cpu_10k.c_str(),
               map, verified);
}

// --------------------------------------------------------------- progress ---

Progress::Progress(uint64_t total) : on_(isatty(STDERR_FILENO) == 1), total_(total) {}

void Progress::Step(const std::string& what) {
  ++done_;
  if (!on_) return;
  // \r and "erase to end of line": the line is redrawn in place.
  std::fprintf(stderr, "\r\033[K  [%" PRIu64 "/%" PRIu64 "] %s", done_, total_, what.c_str());
  std::fflush(stderr);
  shown_ = true;
}

void Progress::Clear() {
  if (!shown_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace hixl_bench
