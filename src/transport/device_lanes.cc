// DeviceLanesChannel: device transfers of a link routed to a second channel
// opened on first use (device_lanes.h).
#include "transport/device_lanes.h"

#include <algorithm>
#include <utility>

#include "transport/transfer.h"

namespace hixl::transport {

bool TouchesDevice(const memory::Slice* s, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (s[i].local_device >= 0 || (s[i].region != nullptr && s[i].region->device)) return true;
  }
  return false;
}

DeviceLanesChannel::DeviceLanesChannel(std::unique_ptr<Channel> main, LinkType device_link,
                                       Opener open, std::string engine,
                                       std::chrono::milliseconds open_bound)
    : main_(std::move(main)),
      device_link_(device_link),
      open_(std::move(open)),
      engine_(std::move(engine)),
      open_bound_(open_bound) {}

DeviceLanesChannel::~DeviceLanesChannel() { Close(net::Clock::now()); }

Status DeviceLanesChannel::PrepareRegion(memory::RemoteRegion& r, const wire::Msg* info) {
  if (r.device) return Status::Ok();
  return main_->PrepareRegion(r, info);
}

Channel* DeviceLanesChannel::DeviceChannel(net::Deadline deadline, Status& why) {
  if (Channel* c = dev_.load(std::memory_order_acquire)) return c;
  std::lock_guard<std::mutex> opening(open_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Channel* c = dev_.load(std::memory_order_acquire)) return c;
    if (closed_) {
      why = Status::NotConnected("link to " + engine_ + " was closed");
      return nullptr;
    }
    if (!failed_.ok()) {
      why = failed_;
      return nullptr;
    }
  }
  std::unique_ptr<Channel> ch;
  Status s = open_(std::min(deadline, net::Clock::now() + open_bound_), ch);
  if (s.ok() && !ch) s = Status::Failed("no channel was made");
  std::lock_guard<std::mutex> lock(mu_);
  if (!s.ok()) {
    failed_ = Status(s.code(), "link to " + engine_ + ": opening " + LinkTypeName(device_link_) +
                                   " lanes for device memory: " + s.message());
    failed_seen_.store(true, std::memory_order_release);
    why = failed_;
    return nullptr;
  }
  dev_owner_ = std::move(ch);
  if (closed_) {
    // Closed while it opened: nothing was sent on it.
    dev_owner_->Close(net::Clock::now());
    why = Status::NotConnected("link to " + engine_ + " was closed");
    return nullptr;
  }
  dev_.store(dev_owner_.get(), std::memory_order_release);
  return dev_owner_.get();
}

void DeviceLanesChannel::Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) {
  if (!TouchesDevice(t->slices.data(), t->slices.size())) {
    main_->Submit(t, caller_waits);
    return;
  }
  Status why;
  Channel* dev = DeviceChannel(t->deadline, why);
  if (dev == nullptr) {
    t->SetParts(1);
    t->PartDone(why);
    return;
  }
  dev->Submit(t, caller_waits);
}

Status DeviceLanesChannel::RunInline(TransferOp op, const memory::Slice* slices, size_t n,
                                     net::Deadline deadline) {
  if (TouchesDevice(slices, n)) {
    return Status::Unsupported("device memory is not moved inline on this link");
  }
  return main_->RunInline(op, slices, n, deadline);
}

void DeviceLanesChannel::Close(net::Deadline drain_until) {
  Channel* dev = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    dev = dev_.load(std::memory_order_acquire);
  }
  main_->Close(drain_until);
  if (dev != nullptr) dev->Close(drain_until);
}

Status DeviceLanesChannel::Health() const {
  if (Status s = main_->Health(); !s.ok()) return s;
  if (const Channel* dev = dev_.load(std::memory_order_acquire)) {
    if (Status s = dev->Health(); !s.ok()) return s;
  }
  if (failed_seen_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  return Status::Ok();
}

void DeviceLanesChannel::Poll() {
  main_->Poll();
  if (Channel* dev = dev_.load(std::memory_order_acquire)) dev->Poll();
}

}  // namespace hixl::transport
