// LlmDataDist::Impl — one hixl engine, the table of this instance's caches
// (published in its own memory for peers to read), the linked clusters and
// what it knows of their tables, events about its caches, and leases.
//
// Locks: mu_ guards local caches, allocations and the published table;
// remotes_mu_ the linked clusters; each Remote's mu its cached table;
// events_mu_ the event queue and callback. None is held across a transfer
// except a Remote's mu during a table read.
#ifndef HIXL_DATADIST_DATADIST_IMPL_H_
#define HIXL_DATADIST_DATADIST_IMPL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "datadist/layout.h"
#include "datadist/metadata.h"
#include "hixl/hixl.h"
#include "llm_datadist/llm_datadist.h"

namespace llm_datadist {

using Clock = std::chrono::steady_clock;

class LlmDataDist::Impl {
 public:
  Impl(uint64_t cluster_id, LlmRole role) : cluster_id_(cluster_id), role_(role) {}
  ~Impl() { Finalize(); }

  Status Initialize(const std::map<std::string, std::string>& options);
  void Finalize();
  Status SetRole(LlmRole role, const std::map<std::string, std::string>& options);
  LlmRole Role() const { return role_.load(); }
  std::string LocalAddress() const { return engine_.LocalEngine(); }

  Status Link(const ClusterInfo& c, int32_t timeout_ms);
  Status Unlink(const ClusterInfo& c, int32_t timeout_ms, bool force);

  Status Register(const CacheDesc& desc, const std::vector<uint64_t>& addrs,
                  const RegisterCfg& cfg, int64_t& cache_id);
  Status Unregister(int64_t cache_id);
  Status AllocHost(size_t size, void** ptr);
  Status FreeHost(void* ptr);

  // How a transfer names the remote cache.
  struct RemoteRef {
    enum class By { kIndex, kKey, kBlocksKey } by = By::kIndex;
    uint64_t cluster_id = 0;
    int64_t cache_id = 0;
    uint32_t batch_index = 0;
    CacheKey key;
    uint64_t model_id = 0;
  };
  // One pull (READ) or push (WRITE) between a local cache and a remote one.
  // blocks: block lists given (else one batch entry each side).
  struct Request {
    hixl::TransferOp op = hixl::TransferOp::READ;
    Cache local;
    RemoteRef remote;
    bool blocks = false;
    uint32_t local_batch = 0;
    int64_t size = -1;
    const std::vector<uint64_t>* local_blocks = nullptr;
    const std::vector<uint64_t>* remote_blocks = nullptr;
    KvCacheExtParam ext;
  };
  Status Transfer(const Request& r);

  Status TransferCacheAsync(const Cache& src, LayerGate gate,
                            const std::vector<LayerTransferConfig>& configs,
                            const std::vector<uint64_t>& src_blocks,
                            const std::vector<uint64_t>& dst_blocks,
                            std::shared_ptr<KvTransferTask>& task, int32_t tpl);

  Status GetEvents(std::vector<KvTransferEvent>& out);
  Status SetCallback(KvTransferCallback cb);

  // --- used by the layer-wise task (task.cc) ---
  struct Remote {
    uint64_t cluster_id = 0;
    std::string engine;  // "ip:port"
    uint64_t generation = 0;
    uint64_t root_addr = 0;
    std::mutex mu;
    uint64_t version = 0;
    std::shared_ptr<const internal::Table> table;
  };
  struct LocalCache {
    internal::CacheEntry entry;
    internal::Layout layout;
    std::vector<hixl::MemHandle> handles;  // registrations this cache holds
    void* fence = nullptr;                 // entry.fence's memory
    hixl::MemHandle fence_handle = 0;
    std::optional<Clock::time_point> lease_until;
    int64_t lease_ms = 0;
    std::vector<bool> key_pulled;  // per entry.keys
  };
  // A remote cache resolved for one transfer.
  struct Target {
    std::shared_ptr<Remote> remote;
    internal::CacheEntry cache;
    internal::Layout layout;
    uint32_t batch_index = 0;
    std::optional<CacheKey> key;
  };
  Status CheckReady() const;
  Status FindLocal(const Cache& c, std::shared_ptr<const LocalCache>& out) const;
  Status ResolveTarget(const RemoteRef& ref, Target& out);
  // Moves descs (sync) and tells the owner what moved.
  Status MoveAndTell(const Target& t, hixl::TransferOp op,
                     const std::vector<hixl::TransferOpDesc>& descs,
                     const internal::EventMsg& event, int32_t timeout_ms);
  // OK when the owner's current table still lists t's cache as t knows it.
  Status StillListed(const Target& t);
  // Appends the descriptor that moves kFenceBytes of t's fence (scratch: a
  // buffer of at least kFenceBytes the caller keeps until the transfer ends).
  static void AddFence(const Target& t, uint8_t* scratch, std::vector<hixl::TransferOpDesc>& d) {
    d.push_back({reinterpret_cast<uintptr_t>(scratch), static_cast<uintptr_t>(t.cache.fence),
                 internal::kFenceBytes});
  }
  // Queues an event for the owner of t's cache; call once its data is in
  // place. The teller thread sends queued events in order (the mover's call
  // does not wait for the owner's answer); Finalize sends what is queued.
  void Tell(const Target& t, const internal::EventMsg& event);
  internal::EventMsg MakeEvent(hixl::TransferOp op, const Target& t);
  hixl::Hixl& engine() { return engine_; }
  int32_t sync_wait_ms() const { return sync_wait_ms_; }

 private:
  Status FetchTable(Remote& r, std::shared_ptr<const internal::Table>& out);
  Status PublishLocked();  // mu_ held
  void OnNotify(const hixl::NotifyDesc& d);
  void Deliver(KvTransferEvent ev);
  void LeaseThread();
  bool InsideAlloc(uint64_t addr, uint64_t len) const;  // mu_ held

  const uint64_t cluster_id_;
  std::atomic<LlmRole> role_;
  hixl::Hixl engine_;
  std::atomic<bool> ready_{false};
  bool switch_role_ = false;
  bool share_by_mapping_ = false;  // llm.ShareCachesByMapping
  bool discovery_ = false;  // the engine has MetadataServer: clusters link by id alone
  static std::string ClusterEngineName(uint64_t cluster_id);
  std::string listen_;
  int32_t sync_wait_ms_ = 1000;
  int64_t default_lease_ms_ = 0;

  mutable std::mutex mu_;
  std::map<int64_t, std::shared_ptr<LocalCache>> caches_;
  int64_t next_cache_id_ = 1;
  struct Registration {
    hixl::MemHandle handle = 0;
    int refs = 0;         // caches using it
    bool device = false;  // registered as MEM_DEVICE (a kDevice cache)
  };
  std::map<std::pair<uint64_t, uint64_t>, Registration> regs_;  // (addr,len)
  std::map<uint64_t, size_t> allocs_;  // AllocHostMemory: addr -> size
  std::deque<internal::ReleasedKey> released_;
  uint64_t version_ = 0;
  void* root_ = nullptr;
  hixl::MemHandle root_handle_ = 0;
  static constexpr size_t kSlotBytes = 256 << 10;
  void* slots_[2] = {nullptr, nullptr};  // registered at Initialize
  int next_slot_ = 0;
  void* table_ = nullptr;  // a table larger than a slot
  hixl::MemHandle table_handle_ = 0;
  void FreeTables();

  mutable std::mutex remotes_mu_;
  std::map<uint64_t, std::shared_ptr<Remote>> remotes_;
  std::atomic<uint64_t> event_seq_{1};

  std::mutex events_mu_;
  internal::EventAssembler assembler_;
  std::deque<KvTransferEvent> events_;
  KvTransferCallback callback_;

  // Layer-wise tasks: their threads end before the engine does (Finalize).
  std::mutex tasks_mu_;
  std::vector<std::pair<std::thread, std::shared_ptr<KvTransferTask>>> task_threads_;
  std::atomic<bool> tasks_stop_{false};
  void StopTasks();

  // Events on their way to owners (Tell).
  struct Telling {
    std::string engine;
    uint64_t cluster_id = 0;
    std::vector<std::string> parts;
  };
  std::mutex tell_mu_;
  std::condition_variable tell_cv_;
  std::deque<Telling> tell_q_;
  bool tell_stop_ = false;
  std::thread tell_thread_;
  void TellThread();

  std::mutex lease_mu_;
  std::condition_variable lease_cv_;
  bool lease_stop_ = false;
  std::thread lease_thread_;
};

}  // namespace llm_datadist

#endif  // HIXL_DATADIST_DATADIST_IMPL_H_
