// tests/peer_process.cc — spawn and drive hixl_test_peer (see peer_process.h).
#include "peer_process.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#ifndef HIXL_TEST_PEER_PATH
#error "HIXL_TEST_PEER_PATH must name the hixl_test_peer executable"
#endif

namespace hixl_test {
namespace {

using Clock = std::chrono::steady_clock;

void IgnoreSigpipeOnce() {
  // Writing to the stdin pipe of a peer that died must not kill the test.
  static const bool done = [] {
    signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  (void)done;
}

bool WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

bool IsOk(const std::string& reply) { return reply == "OK" || reply.rfind("OK ", 0) == 0; }

std::string OkValue(const std::string& reply) {
  if (reply.rfind("OK ", 0) == 0) return reply.substr(3);
  return "";
}

PeerProcess::PeerProcess(std::vector<std::string> extra_options) {
  launch_.options = std::move(extra_options);
  IgnoreSigpipeOnce();
}

PeerProcess::PeerProcess(PeerLaunch launch) : launch_(std::move(launch)) { IgnoreSigpipeOnce(); }

PeerProcess::~PeerProcess() { CloseAndWait(5000); }

bool PeerProcess::Start() {
  if (pid_ > 0) {
    ADD_FAILURE() << "peer already started";
    return false;
  }
  int in_pipe[2];
  int out_pipe[2];
  // O_CLOEXEC: no other child (another peer) may inherit our pipe ends, or
  // closing stdin would not give this peer EOF.
  if (pipe2(in_pipe, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << strerror(errno);
    return false;
  }
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << strerror(errno);
    close(in_pipe[0]);
    close(in_pipe[1]);
    return false;
  }
  // Build argv before fork: the child of a multi-threaded process may only
  // make async-signal-safe calls until exec.
  std::vector<std::string> args = launch_.exec_prefix;
  args.push_back(HIXL_TEST_PEER_PATH);
  if (!launch_.listen.empty()) {
    args.push_back("--listen");
    args.push_back(launch_.listen);
  }
  for (const auto& o : launch_.options) {
    args.push_back("--opt");
    args.push_back(o);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The environment, plus (TSan builds) what keeps TSan from reporting the
  // peer's accesses to its registered memory, which only the remote initiator
  // orders (see tests/tsan_peer.supp): the kernel copies of socket payloads
  // (recv/sendmsg/memcpy interceptors) are not tracked in the peer, and the
  // peer's own fill/hash are suppressed. Races on the engine's data
  // structures are still reported.
  std::vector<std::string> env_strings;
#ifdef HIXL_TEST_TSAN_SUPP
  const bool tsan_supp = kSanitizerDivisor > 1;  // a TSan build
#else
  const bool tsan_supp = false;
#endif
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (tsan_supp && std::strncmp(*e, "TSAN_OPTIONS=", 13) == 0) continue;
    env_strings.emplace_back(*e);
  }
#ifdef HIXL_TEST_TSAN_SUPP
  if (tsan_supp) {
    const char* user = std::getenv("TSAN_OPTIONS");
    env_strings.push_back(std::string("TSAN_OPTIONS=") + (user ? std::string(user) + " " : "") +
                          "ignore_interceptors_accesses=1 suppressions=" + HIXL_TEST_TSAN_SUPP);
  }
#endif
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << strerror(errno);
    close(in_pipe[0]);
    close(in_pipe[1]);
    close(out_pipe[0]);
    close(out_pipe[1]);
    return false;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (dup2(in_pipe[0], 0) < 0 || dup2(out_pipe[1], 1) < 0) _exit(127);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  pid_ = pid;
  to_child_ = in_pipe[1];
  from_child_ = out_pipe[0];
  buffered_.clear();

  std::string line;
  if (!ReadLine(line, 15000)) {
    ADD_FAILURE() << "peer did not print READY within 15 s";
    Kill();
    return false;
  }
  if (line.rfind("READY ", 0) != 0) {
    ADD_FAILURE() << "peer start failed: " << line;
    CloseAndWait(2000);
    return false;
  }
  engine_ = line.substr(6);
  return true;
}

bool PeerProcess::ReadLine(std::string& line, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return true;
    }
    if (from_child_ < 0) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{from_child_, POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) return false;
    char buf[4096];
    ssize_t n = read(from_child_, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;
    }
    if (n == 0) return false;  // EOF: the peer died or closed stdout
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

std::string PeerProcess::Send(const std::string& cmd, int timeout_ms) {
  if (pid_ <= 0 || to_child_ < 0) {
    ADD_FAILURE() << "Send(\"" << cmd << "\") to a peer that is not running";
    return "ERR peer not running";
  }
  if (!WriteAll(to_child_, cmd + "\n")) {
    ADD_FAILURE() << "Send(\"" << cmd << "\"): write to peer failed: " << strerror(errno);
    return "ERR write failed";
  }
  if (timeout_ms < 0) {
    static const char* const kHeavy[] = {"alloc", "reg",  "regsplit", "buf",   "fill", "fillpat",
                                         "hash",  "free", "dereg",    "write", "read"};
    const std::string verb = cmd.substr(0, cmd.find(' '));
    timeout_ms = 10000;
    for (const char* h : kHeavy) {
      if (verb == h) timeout_ms = 30000;
    }
  }
  std::string line;
  if (!ReadLine(line, timeout_ms)) {
    ADD_FAILURE() << "Send(\"" << cmd << "\"): no reply within " << timeout_ms
                  << " ms (peer hung or died)";
    return "ERR no reply";
  }
  return line;
}

bool PeerProcess::Ok(const std::string& cmd, int timeout_ms) {
  std::string r = Send(cmd, timeout_ms);
  if (!IsOk(r)) {
    ADD_FAILURE() << "peer command \"" << cmd << "\" failed: " << r;
    return false;
  }
  return true;
}

uintptr_t PeerProcess::Alloc(const std::string& name, size_t size) {
  std::string r = Send("alloc " + name + " " + std::to_string(size));
  if (!IsOk(r)) {
    ADD_FAILURE() << "peer alloc " << name << " failed: " << r;
    return 0;
  }
  return static_cast<uintptr_t>(std::stoull(OkValue(r)));
}

uintptr_t PeerProcess::Reg(const std::string& name, size_t size, const std::string& perms) {
  std::string r = Send("reg " + name + " " + std::to_string(size) + " " + perms);
  if (!IsOk(r)) {
    ADD_FAILURE() << "peer reg " << name << " failed: " << r;
    return 0;
  }
  return static_cast<uintptr_t>(std::stoull(OkValue(r)));
}

std::string PeerProcess::Hash(const std::string& name, size_t offset, size_t len) {
  std::string r = Send("hash " + name + " " + std::to_string(offset) + " " + std::to_string(len));
  if (!IsOk(r)) {
    ADD_FAILURE() << "peer hash " << name << " failed: " << r;
    return "";
  }
  return OkValue(r);
}

void PeerProcess::Kill() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int st = 0;
    // SIGKILL cannot be caught; the reap is bounded by the kernel, but stay
    // defensive and poll rather than block.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (waitpid(pid_, &st, WNOHANG) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    pid_ = -1;
  }
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
  to_child_ = from_child_ = -1;
}

int PeerProcess::CloseAndWait(int wait_ms) {
  if (to_child_ >= 0) {
    close(to_child_);
    to_child_ = -1;
  }
  int result = -1;
  if (pid_ > 0) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
    bool reaped = false;
    for (;;) {
      int st = 0;
      pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) {
        reaped = true;
        result = (r == pid_) ? st : -1;
        break;
      }
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!reaped) {
      ADD_FAILURE() << "peer pid " << pid_ << " did not exit within " << wait_ms
                    << " ms after stdin EOF; killing it";
      Kill();
      return -1;
    }
    pid_ = -1;
  }
  if (from_child_ >= 0) {
    close(from_child_);
    from_child_ = -1;
  }
  return result;
}

Buffer::Buffer(size_t size, int fill) : size_(size) {
  size_t rounded = (size + 4095) / 4096 * 4096;
  if (rounded == 0) rounded = 4096;
  data_ = static_cast<unsigned char*>(std::aligned_alloc(4096, rounded));
  if (data_ == nullptr) {
    ADD_FAILURE() << "out of memory allocating " << size << " bytes";
    std::abort();
  }
  std::memset(data_, fill, rounded);
}

Buffer::~Buffer() { std::free(data_); }

hixl::TransferStatus WaitForEnd(hixl::Hixl& engine, hixl::TransferReq req, int timeout_ms,
                                hixl::Status* call_status, hixl::Status* reason) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    hixl::TransferStatus st = hixl::TransferStatus::WAITING;
    hixl::Status why;
    hixl::Status s = engine.GetTransferStatus(req, st, why);
    if (call_status) *call_status = s;
    if (!s.ok()) return hixl::TransferStatus::WAITING;
    if (st != hixl::TransferStatus::WAITING) {
      if (reason) *reason = why;
      return st;
    }
    if (Clock::now() >= deadline) return hixl::TransferStatus::WAITING;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int UnusedTcpPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);  // never listened: connecting to it is refused
  return port;
}

int PortOf(const std::string& engine) {
  size_t colon = engine.rfind(':');
  if (colon == std::string::npos) return 0;
  try {
    return std::stoi(engine.substr(colon + 1));
  } catch (...) {
    return 0;
  }
}

const char* TransferStatusName(hixl::TransferStatus s) {
  switch (s) {
    case hixl::TransferStatus::WAITING: return "WAITING";
    case hixl::TransferStatus::COMPLETED: return "COMPLETED";
    case hixl::TransferStatus::TIMEOUT: return "TIMEOUT";
    case hixl::TransferStatus::FAILED: return "FAILED";
    case hixl::TransferStatus::CANCELLED: return "CANCELLED";
  }
  return "UNKNOWN";
}

int RunCommand(const std::vector<std::string>& argv, std::string* out, int timeout_ms) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(p[1], 1);
    dup2(p[1], 2);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(p[1]);
  std::string text;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  bool timed_out = false;
  for (;;) {
    long left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{p[0], POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    char buf[4096];
    ssize_t n = read(p[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(p[0]);
  if (timed_out) kill(pid, SIGKILL);
  int st = 0;
  const auto reap_deadline = Clock::now() + std::chrono::seconds(5);
  pid_t w = 0;
  while ((w = waitpid(pid, &st, WNOHANG)) == 0 && Clock::now() < reap_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (w == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);  // SIGKILLed: the kernel reaps it promptly
    timed_out = true;
  }
  if (out) *out = text;
  if (timed_out || w < 0 || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

}  // namespace hixl_test
