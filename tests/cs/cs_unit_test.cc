// Unit tests of the HiXL CS internals: how a batch is striped over links,
// and the server description a client decodes as hostile bytes.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "cs/cs_info.h"
#include "cs/stripe.h"

namespace hixl::cs {
namespace {

constexpr uint64_t kMiB = 1 << 20;

uint64_t Bytes(const std::vector<Piece>& ps) {
  uint64_t n = 0;
  for (const auto& p : ps) n += p.len;
  return n;
}

// Every byte of `in` appears exactly once in `out`, at the same offsets.
void ExpectCovers(const std::vector<Piece>& in, const std::vector<std::vector<Piece>>& out) {
  std::vector<Piece> all;
  for (const auto& l : out) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end(),
            [](const Piece& a, const Piece& b) { return a.local < b.local; });
  std::vector<Piece> want = in;
  std::sort(want.begin(), want.end(),
            [](const Piece& a, const Piece& b) { return a.local < b.local; });
  size_t j = 0;
  for (const auto& w : want) {
    uint64_t at = w.local;
    while (at < w.local + w.len) {
      ASSERT_LT(j, all.size());
      EXPECT_EQ(all[j].local, at);
      EXPECT_EQ(all[j].remote - all[j].local, w.remote - w.local);
      at += all[j].len;
      ++j;
    }
    EXPECT_EQ(at, w.local + w.len);
  }
  EXPECT_EQ(j, all.size());
}

TEST(CsStripe, SplitsByWeight) {
  std::vector<Piece> in;
  for (uint64_t i = 0; i < 64; ++i)
    in.push_back({0x100000 + i * kMiB, 0x900000000 + i * kMiB, kMiB});
  std::vector<LinkLoad> links{{true, 3e8, 0}, {true, 1e8, 0}};
  auto out = Stripe(in, links, 256 * 1024);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Bytes(out[0]), 48 * kMiB);
  EXPECT_EQ(Bytes(out[1]), 16 * kMiB);
  ExpectCovers(in, out);
}

TEST(CsStripe, CutsOneLargeDescriptor) {
  std::vector<Piece> in{{0x10000, 0x20000000, 10 * kMiB}};
  std::vector<LinkLoad> links{{true, 1e9, 0}, {true, 1e9, 0}, {false, 1e9, 0}};
  auto out = Stripe(in, links, 256 * 1024);
  EXPECT_EQ(Bytes(out[0]), 5 * kMiB);
  EXPECT_EQ(Bytes(out[1]), 5 * kMiB);
  EXPECT_TRUE(out[2].empty());  // down
  ExpectCovers(in, out);
}

TEST(CsStripe, NoShortPieces) {
  // Quotas that would leave a 100 KiB tail: the tail stays with its piece.
  std::vector<Piece> in{{0x10000, 0x20000000, 2 * kMiB + 100 * 1024}};
  std::vector<LinkLoad> links{{true, 1e9, 0}, {true, 1e9, 0}};
  auto out = Stripe(in, links, 256 * 1024);
  ExpectCovers(in, out);
  for (const auto& l : out) {
    for (const auto& p : l) EXPECT_GE(p.len, 256u * 1024);
  }
}

TEST(CsStripe, SmallBatchGoesWholeToTheLinkDoneFirst) {
  std::vector<Piece> in{{0x1000, 0x2000, 4096}, {0x3000, 0x4000, 4096}};
  // Link 0 is faster but busy: link 1 finishes this batch first.
  std::vector<LinkLoad> links{{true, 2e9, 1ull << 30}, {true, 1e9, 0}};
  auto out = Stripe(in, links, 256 * 1024);
  EXPECT_TRUE(out[0].empty());
  ASSERT_EQ(out[1].size(), 2u);
  ExpectCovers(in, out);
}

TEST(CsStripe, NoLinkUpGivesNothing) {
  std::vector<Piece> in{{0x1000, 0x2000, 4096}};
  EXPECT_TRUE(Stripe(in, {{false, 1e9, 0}}, 256 * 1024).empty());
  EXPECT_TRUE(Stripe(in, {}, 256 * 1024).empty());
}

TEST(CsStripe, ManyLinksManyPiecesCovered) {
  std::vector<Piece> in;
  uint64_t at = 0x10000;
  for (uint64_t i = 0; i < 1000; ++i) {
    uint64_t len = 4096 + (i * 7919) % (3 * kMiB);
    in.push_back({at, at + 0x100000000ull, len});
    at += len;
  }
  std::vector<LinkLoad> links{{true, 1e9, 0}, {true, 2e9, 0}, {false, 0, 0}, {true, 5e8, 0}};
  auto out = Stripe(in, links, 256 * 1024);
  ExpectCovers(in, out);
  EXPECT_GT(Bytes(out[1]), Bytes(out[0]));
  EXPECT_GT(Bytes(out[0]), Bytes(out[3]));
}

TEST(CsInfo, RoundTrip) {
  ServerInfo in;
  in.endpoints = {{"tcp", "10.0.0.1", "10.0.0.1:4000"}, {"shm", "127.0.0.1", "127.0.0.1:4001"}};
  in.mems = {{"kv0", 0x7f0000000000, 1 << 20}, {"kv1", 0x7f0010000000, 4096}};
  ServerInfo out;
  ASSERT_TRUE(DecodeInfo(EncodeInfo(in), out).ok());
  ASSERT_EQ(out.endpoints.size(), 2u);
  EXPECT_EQ(out.endpoints[1].engine, "127.0.0.1:4001");
  ASSERT_EQ(out.mems.size(), 2u);
  EXPECT_EQ(out.mems[0].tag, "kv0");
  EXPECT_EQ(out.mems[1].addr, 0x7f0010000000u);
}

TEST(CsInfo, RefusesHostileDescriptions) {
  const std::string ep = R"({"p":"tcp","a":"10.0.0.1","e":"10.0.0.1:4000"})";
  auto with = [&](const std::string& eps, const std::string& mems) {
    return R"({"hixlcs":1,"eps":[)" + eps + R"(],"mems":[)" + mems + "]}";
  };
  std::vector<std::string> bad{
      "",
      "not json",
      "[]",
      R"({"llmdd":1})",             // another layer's info
      R"({"hixlcs":1,"mems":[]})",  // no endpoints
      with("", ""),                 // empty endpoint list
      with(R"({"p":"rdma","a":"10.0.0.1","e":"10.0.0.1:1"})", ""),
      with(R"({"p":"tcp","a":"host","e":"10.0.0.1:1"})", ""),
      with(R"({"p":"tcp","a":"10.0.0.1","e":"10.0.0.1"})", ""),  // no port
      with(R"({"p":"tcp","a":"10.0.0.1","e":"10.0.0.1:0"})", ""),
      with(ep, R"({"t":"x","a":0,"n":10})"),
      with(ep, R"({"t":"x","a":16,"n":0})"),
      with(ep, R"({"t":"x","a":18446744073709551615,"n":2})"),  // wraps
      with(ep, R"({"t":"x","a":-5,"n":2})"),
      with(ep, R"({"t":"","a":16,"n":2})"),
      with(ep, R"({"t":")" + std::string(HIXL_CS_MAX_TAG_LEN + 1, 'x') + R"(","a":16,"n":2})"),
      with(ep, R"({"t":"x","a":16,"n":2},{"t":"x","a":64,"n":2})"),  // tag twice
      with(ep, R"({"t":"x","a":"16","n":2})"),
      with(R"({"p":"tcp","a":"10.0.0.1","e":"10.9.9.9:4000"})", ""),  // engine elsewhere
      with(ep, R"({"t":"x","a":16,"n":32},{"t":"y","a":40,"n":2})"),  // overlap
      with(ep, R"({"t":"a\u0001b","a":16,"n":2})"),                   // not printable
      with(ep, R"({"t":"caf\u00e9","a":16,"n":2})"),                  // not ASCII
  };
  std::string many;
  for (int i = 0; i <= HIXL_CS_MAX_ENDPOINTS; ++i) many += (i ? "," : "") + ep;
  bad.push_back(with(many, ""));
  for (const auto& b : bad) {
    ServerInfo out;
    Status s = DecodeInfo(b, out);
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << b;
  }
  ServerInfo out;
  EXPECT_EQ(DecodeInfo(R"({"hixlcs":2,"eps":[],"mems":[]})", out).code(), StatusCode::kUnsupported);
}

TEST(CsInfo, MapsProtocols) {
  LinkType link;
  std::string name;
  ASSERT_TRUE(MapProtocol(COMM_PROTOCOL_HCCS, link, name).ok());
  EXPECT_EQ(name, "shm");
  ASSERT_TRUE(MapProtocol(COMM_PROTOCOL_ROCE, link, name).ok());
  EXPECT_EQ(name, "ucx");
  ASSERT_TRUE(MapProtocol(COMM_PROTOCOL_TCP, link, name).ok());
  EXPECT_EQ(link, LinkType::TCP);
  EXPECT_EQ(MapProtocol(COMM_PROTOCOL_UB, link, name).code(), StatusCode::kUnsupported);
  EXPECT_EQ(MapProtocol(12345, link, name).code(), StatusCode::kParamInvalid);
}

}  // namespace
}  // namespace hixl::cs
