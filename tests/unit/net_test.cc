// Unit tests of address parsing and of the transfer state machine.
#include <gtest/gtest.h>

#include <thread>

#include "common/net.h"
#include "transport/transfer.h"

namespace hixl {
namespace {

TEST(HostPort, Parses) {
  net::HostPort hp;
  ASSERT_TRUE(net::ParseHostPort("127.0.0.1:80", hp).ok());
  EXPECT_EQ(hp.host, "127.0.0.1");
  EXPECT_EQ(hp.port, 80);
  ASSERT_TRUE(net::ParseHostPort("10.0.0.1", hp).ok());
  EXPECT_EQ(hp.port, -1);
  ASSERT_TRUE(net::ParseHostPort("[::1]:9000", hp).ok());
  EXPECT_EQ(hp.host, "::1");
  EXPECT_EQ(hp.ToString(), "[::1]:9000");
  ASSERT_TRUE(net::ParseHostPort("::1", hp).ok());
  EXPECT_EQ(hp.port, -1);
  for (const char* bad : {"", "localhost:80", "1.2.3.4:", "1.2.3.4:65536", "1.2.3.4:-1",
                          "1.2.3.4:8x", "[::1", "[::1]x", "999.1.1.1:5"}) {
    EXPECT_FALSE(net::ParseHostPort(bad, hp).ok()) << bad;
  }
}

std::shared_ptr<transport::Transfer> MakeTransfer(net::Deadline d = net::Deadline::max(),
                                                  memory::RegionRef* keep = nullptr) {
  auto r = std::make_shared<memory::RemoteRegion>(1, 4096, 4096, MEM_PERM_READ_WRITE, false);
  if (keep != nullptr) *keep = r;
  std::vector<memory::RegionRef> pins{r};
  return std::make_shared<transport::Transfer>(
      TransferOp::WRITE, std::vector<memory::Slice>{{1, 4096, 10, r.get()}}, pins, d);
}

TEST(Transfer, EndsOnceWithTheFirstErrorAndUnpins) {
  memory::RegionRef region;
  auto t = MakeTransfer(net::Deadline::max(), &region);
  t->SetParts(3);
  t->PartDone(Status::Ok());
  EXPECT_FALSE(t->Done());
  t->PartDone(Status::Failed("first"));
  t->PartDone(Status::Timeout("second"));
  EXPECT_TRUE(t->Done());
  EXPECT_EQ(t->state(), TransferStatus::FAILED);
  EXPECT_EQ(t->reason().message(), "first");
  EXPECT_EQ(region.use_count(), 1);  // the transfer let go of its pin
}

TEST(Transfer, StopAndDeadline) {
  auto t = MakeTransfer();
  EXPECT_TRUE(t->CheckContinue().ok());
  t->RequestStop(Status::Failed("stop 1"));
  t->RequestStop(Status::Failed("stop 2"));
  EXPECT_EQ(t->CheckContinue().message(), "stop 1");
  auto late = MakeTransfer(net::Clock::now() - std::chrono::milliseconds(1));
  EXPECT_EQ(late->CheckContinue().code(), StatusCode::kTimeout);
  late->PartDone(late->CheckContinue());
  EXPECT_EQ(late->state(), TransferStatus::TIMEOUT);
}

TEST(Transfer, WaitDoneWakesWaiter) {
  auto t = MakeTransfer();
  EXPECT_FALSE(t->WaitDone(net::DeadlineAfterMs(5)));
  std::thread th([t] { t->PartDone(Status::Ok()); });
  EXPECT_TRUE(t->WaitDone(net::DeadlineAfterMs(5000)));
  th.join();
  EXPECT_EQ(t->state(), TransferStatus::COMPLETED);
}

}  // namespace
}  // namespace hixl
