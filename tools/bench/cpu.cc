#include "bench/cpu.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "bench/common.h"

namespace hixl_bench {
namespace {

int64_t ClockNs(clockid_t c) {
  timespec ts{};
  if (clock_gettime(c, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// utime + stime of pid from /proc/<pid>/stat, in ns (tick resolution).
int64_t ProcStatNs(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces: fields are counted after its ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream ss(text.substr(close + 1));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && ss >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  const long tck = sysconf(_SC_CLK_TCK);
  return static_cast<int64_t>((utime + stime) * (1000000000ull / static_cast<uint64_t>(tck)));
}

}  // namespace

CpuClock::CpuClock(pid_t target) : target_(target) {
  if (target_ > 0 && clock_getcpuclockid(target_, &clock_) == 0 && ClockNs(clock_) >= 0)
    has_clock_ = true;
}

CpuClock::Sample CpuClock::Now() const {
  Sample s;
  s.self_ns = ClockNs(CLOCK_PROCESS_CPUTIME_ID);
  if (target_ > 0) s.target_ns = has_clock_ ? ClockNs(clock_) : ProcStatNs(target_);
  return s;
}

CpuSpan Span(const CpuClock::Sample& a, const CpuClock::Sample& b, double bytes, double transfers) {
  CpuSpan s;
  s.self_ms = static_cast<double>(b.self_ns - a.self_ns) / 1e6;
  s.target_ms = static_cast<double>(b.target_ns - a.target_ns) / 1e6;
  s.bytes = bytes;
  s.transfers = transfers;
  return s;
}

CpuFigures MedianCpu(const std::vector<CpuSpan>& spans) {
  CpuFigures f;
  if (spans.empty()) return f;
  std::vector<double> gb, tgb, tk;
  for (const CpuSpan& s : spans) {
    gb.push_back(s.MsPerGb());
    tgb.push_back(s.TargetMsPerGb());
    tk.push_back(s.MsPer10k());
  }
  f.measured = true;
  f.ms_per_gb = Median(gb);
  f.target_ms_per_gb = Median(tgb);
  f.ms_per_10k = Median(tk);
  return f;
}

}  // namespace hixl_bench
