// Sockets and file descriptors: RAII fds, address parsing, TCP listen/connect
// with deadlines, exact reads/writes with deadlines, Unix sockets passing fds
// (SCM_RIGHTS). errno becomes a Status here and nowhere else.
// Thread safety: free functions are thread-safe; a Fd is owned by one holder.
#ifndef HIXL_COMMON_NET_H_
#define HIXL_COMMON_NET_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "hixl/status.h"

namespace hixl::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A deadline timeout_ms from now; timeout_ms <= 0 means "never".
Deadline DeadlineAfterMs(int64_t timeout_ms);
// Milliseconds left until d for poll(2): -1 for "never", 0 once passed.
int PollTimeoutMs(Deadline d);

// errno (or a given error number) as a Status, naming what was being done.
Status ErrnoStatus(const std::string& what, int err);

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;  // literal IPv4 or IPv6 address, no brackets
  int port = -1;     // -1: none given
  std::string ToString() const;  // "ip:port", "[v6]:port" or "ip"
};
// Parses "ip", "ip:port", "[v6]", "[v6]:port". Ports must be 0..65535.
Status ParseHostPort(const std::string& s, HostPort& out);
// An IP literal (no brackets) in 127.0.0.0/8, ::1, 0.0.0.0 or :: (also
// v4-mapped): an address that means "this host" wherever it is used.
bool IsLoopbackOrUnspecified(const std::string& ip);

// Bound, listening, non-blocking TCP socket; out.port gets the real port.
Status TcpListen(const HostPort& where, Fd& fd, int& bound_port);
// Blocking-with-deadline connect; the socket is returned in blocking mode
// with TCP_NODELAY set.
// connect_errno (optional): the connect's own error number when it failed
// (ECONNREFUSED: nothing listens there), else 0.
Status TcpConnect(const HostPort& to, Deadline deadline, Fd& fd, int* connect_errno = nullptr);

// Reads/writes exactly n bytes before the deadline (blocking or non-blocking fd).
Status ReadFull(int fd, void* buf, size_t n, Deadline deadline);
Status WriteFull(int fd, const void* buf, size_t n, Deadline deadline);

Status SetNonBlocking(int fd, bool on);

// Abstract-namespace Unix stream sockets (name without the leading NUL).
Status UnixListen(const std::string& abstract_name, Fd& fd);
Status UnixConnect(const std::string& abstract_name, Deadline deadline, Fd& fd);
// Sends bytes plus at most one fd (pass_fd < 0: none).
Status SendWithFd(int sock, const void* buf, size_t n, int pass_fd, Deadline deadline);
// Receives exactly n bytes; if the sender attached an fd it lands in *got_fd.
Status RecvWithFd(int sock, void* buf, size_t n, Fd* got_fd, Deadline deadline);

}  // namespace hixl::net

#endif  // HIXL_COMMON_NET_H_
