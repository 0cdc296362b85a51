#include "bench/baselines.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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

int CopyPool::Run(const std::vector<CopyOp>& ops, uint64_t total, uint64_t min_part) {
  ops_ = &ops;
  total_ = total;
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

// ------------------------------------------------------- socket baseline ---

SocketBaseline::SocketBaseline() {
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    Fail("socket baseline: cannot listen on loopback");
  tx = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(tx, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    Fail("socket baseline: connect");
  rx = ::accept(l, nullptr, nullptr);
  ::close(l);
  if (rx < 0) Fail("socket baseline: accept");
  int one = 1;
  setsockopt(tx, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
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

}  // namespace hixl_bench
