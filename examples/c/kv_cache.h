// examples/c/kv_cache.h — the stand-in "KV cache" the seed's prefill, decode
// and async-pipeline programs move: a header followed by a payload whose bytes
// depend only on the request id, so the decode side can verify what arrived.
#ifndef HIXL_EXAMPLES_KV_CACHE_H_
#define HIXL_EXAMPLES_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

struct KVCacheHeader {
  uint64_t magic;          // kKVMagic once written
  uint64_t request_id;     // the inference request this cache belongs to
  uint32_t seq_len;        // tokens
  uint32_t num_layers;
  uint64_t payload_bytes;  // bytes after the header
  uint64_t checksum;       // FNV-1a 64 of the payload
};
inline constexpr uint64_t kKVMagic = 0x4b56434143484531ull;  // "KVCACHE1"

inline uint64_t KVChecksum(const unsigned char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// A whole KV cache (header + payload) in host memory — what the seed keeps in
// device memory from aclrtMalloc.
class KVCache {
 public:
  KVCache(uint64_t request_id, size_t total_bytes) : bytes_(total_bytes) {
    auto* h = reinterpret_cast<KVCacheHeader*>(bytes_.data());
    unsigned char* payload = bytes_.data() + sizeof(KVCacheHeader);
    size_t n = total_bytes - sizeof(KVCacheHeader);
    uint64_t x = request_id * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; ++i) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      payload[i] = static_cast<unsigned char>(x);
    }
    h->magic = kKVMagic;
    h->request_id = request_id;
    h->seq_len = 512 + static_cast<uint32_t>(request_id);
    h->num_layers = 32;
    h->payload_bytes = n;
    h->checksum = KVChecksum(payload, n);
  }
  void* data() { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }

 private:
  std::vector<unsigned char> bytes_;
};

// True when buf holds a complete KV cache of request_id.
inline bool KVCacheValid(const void* buf, size_t size, uint64_t request_id) {
  const auto* h = static_cast<const KVCacheHeader*>(buf);
  if (size < sizeof(KVCacheHeader) || h->magic != kKVMagic || h->request_id != request_id) {
    return false;
  }
  if (h->payload_bytes > size - sizeof(KVCacheHeader)) return false;
  const auto* payload = static_cast<const unsigned char*>(buf) + sizeof(KVCacheHeader);
  return KVChecksum(payload, h->payload_bytes) == h->checksum;
}

#endif  // HIXL_EXAMPLES_KV_CACHE_H_
