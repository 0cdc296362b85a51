#include "bench/ucx_perftest.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace hixl_bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

bool Executable(const std::string& p) {
  struct stat st{};
  return !p.empty() && stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && Executable(dir + "/" + name)) return dir + "/" + name;
  return "";
}

// Our environment with every "KEY=VALUE" of overrides in place of KEY's own.
std::vector<std::string> MergedEnv(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('=') + 1);
    bool replaced = false;
    for (const auto& o : overrides) replaced = replaced || o.rfind(key, 0) == 0;
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

// fork + exec args[0] (with env, if not empty); stdout and stderr go to
// out_fd. The child dies with us.
pid_t Spawn(const std::vector<std::string>& args, int out_fd,
            const std::vector<std::string>& env = {}) {
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;  // parent (or -1)
  // child: only async-signal-safe calls until exec
  const int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  dup2(out_fd, STDOUT_FILENO);
  dup2(out_fd, STDERR_FILENO);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  if (env.empty())
    execv(argv[0], argv.data());
  else
    execve(argv[0], argv.data(), envp.data());
  _exit(127);
}

// Waits up to ms for pid; true (and *status) once it has been reaped.
bool WaitFor(pid_t pid, int ms, int* status) {
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    const pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Ends pid: a grace period to exit by itself, then TERM, then KILL; always reaps.
void EndProcess(pid_t pid, int grace_ms) {
  if (pid <= 0) return;
  int status = 0;
  if (WaitFor(pid, grace_ms, &status)) return;
  kill(pid, SIGTERM);
  if (WaitFor(pid, 1000, &status)) return;
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
}

// A loopback port nobody listens on right now (bind to port 0, read it back).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// Whether some socket listens on port (the server is ready). Read from
// /proc/net/tcp{,6}: a probing connect() would take the server's one accept.
bool Listening(int port) {
  char want[8];
  std::snprintf(want, sizeof want, ":%04X", port);
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ss(line);
      std::string sl, local, remote, st;
      if (!(ss >> sl >> local >> remote >> st)) continue;
      if (st == "0A" && local.size() > 5 && local.compare(local.size() - 5, 5, want) == 0)
        return true;
    }
  }
  return false;
}

// Runs args to completion (bounded), returning what it printed.
struct Captured {
  bool started = false, timed_out = false;
  int status = 0;
  std::string out;
};

Captured RunCapture(const std::vector<std::string>& args, int timeout_ms,
                    const std::vector<std::string>& env = {}) {
  Captured c;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return c;
  const pid_t pid = Spawn(args, p[1], env);
  close(p[1]);
  if (pid < 0) {
    close(p[0]);
    return c;
  }
  c.started = true;
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) {
      c.timed_out = true;
      break;
    }
    pollfd pfd{p[0], POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(p[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: it exited (or closed its output)
    c.out.append(chunk, static_cast<size_t>(n));
  }
  close(p[0]);
  if (c.timed_out) {
    kill(pid, SIGKILL);
    waitpid(pid, &c.status, 0);
  } else if (!WaitFor(pid, 2000, &c.status)) {
    EndProcess(pid, 0);
  }
  return c;
}

std::string Tail(const std::string& s, size_t n) {
  std::string t = s.size() > n ? s.substr(s.size() - n) : s;
  for (auto& ch : t)
    if (ch == '\n') ch = ' ';
  return t;
}

bool ParseNumber(std::string tok, double* v) {
  std::string clean;
  for (char ch : tok)
    if (ch != ',') clean += ch;  // -N thousands separators
  if (clean.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *v = std::strtod(clean.c_str(), &end);
  return errno == 0 && end != nullptr && *end == '\0';
}

}  // namespace

UcxPerftest::UcxPerftest() {
  if (const char* env = std::getenv("HIXL_BENCH_UCX_PERFTEST")) {
    path_ = env;
    if (path_.empty()) why_not_ = "HIXL_BENCH_UCX_PERFTEST is empty";
  } else {
    path_ = FindOnPath("ucx_perftest");
    if (path_.empty() && Executable("/usr/bin/ucx_perftest")) path_ = "/usr/bin/ucx_perftest";
    if (path_.empty()) why_not_ = "ucx_perftest not found on PATH (Debian: apt install ucx-utils)";
  }
  if (!path_.empty() && !Executable(path_)) {
    why_not_ = path_ + " is not an executable file";
    path_.clear();
  }
  if (path_.empty()) return;
  // Newer UCX splits ucp_get into ucp_get_bw and ucp_get_lat.
  const Captured help = RunCapture({path_, "-h"}, 10000);
  if (help.out.find("ucp_get_bw") != std::string::npos) get_bw_ = "ucp_get_bw";
  if (help.out.find("ucp_get_lat") != std::string::npos) get_lat_ = "ucp_get_lat";
  if (help.out.find("ucp_put_bw") == std::string::npos) {
    why_not_ = path_ + " -h lists no ucp_put_bw test";
    path_.clear();
  }
}

std::string UcxPerftest::TestFor(bool read, bool latency) const {
  if (read) return latency ? get_lat_ : get_bw_;
  return latency ? "ucp_put_lat" : "ucp_put_bw";
}

std::vector<std::string> UcxPerftest::ServerArgs(int port) const {
  return {path_, "-p", std::to_string(port)};
}

std::vector<std::string> UcxPerftest::ClientArgs(int port, const std::string& test, uint64_t size,
                                                 uint64_t iters, uint64_t warmup,
                                                 const std::vector<std::string>& extra) const {
  std::vector<std::string> args = {
      path_, "127.0.0.1",          "-p", std::to_string(port),  "-t", test,
      "-s",  std::to_string(size), "-n", std::to_string(iters), "-w", std::to_string(warmup)};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

UcxPerftest::Result UcxPerftest::Parse(const std::string& text) {
  Result best;
  bool best_final = false;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    for (auto& ch : line)
      if (ch == '|') ch = ' ';
    std::istringstream ls(line);
    std::vector<std::string> toks;
    for (std::string t; ls >> t;) toks.push_back(t);
    bool is_final = false;
    size_t first = 0;
    double v = 0;
    // Leading words ("Final:", a stage name) are labels; the rest must be numbers.
    while (first < toks.size() && !ParseNumber(toks[first], &v)) {
      if (toks[first].rfind("Final", 0) == 0) is_final = true;
      ++first;
    }
    std::vector<double> nums;
    bool all = true;
    for (size_t i = first; i < toks.size() && all; ++i) {
      all = ParseNumber(toks[i], &v);
      nums.push_back(v);
    }
    if (!all || nums.size() != 8) continue;
    if (best_final && !is_final) continue;  // a progress row after the final one
    best.ok = true;
    best.iters = static_cast<uint64_t>(nums[0]);
    best.p50_us = nums[1];
    best.avg_us = nums[2];
    best.gbps = nums[5] * 1048576.0 / 1e9;  // perftest's MB/s are MiB/s
    best.msg_rate = nums[7];
    best_final = best_final || is_final;
  }
  if (!best.ok) best.error = "no result row in ucx_perftest output: '" + Tail(text, 300) + "'";
  return best;
}

UcxPerftest::Result UcxPerftest::Run(const std::string& test, uint64_t size, uint64_t iters,
                                     uint64_t warmup, int timeout_ms,
                                     const std::vector<std::string>& extra) const {
  Result res;
  if (!available()) {
    res.error = why_not_;
    return res;
  }
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  std::string last_error;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int port = FreePort();
    if (port == 0) {
      res.error = "no free loopback port";
      return res;
    }
    char log_path[] = "/tmp/hixl-bench-perftest-XXXXXX";
    const int log_fd = mkstemp(log_path);
    if (log_fd < 0) {
      res.error = std::string("mkstemp failed: ") + std::strerror(errno);
      return res;
    }
    unlink(log_path);
    const std::vector<std::string> env = env_.empty() ? env_ : MergedEnv(env_);
    const pid_t server = Spawn(ServerArgs(port), log_fd, env);
    if (server < 0) {
      close(log_fd);
      res.error = std::string("fork failed: ") + std::strerror(errno);
      return res;
    }
    auto server_log = [&]() {
      std::string s(4096, '\0');
      const ssize_t n = pread(log_fd, s.data(), s.size(), 0);
      s.resize(n > 0 ? static_cast<size_t>(n) : 0);
      return Tail(s, 300);
    };
    // Ready when its socket listens (bounded); a server that died is an error.
    bool ready = false, died = false;
    const auto ready_by = SteadyClock::now() + std::chrono::seconds(10);
    while (!ready && !died && SteadyClock::now() < ready_by) {
      int st = 0;
      if (waitpid(server, &st, WNOHANG) == server) {
        died = true;
        break;
      }
      ready = Listening(port);
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!ready) {
      last_error = died ? "ucx_perftest server exited at once: '" + server_log() + "'"
                        : "ucx_perftest server did not listen on port " + std::to_string(port) +
                              " within 10 s";
      if (!died) EndProcess(server, 0);
      close(log_fd);
      continue;  // the port may have been taken in between: another one
    }
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now())
            .count());
    const Captured client =
        RunCapture(ClientArgs(port, test, size, iters, warmup, extra), std::max(left, 1000), env);
    // The server ends by itself after one test; give it a moment, then end it.
    EndProcess(server, client.timed_out ? 0 : 2000);
    const std::string slog = server_log();
    close(log_fd);
    if (!client.started) {
      res.error = "could not start " + path_;
      return res;
    }
    if (client.timed_out) {
      res.error = "ucx_perftest " + test + " -s " + std::to_string(size) + " did not finish in " +
                  std::to_string(timeout_ms / 1000) + " s";
      return res;
    }
    res = Parse(client.out);
    if (res.ok) return res;
    const bool exited_ok = WIFEXITED(client.status) && WEXITSTATUS(client.status) == 0;
    res.error = "ucx_perftest " + test + " " +
                (exited_ok ? std::string("printed no result") : "failed") + ": '" +
                Tail(client.out, 300) + "'" + (slog.empty() ? "" : " (server: '" + slog + "')");
    return res;
  }
  res.error = last_error;
  return res;
}

}  // namespace hixl_bench
