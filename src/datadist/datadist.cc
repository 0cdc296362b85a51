// LlmDataDist::Impl: set-up, links, the published cache table, events and
// leases (transfers are in transfer.cc... see llm_datadist.cc and task.cc).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "datadist/datadist_impl.h"
#include "datadist/status_util.h"

namespace llm_datadist {

using internal::Failed;
using internal::FromHixl;
using internal::NotExist;
using internal::ParamInvalid;

namespace {

constexpr size_t kMaxEvents = 65536;

bool ParseInt(const std::string& s, int64_t lo, int64_t hi, int64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size() || v < lo || v > hi) return false;
  out = v;
  return true;
}

bool ParseBool(const std::string& s, bool& out) {
  if (s == "1" || s == "true" || s == "True") return out = true, true;
  if (s == "0" || s == "false" || s == "False") return out = false, true;
  return false;
}

std::string EngineAddress(const IpInfo& ip) {
  if (ip.ip.find(':') != std::string::npos) return "[" + ip.ip + "]:" + std::to_string(ip.port);
  return ip.ip + ":" + std::to_string(ip.port);
}

void* PageAlloc(size_t len) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t rounded = (len + page - 1) / page * page;
  void* p = std::aligned_alloc(page, rounded);
  if (p != nullptr) std::memset(p, 0, rounded);
  return p;
}

}  // namespace

Status LlmDataDist::Impl::CheckReady() const {
  if (!ready_.load(std::memory_order_acquire)) {
    return Status(LLM_FAILED, "LlmDataDist is not initialized (call Initialize first)");
  }
  return Status();
}

Status LlmDataDist::Impl::Initialize(const std::map<std::string, std::string>& opts) {
  if (ready_.load()) return Status(LLM_FAILED, "Initialize: already initialized");
  std::map<std::string, std::string> engine_opts;
  std::string listen;
  int32_t sync_wait = 1000;
  int64_t lease = 0;
  bool switch_role = false, share_by_mapping = false;
  for (const auto& [k, v] : opts) {
    int64_t n = 0;
    if (k == options::kListenIpInfo) {
      auto colon = v.rfind(':');
      if (colon == std::string::npos || colon == 0 ||
          !ParseInt(v.substr(colon + 1), 0, 65535, n)) {
        return ParamInvalid("llm.ListenIpInfo must be \"ip:port\", got \"" + v + "\"");
      }
      listen = v;
    } else if (k == options::kSyncKvCacheWaitTime) {
      if (!ParseInt(v, 1, 3600000, n)) {
        return ParamInvalid("llm.SyncKvCacheWaitTime must be 1..3600000 ms, got \"" + v + "\"");
      }
      sync_wait = static_cast<int32_t>(n);
    } else if (k == options::kDeviceId) {
      if (!ParseInt(v, 0, 1 << 20, n)) {
        return ParamInvalid("llm.DeviceId must be a device number >= 0, got \"" + v + "\"");
      }
    } else if (k == options::kEnableSwitchRole) {
      if (!ParseBool(v, switch_role)) {
        return ParamInvalid("llm.EnableSwitchRole must be 0 or 1, got \"" + v + "\"");
      }
    } else if (k == options::kTransferBackend) {
      if (v != "hixl") {
        return ParamInvalid("llm.TransferBackend: \"" + v + "\" is not available (only \"hixl\")");
      }
    } else if (k == options::kShareCachesByMapping) {
      if (!ParseBool(v, share_by_mapping)) {
        return ParamInvalid("llm.ShareCachesByMapping must be 0 or 1, got \"" + v + "\"");
      }
    } else if (k == options::kCacheLeaseMs) {
      if (!ParseInt(v, 0, int64_t{1} << 40, n)) {
        return ParamInvalid("llm.CacheLeaseMs must be >= 0 ms, got \"" + v + "\"");
      }
      lease = n;
    } else if (k == options::kGlobalResourceConfig) {
      nlohmann::json j = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) {
        return ParamInvalid("llm.GlobalResourceConfig must be a JSON object of engine options");
      }
      for (auto it = j.begin(); it != j.end(); ++it) {
        const auto& val = it.value();
        if (val.is_string()) engine_opts[it.key()] = val.get<std::string>();
        else if (val.is_boolean()) engine_opts[it.key()] = val.get<bool>() ? "1" : "0";
        else if (val.is_number_integer()) engine_opts[it.key()] = val.dump();
        else return ParamInvalid("llm.GlobalResourceConfig: option " + it.key() +
                                 " must be a string, integer or boolean");
      }
    } else {
      return ParamInvalid("unknown option \"" + k + "\"");
    }
  }
  // With discovery, an instance is published as llm-cluster-<id> (unless the
  // config names it), so peers can link it by cluster id alone.
  discovery_ = engine_opts.count(hixl::options::kMetadataServer) != 0;
  if (discovery_ && !listen.empty() && engine_opts.count(hixl::options::kEngineName) == 0) {
    engine_opts[hixl::options::kEngineName] = ClusterEngineName(cluster_id_);
  }
  if (hixl::Status s = engine_.Initialize(listen.empty() ? "127.0.0.1" : listen, engine_opts);
      !s.ok()) {
    return FromHixl(s, "Initialize: the engine refused");
  }
  listen_ = listen;
  sync_wait_ms_ = sync_wait;
  default_lease_ms_ = lease;
  switch_role_ = switch_role;
  share_by_mapping_ = share_by_mapping;
  root_ = PageAlloc(internal::kRootSize);
  if (root_ == nullptr) {
    engine_.Finalize();
    return Status(LLM_OUT_OF_MEMORY, "Initialize: no memory for the cache table");
  }
  hixl::Status s = engine_.RegisterMem({reinterpret_cast<uintptr_t>(root_), internal::kRootSize},
                                       hixl::MemType::MEM_HOST, root_handle_, hixl::MEM_PERM_READ);
  for (int i = 0; i < 2 && s.ok(); ++i) {
    slots_[i] = PageAlloc(kSlotBytes);
    if (slots_[i] == nullptr) {
      s = hixl::Status::ResourceExhausted("no memory for the cache table");
      break;
    }
    hixl::MemHandle h = 0;
    s = engine_.RegisterMem({reinterpret_cast<uintptr_t>(slots_[i]), kSlotBytes},
                            hixl::MemType::MEM_HOST, h, hixl::MEM_PERM_READ);
  }
  if (s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    Status p = PublishLocked();
    if (!p.ok()) s = hixl::Status::Failed(p.message());
  }
  if (s.ok()) {
    internal::InstanceInfo info{cluster_id_, static_cast<int32_t>(role_.load()),
                                reinterpret_cast<uint64_t>(root_)};
    s = engine_.SetLocalInfo(internal::EncodeInfo(info));
  }
  if (s.ok()) s = engine_.SetNotifyCallback([this](const hixl::NotifyDesc& d) { OnNotify(d); });
  if (!s.ok()) {
    engine_.Finalize();
    FreeTables();
    return FromHixl(s, "Initialize");
  }
  lease_stop_ = false;
  lease_thread_ = std::thread([this] { LeaseThread(); });
  tell_stop_ = false;
  tell_thread_ = std::thread([this] { TellThread(); });
  ready_.store(true, std::memory_order_release);
  return Status();
}

void LlmDataDist::Impl::Finalize() {
  if (!ready_.exchange(false)) return;
  StopTasks();
  {  // Events already queued are sent (each bounded by the sync deadline).
    std::lock_guard<std::mutex> lock(tell_mu_);
    tell_stop_ = true;
  }
  tell_cv_.notify_all();
  if (tell_thread_.joinable()) tell_thread_.join();
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    lease_stop_ = true;
  }
  lease_cv_.notify_all();
  if (lease_thread_.joinable()) lease_thread_.join();
  (void)engine_.SetNotifyCallback(nullptr);
  engine_.Finalize();  // links, registrations and AllocMem memory go with it
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, c] : caches_) std::free(c->fence);
  caches_.clear();
  regs_.clear();
  allocs_.clear();
  released_.clear();
  FreeTables();
  std::lock_guard<std::mutex> rl(remotes_mu_);
  remotes_.clear();
}

Status LlmDataDist::Impl::SetRole(LlmRole role, const std::map<std::string, std::string>& opts) {
  if (Status s = CheckReady(); !s.ok()) return s;
  if (!switch_role_) {
    return Status(LLM_FEATURE_NOT_ENABLED,
                  "SetRole needs llm.EnableSwitchRole=1 at Initialize");
  }
  if (role != LlmRole::kPrompt && role != LlmRole::kDecoder && role != LlmRole::kMix) {
    return ParamInvalid("SetRole: unknown role " + std::to_string(static_cast<int>(role)));
  }
  for (const auto& [k, v] : opts) {
    if (k == options::kListenIpInfo) {
      if (v != listen_ && v != engine_.LocalEngine()) {
        return ParamInvalid("SetRole: the listening address cannot change (it is \"" + listen_ +
                            "\"); finalize and initialize again");
      }
    } else {
      return ParamInvalid("SetRole: unsupported option \"" + k + "\"");
    }
  }
  role_.store(role);
  internal::InstanceInfo info{cluster_id_, static_cast<int32_t>(role),
                              reinterpret_cast<uint64_t>(root_)};
  return FromHixl(engine_.SetLocalInfo(internal::EncodeInfo(info)), "SetRole");
}

// ---------------------------------------------------------------------------
// Links

std::string LlmDataDist::Impl::ClusterEngineName(uint64_t cluster_id) {
  return "llm-cluster-" + std::to_string(cluster_id);
}

Status LlmDataDist::Impl::Link(const ClusterInfo& c, int32_t timeout_ms) {
  if (c.remote_ip_infos.empty() && !discovery_) {
    return ParamInvalid("cluster " + std::to_string(c.remote_cluster_id) +
                        ": remote_ip_infos is empty (or configure discovery: MetadataServer in "
                        "llm.GlobalResourceConfig)");
  }
  if (c.remote_cluster_id == cluster_id_) {
    return ParamInvalid("cluster " + std::to_string(c.remote_cluster_id) + " is this instance");
  }
  {
    std::lock_guard<std::mutex> lock(remotes_mu_);
    auto it = remotes_.find(c.remote_cluster_id);
    if (it != remotes_.end()) {
      hixl::ConnectStatus cs = hixl::ConnectStatus::NOT_CONNECTED;
      (void)engine_.GetConnectStatus(it->second->engine, cs);
      if (cs == hixl::ConnectStatus::CONNECTED) {
        return Status(LLM_ALREADY_LINK,
                      "cluster " + std::to_string(c.remote_cluster_id) + " is already linked");
      }
      remotes_.erase(it);  // the link was lost: link again
    }
  }
  std::string reasons;
  std::vector<std::string> addrs;
  for (const auto& ip : c.remote_ip_infos) addrs.push_back(EngineAddress(ip));
  if (addrs.empty()) addrs.push_back(ClusterEngineName(c.remote_cluster_id));  // by name
  for (const auto& addr : addrs) {
    hixl::Status s = engine_.Connect(addr, timeout_ms);
    if (!s.ok() && s.code() != hixl::StatusCode::kAlreadyConnected) {
      reasons += (reasons.empty() ? "" : "; ") + addr + ": " + s.ToString();
      continue;
    }
    auto r = std::make_shared<Remote>();
    r->cluster_id = c.remote_cluster_id;
    r->engine = addr;
    std::string info_str;
    internal::InstanceInfo info;
    Status st;
    if (hixl::Status e = engine_.GetPeerInfo(addr, info_str); !e.ok()) {
      st = FromHixl(e, "link");
    } else if (Status d = internal::DecodeInfo(info_str, info); !d.ok()) {
      st = d;
    } else if (info.cluster_id != c.remote_cluster_id) {
      st = Status(LLM_LINK_FAILED, "the instance at " + addr + " is cluster " +
                                       std::to_string(info.cluster_id) + ", not " +
                                       std::to_string(c.remote_cluster_id));
    } else {
      r->root_addr = info.root_addr;
      (void)engine_.GetPeerGeneration(addr, r->generation);
      std::shared_ptr<const internal::Table> table;
      st = FetchTable(*r, table);
      if (st.ok() && table->cluster_id != c.remote_cluster_id) {
        st = Status(LLM_LINK_FAILED, "the cache table at " + addr + " names another cluster");
      }
    }
    if (!st.ok()) {
      (void)engine_.Disconnect(addr, 100);
      reasons += (reasons.empty() ? "" : "; ") + addr + ": " + st.ToString();
      continue;
    }
    std::lock_guard<std::mutex> lock(remotes_mu_);
    if (!remotes_.emplace(c.remote_cluster_id, r).second) {
      return Status(LLM_ALREADY_LINK,
                    "cluster " + std::to_string(c.remote_cluster_id) + " is already linked");
    }
    return Status();
  }
  return Status(LLM_LINK_FAILED,
                "could not link cluster " + std::to_string(c.remote_cluster_id) + ": " + reasons);
}

Status LlmDataDist::Impl::Unlink(const ClusterInfo& c, int32_t timeout_ms, bool force) {
  std::shared_ptr<Remote> r;
  {
    std::lock_guard<std::mutex> lock(remotes_mu_);
    auto it = remotes_.find(c.remote_cluster_id);
    if (it == remotes_.end()) {
      return Status(LLM_NOT_YET_LINK,
                    "cluster " + std::to_string(c.remote_cluster_id) + " is not linked");
    }
    r = it->second;
    remotes_.erase(it);
  }
  hixl::Status s = engine_.Disconnect(r->engine, force ? 1 : std::max(timeout_ms, 1));
  if (!s.ok() && !force && s.code() != hixl::StatusCode::kNotConnected) {
    return Status(LLM_UNLINK_FAILED, "unlink cluster " + std::to_string(c.remote_cluster_id) +
                                         ": " + s.ToString());
  }
  return Status();
}

// Reads the peer's root, and its table when the version changed. A root
// torn by a concurrent update, a table rewritten while we read it, or a
// large table in a region our engine has not heard of yet: read again, with
// a growing pause, until the sync deadline.
Status LlmDataDist::Impl::FetchTable(Remote& r, std::shared_ptr<const internal::Table>& out) {
  std::lock_guard<std::mutex> lock(r.mu);
  const int32_t timeout = sync_wait_ms_;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout);
  hixl::TransferArgs args;
  args.remote_generation = r.generation;
  const std::string whose = "the cache table of cluster " + std::to_string(r.cluster_id);
  Status last;
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0) {
      if (Clock::now() >= deadline) break;
      if (attempt > 2) {
        std::this_thread::sleep_for(std::chrono::microseconds(std::min(50 << std::min(attempt, 10), 5000)));
      }
    }
    alignas(8) uint8_t root_bytes[internal::kRootSize];
    hixl::Status s = engine_.TransferSync(
        r.engine, hixl::TransferOp::READ,
        {{reinterpret_cast<uintptr_t>(root_bytes), r.root_addr, internal::kRootSize}}, args,
        timeout);
    if (!s.ok()) return FromHixl(s, "reading " + whose);
    internal::Root root;
    if (!internal::DecodeRoot(root_bytes, root)) {
      last = Failed(whose + " has an unreadable root");
      continue;
    }
    if (r.table && root.version == r.version) {
      out = r.table;
      return Status();
    }
    std::vector<uint8_t> bytes(root.table_len);
    s = engine_.TransferSync(r.engine, hixl::TransferOp::READ,
                             {{reinterpret_cast<uintptr_t>(bytes.data()), root.table_addr,
                               bytes.size()}},
                             args, timeout);
    if (!s.ok()) {
      last = FromHixl(s, "reading " + whose);
      if (s.code() != hixl::StatusCode::kParamInvalid) return last;
      continue;  // a region our engine has not learned of yet, or withdrawn
    }
    auto table = std::make_shared<internal::Table>();
    if (Status d = internal::DecodeTable(bytes.data(), bytes.size(), *table); !d.ok()) {
      last = Failed("cluster " + std::to_string(r.cluster_id) + ": " + d.message());
      continue;  // rewritten while we read it
    }
    if (table->version != root.version) continue;
    r.version = root.version;
    r.table = table;
    out = std::move(table);
    return Status();
  }
  return last.ok() ? Status(LLM_TIMEOUT, whose + " kept changing for " + std::to_string(timeout) +
                                             " ms while it was read")
                   : Status(last.code(), last.message() + " (for " + std::to_string(timeout) +
                                             " ms)");
}

// ---------------------------------------------------------------------------
// Local caches and the published table

void LlmDataDist::Impl::FreeTables() {
  std::free(root_);
  root_ = nullptr;
  std::free(table_);
  table_ = nullptr;
  for (auto& slot : slots_) {
    std::free(slot);
    slot = nullptr;
  }
  root_handle_ = table_handle_ = 0;
  next_slot_ = 0;
}

bool LlmDataDist::Impl::InsideAlloc(uint64_t addr, uint64_t len) const {
  auto it = allocs_.upper_bound(addr);
  if (it == allocs_.begin()) return false;
  --it;
  return addr >= it->first && addr - it->first <= it->second && len <= it->second - (addr - it->first);
}

// Tables up to kSlotBytes go into one of two slots registered at
// Initialize, alternately (peers know those regions from the handshake on,
// so a reader never meets a region its engine has not heard of yet); a
// reader racing with a rewrite of the slot it reads sees a bad checksum and
// reads the root again. A larger table gets a region of its own, which
// readers may meet before their engine learned of it: they retry.
Status LlmDataDist::Impl::PublishLocked() {
  internal::Table t;
  t.version = ++version_;
  t.cluster_id = cluster_id_;
  for (const auto& [id, c] : caches_) t.caches.push_back(c->entry);
  t.released.assign(released_.begin(), released_.end());
  std::vector<uint8_t> bytes = internal::EncodeTable(t);
  uint64_t addr = 0;
  if (bytes.size() <= kSlotBytes) {
    void* slot = slots_[next_slot_];
    next_slot_ ^= 1;
    std::memcpy(slot, bytes.data(), bytes.size());
    addr = reinterpret_cast<uint64_t>(slot);
  } else {
    void* buf = PageAlloc(bytes.size());
    if (buf == nullptr) return Status(LLM_OUT_OF_MEMORY, "no memory for the cache table");
    std::memcpy(buf, bytes.data(), bytes.size());
    hixl::MemHandle h = 0;
    hixl::Status s = engine_.RegisterMem({reinterpret_cast<uintptr_t>(buf), bytes.size()},
                                         hixl::MemType::MEM_HOST, h, hixl::MEM_PERM_READ);
    if (!s.ok()) {
      std::free(buf);
      return FromHixl(s, "publishing the cache table");
    }
    std::swap(buf, table_);
    std::swap(h, table_handle_);
    addr = reinterpret_cast<uint64_t>(table_);
    // The previous large table (if any) is withdrawn after the root moved.
    internal::Root root{t.version, addr, bytes.size()};
    uint8_t root_bytes[internal::kRootSize];
    internal::EncodeRoot(root, root_bytes);
    std::memcpy(root_, root_bytes, internal::kRootSize);
    if (h != 0) (void)engine_.DeregisterMem(h);  // returns once no peer reads it
    std::free(buf);
    return Status();
  }
  internal::Root root{t.version, addr, bytes.size()};
  uint8_t root_bytes[internal::kRootSize];
  internal::EncodeRoot(root, root_bytes);
  std::memcpy(root_, root_bytes, internal::kRootSize);
  if (table_handle_ != 0) {  // back in the slots: withdraw the large table
    (void)engine_.DeregisterMem(table_handle_);
    std::free(table_);
    table_ = nullptr;
    table_handle_ = 0;
  }
  return Status();
}

Status LlmDataDist::Impl::Register(const CacheDesc& desc, const std::vector<uint64_t>& addrs,
                                   const RegisterCfg& cfg, int64_t& cache_id) {
  if (Status s = CheckReady(); !s.ok()) return s;
  if (desc.placement != CachePlacement::kHost && desc.placement != CachePlacement::kDevice) {
    return ParamInvalid("RegisterKvCache: unknown placement");
  }
  auto c = std::make_shared<LocalCache>();
  if (Status s = internal::MakeLayout(desc.num_tensors, desc.data_type, desc.shape, c->layout);
      !s.ok()) {
    return ParamInvalid("RegisterKvCache: " + s.message());
  }
  if (addrs.size() != desc.num_tensors) {
    return ParamInvalid("RegisterKvCache: " + std::to_string(addrs.size()) +
                        " addresses for " + std::to_string(desc.num_tensors) +
                        " tensors (one address per tensor)");
  }
  for (size_t i = 0; i < addrs.size(); ++i) {
    if (addrs[i] == 0 || addrs[i] > UINT64_MAX - c->layout.tensor_bytes) {
      return ParamInvalid("RegisterKvCache: tensor " + std::to_string(i) + " has a bad address");
    }
  }
  if (cfg.cache_keys.size() > c->layout.entries) {
    return ParamInvalid("RegisterKvCache: " + std::to_string(cfg.cache_keys.size()) +
                        " cache keys for " + std::to_string(c->layout.entries) + " batch entries");
  }
  if (cfg.lease_ms < 0) return ParamInvalid("RegisterKvCache: lease_ms must be >= 0");
  std::unique_lock<std::mutex> lock(mu_);
  for (const auto& [id, other] : caches_) {
    for (const auto& k : cfg.cache_keys) {
      if (std::find(other->entry.keys.begin(), other->entry.keys.end(), k) !=
          other->entry.keys.end()) {
        return ParamInvalid("RegisterKvCache: cache key (req " + std::to_string(k.req_id) +
                            ", model " + std::to_string(k.model_id) +
                            ") is already registered with cache " + std::to_string(id));
      }
    }
    if (cfg.blocks_model_id && other->entry.blocks_model_id == cfg.blocks_model_id) {
      return ParamInvalid("RegisterKvCache: cache " + std::to_string(id) +
                          " is already the blocks cache of model " +
                          std::to_string(*cfg.blocks_model_id));
    }
  }
  // Register each tensor's memory (shared registrations are counted).
  std::vector<std::pair<uint64_t, uint64_t>> taken;
  auto undo = [&] {
    for (auto& k : taken) {
      auto it = regs_.find(k);
      if (--it->second.refs == 0) {
        (void)engine_.DeregisterMem(it->second.handle);
        regs_.erase(it);
      }
    }
  };
  // kDevice: the tensors are CUDA device memory, registered as such (the
  // engine checks every address with the driver and refuses host memory);
  // sharing by mapping is for host memory only and does not apply.
  const bool device = desc.placement == CachePlacement::kDevice;
  for (size_t i = 0; i < addrs.size(); ++i) {
    const uint64_t len = c->layout.tensor_bytes;
    if (InsideAlloc(addrs[i], len)) {  // AllocHostMemory memory is registered
      if (device) {
        undo();
        return ParamInvalid("RegisterKvCache: tensor " + std::to_string(i) +
                            " is AllocHostMemory memory, placement is kDevice");
      }
      continue;
    }
    auto key = std::make_pair(addrs[i], len);
    auto it = regs_.find(key);
    if (it != regs_.end() && it->second.device != device) {
      undo();
      return ParamInvalid("RegisterKvCache: tensor " + std::to_string(i) +
                          " is registered by another cache with the other placement");
    }
    if (it == regs_.end()) {
      hixl::MemHandle h = 0;
      hixl::Status s =
          engine_.RegisterMem({static_cast<uintptr_t>(addrs[i]), len},
                              device ? hixl::MemType::MEM_DEVICE : hixl::MemType::MEM_HOST, h,
                              hixl::MEM_PERM_READ_WRITE,
                              share_by_mapping_ && !device ? hixl::REGISTER_SHARE_BY_MAPPING : 0u);
      if (!s.ok()) {
        undo();
        return FromHixl(s, "RegisterKvCache: tensor " + std::to_string(i));
      }
      it = regs_.emplace(key, Registration{h, 0, device}).first;
    }
    ++it->second.refs;
    taken.push_back(key);
  }
  c->fence = PageAlloc(internal::kFenceBytes);
  if (c->fence == nullptr) {
    undo();
    return Status(LLM_OUT_OF_MEMORY, "RegisterKvCache: no memory");
  }
  if (hixl::Status s = engine_.RegisterMem({reinterpret_cast<uintptr_t>(c->fence), internal::kFenceBytes},
                                           hixl::MemType::MEM_HOST, c->fence_handle,
                                           hixl::MEM_PERM_READ_WRITE);
      !s.ok()) {
    std::free(c->fence);
    undo();
    return FromHixl(s, "RegisterKvCache: fence");
  }
  c->entry.fence = reinterpret_cast<uint64_t>(c->fence);
  c->entry.id = next_cache_id_;
  c->entry.placement = static_cast<int32_t>(desc.placement);
  c->entry.num_tensors = desc.num_tensors;
  c->entry.data_type = desc.data_type;
  c->entry.shape = desc.shape;
  c->entry.addrs = addrs;
  c->entry.keys = cfg.cache_keys;
  for (size_t i = 0; i < cfg.cache_keys.size(); ++i) {
    c->entry.key_batches.push_back(static_cast<uint32_t>(i));
  }
  c->entry.blocks_model_id = cfg.blocks_model_id;
  c->key_pulled.assign(cfg.cache_keys.size(), false);
  c->handles.clear();
  for (auto& k : taken) c->handles.push_back(regs_[k].handle);
  const int64_t lease = cfg.lease_ms > 0 ? cfg.lease_ms : default_lease_ms_;
  if (!cfg.cache_keys.empty() && lease > 0) {
    c->lease_ms = lease;
    c->lease_until = Clock::now() + std::chrono::milliseconds(lease);
  }
  caches_[c->entry.id] = c;
  if (Status s = PublishLocked(); !s.ok()) {
    caches_.erase(c->entry.id);
    (void)engine_.DeregisterMem(c->fence_handle);
    std::free(c->fence);
    undo();
    return s;
  }
  cache_id = next_cache_id_++;
  lock.unlock();
  if (c->lease_until) {
    std::lock_guard<std::mutex> ll(lease_mu_);  // the lease thread re-reads the caches
    lease_cv_.notify_all();
  }
  return Status();
}

Status LlmDataDist::Impl::Unregister(int64_t cache_id) {
  if (Status s = CheckReady(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = caches_.find(cache_id);
  if (it == caches_.end()) {
    return NotExist("UnregisterKvCache: no cache " + std::to_string(cache_id));
  }
  auto c = it->second;
  caches_.erase(it);
  // First withdraw it from the table, then its fence (returns once no
  // peer's transfer of it runs: every one also moves fence bytes), then its
  // memory.
  Status pub = PublishLocked();
  (void)engine_.DeregisterMem(c->fence_handle);
  std::free(c->fence);
  for (size_t i = 0; i < c->entry.addrs.size(); ++i) {
    auto r = regs_.find({c->entry.addrs[i], c->layout.tensor_bytes});
    if (r == regs_.end()) continue;
    if (--r->second.refs == 0) {
      (void)engine_.DeregisterMem(r->second.handle);
      regs_.erase(r);
    }
  }
  return pub;
}

Status LlmDataDist::Impl::AllocHost(size_t size, void** ptr) {
  if (Status s = CheckReady(); !s.ok()) return s;
  if (ptr == nullptr || size == 0) return ParamInvalid("AllocHostMemory: size 0 or null ptr");
  void* p = nullptr;
  if (hixl::Status s = engine_.AllocMem(size, hixl::MemType::MEM_HOST, &p); !s.ok()) {
    return FromHixl(s, "AllocHostMemory");
  }
  std::lock_guard<std::mutex> lock(mu_);
  allocs_[reinterpret_cast<uint64_t>(p)] = size;
  *ptr = p;
  return Status();
}

Status LlmDataDist::Impl::FreeHost(void* ptr) {
  if (Status s = CheckReady(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == allocs_.end()) return ParamInvalid("FreeHostMemory: not memory from AllocHostMemory");
  for (const auto& [id, c] : caches_) {
    for (uint64_t a : c->entry.addrs) {
      if (a >= it->first && a - it->first < it->second) {
        return ParamInvalid("FreeHostMemory: cache " + std::to_string(id) +
                            " still uses this memory (unregister it first)");
      }
    }
  }
  allocs_.erase(it);
  return FromHixl(engine_.FreeMem(ptr), "FreeHostMemory");
}

// ---------------------------------------------------------------------------
// Events and leases

void LlmDataDist::Impl::OnNotify(const hixl::NotifyDesc& d) {
  if (d.name != internal::kEventName) return;  // not ours
  internal::EventMsg m;
  std::string why;
  bool complete;
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    complete = assembler_.Feed(d.from, d.notify_msg, m, why);
  }
  if (!complete) return;
  KvTransferEvent ev;
  ev.kind = m.kind;
  ev.peer_cluster_id = m.sender_cluster;
  ev.cache_id = m.cache_id;
  ev.key = m.key;
  ev.batch_index = m.batch_index;
  ev.layer_range = {m.first_layer, m.last_layer};
  ev.user_tag = std::move(m.user_tag);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = caches_.find(m.cache_id);
    if (it == caches_.end()) return;  // unregistered since (or never ours)
    const auto& c = *it->second;
    for (uint64_t b : m.blocks) {
      if (b >= c.layout.entries) return;  // not a description of this cache
    }
    if (m.key && m.kind == KvTransferEvent::Kind::kPulled) {
      for (size_t i = 0; i < c.entry.keys.size(); ++i) {
        if (c.entry.keys[i] == *m.key) it->second->key_pulled[i] = true;
      }
    }
  }
  ev.blocks = std::move(m.blocks);
  Deliver(std::move(ev));
}

void LlmDataDist::Impl::Deliver(KvTransferEvent ev) {
  KvTransferCallback cb;
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    if (!callback_) {
      if (events_.size() >= kMaxEvents) events_.pop_front();
      events_.push_back(std::move(ev));
      return;
    }
    cb = callback_;
  }
  cb(ev);
}

Status LlmDataDist::Impl::GetEvents(std::vector<KvTransferEvent>& out) {
  if (Status s = CheckReady(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(events_mu_);
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
  return Status();
}

Status LlmDataDist::Impl::SetCallback(KvTransferCallback cb) {
  if (Status s = CheckReady(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(events_mu_);
  callback_ = std::move(cb);
  return Status();
}

void LlmDataDist::Impl::LeaseThread() {
  std::unique_lock<std::mutex> lk(lease_mu_);
  while (!lease_stop_) {
    std::vector<KvTransferEvent> expired;
    std::optional<Clock::time_point> next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = Clock::now();
      bool changed = false;
      for (auto& [id, c] : caches_) {
        if (!c->lease_until) continue;
        if (*c->lease_until > now) {
          if (!next || *c->lease_until < *next) next = c->lease_until;
          continue;
        }
        c->lease_until.reset();
        auto& e = c->entry;
        std::vector<CacheKey> keep;
        std::vector<uint32_t> keep_b;
        std::vector<bool> keep_p;
        for (size_t i = 0; i < e.keys.size(); ++i) {
          if (c->key_pulled[i]) {
            keep.push_back(e.keys[i]);
            keep_b.push_back(e.key_batches[i]);
            keep_p.push_back(true);
            continue;
          }
          internal::ReleasedKey r{e.keys[i], "released: its lease of " +
                                                 std::to_string(c->lease_ms) +
                                                 " ms expired before anyone pulled it"};
          released_.push_back(r);
          if (released_.size() > internal::kMaxReleased) released_.pop_front();
          KvTransferEvent ev;
          ev.kind = KvTransferEvent::Kind::kLeaseExpired;
          ev.cache_id = id;
          ev.key = e.keys[i];
          ev.batch_index = e.key_batches[i];
          expired.push_back(std::move(ev));
          changed = true;
        }
        e.keys = std::move(keep);
        e.key_batches = std::move(keep_b);
        c->key_pulled = std::move(keep_p);
      }
      if (changed) (void)PublishLocked();
    }
    if (!expired.empty()) {
      lk.unlock();
      for (auto& ev : expired) Deliver(std::move(ev));
      lk.lock();
      continue;
    }
    if (next) {
      lease_cv_.wait_until(lk, *next);
    } else {
      lease_cv_.wait(lk);
    }
  }
}

}  // namespace llm_datadist
