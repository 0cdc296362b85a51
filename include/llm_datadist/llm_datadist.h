// llm_datadist/llm_datadist.h — LLM-DataDist: KV caches moved between the
// prefill ("prompt") and decode instances of a disaggregated LLM service, by
// one-sided reads and writes of the hixl engine underneath.
//
// The API follows the published LLM-DataDist C++ API (names, option keys,
// status-code values), so code written for it ports with a recompile; what
// goes beyond it is marked "extension".
//
// Model. Each LlmDataDist instance is one hixl engine (hixl::Hixl) plus a
// table of the KV caches it registered. A KV cache is num_tensors tensors of
// one shape and data type, laid out [K0, V0, K1, V1, ...]
// (KvCacheExtParam::tensor_num_per_layer tensors per layer). The first
// dimension of the shape is the batch (whole caches: PullKvCache /
// PushKvCache) or the block count (paged caches: PullKvBlocks /
// PushKvBlocks); one batch entry or block of one tensor is
// prod(shape[1:]) * element size bytes, contiguous.
//
// Linking is directional and independent of role: after A links to B,
// A may pull from and push into every cache B registered — registered
// before or after the link — and sees B's later registrations and
// unregistrations. B needs no call of its own; to move data the other way
// B links to A (A then needs llm.ListenIpInfo). Each pull/push checks the
// request against B's current cache table (cache ids, shapes, data types,
// block and layer ranges) before any byte moves, and the engine checks every
// descriptor against B's registered memory: a bad request fails whole with
// a clear status and writes nothing.
//
// The owner learns what was moved (extension): when a pull or push of one of
// its caches completes, its instance receives a KvTransferEvent naming the
// cache, the request key and the blocks — after the data, so a prefill
// instance may free blocks the moment decode has them. It hears only of
// transfers that succeeded; telling it is best effort (a lost message is
// logged by the mover, whose call still succeeds: its data did move). A cache registered
// with request keys and a lease has its keys released when nobody pulled by
// them in time; a later pull by such a key fails LLM_KV_CACHE_NOT_EXIST
// saying so.
//
// Thread safety: every method may be called from any thread concurrently,
// except Initialize and Finalize, which must not race with other calls on
// the same object. Any number of instances may live in one process.
// Ownership: memory passed to RegisterKvCache stays the caller's and must
// outlive its registration; memory from AllocHostMemory is the instance's
// (released by FreeHostMemory or Finalize). No exceptions cross this API.
#ifndef LLM_DATADIST_LLM_DATADIST_H_
#define LLM_DATADIST_LLM_DATADIST_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hixl/status.h"  // HIXL_EXPORT

namespace llm_datadist {

// ---------------------------------------------------------------------------
// Status codes: the published values.
inline constexpr uint32_t LLM_SUCCESS = 0x0u;
inline constexpr uint32_t LLM_FAILED = 0xFFFFFFFFu;
inline constexpr uint32_t LLM_WAIT_PROC_TIMEOUT = 0x5010B001u;
inline constexpr uint32_t LLM_KV_CACHE_NOT_EXIST = 0x5010B002u;
inline constexpr uint32_t LLM_PARAM_INVALID = 0x5010B005u;
inline constexpr uint32_t LLM_NOT_YET_LINK = 0x5010B007u;
inline constexpr uint32_t LLM_ALREADY_LINK = 0x5010B008u;
inline constexpr uint32_t LLM_LINK_FAILED = 0x5010B009u;
inline constexpr uint32_t LLM_UNLINK_FAILED = 0x5010B00Au;
inline constexpr uint32_t LLM_CLUSTER_NUM_EXCEED_LIMIT = 0x5010B00Cu;
inline constexpr uint32_t LLM_PROCESSING_LINK = 0x5010B00Du;
inline constexpr uint32_t LLM_EXIST_LINK = 0x5010B018u;
inline constexpr uint32_t LLM_FEATURE_NOT_ENABLED = 0x5010B019u;
inline constexpr uint32_t LLM_TIMEOUT = 0x5010B01Au;
inline constexpr uint32_t LLM_OUT_OF_MEMORY = 0x5010B01Cu;

// "LLM_PARAM_INVALID", ...; "LLM_UNKNOWN" for other values.
HIXL_EXPORT const char* StatusCodeName(uint32_t code);

// A status code plus a human-readable message. It converts to and from the
// plain code, so published-style code (`if (ret != LLM_SUCCESS)`,
// `return LLM_PARAM_INVALID;`) compiles unchanged; message() says what went
// wrong, including the engine's own words where the engine failed.
class [[nodiscard]] HIXL_EXPORT Status {
 public:
  Status() = default;  // LLM_SUCCESS
  Status(uint32_t code) : code_(code) {}  // NOLINT: implicit on purpose
  Status(uint32_t code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == LLM_SUCCESS; }
  uint32_t code() const { return code_; }
  const std::string& message() const { return message_; }
  // "LLM_SUCCESS" or "LLM_PARAM_INVALID (0x5010b005): block 7 is out of range ...".
  std::string ToString() const;
  operator uint32_t() const { return code_; }  // NOLINT: implicit on purpose

 private:
  uint32_t code_ = LLM_SUCCESS;
  std::string message_;
};

// ---------------------------------------------------------------------------
// Types (published names and values).
enum class LlmRole : int32_t { kPrompt = 1, kDecoder = 2, kMix = 3 };

enum class CachePlacement : int32_t { kHost = 0, kDevice = 1 };

enum DataType : int32_t {
  DT_FLOAT = 0,
  DT_FLOAT16 = 1,
  DT_INT8 = 2,
  DT_INT32 = 3,
  DT_UINT8 = 4,
  DT_INT16 = 6,
  DT_UINT16 = 7,
  DT_UINT32 = 8,
  DT_INT64 = 9,
  DT_UINT64 = 10,
  DT_DOUBLE = 11,
  DT_BOOL = 12,
  DT_BF16 = 27,
};
// Bytes per element; 0 for a value that is not a DataType above.
HIXL_EXPORT size_t DataTypeSize(int32_t data_type);

struct IpInfo {
  std::string ip;  // IPv4 or IPv6 literal
  uint16_t port = 0;
};

struct ClusterInfo {
  uint64_t remote_cluster_id = 0;
  int32_t remote_role_type = 0;        // an LlmRole value; informational
  std::vector<IpInfo> local_ip_infos;  // accepted; the engine picks the route
  std::vector<IpInfo> remote_ip_infos; // the first reachable one is linked; empty:
                                       // found through discovery (MetadataServer in
                                       // llm.GlobalResourceConfig), where every
                                       // listening instance is published as
                                       // "llm-cluster-<cluster id>"
};

struct CacheDesc {
  // kDevice: the tensors are CUDA device memory (HIXL_WITH_CUDA; the engine
  // checks each address with the driver). Transfers read and write them on
  // the device; the application makes the bytes final (synchronizes its
  // stream) before it pulls, pushes or opens a layer's gate.
  CachePlacement placement = CachePlacement::kHost;
  uint32_t num_tensors = 0;
  DataType data_type = DT_FLOAT16;
  std::vector<int64_t> shape;  // shape[0]: batch or block count; every dim > 0
};

// A request's key (the Python CacheKey): extension in C++, where the
// published API pulls by CacheIndex only.
struct CacheKey {
  uint64_t prompt_cluster_id = 0;
  uint64_t req_id = 0;
  uint64_t model_id = 0;
  bool operator==(const CacheKey& o) const {
    return prompt_cluster_id == o.prompt_cluster_id && req_id == o.req_id &&
           model_id == o.model_id;
  }
};

// A peer's paged cache named by its model (the Python BlocksCacheKey):
// extension in C++. It finds the cache that cluster registered with
// RegisterCfg::blocks_model_id == model_id.
struct BlocksCacheKey {
  uint64_t prompt_cluster_id = 0;
  uint64_t model_id = 0;
};

struct RegisterCfg {
  // Extension: request keys a peer may pull this cache by (PullKvCache with a
  // CacheKey). Each key names one batch entry: cache_keys[i] is batch index i.
  std::vector<CacheKey> cache_keys;
  // Extension: milliseconds the keys stay pullable when nobody pulls by them;
  // then they are released (a KvTransferEvent of kind kLeaseExpired tells the
  // owner) and pulls by them fail LLM_KV_CACHE_NOT_EXIST. 0: no lease.
  int64_t lease_ms = 0;
  // Extension: makes this the paged cache peers find by
  // BlocksCacheKey{this cluster, model_id}; one per model id per instance.
  std::optional<uint64_t> blocks_model_id;
};

// A remote cache: cluster, cache id on that cluster, batch index.
struct CacheIndex {
  uint64_t cluster_id = 0;
  int64_t cache_id = 0;
  uint32_t batch_index = 0;
};

// A local, registered cache (as filled by RegisterKvCache's caller).
struct Cache {
  int64_t cache_id = 0;
  std::vector<uint64_t> tensor_addrs;  // empty: the registered addresses
  CacheDesc cache_desc;                // unused by transfers (the registration is used)
};

// Inclusive {first, last} layer indices; {-1, -1}: every layer.
struct KvCacheExtParam {
  std::pair<int32_t, int32_t> src_layer_range{-1, -1};
  std::pair<int32_t, int32_t> dst_layer_range{-1, -1};
  int32_t tensor_num_per_layer = 2;
  // Extension: up to 256 bytes handed to the owner of the remote cache in
  // its KvTransferEvent::user_tag (e.g. which request this was).
  std::string user_tag;
};

// Extension: what happened to one of this instance's caches.
struct KvTransferEvent {
  enum class Kind : int32_t {
    kPulled = 0,        // a peer read it (data already taken)
    kPushed = 1,        // a peer wrote into it (data already in place)
    kLeaseExpired = 2,  // its request keys were released: nobody pulled in time
  };
  Kind kind = Kind::kPulled;
  uint64_t peer_cluster_id = 0;     // who moved it (kLeaseExpired: 0)
  int64_t cache_id = 0;             // the local cache
  std::optional<CacheKey> key;      // the request key it was pulled by, if any
  // Local blocks moved (block transfers): in the mover's list order, or in
  // ascending order when a long scattered list was sent as a bitmap.
  std::vector<uint64_t> blocks;
  int64_t batch_index = -1;         // local batch entry moved (whole-cache transfers)
  std::pair<int32_t, int32_t> layer_range{-1, -1};  // local layers moved
  std::string user_tag;             // the mover's KvCacheExtParam::user_tag
};
using KvTransferCallback = std::function<void(const KvTransferEvent&)>;

// Extension: the published Python transfer_cache_async, in C++. One
// destination of a layer-wise push.
struct LayerTransferConfig {
  uint64_t dst_cluster_id = 0;
  // The destination: a cache id on dst_cluster_id, or (dst_cache_id == 0)
  // the remote tensor addresses of one of its registered caches, one per
  // tensor of the destination layer range (the published dst_addrs).
  int64_t dst_cache_id = 0;
  std::vector<uint64_t> dst_addrs;
  // Or a request key of dst_cluster_id's (the Python
  // TransferWithCacheKeyConfig): its cache and batch entry.
  std::optional<CacheKey> dst_key;
  std::pair<int32_t, int32_t> src_layer_range{-1, -1};
  std::pair<int32_t, int32_t> dst_layer_range{-1, -1};
  uint32_t src_batch_index = 0;  // whole-cache pushes (no block lists)
  uint32_t dst_batch_index = 0;
  std::string user_tag;  // up to 256 bytes, in the owner's KvTransferEvent
};

// Called before layer `layer` (index in the source cache) moves; returns
// true when the layer's data is ready, false to fail the task (e.g. after
// waiting timeout_ms). Runs on the task's thread.
using LayerGate = std::function<bool(uint32_t layer, int32_t timeout_ms)>;

// A posted layer-wise transfer. Thread-safe.
class HIXL_EXPORT KvTransferTask {
 public:
  virtual ~KvTransferTask() = default;
  // Waits for the end (timeout_ms < 0: without limit). LLM_TIMEOUT when it
  // has not ended in time (it goes on); else the first failure, or success.
  virtual Status Wait(int32_t timeout_ms = -1) = 0;
  // True once every layer of every config has ended.
  virtual bool Done() const = 0;
  // One status per config, valid once Done().
  virtual std::vector<Status> Results() const = 0;
  // Per source layer moved (in order): steady-clock nanoseconds when its
  // transfers were posted (its gate had opened) and when they were seen
  // complete. Valid once Done().
  struct LayerTime {
    int32_t layer = 0;
    int64_t posted_ns = 0;
    int64_t done_ns = 0;
  };
  virtual std::vector<LayerTime> LayerTimes() const = 0;
};

// Instance option keys (Initialize, SetRole).
namespace options {
inline constexpr const char kListenIpInfo[] = "llm.ListenIpInfo";           // "ip:port"
inline constexpr const char kSyncKvCacheWaitTime[] = "llm.SyncKvCacheWaitTime";  // ms, default 1000
inline constexpr const char kDeviceId[] = "llm.DeviceId";                   // accepted
inline constexpr const char kEnableSwitchRole[] = "llm.EnableSwitchRole";   // "0"/"1"
inline constexpr const char kTransferBackend[] = "llm.TransferBackend";     // "hixl"
inline constexpr const char kGlobalResourceConfig[] = "llm.GlobalResourceConfig";  // JSON
// Extension: default lease (ms) of keyed caches whose RegisterCfg has none; 0: none.
inline constexpr const char kCacheLeaseMs[] = "llm.CacheLeaseMs";
// Extension, "0" (default) / "1": RegisterKvCache registers the application's
// tensors with hixl::REGISTER_SHARE_BY_MAPPING, so peers on this host map
// them and copy with memcpy instead of cross-memory attach. Private memory
// (malloc, numpy, torch CPU tensors) is moved in place into a sealed memfd —
// same addresses, contents kept — and moved back by UnregisterKvCache and
// Finalize; memory that cannot be shared fails the registration saying why
// (docs/USER_MEMORY.md: fork and madvise semantics, cost per GiB).
inline constexpr const char kShareCachesByMapping[] = "llm.ShareCachesByMapping";
}  // namespace options

class HIXL_EXPORT LlmDataDist {
 public:
  LlmDataDist(uint64_t cluster_id, LlmRole role);
  ~LlmDataDist();  // calls Finalize
  LlmDataDist(const LlmDataDist&) = delete;
  LlmDataDist& operator=(const LlmDataDist&) = delete;

  // Options: see namespace options. Unknown keys and bad values:
  // LLM_PARAM_INVALID. Without llm.ListenIpInfo the instance only links out.
  Status Initialize(const std::map<std::string, std::string>& options);
  // Unlinks, unregisters every cache and stops the engine. Safe to call twice.
  void Finalize();
  // Changes the role (requires llm.EnableSwitchRole=1 at Initialize, else
  // LLM_FEATURE_NOT_ENABLED). options may carry llm.ListenIpInfo only when
  // it equals the current one (as configured, or as bound: LocalAddress()).
  // Links and caches are kept.
  Status SetRole(LlmRole role, const std::map<std::string, std::string>& options = {});

  uint64_t ClusterId() const { return cluster_id_; }
  LlmRole Role() const;
  // Extension: the engine's address ("ip:port", or "ip" when only linking out).
  std::string LocalAddress() const;

  // One status per cluster, in order: LLM_SUCCESS, LLM_ALREADY_LINK,
  // LLM_LINK_FAILED (unreachable, or the instance there has another cluster
  // id), LLM_PARAM_INVALID. The call returns the first failure (or success).
  Status LinkLlmClusters(const std::vector<ClusterInfo>& clusters, std::vector<Status>& rets,
                         int32_t timeout_ms = 1000);
  // Unlinks (LLM_NOT_YET_LINK for a cluster not linked). force: skip waiting
  // for in-flight pieces to land.
  Status UnlinkLlmClusters(const std::vector<ClusterInfo>& clusters, std::vector<Status>& rets,
                           int32_t timeout_ms = 1000, bool force = false);

  // Registers num_tensors tensors (one address each) for linked peers' pulls
  // and pushes. cache_id: 1, 2, ... per instance, never reused.
  Status RegisterKvCache(const CacheDesc& cache_desc, const std::vector<uint64_t>& addrs,
                         const RegisterCfg& cfg, int64_t& cache_id);
  // Returns once no peer's transfer touches the cache any more.
  Status UnregisterKvCache(int64_t cache_id);

  // Extension: host memory peers on this host map directly (plain memory
  // copies instead of cross-memory attach). Page-aligned.
  Status AllocHostMemory(size_t size, void** ptr);
  Status FreeHostMemory(void* ptr);

  // Whole caches: for each tensor of the layer range, `size` bytes (-1: one
  // whole batch entry) of batch entry src.batch_index of the remote cache
  // into batch entry batch_index of dst.
  Status PullKvCache(const CacheIndex& src_cache_index, const Cache& dst_cache,
                     uint32_t batch_index = 0, int64_t size = -1,
                     const KvCacheExtParam& ext_param = {});
  // Extension: the same, naming the source by a request key (the batch entry
  // the key was registered for).
  Status PullKvCache(const CacheKey& src_key, const Cache& dst_cache, uint32_t batch_index = 0,
                     int64_t size = -1, const KvCacheExtParam& ext_param = {});
  // Paged caches: block src_blocks[i] of the remote cache into block
  // dst_blocks[i] of dst, for every tensor of the layer range. Contiguous
  // runs become one descriptor per tensor; the whole list is one transfer.
  Status PullKvBlocks(const CacheIndex& src_cache_index, const Cache& dst_cache,
                      const std::vector<uint64_t>& src_blocks,
                      const std::vector<uint64_t>& dst_blocks,
                      const KvCacheExtParam& ext_param = {});
  // Extension: the remote paged cache named by its model.
  Status PullKvBlocks(const BlocksCacheKey& src_key, const Cache& dst_cache,
                      const std::vector<uint64_t>& src_blocks,
                      const std::vector<uint64_t>& dst_blocks,
                      const KvCacheExtParam& ext_param = {});
  // Pushes mirror the pulls: local src_cache into the remote cache, which
  // dst_cache_index.batch_index (or the key's batch entry) names the entry of.
  Status PushKvCache(const Cache& src_cache, const CacheIndex& dst_cache_index,
                     uint32_t src_batch_index = 0, int64_t size = -1,
                     const KvCacheExtParam& ext_param = {});
  Status PushKvCache(const Cache& src_cache, const CacheKey& dst_key,
                     uint32_t src_batch_index = 0, int64_t size = -1,
                     const KvCacheExtParam& ext_param = {});
  Status PushKvBlocks(const Cache& src_cache, const CacheIndex& dst_cache_index,
                      const std::vector<uint64_t>& src_blocks,
                      const std::vector<uint64_t>& dst_blocks,
                      const KvCacheExtParam& ext_param = {});
  Status PushKvBlocks(const Cache& src_cache, const BlocksCacheKey& dst_key,
                      const std::vector<uint64_t>& src_blocks,
                      const std::vector<uint64_t>& dst_blocks,
                      const KvCacheExtParam& ext_param = {});

  // Extension: a layer-wise push of src_cache to every config's destination.
  // Layer by layer (source layer order), gate(layer) is called first and the
  // layer moves only after it returned true, so the push of layer i overlaps
  // the caller's compute of layer i+1. With block lists, blocks
  // src_blocks[i] -> dst_blocks[i]; without, whole batch entries. Checks
  // everything before it returns; then the task runs on its own thread.
  Status TransferCacheAsync(const Cache& src_cache, LayerGate gate,
                            const std::vector<LayerTransferConfig>& configs,
                            const std::vector<uint64_t>& src_blocks,
                            const std::vector<uint64_t>& dst_blocks,
                            std::shared_ptr<KvTransferTask>& task,
                            int32_t tensor_num_per_layer = 2);

  // Extension: events about this instance's caches (see KvTransferEvent).
  // Without a callback they queue (oldest first, at most 65536; older ones
  // are dropped beyond that) and GetKvTransferEvents drains them; with one,
  // an instance thread calls it in arrival order. It must not call Finalize.
  Status GetKvTransferEvents(std::vector<KvTransferEvent>& events);
  Status SetKvTransferCallback(KvTransferCallback callback);

  class Impl;

 private:
  const uint64_t cluster_id_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llm_datadist

#endif  // LLM_DATADIST_LLM_DATADIST_H_
