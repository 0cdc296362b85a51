// Tests for the pd_demo model (tools/pd_demo/model.h).
#include "model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>

namespace pd {
namespace {

// A process's paged KV cache: per layer a K and a V buffer of num_blocks blocks.
struct Cache {
  std::vector<std::vector<float>> k, v;
  KvView view;
  Cache(const ModelConfig& c, int num_blocks, float fill = std::numeric_limits<float>::quiet_NaN()) {
    const size_t floats = size_t(num_blocks) * c.block_bytes() / sizeof(float);
    k.assign(size_t(c.layers), std::vector<float>(floats, fill));
    v.assign(size_t(c.layers), std::vector<float>(floats, fill));
    for (int l = 0; l < c.layers; ++l) {
      view.k.push_back(k[size_t(l)].data());
      view.v.push_back(v[size_t(l)].data());
    }
    view.num_blocks = num_blocks;
  }
  // Pointer to the K (or V) row of logical position p under table.
  const float* At(const ModelConfig& c, bool is_k, int layer, const std::vector<int32_t>& table, int p) const {
    const auto& t = is_k ? k[size_t(layer)] : v[size_t(layer)];
    const size_t row = size_t(c.kv_heads) * c.head_dim;
    return t.data() + (size_t(table[size_t(p / c.block_size)]) * c.block_size + size_t(p % c.block_size)) * row;
  }
};

std::vector<int32_t> Iota(int n, int start = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

int BlocksFor(const ModelConfig& c, int positions) { return (positions + c.block_size - 1) / c.block_size; }

// Decodes `steps` tokens after a prefill that returned `first` for a prompt of n tokens.
std::vector<int32_t> Generate(const Model& m, int32_t first, int n, int steps, const KvView& kv,
                              const std::vector<int32_t>& table) {
  std::vector<int32_t> out{first};
  int32_t tok = first;
  for (int s = 0; s < steps; ++s) {
    tok = m.DecodeStep(tok, n + s, kv, table);
    out.push_back(tok);
  }
  return out;
}

// Logical K/V contents of positions [0, positions) compare bit for bit.
void ExpectSameKv(const ModelConfig& c, const Cache& a, const std::vector<int32_t>& ta, const Cache& b,
                  const std::vector<int32_t>& tb, int positions) {
  const size_t row_bytes = size_t(c.kv_heads) * c.head_dim * sizeof(float);
  for (int l = 0; l < c.layers; ++l)
    for (int p = 0; p < positions; ++p)
      for (bool is_k : {true, false})
        ASSERT_EQ(0, std::memcmp(a.At(c, is_k, l, ta, p), b.At(c, is_k, l, tb, p), row_bytes))
            << "layer " << l << " pos " << p << (is_k ? " K" : " V");
}

TEST(ModelConfigTest, DefaultsAreValid) {
  ModelConfig c;
  EXPECT_EQ("", c.Check());
  EXPECT_EQ(256, c.hidden());
  EXPECT_EQ(size_t(16) * 2 * 32 * 4, c.block_bytes());
}

TEST(ModelConfigTest, RejectsBadConfigs) {
  auto bad = [](auto mutate) {
    ModelConfig c;
    mutate(c);
    return c.Check();
  };
  EXPECT_NE("", bad([](ModelConfig& c) { c.layers = 0; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.heads = -1; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.kv_heads = 0; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.head_dim = 0; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.mlp_dim = 0; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.vocab = 0; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.block_size = 0; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.kv_heads = 3; }));   // does not divide 8
  EXPECT_NE("", bad([](ModelConfig& c) { c.kv_heads = 16; }));  // more KV heads than heads
  EXPECT_NE("", bad([](ModelConfig& c) { c.head_dim = 31; }));  // odd
  EXPECT_NE("", bad([](ModelConfig& c) { c.layers = 1 << 20; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.vocab = 1 << 30; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.head_dim = 1 << 14; }));
  EXPECT_NE("", bad([](ModelConfig& c) { c.mlp_dim = 1 << 20; c.layers = 1000; }));  // too many params
  EXPECT_EQ("", bad([](ModelConfig& c) { c.kv_heads = 8; }));   // MHA
  EXPECT_EQ("", bad([](ModelConfig& c) { c.kv_heads = 1; }));   // MQA

  ModelConfig c;
  c.kv_heads = 3;
  EXPECT_THROW(Model m(c), std::invalid_argument);
}

TEST(ModelTest, RejectsBadCalls) {
  ModelConfig c;
  c.layers = 2;
  Model m(c);
  Cache cache(c, 4);
  std::vector<int32_t> table = Iota(2);  // 32 positions
  std::vector<int32_t> prompt = MakePrompt(c.seed, 0, 33, c.vocab);
  EXPECT_THROW(m.Prefill(prompt, cache.view, table), std::invalid_argument);  // table too short
  prompt.resize(8);
  EXPECT_THROW(m.Prefill(prompt, cache.view, {7}), std::out_of_range);  // block id >= num_blocks
  EXPECT_THROW(m.Prefill({}, cache.view, table), std::invalid_argument);
  EXPECT_THROW(m.DecodeStep(c.vocab, 0, cache.view, table), std::out_of_range);
  EXPECT_THROW(m.DecodeStep(0, 32, cache.view, table), std::invalid_argument);
  KvView short_view = cache.view;
  short_view.k.pop_back();
  EXPECT_THROW(m.Prefill(prompt, short_view, table), std::invalid_argument);
  std::vector<float> h(size_t(c.hidden()) * 8);
  EXPECT_THROW(m.PrefillLayer(2, h.data(), 8, cache.view, table), std::out_of_range);
}

TEST(ModelTest, MakePromptIsDeterministic) {
  auto a = MakePrompt(7, 3, 100, 1024);
  EXPECT_EQ(a, MakePrompt(7, 3, 100, 1024));
  EXPECT_NE(a, MakePrompt(7, 4, 100, 1024));
  EXPECT_NE(a, MakePrompt(8, 3, 100, 1024));
  for (int32_t t : a) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 1024);
  }
}

TEST(ModelTest, SameSeedSameTokens) {
  ModelConfig c;
  const int n = 40, steps = 16;
  const auto prompt = MakePrompt(c.seed, 1, n, c.vocab);
  const std::vector<int32_t> table = Iota(BlocksFor(c, n + steps));
  std::vector<int32_t> runs[2];
  for (auto& run : runs) {
    Model m(c);
    Cache cache(c, int(table.size()));
    run = Generate(m, m.Prefill(prompt, cache.view, table), n, steps, cache.view, table);
  }
  EXPECT_EQ(runs[0], runs[1]);

  ModelConfig c2 = c;
  c2.seed = c.seed + 1;
  Model m2(c2);
  Cache cache(c2, int(table.size()));
  EXPECT_NE(runs[0], Generate(m2, m2.Prefill(prompt, cache.view, table), n, steps, cache.view, table));
}

TEST(ModelTest, LayerwisePrefillEqualsPrefill) {
  ModelConfig c;
  Model m(c);
  const int n = 21;
  const auto prompt = MakePrompt(c.seed, 2, n, c.vocab);
  const std::vector<int32_t> table = Iota(BlocksFor(c, n));
  Cache a(c, int(table.size())), b(c, int(table.size()));
  const int32_t t1 = m.Prefill(prompt, a.view, table);
  std::vector<float> hidden(size_t(n) * c.hidden());
  m.Embed(prompt.data(), n, hidden.data());
  for (int l = 0; l < c.layers; ++l) m.PrefillLayer(l, hidden.data(), n, b.view, table);
  EXPECT_EQ(t1, m.Sample(hidden.data() + size_t(n - 1) * c.hidden()));
  ExpectSameKv(c, a, table, b, table, n);
}

// Prefill into table A, copy the blocks bit-exactly to a shuffled table B of
// another (larger) cache, decode from both: identical tokens and KV.
TEST(ModelTest, ResultIndependentOfPhysicalBlocks) {
  ModelConfig c;
  Model m(c);
  const int n = 100, steps = 16;  // 100 is not a multiple of block_size
  const int blocks = BlocksFor(c, n + steps);
  const auto prompt = MakePrompt(c.seed, 3, n, c.vocab);

  Cache a(c, blocks + 3);
  std::vector<int32_t> ta = Iota(blocks, 2);  // blocks 2..blocks+1
  Cache b(c, 3 * blocks);
  std::vector<int32_t> tb = Iota(3 * blocks);
  std::mt19937 rng(42);
  std::shuffle(tb.begin(), tb.end(), rng);
  tb.resize(size_t(blocks));
  ASSERT_NE(ta, tb);

  const int32_t first = m.Prefill(prompt, a.view, ta);
  // Move the prompt's blocks, as the disaggregated transfer would.
  const int prompt_blocks = BlocksFor(c, n);
  const size_t bf = c.block_bytes() / sizeof(float);
  for (int l = 0; l < c.layers; ++l)
    for (int i = 0; i < prompt_blocks; ++i) {
      std::memcpy(b.k[size_t(l)].data() + size_t(tb[size_t(i)]) * bf, a.k[size_t(l)].data() + size_t(ta[size_t(i)]) * bf,
                  c.block_bytes());
      std::memcpy(b.v[size_t(l)].data() + size_t(tb[size_t(i)]) * bf, a.v[size_t(l)].data() + size_t(ta[size_t(i)]) * bf,
                  c.block_bytes());
    }
  const auto in_place = Generate(m, first, n, steps, a.view, ta);
  const auto moved = Generate(m, first, n, steps, b.view, tb);
  EXPECT_EQ(in_place, moved);
  ExpectSameKv(c, a, ta, b, tb, n + steps);
}

// Prefill of n tokens == feeding the same tokens one by one through DecodeStep.
TEST(ModelTest, PrefillEqualsTokenByTokenDecode) {
  for (int n : {1, 5, 16, 37}) {
    ModelConfig c;
    if (n == 5) {  // also a non-default shape: MHA, odd sizes, head_dim not a multiple of 8
      c.layers = 3; c.heads = 4; c.kv_heads = 4; c.head_dim = 14; c.mlp_dim = 70; c.vocab = 333; c.block_size = 3;
    }
    Model m(c);
    const int steps = 8;
    const auto prompt = MakePrompt(c.seed, 4, n, c.vocab);
    const int blocks = BlocksFor(c, n + steps);
    Cache a(c, blocks);
    const std::vector<int32_t> ta = Iota(blocks);
    Cache b(c, blocks + 5);
    std::vector<int32_t> tb = Iota(blocks, 5);
    std::reverse(tb.begin(), tb.end());

    const int32_t from_prefill = m.Prefill(prompt, a.view, ta);
    int32_t from_decode = -1;
    for (int p = 0; p < n; ++p) from_decode = m.DecodeStep(prompt[size_t(p)], p, b.view, tb);
    EXPECT_EQ(from_prefill, from_decode) << "n=" << n;
    ExpectSameKv(c, a, ta, b, tb, n);
    EXPECT_EQ(Generate(m, from_prefill, n, steps, a.view, ta), Generate(m, from_decode, n, steps, b.view, tb));
    ExpectSameKv(c, a, ta, b, tb, n + steps);
  }
}

TEST(ModelTest, NotDegenerate) {
  ModelConfig c;
  Model m(c);
  const int n = 64, steps = 31;
  const std::vector<int32_t> table = Iota(BlocksFor(c, n + steps));
  Cache cache(c, int(table.size()));
  for (int r = 0; r < 3; ++r) {
    const auto prompt = MakePrompt(c.seed, r, n, c.vocab);
    const auto gen = Generate(m, m.Prefill(prompt, cache.view, table), n, steps, cache.view, table);
    ASSERT_EQ(32u, gen.size());
    const std::set<int32_t> distinct(gen.begin(), gen.end());
    EXPECT_GE(distinct.size(), 4u) << "request " << r;
    for (int32_t t : gen) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, c.vocab);
    }
  }
  // K/V are finite and well-scaled.
  double ss = 0;
  size_t cnt = 0;
  for (int p = 0; p < n + steps; ++p) {
    const float* k = cache.At(c, true, c.layers - 1, table, p);
    for (int i = 0; i < c.kv_heads * c.head_dim; ++i) {
      ASSERT_TRUE(std::isfinite(k[i]));
      ss += double(k[i]) * k[i];
      ++cnt;
    }
  }
  const double rms = std::sqrt(ss / double(cnt));
  EXPECT_GT(rms, 0.05);
  EXPECT_LT(rms, 20.0);
}

TEST(ModelTest, FlopCount) {
  ModelConfig c;
  Model m(c);
  EXPECT_GT(m.PrefillFlops(256), 2 * m.PrefillFlops(128) * 0.99);
  EXPECT_EQ(0.0, m.PrefillFlops(0));
}

}  // namespace
}  // namespace pd
