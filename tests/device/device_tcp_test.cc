// CUDA device memory over links that stage it through host buffers: tcp
// (the initiator copies a device WRITE out before sending it and a READ
// reply into the device after receiving it; the target does the same on its
// side, in steps of 4 MiB), and UCX, whose device transfers run on tcp lanes
// to the same peer opened on first use (Debian's UCX has no CUDA support;
// transport/device_lanes.h) while host transfers stay on UCX. Against the
// fake driver, whose device memory faults on any CPU access: a socket call
// or UCX put made straight on device memory crashes the test.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "device/device_common.h"

namespace {

using namespace hixl_device_test;  // NOLINT: the shared helpers

class DeviceStaged : public DeviceShm, public ::testing::WithParamInterface<const char*> {
 protected:
  void LinkParam(std::map<std::string, std::string> opts = {}) { Link(GetParam(), opts); }
};

constexpr size_t kSlice = 8u << 20;  // slices of 8 MiB: two staging steps each

TEST_P(DeviceStaged, HostAndDeviceMemoryEveryWay) {
  const size_t n = (9u << 20) / hixl_test::kSanitizerDivisor + 13;
  // The peer's device region starts inside a larger allocation.
  const uintptr_t pd =
      Num(peer_.Send("devreg pd " + std::to_string(n + 8192) + " 4099 " + std::to_string(n)));
  const uintptr_t ph = Num(peer_.Send("reg ph " + std::to_string(n)));
  ASSERT_NE(pd, 0u);
  ASSERT_NE(ph, 0u);
  LinkParam({{hixl::options::kTcpSliceSize, std::to_string(kSlice)}});
  std::vector<unsigned char> host(n);
  hixl_test::FillPattern(host.data(), n, 7);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
  void* mine = nullptr;
  HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &mine));
  const uintptr_t ld = reinterpret_cast<uintptr_t>(mine);

  // host -> peer device, and back.
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{h, pd, n}}));
  EXPECT_EQ(peer_.Hash("pd", 0, n), Hash(host.data(), n));
  ASSERT_TRUE(peer_.Ok("fillpat pd 9"));
  std::vector<unsigned char> back(n, 0);
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{reinterpret_cast<uintptr_t>(back.data()), pd, n}}));
  EXPECT_EQ(Hash(back.data(), n), PatternHash(n, 9));

  // local device -> peer device, and back.
  ASSERT_TRUE(DevFillPattern(ld, n, 3));
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{ld, pd, n}}));
  EXPECT_EQ(peer_.Hash("pd", 0, n), PatternHash(n, 3));
  ASSERT_TRUE(peer_.Ok("fillpat pd 11"));
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{ld, pd, n}}));
  EXPECT_EQ(DevHash(ld, n), PatternHash(n, 11));

  // local device -> peer host, and back.
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{ld, ph, n}}));
  EXPECT_EQ(peer_.Hash("ph", 0, n), PatternHash(n, 11));
  ASSERT_TRUE(peer_.Ok("fillpat ph 13"));
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{ld, ph, n}}));
  EXPECT_EQ(DevHash(ld, n), PatternHash(n, 13));
  EXPECT_EQ(peer_.Send("canary ph"), "OK intact");

  // One transfer mixing all four, in pieces of odd sizes at odd offsets.
  ASSERT_TRUE(peer_.Ok("fill pd 0"));
  ASSERT_TRUE(peer_.Ok("fill ph 0"));
  const size_t q = n / 4;
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{h, pd, q},
                                          {ld + q, pd + q, q + 1},
                                          {h + 2 * q + 1, ph + 2 * q + 1, 5},
                                          {ld + 3 * q, ph + 3 * q, n - 3 * q}}));
  std::vector<unsigned char> want(n, 0);
  std::vector<unsigned char> dev13(n);
  hixl_test::FillPattern(dev13.data(), n, 13);
  std::copy(host.begin(), host.begin() + q, want.begin());
  std::copy(dev13.begin() + q, dev13.begin() + 2 * q + 1, want.begin() + q);
  EXPECT_EQ(peer_.Hash("pd", 0, 2 * q + 1), Hash(want.data(), 2 * q + 1));
  EXPECT_EQ(peer_.Hash("ph", 2 * q + 1, 5), Hash(host.data() + 2 * q + 1, 5));
  EXPECT_EQ(peer_.Hash("ph", 3 * q, n - 3 * q), Hash(dev13.data() + 3 * q, n - 3 * q));

  // Past the end of the peer's region (still inside its allocation): refused
  // before anything moves.
  const std::string before = peer_.Hash("pd", 0, n);
  hixl::Status s = Move(TransferOp::WRITE, {{ld, pd + n - 4096, 4097}});
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_EQ(peer_.Hash("pd", 0, n), before);
  HIXL_ASSERT_OK(e_.FreeMem(mine));
}

TEST_P(DeviceStaged, FailedCopiesOnEitherSideEndFailedAndTheLinkGoesOn) {
  SKIP_ON_REAL_DRIVER();
  const size_t n = 3u << 20;  // three slices of the default 1 MiB
  const uintptr_t d = Num(peer_.Send("devalloc d " + std::to_string(n)));
  LinkParam();
  ASSERT_TRUE(peer_.Ok("fill d 0x33"));
  const std::string before = peer_.Hash("d", 0, n);
  void* mine = nullptr;
  HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &mine));
  const uintptr_t ld = reinterpret_cast<uintptr_t>(mine);
  ASSERT_TRUE(DevFillPattern(ld, n, 4));
  std::vector<unsigned char> host(n);
  hixl_test::FillPattern(host.data(), n, 5);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());

  // This side: the copy out of local device memory, and into it, fail.
  FailCopiesAfter(0);
  hixl::Status s = Move(TransferOp::WRITE, {{ld, d, n}});
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  s = Move(TransferOp::READ, {{ld, d, n}});
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  FailCopiesAfter(-1);
  EXPECT_EQ(peer_.Hash("d", 0, n), before);
  EXPECT_EQ(DevHash(ld, n), PatternHash(n, 4));

  // The target's side: its copies into and out of its device memory fail.
  ASSERT_TRUE(peer_.Ok("devfail 0"));
  s = Move(TransferOp::WRITE, {{h, d, n}});
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  EXPECT_NE(s.message().find("device memory failed"), std::string::npos) << s.ToString();
  std::vector<unsigned char> back(n, 0x5a);
  s = Move(TransferOp::READ, {{reinterpret_cast<uintptr_t>(back.data()), d, n}});
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  ASSERT_TRUE(peer_.Ok("devfail -1"));
  EXPECT_EQ(peer_.Hash("d", 0, n), before);
  EXPECT_EQ(Hash(back.data(), n), Hash(std::vector<unsigned char>(n, 0x5a).data(), n));

  // The lanes stayed up: the next transfers go through.
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{h, d, n}}));
  EXPECT_EQ(peer_.Hash("d", 0, n), Hash(host.data(), n));
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{ld, d, n}}));
  EXPECT_EQ(DevHash(ld, n), Hash(host.data(), n));
  HIXL_ASSERT_OK(e_.FreeMem(mine));
}

// Thousands of small device pieces in one WRITE, each copied out of the
// device under the lane's lock: the lane lets go of the lock every few
// pieces, so the control thread's health poll (which takes it) keeps the
// link's heartbeats going. Held for the whole transfer, the lock stopped
// them for longer than the peer waits (here 3 x 100 ms): the link dropped.
TEST_P(DeviceStaged, ManySmallDevicePiecesKeepTheLinksHeartbeats) {
  SKIP_ON_REAL_DRIVER();
  constexpr size_t kPiece = 512, kPieces = 3000, n = kPiece * kPieces;
  const uintptr_t ph = Num(peer_.Send("reg ph " + std::to_string(n)));
  ASSERT_NE(ph, 0u);
  LinkParam({{hixl::options::kHeartbeatIntervalMs, "100"}});
  void* mine = nullptr;
  HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &mine));
  const uintptr_t ld = reinterpret_cast<uintptr_t>(mine);
  ASSERT_TRUE(DevFillPattern(ld, n, 21));
  // Piece i of the device lands at the mirrored place of the peer's memory
  // (no two neighbours meet, so nothing merges them).
  std::vector<hixl::TransferOpDesc> d;
  for (size_t i = 0; i < kPieces; ++i) {
    d.push_back({ld + i * kPiece, ph + (kPieces - 1 - i) * kPiece, kPiece});
  }
  SetCopyDelayUs(300);  // this process's copies: 3000 x 0.3 ms = 0.9 s of staging
  hixl::Status s = e_.TransferSync(peer_.engine(), TransferOp::WRITE, d, 20000);
  SetCopyDelayUs(0);
  HIXL_ASSERT_OK(s);
  std::vector<unsigned char> want(n), got(n);
  hixl_test::FillPattern(want.data(), n, 21);
  for (size_t i = 0; i < kPieces; ++i) {
    std::memcpy(got.data() + (kPieces - 1 - i) * kPiece, want.data() + i * kPiece, kPiece);
  }
  EXPECT_EQ(peer_.Hash("ph", 0, n), Hash(got.data(), n));
  // The link is still up: a small transfer needs no reconnect.
  HIXL_EXPECT_OK(Move(TransferOp::WRITE, {{ld, ph, kPiece}}));
  HIXL_ASSERT_OK(e_.FreeMem(mine));
}

TEST_P(DeviceStaged, TimedOutTransfersWriteNothingLater) {
  SKIP_ON_REAL_DRIVER();
  const size_t n = 1u << 20;
  const uintptr_t d = Num(peer_.Send("devalloc d " + std::to_string(n)));
  LinkParam();
  ASSERT_TRUE(peer_.Ok("fill d 0x21"));
  void* mine = nullptr;
  HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &mine));
  const uintptr_t ld = reinterpret_cast<uintptr_t>(mine);
  ASSERT_TRUE(DevFillPattern(ld, n, 8));
  std::vector<unsigned char> host(n, 0x99);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());

  // The target's device copies take 400 ms; the transfers allow 100.
  ASSERT_TRUE(peer_.Ok("devdelay 400000"));
  hixl::Status s = e_.TransferSync(peer_.engine(), TransferOp::READ, {{ld, d, n}}, 100);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  // A WRITE whose bytes are all on the wire ends when the target answered
  // them: TIMEOUT when that is past the deadline and the lane was reset
  // first, SUCCESS when the answer came first (then the bytes are there).
  s = e_.TransferSync(peer_.engine(), TransferOp::WRITE, {{h, d, n}}, 100);
  EXPECT_TRUE(s.code() == StatusCode::kTimeout || s.ok()) << s.ToString();
  // Whatever the target still does, neither side's memory changes after the
  // transfers ended.
  const std::string dev_now = DevHash(ld, n);
  EXPECT_EQ(dev_now, PatternHash(n, 8));
  ASSERT_TRUE(peer_.Ok("devdelay 0"));
  const std::string peer_now = peer_.Hash("d", 0, n);
  if (s.ok()) {
    EXPECT_EQ(peer_now, Hash(host.data(), n));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  EXPECT_EQ(DevHash(ld, n), dev_now);
  EXPECT_EQ(peer_.Hash("d", 0, n), peer_now);

  // And the link still works.
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{h, d, n}}));
  EXPECT_EQ(peer_.Hash("d", 0, n), Hash(host.data(), n));
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{ld, d, n}}));
  EXPECT_EQ(DevHash(ld, n), Hash(host.data(), n));
  HIXL_ASSERT_OK(e_.FreeMem(mine));
}

INSTANTIATE_TEST_SUITE_P(Links, DeviceStaged,
#if defined(HIXL_TEST_UCX)
                         ::testing::Values("TCP", "UCX"),
#else
                         ::testing::Values("TCP"),
#endif
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

#if defined(HIXL_TEST_UCX)
class DeviceUcx : public DeviceShm {};

// Host transfers of a UCX link stay on UCX, device transfers take its tcp
// lanes, and a notification sent with a device WRITE arrives after the data.
TEST_F(DeviceUcx, HostStaysOnUcxAndNotificationsFollowDeviceData) {
  const size_t n = 1u << 20;
  const uintptr_t d = Num(peer_.Send("devalloc d " + std::to_string(n)));
  const uintptr_t r = Num(peer_.Send("reg r " + std::to_string(n)));
  ASSERT_NE(d, 0u);
  ASSERT_NE(r, 0u);
  Link("UCX");
  hixl::LinkType type = hixl::LinkType::AUTO;
  HIXL_ASSERT_OK(e_.GetLinkType(peer_.engine(), type));
  EXPECT_EQ(type, hixl::LinkType::UCX);
  std::vector<unsigned char> host(n);
  hixl_test::FillPattern(host.data(), n, 31);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{h, r, n}}));
  EXPECT_EQ(peer_.Hash("r", 0, n), Hash(host.data(), n));

  void* mine = nullptr;
  HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &mine));
  const uintptr_t ld = reinterpret_cast<uintptr_t>(mine);
  ASSERT_TRUE(DevFillPattern(ld, n, 32));
  // Host and device pieces in one WRITE, with a notification: the transfer
  // ends once the notification was delivered, after the data.
  const size_t half = n / 2;
  std::vector<unsigned char> want(n);
  hixl_test::FillPattern(want.data(), n, 32);
  std::memcpy(want.data(), host.data(), half);
  hixl::TransferArgs args;
  hixl::NotifyDesc note;
  note.name = "kv";
  note.notify_msg = "m1";
  args.notify = note;
  HIXL_ASSERT_OK(e_.TransferSync(peer_.engine(), TransferOp::WRITE,
                                 {{h, d, half}, {ld + half, d + half, n - half}}, args, 10000));
  EXPECT_EQ(peer_.Send("getnotifies"), "OK 1 kv=m1");
  EXPECT_EQ(peer_.Hash("d", 0, n), Hash(want.data(), n));

  // Host transfers after device ones still work (and stay on UCX).
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{h, r, n}}));
  EXPECT_EQ(Hash(host.data(), n), PatternHash(n, 31));
  HIXL_ASSERT_OK(e_.GetLinkType(peer_.engine(), type));
  EXPECT_EQ(type, hixl::LinkType::UCX);
  HIXL_ASSERT_OK(e_.FreeMem(mine));
}

// On an authenticated link the tcp lanes prove the link key like any tcp
// lane; a lane hello without it is refused (auth_test covers tcp links).
TEST(DeviceUcxAuth, TcpLanesOfAnAuthenticatedUcxLinkCarryDeviceBytes) {
  ASSERT_TRUE(TestCuda::Get().ok()) << TestCuda::Get().error();
  const std::string secret = "device-lanes-secret-0123456789";
  PeerProcess peer({std::string(hixl::options::kAuthSecret) + "=" + secret});
  ASSERT_TRUE(peer.Start());
  const size_t n = 256u << 10;
  const uintptr_t d = Num(peer.Send("devalloc d " + std::to_string(n)));
  ASSERT_NE(d, 0u);
  hixl::Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1", {{hixl::options::kLinkType, "UCX"},
                                            {hixl::options::kAuthSecret, secret}}));
  HIXL_ASSERT_OK(e.Connect(peer.engine(), 5000));
  void* mine = nullptr;
  HIXL_ASSERT_OK(e.AllocMem(n, MemType::MEM_DEVICE, &mine));
  const uintptr_t ld = reinterpret_cast<uintptr_t>(mine);
  ASSERT_TRUE(DevFillPattern(ld, n, 41));
  HIXL_ASSERT_OK(e.TransferSync(peer.engine(), TransferOp::WRITE, {{ld, d, n}}, 10000));
  EXPECT_EQ(peer.Hash("d", 0, n), PatternHash(n, 41));
  ASSERT_TRUE(peer.Ok("fillpat d 42"));
  HIXL_ASSERT_OK(e.TransferSync(peer.engine(), TransferOp::READ, {{ld, d, n}}, 10000));
  EXPECT_EQ(DevHash(ld, n), PatternHash(n, 42));
  HIXL_ASSERT_OK(e.FreeMem(mine));
  e.Finalize();
}
#endif

}  // namespace
