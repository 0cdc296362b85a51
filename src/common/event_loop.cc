#include "common/event_loop.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace hixl {

namespace {
constexpr uint64_t kWakeId = 0;
}

void EventLoop::SetTicker(std::function<void()> fn, int interval_ms) {
  ticker_ = std::move(fn);
  tick_ms_ = interval_ms;
}

Status EventLoop::Start(const std::string& thread_name) {
  epoll_.Reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return net::ErrnoStatus("epoll_create1", errno);
  wake_.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) return net::ErrnoStatus("eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) {
    return net::ErrnoStatus("epoll_ctl", errno);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
    running_ = true;
  }
  thread_ = std::thread([this] { Run(); });
  pthread_setname_np(thread_.native_handle(), thread_name.substr(0, 15).c_str());
  return Status::Ok();
}

void EventLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return;
    stopping_ = true;
  }
  uint64_t one = 1;
  ssize_t r = ::write(wake_.get(), &one, sizeof(one));
  (void)r;
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    posted_.clear();
  }
  entries_.clear();
  epoll_.Reset();
  wake_.Reset();
}

bool EventLoop::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_ || stopping_) return false;
    posted_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  ssize_t r = ::write(wake_.get(), &one, sizeof(one));
  (void)r;
  return true;
}

uint64_t EventLoop::Add(int fd, uint32_t events, Handler h) {
  uint64_t id = next_id_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    HIXL_LOG(ERROR) << "epoll_ctl(ADD) failed: " << std::strerror(errno);
    return 0;
  }
  entries_[id] = Entry{fd, std::make_shared<Handler>(std::move(h))};
  return id;
}

void EventLoop::Modify(uint64_t id, uint32_t events) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, it->second.fd, &ev);
}

void EventLoop::ModifyFd(int fd, uint64_t id, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::Remove(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.fd, nullptr);
  entries_.erase(it);
}

void EventLoop::RunPosted() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    work.swap(posted_);
  }
  for (auto& fn : work) fn();
}

uint64_t EventLoop::Checkpoint() {
  const auto now = net::Clock::now();
  if (stall_bound_.count() > 0 && now - last_checkpoint_ > stall_bound_) ++stalls_;
  last_checkpoint_ = now;
  return stalls_;
}

void EventLoop::Run() {
  thread_id_ = std::this_thread::get_id();
  last_checkpoint_ = net::Clock::now();
  epoll_event events[64];
  auto next_tick = net::Clock::now() + std::chrono::milliseconds(tick_ms_);
  auto spin_until = net::Clock::time_point::min();  // poll without sleeping until then
  bool in_window = false;  // spin_until was set by a window not yet reported
  for (;;) {
    const auto before = net::Clock::now();
    const bool spinning = before < spin_until;
    if (in_window && !spinning) {
      spin_budget_.Miss();  // the window ran out with nothing: poll less next time
      in_window = false;
    }
    int timeout = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - before).count());
    if (timeout < 0 || spinning) timeout = 0;
    int n = epoll_wait(epoll_.get(), events, 64, timeout);
    const int wait_errno = errno;
    if (n > 0 && spin_.count() > 0) {
      if (in_window) spin_budget_.Hit();  // found while polling: the window paid
      const auto window = spin_budget_.Window(spin_);
      spin_until = net::Clock::now() + window;
      in_window = window.count() > 0;
    } else if (n == 0 && spinning) {
      sched_yield();  // let whatever else wants this CPU run between polls
    }
    {
      // The time since the last checkpoint, less what the wait was allowed
      // to take: a stop signal ends the wait (EINTR) once the process
      // continues, a stop between the last handler and this wait shows here
      // too. Counted before any handler of this wake runs.
      const auto now = net::Clock::now();
      if (stall_bound_.count() > 0 &&
          now - last_checkpoint_ - std::chrono::milliseconds(timeout) > stall_bound_)
        ++stalls_;
      last_checkpoint_ = now;
    }
    if (n < 0 && wait_errno != EINTR) {
      HIXL_LOG(ERROR) << "epoll_wait failed: " << std::strerror(wait_errno);
      break;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t id = events[i].data.u64;
      if (id == kWakeId) {
        uint64_t v;
        ssize_t r = ::read(wake_.get(), &v, sizeof(v));
        (void)r;
        continue;
      }
      auto it = entries_.find(id);
      if (it == entries_.end()) continue;  // removed by an earlier handler
      std::shared_ptr<Handler> h = it->second.handler;  // the handler may remove itself
      (*h)(events[i].events);
    }
    RunPosted();
    if (net::Clock::now() >= next_tick) {
      if (ticker_) ticker_();
      next_tick = net::Clock::now() + std::chrono::milliseconds(tick_ms_);
    } else if (next_tick - net::Clock::now() > std::chrono::milliseconds(tick_ms_)) {
      next_tick = net::Clock::now() + std::chrono::milliseconds(tick_ms_);  // interval shortened
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) break;
  }
  RunPosted();
}

}  // namespace hixl
