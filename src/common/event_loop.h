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
  // Loop thread only, inside a handler: how much later than it should have
  // this loop woke up this time (0 normally; large after the process was
  // stopped or starved while the loop waited).
  std::chrono::milliseconds Lateness() const { return lateness_; }
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
  std::chrono::milliseconds lateness_{0};
  std::chrono::milliseconds carried_late_{0};
};

}  // namespace hixl

#endif  // HIXL_COMMON_EVENT_LOOP_H_
