// Unit tests of the KV-cache layout arithmetic (src/datadist/layout.*):
// shapes, layer ranges, merged block runs and their bounds checks.
#include "datadist/layout.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace llm_datadist::internal {
namespace {

Layout L(uint32_t tensors, std::vector<int64_t> shape, int32_t dt = DT_FLOAT16) {
  Layout l;
  EXPECT_TRUE(MakeLayout(tensors, dt, shape, l).ok());
  return l;
}

std::vector<uint64_t> Addrs(uint32_t n, uint64_t base, uint64_t stride) {
  std::vector<uint64_t> a;
  for (uint32_t i = 0; i < n; ++i) a.push_back(base + i * stride);
  return a;
}

TEST(DatadistLayout, MakeLayoutChecksShapes) {
  Layout l;
  ASSERT_TRUE(MakeLayout(4, DT_FLOAT16, {10, 16, 8, 128}, l).ok());
  EXPECT_EQ(l.entries, 10u);
  EXPECT_EQ(l.entry_bytes, 16u * 8 * 128 * 2);
  EXPECT_EQ(l.tensor_bytes, 10u * l.entry_bytes);
  EXPECT_EQ(MakeLayout(0, DT_FLOAT16, {1}, l).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(MakeLayout(1, 5, {1}, l).code(), LLM_PARAM_INVALID);  // 5 is no data type
  EXPECT_EQ(MakeLayout(1, DT_FLOAT, {}, l).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(MakeLayout(1, DT_FLOAT, {4, 0}, l).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(MakeLayout(1, DT_FLOAT, {4, -3}, l).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(MakeLayout(1, DT_DOUBLE, {1 << 30, 1 << 30, 1 << 30}, l).code(), LLM_PARAM_INVALID);
}

TEST(DatadistLayout, LayerRanges) {
  TensorSpan s;
  ASSERT_TRUE(ResolveLayers({-1, -1}, 8, 2, "source", s).ok());
  EXPECT_EQ(s.first, 0u);
  EXPECT_EQ(s.count, 8u);
  ASSERT_TRUE(ResolveLayers({1, 2}, 8, 2, "source", s).ok());
  EXPECT_EQ(s.first, 2u);
  EXPECT_EQ(s.count, 4u);
  EXPECT_EQ(s.first_layer, 1);
  EXPECT_EQ(s.last_layer, 2);
  EXPECT_EQ(ResolveLayers({3, 4}, 8, 2, "source", s).code(), LLM_PARAM_INVALID);  // 4 layers: 0..3
  EXPECT_EQ(ResolveLayers({2, 1}, 8, 2, "source", s).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(ResolveLayers({-1, 2}, 8, 2, "source", s).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(ResolveLayers({0, 0}, 7, 2, "source", s).code(), LLM_PARAM_INVALID);  // 2 does not divide 7
  EXPECT_EQ(ResolveLayers({0, 0}, 8, 0, "source", s).code(), LLM_PARAM_INVALID);
  ASSERT_TRUE(ResolveLayers({0, 0}, 3, 3, "source", s).ok());
  EXPECT_EQ(s.count, 3u);
}

TEST(DatadistLayout, ContiguousRunsBecomeOneDescriptorPerTensor) {
  Layout l = L(4, {100, 64});
  const auto la = Addrs(4, 0x100000, 0x10000), ra = Addrs(4, 0x900000, 0x10000);
  TensorSpan all{0, 4, 0, 1};
  std::vector<uint64_t> lb(50), rb(50);
  std::iota(lb.begin(), lb.end(), 10);
  std::iota(rb.begin(), rb.end(), 30);
  std::vector<hixl::TransferOpDesc> d;
  ASSERT_TRUE(BuildBlockDescs(la, l, all, lb, ra, l, all, rb, true, d).ok());
  ASSERT_EQ(d.size(), 4u);
  for (uint32_t t = 0; t < 4; ++t) {
    EXPECT_EQ(d[t].local_addr, la[t] + 10 * 128);
    EXPECT_EQ(d[t].remote_addr, ra[t] + 30 * 128);
    EXPECT_EQ(d[t].len, 50u * 128);
  }
}

TEST(DatadistLayout, ScatteredBlocksMapOneToOne) {
  Layout l = L(2, {1000, 16});
  const auto la = Addrs(2, 0x100000, 0x100000), ra = Addrs(2, 0x900000, 0x100000);
  std::vector<uint64_t> lb(1000), rb(1000);
  std::iota(lb.begin(), lb.end(), 0);
  std::iota(rb.begin(), rb.end(), 0);
  std::mt19937_64 rng(7);
  std::shuffle(lb.begin(), lb.end(), rng);
  std::shuffle(rb.begin(), rb.end(), rng);
  std::vector<hixl::TransferOpDesc> d;
  TensorSpan all{0, 2, 0, 0};
  ASSERT_TRUE(BuildBlockDescs(la, l, all, lb, ra, l, all, rb, false, d).ok());
  // Every (local block, remote block) pair is covered exactly once per tensor.
  size_t bytes = 0;
  for (const auto& x : d) bytes += x.len;
  EXPECT_EQ(bytes, 2u * 1000 * 32);
  for (size_t i = 0; i < d.size() / 2; ++i) {  // tensor 0's descriptors come first
    uint64_t lblock = (d[i].local_addr - la[0]) / 32, rblock = (d[i].remote_addr - ra[0]) / 32;
    auto it = std::find(lb.begin(), lb.end(), lblock);
    ASSERT_NE(it, lb.end());
    EXPECT_EQ(rb[it - lb.begin()], rblock);
  }
}

TEST(DatadistLayout, BlockErrorsTouchNothing) {
  Layout l = L(2, {8, 16}), other = L(2, {8, 32}), f32 = L(2, {8, 16}, DT_FLOAT);
  const auto a = Addrs(2, 0x100000, 0x1000);
  TensorSpan all{0, 2, 0, 0}, one{0, 1, 0, 0};
  std::vector<hixl::TransferOpDesc> d;
  EXPECT_EQ(BuildBlockDescs(a, l, all, {8}, a, l, all, {0}, true, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildBlockDescs(a, l, all, {0}, a, l, all, {8}, true, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildBlockDescs(a, l, all, {0, 1}, a, l, all, {0}, true, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildBlockDescs(a, l, all, {}, a, l, all, {}, true, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildBlockDescs(a, l, all, {1, 1}, a, l, all, {2, 3}, true, d).code(),
            LLM_PARAM_INVALID);  // a destination block twice
  EXPECT_TRUE(BuildBlockDescs(a, l, all, {1, 1}, a, l, all, {2, 3}, false, d).ok());  // source twice is fine
  d.clear();
  EXPECT_EQ(BuildBlockDescs(a, l, all, {0}, a, other, all, {0}, true, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildBlockDescs(a, l, all, {0}, a, f32, all, {0}, true, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildBlockDescs(a, l, all, {0}, a, l, one, {0}, true, d).code(), LLM_PARAM_INVALID);
  EXPECT_TRUE(d.empty());
}

TEST(DatadistLayout, BatchEntriesAndSizes) {
  Layout l = L(2, {4, 256}), big = L(2, {2, 512});
  const auto la = Addrs(2, 0x100000, 0x10000), ra = Addrs(2, 0x900000, 0x10000);
  TensorSpan all{0, 2, 0, 0};
  std::vector<hixl::TransferOpDesc> d;
  ASSERT_TRUE(BuildEntryDescs(la, l, all, 1, ra, l, all, 3, -1, d).ok());
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].local_addr, la[0] + 512);
  EXPECT_EQ(d[0].remote_addr, ra[0] + 3 * 512);
  EXPECT_EQ(d[0].len, 512u);
  d.clear();
  ASSERT_TRUE(BuildEntryDescs(la, l, all, 0, ra, big, all, 1, 100, d).ok());  // part of an entry
  EXPECT_EQ(d[1].len, 100u);
  d.clear();
  EXPECT_EQ(BuildEntryDescs(la, l, all, 0, ra, big, all, 1, -1, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildEntryDescs(la, l, all, 0, ra, l, all, 0, 513, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildEntryDescs(la, l, all, 4, ra, l, all, 0, -1, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildEntryDescs(la, l, all, 0, ra, l, all, 4, -1, d).code(), LLM_PARAM_INVALID);
  EXPECT_EQ(BuildEntryDescs(la, l, all, 0, ra, l, all, 0, 0, d).code(), LLM_PARAM_INVALID);
  EXPECT_TRUE(d.empty());
}

TEST(DatadistLayout, Runs) {
  auto r = Runs({5, 6, 7, 1, 2, 9});
  ASSERT_EQ(r.size(), 3u);
  using P = std::pair<uint64_t, uint64_t>;
  EXPECT_EQ(r[0], P(5, 3));
  EXPECT_EQ(r[1], P(1, 2));
  EXPECT_EQ(r[2], P(9, 1));
  EXPECT_TRUE(Runs({}).empty());
}

}  // namespace
}  // namespace llm_datadist::internal
