// TransferCacheAsync: a layer-wise push. Every check happens before it
// returns; then the task's thread opens each layer's gate in order and posts
// that layer's transfers (they overlap the caller's compute of the next
// layers), waits for them all, and tells each owner what arrived.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <thread>

#include "datadist/datadist_impl.h"
#include "datadist/status_util.h"

namespace llm_datadist {

using internal::FromHixl;
using internal::NotExist;
using internal::ParamInvalid;

namespace {

struct ConfigPlan {
  LlmDataDist::Impl::Target target;
  internal::TensorSpan src_span;
  internal::TensorSpan dst_span;
  std::vector<std::vector<hixl::TransferOpDesc>> layer_descs;  // by src layer - src first layer
  internal::EventMsg event;
  Status status;
  uint8_t fence_scratch[internal::kFenceBytes] = {};  // source of each layer's fence bytes
};

class LayerTask final : public KvTransferTask {
 public:
  Status Wait(int32_t timeout_ms) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto done = [this] { return done_; };
    if (timeout_ms < 0) {
      cv_.wait(lock, done);
    } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), done)) {
      return Status(LLM_TIMEOUT, "the layer-wise transfer has not ended within " +
                                     std::to_string(timeout_ms) + " ms (it goes on)");
    }
    for (const auto& s : results_) {
      if (!s.ok()) return s;
    }
    return Status();
  }
  bool Done() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  std::vector<Status> Results() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return results_;
  }
  std::vector<LayerTime> LayerTimes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ ? times_ : std::vector<LayerTime>{};
  }

  void Run(LlmDataDist::Impl* impl);
  void Finish(std::vector<Status> results, std::vector<LayerTime> times) {
    std::lock_guard<std::mutex> lock(mu_);
    results_ = std::move(results);
    times_ = std::move(times);
    done_ = true;
    cv_.notify_all();
  }

  LayerGate gate;
  std::vector<ConfigPlan> plans;
  int32_t first_layer = 0;  // union of the configs' source layers
  int32_t last_layer = 0;
  int32_t tpl = 2;
  std::atomic<bool>* stop = nullptr;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::vector<Status> results_;
  std::vector<LayerTime> times_;
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void LayerTask::Run(LlmDataDist::Impl* impl) {
  hixl::Hixl& engine = impl->engine();
  const int32_t timeout = impl->sync_wait_ms();
  // Posted layers, in order, with the requests of every config; a poller
  // thread sees each complete while later gates are still closed. Config
  // statuses are written under mu by both threads.
  struct Posted {
    LayerTime time;
    std::vector<std::pair<ConfigPlan*, hixl::TransferReq>> reqs;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Posted> posted;  // stable references while growing at the back
  size_t next_to_poll = 0;
  bool posting_done = false;
  auto set_status = [&](ConfigPlan* p, Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (p->status.ok()) p->status = std::move(s);
  };
  std::thread poller([&] {
    for (;;) {
      Posted* layer = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return posting_done || next_to_poll < posted.size(); });
        if (next_to_poll == posted.size()) return;  // posting_done
        layer = &posted[next_to_poll];
      }
      for (auto [p, req] : layer->reqs) {
        int sleep_us = 5;
        for (;;) {
          hixl::TransferStatus st = hixl::TransferStatus::WAITING;
          hixl::Status reason;
          hixl::Status q = engine.GetTransferStatus(req, st, reason);
          if (!q.ok()) {
            set_status(p, FromHixl(q, "layer-wise push"));
            break;
          }
          if (st == hixl::TransferStatus::WAITING) {
            std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
            sleep_us = std::min(sleep_us * 2, 20);
            continue;
          }
          if (st != hixl::TransferStatus::COMPLETED) {
            set_status(p, FromHixl(reason.ok() ? hixl::Status::Failed("transfer did not complete")
                                               : reason,
                                   "push of layer " + std::to_string(layer->time.layer) +
                                       " to cluster " +
                                       std::to_string(p->target.remote->cluster_id)));
          }
          break;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      layer->time.done_ns = NowNs();
      ++next_to_poll;
    }
  });
  for (int32_t layer = first_layer; layer <= last_layer; ++layer) {
    std::vector<ConfigPlan*> todo;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& p : plans) {
        if (p.status.ok() && layer >= p.src_span.first_layer && layer <= p.src_span.last_layer) {
          todo.push_back(&p);
        }
      }
    }
    if (todo.empty()) continue;
    Status fail;
    if (stop->load()) {
      fail = Status(LLM_FAILED, "the instance was finalized during the transfer");
    } else if (gate && !gate(static_cast<uint32_t>(layer), timeout)) {
      fail = Status(LLM_FAILED, "the layer gate for layer " + std::to_string(layer) +
                                    " returned false: layer " + std::to_string(layer) +
                                    " and the ones after it were not moved");
    }
    if (!fail.ok()) {
      for (ConfigPlan* p : todo) set_status(p, fail);
      continue;
    }
    Posted entry;
    entry.time = {layer, NowNs(), 0};
    for (ConfigPlan* p : todo) {
      hixl::TransferArgs args;
      args.timeout_ms = timeout;
      args.remote_generation = p->target.remote->generation;
      hixl::TransferReq req = 0;
      hixl::Status s;
      const auto post_start = std::chrono::steady_clock::now();
      for (int attempt = 0;; ++attempt) {
        s = engine.TransferAsync(p->target.remote->engine, hixl::TransferOp::WRITE,
                                 p->layer_descs[layer - p->src_span.first_layer], args, req);
        if (s.ok() || s.code() != hixl::StatusCode::kParamInvalid) break;
        // Refused before any byte moved: unregistered meanwhile, or so
        // recently registered that our engine has not heard of it yet.
        if (Status listed = impl->StillListed(p->target); !listed.ok()) {
          s = hixl::Status::ParamInvalid(listed.message() + " (" + s.message() + ")");
          break;
        }
        if (std::chrono::steady_clock::now() - post_start >= std::chrono::milliseconds(timeout)) {
          break;
        }
        std::this_thread::sleep_for(
            std::chrono::microseconds(std::min(50 << std::min(attempt, 10), 5000)));
      }
      if (!s.ok()) {
        set_status(p, FromHixl(s, "push of layer " + std::to_string(layer) + " to cluster " +
                                      std::to_string(p->target.remote->cluster_id)));
        continue;
      }
      entry.reqs.emplace_back(p, req);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      posted.push_back(std::move(entry));
    }
    cv.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    posting_done = true;
  }
  cv.notify_all();
  poller.join();
  // Every layer has landed (or failed): tell each owner, after the data.
  std::vector<Status> results;
  std::vector<LayerTime> times;
  for (const auto& e : posted) times.push_back(e.time);
  for (auto& p : plans) {
    if (p.status.ok()) {  // the data is in place; telling the owner is best effort
      impl->Tell(p.target, p.event);
    }
    results.push_back(p.status);
  }
  Finish(std::move(results), std::move(times));
}

}  // namespace

Status LlmDataDist::Impl::TransferCacheAsync(const Cache& src, LayerGate gate,
                                             const std::vector<LayerTransferConfig>& configs,
                                             const std::vector<uint64_t>& src_blocks,
                                             const std::vector<uint64_t>& dst_blocks,
                                             std::shared_ptr<KvTransferTask>& task, int32_t tpl) {
  if (Status s = CheckReady(); !s.ok()) return s;
  if (configs.empty()) return ParamInvalid("TransferCacheAsync: no transfer configs");
  const bool blocks = !src_blocks.empty() || !dst_blocks.empty();
  std::shared_ptr<const LocalCache> local;
  if (Status s = FindLocal(src, local); !s.ok()) return s;
  auto t = std::make_shared<LayerTask>();
  t->gate = std::move(gate);
  t->tpl = tpl;
  t->first_layer = INT32_MAX;
  t->last_layer = -1;
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    const auto& cfg = configs[ci];
    const std::string where = "TransferCacheAsync config " + std::to_string(ci) + ": ";
    ConfigPlan p;
    RemoteRef ref;
    ref.cluster_id = cfg.dst_cluster_id;
    if (cfg.dst_key) {
      ref.by = RemoteRef::By::kKey;
      ref.key = *cfg.dst_key;
    } else {
      ref.by = RemoteRef::By::kIndex;
      ref.cache_id = cfg.dst_cache_id;
      ref.batch_index = cfg.dst_batch_index;
    }
    auto dst_range = cfg.dst_layer_range;
    if (!cfg.dst_key && cfg.dst_cache_id == 0) {
      // Find the remote cache by its tensor addresses.
      if (cfg.dst_addrs.empty()) {
        return ParamInvalid(where + "name the destination by dst_cache_id, dst_key or dst_addrs");
      }
      std::shared_ptr<Remote> remote;
      {
        std::lock_guard<std::mutex> lock(remotes_mu_);
        auto it = remotes_.find(cfg.dst_cluster_id);
        if (it != remotes_.end()) remote = it->second;
      }
      if (!remote) {
        return Status(LLM_NOT_YET_LINK,
                      where + "cluster " + std::to_string(cfg.dst_cluster_id) + " is not linked");
      }
      std::shared_ptr<const internal::Table> table;
      if (Status s = FetchTable(*remote, table); !s.ok()) return s;
      bool found = false;
      for (const auto& c : table->caches) {
        auto at = std::search(c.addrs.begin(), c.addrs.end(), cfg.dst_addrs.begin(),
                              cfg.dst_addrs.end());
        if (at == c.addrs.end()) continue;
        size_t off = static_cast<size_t>(at - c.addrs.begin());
        if (tpl <= 0 || off % tpl != 0 || cfg.dst_addrs.size() % tpl != 0) continue;
        ref.cache_id = c.id;
        std::pair<int32_t, int32_t> r{static_cast<int32_t>(off / tpl),
                                      static_cast<int32_t>((off + cfg.dst_addrs.size()) / tpl - 1)};
        if (dst_range != std::make_pair(-1, -1) && dst_range != r) {
          return ParamInvalid(where + "dst_layer_range disagrees with dst_addrs");
        }
        dst_range = r;
        found = true;
        break;
      }
      if (!found) {
        return NotExist(where + "no cache of cluster " + std::to_string(cfg.dst_cluster_id) +
                        " has these tensor addresses (whole layers of one registered cache)");
      }
    }
    if (Status s = ResolveTarget(ref, p.target); !s.ok()) return Status(s.code(), where + s.message());
    if (Status s = internal::ResolveLayers(cfg.src_layer_range, local->entry.num_tensors, tpl,
                                           "source", p.src_span);
        !s.ok()) {
      return Status(s.code(), where + s.message());
    }
    if (Status s = internal::ResolveLayers(dst_range, p.target.cache.num_tensors, tpl,
                                           "destination", p.dst_span);
        !s.ok()) {
      return Status(s.code(), where + s.message());
    }
    if (p.src_span.count != p.dst_span.count) {
      return ParamInvalid(where + "source and destination layer ranges differ in length");
    }
    for (int32_t l = p.src_span.first_layer; l <= p.src_span.last_layer; ++l) {
      internal::TensorSpan ls{static_cast<uint32_t>(l) * tpl, static_cast<uint32_t>(tpl), l, l};
      int32_t dl = l - p.src_span.first_layer + p.dst_span.first_layer;
      internal::TensorSpan ds{static_cast<uint32_t>(dl) * tpl, static_cast<uint32_t>(tpl), dl, dl};
      std::vector<hixl::TransferOpDesc> d;
      Status s = blocks ? internal::BuildBlockDescs(local->entry.addrs, local->layout, ls,
                                                    src_blocks, p.target.cache.addrs,
                                                    p.target.layout, ds, dst_blocks,
                                                    /*dest_is_local=*/false, d)
                        : internal::BuildEntryDescs(local->entry.addrs, local->layout, ls,
                                                    cfg.src_batch_index, p.target.cache.addrs,
                                                    p.target.layout, ds, p.target.batch_index,
                                                    -1, d);
      if (!s.ok()) return Status(s.code(), where + s.message());
      p.layer_descs.push_back(std::move(d));
    }
    p.event = MakeEvent(hixl::TransferOp::WRITE, p.target);
    if (cfg.user_tag.size() > internal::kMaxUserTag) {
      return ParamInvalid(where + "user_tag is longer than 256 bytes");
    }
    p.event.user_tag = cfg.user_tag;
    p.event.first_layer = p.dst_span.first_layer;
    p.event.last_layer = p.dst_span.last_layer;
    if (blocks) p.event.blocks = dst_blocks;
    else p.event.batch_index = p.target.batch_index;
    t->first_layer = std::min(t->first_layer, p.src_span.first_layer);
    t->last_layer = std::max(t->last_layer, p.src_span.last_layer);
    t->plans.push_back(std::move(p));
  }
  // Every layer's transfer also moves fence bytes of its cache (see
  // CacheEntry::fence); the plans stay where they are from here on.
  for (auto& p : t->plans) {
    for (auto& d : p.layer_descs) AddFence(p.target, p.fence_scratch, d);
  }
  std::lock_guard<std::mutex> lock(tasks_mu_);
  // Join the threads of tasks that ended.
  for (auto it = task_threads_.begin(); it != task_threads_.end();) {
    if (it->second->Done()) {
      it->first.join();
      it = task_threads_.erase(it);
    } else {
      ++it;
    }
  }
  t->stop = &tasks_stop_;
  LlmDataDist::Impl* self = this;
  task_threads_.emplace_back(std::thread([t, self] { t->Run(self); }), t);
  task = t;
  return Status();
}

void LlmDataDist::Impl::StopTasks() {
  std::lock_guard<std::mutex> lock(tasks_mu_);
  tasks_stop_.store(true);
  for (auto& [th, t] : task_threads_) th.join();
  task_threads_.clear();
  tasks_stop_.store(false);
}

}  // namespace llm_datadist
