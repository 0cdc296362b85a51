// tests/fault/fault_proxy.cc — the fault proxy's poll loop (see
// fault_proxy.h for what it does and where it sits).
//
// Per connection there are two flows (up: client -> server, down: server ->
// client). A flow reads chunks from its source socket into a bounded queue
// (kMaxQueued) and writes them to its sink when their release time (delay)
// has come and its token bucket (rate) allows. One-shot faults act on the
// bytes as they are read (corrupt) or once exactly `offset` bytes were
// written (cut, reset, stall). Everything runs on the loop thread under the
// state mutex; poll() is the only call made without it.
#include "fault/fault_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

namespace hixl_fault {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxQueued = 256 * 1024;  // per flow
constexpr size_t kReadChunk = 64 * 1024;
constexpr int kIdlePollMs = 100;

std::string AddrText(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void CloseReset(int fd) {
  if (fd < 0) return;
  linger lg{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  close(fd);
}

struct Settings {
  int delay_ms = 0;
  uint64_t rate = 0;
  bool stall = false;
};

}  // namespace

const char* ClassName(ConnClass c) {
  switch (c) {
    case ConnClass::kControl: return "control";
    case ConnClass::kData: return "data";
    case ConnClass::kAny: return "any";
  }
  return "?";
}

struct FaultProxy::State {
  struct Chunk {
    Clock::time_point release;
    std::string data;
    size_t off = 0;
  };
  struct Flow {
    std::deque<Chunk> q;
    size_t queued = 0;
    uint64_t read = 0;     // bytes read from the source
    uint64_t written = 0;  // bytes written to the sink
    bool eof = false;      // the source sent FIN
    bool shut = false;     // the FIN was passed on
    double tokens = 0;
    Clock::time_point refill = Clock::now();
    std::optional<uint64_t> stop_at;  // a one-shot action waits for `written` to reach this
    Action stop_action = Action::kCut;
  };
  struct Conn {
    uint64_t id = 0;
    ConnClass cls = ConnClass::kData;
    int cfd = -1, sfd = -1;
    bool connecting = true;
    bool open = true;
    Flow up, down;  // up: cfd -> sfd
    std::string client, server;
  };
  struct Shot {
    bool armed = false;
    bool fired = false;
    ConnClass cls = ConnClass::kData;
    Dir dir = Dir::kUp;
    uint64_t offset = 0;
    Action action = Action::kCorrupt;
    uint8_t mask = 0xff;
    uint64_t conn = 0;
  };

  mutable std::mutex mu;
  mutable std::condition_variable cv;  // bytes moved, shot fired
  std::thread th;
  int listen_fd = -1;
  int wake_fd = -1;
  bool stop = false;
  int control_port = 0;
  Settings ctl, data;
  Shot shot;
  uint64_t next_id = 1;
  std::map<uint64_t, std::unique_ptr<Conn>> conns;

  Settings& For(ConnClass c) { return c == ConnClass::kControl ? ctl : data; }
  static bool Matches(ConnClass want, ConnClass have) {
    return want == ConnClass::kAny || want == have;
  }
  void Wake() {
    uint64_t one = 1;
    if (wake_fd >= 0) (void)!write(wake_fd, &one, sizeof(one));
  }

  // ---- loop thread, mu held ------------------------------------------------

  void Kill(Conn& c, bool reset) {
    if (!c.open) return;
    c.open = false;
    if (reset) {
      CloseReset(c.cfd);
      CloseReset(c.sfd);
    } else {
      if (c.cfd >= 0) close(c.cfd);
      if (c.sfd >= 0) close(c.sfd);
    }
    c.cfd = c.sfd = -1;
    c.up.q.clear();
    c.down.q.clear();
    c.up.queued = c.down.queued = 0;
    cv.notify_all();
  }

  void Accept() {
    for (;;) {
      sockaddr_in peer{};
      socklen_t plen = sizeof(peer);
      int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &plen,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      sockaddr_in orig{};
      socklen_t olen = sizeof(orig);
      if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &orig, &olen) != 0) {
        CloseReset(fd);  // not a redirected connection
        continue;
      }
      SetNoDelay(fd);
      auto c = std::make_unique<Conn>();
      c->id = next_id++;
      c->cfd = fd;
      c->client = AddrText(peer);
      c->server = AddrText(orig);
      c->cls = ntohs(orig.sin_port) == control_port ? ConnClass::kControl : ConnClass::kData;
      c->sfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (c->sfd < 0) {
        Kill(*c, true);
      } else {
        SetNoDelay(c->sfd);
        int r = connect(c->sfd, reinterpret_cast<sockaddr*>(&orig), sizeof(orig));
        if (r == 0) {
          c->connecting = false;
        } else if (errno != EINPROGRESS) {
          Kill(*c, true);
        }
      }
      conns[c->id] = std::move(c);
      cv.notify_all();
    }
  }

  bool Stalled(const Conn& c) { return For(c.cls).stall; }

  bool CanRead(const Conn& c, const Flow& f) {
    return c.open && !c.connecting && !Stalled(c) && !f.eof && !f.stop_at && f.queued < kMaxQueued;
  }

  // Refills the bucket; true when the flow's head may be written now.
  // *wait_ms: how long until it may (when it may not), -1 for never.
  bool CanWrite(const Conn& c, Flow& f, Clock::time_point now, int* wait_ms) {
    *wait_ms = -1;
    if (!c.open || c.connecting || Stalled(c) || f.q.empty()) return false;
    if (f.q.front().release > now) {
      *wait_ms = static_cast<int>(
          std::chrono::ceil<std::chrono::milliseconds>(f.q.front().release - now).count());
      return false;
    }
    const uint64_t rate = For(c.cls).rate;
    if (rate == 0) return true;
    const double cap = std::max(16384.0, static_cast<double>(rate) / 50.0);
    f.tokens = std::min(cap, f.tokens + static_cast<double>(rate) *
                                            std::chrono::duration<double>(now - f.refill).count());
    f.refill = now;
    if (f.tokens >= 1.0) return true;
    *wait_ms = std::max(1, static_cast<int>(1000.0 * (1.0 - f.tokens) / static_cast<double>(rate)));
    return false;
  }

  // Reads what it may from src into f. False when the connection ended.
  bool ReadFlow(Conn& c, Flow& f, Dir dir, int src) {
    while (CanRead(c, f)) {
      size_t want = std::min(kReadChunk, kMaxQueued - f.queued);
      std::string buf(want, '\0');
      ssize_t n = recv(src, buf.data(), want, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        Kill(c, true);  // the error (e.g. RST) passes on as RST
        return false;
      }
      if (n == 0) {
        f.eof = true;
        return true;
      }
      buf.resize(static_cast<size_t>(n));
      const uint64_t r0 = f.read;
      if (shot.armed && !shot.fired && Matches(shot.cls, c.cls) && shot.dir == dir) {
        const uint64_t at = std::max(shot.offset, r0);
        const bool corrupt = shot.action == Action::kCorrupt;
        if (corrupt ? at < r0 + buf.size() : at <= r0 + buf.size()) {
          shot.fired = true;
          shot.conn = c.id;
          if (corrupt) {
            buf[at - r0] = static_cast<char>(static_cast<uint8_t>(buf[at - r0]) ^ shot.mask);
          } else {
            f.stop_at = at;  // WriteFlow forwards up to `at`, then acts
            f.stop_action = shot.action;
          }
          cv.notify_all();
        }
      }
      f.read += buf.size();
      if (!buf.empty()) {
        f.queued += buf.size();
        f.q.push_back(Chunk{Clock::now() + std::chrono::milliseconds(For(c.cls).delay_ms),
                            std::move(buf), 0});
      }
    }
    return true;
  }

  // Writes what it may from f to dst, then runs a one-shot action or passes
  // a FIN on. False when the connection ended.
  bool WriteFlow(Conn& c, Flow& f, int dst, int* wait_ms) {
    int w = -1;
    while (CanWrite(c, f, Clock::now(), &w)) {
      Chunk& ch = f.q.front();
      size_t len = ch.data.size() - ch.off;
      const uint64_t rate = For(c.cls).rate;
      if (rate != 0) len = std::min(len, static_cast<size_t>(f.tokens));
      if (f.stop_at) len = std::min(len, static_cast<size_t>(*f.stop_at - f.written));
      if (len == 0) break;
      ssize_t n = send(dst, ch.data.data() + ch.off, len, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        Kill(c, true);
        return false;
      }
      if (rate != 0) f.tokens -= static_cast<double>(n);
      ch.off += static_cast<size_t>(n);
      f.written += static_cast<uint64_t>(n);
      f.queued -= static_cast<size_t>(n);
      if (ch.off == ch.data.size()) f.q.pop_front();
      cv.notify_all();
    }
    if (w >= 0 && (*wait_ms < 0 || w < *wait_ms)) *wait_ms = w;
    if (f.stop_at && f.written == *f.stop_at) {
      const Action a = f.stop_action;
      f.stop_at.reset();
      switch (a) {
        case Action::kCut: Kill(c, false); return false;
        case Action::kReset: Kill(c, true); return false;
        case Action::kStall: For(c.cls).stall = true; break;
        case Action::kCorrupt: break;
      }
    }
    if (f.eof && f.q.empty() && !f.shut && c.open && !Stalled(c)) {
      shutdown(dst, SHUT_WR);
      f.shut = true;
    }
    if (c.up.shut && c.down.shut) {
      Kill(c, false);
      return false;
    }
    return true;
  }

  void Serve(Conn& c, int* wait_ms) {
    if (!c.open) return;
    if (c.connecting) {
      pollfd p{c.sfd, POLLOUT, 0};
      if (poll(&p, 1, 0) <= 0) return;
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(c.sfd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        Kill(c, true);
        return;
      }
      c.connecting = false;
    }
    if (!ReadFlow(c, c.up, Dir::kUp, c.cfd)) return;
    if (!ReadFlow(c, c.down, Dir::kDown, c.sfd)) return;
    if (!WriteFlow(c, c.up, c.sfd, wait_ms)) return;
    (void)WriteFlow(c, c.down, c.cfd, wait_ms);
  }
};

FaultProxy::FaultProxy() : st_(std::make_unique<State>()) {}
FaultProxy::~FaultProxy() { Stop(); }

bool FaultProxy::Start(const std::string& netns, int port, std::string* err) {
  if (st_->th.joinable()) {
    *err = "already started";
    return false;
  }
  std::promise<std::string> ready;
  auto result = ready.get_future();
  st_->th = std::thread([this, netns, port, &ready] {
    auto fail = [&](const std::string& what) {
      ready.set_value(what + ": " + std::strerror(errno));
    };
    if (!netns.empty()) {
      const std::string path = "/var/run/netns/" + netns;
      int nfd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (nfd < 0) return fail("open " + path);
      int r = setns(nfd, CLONE_NEWNET);
      close(nfd);
      if (r != 0) return fail("setns " + path);
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0) return fail("socket");
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t alen = sizeof(a);
    if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(lfd, 128) != 0 ||
        getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &alen) != 0) {
      close(lfd);
      return fail("bind/listen");
    }
    int wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wfd < 0) {
      close(lfd);
      return fail("eventfd");
    }
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      st_->listen_fd = lfd;
      st_->wake_fd = wfd;
      port_ = ntohs(a.sin_port);
    }
    ready.set_value("");
    Loop();
  });
  std::string e = result.get();
  if (!e.empty()) {
    st_->th.join();
    *err = e;
    return false;
  }
  return true;
}

void FaultProxy::Stop() {
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->stop = true;
    st_->Wake();
  }
  if (st_->th.joinable()) st_->th.join();
  std::lock_guard<std::mutex> lock(st_->mu);
  for (auto& [id, c] : st_->conns) st_->Kill(*c, true);
  if (st_->listen_fd >= 0) close(st_->listen_fd);
  if (st_->wake_fd >= 0) close(st_->wake_fd);
  st_->listen_fd = st_->wake_fd = -1;
}

void FaultProxy::Loop() {
  std::vector<pollfd> fds;
  std::unique_lock<std::mutex> lock(st_->mu);
  while (!st_->stop) {
    fds.clear();
    fds.push_back({st_->listen_fd, POLLIN, 0});
    fds.push_back({st_->wake_fd, POLLIN, 0});
    int timeout = kIdlePollMs;
    const auto now = Clock::now();
    for (auto& [id, cp] : st_->conns) {
      State::Conn& c = *cp;
      if (!c.open) continue;
      if (c.connecting) {
        fds.push_back({c.sfd, POLLOUT, 0});
        continue;
      }
      int w = -1;
      short cev = 0, sev = 0;
      if (st_->CanRead(c, c.up)) cev |= POLLIN;
      if (st_->CanRead(c, c.down)) sev |= POLLIN;
      if (st_->CanWrite(c, c.up, now, &w)) sev |= POLLOUT;
      if (w >= 0) timeout = std::min(timeout, w);
      if (st_->CanWrite(c, c.down, now, &w)) cev |= POLLOUT;
      if (w >= 0) timeout = std::min(timeout, w);
      if (cev != 0) fds.push_back({c.cfd, cev, 0});
      if (sev != 0) fds.push_back({c.sfd, sev, 0});
    }
    lock.unlock();
    int r = poll(fds.data(), fds.size(), timeout);
    lock.lock();
    if (st_->stop) break;
    if (r < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!read(st_->wake_fd, &v, sizeof(v));
    }
    if (fds[0].revents & POLLIN) st_->Accept();
    // Serving every connection each round is cheap at the handful a test
    // makes, and it also picks up what a timeout (delay, rate) released.
    for (auto& [id, cp] : st_->conns) {
      int w = -1;
      st_->Serve(*cp, &w);
    }
  }
}

void FaultProxy::SetControlPort(int port) {
  std::lock_guard<std::mutex> lock(st_->mu);
  st_->control_port = port;
}

void FaultProxy::SetDelay(ConnClass c, int ms) {
  std::lock_guard<std::mutex> lock(st_->mu);
  if (c != ConnClass::kData) st_->ctl.delay_ms = ms;
  if (c != ConnClass::kControl) st_->data.delay_ms = ms;
  st_->Wake();
}

void FaultProxy::SetRate(ConnClass c, uint64_t bytes_per_sec) {
  std::lock_guard<std::mutex> lock(st_->mu);
  if (c != ConnClass::kData) st_->ctl.rate = bytes_per_sec;
  if (c != ConnClass::kControl) st_->data.rate = bytes_per_sec;
  st_->Wake();
}

void FaultProxy::SetStall(ConnClass c, bool on) {
  std::lock_guard<std::mutex> lock(st_->mu);
  if (c != ConnClass::kData) st_->ctl.stall = on;
  if (c != ConnClass::kControl) st_->data.stall = on;
  st_->Wake();
}

void FaultProxy::Arm(ConnClass c, Dir d, uint64_t offset, Action a, uint8_t mask) {
  std::lock_guard<std::mutex> lock(st_->mu);
  st_->shot = State::Shot{true, false, c, d, offset, a, mask, 0};
  st_->Wake();
}

bool FaultProxy::Fired(uint64_t* conn_id) const {
  std::lock_guard<std::mutex> lock(st_->mu);
  if (conn_id) *conn_id = st_->shot.conn;
  return st_->shot.fired;
}

bool FaultProxy::WaitFired(int timeout_ms) const {
  std::unique_lock<std::mutex> lock(st_->mu);
  return st_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                          [&] { return st_->shot.fired; });
}

std::vector<ConnStats> FaultProxy::Connections() const {
  std::lock_guard<std::mutex> lock(st_->mu);
  std::vector<ConnStats> out;
  for (const auto& [id, c] : st_->conns) {
    out.push_back(
        ConnStats{c->id, c->cls, c->client, c->server, c->up.written, c->down.written, c->open});
  }
  return out;
}

uint64_t FaultProxy::Bytes(ConnClass c, Dir d) const {
  uint64_t n = 0;
  for (const auto& s : Connections()) {
    if (State::Matches(c, s.cls)) n += d == Dir::kUp ? s.up : s.down;
  }
  return n;
}

bool FaultProxy::WaitBytes(ConnClass c, Dir d, uint64_t n, int timeout_ms) const {
  std::unique_lock<std::mutex> lock(st_->mu);
  return st_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    uint64_t got = 0;
    for (const auto& [id, cp] : st_->conns) {
      if (State::Matches(c, cp->cls)) got += d == Dir::kUp ? cp->up.written : cp->down.written;
    }
    return got >= n;
  });
}

size_t FaultProxy::Count(ConnClass c) const {
  size_t n = 0;
  for (const auto& s : Connections()) n += State::Matches(c, s.cls) ? 1 : 0;
  return n;
}

std::string FaultProxy::Describe() const {
  std::ostringstream o;
  for (const auto& s : Connections()) {
    o << "  #" << s.id << " " << ClassName(s.cls) << " " << s.client << " -> " << s.server << " up "
      << s.up << " down " << s.down << (s.open ? " open" : " closed") << "\n";
  }
  return o.str();
}

}  // namespace hixl_fault
