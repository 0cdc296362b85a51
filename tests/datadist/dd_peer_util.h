// tests/datadist/dd_peer_util.h — helpers of the LLM-DataDist test peer
// (datadist_peer.cc): argument parsing, its view of a local cache, the hash
// commands, the layer-wise config syntax and the event line format.
#ifndef HIXL_TESTS_DATADIST_DD_PEER_UTIL_H_
#define HIXL_TESTS_DATADIST_DD_PEER_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dd_common.h"
#include "llm_datadist/llm_datadist.h"
#include "peer_process.h"

namespace dd_test {
namespace ld = llm_datadist;

inline bool ParseRole(const std::string& s, ld::LlmRole& r) {
  if (s == "prompt") r = ld::LlmRole::kPrompt;
  else if (s == "decoder") r = ld::LlmRole::kDecoder;
  else if (s == "mix") r = ld::LlmRole::kMix;
  else return false;
  return true;
}

inline bool SplitAddr(const std::string& a, ld::IpInfo& ip) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos) return false;
  ip.ip = a.substr(0, colon);
  ip.port = static_cast<uint16_t>(std::strtoul(a.c_str() + colon + 1, nullptr, 10));
  return true;
}

// One cache the peer allocated (and usually registered).
struct LocalCache {
  ld::CacheDesc desc;
  std::vector<uint64_t> addrs;
  size_t tensor_bytes = 0;
  size_t entry_bytes = 0;  // one batch entry / block
  std::string mem = "malloc";
  std::vector<void*> owned;  // malloc'd or AllocHostMemory blocks
  int64_t id = 0;
  bool registered = false;
  unsigned char* T(size_t t) const { return reinterpret_cast<unsigned char*>(addrs[t]); }
};

// hasht / hashb / hashe / hashr (see datadist_peer.cc) -> the reply line.
inline std::string HashCommand(const std::string& cmd, const LocalCache& c, std::istringstream& in) {
  std::vector<uint64_t> hs;
  if (cmd == "hasht") {
    std::string out;
    for (size_t t = 0; t < c.addrs.size(); ++t)
      out += (out.empty() ? "" : ",") + hixl_test::HashHex(hixl_test::Fnv1a64(c.T(t), c.tensor_bytes));
    return "OK " + out;
  }
  size_t t0 = 0, t1 = 0;
  if (!(in >> t0 >> t1) || t1 < t0 || t1 >= c.addrs.size()) return "ERR usage tensor range";
  if (cmd == "hashb") {
    std::string list_s;
    std::vector<uint64_t> blocks;
    if (!(in >> list_s) || !dd_test::ParseList(list_s, blocks)) return "ERR usage block list";
    const size_t nb = c.tensor_bytes / c.entry_bytes;
    for (size_t t = t0; t <= t1; ++t) {
      for (uint64_t b : blocks) {
        if (b >= nb) return "ERR usage block " + std::to_string(b) + " out of range";
        hs.push_back(hixl_test::Fnv1a64(c.T(t) + b * c.entry_bytes, c.entry_bytes));
      }
    }
  } else if (cmd == "hashr") {
    size_t off = 0, len = 0;
    if (!(in >> off >> len) || off > c.tensor_bytes || len > c.tensor_bytes - off)
      return "ERR usage hashr NAME T0 T1 OFFSET LEN";
    for (size_t t = t0; t <= t1; ++t) hs.push_back(hixl_test::Fnv1a64(c.T(t) + off, len));
  } else {
    size_t entry = 0;
    long long size = -1;
    if (!(in >> entry >> size)) return "ERR usage hashe NAME T0 T1 ENTRY SIZE";
    const size_t n = size < 0 ? c.entry_bytes : static_cast<size_t>(size);
    if (n > c.entry_bytes || (entry + 1) * c.entry_bytes > c.tensor_bytes) return "ERR usage range";
    for (size_t t = t0; t <= t1; ++t)
      hs.push_back(hixl_test::Fnv1a64(c.T(t) + entry * c.entry_bytes, n));
  }
  return "OK " + hixl_test::HashHex(dd_test::CombineHashes(hs));
}

// One "cfg=" value: fields "k=v" separated by '/' (see datadist_peer.cc).
// Returns "" or what is wrong.
inline std::string ParseLayerConfig(const std::string& f, ld::LayerTransferConfig& lc) {
  std::stringstream ss(f);
  std::string field;
  while (std::getline(ss, field, '/')) {
    const size_t eq = field.find('=');
    if (eq == std::string::npos) return "cfg field " + field;
    const std::string k = field.substr(0, eq), v = field.substr(eq + 1);
    if (k == "cluster") lc.dst_cluster_id = std::stoull(v);
    else if (k == "cache") lc.dst_cache_id = std::stoll(v);
    else if (k == "sb") lc.src_batch_index = static_cast<uint32_t>(std::stoul(v));
    else if (k == "db") lc.dst_batch_index = static_cast<uint32_t>(std::stoul(v));
    else if (k == "sl" && dd_test::ParseRange(v, lc.src_layer_range)) continue;
    else if (k == "dl" && dd_test::ParseRange(v, lc.dst_layer_range)) continue;
    else if (k == "key") {
      ld::CacheKey key;
      if (!dd_test::ParseKey(v, key)) return "cfg key";
      lc.dst_key = key;
    } else if (k == "tag") {
      lc.user_tag = v;
    } else if (k == "addrs") {
      if (!dd_test::ParseList(v, lc.dst_addrs)) return "cfg addrs";
    } else {
      return "cfg field " + field;
    }
  }
  return "";
}

// " | "-separated items of the "events" reply.
inline std::string FormatEvent(const ld::KvTransferEvent& e) {
  return "kind=" + dd_test::KindName(e.kind) + " peer=" + std::to_string(e.peer_cluster_id) +
         " cache=" + std::to_string(e.cache_id) +
         " key=" + (e.key ? dd_test::FormatKey(*e.key) : std::string("none")) +
         " blocks=" + dd_test::FormatList(e.blocks) + " batch=" + std::to_string(e.batch_index) +
         " layers=" + dd_test::FormatRange(e.layer_range) + " tag=" + e.user_tag;
}

}  // namespace dd_test

#endif  // HIXL_TESTS_DATADIST_DD_PEER_UTIL_H_
