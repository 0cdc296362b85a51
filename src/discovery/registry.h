// The engine registry in etcd: each engine publishes its EngineEntry under
// <prefix>engines/<name>, bound to a lease it keeps alive, and keeps a cache
// of every engine's entry so that a name resolves to an address without a
// round trip.
//
//   Start    grants a lease (ttl_s), claims the key with a transaction that
//            succeeds only if the key does not exist, lists the current
//            entries and starts two threads. A name held by another entry is
//            taken over when its engine is gone (below); a name held by a
//            live engine, or one that cannot be shown dead, is refused:
//            ALREADY_CONNECTED naming the holder and why it counts as alive.
//   keeper   renews the lease every ttl_s/3; when the lease is gone (expired
//            while etcd was unreachable, revoked by someone) it grants a new
//            one and claims the key again; when the key alone was deleted it
//            claims it again. While etcd is unreachable it retries with a
//            bounded backoff, logging once per change of state.
//   watcher  watches the prefix from the listed revision and keeps the cache;
//            on compaction, a broken stream or an etcd restart it lists and
//            watches again (bounded backoff). Entries that are not valid hixl
//            entries (DecodeEntry) are skipped with one WARN each.
//   Stop     revokes the lease, so the key disappears at once, and joins both
//            threads (bounded by about twice the request timeout).
//
// A process that dies without Stop leaves its key until the lease expires:
// within ttl_s (plus etcd's expiry check, under a second). Peers see it until
// then; an engine restarted under that name need not wait: it takes the name
// over when the holder is gone — on this host (same host_id) its pid no
// longer exists, or holder_gone (the engine probes the holder's address)
// says so. The take-over is one etcd transaction conditioned on the holder's
// entry being unchanged (its mod_revision), so of two engines racing for one
// dead name exactly one wins and the other finds the winner alive. Should a
// live engine's name be taken over all the same (holder_gone judged wrong),
// the watcher sees its key change hands: an ERROR is logged and the keeper
// tries to claim the name back (refused, and retried, while the new holder
// lives).
//
// Thread safety: after Start returned OK every method may be called from any
// thread (Start itself from one thread, once), except that Stop and
// SetListener must not be called from inside the listener. The
// listener runs on the watcher thread, one call at a time, never under a
// registry lock; after Stop returns it is not called again.
// Ownership: the registry owns its etcd client and threads; results are
// copies.
#ifndef HIXL_DISCOVERY_REGISTRY_H_
#define HIXL_DISCOVERY_REGISTRY_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "discovery/entry.h"
#include "discovery/etcd_client.h"
#include "hixl/status.h"

namespace hixl::discovery {

struct RegistryConfig {
  std::string endpoints;        // "etcd://host:port[,host:port...]"
  std::string prefix = "hixl/";  // 1..256 printable ASCII bytes
  EngineEntry self;             // what to publish; self.name is the key's name
                                // (empty: publish nothing, only watch and look up)
  int ttl_s = 10;               // lease TTL, 2..3600 s
  int request_timeout_ms = 3000;  // each etcd request, 1..60000 ms
  // Asked when the name is held by another engine's entry that the pid test
  // does not show dead (another host, or its pid still exists): true when
  // that engine is gone, with why; false when it is alive or that cannot be
  // told, with why. Null: only the pid test. Called on the caller's thread
  // in Start and on the keeper thread, never under a registry lock.
  std::function<bool(const EngineEntry& holder, std::string& why)> holder_gone;
};

class Registry {
 public:
  // name: the engine whose entry changed; entry: its new entry, or null when
  // it is gone (Stop, lease expiry, deleted, or no longer a valid entry).
  using Listener = std::function<void(const std::string& name, const EngineEntry* entry)>;

  Registry() = default;
  ~Registry() { Stop(); }
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Once per object. PARAM_INVALID for a bad config, ALREADY_CONNECTED when
  // the name is held by another live engine, FAILED/TIMEOUT when etcd could
  // not be reached; on error nothing is left in etcd and no thread runs.
  Status Start(const RegistryConfig& config);
  // Idempotent; see above.
  void Stop();

  // The entry published under name: from the cache, else (a peer that has
  // just registered) by one direct read from etcd. PARAM_INVALID for a bad
  // name, FAILED "not registered" when there is no valid entry, FAILED or
  // TIMEOUT when etcd could not be asked.
  Status Lookup(const std::string& name, EngineEntry& out);
  // Every valid entry in the cache (this engine's included), by name.
  std::vector<EngineEntry> List() const;
  // Replaces the listener (null: none). Later changes only: call List()
  // after it to learn the current state.
  void SetListener(Listener listener);

  // The key this engine holds and its current lease (0 while it has none);
  // for tests and diagnostics.
  const std::string& key() const { return key_; }
  int64_t lease_id() const;

 private:
  struct Cached {
    EngineEntry entry;
    int64_t mod_revision = 0;
  };
  using Changes = std::vector<std::pair<std::string, std::unique_ptr<EngineEntry>>>;

  void KeeperLoop();
  void WatcherLoop(int64_t revision);
  // One renewal (and whatever re-registration it needs).
  Status KeeperStep(int depth = 0);
  Status Claim(int64_t lease, bool at_start);
  // Whether the engine of holder (another engine's entry under our key) is gone.
  bool HolderGone(const EngineEntry& holder, std::string& why) const;
  // Waits up to ms or until stopping; false when stopping.
  bool WaitMs(int64_t ms, bool wake_on_republish);
  // Decodes a kv of the watched prefix; false (after one WARN) if invalid.
  bool DecodeKv(const KeyValue& kv, std::string& name, EngineEntry& e);
  void ApplySnapshot(const RangeResult& r, Changes& changes);
  void ApplyEvents(const WatchMessage& m, Changes& changes);
  void Notify(Changes& changes);

  RegistryConfig cfg_;
  std::unique_ptr<EtcdClient> client_;
  std::string engines_prefix_;
  std::string key_;
  std::string value_;

  mutable std::mutex mu_;  // keeper state and stop
  std::condition_variable cv_;
  bool started_ = false;
  bool stopping_ = false;
  bool republish_ = false;
  int64_t lease_ = 0;
  bool claimed_ = false;
  std::thread keeper_;
  std::thread watcher_;
  WatchStop watch_stop_;

  mutable std::mutex cache_mu_;
  std::map<std::string, Cached> cache_;
  std::map<std::string, int64_t> warned_;  // invalid key -> mod_revision warned about

  std::mutex listener_mu_;
  std::shared_ptr<Listener> listener_;
};

}  // namespace hixl::discovery

#endif  // HIXL_DISCOVERY_REGISTRY_H_
