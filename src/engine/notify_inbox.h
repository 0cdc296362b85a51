// NotifyInbox: the notifications this engine received, from two paths —
// frames on a link's control connection (Push, on the control loop) and
// records an initiator on this host wrote into the link's shared-memory ring
// (transport/notify_ring.h; attached by the shm transport) — and their
// delivery: GetNotifies (TakeAll) or the callback thread.
//
// Promises:
// - Per link, notifications come out in the order they were posted: a frame
//   from a link is queued only after everything its ring held (the sender
//   uses its ring only when none of its frames is unanswered).
// - At most `depth` notifications per link wait here (NotifyQueueDepth): a
//   frame beyond it is refused; a ring's producer may publish only up to the
//   credit this inbox gives it (delivered + depth).
// - What a ring held when its link closed is still delivered.
// - Across links, notifications that arrived between two TakeAll calls come
//   out grouped by link (earlier links first), each link in its order.
//
// The callback thread delivers one notification at a time; after one it
// polls for up to PollSpinUs (less while such polls keep finding nothing:
// SpinBudget) before it sleeps on the doorbells (its own eventfd,
// and each ring's), which a ring's producer rings only when it sees the
// thread sleeping.
//
// Thread safety: every method may be called from any thread. Ownership: the
// inbox owns the rings (and unmaps them when their link closes).
#ifndef HIXL_ENGINE_NOTIFY_INBOX_H_
#define HIXL_ENGINE_NOTIFY_INBOX_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/spin_budget.h"
#include "hixl/hixl.h"
#include "transport/transport.h"

namespace hixl::engine {

class NotifyInbox final : public transport::NotifySink {
 public:
  using NotifyCallback = Hixl::NotifyCallback;
  NotifyInbox() = default;
  ~NotifyInbox() override { Stop(); }

  Status Start(size_t depth, int spin_us);
  // Stops the callback thread (after the callback in progress returns) and
  // drops everything queued.
  void Stop();

  // Accepted link conn_id from engine `from` completed its handshake / closed.
  void OpenConn(uint64_t conn_id, const std::string& from);
  void CloseConn(uint64_t conn_id);

  // A notification that arrived on conn_id's control connection. False (why
  // says so) when that link's queue is full.
  bool Push(uint64_t conn_id, NotifyDesc d, std::string& why);
  // Everything waiting, in order (see the promises above).
  void TakeAll(std::vector<NotifyDesc>& out);
  void SetCallback(NotifyCallback cb);

  // transport::NotifySink
  bool AttachRing(uint64_t conn_id, std::unique_ptr<transport::NotifyRing> ring) override;

 private:
  struct Source {
    std::string from;
    std::unique_ptr<transport::NotifyRing> ring;
    size_t queued = 0;      // in q_, not yet delivered
    uint64_t released = 0;  // records of the ring delivered (credit = released + depth)
  };
  // Moves what conn's ring holds into q_, up to the link's depth (mu_ held).
  void DrainLocked(uint64_t conn_id, Source& s);
  void DrainAllLocked();
  void ReleaseLocked(uint64_t conn_id, size_t n);
  void Wake();
  void Thread();

  size_t depth_ = 4096;
  int spin_us_ = 0;
  SpinBudget spin_budget_;  // the delivery thread only
  net::Fd bell_;  // eventfd: Push, CloseConn, SetCallback and Stop signal it

  std::mutex mu_;
  std::map<uint64_t, Source> sources_;  // by link (conn id, increasing with time)
  std::deque<std::pair<uint64_t, NotifyDesc>> q_;
  NotifyCallback cb_;
  bool stop_ = false;
  std::atomic<bool> sleeping_{false};  // the callback thread waits on the doorbell
  std::thread thread_;
};

}  // namespace hixl::engine

#endif  // HIXL_ENGINE_NOTIFY_INBOX_H_
