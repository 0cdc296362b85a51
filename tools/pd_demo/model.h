// pd_demo model: a small, deterministic decoder-only transformer for the
// prefill/decode disaggregation demo.
//
// Architecture (Llama-like, all tensor math in float32, single-threaded):
//   embedding [vocab, hidden]
//   per layer:
//     x += Wo * Attn(RoPE(Wq * RMSNorm(x)), RoPE(Wk * RMSNorm(x)), Wv * RMSNorm(x))
//     x += Wdown * (SiLU(Wgate * RMSNorm(x)) * (Wup * RMSNorm(x)))
//   final RMSNorm, LM head [hidden, vocab], greedy argmax (lowest index on ties).
// Attention is causal multi-head with grouped KV heads (GQA): query head h
// uses KV head h / (heads / kv_heads). RoPE is the "rotate-half" (GPT-NeoX /
// HF Llama) form with base 10000: within one head of head_dim d, element i
// and element i + d/2 (i < d/2) are rotated together by angle
// pos * 10000^(-2i/d). RMSNorm: y = x / sqrt(mean(x^2) + 1e-5) * w.
//
// Weights are drawn from `seed` with SplitMix64 -> uniform floats in [-s, s],
// s = sqrt(3 / fan_in) for projections (unit-variance preserving), embedding
// in [-1, 1], norm weights in 1 +- 0.1. No files, no downloads.
//
// Paged KV cache (vLLM-style): for each layer a K and a V tensor, each laid
// out [num_blocks][block_size][kv_heads][head_dim] float32, contiguous. A
// request owns a block table of physical block ids; token position p lives in
// block table[p / block_size], slot p % block_size. K is stored after RoPE.
//
// Determinism: results depend only on the logical KV contents, never on the
// physical blocks. Prefill and decode share one code path (ForwardLayer): the
// K/V of the new positions are written to the cache first and attention for
// position p always reads positions 0..p back from the cache in the same
// order with the same reductions, and every matrix product accumulates each
// output in the same order whatever the number of rows. So prefilling n
// tokens gives bit-identical K/V and the same next token as feeding the
// tokens one by one through DecodeStep, and a bit-exact copy of a request's
// blocks to other physical blocks decodes exactly as in place.
// (Build without -ffast-math; results are reproducible for one binary.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pd {

struct ModelConfig {
  int layers = 6, heads = 8, kv_heads = 2, head_dim = 32, mlp_dim = 512, vocab = 1024, block_size = 16;
  uint64_t seed = 1234;
  int hidden() const { return heads * head_dim; }
  // bytes of one block of one K or V tensor
  size_t block_bytes() const { return size_t(block_size) * kv_heads * head_dim * sizeof(float); }
  std::string Check() const;  // "" when valid, else what is wrong (all > 0, kv_heads divides heads, head_dim even, sane upper bounds)
};

// Where a process's paged KV cache lives: k[l], v[l] point at layer l's tensors of num_blocks blocks each.
struct KvView { std::vector<float*> k, v; int num_blocks = 0; };

class Model {
 public:
  // Throws std::invalid_argument when c.Check() is not empty.
  explicit Model(const ModelConfig& c);
  const ModelConfig& config() const;
  // hidden: n x hidden() floats, row i = token i's embedding.
  // Throws std::out_of_range for a token outside [0, vocab).
  void Embed(const int32_t* tokens, int n, float* hidden) const;
  // One layer of prefill over positions 0..n-1 (causal): updates hidden in place and writes K,V of every position into kv per block_table (which must cover n positions).
  // Throws std::invalid_argument / std::out_of_range on a bad layer, kv view or block table.
  void PrefillLayer(int layer, float* hidden, int n, const KvView& kv, const std::vector<int32_t>& block_table) const;
  // Final norm + LM head + argmax of one hidden row.
  int32_t Sample(const float* hidden_row) const;
  // Convenience: Embed + every PrefillLayer + Sample(last row): the first generated token.
  int32_t Prefill(const std::vector<int32_t>& prompt, const KvView& kv, const std::vector<int32_t>& block_table) const;
  // One decode step: `token` at position pos (KV of 0..pos-1 already in kv), writes K,V at pos (block_table must cover pos+1 positions), returns the next token.
  int32_t DecodeStep(int32_t token, int pos, const KvView& kv, const std::vector<int32_t>& block_table) const;
  // FLOPs of a prefill of n tokens (for reporting), approximately.
  double PrefillFlops(int n) const;

 private:
  struct Layer {
    std::vector<float> attn_norm;  // [hidden]
    std::vector<float> wqkv;       // [hidden, q_dim + 2 * kv_dim]: columns Q | K | V
    std::vector<float> wo;         // [hidden, hidden]
    std::vector<float> mlp_norm;   // [hidden]
    std::vector<float> wgu;        // [hidden, 2 * mlp_dim]: columns gate | up
    std::vector<float> wdown;      // [mlp_dim, hidden]
  };
  // Positions p0..p0+n-1 through one layer; KV of 0..p0-1 must already be in kv.
  void ForwardLayer(int layer, float* hidden, int n, int p0, const KvView& kv,
                    const std::vector<int32_t>& block_table) const;
  void CheckKv(int layer, int positions, const KvView& kv, const std::vector<int32_t>& block_table) const;

  ModelConfig c_;
  std::vector<float> embed_;       // [vocab, hidden]
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;  // [hidden]
  std::vector<float> lm_head_;     // [hidden, vocab]
  std::vector<double> inv_freq_;   // [head_dim / 2] RoPE inverse frequencies (angles in double, rounded to float)
};

// A deterministic prompt of n tokens for request r (from the seed).
std::vector<int32_t> MakePrompt(uint64_t seed, int request, int n, int vocab);

}  // namespace pd
