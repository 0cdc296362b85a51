// Unit tests of the control-message encoding and the protocol decoders: every
// malformed input is refused with a status, never a crash.
#include "common/wire.h"

#include <gtest/gtest.h>

#include <random>

#include "control/protocol.h"

namespace hixl {
namespace {

TEST(Wire, FrameRoundTripInPieces) {
  wire::Msg m = {{"t", "x"}, {"n", 42u}, {"s", "hello"}};
  auto f1 = wire::EncodeFrame(m);
  auto f2 = wire::EncodeFrame({{"t", "y"}});
  std::vector<uint8_t> all = f1;
  all.insert(all.end(), f2.begin(), f2.end());
  wire::FrameReader r;
  std::vector<std::string> types;
  for (uint8_t b : all) {  // one byte at a time
    r.Append(&b, 1);
    for (;;) {
      wire::Msg out;
      bool has = false;
      ASSERT_TRUE(r.Next(out, has).ok());
      if (!has) break;
      types.push_back(control::TypeOf(out));
      if (types.size() == 1) {
        uint64_t n = 0;
        std::string s;
        EXPECT_TRUE(wire::GetU64(out, "n", n));
        EXPECT_EQ(n, 42u);
        EXPECT_TRUE(wire::GetStr(out, "s", s));
        EXPECT_EQ(s, "hello");
      }
    }
  }
  EXPECT_EQ(types, (std::vector<std::string>{"x", "y"}));
}

TEST(Wire, RejectsBadMagicAndLengths) {
  uint8_t hdr[8] = {'G', 'E', 'T', ' ', 0, 0, 0, 1};
  uint32_t len = 0;
  EXPECT_EQ(wire::DecodeFrameHeader(hdr, len).code(), StatusCode::kParamInvalid);
  auto f = wire::EncodeFrame({{"t", "x"}});
  f[4] = 0xff, f[5] = 0xff, f[6] = 0xff, f[7] = 0xff;  // 4 GiB body claimed
  EXPECT_FALSE(wire::DecodeFrameHeader(f.data(), len).ok());
  f[4] = f[5] = f[6] = f[7] = 0;  // empty body
  EXPECT_FALSE(wire::DecodeFrameHeader(f.data(), len).ok());
}

TEST(Wire, RejectsBodiesThatAreNotTypedMaps) {
  wire::Msg out;
  const uint8_t garbage[] = {0xc1, 0x00, 0x13};  // 0xc1 is never valid MessagePack
  EXPECT_FALSE(wire::DecodeBody(garbage, sizeof(garbage), out).ok());
  std::vector<uint8_t> arr;
  wire::Msg::to_msgpack(wire::Msg::array({1, 2}), arr);
  EXPECT_FALSE(wire::DecodeBody(arr.data(), arr.size(), out).ok());
  std::vector<uint8_t> untyped;
  wire::Msg::to_msgpack(wire::Msg{{"x", 1}}, untyped);
  EXPECT_FALSE(wire::DecodeBody(untyped.data(), untyped.size(), out).ok());
  std::vector<uint8_t> truncated;
  wire::Msg::to_msgpack(wire::Msg{{"t", "hello"}, {"engine", "1.2.3.4:5"}}, truncated);
  EXPECT_FALSE(wire::DecodeBody(truncated.data(), truncated.size() - 3, out).ok());
}

TEST(Wire, TypedGettersCheckTypesAndRanges) {
  wire::Msg m = {{"u", 5u}, {"neg", -3}, {"s", "abc"}, {"b", true}, {"big", uint64_t{1} << 40}};
  uint64_t u;
  uint32_t u32;
  int64_t i;
  std::string s;
  bool b;
  EXPECT_FALSE(wire::GetU64(m, "neg", u));
  EXPECT_FALSE(wire::GetU64(m, "s", u));
  EXPECT_FALSE(wire::GetU64(m, "missing", u));
  EXPECT_FALSE(wire::GetU32(m, "big", u32));
  EXPECT_TRUE(wire::GetI64(m, "neg", i));
  EXPECT_EQ(i, -3);
  EXPECT_FALSE(wire::GetStr(m, "s", s, 2));
  EXPECT_FALSE(wire::GetBool(m, "u", b));
  EXPECT_TRUE(wire::GetBool(m, "b", b));
}

wire::Msg Roundtrip(const wire::Msg& m) {
  auto f = wire::EncodeFrame(m);
  wire::Msg out;
  EXPECT_TRUE(wire::DecodeBody(f.data() + 8, f.size() - 8, out).ok());
  return out;
}

TEST(Protocol, HelloAndWelcomeRoundTrip) {
  control::Hello h{control::kProtocolVersion, "127.0.0.1:5", 77, "host", 123};
  control::Hello h2;
  ASSERT_TRUE(control::DecodeHello(Roundtrip(control::EncodeHello(h)), h2).ok());
  EXPECT_EQ(h2.engine, "127.0.0.1:5");
  EXPECT_EQ(h2.generation, 77u);
  EXPECT_EQ(h2.pid, 123);
  EXPECT_EQ(h2.link, hixl::LinkType::AUTO);  // not sent: AUTO
  h.link = hixl::LinkType::TCP;
  ASSERT_TRUE(control::DecodeHello(Roundtrip(control::EncodeHello(h)), h2).ok());
  EXPECT_EQ(h2.link, hixl::LinkType::TCP);
  control::Welcome w;
  w.engine = "e";
  w.generation = 9;
  w.host = "h";
  w.pid = 5;
  w.regions.push_back({1, 4096, 100, 3, true});
  w.transports["shm"] = {{"uds", "x"}};
  control::Welcome w2;
  ASSERT_TRUE(control::DecodeWelcome(Roundtrip(control::EncodeWelcome(w)), w2).ok());
  ASSERT_EQ(w2.regions.size(), 1u);
  EXPECT_EQ(w2.regions[0].addr, 4096u);
  EXPECT_TRUE(w2.regions[0].shareable);
  EXPECT_TRUE(w2.transports.contains("shm"));
}

TEST(Protocol, ProbeAndIdent) {
  EXPECT_EQ(control::TypeOf(Roundtrip(control::EncodeProbe())), "probe");
  control::Ident id{control::kProtocolVersion, "127.0.0.1:9", 42};
  control::Ident got;
  ASSERT_TRUE(control::DecodeIdent(Roundtrip(control::EncodeIdent(id)), got).ok());
  EXPECT_EQ(got.engine, "127.0.0.1:9");
  EXPECT_EQ(got.generation, 42u);
  // Another version is UNSUPPORTED (alive, but not ours to judge); anything
  // else malformed is PARAM_INVALID.
  wire::Msg m = control::EncodeIdent(id);
  m["v"] = 2u;
  EXPECT_EQ(control::DecodeIdent(Roundtrip(m), got).code(), StatusCode::kUnsupported);
  m = control::EncodeIdent(id);
  m["gen"] = 0u;
  EXPECT_EQ(control::DecodeIdent(Roundtrip(m), got).code(), StatusCode::kParamInvalid);
  m = control::EncodeIdent(id);
  m.erase("engine");
  EXPECT_FALSE(control::DecodeIdent(Roundtrip(m), got).ok());
  EXPECT_FALSE(control::DecodeIdent(Roundtrip(control::EncodeBye()), got).ok());
}

TEST(Protocol, RejectsBadIdentityAndRegions) {
  control::Hello h;
  wire::Msg m = control::EncodeHello({control::kProtocolVersion, "e", 1, "h", 1});
  m["v"] = 99u;
  EXPECT_EQ(control::DecodeHello(Roundtrip(m), h).code(), StatusCode::kUnsupported);
  m = control::EncodeHello({control::kProtocolVersion, "e", 1, "h", 1});
  m["gen"] = 0u;
  EXPECT_FALSE(control::DecodeHello(Roundtrip(m), h).ok());
  m["gen"] = "one";
  EXPECT_FALSE(control::DecodeHello(Roundtrip(m), h).ok());
  m = control::EncodeHello({control::kProtocolVersion, std::string(1000, 'e'), 1, "h", 1});
  EXPECT_FALSE(control::DecodeHello(Roundtrip(m), h).ok());
  m = control::EncodeHello({control::kProtocolVersion, "e", 1, "h", 1});
  m["lt"] = 4u;  // no such link type
  EXPECT_FALSE(control::DecodeHello(Roundtrip(m), h).ok());
  m["lt"] = "tcp";
  EXPECT_FALSE(control::DecodeHello(Roundtrip(m), h).ok());

  std::vector<control::RegionDesc> out;
  auto bad_region = [&](control::RegionDesc r) {
    return control::DecodeRegionAdd(Roundtrip(control::EncodeRegionAdd({r})), out);
  };
  EXPECT_TRUE(bad_region({1, 4096, 10, 1, false}).ok());
  EXPECT_FALSE(bad_region({0, 4096, 10, 1, false}).ok());            // id 0
  EXPECT_FALSE(bad_region({1, 4096, 0, 1, false}).ok());             // empty
  EXPECT_FALSE(bad_region({1, UINT64_MAX - 5, 10, 1, false}).ok());  // wraps
  EXPECT_FALSE(bad_region({1, 4096, 10, 8, false}).ok());            // unknown perm bit
  wire::Msg weird = control::EncodeRegionAdd({});
  weird["regions"] = wire::Msg::array({"not a map"});
  EXPECT_FALSE(control::DecodeRegionAdd(Roundtrip(weird), out).ok());

  uint64_t seq;
  std::vector<uint64_t> ids;
  wire::Msg del = control::EncodeRegionDel(3, {1, 2});
  ASSERT_TRUE(control::DecodeRegionDel(Roundtrip(del), seq, ids).ok());
  EXPECT_EQ(ids.size(), 2u);
  del["ids"] = wire::Msg::array({-1});
  EXPECT_FALSE(control::DecodeRegionDel(Roundtrip(del), seq, ids).ok());
}

TEST(Protocol, NotifyAckAndHeartbeatFieldsAreChecked) {
  // Names and messages are bytes (any values), at most 1024 each.
  const std::string name("a\0b\xff", 4), msg(1024, '\x80');
  uint64_t seq = 0;
  std::string n, m;
  ASSERT_TRUE(
      control::DecodeNotify(Roundtrip(control::EncodeNotify(7, name, msg)), seq, n, m).ok());
  EXPECT_EQ(seq, 7u);
  EXPECT_EQ(n, name);
  EXPECT_EQ(m, msg);
  EXPECT_FALSE(
      control::DecodeNotify(Roundtrip(control::EncodeNotify(7, name, msg + "x")), seq, n, m).ok());
  EXPECT_FALSE(control::DecodeNotify(
                   Roundtrip(control::EncodeNotify(7, std::string(1025, 'n'), "")), seq, n, m)
                   .ok());
  wire::Msg bad = control::EncodeNotify(7, "n", "m");
  bad["n"] = "a string, not bytes";
  EXPECT_FALSE(control::DecodeNotify(Roundtrip(bad), seq, n, m).ok());
  bad = control::EncodeNotify(7, "n", "m");
  bad.erase("seq");
  EXPECT_FALSE(control::DecodeNotify(Roundtrip(bad), seq, n, m).ok());

  uint32_t code = 0;
  std::string why;
  ASSERT_TRUE(
      control::DecodeNotifyAck(Roundtrip(control::EncodeNotifyAck(3, 7, "full")), seq, code, why)
          .ok());
  EXPECT_EQ(code, 7u);
  EXPECT_EQ(why, "full");
  EXPECT_FALSE(
      control::DecodeNotifyAck(Roundtrip(control::EncodeNotifyAck(3, 9999, "")), seq, code, why)
          .ok());
  EXPECT_FALSE(
      control::DecodeNotifyAck(Roundtrip(control::EncodeNotifyAck(3, 1, std::string(2000, 'w'))),
                               seq, code, why)
          .ok());

  // The heartbeat interval in hello/welcome: optional, else within bounds.
  control::Hello h;
  wire::Msg hello = control::EncodeHello({control::kProtocolVersion, "e", 1, "h", 1});
  hello.erase("hb");
  ASSERT_TRUE(control::DecodeHello(Roundtrip(hello), h).ok());
  EXPECT_EQ(h.hb_ms, control::kDefaultHeartbeatMs);
  hello["hb"] = 250u;
  ASSERT_TRUE(control::DecodeHello(Roundtrip(hello), h).ok());
  EXPECT_EQ(h.hb_ms, 250u);
  for (const wire::Msg& v :
       {wire::Msg(0u), wire::Msg(1u << 31), wire::Msg("fast"), wire::Msg(-5)}) {
    hello["hb"] = v;
    EXPECT_FALSE(control::DecodeHello(Roundtrip(hello), h).ok()) << v.dump();
  }
}

// Random bytes and randomly damaged valid frames never crash the decoders.
TEST(Protocol, SurvivesRandomInput) {
  std::mt19937_64 rng(12345);
  control::Welcome w;
  w.engine = "e";
  w.generation = 9;
  w.host = "h";
  w.pid = 5;
  for (int i = 0; i < 20; ++i)
    w.regions.push_back({uint64_t(i + 1), 4096u * (i + 1), 100, 3, i % 2 == 0});
  const std::vector<std::vector<uint8_t>> valids = {
      wire::EncodeFrame(control::EncodeWelcome(w)),
      wire::EncodeFrame(control::EncodeNotify(5, "layer-3", std::string(300, 'x'))),
      wire::EncodeFrame(control::EncodeNotifyAck(5, 7, "queue full"))};
  for (int iter = 0; iter < 5000; ++iter) {
    std::vector<uint8_t> buf;
    if (iter % 2 == 0) {
      buf.resize(rng() % 256);
      for (auto& b : buf) b = static_cast<uint8_t>(rng());
    } else {
      buf = valids[static_cast<size_t>(iter / 2) % valids.size()];
      for (int k = 0; k < 4; ++k) buf[8 + rng() % (buf.size() - 8)] = static_cast<uint8_t>(rng());
    }
    wire::FrameReader r;
    r.Append(buf.data(), buf.size());
    for (int k = 0; k < 4; ++k) {
      wire::Msg m;
      bool has = false;
      if (!r.Next(m, has).ok() || !has) break;
      control::Welcome out;
      control::Hello hout;
      std::vector<control::RegionDesc> regions;
      (void)control::DecodeWelcome(m, out);
      (void)control::DecodeHello(m, hout);
      (void)control::DecodeRegionAdd(m, regions);
      uint64_t seq = 0;
      uint32_t code = 0;
      std::string a, b;
      (void)control::DecodeNotify(m, seq, a, b);
      (void)control::DecodeNotifyAck(m, seq, code, a);
    }
  }
}

}  // namespace
}  // namespace hixl
