#include "bench/baselines.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "bench/common.h"

namespace hixl_bench {

// ------------------------------------------------------- memcpy baseline ---

CopyPool::CopyPool(int threads) : threads_(threads) {
  for (int i = 1; i < threads_; ++i) helpers_.emplace_back([this, i] { Worker(i); });
}

CopyPool::~CopyPool() {
  stop_.store(true, std::memory_order_release);
  gen_.fetch_add(1, std::memory_order_acq_rel);
  gen_.notify_all();
  for (auto& t : helpers_) t.join();
}

int CopyPool::Run(const std::vector<CopyOp>& ops, uint64_t total, uint64_t min_part, Mover how) {
  ops_ = &ops;
  total_ = total;
  how_ = how;
  parts_ = threads_;
  if (min_part > 0)
    parts_ = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(threads_),
                                                 std::max<uint64_t>(1, total / min_part)));
  if (parts_ > 1) {
    pending_.store(threads_ - 1, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_acq_rel);
    gen_.notify_all();
  }
  DoPart(0);
  // Sleep (futex) rather than spin: on a busy 2-core host a spinning waiter
  // steals the core a helper, or the engine's copy threads, need.
  for (int left; (left = pending_.load(std::memory_order_acquire)) != 0;)
    pending_.wait(left, std::memory_order_acquire);
  if (how_.kind != Mover::kMemcpy) {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!error_.empty()) {
      const std::string e = std::move(error_);
      error_.clear();
      Fail(e);
    }
  }
  return parts_;
}

void CopyPool::Worker(int part) {
  uint32_t seen = 0;  // gen_ at construction: a job posted before this thread runs is not missed
  for (;;) {
    gen_.wait(seen, std::memory_order_acquire);  // returns once gen_ != seen
    seen = gen_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    if (part < parts_) DoPart(part);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void CopyPool::DoPart(int part) {
  const uint64_t lo = total_ * static_cast<uint64_t>(part) / static_cast<uint64_t>(parts_);
  const uint64_t hi = total_ * static_cast<uint64_t>(part + 1) / static_cast<uint64_t>(parts_);
  if (how_.kind != Mover::kMemcpy) return CmaPart(lo, hi);
  uint64_t off = 0;
  for (const CopyOp& op : *ops_) {
    const uint64_t end = off + op.len;
    if (end > lo && off < hi) {
      const uint64_t s = std::max(lo, off), e = std::min(hi, end);
      std::memcpy(op.dst + (s - off), op.src + (s - off), e - s);
    }
    if (end >= hi) break;
    off = end;
  }
}

// The bytes [lo, hi) of the job by process_vm_writev/readv, in the calls the
// engine's shm transport would make for them (see Mover).
void CopyPool::CmaPart(uint64_t lo, uint64_t hi) {
  constexpr size_t kChunk = 16 * MiB, kIovMax = 1024;  // the engine's limits
  iovec liov[kIovMax], riov[kIovMax];
  size_t n = 0, bytes = 0;
  const bool write = how_.kind == Mover::kCmaWrite;
  auto flush = [&]() -> bool {
    if (n == 0) return true;
    const ssize_t r = write ? process_vm_writev(how_.pid, liov, n, riov, n, 0)
                            : process_vm_readv(how_.pid, liov, n, riov, n, 0);
    const int err = errno;
    const bool ok = r >= 0 && static_cast<size_t>(r) == bytes;
    if (!ok) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (error_.empty())
        error_ =
            std::string("cma baseline: ") + (write ? "process_vm_writev" : "process_vm_readv") +
            " to pid " + std::to_string(how_.pid) +
            (r < 0 ? std::string(" failed: ") + std::strerror(err)
                   : " moved " + std::to_string(r) + " of " + std::to_string(bytes) + " bytes");
    }
    n = bytes = 0;
    return ok;
  };
  uint64_t off = 0;
  for (const CopyOp& op : *ops_) {
    const uint64_t end = off + op.len;
    if (end > lo && off < hi) {
      for (uint64_t s = std::max(lo, off), e = std::min(hi, end); s < e;) {
        const size_t len = std::min<uint64_t>(e - s, kChunk);
        // local = this process's side, remote = the target's
        uint8_t* local = write ? const_cast<uint8_t*>(op.src) + (s - off) : op.dst + (s - off);
        uint8_t* remote = write ? op.dst + (s - off) : const_cast<uint8_t*>(op.src) + (s - off);
        liov[n] = {local, len};
        riov[n] = {remote, len};
        ++n;
        bytes += len;
        if ((n == kIovMax || bytes >= kChunk) && !flush()) return;
        s += len;
      }
    }
    if (end >= hi) break;
    off = end;
  }
  flush();
}

// ------------------------------------------------------- socket baseline ---

namespace {
// A connected loopback TCP pair (client, server), TCP_NODELAY on both.
void LoopbackPair(int& client, int& server, const std::string& what) {
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    Fail(what + ": cannot listen on loopback");
  client = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) Fail(what + ": connect");
  server = ::accept(l, nullptr, nullptr);
  ::close(l);
  if (server < 0) Fail(what + ": accept");
  // Checked, not assumed: a baseline that waits out Nagle's delay would make
  // every ratio against it flatter hixl.
  for (int fd : {client, server}) {
    int one = 1, got = 0;
    socklen_t got_len = sizeof(got);
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &got, &got_len) != 0 || got == 0)
      Fail(what + ": cannot set TCP_NODELAY");
  }
}
}  // namespace

SocketBaseline::SocketBaseline() {
  LoopbackPair(tx, rx, "socket baseline");
  receiver = std::thread([this] { Receive(); });
}

SocketBaseline::~SocketBaseline() {
  {
    std::lock_guard<std::mutex> lock(mu);
    quit = true;
  }
  cv.notify_all();
  ::shutdown(tx, SHUT_RDWR);
  receiver.join();
  ::close(tx);
  ::close(rx);
}

void SocketBaseline::Run(const std::vector<CopyOp>& copies, uint64_t total, bool staged) {
  if (staged && stage_tx.size() < total) {
    stage_tx.resize(total);
    stage_rx.resize(total);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    job = &copies;
    job_total = total;
    job_staged = staged;
    done = false;
    ++gen;
  }
  cv.notify_all();
  if (staged) {  // serialize: gather every block into one staging buffer
    uint64_t off = 0;
    for (const auto& c : copies) std::memcpy(stage_tx.data() + off, c.src, c.len), off += c.len;
    SendAll(stage_tx.data(), total);
  } else {
    for (const auto& c : copies) SendAll(c.src, c.len);
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [this] { return done; });
}

void SocketBaseline::SendAll(const uint8_t* p, uint64_t n) {
  while (n > 0) {
    ssize_t r = ::send(tx, p, std::min<uint64_t>(n, 1 * MiB), MSG_NOSIGNAL);
    if (r <= 0) Fail("socket baseline: send failed");
    p += r;
    n -= static_cast<uint64_t>(r);
  }
}

void SocketBaseline::RecvAll(uint8_t* p, uint64_t n) {
  while (n > 0) {
    ssize_t r = ::recv(rx, p, n, 0);
    if (r <= 0) Fail("socket baseline: recv failed");
    p += r;
    n -= static_cast<uint64_t>(r);
  }
}

void SocketBaseline::Receive() {
  uint64_t seen = 0;
  for (;;) {
    const std::vector<CopyOp>* copies;
    uint64_t total;
    bool staged;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return quit || gen != seen; });
      if (quit) return;
      seen = gen;
      copies = job;
      total = job_total;
      staged = job_staged;
    }
    if (staged) {  // receive into staging, then copy every block into place
      RecvAll(stage_rx.data(), total);
      uint64_t off = 0;
      for (const auto& c : *copies) std::memcpy(c.dst, stage_rx.data() + off, c.len), off += c.len;
    } else {
      for (const auto& c : *copies) RecvAll(c.dst, c.len);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
  }
}

namespace {
// Blocking: all of n bytes, or false at EOF or an error.
// busy_poll: polls with MSG_DONTWAIT, for at most kPollFor without a byte
// (then it sleeps in recv, so an idle echo thread takes no core from the
// other legs of the run).
constexpr auto kPollFor = std::chrono::microseconds(200);
bool RecvFull(int fd, char* p, size_t n, bool busy_poll = false) {
  // The blocking form reads no clock: it is the baseline being timed.
  Clock::time_point poll_until;
  if (busy_poll) poll_until = Clock::now() + kPollFor;
  while (n > 0) {
    const bool poll = busy_poll && Clock::now() < poll_until;
    ssize_t r = ::recv(fd, p, n, poll ? MSG_DONTWAIT : 0);
    if (r < 0 && (errno == EINTR || (poll && (errno == EAGAIN || errno == EWOULDBLOCK)))) continue;
    if (r > 0 && busy_poll) poll_until = Clock::now() + kPollFor;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool SendFull(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
}  // namespace

PingPong::PingPong(size_t out, bool busy_poll)
    : out_(out), busy_poll_(busy_poll), tx_(out, 'p'), rx_(16) {
  LoopbackPair(a_, b_, "ping-pong baseline");
  echo_ = std::thread([this] {
    std::vector<char> in(out_), answer(16, 'a');
    while (RecvFull(b_, in.data(), in.size(), busy_poll_) &&
           SendFull(b_, answer.data(), answer.size())) {
    }
  });
}

PingPong::~PingPong() {
  ::shutdown(a_, SHUT_RDWR);  // the echo thread sees EOF
  echo_.join();
  ::close(a_);
  ::close(b_);
}

void PingPong::RoundTrip() {
  if (!SendFull(a_, tx_.data(), out_) || !RecvFull(a_, rx_.data(), rx_.size(), busy_poll_))
    Fail("ping-pong baseline: the echo thread went away");
}

}  // namespace hixl_bench
