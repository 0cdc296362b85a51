// A link whose own channel cannot reach CUDA device memory (UCX built without
// CUDA support, as Debian's) paired with a second channel to the same peer
// that can (tcp lanes, which stage device bytes through host buffers on both
// sides: the initiator copies a WRITE out of its device before sending and a
// READ reply into it after receiving; the target receives into a host buffer,
// copies to its device and answers only after that copy completed).
//
// Transfers that touch device memory on either side, in any descriptor, run
// whole on the second channel; all others on the main one. The second channel
// is opened on the first such transfer (bounded by that transfer's deadline
// and by open_bound, so that a TransferAsync without a deadline does not wait
// on a target that never answers), so links that never move device memory
// cost nothing extra. If it cannot be
// opened, that transfer fails with the reason and Health reports it: the
// engine drops the link, and the next transfer connects anew.
// Thread safety: all methods are thread-safe. Health and Poll never wait for
// the second channel's opening (they run on the control thread).
#ifndef HIXL_TRANSPORT_DEVICE_LANES_H_
#define HIXL_TRANSPORT_DEVICE_LANES_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "transport/transport.h"

namespace hixl::transport {

// True when a slice of [s, s + n) lies in device memory on either side.
bool TouchesDevice(const memory::Slice* s, size_t n);

class DeviceLanesChannel final : public Channel {
 public:
  // Opens the second channel (called at most once, on a submitting thread).
  using Opener = std::function<Status(net::Deadline, std::unique_ptr<Channel>&)>;
  // device_link: the link type of what open makes (the engine's device checks
  // treat device transfers as that link's).
  DeviceLanesChannel(std::unique_ptr<Channel> main, LinkType device_link, Opener open,
                     std::string engine, std::chrono::milliseconds open_bound);
  ~DeviceLanesChannel() override;

  LinkType link_type() const override { return main_->link_type(); }
  LinkType device_link_type() const override { return device_link_; }
  // Device regions need nothing prepared: the second channel's target checks
  // and stages them. The rest are the main channel's.
  Status PrepareRegion(memory::RemoteRegion& r, const wire::Msg* info) override;
  void Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) override;
  size_t InlineLimit() const override { return main_->InlineLimit(); }
  bool InlineMayWait() const override { return main_->InlineMayWait(); }
  // Host memory only: the engine never runs a device transfer inline here
  // (device_link_type differs from link_type).
  Status RunInline(TransferOp op, const memory::Slice* slices, size_t n,
                   net::Deadline deadline) override;
  void Close(net::Deadline drain_until) override;
  Status Health() const override;
  void Poll() override;
  NotifyPath TryNotify(std::string_view name, std::string_view msg) override {
    return main_->TryNotify(name, msg);
  }

  // The second channel is open (for tests and diagnostics).
  bool device_lanes_open() const { return dev_.load(std::memory_order_acquire) != nullptr; }

 private:
  // The second channel, opened if it is not yet; null with why set when it
  // cannot be (closed, or opening failed).
  Channel* DeviceChannel(net::Deadline deadline, Status& why);

  const std::unique_ptr<Channel> main_;
  const LinkType device_link_;
  Opener open_;
  const std::string engine_;
  const std::chrono::milliseconds open_bound_;
  std::mutex open_mu_;  // held while opening (serializes openers only)
  mutable std::mutex mu_;
  bool closed_ = false;  // mu_
  Status failed_;        // mu_: why the second channel could not be opened
  std::atomic<bool> failed_seen_{false};
  std::unique_ptr<Channel> dev_owner_;  // set once (mu_), destroyed with this
  std::atomic<Channel*> dev_{nullptr};  // dev_owner_, once usable
};

}  // namespace hixl::transport

#endif  // HIXL_TRANSPORT_DEVICE_LANES_H_
