// tests/tcp_hostile_test.cc — hostile clients of the tcp transport's data
// lanes (see src/transport/tcp/tcp_transport.h for the wire format).
//
// A raw client in this process does a real control handshake with a
// hixl_test_peer by hand (hello -> welcome, tp.tcp.port and tp.tcp.token),
// keeps that control link open, and then misbehaves on data connections. In
// every case:
//   * the peer's region contents and canaries are unchanged (hash + canary),
//   * the offending lane is closed within a bounded time (recv gives 0 or an
//     error), possibly after an error response with a non-zero status, and
//     never after delivering data it must not deliver,
//   * the peer keeps serving: a real engine (LinkType=TCP) connects and moves
//     bytes, verified by hash.
// Everything is bounded by deadlines; no test waits without a limit.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"
#include "peer_process.h"
#include "raw_client.h"

namespace {

using hixl::Hixl;
using hixl::LinkType;
using hixl::Status;
using hixl::TransferOp;
using hixl_test::Buffer;
using hixl_test::PeerProcess;

using namespace hixl_test::raw;  // NOLINT: the raw client's vocabulary

// ---------------------------------------------------------------------------

class TcpHostileTest : public ::testing::Test {
 protected:
  static constexpr size_t kRw = 1 * kMiB, kSmall = 64 * 1024;

  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Prepare({}, false)); }
  void TearDown() override {
    ctl_.Close();
    peer_.reset();
  }

  // Starts the peer with its regions (filled with known patterns) and opens
  // the raw control link.
  void Prepare(std::vector<std::string> peer_opts, bool ack_rdel) {
    peer_opts.push_back(std::string(hixl::options::kHeartbeatIntervalMs) + "=600000");
    peer_ = std::make_unique<PeerProcess>(peer_opts);
    ASSERT_TRUE(peer_->Start());
    rw_ = peer_->Reg("rw", kRw, "rw");
    ro_ = peer_->Reg("ro", kSmall, "r");
    wo_ = peer_->Reg("wo", kSmall, "w");
    no_ = peer_->Reg("no", kSmall, "none");
    std::string r = peer_->Send("regsplit A B " + std::to_string(kSmall) + " rw");
    ASSERT_TRUE(hixl_test::IsOk(r)) << r;
    ASSERT_EQ(std::sscanf(r.c_str(), "OK %zu %zu", &a_, &b_), 2) << r;
    ASSERT_TRUE(rw_ && ro_ && wo_ && no_);
    uint64_t seed = 100;
    for (const char* n : {"rw", "ro", "wo", "no", "A", "B"}) {
      ASSERT_TRUE(peer_->Ok(std::string("fillpat ") + n + " " + std::to_string(++seed)));
      const size_t size = std::string(n) == "rw" ? kRw : kSmall;
      hashes_[n] = peer_->Hash(n, 0, size);
      // The hash the test computes from the pattern agrees with the peer's.
      ASSERT_EQ(hashes_[n],
                hixl_test::HashHex(hixl_test::Fnv1a64(Pattern(size, seed).data(), size)));
    }
    std::string err;
    ASSERT_TRUE(ctl_.Open(peer_->engine(), ack_rdel, &err)) << err;
    ASSERT_GT(ctl_.data_port, 0);
  }

  // A data connection with a lane hello; *status gets the reply status (or
  // -1 when there was no reply).
  Sock OpenLane(uint64_t token, uint64_t gen, int64_t* status) {
    Sock s(ConnectTcp(ctl_.ip(), ctl_.data_port));
    *status = -1;
    if (s.get() < 0) {
      ADD_FAILURE() << "connect to the data port: " << strerror(errno);
      return s;
    }
    if (!SendAll(s.get(), LaneHello(token, gen))) return s;
    uint8_t rep[kLaneReplySize];
    if (RecvExact(s.get(), rep, sizeof(rep), 3000)) {
      EXPECT_EQ(GetU32(rep), kLaneMagic) << "lane reply magic";
      *status = GetU32(rep + 4);
    }
    return s;
  }
  // A lane the target accepted.
  Sock GoodLane() {
    int64_t st = -1;
    Sock s = OpenLane(ctl_.token, ctl_.generation, &st);
    EXPECT_EQ(st, 0) << "the target refused a lane hello with the welcome's token";
    return s;
  }

  // Sends one bad request (plus payload) on a fresh lane and expects: at most
  // one error response for it (status != 0, our seq, no payload), then the
  // lane closed within 3 s.
  void ExpectRefused(const std::string& what, const Bytes& req, const Bytes& payload = {}) {
    SCOPED_TRACE(what);
    Sock lane = GoodLane();
    ASSERT_GE(lane.get(), 0);
    Bytes all = req;
    Append(all, payload);
    // The target may close before it has read the payload: a failed send is fine.
    (void)SendAll(lane.get(), all, 2000);
    Bytes got;
    const auto t0 = Clock::now();
    EXPECT_TRUE(DrainUntilClosed(lane.get(), 3000, &got))
        << "the lane is still open 3 s after a bad request";
    EXPECT_LT(ElapsedMs(t0), 3500);
    std::vector<Resp> resps;
    std::string why;
    bool truncated = false;
    ASSERT_TRUE(ParseResponses(got, resps, why, &truncated)) << why;
    EXPECT_FALSE(truncated) << got.size() << " bytes, not whole responses";
    EXPECT_LE(resps.size(), 1u) << "more than one response to a single bad request";
    for (const Resp& r : resps) {
      EXPECT_NE(r.status, 0) << "a bad request was answered with status 0 (ok)";
      EXPECT_EQ(r.seq, GetU64(&req[8])) << "error response for another seq";
      EXPECT_EQ(r.op, req[4]);
      EXPECT_EQ(r.len, 0u) << "an error response announces payload";
      std::printf("[ info ] %s: error response status %u\n", what.c_str(), r.status);
    }
    if (resps.empty()) std::printf("[ info ] %s: lane closed without a response\n", what.c_str());
  }

  // Every region's content and canaries are as SetUp left them.
  void ExpectRegionsUnchanged() {
    for (const auto& [name, hash] : hashes_) {
      const size_t size = name == "rw" ? kRw : kSmall;
      EXPECT_EQ(peer_->Hash(name, 0, size), hash) << "region " << name << " was modified";
    }
    for (const char* n : {"rw", "ro", "wo", "no", "A"}) {
      EXPECT_EQ(peer_->Send(std::string("canary ") + n), "OK intact") << n;
    }
  }

  // A real initiator (LinkType=TCP) connects and moves bytes to the peer.
  // Overwrites region "rw" (call it last).
  void ExpectPeerStillServes(int bound_ms = 10000) {
    SCOPED_TRACE("a real tcp initiator after the hostile client");
    EXPECT_TRUE(peer_->Ok("ping"));
    const auto t0 = Clock::now();
    Hixl e;
    HIXL_ASSERT_OK(e.Initialize("127.0.0.1", {{hixl::options::kLinkType, "TCP"}}));
    HIXL_ASSERT_OK(e.Connect(peer_->engine(), 5000));
    LinkType t = LinkType::AUTO;
    HIXL_ASSERT_OK(e.GetLinkType(peer_->engine(), t));
    EXPECT_EQ(t, LinkType::TCP);
    Buffer src(kRw);
    hixl_test::FillPattern(src.data(), kRw, 999);
    HIXL_EXPECT_OK(
        e.TransferSync(peer_->engine(), TransferOp::WRITE, {{src.addr(), rw_, kRw}}, 5000));
    EXPECT_EQ(peer_->Hash("rw", 0, kRw), src.HashHex());
    Buffer back(kRw, 0);
    HIXL_EXPECT_OK(
        e.TransferSync(peer_->engine(), TransferOp::READ, {{back.addr(), rw_, kRw}}, 5000));
    EXPECT_EQ(back.HashHex(), src.HashHex());
    Buffer ro_back(kSmall, 0);
    HIXL_EXPECT_OK(
        e.TransferSync(peer_->engine(), TransferOp::READ, {{ro_back.addr(), ro_, kSmall}}, 5000));
    EXPECT_EQ(ro_back.HashHex(), hashes_["ro"]);
    e.Finalize();
    EXPECT_LT(ElapsedMs(t0), bound_ms) << "the real initiator was slowed down by the hostile one";
    EXPECT_EQ(peer_->Send("canary rw"), "OK intact");
  }

  std::unique_ptr<PeerProcess> peer_;
  RawControl ctl_;
  uintptr_t rw_ = 0, ro_ = 0, wo_ = 0, no_ = 0;
  size_t a_ = 0, b_ = 0;
  std::map<std::string, std::string> hashes_;
};

// The raw handshake itself is right: a lane with the welcome's token is
// accepted and serves a READ and a WRITE like the engine's own lanes.
TEST_F(TcpHostileTest, RawClientBaseline) {
  Sock lane = GoodLane();
  ASSERT_GE(lane.get(), 0);
  Bytes req = Request(kOpRead, 7, ro_ + 100, 4096);
  ASSERT_TRUE(SendAll(lane.get(), req));
  uint8_t hdr[kRespSize];
  ASSERT_TRUE(RecvExact(lane.get(), hdr, sizeof(hdr)));
  EXPECT_EQ(GetU32(hdr), kRespMagic);
  EXPECT_EQ(hdr[4], kOpRead);
  EXPECT_EQ(hdr[5], 0) << "status";
  EXPECT_EQ(GetU64(hdr + 8), 7u);
  ASSERT_EQ(GetU64(hdr + 16), 4096u);
  Bytes data(4096);
  ASSERT_TRUE(RecvExact(lane.get(), data.data(), data.size()));
  Bytes image = Pattern(kSmall, 102);  // "ro" was filled with seed 102
  EXPECT_EQ(std::memcmp(data.data(), image.data() + 100, 4096), 0) << "READ returned other bytes";

  Bytes payload = Pattern(4096, 55);
  Bytes w = Request(kOpWrite, 8, a_ + 8, payload.size());
  Append(w, payload);
  ASSERT_TRUE(SendAll(lane.get(), w));
  ASSERT_TRUE(RecvExact(lane.get(), hdr, sizeof(hdr)));
  EXPECT_EQ(GetU32(hdr), kRespMagic);
  EXPECT_EQ(hdr[4], kOpWrite);
  EXPECT_EQ(hdr[5], 0) << "status";
  EXPECT_EQ(GetU64(hdr + 8), 8u);
  Bytes expect = Pattern(kSmall, 105);  // "A"
  std::memcpy(expect.data() + 8, payload.data(), payload.size());
  EXPECT_EQ(peer_->Hash("A", 0, kSmall),
            hixl_test::HashHex(hixl_test::Fnv1a64(expect.data(), kSmall)));
  hashes_["A"] = peer_->Hash("A", 0, kSmall);
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// (a) Garbage instead of a lane hello.
TEST_F(TcpHostileTest, GarbageInsteadOfLaneHello) {
  Bytes junk(64);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 73 + 5);
  Bytes ones(64, 0xFF);
  // A request header where the hello belongs, followed by its payload.
  Bytes req = Request(kOpWrite, 1, rw_, 4096);
  Append(req, Bytes(4096, 0xEE));
  // A control-protocol frame on the data port (as long as a lane hello).
  Bytes frame;
  PutU32(frame, kFrameMagic);
  PutU32(frame, static_cast<uint32_t>(kLaneHelloSize - 8));
  Append(frame, Bytes(kLaneHelloSize - 8, 0x80));
  for (const Bytes* g : {&junk, &ones, &req, &frame}) {
    Sock s(ConnectTcp(ctl_.ip(), ctl_.data_port));
    ASSERT_GE(s.get(), 0);
    (void)SendAll(s.get(), *g, 2000);
    Bytes got;
    EXPECT_TRUE(DrainUntilClosed(s.get(), 3000, &got)) << "lane still open 3 s after garbage";
    // At most a refusal {magic, status != 0}.
    EXPECT_TRUE(got.empty() || got.size() == kLaneReplySize) << got.size() << " bytes came back";
    if (got.size() == kLaneReplySize) {
      EXPECT_EQ(GetU32(got.data()), kLaneMagic);
      EXPECT_NE(GetU32(got.data() + 4), 0u) << "garbage was accepted as a lane hello";
    }
  }
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// A data connection that sends part of a hello, or nothing, and then waits:
// closed once HandshakeTimeoutMs (1 s here) has passed, so idle connections
// cannot pile up.
class TcpHelloTimeoutTest : public TcpHostileTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Prepare({"HandshakeTimeoutMs=1000"}, false)); }
};

TEST_F(TcpHelloTimeoutTest, DataConnectionsWithoutAHelloAreClosedInTime) {
  Sock silent(ConnectTcp(ctl_.ip(), ctl_.data_port));
  Sock partial(ConnectTcp(ctl_.ip(), ctl_.data_port));
  ASSERT_GE(silent.get(), 0);
  ASSERT_GE(partial.get(), 0);
  Bytes half = LaneHello(ctl_.token, ctl_.generation);
  half.resize(kLaneHelloSize / 2);
  ASSERT_TRUE(SendAll(partial.get(), half));
  const auto t0 = Clock::now();
  EXPECT_TRUE(DrainUntilClosed(silent.get(), 10000)) << "silent connection still open";
  EXPECT_TRUE(DrainUntilClosed(partial.get(), 10000)) << "half-hello connection still open";
  EXPECT_GE(ElapsedMs(t0), 500) << "closed before its time";
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// (b) A valid lane hello, then a truncated request header, then close (and a
// half-close variant: the target must notice and close its side).
TEST_F(TcpHostileTest, TruncatedRequestHeaderThenClose) {
  Bytes req = Request(kOpWrite, 1, rw_, 4096);
  {
    Sock lane = GoodLane();
    ASSERT_GE(lane.get(), 0);
    ASSERT_TRUE(SendAll(lane.get(), req.data(), 13));
  }  // closed
  {
    Sock lane = GoodLane();
    ASSERT_GE(lane.get(), 0);
    ASSERT_TRUE(SendAll(lane.get(), req.data(), kReqSize - 1));
    ASSERT_EQ(shutdown(lane.get(), SHUT_WR), 0);
    Bytes got;
    EXPECT_TRUE(DrainUntilClosed(lane.get(), 3000, &got))
        << "the target kept a half-closed lane with a truncated header open";
    EXPECT_TRUE(got.empty()) << "the target answered a request it never got whole";
  }
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// (b2) A valid WRITE header whose payload stops half-way, then close: only
// the bytes that arrived may land, nothing outside the request's range.
TEST_F(TcpHostileTest, WritePayloadCutShortThenClose) {
  const size_t off = 4096 + 3, len = 64 * 1024, sent = 10000;
  Bytes payload = Pattern(len, 77);
  {
    Sock lane = GoodLane();
    ASSERT_GE(lane.get(), 0);
    Bytes w = Request(kOpWrite, 1, rw_ + off, len);
    w.insert(w.end(), payload.begin(), payload.begin() + sent);
    ASSERT_TRUE(SendAll(lane.get(), w));
    ASSERT_EQ(shutdown(lane.get(), SHUT_WR), 0);
    Bytes got;
    EXPECT_TRUE(DrainUntilClosed(lane.get(), 3000, &got))
        << "lane still open after EOF mid-payload";
    EXPECT_TRUE(got.empty()) << "a WRITE whose payload never arrived was acknowledged";
  }
  // The initiator hung up mid-payload, i.e. gave the lane up: the target
  // applies the part it had already taken in, or (having seen the hang-up
  // first) none of it. The 10000 bytes travel in one segment with their
  // header, so it is all or nothing; anything else, or any byte outside that
  // part, is a fault.
  Bytes untouched = Pattern(kRw, 101);  // "rw"
  Bytes applied = untouched;
  std::memcpy(applied.data() + off, payload.data(), sent);
  const std::string got = peer_->Hash("rw", 0, kRw);
  EXPECT_TRUE(got == hixl_test::HashHex(hixl_test::Fnv1a64(untouched.data(), kRw)) ||
              got == hixl_test::HashHex(hixl_test::Fnv1a64(applied.data(), kRw)))
      << "bytes outside the part of the payload that arrived changed";
  hashes_["rw"] = peer_->Hash("rw", 0, kRw);
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// (c) Headers with an out-of-range address, a huge length, addr+len
// overflow, and other malformed fields. WRITEs carry their payload.
TEST_F(TcpHostileTest, OutOfRangeAndMalformedRequestsAreRefused) {
  const Bytes p64 = Bytes(64, 0xE1), p32 = Bytes(32, 0xE2), p4k = Bytes(4096, 0xE3);
  ExpectRefused("WRITE across the end of rw into its guard",
                Request(kOpWrite, 11, rw_ + kRw - 8, 64), p64);
  ExpectRefused("WRITE starting in the guard before rw", Request(kOpWrite, 12, rw_ - 16, 32), p32);
  ExpectRefused("WRITE entirely after rw", Request(kOpWrite, 13, rw_ + kRw + 64, 32), p32);
  ExpectRefused("WRITE spanning adjacent regions A and B",
                Request(kOpWrite, 14, a_ + kSmall - 16, 32), p32);
  ExpectRefused("WRITE to an unmapped low address", Request(kOpWrite, 15, 0x10000, 32), p32);
  ExpectRefused("WRITE to address 0", Request(kOpWrite, 16, 0, 32), p32);
  ExpectRefused("WRITE len 0", Request(kOpWrite, 17, rw_, 0));
  ExpectRefused("WRITE len 64 MiB + 1", Request(kOpWrite, 18, rw_, kMaxSlice + 1), p4k);
  ExpectRefused("WRITE len 2^63", Request(kOpWrite, 19, rw_, 1ull << 63), p4k);
  ExpectRefused("WRITE len UINT64_MAX", Request(kOpWrite, 20, rw_, UINT64_MAX), p4k);
  ExpectRefused("WRITE addr+len overflows", Request(kOpWrite, 21, UINT64_MAX - 15, 32), p32);
  ExpectRefused("WRITE addr+len wraps into rw", Request(kOpWrite, 22, rw_ + 16, UINT64_MAX - 8),
                p4k);
  ExpectRefused("READ across the end of ro", Request(kOpRead, 23, ro_ + kSmall - 8, 64));
  ExpectRefused("READ len 1 GiB", Request(kOpRead, 24, rw_, 1ull << 30));
  ExpectRefused("READ addr+len overflows", Request(kOpRead, 25, UINT64_MAX - 15, 32));
  ExpectRefused("unknown op 7", Request(7, 26, rw_, 32), p32);
  ExpectRefused("unknown op 0xFF", Request(0xFF, 27, rw_, 32), p32);
  ExpectRefused("bad request magic", Request(kOpWrite, 28, rw_, 32, 0xDEADBEEF), p32);
  ExpectRefused("lane hello magic as a request", Request(kOpWrite, 29, rw_, 32, kLaneMagic), p32);
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// A valid READ pipelined in front of a bad request: the READ is answered
// whole, then at most an error response, then the lane closes; the bad
// request's payload lands nowhere.
TEST_F(TcpHostileTest, GoodRequestThenBadRequestOnOneLane) {
  Sock lane = GoodLane();
  ASSERT_GE(lane.get(), 0);
  Bytes all = Request(kOpRead, 1, ro_, 8192);
  Append(all, Request(kOpWrite, 2, ro_ + 8192, 4096));  // read-only region
  Append(all, Bytes(4096, 0xAB));
  Append(all, Request(kOpRead, 3, ro_, 4096));  // after the bad one: must not be served
  (void)SendAll(lane.get(), all, 2000);
  Bytes got;
  EXPECT_TRUE(DrainUntilClosed(lane.get(), 3000, &got)) << "lane still open after a bad request";
  std::vector<Resp> resps;
  std::string why;
  bool truncated = false;
  ASSERT_TRUE(ParseResponses(got, resps, why, &truncated)) << why;
  EXPECT_FALSE(truncated);
  ASSERT_GE(resps.size(), 1u);
  EXPECT_LE(resps.size(), 2u) << "a request after the refused one was served";
  EXPECT_EQ(resps[0].seq, 1u);
  EXPECT_EQ(resps[0].status, 0);
  ASSERT_EQ(resps[0].len, 8192u);
  Bytes image = Pattern(kSmall, 102);
  EXPECT_EQ(std::memcmp(got.data() + resps[0].payload_off, image.data(), 8192), 0);
  if (resps.size() == 2) {
    EXPECT_EQ(resps[1].seq, 2u);
    EXPECT_NE(resps[1].status, 0);
    EXPECT_EQ(resps[1].len, 0u);
  }
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// The same with more valid READ data queued than the socket buffers hold
// when the bad request arrives (the client reads only after a pause): the
// target answers a lane's requests in order, so every valid READ before the
// bad request is still delivered whole, then at most the error response,
// then the lane closes.
TEST_F(TcpHostileTest, QueuedRepliesBeforeABadRequestAreDelivered) {
  Sock lane = GoodLane();
  ASSERT_GE(lane.get(), 0);
  constexpr int kGood = 48;  // 48 MiB of replies
  Bytes all;
  for (int i = 0; i < kGood; ++i) Append(all, Request(kOpRead, i + 1, rw_, kRw));
  Append(all, Request(kOpWrite, kGood + 1, ro_, 4096));  // refused: read-only
  Append(all, Bytes(4096, 0xAB));
  (void)SendAll(lane.get(), all, 2000);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Bytes got;
  EXPECT_TRUE(DrainUntilClosed(lane.get(), 5000, &got)) << "lane still open after a bad request";
  std::vector<Resp> resps;
  std::string why;
  bool truncated = false;
  ASSERT_TRUE(ParseResponses(got, resps, why, &truncated)) << why;
  size_t ok = 0;
  const Bytes image = Pattern(kRw, 101);  // "rw"
  for (const Resp& r : resps) {
    if (r.status != 0 || r.len != kRw || r.payload_off + kRw > got.size()) continue;
    EXPECT_EQ(std::memcmp(got.data() + r.payload_off, image.data(), kRw), 0) << "seq " << r.seq;
    ++ok;
  }
  EXPECT_EQ(ok, static_cast<size_t>(kGood))
      << "of " << kGood << " valid READs queued before a bad request only " << ok
      << " were delivered (" << got.size() << " bytes) before the lane closed"
      << (truncated ? ", the last one cut off" : "");
  if (resps.size() == kGood + 1) {
    EXPECT_EQ(resps.back().seq, kGood + 1u);
    EXPECT_NE(resps.back().status, 0);
  }
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// (d) WRITE into a read-only region (and into a "none" region), with payload.
TEST_F(TcpHostileTest, WriteIntoReadOnlyRegionIsRefused) {
  ExpectRefused("WRITE 4 KiB into ro", Request(kOpWrite, 31, ro_, 4096), Pattern(4096, 1));
  ExpectRefused("WRITE all of ro", Request(kOpWrite, 32, ro_, kSmall), Pattern(kSmall, 2));
  ExpectRefused("WRITE 1 byte at the end of ro", Request(kOpWrite, 33, ro_ + kSmall - 1, 1),
                {0x11});
  ExpectRefused("WRITE into a no-permission region", Request(kOpWrite, 34, no_, 4096),
                Pattern(4096, 3));
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// (e) READ from a write-only region (and from a "none" region): no data.
TEST_F(TcpHostileTest, ReadFromWriteOnlyRegionIsRefused) {
  ExpectRefused("READ 4 KiB from wo", Request(kOpRead, 41, wo_, 4096));
  ExpectRefused("READ all of wo", Request(kOpRead, 42, wo_, kSmall));
  ExpectRefused("READ from a no-permission region", Request(kOpRead, 43, no_, 4096));
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// (f) Lane hellos that must be refused: wrong token, wrong generation, wrong
// version or magic. Requests pipelined right behind the refused hello are
// never executed.
TEST_F(TcpHostileTest, WrongTokenIsRefused) {
  struct Case {
    const char* what;
    Bytes hello;
  };
  const uint64_t tok = ctl_.token, gen = ctl_.generation;
  const std::vector<Case> cases = {
      {"token ^ 1", LaneHello(tok ^ 1, gen)},
      {"token 0", LaneHello(0, gen)},
      {"token all ones", LaneHello(~0ull, gen)},
      {"right token, wrong generation", LaneHello(tok, gen + 1)},
      {"right token, generation 0", LaneHello(tok, 0)},
      {"right token, version 1 (the tagless one)", LaneHello(tok, gen, kLaneMagic, 1)},
      {"right token, version 3", LaneHello(tok, gen, kLaneMagic, 3)},
      {"right token, version 0", LaneHello(tok, gen, kLaneMagic, 0)},
      {"right token, bad magic", LaneHello(tok, gen, 0x12345678)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Sock s(ConnectTcp(ctl_.ip(), ctl_.data_port));
    ASSERT_GE(s.get(), 0);
    Bytes all = c.hello;
    Append(all, Request(kOpWrite, 1, rw_, 4096));
    Append(all, Bytes(4096, 0x99));
    Append(all, Request(kOpRead, 2, ro_, 4096));
    (void)SendAll(s.get(), all, 2000);
    Bytes got;
    EXPECT_TRUE(DrainUntilClosed(s.get(), 3000, &got))
        << "lane still open 3 s after a refused hello";
    EXPECT_TRUE(got.empty() || got.size() == kLaneReplySize)
        << got.size() << " bytes came back: requests behind a refused hello were served";
    if (got.size() >= kLaneReplySize) {
      EXPECT_EQ(GetU32(got.data()), kLaneMagic);
      EXPECT_NE(GetU32(got.data() + 4), 0u) << "the hello was accepted";
    }
  }
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// (f2) A token stops working when its control link ends, and lanes opened
// with it are closed then.
TEST_F(TcpHostileTest, TokenDiesWithItsControlLink) {
  Sock lane = GoodLane();
  ASSERT_GE(lane.get(), 0);
  const uint64_t tok = ctl_.token, gen = ctl_.generation;
  ctl_.Close();
  Bytes got;
  EXPECT_TRUE(DrainUntilClosed(lane.get(), 3000, &got))
      << "a lane outlived its control link by 3 s";
  EXPECT_TRUE(got.empty());
  // The old token is refused (the revocation is asynchronous: allow 3 s).
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  int64_t st = 0;
  do {
    Sock again = OpenLane(tok, gen, &st);
    if (st != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < deadline);
  EXPECT_NE(st, 0) << "a token still opens lanes 3 s after its control link ended";
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// (g) Clients that never read their READ responses (and one stalled in the
// middle of a WRITE payload, and one that never says hello) hold lanes on
// the peer's I/O threads; a real initiator still gets served promptly.
TEST_F(TcpHostileTest, StuckClientsDoNotBlockOtherInitiators) {
  constexpr int kLanes = 4, kReqsPerLane = 64;
  std::vector<Sock> lanes;
  for (int l = 0; l < kLanes; ++l) {
    lanes.push_back(GoodLane());
    ASSERT_GE(lanes.back().get(), 0);
    int rcv = 4096;  // keep our receive buffer small: the target's sends block early
    setsockopt(lanes.back().get(), SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    Bytes reqs;
    for (int i = 0; i < kReqsPerLane; ++i) Append(reqs, Request(kOpRead, i + 1, rw_, kRw));
    ASSERT_TRUE(SendAll(lanes.back().get(), reqs, 3000));  // 64 MiB of replies asked for
  }
  Sock stalled = GoodLane();
  ASSERT_GE(stalled.get(), 0);
  Bytes w = Request(kOpWrite, 1, rw_, 256 * 1024);
  Append(w, Bytes(1000, 0x5C));
  ASSERT_TRUE(SendAll(stalled.get(), w));
  Sock silent(ConnectTcp(ctl_.ip(), ctl_.data_port));
  ASSERT_GE(silent.get(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the target fill its queues

  ExpectPeerStillServes(5000);
  // The stuck lanes are still there (or were dropped); either way closing
  // them now must leave the peer healthy.
  lanes.clear();
  stalled.Reset();
  silent.Reset();
  EXPECT_TRUE(peer_->Ok("ping"));
  ExpectPeerStillServes(5000);
}

// A client asks for more READ data at once than the target queues (it stops
// reading requests at 64 MiB of pending replies) and only starts reading the
// replies after a pause. Per the lane protocol a lane may keep any number of
// requests in flight and the target answers them in order: once the client
// reads, every request is answered, including the ones the target had
// already buffered when it applied back-pressure.
TEST_F(TcpHostileTest, SlowReaderGetsEveryResponseEventually) {
  const size_t n = 8 * kMiB;
  uintptr_t big = peer_->Reg("big", n, "r");
  ASSERT_NE(big, 0u);
  ASSERT_TRUE(peer_->Ok("fillpat big 808"));
  const Bytes image = Pattern(n, 808);
  Sock lane = GoodLane();
  ASSERT_GE(lane.get(), 0);
  constexpr int kReqs = 16;  // 128 MiB of replies
  Bytes reqs;
  for (int i = 0; i < kReqs; ++i) Append(reqs, Request(kOpRead, i + 1, big, n));
  ASSERT_TRUE(SendAll(lane.get(), reqs, 3000));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the target's queue fills
  Bytes got;
  const auto t0 = Clock::now();
  // The lane stays open (it is idle once everything is answered): read for
  // at most 5 s (20 s under TSan, which makes this process slow at taking
  // 128 MiB), stopping early once all responses are in.
  const size_t want = kReqs * (kRespSize + n);
  const long limit_ms = 5000 * static_cast<long>(hixl_test::kSanitizerDivisor);
  got.reserve(want);
  std::vector<uint8_t> buf(1 * kMiB);
  while (got.size() < want && ElapsedMs(t0) < limit_ms) {
    pollfd pfd{lane.get(), POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    ssize_t r = recv(lane.get(), buf.data(), buf.size(), MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) break;
    if (r > 0) got.insert(got.end(), buf.data(), buf.data() + r);
  }
  std::vector<Resp> resps;
  std::string why;
  bool truncated = false;
  ASSERT_TRUE(ParseResponses(got, resps, why, &truncated)) << why;
  std::printf("[ info ] %zu of %d responses (%zu bytes) in %ld ms\n", resps.size(), kReqs,
              got.size(), ElapsedMs(t0));
  EXPECT_EQ(resps.size(), static_cast<size_t>(kReqs))
      << "the target stopped answering after " << resps.size() << " of " << kReqs
      << " READ requests on one lane (requests it had already buffered when its reply queue "
         "was full were never served)";
  EXPECT_FALSE(truncated);
  for (size_t i = 0; i < resps.size(); ++i) {
    EXPECT_EQ(resps[i].seq, i + 1);
    EXPECT_EQ(resps[i].status, 0);
    if (resps[i].len == n && resps[i].payload_off + n <= got.size()) {
      EXPECT_EQ(std::memcmp(got.data() + resps[i].payload_off, image.data(), n), 0) << "resp " << i;
    }
  }
  lane.Reset();
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

// A client keeps READ replies from a region queued on the target (it does not
// read them) while the peer deregisters the region. DeregisterMem returns only
// after every peer stopped using the region; the target's own queued replies
// are such a use. So once the peer's `dereg` has returned and the region has
// been overwritten with 0x42, no byte the client still receives may come from
// the overwritten region: every READ payload must be the pre-deregistration
// pattern. Param: whether the raw client acknowledges the removal at once
// (claiming it has nothing in flight) or ignores it (the peer then gives up
// after DeregisterTimeoutMs=300 and drops the client's link).
class TcpDeregTest : public TcpHostileTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Prepare({"DeregisterTimeoutMs=300"}, GetParam()));
  }
};

TEST_P(TcpDeregTest, QueuedReadRepliesNeverSendDeregisteredMemory) {
  const size_t n = 8 * kMiB;
  uintptr_t big = peer_->Reg("big", n, "rw");
  ASSERT_NE(big, 0u);
  ASSERT_TRUE(peer_->Ok("fillpat big 4242"));
  const Bytes image = Pattern(n, 4242);
  // The region was registered after our hello: wait until the target accepts
  // requests against it (its region table is local, so at once).
  Sock lane = GoodLane();
  ASSERT_GE(lane.get(), 0);
  constexpr int kReqs = 24;  // 192 MiB asked for; the target queues up to its limit
  Bytes reqs;
  for (int i = 0; i < kReqs; ++i) Append(reqs, Request(kOpRead, i + 1, big, n));
  ASSERT_TRUE(SendAll(lane.get(), reqs, 3000));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  const auto t0 = Clock::now();
  ASSERT_TRUE(peer_->Ok("dereg big", 15000));
  std::printf("[ info ] dereg took %ld ms (control link %s rdel, %d seen)\n", ElapsedMs(t0),
              GetParam() ? "acks" : "ignores", ctl_.rdel_seen());
  ASSERT_TRUE(peer_->Ok("fill big 0x42"));

  Bytes got;
  const bool closed = DrainUntilClosed(lane.get(), 5000, &got, 256 * kMiB);
  std::vector<Resp> resps;
  std::string why;
  bool truncated = false;
  ASSERT_TRUE(ParseResponses(got, resps, why, &truncated)) << why;
  size_t good = 0, bad = 0, payload_bytes = 0;
  for (const Resp& r : resps) {
    if (r.status != 0) continue;
    size_t avail = std::min<size_t>(r.len, got.size() - r.payload_off);
    payload_bytes += avail;
    // Compare in 64 KiB blocks: count blocks that differ from the pattern.
    for (size_t off = 0; off < avail; off += 65536) {
      size_t k = std::min<size_t>(65536, avail - off);
      if (std::memcmp(got.data() + r.payload_off + off, image.data() + off, k) == 0) {
        ++good;
      } else {
        ++bad;
      }
    }
  }
  std::printf("[ info ] received %zu responses, %zu payload bytes; lane %s\n", resps.size(),
              payload_bytes, closed ? "closed" : "still open after 5 s");
  // The requests behind the queued ones name a region that is gone: refused,
  // and the lane closed (or the lane went with the dropped control link).
  EXPECT_TRUE(closed) << "the lane is still open 5 s after the region went; it stopped "
                         "answering after "
                      << resps.size() << " of " << kReqs << " requests";
  EXPECT_EQ(bad, 0u) << bad << " blocks of 64 KiB (of " << (good + bad)
                     << ") the client received after the peer's DeregisterMem returned hold the "
                        "overwritten content (0x42): the target sent them from the region after "
                        "its deregistration";
  EXPECT_TRUE(peer_->Ok("canary big"));
  lane.Reset();
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

INSTANTIATE_TEST_SUITE_P(Rdel, TcpDeregTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "ClientAcksRemoval"
                                                      : "ClientIgnoresRemoval");
                         });

// (g) Notifications from a raw initiator: well-formed ones are queued and
// acknowledged; wrong field types, oversized fields and messages only a
// target may send close the link without queuing anything; the target keeps
// serving everyone else.
TEST_F(TcpHostileTest, NotificationsFromARawInitiatorAreCheckedAndBounded) {
  auto bin = [](const std::string& s) {
    return nlohmann::json::binary(std::vector<uint8_t>(s.begin(), s.end()));
  };
  ASSERT_TRUE(ctl_.Send({{"t", "notify"}, {"seq", 1u}, {"n", bin("raw")}, {"m", bin("hello")}}));
  EXPECT_EQ(ctl_.WaitNack(1, 5000), 0)
      << "a well-formed notification was not acknowledged as queued";
  EXPECT_EQ(peer_->Send("getnotifies"), "OK 1 raw=hello");

  struct Bad {
    const char* what;
    nlohmann::json msg;
  };
  const std::vector<Bad> bad = {
      {"name as a string, not bytes",
       {{"t", "notify"}, {"seq", 2u}, {"n", "raw"}, {"m", bin("x")}}},
      {"message of 1025 bytes",
       {{"t", "notify"}, {"seq", 3u}, {"n", bin("raw")}, {"m", bin(std::string(1025, 'm'))}}},
      {"name of 4096 bytes",
       {{"t", "notify"}, {"seq", 4u}, {"n", bin(std::string(4096, 'n'))}, {"m", bin("")}}},
      {"no sequence number", {{"t", "notify"}, {"n", bin("raw")}, {"m", bin("x")}}},
      {"negative sequence number",
       {{"t", "notify"}, {"seq", -1}, {"n", bin("raw")}, {"m", bin("x")}}},
      {"a nack, which only a target sends",
       {{"t", "nack"}, {"seq", 1u}, {"code", 0u}, {"why", ""}}},
      {"a heartbeat with a body that is not a map", nlohmann::json::array({"hb"})},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    RawControl c;
    std::string err;
    ASSERT_TRUE(c.Open(peer_->engine(), false, &err)) << err;
    ASSERT_TRUE(c.Send(b.msg));
    EXPECT_TRUE(c.WaitClosed(5000)) << "the target kept a link that sent " << b.what;
    EXPECT_EQ(c.WaitNack(2, 0), -1);
  }
  EXPECT_EQ(peer_->Send("getnotifies"), "OK 0") << "a malformed notification was queued";
  // The first link is unaffected and still acknowledged.
  ASSERT_TRUE(ctl_.Send({{"t", "notify"}, {"seq", 9u}, {"n", bin("after")}, {"m", bin("")}}));
  EXPECT_EQ(ctl_.WaitNack(9, 5000), 0);
  EXPECT_EQ(peer_->Send("getnotifies"), "OK 1 after=");
  ExpectRegionsUnchanged();
  ExpectPeerStillServes();
}

}  // namespace
