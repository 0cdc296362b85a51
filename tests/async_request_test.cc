// tests/async_request_test.cc — the TransferAsync request contract for small
// transfers, between this process and a real hixl_test_peer, on every
// transport. On shm a transfer up to 64 KiB ends inside TransferAsync (the
// copy runs on the caller's thread and no request object is kept); the
// contract must not change for it: every request is reported exactly once,
// in any order the caller reaps them, CancelTransfer of an ended request
// changes nothing, and a copy that fails is reported FAILED with its reason.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"
#include "peer_process.h"

namespace {

using hixl::Status;
using hixl::StatusCode;
using hixl::TransferOp;
using hixl::TransferReq;
using hixl::TransferStatus;
using hixl_test::Buffer;
using hixl_test::PeerProcess;

constexpr int kConnectMs = 5000;
constexpr int kEndMs = 10000;

class AsyncRequestTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    peer_ = std::make_unique<PeerProcess>();
    ASSERT_TRUE(peer_->Start());
  }
  void Connect(std::map<std::string, std::string> opts = {}) {
    opts[hixl::options::kLinkType] = GetParam();
    HIXL_ASSERT_OK(engine_.Initialize("127.0.0.1:0", opts));
    HIXL_ASSERT_OK(engine_.Connect(peer_->engine(), kConnectMs));
  }
  void TearDown() override {
    engine_.Finalize();
    peer_.reset();
  }
  // Posts one async transfer of each slot (slot i: bytes [i*len, (i+1)*len)
  // both sides), then reaps them last to first: each ends COMPLETED, once.
  void PostAllReapBackwards(TransferOp op, uintptr_t remote, Buffer& local, size_t slots,
                            size_t len) {
    std::vector<TransferReq> reqs(slots);
    for (size_t i = 0; i < slots; ++i) {
      HIXL_ASSERT_OK(engine_.TransferAsync(
          peer_->engine(), op, {{local.addr(i * len), remote + i * len, len}}, {}, reqs[i]));
    }
    std::vector<TransferReq> sorted = reqs;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "duplicate req";
    for (size_t i = slots; i-- > 0;) {
      Status call, reason;
      ASSERT_EQ(hixl_test::WaitForEnd(engine_, reqs[i], kEndMs, &call, &reason),
                TransferStatus::COMPLETED)
          << "req " << i << ": " << call.ToString() << " " << reason.ToString();
      TransferStatus again = TransferStatus::WAITING;
      ASSERT_EQ(engine_.GetTransferStatus(reqs[i], again).code(), StatusCode::kParamInvalid)
          << "req " << i << " was reported twice";
    }
  }

  std::unique_ptr<PeerProcess> peer_;
  hixl::Hixl engine_;
};

// Both kinds of target memory: a region the peer allocated (shm maps it) and
// one it registered from its heap (shm reaches it by cross-memory attach).
TEST_P(AsyncRequestTest, SmallRequestsEndOnceEachInWhateverOrderTheyAreReaped) {
  constexpr size_t kSlots = 300, kLen = 4096, kN = kSlots * kLen;
  const uintptr_t mapped = peer_->Alloc("a", kN);
  const uintptr_t heap = peer_->Reg("m", kN, "rw");
  ASSERT_NE(mapped, 0u);
  ASSERT_NE(heap, 0u);
  ASSERT_NO_FATAL_FAILURE(Connect());
  int seed = 40;
  for (auto [name, remote] : {std::pair{"a", mapped}, std::pair{"m", heap}}) {
    SCOPED_TRACE(name);
    Buffer src(kN);
    hixl_test::FillPattern(src.data(), kN, ++seed);
    ASSERT_NO_FATAL_FAILURE(PostAllReapBackwards(TransferOp::WRITE, remote, src, kSlots, kLen));
    EXPECT_EQ(peer_->Hash(name, 0, kN), src.HashHex());
    ASSERT_TRUE(peer_->Ok(std::string("fillpat ") + name + " " + std::to_string(++seed)));
    Buffer dst(kN);
    ASSERT_NO_FATAL_FAILURE(PostAllReapBackwards(TransferOp::READ, remote, dst, kSlots, kLen));
    EXPECT_EQ(dst.HashHex(), peer_->Hash(name, 0, kN));
  }
}

// Small and large requests share one id space and one set of reports.
TEST_P(AsyncRequestTest, SmallAndLargeRequestsInterleaved) {
  constexpr size_t kSmall = 4096, kLarge = 4u << 20, kPairs = 8;
  constexpr size_t kStride = kSmall + kLarge, kN = kPairs * kStride;
  const uintptr_t remote = peer_->Alloc("a", kN);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(Connect());
  Buffer src(kN);
  hixl_test::FillPattern(src.data(), kN, 77);
  std::vector<TransferReq> reqs;
  for (size_t i = 0; i < kPairs; ++i) {
    for (auto [off, len] :
         {std::pair{i * kStride, kSmall}, std::pair{i * kStride + kSmall, kLarge}}) {
      TransferReq r = 0;
      HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                           {{src.addr(off), remote + off, len}}, {}, r));
      reqs.push_back(r);
    }
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    Status call;
    EXPECT_EQ(hixl_test::WaitForEnd(engine_, reqs[i], kEndMs, &call), TransferStatus::COMPLETED)
        << "req " << i << " " << call.ToString();
  }
  EXPECT_EQ(peer_->Hash("a", 0, kN), src.HashHex());
}

// Cancelling a request that has ended (or is about to) is harmless: it is
// still reported, once; after that the id is unknown to CancelTransfer too.
TEST_P(AsyncRequestTest, CancelOfAnEndedSmallRequestKeepsItsReport) {
  constexpr size_t kLen = 4096;
  const uintptr_t remote = peer_->Alloc("a", kLen);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(Connect());
  Buffer src(kLen, 0x5a);
  TransferReq req = 0;
  HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                       {{src.addr(), remote, kLen}}, {}, req));
  if (GetParam() == "SHM") {
    // It ended before TransferAsync returned.
    HIXL_EXPECT_OK(engine_.CancelTransfer(req));
    HIXL_EXPECT_OK(engine_.CancelTransfer(req));
    TransferStatus st = TransferStatus::WAITING;
    Status reason;
    HIXL_ASSERT_OK(engine_.GetTransferStatus(req, st, reason));
    EXPECT_EQ(st, TransferStatus::COMPLETED) << reason.ToString();
    EXPECT_EQ(peer_->Hash("a", 0, kLen), src.HashHex());
  } else {
    HIXL_EXPECT_OK(engine_.CancelTransfer(req));  // returns once it ended, either way
    TransferStatus st = TransferStatus::WAITING;
    HIXL_ASSERT_OK(engine_.GetTransferStatus(req, st));
    EXPECT_TRUE(st == TransferStatus::COMPLETED || st == TransferStatus::CANCELLED)
        << hixl_test::TransferStatusName(st);
  }
  TransferStatus st = TransferStatus::WAITING;
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, engine_.GetTransferStatus(req, st));
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, engine_.CancelTransfer(req));
}

// A small copy that fails (the local buffer is not readable: cross-memory
// attach meets a fault) is reported FAILED with the reason, once; the
// requests around it are unaffected.
TEST_P(AsyncRequestTest, SmallRequestThatFailsIsReportedFailedOnce) {
  if (GetParam() != "SHM") GTEST_SKIP() << "only shm copies from local memory in this process";
  constexpr size_t kLen = 4096;
  const uintptr_t remote = peer_->Reg("m", 2 * kLen, "rw");
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(Connect());
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* hole = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  Buffer src(kLen, 0x33);
  TransferReq good1 = 0, bad = 0, good2 = 0;
  HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                       {{src.addr(), remote, kLen}}, {}, good1));
  HIXL_ASSERT_OK(engine_.TransferAsync(
      peer_->engine(), TransferOp::WRITE,
      {{reinterpret_cast<uintptr_t>(hole), remote + kLen, std::min(kLen, page)}}, {}, bad));
  HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                       {{src.addr(), remote + kLen, kLen}}, {}, good2));
  TransferStatus st = TransferStatus::WAITING;
  Status reason;
  HIXL_ASSERT_OK(engine_.GetTransferStatus(bad, st, reason));
  EXPECT_EQ(st, TransferStatus::FAILED);
  EXPECT_NE(reason.message().find("cross-memory attach"), std::string::npos) << reason.ToString();
  HIXL_EXPECT_CODE(StatusCode::kParamInvalid, engine_.GetTransferStatus(bad, st, reason));
  for (TransferReq r : {good2, good1}) {
    HIXL_ASSERT_OK(engine_.GetTransferStatus(r, st, reason));
    EXPECT_EQ(st, TransferStatus::COMPLETED) << reason.ToString();
  }
  const Buffer both(2 * kLen, 0x33);
  EXPECT_EQ(peer_->Hash("m", 0, 2 * kLen), both.HashHex());
  munmap(hole, page);
}

// Small transfers from two threads while the peer frees the region they
// write into: each one completes or fails cleanly (refused at post, or
// FAILED), none touches the region's mapping after it is gone (this process
// would crash), and once the peer's free returned no transfer succeeds.
TEST_P(AsyncRequestTest, SmallRequestsRacingAFreeOfTheirRegion) {
  constexpr size_t kLen = 4096, kSlots = 64, kN = kSlots * kLen;
  const uintptr_t remote = peer_->Alloc("f", kN);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(Connect());
  Buffer src(kN, 0x11);
  std::atomic<bool> freed{false};
  std::atomic<int> ok{0}, refused{0}, failed{0}, late_ok{0};
  auto worker = [&](int id) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    for (int i = 0; i < 200000 && std::chrono::steady_clock::now() < until; ++i) {
      const bool after = freed.load();
      const size_t off = (id * kSlots / 2 + i % (kSlots / 2)) * kLen;  // its own slots
      Status s;
      if (i % 2 == 0) {
        s = engine_.TransferSync(peer_->engine(), TransferOp::WRITE,
                                 {{src.addr(off), remote + off, kLen}}, 2000);
      } else {
        TransferReq req = 0;
        s = engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                  {{src.addr(off), remote + off, kLen}}, {}, req);
        if (s.ok()) {
          Status reason;
          TransferStatus st = hixl_test::WaitForEnd(engine_, req, kEndMs, nullptr, &reason);
          if (st != TransferStatus::COMPLETED)
            s = reason.ok() ? Status::Failed("not ended") : reason;
        }
      }
      if (s.ok()) {
        ++ok;
        if (after) ++late_ok;
      } else if (s.code() == StatusCode::kParamInvalid) {
        ++refused;
        if (after) return;  // seen refused after the free: done
      } else {
        ++failed;
      }
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const bool freed_ok = peer_->Ok("free f");
  freed = true;
  a.join();
  b.join();
  ASSERT_TRUE(freed_ok);
  EXPECT_GT(ok.load(), 0) << "nothing was written before the free";
  EXPECT_GT(refused.load(), 0) << "nothing was refused after the free";
  EXPECT_EQ(late_ok.load(), 0) << "transfers started after the free returned succeeded";
  EXPECT_TRUE(peer_->Ok("ping"));
}

// Sync callers and async requests on one link at once (tcp: one lane, so a
// caller waiting in TransferSync receives the answers of the other threads'
// transfers too, and they receive its): every transfer ends with its own
// answer, READs bring back exactly the bytes of their slot, and nothing is
// lost or delivered twice.
TEST_P(AsyncRequestTest, SyncCallersAndAsyncRequestsShareALane) {
  constexpr size_t kThreads = 3, kSlots = 48, kIters = 120;
  constexpr size_t kLens[] = {4096, 64u << 10, 200u << 10};
  constexpr size_t kSlot = 200u << 10, kN = kThreads * kSlots * kSlot;
  const uintptr_t remote = peer_->Alloc("a", kN);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(Connect({{hixl::options::kTcpLanes, "1"}}));
  Buffer src(kN);
  hixl_test::FillPattern(src.data(), kN, 91);
  std::vector<std::string> errors(kThreads + 1);
  std::atomic<bool> done{false};
  // Thread kThreads keeps async READs of slot 0 of every sync thread's area
  // in flight meanwhile; slot 0 is written once before and never again.
  for (size_t t = 0; t < kThreads; ++t) {
    const size_t off = t * kSlots * kSlot;
    HIXL_ASSERT_OK(engine_.TransferSync(peer_->engine(), TransferOp::WRITE,
                                        {{src.addr(off), remote + off, kSlot}}, kEndMs));
  }
  auto sync_worker = [&](size_t t) {
    Buffer back(kSlot);
    for (size_t i = 0; i < kIters && errors[t].empty(); ++i) {
      const size_t len = kLens[i % 3];
      const size_t off = (t * kSlots + 1 + i % (kSlots - 1)) * kSlot;
      Status s = engine_.TransferSync(peer_->engine(), TransferOp::WRITE,
                                      {{src.addr(off), remote + off, len}}, kEndMs);
      if (s.ok()) {
        std::memset(back.data(), 0, len);
        s = engine_.TransferSync(peer_->engine(), TransferOp::READ,
                                 {{back.addr(), remote + off, len}}, kEndMs);
      }
      if (!s.ok()) {
        errors[t] = s.ToString();
      } else if (std::memcmp(back.data(), src.data() + off, len) != 0) {
        errors[t] = "READ of " + std::to_string(len) + " bytes at " + std::to_string(off) +
                    " brought back other bytes";
      }
    }
  };
  auto async_worker = [&] {
    Buffer back(kThreads * kSlot);
    for (int round = 0; round < 1000 && !done.load() && errors[kThreads].empty(); ++round) {
      std::vector<TransferReq> reqs(kThreads);
      std::memset(back.data(), 0, back.size());
      for (size_t t = 0; t < kThreads; ++t) {
        Status s = engine_.TransferAsync(
            peer_->engine(), TransferOp::READ,
            {{back.addr(t * kSlot), remote + t * kSlots * kSlot, kSlot}}, {}, reqs[t]);
        if (!s.ok()) errors[kThreads] = s.ToString();
      }
      for (size_t t = 0; t < kThreads && errors[kThreads].empty(); ++t) {
        Status reason;
        if (hixl_test::WaitForEnd(engine_, reqs[t], kEndMs, nullptr, &reason) !=
            TransferStatus::COMPLETED) {
          errors[kThreads] = "async READ: " + reason.ToString();
        } else if (std::memcmp(back.data() + t * kSlot, src.data() + t * kSlots * kSlot, kSlot) !=
                   0) {
          errors[kThreads] = "async READ brought back other bytes";
        }
      }
    }
  };
  std::thread reader(async_worker);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) threads.emplace_back(sync_worker, t);
  for (auto& th : threads) th.join();
  done = true;
  reader.join();
  for (size_t t = 0; t <= kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  for (size_t t = 0; t < kThreads; ++t) {
    const size_t off = t * kSlots * kSlot;
    EXPECT_EQ(peer_->Hash("a", off, kSlot), src.HashHex(off, kSlot));
  }
}

// A request that ends while GetTransferStatus looks at it is either still
// WAITING or reported ended and released, never reported ended yet kept:
// polled without a pause, the transfer's end often falls inside the call.
TEST_P(AsyncRequestTest, AnEndReportedByAPollInTheRaceIsAlsoReleased) {
  constexpr size_t kLen = 128u << 10;  // past shm's inline copies: a request object
  constexpr int kRounds = 300;
  const uintptr_t remote = peer_->Alloc("a", kLen);
  ASSERT_NE(remote, 0u);
  ASSERT_NO_FATAL_FAILURE(Connect());
  Buffer src(kLen);
  hixl_test::FillPattern(src.data(), kLen, 17);
  for (int r = 0; r < kRounds; ++r) {
    TransferReq req = 0;
    HIXL_ASSERT_OK(engine_.TransferAsync(peer_->engine(), TransferOp::WRITE,
                                         {{src.addr(), remote, kLen}}, {}, req));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kEndMs);
    TransferStatus st = TransferStatus::WAITING;
    Status why;
    while (st == TransferStatus::WAITING && std::chrono::steady_clock::now() < deadline) {
      HIXL_ASSERT_OK(engine_.GetTransferStatus(req, st, why));
      if (st == TransferStatus::WAITING) {
        EXPECT_TRUE(why.ok()) << why.ToString();
      }
    }
    ASSERT_EQ(st, TransferStatus::COMPLETED) << "round " << r << ": " << why.ToString();
    TransferStatus again = TransferStatus::WAITING;
    ASSERT_EQ(engine_.GetTransferStatus(req, again).code(), StatusCode::kParamInvalid)
        << "round " << r << ": reported COMPLETED yet still known";
  }
  EXPECT_EQ(peer_->Hash("a", 0, kLen), src.HashHex());
}

std::string LinkParamName(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

INSTANTIATE_TEST_SUITE_P(Transports, AsyncRequestTest,
                         ::testing::ValuesIn(hixl_test::AllLinkTypes()), LinkParamName);

}  // namespace
