// One transfer request as the transports see it: validated slices, the
// region pins that keep the peer's regions alive, a stop flag, and the end
// state. A transfer ends exactly once; after it has ended no transport
// touches its memory again.
// Thread safety: all methods are thread-safe.
#ifndef HIXL_TRANSPORT_TRANSFER_H_
#define HIXL_TRANSPORT_TRANSFER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common/net.h"
#include "device/cuda.h"
#include "hixl/hixl.h"
#include "memory/remote_regions.h"

namespace hixl::transport {

class Transfer : public std::enable_shared_from_this<Transfer> {
 public:
  // keepalive: what must outlive the transfer's execution (the peer and its
  // channel); released when the transfer ends. active (optional, kept alive
  // by keepalive): a count of work in flight, decremented once at the end.
  Transfer(TransferOp op, std::vector<memory::Slice> slices, std::vector<memory::RegionRef> pins,
           net::Deadline deadline, std::shared_ptr<const void> keepalive = nullptr,
           std::atomic<int>* active = nullptr);
  ~Transfer();

  const TransferOp op;
  const std::vector<memory::Slice> slices;
  const net::Deadline deadline;
  // TransferArgs::stream's event (set before the transfer is submitted): its
  // device copies wait for it (device::Copy's after).
  device::StreamEvent after;
  size_t bytes() const { return bytes_; }

  // Asks every part to stop at its next check; the first reason wins. The
  // stop hook (if any) runs once, on the calling thread, without locks held.
  void RequestStop(Status why);
  // Set by the transport before it starts the parts: lets it drop work not yet
  // begun as soon as a stop is requested. Runs at once if one already was.
  void SetStopHook(std::function<void()> hook);
  // Set by the engine before submitting: when every part succeeded, the
  // transfer does not end yet; then(self) runs instead (on the thread of the
  // last part) and must call Finish exactly once later.
  void SetThen(std::function<void(std::shared_ptr<Transfer>)> then) { then_ = std::move(then); }
  // Ends the transfer (after its then step); no-op if it had ended.
  void Finish(Status s) { End(std::move(s)); }
  bool StopRequested() const { return stop_.load(std::memory_order_acquire); }
  // The reason a part should end with now (stop requested or deadline passed), or OK.
  Status CheckContinue() const;
  // The same without reading the clock: only a requested stop.
  Status CheckStop() const;

  // The transfer runs as n parts; each calls PartDone once. The last one ends it.
  void SetParts(int n) { parts_left_.store(n, std::memory_order_release); }
  void PartDone(const Status& s);
  // Every part has called PartDone (the transfer may still be in its then step).
  bool PartsDone() const { return parts_left_.load(std::memory_order_acquire) <= 0; }

  bool Done() const { return state_.load(std::memory_order_acquire) != TransferStatus::WAITING; }
  TransferStatus state() const { return state_.load(std::memory_order_acquire); }
  Status reason() const;
  // Spins (no sleep, no system call) until the transfer ended or `for_`
  // passed; true if it ended. For a caller whose answer is microseconds
  // away: cheaper than being put to sleep and woken.
  bool SpinUntilDone(std::chrono::microseconds for_) const;
  // Waits until the transfer ended or the deadline passed; true if it ended.
  bool WaitDone(net::Deadline d) const;

 private:
  void End(Status s);
  // End with mu_ held; hands the keepalive out, to be released unlocked.
  void EndLocked(Status s, std::shared_ptr<const void>& keepalive);

  size_t bytes_ = 0;
  std::vector<memory::RegionRef> pins_;
  std::shared_ptr<const void> keepalive_;
  std::atomic<int>* active_ = nullptr;
  std::function<void()> stop_hook_;
  bool stop_hook_ran_ = false;
  std::function<void(std::shared_ptr<Transfer>)> then_;
  std::atomic<bool> stop_{false};
  std::atomic<int> parts_left_{1};
  std::atomic<TransferStatus> state_{TransferStatus::WAITING};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Status stop_reason_;
  Status first_error_;
  Status reason_;
};

}  // namespace hixl::transport

#endif  // HIXL_TRANSPORT_TRANSFER_H_
