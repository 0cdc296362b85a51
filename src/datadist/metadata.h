// What one LLM-DataDist instance tells its peers, and how it travels.
//
// Cache table: each instance publishes the table of its caches in its own
// memory, registered READ-only for peers, and peers read it one-sidedly:
//   info string (handshake, Hixl::SetLocalInfo): {"llmdd":1, "cluster", "role", "root"}
//   root block at `root` (kRootSize bytes): {magic, version, table addr, table len, checksum}
//   table at that address: {magic, version, body len, checksum} + MessagePack body
// A published table is never modified (a change publishes a new one and then
// withdraws the old), so a reader that sees the root's version in the
// table's header with a good checksum holds a consistent table; a torn root
// or a withdrawn table fails a check and the reader tries again.
//
// Transfer events: after a pull or push succeeded, the initiator tells the
// cache's owner what moved in notifications named kEventName (binary,
// little endian, split into parts when long, sent in order).
//
// Every decoder treats its bytes as hostile: lengths, counts, ranges and
// checksums are checked before use. Thread safety: stateless functions.
#ifndef HIXL_DATADIST_METADATA_H_
#define HIXL_DATADIST_METADATA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llm_datadist/llm_datadist.h"

namespace llm_datadist::internal {

inline constexpr size_t kRootSize = 64;
inline constexpr uint64_t kMaxTableBytes = 256ull << 20;
inline constexpr size_t kMaxCaches = 1u << 20;
inline constexpr size_t kMaxKeysPerCache = 1u << 20;
inline constexpr size_t kMaxReleased = 4096;  // released keys remembered, newest kept
inline constexpr size_t kMaxUserTag = 256;
inline constexpr const char kEventName[] = "llmdd.event";

uint64_t Fnv1a(const void* data, size_t len, uint64_t h = 0xcbf29ce484222325ull);

struct InstanceInfo {
  uint64_t cluster_id = 0;
  int32_t role = 0;
  uint64_t root_addr = 0;
};
std::string EncodeInfo(const InstanceInfo& i);
Status DecodeInfo(const std::string& s, InstanceInfo& out);

struct CacheEntry {
  int64_t id = 0;
  int32_t placement = 0;
  uint32_t num_tensors = 0;
  int32_t data_type = 0;
  std::vector<int64_t> shape;
  std::vector<uint64_t> addrs;
  std::vector<CacheKey> keys;          // request keys, each naming one batch entry:
  std::vector<uint32_t> key_batches;   // keys[i] -> batch entry key_batches[i]
  std::optional<uint64_t> blocks_model_id;
  // A small region of the owner's registered only for this cache: every
  // transfer of the cache also moves kFenceBytes of it, so the engine pins
  // it for the transfer's life and the owner's DeregisterMem of it (in
  // UnregisterKvCache) returns only once no transfer of the cache runs —
  // even when the tensors live in memory registered once for many caches.
  uint64_t fence = 0;
};
inline constexpr size_t kFenceBytes = 8;
struct ReleasedKey {
  CacheKey key;
  std::string why;
};
struct Table {
  uint64_t version = 0;
  uint64_t cluster_id = 0;
  std::vector<CacheEntry> caches;
  std::vector<ReleasedKey> released;
};

// The published bytes of a table (header + body).
std::vector<uint8_t> EncodeTable(const Table& t);
// Checks header, checksum, and every field (shapes via MakeLayout).
Status DecodeTable(const uint8_t* data, size_t len, Table& out);

struct Root {
  uint64_t version = 0;
  uint64_t table_addr = 0;
  uint64_t table_len = 0;
};
void EncodeRoot(const Root& r, uint8_t out[kRootSize]);
// False when the bytes are torn or not a root.
bool DecodeRoot(const uint8_t in[kRootSize], Root& out);

struct EventMsg {
  KvTransferEvent::Kind kind = KvTransferEvent::Kind::kPulled;
  uint64_t sender_cluster = 0;
  uint64_t seq = 0;  // per sender
  int64_t cache_id = 0;
  std::optional<CacheKey> key;
  int64_t batch_index = -1;
  int32_t first_layer = -1;
  int32_t last_layer = -1;
  std::string user_tag;
  std::vector<uint64_t> blocks;  // the owner's blocks
};
// The notification messages (each at most 1024 bytes) carrying e.
std::vector<std::string> EncodeEvent(const EventMsg& e);

// Reassembles parts; one per owner instance. Not thread-safe.
class EventAssembler {
 public:
  // Feeds one notification from `from`. Returns true and fills out when an
  // event is complete; malformed parts are dropped (why says so).
  bool Feed(const std::string& from, const std::string& msg, EventMsg& out, std::string& why);

 private:
  struct Pending {
    EventMsg head;
    uint32_t parts = 0;
    uint32_t next = 0;
    std::string stream;
  };
  std::vector<std::pair<std::string, Pending>> pending_;  // bounded
  bool Finish(Pending& p, EventMsg& out, std::string& why);
};

}  // namespace llm_datadist::internal

#endif  // HIXL_DATADIST_METADATA_H_
