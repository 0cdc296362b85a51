// tests/datadist/dd_common.h — text formats and data helpers shared by the
// LLM-DataDist test peer (datadist_peer.cc) and the tests that drive it:
// block lists, cache keys, layer ranges, the per-tensor fill seeds and the
// combined hash of a set of (tensor, block) pieces.
#ifndef HIXL_TESTS_DATADIST_DD_COMMON_H_
#define HIXL_TESTS_DATADIST_DD_COMMON_H_

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "llm_datadist/llm_datadist.h"
#include "peer_process.h"

namespace dd_test {

// Seed of tensor t when a cache is filled with `seed`: every tensor (and so
// every layer) holds different bytes.
inline uint64_t TensorSeed(uint64_t seed, uint64_t tensor) { return seed * 1000003ull + tensor; }

// Combined hash of several pieces: Fnv1a64 over the pieces' Fnv1a64 values,
// in order. Two sides agree iff every piece agrees (in the same order).
inline uint64_t CombineHashes(const std::vector<uint64_t>& hashes) {
  return hixl_test::Fnv1a64(hashes.data(), hashes.size() * sizeof(uint64_t));
}

// "1,2,5-9,3" <-> {1,2,5,6,7,8,9,3}: runs of consecutive ascending values
// become "a-b", order is kept. The empty list is "none".
inline std::string FormatList(const std::vector<uint64_t>& v) {
  if (v.empty()) return "none";
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(v[i]);
    if (j > i) out += '-' + std::to_string(v[j]);
    i = j + 1;
  }
  return out;
}

inline bool ParseList(const std::string& s, std::vector<uint64_t>& out) {
  out.clear();
  if (s == "none" || s.empty()) return true;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(pos, comma - pos);
    if (item.empty()) return false;
    char* end = nullptr;
    const uint64_t a = std::strtoull(item.c_str(), &end, 10);
    if (*end == '\0') {
      out.push_back(a);
    } else if (*end == '-') {
      char* end2 = nullptr;
      const uint64_t b = std::strtoull(end + 1, &end2, 10);
      if (*end2 != '\0' || b < a || b - a > 100000000ull) return false;
      for (uint64_t x = a; x <= b; ++x) out.push_back(x);
    } else {
      return false;
    }
    pos = comma + 1;
  }
  return true;
}

// "c:r:m" <-> CacheKey{prompt_cluster_id, req_id, model_id}.
inline std::string FormatKey(const llm_datadist::CacheKey& k) {
  return std::to_string(k.prompt_cluster_id) + ":" + std::to_string(k.req_id) + ":" +
         std::to_string(k.model_id);
}
inline bool ParseKey(const std::string& s, llm_datadist::CacheKey& k) {
  char* end = nullptr;
  k.prompt_cluster_id = std::strtoull(s.c_str(), &end, 10);
  if (*end != ':') return false;
  k.req_id = std::strtoull(end + 1, &end, 10);
  if (*end != ':') return false;
  k.model_id = std::strtoull(end + 1, &end, 10);
  return *end == '\0';
}

// "a:b" <-> {a, b} (signed: "-1:-1" is every layer).
inline std::string FormatRange(std::pair<int32_t, int32_t> r) {
  return std::to_string(r.first) + ":" + std::to_string(r.second);
}
inline bool ParseRange(const std::string& s, std::pair<int32_t, int32_t>& r) {
  char* end = nullptr;
  r.first = static_cast<int32_t>(std::strtol(s.c_str(), &end, 10));
  if (*end != ':') return false;
  r.second = static_cast<int32_t>(std::strtol(end + 1, &end, 10));
  return *end == '\0';
}

inline std::string KindName(llm_datadist::KvTransferEvent::Kind k) {
  switch (k) {
    case llm_datadist::KvTransferEvent::Kind::kPulled: return "pulled";
    case llm_datadist::KvTransferEvent::Kind::kPushed: return "pushed";
    case llm_datadist::KvTransferEvent::Kind::kLeaseExpired: return "lease_expired";
  }
  return "kind" + std::to_string(static_cast<int>(k));
}

// Data type by short name ("fp16", "bf16", "fp32", "int8", ...) or number.
inline bool ParseDataType(const std::string& s, llm_datadist::DataType& dt) {
  using namespace llm_datadist;
  static const std::pair<const char*, DataType> kNames[] = {
      {"fp32", DT_FLOAT},   {"fp16", DT_FLOAT16}, {"int8", DT_INT8},    {"int32", DT_INT32},
      {"uint8", DT_UINT8},  {"int16", DT_INT16},  {"uint16", DT_UINT16}, {"uint32", DT_UINT32},
      {"int64", DT_INT64},  {"uint64", DT_UINT64}, {"fp64", DT_DOUBLE}, {"bool", DT_BOOL},
      {"bf16", DT_BF16}};
  for (const auto& [n, v] : kNames) {
    if (s == n) {
      dt = v;
      return true;
    }
  }
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0') return false;
  dt = static_cast<DataType>(v);
  return true;
}

// "4,16,8" <-> {4, 16, 8}.
inline std::string FormatShape(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) out += (out.empty() ? "" : ",") + std::to_string(d);
  return out;
}
inline bool ParseShape(const std::string& s, std::vector<int64_t>& shape) {
  shape.clear();
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    char* end = nullptr;
    const std::string item = s.substr(pos, comma - pos);
    shape.push_back(std::strtoll(item.c_str(), &end, 10));
    if (item.empty() || *end != '\0') return false;
    pos = comma + 1;
  }
  return !shape.empty();
}

}  // namespace dd_test

#endif  // HIXL_TESTS_DATADIST_DD_COMMON_H_
