// hixl-bench: the references measured in the same run — memcpy split over
// persistent threads (shm), bare cross-memory attach into the target process
// split the same way (shm), a plain loopback socket pair and the staged
// "before" path (tcp).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hixl_bench {

struct CopyOp {
  uint8_t* dst;
  const uint8_t* src;
  size_t len;
};

// How a CopyPool job moves its bytes: memcpy inside this process, or
// cross-memory attach (process_vm_writev: every dst lies in process pid;
// process_vm_readv: every src does), cut into calls the way the engine's shm
// transport cuts them: iovec entries of at most 16 MiB, a call ending at 1024
// entries or once it carries 16 MiB or more.
struct Mover {
  enum Kind { kMemcpy, kCmaWrite, kCmaRead };
  Kind kind = kMemcpy;
  pid_t pid = -1;
};

// T-1 persistent helper threads plus the caller split the bytes of a list of
// copies into T roughly equal parts. Helpers sleep on a futex between jobs
// (like the engine's own copy threads), so thread creation is never timed.
class CopyPool {
 public:
  explicit CopyPool(int threads);
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  // Copies every op; returns how many threads took part. With min_part > 0 no
  // thread gets less than min_part bytes (the engine's own rule), so a small
  // copy runs on the calling thread alone. A cross-memory attach call that
  // fails or moves fewer bytes than asked throws (after every part ended).
  int Run(const std::vector<CopyOp>& ops, uint64_t total, uint64_t min_part, Mover how = {});

 private:
  void Worker(int part);
  void DoPart(int part);
  void CmaPart(uint64_t lo, uint64_t hi);

  const int threads_;
  int parts_ = 1;  // threads taking part in the current job
  std::vector<std::thread> helpers_;
  std::atomic<uint32_t> gen_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::vector<CopyOp>* ops_ = nullptr;
  uint64_t total_ = 0;
  Mover how_;
  std::mutex error_mu_;
  std::string error_;  // the first cross-memory attach failure of the current job
};

// The tcp references, measured in the same run: a plain blocking loopback TCP
// connection between two threads moving the same bytes with 1 MiB send()
// calls straight into the destination ("socket"), and the path hixl replaces
// ("staged": copy into a staging buffer, send, receive into a staging
// buffer, copy into place).
struct SocketBaseline {
  SocketBaseline();
  ~SocketBaseline();
  SocketBaseline(const SocketBaseline&) = delete;
  SocketBaseline& operator=(const SocketBaseline&) = delete;
  // Moves the bytes of copies (dst <- src) over the socket; returns when the
  // receiver holds them all.
  void Run(const std::vector<CopyOp>& copies, uint64_t total, bool staged);

 private:
  void SendAll(const uint8_t* p, uint64_t n);
  void RecvAll(uint8_t* p, uint64_t n);
  void Receive();

  int tx = -1, rx = -1;
  std::thread receiver;
  std::mutex mu;
  std::condition_variable cv;
  const std::vector<CopyOp>* job = nullptr;
  uint64_t job_total = 0, gen = 0;
  bool job_staged = false, done = false, quit = false;
  std::vector<uint8_t> stage_tx, stage_rx;
};

// The tcp latency reference: a loopback TCP ping-pong between the calling
// thread and an echo thread, `out` bytes there and a 16-byte answer back —
// the round trip a 4 KiB WRITE that waits for its acknowledgement needs too.
// Both sockets have TCP_NODELAY; each side reads exactly the message's size.
// Blocking (the default): each side sleeps in recv until its bytes come.
// busy_poll: each side polls recv(MSG_DONTWAIT) instead (for at most 200 us
// without a byte, then it sleeps), as hixl's threads do while a reply is
// due: the floor a polling transfer can reach, without the wake-ups a
// sleeping thread pays for.
class PingPong {
 public:
  explicit PingPong(size_t out, bool busy_poll = false);
  ~PingPong();
  PingPong(const PingPong&) = delete;
  PingPong& operator=(const PingPong&) = delete;
  void RoundTrip();

 private:
  int a_ = -1, b_ = -1;
  size_t out_;
  bool busy_poll_;
  std::vector<char> tx_, rx_;
  std::thread echo_;
};

}  // namespace hixl_bench
