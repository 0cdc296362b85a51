// Unit tests of DeviceLanesChannel (transport/device_lanes.h) with channels
// that only record what reaches them: which transfers go where, the second
// channel opened once and only for device transfers, an opening that fails,
// closing. The real pairing (UCX with tcp lanes, device memory of the fake
// driver, peer processes) is tests/device/device_tcp_test.cc.
#include "transport/device_lanes.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport/transfer.h"

namespace hixl {
namespace {

using transport::Channel;
using transport::DeviceLanesChannel;
using transport::Transfer;

// Ends every transfer it is given at once, counting them.
class RecordingChannel final : public Channel {
 public:
  RecordingChannel(LinkType type, std::shared_ptr<std::atomic<int>> closes)
      : type_(type), closes_(std::move(closes)) {}
  LinkType link_type() const override { return type_; }
  Status PrepareRegion(memory::RemoteRegion&, const wire::Msg*) override {
    prepared.fetch_add(1);
    return Status::Ok();
  }
  void Submit(const std::shared_ptr<Transfer>& t, bool) override {
    submitted.fetch_add(1);
    t->SetParts(1);
    t->PartDone(Status::Ok());
  }
  size_t InlineLimit() const override { return 1 << 16; }
  Status RunInline(TransferOp, const memory::Slice*, size_t, net::Deadline) override {
    inline_runs.fetch_add(1);
    return Status::Ok();
  }
  void Close(net::Deadline) override { closes_->fetch_add(1); }
  Status Health() const override { return health; }

  std::atomic<int> submitted{0}, inline_runs{0}, prepared{0};
  Status health;

 private:
  LinkType type_;
  std::shared_ptr<std::atomic<int>> closes_;
};

struct Fixture {
  std::shared_ptr<std::atomic<int>> main_closes = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> dev_closes = std::make_shared<std::atomic<int>>(0);
  std::atomic<int> opens{0};
  RecordingChannel* main = nullptr;
  RecordingChannel* dev = nullptr;  // once opened
  Status open_result;
  net::Deadline open_deadline;
  std::unique_ptr<DeviceLanesChannel> ch;

  Fixture() {
    auto m = std::make_unique<RecordingChannel>(LinkType::UCX, main_closes);
    main = m.get();
    ch = std::make_unique<DeviceLanesChannel>(
        std::move(m), LinkType::TCP,
        [this](net::Deadline deadline, std::unique_ptr<Channel>& out) {
          opens.fetch_add(1);
          open_deadline = deadline;
          if (!open_result.ok()) return open_result;
          auto d = std::make_unique<RecordingChannel>(LinkType::TCP, dev_closes);
          dev = d.get();
          out = std::move(d);
          return Status::Ok();
        },
        "peer:1", std::chrono::milliseconds(1000));
  }
};

// A transfer of one slice; device: which side (if any) is device memory.
struct Made {
  std::shared_ptr<memory::RemoteRegion> region;
  std::shared_ptr<Transfer> t;
};
Made Make(bool local_device, bool remote_device) {
  Made m;
  m.region = std::make_shared<memory::RemoteRegion>(1, 4096, 4096, MEM_PERM_READ_WRITE, false);
  m.region->device = remote_device;
  memory::Slice s{1, 4096, 64, m.region.get()};
  s.local_device = local_device ? 0 : -1;
  m.t = std::make_shared<Transfer>(TransferOp::WRITE, std::vector<memory::Slice>{s},
                                   std::vector<memory::RegionRef>{m.region}, net::Deadline::max());
  return m;
}

TEST(DeviceLanes, HostTransfersStayOnTheMainChannelAndOpenNothing) {
  Fixture f;
  EXPECT_EQ(f.ch->link_type(), LinkType::UCX);
  EXPECT_EQ(f.ch->device_link_type(), LinkType::TCP);
  Made m = Make(false, false);
  f.ch->Submit(m.t, true);
  EXPECT_EQ(m.t->state(), TransferStatus::COMPLETED);
  EXPECT_EQ(f.main->submitted.load(), 1);
  EXPECT_EQ(f.opens.load(), 0);
  EXPECT_FALSE(f.ch->device_lanes_open());
  memory::Slice s{1, 4096, 64, m.region.get()};
  EXPECT_TRUE(f.ch->RunInline(TransferOp::WRITE, &s, 1, net::Deadline::max()).ok());
  EXPECT_EQ(f.main->inline_runs.load(), 1);
  // Host regions are the main channel's to prepare; device regions need nothing.
  memory::RemoteRegion host(2, 0, 10, MEM_PERM_READ, false), dev(3, 0, 10, MEM_PERM_READ, false);
  dev.device = true;
  EXPECT_TRUE(f.ch->PrepareRegion(host, nullptr).ok());
  EXPECT_TRUE(f.ch->PrepareRegion(dev, nullptr).ok());
  EXPECT_EQ(f.main->prepared.load(), 1);
}

TEST(DeviceLanes, DeviceTransfersOpenTheSecondChannelOnceAndGoThere) {
  Fixture f;
  std::vector<Made> ms = {Make(true, false), Make(false, true), Make(true, true)};
  std::vector<std::thread> th;
  for (auto& m : ms) th.emplace_back([&f, &m] { f.ch->Submit(m.t, false); });
  for (auto& t : th) t.join();
  for (auto& m : ms) EXPECT_EQ(m.t->state(), TransferStatus::COMPLETED);
  EXPECT_EQ(f.opens.load(), 1);
  // A transfer without a deadline still opens within the bound (1 s here).
  EXPECT_LE(f.open_deadline, net::Clock::now() + std::chrono::milliseconds(1000));
  ASSERT_NE(f.dev, nullptr);
  EXPECT_EQ(f.dev->submitted.load(), 3);
  EXPECT_EQ(f.main->submitted.load(), 0);
  EXPECT_TRUE(f.ch->device_lanes_open());
  // Never inline: the engine sends device transfers through Submit.
  memory::Slice s{1, 4096, 64, ms[1].region.get()};
  EXPECT_EQ(f.ch->RunInline(TransferOp::WRITE, &s, 1, net::Deadline::max()).code(),
            StatusCode::kUnsupported);
  EXPECT_EQ(f.main->inline_runs.load(), 0);
  // The second channel's health is the link's.
  EXPECT_TRUE(f.ch->Health().ok());
  f.dev->health = Status::NotConnected("lane reset");
  EXPECT_EQ(f.ch->Health().message(), "lane reset");
  f.dev->health = Status::Ok();
  f.ch->Close(net::Clock::now());
  f.ch->Close(net::Clock::now());
  EXPECT_EQ(f.main_closes->load(), 1);
  EXPECT_EQ(f.dev_closes->load(), 1);
}

TEST(DeviceLanes, AFailedOpeningFailsTheTransferAndMarksTheLinkUnhealthy) {
  Fixture f;
  f.open_result = Status::Failed("tcp lane to 10.0.0.1:5: target refused the data lane");
  Made a = Make(true, false);
  f.ch->Submit(a.t, true);
  EXPECT_EQ(a.t->state(), TransferStatus::FAILED);
  EXPECT_NE(a.t->reason().message().find("opening TCP lanes for device memory"), std::string::npos)
      << a.t->reason().ToString();
  EXPECT_NE(a.t->reason().message().find("target refused the data lane"), std::string::npos);
  Status h = f.ch->Health();
  EXPECT_FALSE(h.ok());
  EXPECT_NE(h.message().find("target refused the data lane"), std::string::npos);
  // Not tried again on this link (the engine drops it and connects anew).
  Made b = Make(false, true);
  f.ch->Submit(b.t, true);
  EXPECT_EQ(b.t->state(), TransferStatus::FAILED);
  EXPECT_EQ(f.opens.load(), 1);
  // Host transfers still go to the main channel until the link is dropped.
  Made c = Make(false, false);
  f.ch->Submit(c.t, true);
  EXPECT_EQ(c.t->state(), TransferStatus::COMPLETED);
}

TEST(DeviceLanes, AfterCloseNothingOpens) {
  Fixture f;
  f.ch->Close(net::Clock::now());
  Made m = Make(true, true);
  f.ch->Submit(m.t, true);
  EXPECT_EQ(m.t->state(), TransferStatus::FAILED);
  EXPECT_EQ(m.t->reason().code(), StatusCode::kNotConnected);
  EXPECT_EQ(f.opens.load(), 0);
  EXPECT_TRUE(f.ch->Health().ok());
}

}  // namespace
}  // namespace hixl
