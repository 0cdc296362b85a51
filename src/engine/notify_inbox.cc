#include "engine/notify_inbox.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "common/log.h"

namespace hixl::engine {

Status NotifyInbox::Start(size_t depth, int spin_us) {
  std::lock_guard<std::mutex> lock(mu_);
  depth_ = depth;
  spin_us_ = spin_us;
  stop_ = false;
  bell_.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!bell_.valid()) return net::ErrnoStatus("eventfd (notification doorbell)", errno);
  return Status::Ok();
}

void NotifyInbox::Stop() {
  NotifyCallback old;  // destroyed after the lock is released (it may need locks of its own)
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    old = std::move(cb_);
    cb_ = nullptr;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, s] : sources_) {
    if (s.ring) s.ring->Close();
  }
  sources_.clear();
  q_.clear();
}

void NotifyInbox::Wake() {
  if (!bell_.valid()) return;
  const uint64_t one = 1;
  ssize_t w = ::write(bell_.get(), &one, sizeof(one));  // EAGAIN: already rung
  (void)w;
}

void NotifyInbox::OpenConn(uint64_t conn_id, const std::string& from) {
  std::lock_guard<std::mutex> lock(mu_);
  sources_[conn_id].from = from;
}

void NotifyInbox::CloseConn(uint64_t conn_id) {
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sources_.find(conn_id);
    if (it == sources_.end()) return;
    if (it->second.ring) {
      // Closed first, then emptied: a record the producer published before
      // it saw the close is taken here (NotifyRing::Push).
      it->second.ring->Close();
      const size_t before = q_.size();
      DrainLocked(conn_id, it->second);
      more = q_.size() != before;
    }
    sources_.erase(it);  // what it queued stays in q_ and is delivered
  }
  if (more && sleeping_.load(std::memory_order_seq_cst)) Wake();
}

bool NotifyInbox::AttachRing(uint64_t conn_id, std::unique_ptr<transport::NotifyRing> ring) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sources_.find(conn_id);
  if (stop_ || it == sources_.end() || it->second.ring) return false;
  ring->SetCredit(it->second.released + depth_);
  it->second.ring = std::move(ring);
  // A sleeping thread does not watch this ring's doorbell yet: it wakes and
  // announces its sleep on every ring again.
  if (sleeping_.load(std::memory_order_seq_cst)) Wake();
  return true;
}

void NotifyInbox::DrainLocked(uint64_t conn_id, Source& s) {
  if (!s.ring) return;
  while (s.queued < depth_) {
    NotifyDesc d;
    const auto r = s.ring->Pop(d.name, d.notify_msg);
    if (r == transport::NotifyRing::PopResult::kEmpty) return;
    if (r == transport::NotifyRing::PopResult::kBroken) {
      HIXL_LOG(WARN) << "the notification ring of " << s.from
                     << " breaks its format; no longer reading it (its notifications now fail)";
      s.ring->Close();
      s.ring.reset();
      return;
    }
    d.from = s.from;
    q_.emplace_back(conn_id, std::move(d));
    ++s.queued;
  }
}

void NotifyInbox::DrainAllLocked() {
  for (auto& [id, s] : sources_) DrainLocked(id, s);
}

void NotifyInbox::ReleaseLocked(uint64_t conn_id, size_t n) {
  auto it = sources_.find(conn_id);
  if (it == sources_.end() || n == 0) return;  // its link closed
  Source& s = it->second;
  s.queued -= std::min(s.queued, n);
  if (s.ring) {
    s.released += n;
    s.ring->SetCredit(s.released + depth_);
  }
}

bool NotifyInbox::Push(uint64_t conn_id, NotifyDesc d, std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Source& s = sources_[conn_id];
    if (s.from.empty()) s.from = d.from;
    DrainLocked(conn_id, s);  // what the ring holds was posted before this frame
    if (s.queued >= depth_) {
      why = "its notification queue for " + d.from + " is full (" + std::to_string(depth_) +
            " waiting; NotifyQueueDepth)";
      return false;
    }
    q_.emplace_back(conn_id, std::move(d));
    ++s.queued;
  }
  if (sleeping_.load(std::memory_order_seq_cst)) Wake();
  return true;
}

void NotifyInbox::TakeAll(std::vector<NotifyDesc>& out) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainAllLocked();
  std::map<uint64_t, size_t> taken;
  while (!q_.empty()) {
    ++taken[q_.front().first];
    out.push_back(std::move(q_.front().second));
    q_.pop_front();
  }
  for (const auto& [id, n] : taken) ReleaseLocked(id, n);
}

void NotifyInbox::SetCallback(NotifyCallback cb) {
  NotifyCallback old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::move(cb_);
    cb_ = std::move(cb);
    if (cb_ && !thread_.joinable() && !stop_) thread_ = std::thread([this] { Thread(); });
  }
  Wake();
}

void NotifyInbox::Thread() {
  std::unique_lock<std::mutex> lock(mu_);
  auto spin_until = net::Clock::now();
  bool in_window = false;  // polling since the last callback, not yet reported
  while (!stop_) {
    if (cb_) DrainAllLocked();
    if (cb_ && !q_.empty()) {
      if (in_window) spin_budget_.Hit();
      in_window = false;
      auto [conn, d] = std::move(q_.front());
      q_.pop_front();
      ReleaseLocked(conn, 1);
      NotifyCallback cb = cb_;
      lock.unlock();
      cb(d);
      cb = nullptr;  // released before the lock is taken again
      // Notifications tend to come in runs: poll briefly for the next one
      // rather than sleep and be woken (bounded by PollSpinUs).
      // Less while such polls keep finding nothing (SpinBudget).
      const auto window = spin_budget_.Window(std::chrono::microseconds(spin_us_));
      spin_until = net::Clock::now() + window;
      in_window = window.count() > 0;
      lock.lock();
      continue;
    }
    if (cb_ && net::Clock::now() < spin_until) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
      continue;
    }
    if (in_window) {
      spin_budget_.Miss();
      in_window = false;
    }
    // Sleep on the doorbell. Announce it first, then look once more: a
    // producer publishing meanwhile either is seen here or sees the flag.
    // (Without a callback nothing is delivered: only SetCallback and Stop
    // wake the thread.)
    sleeping_.store(cb_ != nullptr, std::memory_order_seq_cst);
    bool ready = false;
    if (cb_) {
      for (auto& [id, s] : sources_) {
        if (s.ring && s.ring->SetSleeping(true)) ready = true;
      }
    }
    if (!ready) {
      std::vector<pollfd> fds{{bell_.get(), POLLIN, 0}};
      if (cb_) {
        for (auto& [id, s] : sources_) {
          if (s.ring) fds.push_back({s.ring->bell_fd(), POLLIN, 0});
        }
      }
      lock.unlock();
      // No timeout: every change that could leave something undelivered
      // rings one of these (a ring's producer, Push, AttachRing, CloseConn,
      // SetCallback, Stop). A ring destroyed meanwhile (its link closed) only
      // ends this poll early or not at all: nothing here touches it.
      if (::poll(fds.data(), fds.size(), -1) > 0 && (fds[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t r = ::read(fds[0].fd, &v, sizeof(v));
        (void)r;
      }
      lock.lock();
      for (auto& [id, s] : sources_) {
        if (s.ring) s.ring->DrainBell();
      }
    }
    sleeping_.store(false, std::memory_order_seq_cst);
    for (auto& [id, s] : sources_) {
      if (s.ring) s.ring->SetSleeping(false);
    }
  }
}

}  // namespace hixl::engine
