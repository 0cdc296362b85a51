// Device memory on both sides, over shm and tcp: transfers ordered after
// the application's stream (TransferArgs::stream), a target that
// deregisters (and frees) its device memory while transfers into it run,
// and a target killed while its device copies are slow. The fake driver's
// freed memory is unmapped, so a copy that landed after FreeMem returned
// would fault in the target (the test then finds it dead).
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "device/device_common.h"

namespace {

using namespace hixl_device_test;  // NOLINT: the shared helpers

class DeviceLinks : public DeviceShm, public ::testing::WithParamInterface<const char*> {
 protected:
  // The peer's device region d of n bytes, the link, and local device
  // memory of n bytes holding pattern seed (freed by the test).
  void SetUpLink(size_t n, uint64_t seed) {
    d_ = Num(peer_.Send("devalloc d " + std::to_string(n)));
    ASSERT_NE(d_, 0u);
    Link(GetParam());
    HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &mine_));
    ld_ = reinterpret_cast<uintptr_t>(mine_);
    ASSERT_TRUE(DevFillPattern(ld_, n, seed));
  }
  uintptr_t d_ = 0, ld_ = 0;
  void* mine_ = nullptr;
  hixl::TransferReq req_ = 0;
};

TEST_P(DeviceLinks, DeregistrationDuringTransfersWaitsAndNothingLandsAfter) {
  const size_t n = 2u << 20;
  ASSERT_NO_FATAL_FAILURE(SetUpLink(n, 31));
  const uintptr_t d = d_, ld = ld_;

  // WRITEs back to back (bounded in count and time) until one is refused.
  std::atomic<int> done{0};
  std::atomic<bool> started{false};
  hixl::Status last;
  std::thread writer([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (int i = 0; i < 20000 && std::chrono::steady_clock::now() < until; ++i) {
      last = e_.TransferSync(peer_.engine(), TransferOp::WRITE, {{ld, d, n}}, 5000);
      if (!last.ok()) return;
      done.fetch_add(1);
      started.store(true);
    }
  });
  ASSERT_TRUE(Eventually([&] { return started.load(); }));
  // Deregisters (waiting for this engine) and frees the device memory.
  const std::string reply = peer_.Send("free d");
  writer.join();
  EXPECT_EQ(reply, "OK");
  EXPECT_GT(done.load(), 0);
  EXPECT_FALSE(last.ok());  // refused, or failed on a lane the target closed
  // The region is gone from this engine's table once FreeMem returned there.
  hixl::Status s = Move(TransferOp::WRITE, {{ld, d, n}});
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  // The target is alive (no copy landed in its freed memory) and serves on.
  const uintptr_t e2 = Num(peer_.Send("devalloc e " + std::to_string(n)));
  ASSERT_NE(e2, 0u);
  ASSERT_TRUE(Eventually([&] { return Move(TransferOp::WRITE, {{ld, e2, n}}).ok(); }));
  EXPECT_EQ(peer_.Hash("e", 0, n), PatternHash(n, 31));
  HIXL_ASSERT_OK(e_.FreeMem(mine_));
}

TEST_P(DeviceLinks, TargetKilledDuringSlowDeviceCopies) {
  SKIP_ON_REAL_DRIVER();
  const size_t n = 4u << 20;
  ASSERT_NO_FATAL_FAILURE(SetUpLink(n, 41));
  const uintptr_t d = d_, ld = ld_;
  // The target's copies (tcp) take 200 ms each; on shm this engine copies.
  ASSERT_TRUE(peer_.Ok("devdelay 200000"));
  std::vector<hixl::TransferReq> reqs;
  for (int i = 0; i < 4; ++i) {
    hixl::TransferReq r = 0;
    const TransferOp op = i % 2 == 0 ? TransferOp::READ : TransferOp::WRITE;
    HIXL_ASSERT_OK(e_.TransferAsync(peer_.engine(), op, {{ld, d, n}}, {}, r));
    reqs.push_back(r);
  }
  ASSERT_EQ(kill(peer_.pid(), SIGKILL), 0);
  // Every request ends (bounded by the heartbeat timeout), none is left
  // waiting; nothing crashes here.
  for (hixl::TransferReq r : reqs) {
    hixl::TransferStatus st = hixl::TransferStatus::WAITING;
    ASSERT_TRUE(Eventually(
        [&] { return e_.GetTransferStatus(r, st).ok() && st != hixl::TransferStatus::WAITING; },
        20000));
  }
  // Once they have ended, this side's device memory no longer changes.
  const std::string now = DevHash(ld, n);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(DevHash(ld, n), now);
  hixl::Status s = Move(TransferOp::WRITE, {{ld, d, n}});
  EXPECT_FALSE(s.ok());
  HIXL_ASSERT_OK(e_.FreeMem(mine_));
}

TEST_P(DeviceLinks, TransfersWaitForTheApplicationsStream) {
  SKIP_ON_REAL_DRIVER();
  const size_t n = 1u << 20;
  ASSERT_NO_FATAL_FAILURE(SetUpLink(n, 51));
  const uintptr_t d = d_, ld = ld_;
  auto& cuda = TestCuda::Get();
  void* app = cuda.NewStream();
  ASSERT_NE(app, nullptr);
  hixl::TransferArgs args;
  args.stream = app;
  struct DelayOff {
    ~DelayOff() { SetCopyDelayUs(0); }
  } delay_off;

  // The application's stream writes new bytes into ld, slowly (300 ms); a
  // WRITE posted right after, with the stream, sends those bytes.
  std::vector<unsigned char> fresh(n);
  hixl_test::FillPattern(fresh.data(), n, 52);
  SetCopyDelayUs(300000);
  ASSERT_TRUE(cuda.CopyAsync(reinterpret_cast<void*>(ld), fresh.data(), n, app));
  HIXL_ASSERT_OK(e_.TransferSync(peer_.engine(), TransferOp::WRITE, {{ld, d, n}}, args, 10000));
  SetCopyDelayUs(0);
  EXPECT_EQ(peer_.Hash("d", 0, n), PatternHash(n, 52));

  // The stream still reads ld (slowly) when a READ into ld is posted with
  // it: the READ's bytes land only after that read.
  ASSERT_TRUE(peer_.Ok("fillpat d 54"));
  std::vector<unsigned char> snap(n, 0);
  SetCopyDelayUs(300000);
  ASSERT_TRUE(cuda.CopyAsync(snap.data(), reinterpret_cast<void*>(ld), n, app));
  HIXL_ASSERT_OK(e_.TransferSync(peer_.engine(), TransferOp::READ, {{ld, d, n}}, args, 10000));
  SetCopyDelayUs(0);
  ASSERT_TRUE(cuda.Sync(app));
  EXPECT_EQ(Hash(snap.data(), n), PatternHash(n, 52));
  EXPECT_EQ(DevHash(ld, n), PatternHash(n, 54));

  // Host memory as the local side: the calling thread waits for the stream
  // (copying ld into it) before the CPU reads it.
  std::vector<unsigned char> host(n, 0);
  SetCopyDelayUs(300000);
  ASSERT_TRUE(peer_.Ok("fill d 0"));
  ASSERT_TRUE(cuda.CopyAsync(host.data(), reinterpret_cast<void*>(ld), n, app));
  HIXL_ASSERT_OK(e_.TransferAsync(peer_.engine(), TransferOp::WRITE,
                                  {{reinterpret_cast<uintptr_t>(host.data()), d, n}}, args, req_));
  SetCopyDelayUs(0);
  hixl::TransferStatus st = hixl::TransferStatus::WAITING;
  ASSERT_TRUE(Eventually(
      [&] { return e_.GetTransferStatus(req_, st).ok() && st != hixl::TransferStatus::WAITING; },
      10000));
  EXPECT_EQ(st, hixl::TransferStatus::COMPLETED);
  EXPECT_EQ(peer_.Hash("d", 0, n), PatternHash(n, 54));

  // A stream that is not one: refused, nothing moves.
  args.stream = reinterpret_cast<void*>(uintptr_t{0xdead0});
  hixl::Status s = e_.TransferSync(peer_.engine(), TransferOp::WRITE, {{ld, d, n}}, args, 1000);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_NE(s.message().find("TransferArgs.stream"), std::string::npos) << s.ToString();
  EXPECT_EQ(peer_.Hash("d", 0, n), PatternHash(n, 54));
  EXPECT_TRUE(cuda.DestroyStream(app));
  HIXL_ASSERT_OK(e_.FreeMem(mine_));
}

INSTANTIATE_TEST_SUITE_P(Links, DeviceLinks, HIXL_DEVICE_LINKS,
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

}  // namespace
