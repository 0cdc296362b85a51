// hixl-bench: the references measured in the same run — memcpy split over
// persistent threads (shm), a plain loopback socket pair and the staged
// "before" path (tcp).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace hixl_bench {

struct CopyOp {
  uint8_t* dst;
  const uint8_t* src;
  size_t len;
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
  // copy runs on the calling thread alone.
  int Run(const std::vector<CopyOp>& ops, uint64_t total, uint64_t min_part);

 private:
  void Worker(int part);
  void DoPart(int part);

  const int threads_;
  int parts_ = 1;  // threads taking part in the current job
  std::vector<std::thread> helpers_;
  std::atomic<uint32_t> gen_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::vector<CopyOp>* ops_ = nullptr;
  uint64_t total_ = 0;
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

}  // namespace hixl_bench
