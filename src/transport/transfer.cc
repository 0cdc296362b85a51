#include "transport/transfer.h"

#include "common/cpu_relax.h"

namespace hixl::transport {

Transfer::Transfer(TransferOp op_, std::vector<memory::Slice> slices_,
                   std::vector<memory::RegionRef> pins, net::Deadline deadline_,
                   std::shared_ptr<const void> keepalive, std::atomic<int>* active)
    : op(op_),
      slices(std::move(slices_)),
      deadline(deadline_),
      pins_(std::move(pins)),
      keepalive_(std::move(keepalive)),
      active_(active) {
  for (const auto& s : slices) bytes_ += s.len;
}

Transfer::~Transfer() {
  // A transfer dropped before it ended (e.g. never submitted) still unpins.
  // The last reference is going: nothing else can touch pins_ (no lock).
  memory::Unpin(pins_);
  if (active_ != nullptr) active_->fetch_sub(1, std::memory_order_acq_rel);  // before keepalive_
}

void Transfer::RequestStop(Status why) {
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_.load(std::memory_order_relaxed)) return;
    stop_reason_ = std::move(why);
    stop_.store(true, std::memory_order_release);
    if (stop_hook_ && !stop_hook_ran_) {
      stop_hook_ran_ = true;
      hook = stop_hook_;
    }
  }
  if (hook) hook();
}

void Transfer::SetStopHook(std::function<void()> hook) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_.load(std::memory_order_relaxed)) {
      stop_hook_ = std::move(hook);
      return;
    }
    if (stop_hook_ran_) return;
    stop_hook_ran_ = true;
  }
  hook();
}

Status Transfer::CheckStop() const {
  if (!stop_.load(std::memory_order_acquire)) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  return stop_reason_;
}

Status Transfer::CheckContinue() const {
  if (stop_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_reason_;
  }
  if (deadline != net::Deadline::max() && net::Clock::now() >= deadline) {
    return Status::Timeout("transfer deadline passed");
  }
  return Status::Ok();
}

void Transfer::PartDone(const Status& s) {
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_error_.ok()) first_error_ = s;
  }
  if (parts_left_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::shared_ptr<const void> keepalive;  // released after the lock, last
  std::function<void(std::shared_ptr<Transfer>)> then;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status end = first_error_;
    // A part that failed because the transfer was stopped reports the
    // stop's reason (TIMEOUT, CANCELLED, ...), not a side effect of it.
    if (!end.ok() && stop_.load(std::memory_order_relaxed) && !stop_reason_.ok()) {
      end = stop_reason_;
    }
    stop_hook_ = nullptr;  // it may hold the channel; not needed any more
    if (end.ok() && then_) {
      // The data is in place: nothing of it moves any more, so the regions
      // are released now; the transfer ends when its then step says so.
      memory::Unpin(pins_);
      then = std::move(then_);
      then_ = nullptr;
    } else {
      EndLocked(std::move(end), keepalive);
    }
  }
  if (then) then(shared_from_this());
}

void Transfer::End(Status s) {
  std::shared_ptr<const void> keepalive;  // released after the lock, last
  std::lock_guard<std::mutex> lock(mu_);
  EndLocked(std::move(s), keepalive);
}

void Transfer::EndLocked(Status s, std::shared_ptr<const void>& keepalive) {
  if (state_.load(std::memory_order_relaxed) != TransferStatus::WAITING) return;
  keepalive.swap(keepalive_);
  if (active_ != nullptr) {
    active_->fetch_sub(1, std::memory_order_acq_rel);
    active_ = nullptr;
  }
  memory::Unpin(pins_);
  reason_ = std::move(s);
  TransferStatus st = reason_.ok()                               ? TransferStatus::COMPLETED
                      : reason_.code() == StatusCode::kTimeout   ? TransferStatus::TIMEOUT
                      : reason_.code() == StatusCode::kCancelled ? TransferStatus::CANCELLED
                                                                 : TransferStatus::FAILED;
  stop_hook_ = nullptr;
  then_ = nullptr;
  state_.store(st, std::memory_order_release);
  cv_.notify_all();
}

Status Transfer::reason() const {
  // reason_ is final once the state left WAITING (stored before it, with
  // release): no lock needed then.
  if (Done()) return reason_;
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

bool Transfer::SpinUntilDone(std::chrono::microseconds for_) const {
  const auto until = net::Clock::now() + for_;
  for (unsigned i = 1;; ++i) {
    if (Done()) return true;
    if (i % 64 == 0 && net::Clock::now() >= until) return false;
    CpuRelax();
  }
}

bool Transfer::WaitDone(net::Deadline d) const {
  if (Done()) return true;
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [this] { return state_.load(std::memory_order_acquire) != TransferStatus::WAITING; };
  if (d == net::Deadline::max()) {
    cv_.wait(lock, done);
    return true;
  }
  return cv_.wait_until(lock, d, done);
}

}  // namespace hixl::transport
