// pd_demo model: see model.h for the architecture and the determinism rules.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace pd {
namespace {

constexpr float kRmsEps = 1e-5f;
constexpr double kRopeBase = 10000.0;

struct SplitMix64 {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [-s, s]: 24 random bits -> [0, 1) exactly, then scaled.
  float Uniform(float scale) {
    const float u = float(Next() >> 40) * (1.0f / 16777216.0f);
    return (2.0f * u - 1.0f) * scale;
  }
};

void FillUniform(SplitMix64& rng, std::vector<float>& v, size_t n, float scale) {
  v.resize(n);
  for (size_t i = 0; i < n; ++i) v[i] = rng.Uniform(scale);
}

void FillNorm(SplitMix64& rng, std::vector<float>& v, size_t n) {
  v.resize(n);
  for (size_t i = 0; i < n; ++i) v[i] = 1.0f + rng.Uniform(0.1f);
}

float ProjScale(int fan_in) { return float(std::sqrt(3.0 / double(fan_in))); }

// Per-thread scratch, grown on demand and kept, so steady-state decoding does
// not allocate.
struct Work {
  std::vector<float> hid, xn, qkv, att, o, gu, act, scores, cs, sn, row, logits;
};
Work& Ws() {
  static thread_local Work w;
  return w;
}
float* Get(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// y[n][N] = x[n][K] * W[K][N] (W row-major [K][N]).
// Every output element is accumulated as ((0 + x0*w0) + x1*w1) + ... in k
// order, independent of n and of which row block the row falls into, so a
// row gives the same bits whether it is multiplied alone (decode) or with
// others (prefill). Blocked 4 rows x 64 columns for cache reuse; the inner
// loop runs over columns (independent outputs), so it vectorises without
// reassociating any sum.
constexpr int kRowBlock = 4;
constexpr int kColBlock = 64;

template <int CB>
inline void MatMulTile(const float* x, int rb, int K, const float* W, int N, int cb_rt, float* y, int ldy) {
  const int cb = CB > 0 ? CB : cb_rt;
  float acc[kRowBlock][kColBlock];
  for (int r = 0; r < rb; ++r)
    for (int j = 0; j < cb; ++j) acc[r][j] = 0.0f;
  for (int k = 0; k < K; ++k) {
    const float* w = W + size_t(k) * N;
    for (int r = 0; r < rb; ++r) {
      const float a = x[size_t(r) * K + k];
      float* ar = acc[r];
      for (int j = 0; j < cb; ++j) ar[j] += a * w[j];
    }
  }
  for (int r = 0; r < rb; ++r) std::memcpy(y + size_t(r) * ldy, acc[r], sizeof(float) * size_t(cb));
}

void MatMul(const float* x, int n, int K, const float* W, int N, float* y) {
  for (int i0 = 0; i0 < n; i0 += kRowBlock) {
    const int rb = std::min(kRowBlock, n - i0);
    const float* xr = x + size_t(i0) * K;
    float* yr = y + size_t(i0) * N;
    for (int j0 = 0; j0 < N; j0 += kColBlock) {
      const int cb = std::min(kColBlock, N - j0);
      // Which variant a column uses depends only on N, never on n.
      if (cb == kColBlock)
        MatMulTile<kColBlock>(xr, rb, K, W + j0, N, cb, yr + j0, N);
      else
        MatMulTile<0>(xr, rb, K, W + j0, N, cb, yr + j0, N);
    }
  }
}

// Dot product with a fixed 8-lane partial-sum order.
inline float Dot(const float* a, const float* b, int n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

void RmsNorm(const float* x, const float* w, int d, float* y) {
  float ss = 0.0f;
  for (int i = 0; i < d; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(d) + kRmsEps);
  for (int i = 0; i < d; ++i) y[i] = (x[i] * inv) * w[i];
}

// Rotate-half RoPE on one head: pairs (i, i + half).
inline void Rope(float* x, int half, const float* cs, const float* sn) {
  for (int i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cs[i] - x2 * sn[i];
    x[i + half] = x2 * cs[i] + x1 * sn[i];
  }
}

struct AttnShape {
  int bs, kvh, hd, group;
  float scale;
};

// Causal attention of the (roped) queries of one position p over cache
// positions 0..p, read back from the paged cache through the block table.
// q: [heads][hd]; out: [heads][hd]; scores: scratch of group * (p + 1).
// The operation order depends only on p and the logical cache contents.
void Attend(const float* q, int p, const float* kc, const float* vc, const int32_t* table,
            const AttnShape& s, float* out, float* scores) {
  const int T = p + 1;
  const size_t kvd = size_t(s.kvh) * s.hd;
  for (int g = 0; g < s.kvh; ++g) {
    const float* qg = q + size_t(g) * s.group * s.hd;
    // Scores.
    for (int t0 = 0, b = 0; t0 < T; t0 += s.bs, ++b) {
      const int nt = std::min(s.bs, T - t0);
      const float* kb = kc + size_t(table[b]) * s.bs * kvd + size_t(g) * s.hd;
      for (int t = 0; t < nt; ++t) {
        const float* kr = kb + size_t(t) * kvd;
        for (int h = 0; h < s.group; ++h)
          scores[size_t(h) * T + t0 + t] = Dot(qg + size_t(h) * s.hd, kr, s.hd) * s.scale;
      }
    }
    // Softmax per head (probabilities normalised before the weighted sum).
    for (int h = 0; h < s.group; ++h) {
      float* sh = scores + size_t(h) * T;
      float m = sh[0];
      for (int t = 1; t < T; ++t) m = std::max(m, sh[t]);
      float sum = 0.0f;
      for (int t = 0; t < T; ++t) {
        sh[t] = std::exp(sh[t] - m);
        sum += sh[t];
      }
      const float inv = 1.0f / sum;
      for (int t = 0; t < T; ++t) sh[t] *= inv;
    }
    // Weighted sum of V, accumulated in position order.
    float* og = out + size_t(g) * s.group * s.hd;
    for (size_t i = 0; i < size_t(s.group) * s.hd; ++i) og[i] = 0.0f;
    for (int t0 = 0, b = 0; t0 < T; t0 += s.bs, ++b) {
      const int nt = std::min(s.bs, T - t0);
      const float* vb = vc + size_t(table[b]) * s.bs * kvd + size_t(g) * s.hd;
      for (int t = 0; t < nt; ++t) {
        const float* vr = vb + size_t(t) * kvd;
        for (int h = 0; h < s.group; ++h) {
          const float pt = scores[size_t(h) * T + t0 + t];
          float* oh = og + size_t(h) * s.hd;
          for (int d = 0; d < s.hd; ++d) oh[d] += pt * vr[d];
        }
      }
    }
  }
}

}  // namespace

std::string ModelConfig::Check() const {
  if (layers <= 0) return "layers must be > 0";
  if (heads <= 0) return "heads must be > 0";
  if (kv_heads <= 0) return "kv_heads must be > 0";
  if (head_dim <= 0) return "head_dim must be > 0";
  if (mlp_dim <= 0) return "mlp_dim must be > 0";
  if (vocab <= 0) return "vocab must be > 0";
  if (block_size <= 0) return "block_size must be > 0";
  if (heads % kv_heads != 0) return "kv_heads must divide heads";
  if (head_dim % 2 != 0) return "head_dim must be even (RoPE pairs)";
  if (layers > 1024) return "layers must be <= 1024";
  if (heads > 1024) return "heads must be <= 1024";
  if (head_dim > 4096) return "head_dim must be <= 4096";
  if (int64_t(heads) * head_dim > 65536) return "hidden (heads * head_dim) must be <= 65536";
  if (mlp_dim > (1 << 20)) return "mlp_dim must be <= 1048576";
  if (vocab > (1 << 24)) return "vocab must be <= 16777216";
  if (block_size > 65536) return "block_size must be <= 65536";
  const double h = double(heads) * head_dim, kvd = double(kv_heads) * head_dim;
  const double per_layer = h * (h + 2 * kvd) + h * h + 3 * h * mlp_dim + 2 * h;
  const double params = 2 * double(vocab) * h + layers * per_layer + h;
  if (params > double(1ULL << 30)) return "too many parameters (> 2^30 floats)";
  return "";
}

Model::Model(const ModelConfig& c) : c_(c) {
  const std::string err = c_.Check();
  if (!err.empty()) throw std::invalid_argument("pd::ModelConfig: " + err);
  const int H = c_.hidden(), kvd = c_.kv_heads * c_.head_dim, M = c_.mlp_dim;
  const size_t qkvd = size_t(H) + 2 * size_t(kvd);
  SplitMix64 rng{c_.seed};
  FillUniform(rng, embed_, size_t(c_.vocab) * H, 1.0f);
  layers_.resize(size_t(c_.layers));
  for (Layer& L : layers_) {
    FillNorm(rng, L.attn_norm, size_t(H));
    FillUniform(rng, L.wqkv, size_t(H) * qkvd, ProjScale(H));
    FillUniform(rng, L.wo, size_t(H) * H, ProjScale(H));
    FillNorm(rng, L.mlp_norm, size_t(H));
    FillUniform(rng, L.wgu, size_t(H) * 2 * M, ProjScale(H));
    FillUniform(rng, L.wdown, size_t(M) * H, ProjScale(M));
  }
  FillNorm(rng, final_norm_, size_t(H));
  FillUniform(rng, lm_head_, size_t(H) * c_.vocab, ProjScale(H));
  const int half = c_.head_dim / 2;
  inv_freq_.resize(size_t(half));
  for (int i = 0; i < half; ++i) inv_freq_[size_t(i)] = std::pow(kRopeBase, -2.0 * i / double(c_.head_dim));
}

const ModelConfig& Model::config() const { return c_; }

void Model::Embed(const int32_t* tokens, int n, float* hidden) const {
  const int H = c_.hidden();
  for (int i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= c_.vocab) throw std::out_of_range("pd::Model::Embed: token out of range");
    std::memcpy(hidden + size_t(i) * H, embed_.data() + size_t(t) * H, sizeof(float) * size_t(H));
  }
}

void Model::CheckKv(int layer, int positions, const KvView& kv, const std::vector<int32_t>& table) const {
  if (layer < 0 || layer >= c_.layers) throw std::out_of_range("pd::Model: layer out of range");
  if (kv.k.size() != size_t(c_.layers) || kv.v.size() != size_t(c_.layers))
    throw std::invalid_argument("pd::Model: KvView must have one K and one V tensor per layer");
  if (kv.k[size_t(layer)] == nullptr || kv.v[size_t(layer)] == nullptr)
    throw std::invalid_argument("pd::Model: KvView tensor is null");
  if (kv.num_blocks <= 0) throw std::invalid_argument("pd::Model: KvView has no blocks");
  const size_t needed = (size_t(positions) + size_t(c_.block_size) - 1) / size_t(c_.block_size);
  if (table.size() < needed) throw std::invalid_argument("pd::Model: block table does not cover all positions");
  for (size_t b = 0; b < needed; ++b)
    if (table[b] < 0 || table[b] >= kv.num_blocks) throw std::out_of_range("pd::Model: block id out of range");
}

void Model::ForwardLayer(int l, float* hidden, int n, int p0, const KvView& kv,
                         const std::vector<int32_t>& table) const {
  if (n <= 0) return;
  const int H = c_.hidden(), hd = c_.head_dim, kvh = c_.kv_heads, heads = c_.heads;
  const int kvd = kvh * hd, qkvd = H + 2 * kvd, M = c_.mlp_dim, bs = c_.block_size, half = hd / 2;
  const Layer& L = layers_[size_t(l)];
  Work& w = Ws();

  // Attention block.
  float* xn = Get(w.xn, size_t(n) * H);
  for (int i = 0; i < n; ++i) RmsNorm(hidden + size_t(i) * H, L.attn_norm.data(), H, xn + size_t(i) * H);
  float* qkv = Get(w.qkv, size_t(n) * qkvd);
  MatMul(xn, n, H, L.wqkv.data(), qkvd, qkv);

  float* cs = Get(w.cs, size_t(half));
  float* sn = Get(w.sn, size_t(half));
  float* kc = kv.k[size_t(l)];
  float* vc = kv.v[size_t(l)];
  for (int i = 0; i < n; ++i) {
    const int p = p0 + i;
    for (int j = 0; j < half; ++j) {
      const double a = double(p) * inv_freq_[size_t(j)];
      cs[j] = float(std::cos(a));
      sn[j] = float(std::sin(a));
    }
    float* row = qkv + size_t(i) * qkvd;
    for (int h = 0; h < heads; ++h) Rope(row + size_t(h) * hd, half, cs, sn);
    for (int g = 0; g < kvh; ++g) Rope(row + H + size_t(g) * hd, half, cs, sn);
    const size_t dst = (size_t(table[size_t(p / bs)]) * bs + size_t(p % bs)) * kvd;
    std::memcpy(kc + dst, row + H, sizeof(float) * size_t(kvd));
    std::memcpy(vc + dst, row + H + kvd, sizeof(float) * size_t(kvd));
  }

  const AttnShape shape{bs, kvh, hd, heads / kvh, 1.0f / std::sqrt(float(hd))};
  float* att = Get(w.att, size_t(n) * H);
  float* scores = Get(w.scores, size_t(shape.group) * size_t(p0 + n));
  for (int i = 0; i < n; ++i)
    Attend(qkv + size_t(i) * qkvd, p0 + i, kc, vc, table.data(), shape, att + size_t(i) * H, scores);

  float* o = Get(w.o, size_t(n) * H);
  MatMul(att, n, H, L.wo.data(), H, o);
  for (size_t i = 0; i < size_t(n) * H; ++i) hidden[i] += o[i];

  // MLP block (SwiGLU).
  for (int i = 0; i < n; ++i) RmsNorm(hidden + size_t(i) * H, L.mlp_norm.data(), H, xn + size_t(i) * H);
  float* gu = Get(w.gu, size_t(n) * 2 * M);
  MatMul(xn, n, H, L.wgu.data(), 2 * M, gu);
  float* act = Get(w.act, size_t(n) * M);
  for (int i = 0; i < n; ++i) {
    const float* g = gu + size_t(i) * 2 * M;
    const float* u = g + M;
    float* a = act + size_t(i) * M;
    for (int m = 0; m < M; ++m) a[m] = (g[m] / (1.0f + std::exp(-g[m]))) * u[m];
  }
  MatMul(act, n, M, L.wdown.data(), H, o);
  for (size_t i = 0; i < size_t(n) * H; ++i) hidden[i] += o[i];
}

void Model::PrefillLayer(int layer, float* hidden, int n, const KvView& kv,
                         const std::vector<int32_t>& block_table) const {
  if (n < 0) throw std::invalid_argument("pd::Model::PrefillLayer: n < 0");
  CheckKv(layer, n, kv, block_table);
  ForwardLayer(layer, hidden, n, 0, kv, block_table);
}

int32_t Model::Sample(const float* hidden_row) const {
  const int H = c_.hidden(), V = c_.vocab;
  Work& w = Ws();
  float* x = Get(w.row, size_t(H));
  RmsNorm(hidden_row, final_norm_.data(), H, x);
  float* logits = Get(w.logits, size_t(V));
  MatMul(x, 1, H, lm_head_.data(), V, logits);
  int best = -1;
  for (int v = 0; v < V; ++v) {
    if (std::isnan(logits[v])) continue;
    if (best < 0 || logits[v] > logits[best]) best = v;  // strict: lowest index wins ties
  }
  return best < 0 ? 0 : best;
}

int32_t Model::Prefill(const std::vector<int32_t>& prompt, const KvView& kv,
                       const std::vector<int32_t>& block_table) const {
  if (prompt.empty()) throw std::invalid_argument("pd::Model::Prefill: empty prompt");
  if (prompt.size() > size_t(std::numeric_limits<int>::max() / 2))
    throw std::invalid_argument("pd::Model::Prefill: prompt too long");
  const int n = int(prompt.size()), H = c_.hidden();
  for (int l = 0; l < c_.layers; ++l) CheckKv(l, n, kv, block_table);
  float* hidden = Get(Ws().hid, size_t(n) * H);
  Embed(prompt.data(), n, hidden);
  for (int l = 0; l < c_.layers; ++l) ForwardLayer(l, hidden, n, 0, kv, block_table);
  return Sample(hidden + size_t(n - 1) * H);
}

int32_t Model::DecodeStep(int32_t token, int pos, const KvView& kv,
                          const std::vector<int32_t>& block_table) const {
  if (pos < 0 || pos == std::numeric_limits<int>::max())
    throw std::invalid_argument("pd::Model::DecodeStep: bad position");
  for (int l = 0; l < c_.layers; ++l) CheckKv(l, pos + 1, kv, block_table);
  float* hidden = Get(Ws().hid, size_t(c_.hidden()));
  Embed(&token, 1, hidden);
  for (int l = 0; l < c_.layers; ++l) ForwardLayer(l, hidden, 1, pos, kv, block_table);
  return Sample(hidden);
}

double Model::PrefillFlops(int n) const {
  if (n <= 0) return 0.0;
  const double N = n, H = c_.hidden(), kvd = double(c_.kv_heads) * c_.head_dim, M = c_.mlp_dim;
  const double proj = 2.0 * N * H * (H + 2.0 * kvd) + 2.0 * N * H * H + 2.0 * N * H * 2.0 * M + 2.0 * N * M * H;
  // QK^T and PV over the causal triangle: position i attends to i + 1 positions.
  const double attn = 4.0 * double(c_.heads) * c_.head_dim * (N * (N + 1.0) / 2.0);
  return c_.layers * (proj + attn) + 2.0 * H * c_.vocab;  // + LM head of the last row
}

std::vector<int32_t> MakePrompt(uint64_t seed, int request, int n, int vocab) {
  if (n < 0) throw std::invalid_argument("pd::MakePrompt: n < 0");
  if (vocab <= 0) throw std::invalid_argument("pd::MakePrompt: vocab <= 0");
  SplitMix64 rng{seed ^ (0xD1B54A32D192ED03ULL * (uint64_t(uint32_t(request)) + 1))};
  rng.Next();
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (auto& t : out) t = int32_t(rng.Next() % uint64_t(vocab));
  return out;
}

}  // namespace pd
