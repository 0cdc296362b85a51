// LlmDataDist: the public class, and pulls and pushes (resolve both caches,
// build the descriptors, move them in one engine transfer, tell the owner).
#include <algorithm>
#include <cstdio>
#include <thread>

#include "datadist/datadist_impl.h"
#include "datadist/status_util.h"

namespace llm_datadist {

using internal::FromHixl;
using internal::NotExist;
using internal::ParamInvalid;

namespace {

std::string KeyText(const CacheKey& k) {
  return "(cluster " + std::to_string(k.prompt_cluster_id) + ", req " + std::to_string(k.req_id) +
         ", model " + std::to_string(k.model_id) + ")";
}

}  // namespace

Status LlmDataDist::Impl::FindLocal(const Cache& c, std::shared_ptr<const LocalCache>& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = caches_.find(c.cache_id);
  if (it == caches_.end()) {
    return NotExist("no local cache " + std::to_string(c.cache_id) +
                    " (register it with RegisterKvCache first)");
  }
  if (!c.tensor_addrs.empty() && c.tensor_addrs != it->second->entry.addrs) {
    return ParamInvalid("cache " + std::to_string(c.cache_id) +
                        ": tensor_addrs differ from the registered addresses");
  }
  out = it->second;
  return Status();
}

Status LlmDataDist::Impl::ResolveTarget(const RemoteRef& ref, Target& out) {
  const uint64_t cluster = ref.by == RemoteRef::By::kKey ? ref.key.prompt_cluster_id : ref.cluster_id;
  std::shared_ptr<Remote> remote;
  {
    std::lock_guard<std::mutex> lock(remotes_mu_);
    auto it = remotes_.find(cluster);
    if (it != remotes_.end()) remote = it->second;
  }
  if (!remote) {
    return Status(LLM_NOT_YET_LINK, "cluster " + std::to_string(cluster) +
                                        " is not linked (LinkLlmClusters first)");
  }
  std::shared_ptr<const internal::Table> table;
  if (Status s = FetchTable(*remote, table); !s.ok()) return s;
  const internal::CacheEntry* found = nullptr;
  Target t;
  if (ref.by == RemoteRef::By::kIndex) {
    for (const auto& c : table->caches) {
      if (c.id == ref.cache_id) found = &c;
    }
    if (!found) {
      return NotExist("cluster " + std::to_string(cluster) + " has no cache " +
                      std::to_string(ref.cache_id));
    }
    t.batch_index = ref.batch_index;
  } else if (ref.by == RemoteRef::By::kKey) {
    for (const auto& c : table->caches) {
      for (size_t i = 0; i < c.keys.size() && !found; ++i) {
        if (c.keys[i] == ref.key) {
          found = &c;
          t.batch_index = c.key_batches[i];
        }
      }
    }
    if (!found) {
      for (const auto& r : table->released) {
        if (r.key == ref.key) return NotExist("cache key " + KeyText(ref.key) + " was " + r.why);
      }
      return NotExist("cluster " + std::to_string(cluster) + " has no cache key " +
                      KeyText(ref.key));
    }
    t.key = ref.key;
  } else {
    for (const auto& c : table->caches) {
      if (c.blocks_model_id && *c.blocks_model_id == ref.model_id) found = &c;
    }
    if (!found) {
      return NotExist("cluster " + std::to_string(cluster) + " has no blocks cache of model " +
                      std::to_string(ref.model_id));
    }
  }
  t.remote = remote;
  t.cache = *found;
  if (Status s = internal::MakeLayout(t.cache.num_tensors, t.cache.data_type, t.cache.shape,
                                      t.layout);
      !s.ok()) {
    return s;
  }
  out = std::move(t);
  return Status();
}

internal::EventMsg LlmDataDist::Impl::MakeEvent(hixl::TransferOp op, const Target& t) {
  internal::EventMsg e;
  e.kind = op == hixl::TransferOp::READ ? KvTransferEvent::Kind::kPulled
                                        : KvTransferEvent::Kind::kPushed;
  e.sender_cluster = cluster_id_;
  e.seq = event_seq_.fetch_add(1);
  e.cache_id = t.cache.id;
  e.key = t.key;
  return e;
}

void LlmDataDist::Impl::Tell(const Target& t, const internal::EventMsg& event) {
  Telling item{t.remote->engine, t.remote->cluster_id, internal::EncodeEvent(event)};
  {
    std::lock_guard<std::mutex> lock(tell_mu_);
    tell_q_.push_back(std::move(item));
  }
  tell_cv_.notify_one();
}

void LlmDataDist::Impl::TellThread() {
  std::unique_lock<std::mutex> lock(tell_mu_);
  for (;;) {
    tell_cv_.wait(lock, [this] { return tell_stop_ || !tell_q_.empty(); });
    if (tell_q_.empty()) return;  // stopping, all sent
    Telling item = std::move(tell_q_.front());
    tell_q_.pop_front();
    lock.unlock();
    for (const auto& part : item.parts) {
      hixl::Status s = engine_.SendNotify(item.engine, {internal::kEventName, part, ""}, sync_wait_ms_);
      if (!s.ok()) {
        // The transfer itself succeeded; the owner may not hear of it (its
        // lease, if any, is the backstop).
        std::fprintf(stderr,
                     "llm_datadist: cluster %llu: the data moved, but telling its owner failed: %s\n",
                     static_cast<unsigned long long>(item.cluster_id), s.ToString().c_str());
        break;
      }
    }
    lock.lock();
  }
}

Status LlmDataDist::Impl::StillListed(const Target& t) {
  std::shared_ptr<const internal::Table> table;
  if (Status s = FetchTable(*t.remote, table); !s.ok()) return s;
  for (const auto& c : table->caches) {
    if (c.id == t.cache.id) {
      if (c.addrs != t.cache.addrs) break;
      return Status();
    }
  }
  return NotExist("cache " + std::to_string(t.cache.id) + " of cluster " +
                  std::to_string(t.remote->cluster_id) + " was unregistered");
}

Status LlmDataDist::Impl::MoveAndTell(const Target& t, hixl::TransferOp op,
                                      const std::vector<hixl::TransferOpDesc>& descs,
                                      const internal::EventMsg& event, int32_t timeout_ms) {
  // The data moves first; the owner is told once it is all in place. (Not
  // attached to the transfer: a notification whose answer timed out may
  // still arrive, and the owner must never hear of a transfer its mover
  // was told had failed.)
  hixl::TransferArgs args;
  args.remote_generation = t.remote->generation;
  const char* verb = op == hixl::TransferOp::READ ? "pull from" : "push to";
  const std::string what = std::string(verb) + " cache " + std::to_string(t.cache.id) +
                           " of cluster " + std::to_string(t.remote->cluster_id);
  const auto start = Clock::now();
  for (int attempt = 0;; ++attempt) {
    const int32_t left = timeout_ms - static_cast<int32_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
    hixl::Status s = engine_.TransferSync(t.remote->engine, op, descs, args, std::max(left, 1));
    if (s.ok()) break;
    if (s.code() != hixl::StatusCode::kParamInvalid) return FromHixl(s, what);
    // The engine refused before any byte moved. Either the owner unregistered
    // the cache meanwhile (say so), or it registered it so recently that our
    // engine has not heard of its memory yet (wait a little and try again).
    if (Status listed = StillListed(t); !listed.ok()) {
      return Status(listed.code(), what + ": " + listed.message() + " (" + s.ToString() + ")");
    }
    if (Clock::now() - start >= std::chrono::milliseconds(timeout_ms)) return FromHixl(s, what);
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(50 << std::min(attempt, 10), 5000)));
  }
  Tell(t, event);
  return Status();
}

Status LlmDataDist::Impl::Transfer(const Request& r) {
  if (Status s = CheckReady(); !s.ok()) return s;
  if (r.ext.user_tag.size() > internal::kMaxUserTag) {
    return ParamInvalid("user_tag is " + std::to_string(r.ext.user_tag.size()) +
                        " bytes, at most 256");
  }
  std::shared_ptr<const LocalCache> local;
  if (Status s = FindLocal(r.local, local); !s.ok()) return s;
  Target t;
  if (Status s = ResolveTarget(r.remote, t); !s.ok()) return s;
  const bool pull = r.op == hixl::TransferOp::READ;
  internal::TensorSpan lspan, rspan;
  const auto lrange = pull ? r.ext.dst_layer_range : r.ext.src_layer_range;
  const auto rrange = pull ? r.ext.src_layer_range : r.ext.dst_layer_range;
  if (Status s = internal::ResolveLayers(lrange, local->entry.num_tensors,
                                         r.ext.tensor_num_per_layer,
                                         pull ? "destination" : "source", lspan);
      !s.ok()) {
    return s;
  }
  if (Status s = internal::ResolveLayers(rrange, t.cache.num_tensors, r.ext.tensor_num_per_layer,
                                         pull ? "source" : "destination", rspan);
      !s.ok()) {
    return s;
  }
  std::vector<hixl::TransferOpDesc> descs;
  internal::EventMsg ev = MakeEvent(r.op, t);
  ev.first_layer = rspan.first_layer;
  ev.last_layer = rspan.last_layer;
  ev.user_tag = r.ext.user_tag;
  if (r.blocks) {
    if (Status s = internal::BuildBlockDescs(local->entry.addrs, local->layout, lspan,
                                             *r.local_blocks, t.cache.addrs, t.layout, rspan,
                                             *r.remote_blocks, /*dest_is_local=*/pull, descs);
        !s.ok()) {
      return s;
    }
    ev.blocks = *r.remote_blocks;
  } else {
    if (Status s = internal::BuildEntryDescs(local->entry.addrs, local->layout, lspan,
                                             r.local_batch, t.cache.addrs, t.layout, rspan,
                                             t.batch_index, r.size, descs);
        !s.ok()) {
      return s;
    }
    ev.batch_index = t.batch_index;
  }
  uint8_t fence_scratch[internal::kFenceBytes] = {};
  AddFence(t, fence_scratch, descs);
  return MoveAndTell(t, r.op, descs, ev, sync_wait_ms_);
}

// ---------------------------------------------------------------------------
// The public class

LlmDataDist::LlmDataDist(uint64_t cluster_id, LlmRole role)
    : cluster_id_(cluster_id), impl_(std::make_unique<Impl>(cluster_id, role)) {}
LlmDataDist::~LlmDataDist() { Finalize(); }

Status LlmDataDist::Initialize(const std::map<std::string, std::string>& options) {
  return impl_->Initialize(options);
}
void LlmDataDist::Finalize() { impl_->Finalize(); }
Status LlmDataDist::SetRole(LlmRole role, const std::map<std::string, std::string>& options) {
  return impl_->SetRole(role, options);
}
LlmRole LlmDataDist::Role() const { return impl_->Role(); }
std::string LlmDataDist::LocalAddress() const { return impl_->LocalAddress(); }

Status LlmDataDist::LinkLlmClusters(const std::vector<ClusterInfo>& clusters,
                                    std::vector<Status>& rets, int32_t timeout_ms) {
  rets.clear();
  if (Status s = impl_->CheckReady(); !s.ok()) return s;
  if (clusters.empty()) return ParamInvalid("LinkLlmClusters: no clusters given");
  if (timeout_ms <= 0) return ParamInvalid("LinkLlmClusters: timeout_ms must be > 0");
  Status first;
  for (const auto& c : clusters) {
    rets.push_back(impl_->Link(c, timeout_ms));
    if (first.ok() && !rets.back().ok()) first = rets.back();
  }
  return first;
}

Status LlmDataDist::UnlinkLlmClusters(const std::vector<ClusterInfo>& clusters,
                                      std::vector<Status>& rets, int32_t timeout_ms, bool force) {
  rets.clear();
  if (Status s = impl_->CheckReady(); !s.ok()) return s;
  if (clusters.empty()) return ParamInvalid("UnlinkLlmClusters: no clusters given");
  Status first;
  for (const auto& c : clusters) {
    rets.push_back(impl_->Unlink(c, timeout_ms, force));
    if (first.ok() && !rets.back().ok()) first = rets.back();
  }
  return first;
}

Status LlmDataDist::RegisterKvCache(const CacheDesc& cache_desc, const std::vector<uint64_t>& addrs,
                                    const RegisterCfg& cfg, int64_t& cache_id) {
  return impl_->Register(cache_desc, addrs, cfg, cache_id);
}
Status LlmDataDist::UnregisterKvCache(int64_t cache_id) { return impl_->Unregister(cache_id); }
Status LlmDataDist::AllocHostMemory(size_t size, void** ptr) { return impl_->AllocHost(size, ptr); }
Status LlmDataDist::FreeHostMemory(void* ptr) { return impl_->FreeHost(ptr); }

namespace {
using Request = LlmDataDist::Impl::Request;
using RemoteRef = LlmDataDist::Impl::RemoteRef;

RemoteRef ByIndex(const CacheIndex& i) {
  RemoteRef r;
  r.by = RemoteRef::By::kIndex;
  r.cluster_id = i.cluster_id;
  r.cache_id = i.cache_id;
  r.batch_index = i.batch_index;
  return r;
}
RemoteRef ByKey(const CacheKey& k) {
  RemoteRef r;
  r.by = RemoteRef::By::kKey;
  r.key = k;
  return r;
}
RemoteRef ByBlocksKey(const BlocksCacheKey& k) {
  RemoteRef r;
  r.by = RemoteRef::By::kBlocksKey;
  r.cluster_id = k.prompt_cluster_id;
  r.model_id = k.model_id;
  return r;
}
Request Whole(hixl::TransferOp op, const Cache& local, RemoteRef remote, uint32_t local_batch,
              int64_t size, const KvCacheExtParam& ext) {
  Request q;
  q.op = op;
  q.local = local;
  q.remote = remote;
  q.local_batch = local_batch;
  q.size = size;
  q.ext = ext;
  return q;
}
Request Blocks(hixl::TransferOp op, const Cache& local, RemoteRef remote,
               const std::vector<uint64_t>& local_blocks, const std::vector<uint64_t>& remote_blocks,
               const KvCacheExtParam& ext) {
  Request q;
  q.op = op;
  q.local = local;
  q.remote = remote;
  q.blocks = true;
  q.local_blocks = &local_blocks;
  q.remote_blocks = &remote_blocks;
  q.ext = ext;
  return q;
}
}  // namespace

Status LlmDataDist::PullKvCache(const CacheIndex& src, const Cache& dst, uint32_t batch_index,
                                int64_t size, const KvCacheExtParam& ext) {
  return impl_->Transfer(Whole(hixl::TransferOp::READ, dst, ByIndex(src), batch_index, size, ext));
}
Status LlmDataDist::PullKvCache(const CacheKey& src, const Cache& dst, uint32_t batch_index,
                                int64_t size, const KvCacheExtParam& ext) {
  return impl_->Transfer(Whole(hixl::TransferOp::READ, dst, ByKey(src), batch_index, size, ext));
}
Status LlmDataDist::PullKvBlocks(const CacheIndex& src, const Cache& dst,
                                 const std::vector<uint64_t>& src_blocks,
                                 const std::vector<uint64_t>& dst_blocks,
                                 const KvCacheExtParam& ext) {
  return impl_->Transfer(
      Blocks(hixl::TransferOp::READ, dst, ByIndex(src), dst_blocks, src_blocks, ext));
}
Status LlmDataDist::PullKvBlocks(const BlocksCacheKey& src, const Cache& dst,
                                 const std::vector<uint64_t>& src_blocks,
                                 const std::vector<uint64_t>& dst_blocks,
                                 const KvCacheExtParam& ext) {
  return impl_->Transfer(
      Blocks(hixl::TransferOp::READ, dst, ByBlocksKey(src), dst_blocks, src_blocks, ext));
}
Status LlmDataDist::PushKvCache(const Cache& src, const CacheIndex& dst, uint32_t src_batch_index,
                                int64_t size, const KvCacheExtParam& ext) {
  return impl_->Transfer(
      Whole(hixl::TransferOp::WRITE, src, ByIndex(dst), src_batch_index, size, ext));
}
Status LlmDataDist::PushKvCache(const Cache& src, const CacheKey& dst, uint32_t src_batch_index,
                                int64_t size, const KvCacheExtParam& ext) {
  return impl_->Transfer(
      Whole(hixl::TransferOp::WRITE, src, ByKey(dst), src_batch_index, size, ext));
}
Status LlmDataDist::PushKvBlocks(const Cache& src, const CacheIndex& dst,
                                 const std::vector<uint64_t>& src_blocks,
                                 const std::vector<uint64_t>& dst_blocks,
                                 const KvCacheExtParam& ext) {
  return impl_->Transfer(
      Blocks(hixl::TransferOp::WRITE, src, ByIndex(dst), src_blocks, dst_blocks, ext));
}
Status LlmDataDist::PushKvBlocks(const Cache& src, const BlocksCacheKey& dst,
                                 const std::vector<uint64_t>& src_blocks,
                                 const std::vector<uint64_t>& dst_blocks,
                                 const KvCacheExtParam& ext) {
  return impl_->Transfer(
      Blocks(hixl::TransferOp::WRITE, src, ByBlocksKey(dst), src_blocks, dst_blocks, ext));
}

Status LlmDataDist::TransferCacheAsync(const Cache& src_cache, LayerGate gate,
                                       const std::vector<LayerTransferConfig>& configs,
                                       const std::vector<uint64_t>& src_blocks,
                                       const std::vector<uint64_t>& dst_blocks,
                                       std::shared_ptr<KvTransferTask>& task,
                                       int32_t tensor_num_per_layer) {
  return impl_->TransferCacheAsync(src_cache, std::move(gate), configs, src_blocks, dst_blocks,
                                   task, tensor_num_per_layer);
}

Status LlmDataDist::GetKvTransferEvents(std::vector<KvTransferEvent>& events) {
  return impl_->GetEvents(events);
}
Status LlmDataDist::SetKvTransferCallback(KvTransferCallback callback) {
  return impl_->SetCallback(std::move(callback));
}

}  // namespace llm_datadist
