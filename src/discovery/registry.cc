#include "discovery/registry.h"

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <limits>

#include "common/log.h"

namespace hixl::discovery {
namespace {

constexpr int64_t kMinBackoffMs = 100;
constexpr int64_t kMaxBackoffMs = 1000;
constexpr size_t kMaxWarned = 4096;
// Claim: how many times the key may change under a take-over before giving up.
constexpr int kMaxClaimRounds = 4;

Status CheckConfig(const RegistryConfig& c) {
  if (!c.self.name.empty()) {  // an empty name: watch only, publish nothing
    Status s = CheckEntry(c.self);
    if (!s.ok()) return Status::ParamInvalid("registry: " + s.message());
  }
  if (c.prefix.empty() || c.prefix.size() > 256 ||
      !std::all_of(c.prefix.begin(), c.prefix.end(), [](char ch) { return ch > 0x20 && ch < 0x7f; })) {
    return Status::ParamInvalid("registry: prefix must be 1..256 printable ASCII characters");
  }
  if (c.ttl_s < 2 || c.ttl_s > 3600) {
    return Status::ParamInvalid("registry: ttl_s must be 2..3600 (got " + std::to_string(c.ttl_s) +
                                ")");
  }
  if (c.request_timeout_ms < 1 || c.request_timeout_ms > 60000) {
    return Status::ParamInvalid("registry: request_timeout_ms must be 1..60000");
  }
  return Status::Ok();
}

bool LeaseGone(const Status& s) {
  return s.message().find("requested lease not found") != std::string::npos;
}

std::string Holder(const std::string& name, const KeyValue& kv) {
  EngineEntry e;
  if (DecodeEntry(name, kv.value, e).ok()) {
    return "engine at " + e.address + " (pid " + std::to_string(e.pid) + ", host " +
           e.host_id.substr(0, 64) + ")";
  }
  return "a value that is not a hixl entry";
}

}  // namespace

Status Registry::Start(const RegistryConfig& config) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) return Status::ParamInvalid("registry: already started");
  }
  Status s = CheckConfig(config);
  if (!s.ok()) return s;
  std::unique_ptr<EtcdClient> client;
  s = EtcdClient::Create(config.endpoints, &client);
  if (!s.ok()) return s;
  cfg_ = config;
  client_ = std::move(client);
  engines_prefix_ = cfg_.prefix + "engines/";
  key_ = engines_prefix_ + cfg_.self.name;
  value_ = EncodeEntry(cfg_.self);

  const bool publish = !cfg_.self.name.empty();
  int64_t lease = 0, ttl = 0;
  if (publish) {
    s = client_->LeaseGrant(cfg_.ttl_s, cfg_.request_timeout_ms, lease, ttl);
    if (!s.ok()) return Status(s.code(), "registry: cannot grant a lease: " + s.message());
    s = Claim(lease, /*at_start=*/true);
    if (!s.ok()) {
      Status r = client_->LeaseRevoke(lease, cfg_.request_timeout_ms);
      (void)r;
      return s;
    }
  }
  RangeResult snapshot;
  s = client_->Range(engines_prefix_, cfg_.request_timeout_ms, snapshot);
  if (!s.ok()) {
    if (publish) {
      Status r = client_->LeaseRevoke(lease, cfg_.request_timeout_ms);
      (void)r;
    }
    return Status(s.code(), "registry: cannot list engines: " + s.message());
  }
  Changes ignored;
  ApplySnapshot(snapshot, ignored);
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
    lease_ = lease;
    claimed_ = publish;
  }
  if (publish) keeper_ = std::thread([this] { KeeperLoop(); });
  watcher_ = std::thread([this, rev = snapshot.revision] { WatcherLoop(rev); });
  if (publish) {
    HIXL_LOG(INFO) << "registry: published " << key_ << " (lease " << lease << ", ttl " << ttl
                   << " s)";
  }
  return Status::Ok();
}

void Registry::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  watch_stop_.Stop();
  if (keeper_.joinable()) keeper_.join();
  int64_t lease = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease = std::exchange(lease_, 0);
  }
  if (lease != 0) {
    Status s = client_->LeaseRevoke(lease, cfg_.request_timeout_ms);
    if (!s.ok()) {
      HIXL_LOG(WARN) << "registry: could not revoke the lease of " << key_
                     << " (it expires within " << cfg_.ttl_s << " s): " << s.ToString();
    }
  }
  if (watcher_.joinable()) watcher_.join();
}

int64_t Registry::lease_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lease_;
}

bool Registry::WaitMs(int64_t ms, bool wake_on_republish) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(ms),
               [&] { return stopping_ || (wake_on_republish && republish_); });
  return !stopping_;
}

// ---- keeper ------------------------------------------------------------------

bool Registry::HolderGone(const EngineEntry& holder, std::string& why) const {
  if (holder.host_id == cfg_.self.host_id && holder.pid <= std::numeric_limits<pid_t>::max()) {
    // Same host and pid namespace (host::HostIdentity): the pid says it.
    if (::kill(static_cast<pid_t>(holder.pid), 0) != 0 && errno == ESRCH) {
      why = "its process " + std::to_string(holder.pid) + " no longer exists on this host";
      return true;
    }
    why = "its process " + std::to_string(holder.pid) + " exists";
  } else {
    why = "it is on another host";
  }
  if (!cfg_.holder_gone) return false;
  std::string probe;
  const bool gone = cfg_.holder_gone(holder, probe);
  why = gone ? probe : why + " and " + probe;
  return gone;
}

Status Registry::Claim(int64_t lease, bool at_start) {
  std::string alive_why;
  KeyValue existing;
  for (int round = 0; round < kMaxClaimRounds; ++round) {
    bool created = false;
    existing = KeyValue();
    Status s =
        client_->PutIfAbsent(key_, value_, lease, cfg_.request_timeout_ms, created, existing);
    if (!s.ok()) {
      return Status(s.code(), "registry: cannot publish " + key_ + ": " + s.message());
    }
    // A retried transaction may find our own put.
    if (created || (existing.lease == lease && existing.value == value_)) return Status::Ok();
    EngineEntry holder;
    std::string why;
    bool gone = false;
    if (existing.value == value_) {
      gone = true;  // this engine's own entry, under a lease it lost
      why = "it is this engine's own entry under an old lease";
    } else if (DecodeEntry(cfg_.self.name, existing.value, holder).ok()) {
      gone = HolderGone(holder, why);
    } else {
      why = "it is not a hixl entry";
    }
    if (!gone) {
      alive_why = why;
      break;
    }
    // Take it over, unless the entry changed since we read it (another
    // engine took it first, or the holder's lease expired: look again).
    bool replaced = false, found = false;
    KeyValue now;
    s = client_->PutIfUnchanged(key_, value_, lease, existing.mod_revision, cfg_.request_timeout_ms,
                                replaced, found, now);
    if (!s.ok()) {
      return Status(s.code(), "registry: cannot take over " + key_ + ": " + s.message());
    }
    if (replaced) {
      HIXL_LOG(WARN) << "registry: took over " << key_ << " from "
                     << Holder(cfg_.self.name, existing) << ": " << why;
      return Status::Ok();
    }
    alive_why = "its entry changed while this engine took the name over";
  }
  std::string why = "engine name '" + cfg_.self.name + "' is already registered in etcd (" + key_ +
                    ") by " + Holder(cfg_.self.name, existing) +
                    (existing.lease != 0 ? " with a live lease" : " without a lease") +
                    ", and that engine is not known to be gone (" + alive_why +
                    "); choose another name or stop that engine";
  if (!at_start) why += "; retrying";
  return Status::AlreadyConnected(why);
}

Status Registry::KeeperStep(int depth) {
  int64_t lease = 0;
  bool claimed = false, republish = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease = lease_;
    claimed = claimed_;
    republish = std::exchange(republish_, false);
  }
  if (lease != 0 && !republish) {
    int64_t ttl = 0;
    Status s = client_->LeaseKeepAlive(lease, cfg_.request_timeout_ms, ttl);
    if (!s.ok()) return s;
    if (ttl == 0) {
      HIXL_LOG(WARN) << "registry: lease " << lease << " of " << key_
                     << " is gone (expired or revoked); registering again";
      lease = 0;
    }
  }
  if (lease == 0) {
    int64_t ttl = 0;
    Status s = client_->LeaseGrant(cfg_.ttl_s, cfg_.request_timeout_ms, lease, ttl);
    if (!s.ok()) return s;
    claimed = false;
    std::lock_guard<std::mutex> lock(mu_);
    lease_ = lease;
    claimed_ = false;
  }
  if (!claimed || republish) {
    Status s = Claim(lease, /*at_start=*/false);
    if (!s.ok() && LeaseGone(s)) {
      HIXL_LOG(INFO) << "registry: lease " << lease << " of " << key_
                     << " was revoked; registering again";
      {
        std::lock_guard<std::mutex> lock(mu_);
        lease_ = 0;  // revoked under us: a new lease at once
        claimed_ = false;
      }
      if (depth == 0) return KeeperStep(1);  // lease_ is 0 now: grants first
      return s;
    }
    if (!s.ok()) return s;
    if (!claimed) {
      HIXL_LOG(INFO) << "registry: published " << key_ << " again (lease " << lease << ")";
    }
    std::lock_guard<std::mutex> lock(mu_);
    claimed_ = true;
  }
  return Status::Ok();
}

void Registry::KeeperLoop() {
  const int64_t interval_ms = std::max<int64_t>(cfg_.ttl_s * 1000 / 3, 200);
  int64_t backoff_ms = kMinBackoffMs;
  bool healthy = true;
  int64_t wait_ms = interval_ms;
  while (WaitMs(wait_ms, /*wake_on_republish=*/true)) {
    Status s = KeeperStep();
    if (s.ok()) {
      if (!healthy) {
        HIXL_LOG(INFO) << "registry: " << key_ << " is registered again in etcd";
      }
      healthy = true;
      backoff_ms = kMinBackoffMs;
      wait_ms = interval_ms;
      continue;
    }
    if (healthy) {
      HIXL_LOG(WARN) << "registry: keeping " << key_ << " registered failed (retrying): "
                     << s.ToString();
    }
    healthy = false;
    wait_ms = backoff_ms;
    backoff_ms = std::min<int64_t>({backoff_ms * 2, kMaxBackoffMs, interval_ms});
  }
}

// ---- watcher and cache -------------------------------------------------------

bool Registry::DecodeKv(const KeyValue& kv, std::string& name, EngineEntry& e) {
  Status s;
  if (kv.key.compare(0, engines_prefix_.size(), engines_prefix_) != 0) {
    s = Status::ParamInvalid("key outside the prefix");
  } else {
    name = kv.key.substr(engines_prefix_.size());
    s = CheckEngineName(name);
    if (s.ok()) s = DecodeEntry(name, kv.value, e);
  }
  if (s.ok()) return true;
  std::lock_guard<std::mutex> lock(cache_mu_);
  auto it = warned_.find(kv.key);
  if (it != warned_.end() && it->second == kv.mod_revision) return false;
  if (warned_.size() >= kMaxWarned) warned_.clear();
  warned_[kv.key] = kv.mod_revision;
  std::string shown = kv.key.substr(0, 200);
  for (char& c : shown) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  HIXL_LOG(WARN) << "registry: skipping '" << shown << "': " << s.message();
  return false;
}

void Registry::ApplySnapshot(const RangeResult& r, Changes& changes) {
  std::map<std::string, Cached> fresh;
  for (const KeyValue& kv : r.kvs) {
    std::string name;
    EngineEntry e;
    if (DecodeKv(kv, name, e)) fresh[name] = Cached{std::move(e), kv.mod_revision};
  }
  std::lock_guard<std::mutex> lock(cache_mu_);
  for (const auto& [name, c] : cache_) {
    if (!fresh.count(name)) changes.emplace_back(name, nullptr);
  }
  for (const auto& [name, c] : fresh) {
    auto it = cache_.find(name);
    if (it == cache_.end() || it->second.mod_revision != c.mod_revision ||
        !(it->second.entry == c.entry)) {
      changes.emplace_back(name, std::make_unique<EngineEntry>(c.entry));
    }
  }
  cache_ = std::move(fresh);
}

void Registry::ApplyEvents(const WatchMessage& m, Changes& changes) {
  for (const WatchEvent& ev : m.events) {
    if (!cfg_.self.name.empty() && ev.kv.key == key_ && ev.type == WatchEvent::Type::kDelete) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        republish_ = true;  // our key went while we hold it: claim it again
      }
      cv_.notify_all();
    } else if (!cfg_.self.name.empty() && ev.kv.key == key_ && ev.kv.value != value_) {
      // Another engine took our name over (it judged us gone). Peers now
      // find it, not us: say so, and let the keeper claim the name back
      // (it is refused, and retries, while that engine lives).
      HIXL_LOG(ERROR) << "registry: " << key_ << " now names " << Holder(cfg_.self.name, ev.kv)
                      << ", not this engine: peers no longer find this engine by its name";
      {
        std::lock_guard<std::mutex> lock(mu_);
        claimed_ = false;  // the keeper claims it again, round after round
        republish_ = true;
      }
      cv_.notify_all();
    }
    std::string name;
    EngineEntry e;
    bool valid = false;
    if (ev.type == WatchEvent::Type::kPut) {
      valid = DecodeKv(ev.kv, name, e);
    } else if (ev.kv.key.compare(0, engines_prefix_.size(), engines_prefix_) == 0) {
      name = ev.kv.key.substr(engines_prefix_.size());
    }
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (valid) {
      cache_[name] = Cached{e, ev.kv.mod_revision};
      changes.emplace_back(name, std::make_unique<EngineEntry>(std::move(e)));
    } else if (!name.empty() && cache_.erase(name) > 0) {
      changes.emplace_back(name, nullptr);  // deleted, or replaced by an invalid value
    }
  }
}

void Registry::Notify(Changes& changes) {
  std::shared_ptr<Listener> l;
  {
    std::lock_guard<std::mutex> lock(listener_mu_);
    l = listener_;
  }
  if (l && *l) {
    for (auto& [name, e] : changes) (*l)(name, e.get());
  }
  changes.clear();
}

void Registry::WatcherLoop(int64_t revision) {
  int64_t backoff_ms = kMinBackoffMs;
  bool healthy = true;
  bool need_list = false;
  const std::string range_end = PrefixRangeEnd(engines_prefix_);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    Changes changes;
    Status s;
    if (need_list) {
      RangeResult r;
      s = client_->Range(engines_prefix_, cfg_.request_timeout_ms, r);
      if (s.ok()) {
        ApplySnapshot(r, changes);
        Notify(changes);
        revision = r.revision;
        need_list = false;
      }
    }
    bool delivered = false;
    if (s.ok()) {
      s = client_->Watch(engines_prefix_, range_end, revision + 1, cfg_.request_timeout_ms,
                         watch_stop_, [&](const WatchMessage& m) {
                           if (m.created && !delivered) {
                             delivered = true;
                             if (!healthy) {
                               HIXL_LOG(INFO) << "registry: watching " << engines_prefix_
                                              << " again";
                             }
                             healthy = true;
                             backoff_ms = kMinBackoffMs;
                           }
                           ApplyEvents(m, changes);
                           Notify(changes);
                           return true;
                         });
    }
    if (s.code() == StatusCode::kCancelled) return;  // Stop
    need_list = true;  // whatever ended the watch (compaction, restart): list again
    if (delivered) {
      HIXL_LOG(INFO) << "registry: watch of " << engines_prefix_ << " ended (listing again): "
                     << s.ToString();
    } else if (healthy) {
      HIXL_LOG(WARN) << "registry: cannot watch " << engines_prefix_ << " (retrying): "
                     << s.ToString();
      healthy = false;
    }
    if (!WaitMs(delivered ? kMinBackoffMs : backoff_ms, /*wake_on_republish=*/false)) return;
    if (!delivered) backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
  }
}

// ---- lookups -------------------------------------------------------------------

Status Registry::Lookup(const std::string& name, EngineEntry& out) {
  Status s = CheckEngineName(name);
  if (!s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(name);
    if (it != cache_.end()) {
      out = it->second.entry;
      return Status::Ok();
    }
  }
  if (!client_) return Status::Failed("registry: not started");
  bool found = false;
  KeyValue kv;
  s = client_->Get(engines_prefix_ + name, cfg_.request_timeout_ms, found, kv);
  if (!s.ok()) return Status(s.code(), "registry: looking up '" + name + "': " + s.message());
  EngineEntry e;
  std::string got;
  if (!found || !DecodeKv(kv, got, e)) {
    return Status::Failed("engine '" + name + "' is not registered in etcd (" + engines_prefix_ +
                          name + ")");
  }
  out = std::move(e);
  return Status::Ok();
}

std::vector<EngineEntry> Registry::List() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  std::vector<EngineEntry> v;
  v.reserve(cache_.size());
  for (const auto& [name, c] : cache_) v.push_back(c.entry);
  return v;
}

void Registry::SetListener(Listener listener) {
  auto p = listener ? std::make_shared<Listener>(std::move(listener)) : nullptr;
  std::lock_guard<std::mutex> lock(listener_mu_);
  listener_ = std::move(p);
}

}  // namespace hixl::discovery
