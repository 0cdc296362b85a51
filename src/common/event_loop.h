// A single-threaded epoll loop (the control plane's, and each transport I/O
// thread's). Other threads hand it work with Post; fds are added and removed
// only on the loop thread. A ticker runs on the loop thread at an interval.
// Thread safety: Post, InLoop and ModifyFd from any thread; the rest on the
// loop thread (or before Start).
#ifndef HIXL_COMMON_EVENT_LOOP_H_
#define HIXL_COMMON_EVENT_LOOP_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/net.h"
#include "common/spin_budget.h"

namespace hixl {

class EventLoop {
 public:
  using Handler = std::function<void(uint32_t events)>;

  EventLoop() = default;
  ~EventLoop() { Stop(); }
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void SetTicker(std::function<void()> fn, int interval_ms);
  // Before Start: after a wake that handled events, keep polling (epoll_wait
  // without sleeping, yielding the CPU between polls) for up to this long
  // before sleeping again, less while such polls keep finding nothing
  // (SpinBudget); 0 (default): sleep at once.
  void SetSpin(std::chrono::microseconds spin) { spin_ = spin; }
  Status Start(const std::string& thread_name);
  // Runs the functions already posted, then stops and joins the thread.
  void Stop();

  // Queues fn to run on the loop thread; false once stopped.
  bool Post(std::function<void()> fn);
  bool InLoop() const { return std::this_thread::get_id() == thread_id_.load(); }

  // Loop thread only. Returns an id naming the registration.
  uint64_t Add(int fd, uint32_t events, Handler h);
  void Modify(uint64_t id, uint32_t events);
  // Any thread: changes the events of fd, registered under id (epoll_ctl is
  // thread-safe; the caller guarantees fd is still registered).
  void ModifyFd(int fd, uint64_t id, uint32_t events);
  void Remove(uint64_t id);
  // Stall watch, for handlers that must not act on what they read before
  // this thread could not run for a while (the process stopped by a signal,
  // a paused host, starvation). SetStallBound before Start (0, the default:
  // off). Loop thread only: Checkpoint() notes that the thread runs now and
  // returns how many stalls longer than the bound the loop has seen so far:
  // a wait that ended that much later than its timeout, or that much time
  // between two checkpoints, or between the last one and the next wait
  // (whatever ran in between: other handlers, posted work, the ticker). A
  // handler remembers the count when it starts and fences itself once the
  // count moved, also after a stall another handler of this loop noticed;
  // it checkpoints right before each step that acts, so that the only
  // moment a stall can slip past is between that clock read and the step.
  void SetStallBound(std::chrono::milliseconds bound) { stall_bound_ = bound; }
  uint64_t Checkpoint();
  uint64_t stalls() const { return stalls_; }
  // Loop thread only: how often the ticker runs from now on.
  void SetTickInterval(int interval_ms) { tick_ms_ = interval_ms; }

 private:
  void Run();
  void RunPosted();

  net::Fd epoll_;
  net::Fd wake_;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::mutex mu_;
  std::vector<std::function<void()>> posted_;
  bool stopping_ = false;
  bool running_ = false;
  struct Entry {
    int fd;
    std::shared_ptr<Handler> handler;
  };
  std::unordered_map<uint64_t, Entry> entries_;
  uint64_t next_id_ = 1;
  std::function<void()> ticker_;
  int tick_ms_ = 100;
  std::chrono::microseconds spin_{0};
  SpinBudget spin_budget_;  // loop thread only
  std::chrono::milliseconds stall_bound_{0};
  net::Clock::time_point last_checkpoint_{};  // loop thread only
  uint64_t stalls_ = 0;                       // loop thread only
};

}  // namespace hixl

#endif  // HIXL_COMMON_EVENT_LOOP_H_
