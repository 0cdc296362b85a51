#include "transport/ucx/ucx_channel.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/log.h"

namespace hixl::transport::ucx {

// Locks: post_mu serializes posting with Close and with destroying remote
// keys (a key must not go while an operation is being posted with it);
// mu guards the operations in flight and the health; key_mu the set of live
// keys. Completion callbacks (progress thread, inside UCX's worker lock) take
// only mu and key_mu (a region released there); nothing holding mu or key_mu
// calls into UCX, so they never wait on each other.
struct UcxChannel::Core {
  struct Op {
    std::shared_ptr<Transfer> t;
    Status result;                // an error met while posting
    bool stop_seen = false;       // Poll saw the transfer stopped or late
    net::Clock::time_point stop_at{};
  };
  struct KeyBox {
    ucp_rkey_h key = nullptr;
  };

  std::string engine;
  bool err_peer = false;
  int stall_ms = 1000;
  ucp_ep_h ep = nullptr;

  std::mutex post_mu;
  bool post_closed = false;  // under post_mu
  // Set once Close began: a later Close (the channel's destructor, which may
  // run inside a UCX callback when a transfer's end drops the last reference
  // to its link) returns without taking post_mu.
  std::atomic<bool> close_begun{false};

  std::mutex mu;
  std::condition_variable cv;
  uint64_t next_op = 1;
  std::unordered_map<uint64_t, Op> ops;
  // The flush contexts UCX holds (FlushCtx*): freed by their callback, or
  // after the worker is destroyed if UCX never completes them.
  std::unordered_set<void*> flushes;
  bool closed = false;
  Status broken;
  std::atomic<bool> is_broken{false};  // broken is set (read without mu)

  std::mutex key_mu;
  std::set<KeyBox*> keys;          // live keys (the regions still hold them)
  std::vector<ucp_rkey_h> garbage;  // keys of released regions, destroyed under post_mu
  std::atomic<bool> has_garbage{false};  // garbage may be non-empty (read without key_mu)

  void End(uint64_t id, ucs_status_t st) {
    Op op;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = ops.find(id);
      if (it == ops.end()) return;
      op = std::move(it->second);
      ops.erase(it);
      cv.notify_all();
    }
    Status s = op.result;
    if (s.ok() && st != UCS_OK) s = UcxStatus("UCX transfer to " + engine, st);
    // A transfer stopped or past its deadline reports why, though its bytes
    // landed: what it promises is that none lands after it ended.
    if (s.ok()) s = op.t->CheckContinue();
    op.t->PartDone(s);
  }

  // The peer process has exited with operations UCX still holds: nothing
  // can answer them or read what they would send, so the endpoint is closed
  // by force, which drops them (under error handling NONE that is safe only
  // because no peer is left to be confused by it). Keys go first.
  void CloseForGonePeer() {
    std::lock_guard<std::mutex> post(post_mu);
    if (ep == nullptr) return;
    DestroyKeys();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);  // released when done
    ep = nullptr;
  }

  // Posts one put (WRITE) or get (READ) per slice; post_mu held. Stops at
  // the first error, or when t (if given) was stopped or passed its deadline
  // (checked every 1024 slices): what was posted still lands. in_place (if
  // given): set false when an operation did not complete in place (UCX
  // returned a request), i.e. it still moves bytes after this returns.
  Status Post(TransferOp op, const memory::Slice* slices, size_t n, const Transfer* t,
              bool* in_place) {
    for (size_t i = 0; i < n; ++i) {
      const memory::Slice& sl = slices[i];
      if (t != nullptr && ((i + 1) & 1023) == 0) {
        if (Status s = t->CheckContinue(); !s.ok()) return s;
      }
      auto* box = static_cast<KeyBox*>(sl.region->transport_state.get());
      if (box == nullptr || box->key == nullptr) {
        return Status::Failed("region " + std::to_string(sl.region->id) + " of " + engine +
                              " has no UCX remote key");
      }
      ucp_request_param_t p{};
      void* local = reinterpret_cast<void*>(sl.local);
      ucs_status_ptr_t r = op == TransferOp::WRITE
                               ? ucp_put_nbx(ep, local, sl.len, sl.remote, box->key, &p)
                               : ucp_get_nbx(ep, local, sl.len, sl.remote, box->key, &p);
      if (UCS_PTR_IS_ERR(r)) {
        return UcxStatus(
            "UCX " + std::string(op == TransferOp::WRITE ? "put" : "get") + " to " + engine,
            UCS_PTR_STATUS(r));
      }
      if (r != nullptr) {
        ucp_request_free(r);  // released when done; the flush waits for it
        if (in_place != nullptr) *in_place = false;
      }
    }
    return Status::Ok();
  }

  // Destroys every remote key, released or live; post_mu held.
  void DestroyKeys() {
    CollectGarbage();
    std::vector<ucp_rkey_h> live;
    {
      std::lock_guard<std::mutex> lock(key_mu);
      for (auto* b : keys) {
        if (b->key != nullptr) live.push_back(b->key);
        b->key = nullptr;
      }
    }
    for (ucp_rkey_h k : live) ucp_rkey_destroy(k);  // not under key_mu (see Locks)
  }

  // Destroys the keys of released regions; post_mu held.
  void CollectGarbage() {
    if (!has_garbage.load(std::memory_order_acquire)) return;
    std::vector<ucp_rkey_h> g;
    {
      std::lock_guard<std::mutex> lock(key_mu);
      g.swap(garbage);
      has_garbage.store(false, std::memory_order_relaxed);
    }
    for (ucp_rkey_h k : g) ucp_rkey_destroy(k);
  }
};

namespace {
// How long a thread that waits for its own transfer progresses the worker.
constexpr int kCallerSpinUs = 50;

// The process pid (of this host and pid namespace) has exited: it is gone or
// a zombie, whose memory is released. False for pid <= 0 (not known).
bool ProcessGone(int64_t pid) {
  if (pid <= 0) return false;
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return errno == ENOENT || errno == ESRCH;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) S ...": the name may hold ')' itself, the state follows the last.
  const char* close = std::strrchr(buf, ')');
  if (close == nullptr || close[1] != ' ') return n == 0;
  return close[2] == 'Z' || close[2] == 'X';
}

struct FlushCtx {
  std::shared_ptr<UcxChannel::Core> core;
  uint64_t id;
};

void OnFlushed(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<FlushCtx*>(user_data);
  {
    std::lock_guard<std::mutex> lock(ctx->core->mu);
    ctx->core->flushes.erase(ctx);
  }
  ctx->core->End(ctx->id, status);
  delete ctx;
  ucp_request_free(request);
}

void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* core = static_cast<UcxChannel::Core*>(arg);
  std::lock_guard<std::mutex> lock(core->mu);
  if (core->closed || !core->broken.ok()) return;
  core->broken = UcxStatus("UCX endpoint to " + core->engine + " failed", status);
  core->is_broken.store(true, std::memory_order_release);
  HIXL_LOG(WARN) << core->broken.message();
}

// Waits for a UCX request the progress thread drives; frees it.
ucs_status_t WaitRequest(ucs_status_ptr_t req, net::Deadline deadline) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  ucs_status_t s = UCS_INPROGRESS;
  while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) {
    if (net::Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  ucp_request_free(req);  // an unfinished one is released when it completes
  return s == UCS_INPROGRESS ? UCS_ERR_TIMED_OUT : s;
}
}  // namespace

UcxChannel::UcxChannel(std::shared_ptr<Worker> worker, std::shared_ptr<EndpointCache> cache,
                       std::string engine, bool err_peer, int hb_bound_ms, int64_t peer_pid)
    : worker_(std::move(worker)),
      cache_(std::move(cache)),
      core_(std::make_shared<Core>()),
      peer_pid_(peer_pid) {
  core_->engine = std::move(engine);
  core_->err_peer = err_peer;
  core_->stall_ms = std::max(1000, hb_bound_ms);
}

UcxChannel::~UcxChannel() { Close(net::Clock::now()); }

Status UcxChannel::Open(const std::vector<uint8_t>& peer_address, net::Deadline deadline) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  p.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  p.err_mode = core_->err_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  if (core_->err_peer) {
    p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.err_handler.cb = &OnEndpointError;
    p.err_handler.arg = core_.get();
  }
  const std::string mode = core_->err_peer ? "PEER" : "NONE";
  peer_address_ = peer_address;
  if (!core_->err_peer && cache_) core_->ep = cache_->Take(peer_address);
  if (core_->ep == nullptr) {
    if (ucs_status_t s = ucp_ep_create(worker_->worker(), &p, &core_->ep); s != UCS_OK) {
      core_->ep = nullptr;
      return UcxStatus("UCX endpoint to " + core_->engine + " (error handling " + mode + ")", s);
    }
  }
  // Wire-up is lazy: a flush proves the peer is reachable before the link is up.
  ucp_request_param_t fp{};
  ucs_status_ptr_t req = ucp_ep_flush_nbx(core_->ep, &fp);
  worker_->Wake();
  if (ucs_status_t s = WaitRequest(req, deadline); s != UCS_OK) {
    return UcxStatus("UCX endpoint to " + core_->engine + " (error handling " + mode + ")", s);
  }
  layers_ = EndpointLayers(core_->ep);
  shared_memory_ = IsSharedMemory(layers_);
  HIXL_LOG(INFO) << "ucx link to " << core_->engine << ": layers " << layers_
                 << ", error handling " << mode;
  return Status::Ok();
}

Status UcxChannel::PrepareRegion(memory::RemoteRegion& r, const wire::Msg* info) {
  const wire::Msg* key = nullptr;
  if (info != nullptr && info->is_object()) {
    if (auto it = info->find("rkey"); it != info->end()) key = &*it;
  }
  if (key == nullptr || !key->is_binary() || key->get_binary().empty() ||
      key->get_binary().size() > 4096) {
    return Status::Failed("peer " + core_->engine + " sent no usable UCX remote key for region " +
                          std::to_string(r.id));
  }
  std::lock_guard<std::mutex> post(core_->post_mu);
  if (core_->post_closed) return Status::NotConnected("link to " + core_->engine + " is closed");
  ucp_rkey_h k = nullptr;
  if (ucs_status_t s = ucp_ep_rkey_unpack(core_->ep, key->get_binary().data(), &k); s != UCS_OK) {
    return UcxStatus("unpacking the UCX remote key of region " + std::to_string(r.id), s);
  }
  auto* box = new Core::KeyBox{k};
  {
    std::lock_guard<std::mutex> lock(core_->key_mu);
    core_->keys.insert(box);
  }
  // Released with the region, on any thread: the key is destroyed later under
  // post_mu (never while an operation is posted with it), or by Close.
  r.transport_state = std::shared_ptr<void>(box, [core = core_](void* p) {
    auto* b = static_cast<Core::KeyBox*>(p);
    std::lock_guard<std::mutex> lock(core->key_mu);
    if (b->key != nullptr) {
      core->garbage.push_back(b->key);
      core->has_garbage.store(true, std::memory_order_release);
    }
    core->keys.erase(b);
    delete b;
  });
  return Status::Ok();
}

void UcxChannel::Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) {
  Core& c = *core_;
  std::unique_lock<std::mutex> post(c.post_mu);
  if (c.post_closed) {
    post.unlock();
    t->PartDone(Status::NotConnected("link to " + c.engine + " is closed"));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (!c.broken.ok()) {
      Status b = c.broken;
      post.unlock();
      t->PartDone(b);
      return;
    }
  }
  c.CollectGarbage();
  if (Status s = t->CheckContinue(); !s.ok()) {
    post.unlock();
    t->PartDone(s);
    return;
  }
  Status result = c.Post(t->op, t->slices.data(), t->slices.size(), t.get(), nullptr);
  FlushAndTrack(post, t, std::move(result), caller_waits);
}

void UcxChannel::FlushAndTrack(std::unique_lock<std::mutex>& post,
                               const std::shared_ptr<Transfer>& t, Status result,
                               bool caller_waits) {
  Core& c = *core_;
  uint64_t id = 0;
  FlushCtx* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    id = c.next_op++;
    c.ops.emplace(id, Core::Op{t, std::move(result)});
    ctx = new FlushCtx{core_, id};
    c.flushes.insert(ctx);
  }
  ucp_request_param_t fp{};
  fp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  fp.cb.send = &OnFlushed;
  fp.user_data = ctx;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(c.ep, &fp);
  post.unlock();
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    {
      std::lock_guard<std::mutex> lock(c.mu);
      c.flushes.erase(ctx);
    }
    delete ctx;
    c.End(id, r == nullptr ? UCS_OK : UCS_PTR_STATUS(r));
    return;
  }
  if (caller_waits) {
    // The caller would only sleep: it progresses the worker itself for a
    // bounded while (a small transfer ends here without two thread wake-ups),
    // then leaves the rest to the progress thread.
    const auto until = net::Clock::now() + std::chrono::microseconds(kCallerSpinUs);
    while (net::Clock::now() < until) {
      ucp_worker_progress(worker_->worker());
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.ops.count(id) == 0) return;
    }
  }
  worker_->Wake();
}

Status UcxChannel::RunInline(TransferOp op, const memory::Slice* slices, size_t n,
                             net::Deadline deadline) {
  Core& c = *core_;
  std::unique_lock<std::mutex> post(c.post_mu);
  if (c.post_closed) return Status::NotConnected("link to " + c.engine + " is closed");
  if (c.is_broken.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(c.mu);
    return c.broken;
  }
  c.CollectGarbage();
  // The deadline is not read here: the caller has just set it (as shm's
  // inline copies do, it is looked at only where a transfer could wait).
  bool in_place = true;
  Status result = c.Post(op, slices, n, nullptr, &in_place);
  if (in_place) {
    // Every put or get was a copy this thread made (shared memory, cma): the
    // flush has nothing to wait for and completes here, without a request.
    ucp_request_param_t fp{};
    ucs_status_ptr_t r = ucp_ep_flush_nbx(c.ep, &fp);
    if (r == nullptr) return result;
    if (UCS_PTR_IS_ERR(r)) {
      return result.ok() ? UcxStatus("UCX transfer to " + c.engine, UCS_PTR_STATUS(r)) : result;
    }
    ucp_request_free(r);  // released when done; the flush below covers the same operations
  }
  // Bytes are still on their way: the rest runs as a transfer of its own
  // (no slices: the caller holds the pins until this returns), so Close and
  // the stall checks see it like any other.
  auto t = std::make_shared<Transfer>(op, std::vector<memory::Slice>{},
                                      std::vector<memory::RegionRef>{}, deadline);
  FlushAndTrack(post, t, std::move(result), /*caller_waits=*/true);
  if (!t->WaitDone(deadline)) {
    // As TransferSync does: stop, then wait until nothing can move any more.
    t->RequestStop(Status::Timeout("transfer deadline passed"));
    t->WaitDone(net::Deadline::max());
  }
  return t->reason();
}

Status UcxChannel::Health() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  if (core_->closed) return Status::Ok();  // being closed on purpose: not a failure
  return core_->broken;
}

void UcxChannel::Poll() {
  Core& c = *core_;
  {
    std::unique_lock<std::mutex> post(c.post_mu, std::try_to_lock);
    if (post.owns_lock() && !c.post_closed) c.CollectGarbage();
  }
  const auto now = net::Clock::now();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.closed || !c.broken.ok()) return;
  for (auto& [id, op] : c.ops) {
    if (op.t->CheckContinue().ok()) continue;
    if (!op.stop_seen) {
      op.stop_seen = true;
      op.stop_at = now;
    } else if (now - op.stop_at > std::chrono::milliseconds(c.stall_ms)) {
      c.broken = Status::NotConnected("UCX: " + c.engine + " left a stopped transfer unanswered for " +
                                      std::to_string(c.stall_ms) + " ms");
      c.is_broken.store(true, std::memory_order_release);
      HIXL_LOG(WARN) << c.broken.message();
      return;
    }
  }
}

void UcxChannel::Close(net::Deadline drain_until) {
  Core& c = *core_;
  if (c.close_begun.load(std::memory_order_acquire)) return;
  {
    std::lock_guard<std::mutex> post(c.post_mu);
    if (c.post_closed) return;
    c.post_closed = true;
    c.close_begun.store(true, std::memory_order_release);
  }
  // 1. What was posted lands first (until drain_until at most).
  std::unique_lock<std::mutex> lock(c.mu);
  c.closed = true;
  c.cv.wait_until(lock, drain_until, [&] { return c.ops.empty(); });
  const bool idle = c.ops.empty();
  lock.unlock();
  std::lock_guard<std::mutex> post(c.post_mu);
  if (c.ep == nullptr) return;
  if (worker_->shut_down()) {
    // The worker and every endpoint went with it: nothing of UCX is left to
    // touch, and nothing to wait for.
    c.ep = nullptr;
    std::unordered_map<uint64_t, Core::Op> left;
    {
      std::lock_guard<std::mutex> l(c.mu);
      left.swap(c.ops);
    }
    for (auto& [id, op] : left) {
      op.t->PartDone(Status::Failed("link to " + c.engine + " closed: the engine was finalized"));
    }
    return;
  }
  if (!c.err_peer && !idle) {
    // Error handling NONE: UCX can neither cancel these operations nor close
    // the endpoint under them, and it may still copy their bytes: a put
    // waiting for room in the peer's shared-memory queue reads the source
    // later, a get's answer is written into its buffer when it comes. So a
    // transfer left here ends only once UCX cannot touch its memory any more:
    // UCX completed it, the peer process is gone (nothing will drain the
    // queue or answer), or this engine's worker was destroyed. The endpoint
    // and its keys stay until the worker goes.
    size_t n = 0;
    {
      std::lock_guard<std::mutex> l(c.mu);
      n = c.ops.size();
    }
    const bool gone = ProcessGone(peer_pid_);
    HIXL_LOG(WARN) << "ucx: closing the link to " << c.engine << " with " << n
                   << " transfer(s) unanswered under UcxErrorHandling=NONE, which UCX cannot "
                      "cancel: "
                   << (gone ? "the peer process has exited, they end FAILED"
                            : "they end when UCX completes them, when the peer process exits, "
                              "or when this engine is finalized");
    auto settle = [core = core_, pid = peer_pid_](bool worker_gone) {
      std::unordered_map<uint64_t, Core::Op> left;
      {
        std::lock_guard<std::mutex> l(core->mu);
        if (core->ops.empty()) return true;
        if (!worker_gone && !ProcessGone(pid)) return false;
        left.swap(core->ops);
      }
      // Not called on the destroyed worker; else UCX would keep retrying
      // the queued operations (a core busy) until the engine finalizes.
      if (!worker_gone) core->CloseForGonePeer();
      const std::string why =
          worker_gone ? " (the engine was finalized)" : " (the peer process has exited)";
      for (auto& [id, op] : left) {
        op.t->PartDone(Status::Failed("link to " + core->engine +
                                      " closed with the transfer unanswered" + why));
      }
      return true;
    };
    // Settled on the progress thread (this thread holds post_mu).
    worker_->Linger(std::move(settle));
    worker_->Wake();
    // Their flushes may never complete: what UCX still holds of them is
    // freed once the worker is gone.
    worker_->AtDestroy([core = core_] {
      std::vector<void*> left_flushes;
      {
        std::lock_guard<std::mutex> l(core->mu);
        left_flushes.assign(core->flushes.begin(), core->flushes.end());
        core->flushes.clear();
      }
      for (void* f : left_flushes) delete static_cast<FlushCtx*>(f);
    });
    return;
  }
  // 2. Keys go before their endpoint -- unless operations still use them: a
  //    forced close ends those first.
  if (idle) c.DestroyKeys();
  if (idle && !c.err_peer && cache_) {
    // Kept for the next link to this worker (see EndpointCache).
    cache_->Put(peer_address_, c.ep);
    c.ep = nullptr;
    return;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = c.err_peer ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(c.ep, &p);
  worker_->Wake();
  const auto bound = net::Clock::now() + std::chrono::seconds(1);
  if (ucs_status_t s = WaitRequest(req, bound); s != UCS_OK && s != UCS_ERR_CANCELED &&
                                                 s != UCS_ERR_CONNECTION_RESET &&
                                                 s != UCS_ERR_ENDPOINT_TIMEOUT) {
    HIXL_LOG(INFO) << "ucx: closing the endpoint to " << c.engine << ": " << ucs_status_string(s);
  }
  c.ep = nullptr;
  // 3. A forced close completed every operation (with an error); end any the
  //    callbacks have not reached yet.
  lock.lock();
  c.cv.wait_until(lock, net::Clock::now() + std::chrono::seconds(2), [&] { return c.ops.empty(); });
  std::unordered_map<uint64_t, Core::Op> left;
  left.swap(c.ops);
  lock.unlock();
  for (auto& [id, op] : left) {
    op.t->PartDone(Status::Failed("link to " + c.engine + " closed with the transfer unanswered"));
  }
  if (!idle) c.DestroyKeys();
}

}  // namespace hixl::transport::ucx
