#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hixl::net {

Deadline DeadlineAfterMs(int64_t timeout_ms) {
  if (timeout_ms <= 0) return Deadline::max();
  return Clock::now() + std::chrono::milliseconds(timeout_ms);
}

int PollTimeoutMs(Deadline d) {
  if (d == Deadline::max()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000000 ? 1000000 : static_cast<int>(left) + 1;
}

Status ErrnoStatus(const std::string& what, int err) {
  std::string msg = what + ": " + std::strerror(err);
  switch (err) {
    case ETIMEDOUT: return Status::Timeout(msg);
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN: return Status::NotConnected(msg);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case ENOSPC: return Status::ResourceExhausted(msg);
    case EINVAL:
    case EFAULT: return Status::ParamInvalid(msg);
    case EPERM:
    case EACCES:
    case ENOSYS: return Status::Unsupported(msg);
    default: return Status::Failed(msg);
  }
}

void Fd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string HostPort::ToString() const {
  bool v6 = host.find(':') != std::string::npos;
  std::string h = v6 ? "[" + host + "]" : host;
  if (port < 0) return h;
  return h + ":" + std::to_string(port);
}

namespace {

bool ParsePort(const std::string& s, int& port) {
  if (s.empty() || s.size() > 5) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > 65535) return false;
  port = v;
  return true;
}

bool IsIpLiteral(const std::string& h) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, h.c_str(), &a4) == 1 || inet_pton(AF_INET6, h.c_str(), &a6) == 1;
}

Status ToSockaddr(const HostPort& hp, sockaddr_storage& ss, socklen_t& len) {
  std::memset(&ss, 0, sizeof(ss));
  int port = hp.port < 0 ? 0 : hp.port;
  auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
  if (inet_pton(AF_INET, hp.host.c_str(), &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in);
    return Status::Ok();
  }
  auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET6, hp.host.c_str(), &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in6);
    return Status::Ok();
  }
  return Status::ParamInvalid("'" + hp.host + "' is not an IPv4 or IPv6 address");
}

Status WaitFd(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (r > 0) return Status::Ok();
    if (r == 0) return Status::Timeout(std::string(what) + ": deadline passed");
    if (errno != EINTR) return ErrnoStatus(std::string(what) + ": poll", errno);
  }
}

Status AbstractAddr(const std::string& name, sockaddr_un& sa, socklen_t& len) {
  if (name.empty() || name.size() + 1 > sizeof(sa.sun_path)) {
    return Status::ParamInvalid("unix socket name '" + name + "' is empty or too long");
  }
  std::memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return Status::Ok();
}

}  // namespace

bool IsLoopbackOrUnspecified(const std::string& ip) {
  in_addr a4;
  if (inet_pton(AF_INET, ip.c_str(), &a4) == 1) {
    const uint32_t v = ntohl(a4.s_addr);
    return (v >> 24) == 127 || v == 0;
  }
  in6_addr a6;
  if (inet_pton(AF_INET6, ip.c_str(), &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6) || IN6_IS_ADDR_UNSPECIFIED(&a6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      const uint8_t first = a6.s6_addr[12];
      const bool zero =
          a6.s6_addr[12] == 0 && a6.s6_addr[13] == 0 && a6.s6_addr[14] == 0 && a6.s6_addr[15] == 0;
      return first == 127 || zero;
    }
  }
  return false;
}

Status ParseHostPort(const std::string& s, HostPort& out) {
  HostPort hp;
  if (s.empty()) return Status::ParamInvalid("engine address is empty");
  if (s.front() == '[') {
    auto close = s.find(']');
    if (close == std::string::npos) return Status::ParamInvalid("'" + s + "': missing ']'");
    hp.host = s.substr(1, close - 1);
    std::string rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':' || !ParsePort(rest.substr(1), hp.port)) {
        return Status::ParamInvalid("'" + s + "': bad port");
      }
    }
  } else {
    auto colon = s.find(':');
    if (colon != std::string::npos && s.find(':', colon + 1) != std::string::npos) {
      hp.host = s;  // bare IPv6 without port
    } else if (colon != std::string::npos) {
      hp.host = s.substr(0, colon);
      if (!ParsePort(s.substr(colon + 1), hp.port)) {
        return Status::ParamInvalid("'" + s + "': bad port (expected 0..65535)");
      }
    } else {
      hp.host = s;
    }
  }
  if (!IsIpLiteral(hp.host)) {
    return Status::ParamInvalid("'" + s + "': host must be an IPv4 or IPv6 address");
  }
  out = hp;
  return Status::Ok();
}

Status SetNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return ErrnoStatus("fcntl(F_GETFL)", errno);
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) < 0) return ErrnoStatus("fcntl(F_SETFL)", errno);
  return Status::Ok();
}

Status TcpListen(const HostPort& where, Fd& fd, int& bound_port) {
  sockaddr_storage ss;
  socklen_t len;
  if (Status s = ToSockaddr(where, ss, len); !s.ok()) return s;
  Fd sock(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock.valid()) return ErrnoStatus("socket", errno);
  int one = 1;
  setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return ErrnoStatus("bind " + where.ToString(), errno);
  }
  if (::listen(sock.get(), 128) != 0) return ErrnoStatus("listen", errno);
  sockaddr_storage got;
  socklen_t got_len = sizeof(got);
  if (getsockname(sock.get(), reinterpret_cast<sockaddr*>(&got), &got_len) != 0) {
    return ErrnoStatus("getsockname", errno);
  }
  bound_port = got.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&got)->sin_port)
                                        : ntohs(reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  fd = std::move(sock);
  return Status::Ok();
}

Status TcpConnect(const HostPort& to, Deadline deadline, Fd& fd, int* connect_errno) {
  if (connect_errno != nullptr) *connect_errno = 0;
  sockaddr_storage ss;
  socklen_t len;
  if (Status s = ToSockaddr(to, ss, len); !s.ok()) return s;
  Fd sock(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock.valid()) return ErrnoStatus("socket", errno);
  int one = 1;
  setsockopt(sock.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    if (errno != EINPROGRESS) {
      if (connect_errno != nullptr) *connect_errno = errno;
      return ErrnoStatus("connect to " + to.ToString(), errno);
    }
    if (Status s = WaitFd(sock.get(), POLLOUT, deadline, "connect"); !s.ok()) {
      return Status::Timeout("connect to " + to.ToString() + ": no answer before the deadline");
    }
    int err = 0;
    socklen_t elen = sizeof(err);
    getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) {
      if (connect_errno != nullptr) *connect_errno = err;
      return ErrnoStatus("connect to " + to.ToString(), err);
    }
  }
  if (Status s = SetNonBlocking(sock.get(), false); !s.ok()) return s;
  fd = std::move(sock);
  return Status::Ok();
}

Status ReadFull(int fd, void* buf, size_t n, Deadline deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (Status s = WaitFd(fd, POLLIN, deadline, "read"); !s.ok()) return s;
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return Status::NotConnected("peer closed the connection");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoStatus("recv", errno);
    }
  }
  return Status::Ok();
}

Status WriteFull(int fd, const void* buf, size_t n, Deadline deadline) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Status s = WaitFd(fd, POLLOUT, deadline, "write"); !s.ok()) return s;
    } else if (r < 0 && errno != EINTR) {
      return ErrnoStatus("send", errno);
    }
  }
  return Status::Ok();
}

Status UnixListen(const std::string& abstract_name, Fd& fd) {
  sockaddr_un sa;
  socklen_t len;
  if (Status s = AbstractAddr(abstract_name, sa, len); !s.ok()) return s;
  Fd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return ErrnoStatus("socket(AF_UNIX)", errno);
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    return ErrnoStatus("bind unix socket", errno);
  }
  if (::listen(sock.get(), 64) != 0) return ErrnoStatus("listen unix socket", errno);
  fd = std::move(sock);
  return Status::Ok();
}

Status UnixConnect(const std::string& abstract_name, Deadline deadline, Fd& fd) {
  (void)deadline;  // local connect either succeeds or fails at once
  sockaddr_un sa;
  socklen_t len;
  if (Status s = AbstractAddr(abstract_name, sa, len); !s.ok()) return s;
  Fd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return ErrnoStatus("socket(AF_UNIX)", errno);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    return ErrnoStatus("connect unix socket", errno);
  }
  fd = std::move(sock);
  return Status::Ok();
}

Status SendWithFd(int sock, const void* buf, size_t n, int pass_fd, Deadline deadline) {
  if (pass_fd < 0) return WriteFull(sock, buf, n, deadline);
  if (n == 0) return Status::ParamInvalid("SendWithFd needs at least one byte");
  iovec iov{const_cast<void*>(buf), n};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
  std::memset(ctrl, 0, sizeof(ctrl));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  for (;;) {
    if (Status s = WaitFd(sock, POLLOUT, deadline, "sendmsg"); !s.ok()) return s;
    ssize_t r = ::sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoStatus("sendmsg(SCM_RIGHTS)", errno);
    }
    // The fd travels with the first byte; the rest is plain data.
    return WriteFull(sock, static_cast<const char*>(buf) + r, n - static_cast<size_t>(r), deadline);
  }
}

Status RecvWithFd(int sock, void* buf, size_t n, Fd* got_fd, Deadline deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (Status s = WaitFd(sock, POLLIN, deadline, "recvmsg"); !s.ok()) return s;
    iovec iov{p, n};
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 4)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
    ssize_t r = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r == 0) return Status::NotConnected("peer closed the unix socket");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoStatus("recvmsg", errno);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (got_fd != nullptr && !got_fd->valid()) {
          got_fd->Reset(fd);
        } else {
          ::close(fd);  // unexpected extra fds are never leaked
        }
      }
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace hixl::net
