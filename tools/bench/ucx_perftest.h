// hixl-bench: the --transport ucx baseline, ucx_perftest (UCX's own
// benchmark, Debian ucx-utils), run in the same bench run with the same UCX
// environment (UCX_TLS, UCX_TCP_*_SEG_SIZE, ... are inherited).
//
// Each Run starts a server process (`ucx_perftest -p PORT`, PORT a free
// loopback port, its listening socket seen in /proc/net/tcp before the client
// starts) and the client (`ucx_perftest 127.0.0.1 -p PORT -t TEST -s SIZE
// -n ITERS -w WARMUP`), reads the client's final result line, and ends both by
// pid with a bounded wait (TERM, then KILL). A failure (no binary, a UCX
// transport perftest cannot use, a timeout) is a failed Run with a reason,
// never an exception: the bench then reports no baseline and no ratio.
//
// Units: ucx_perftest prints MB/s meaning 2^20 bytes per second; Result.gbps
// is converted to 10^9 bytes per second like every other figure here.
// Latency tests (ucp_put_lat) are a put ping-pong; perftest prints half the
// round trip (one way, no remote-completion flush).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hixl_bench {

class UcxPerftest {
 public:
  struct Result {
    bool ok = false;
    std::string error;     // why not, when !ok
    uint64_t iters = 0;    // as perftest reports them
    double p50_us = 0;     // latency tests: one-way p50; bandwidth tests: p50 post overhead
    double avg_us = 0;     // same, average
    double gbps = 0;       // overall bandwidth, 10^9 B/s
    double msg_rate = 0;   // overall messages per second
  };

  // Finds the binary: $HIXL_BENCH_UCX_PERFTEST if set (empty: "not installed"),
  // else ucx_perftest on PATH, else /usr/bin/ucx_perftest; and learns from its
  // -h which test names this UCX version has (ucp_get vs ucp_get_bw/_lat).
  UcxPerftest();

  bool available() const { return !path_.empty(); }
  // "KEY=VALUE" settings server and client run with in place of the
  // inherited ones (--stream: UCX_TLS=posix,cma,self for --transport shm).
  void SetEnv(std::vector<std::string> overrides) { env_ = std::move(overrides); }
  const std::vector<std::string>& env() const { return env_; }
  const std::string& path() const { return path_; }
  const std::string& why_not() const { return why_not_; }

  // The perftest test paired with a hixl WRITE/READ bandwidth or latency row.
  std::string TestFor(bool read, bool latency) const;

  // One measurement: `size` bytes per message, `iters` timed messages after
  // `warmup` untimed ones. Bounded by timeout_ms overall. extra: more
  // client arguments (--stream: "-O", the window).
  Result Run(const std::string& test, uint64_t size, uint64_t iters, uint64_t warmup,
             int timeout_ms, const std::vector<std::string>& extra = {}) const;

  // The command lines Run uses (for the report), with PORT as given.
  std::vector<std::string> ServerArgs(int port) const;
  std::vector<std::string> ClientArgs(int port, const std::string& test, uint64_t size,
                                      uint64_t iters, uint64_t warmup,
                                      const std::vector<std::string>& extra = {}) const;

  // Parses perftest's output: the last result row ("Final:" row preferred) of
  // 8 numbers (iterations, lat/overhead p50 avg overall, MB/s avg overall,
  // msg/s avg overall); table borders and separators are ignored.
  static Result Parse(const std::string& text);

 private:
  std::string path_, why_not_;
  std::vector<std::string> env_;
  std::string get_bw_ = "ucp_get", get_lat_ = "ucp_get";
};

}  // namespace hixl_bench
