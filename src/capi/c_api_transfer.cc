// The C API's transfers (hixl/hixl_c.h): single and batched reads and
// writes, blocking and async, with options and on a CUDA stream, and the
// requests they return. Handles are checked as in c_api.cc.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_util.h"
#include "capi/handles.h"
#include "capi/last_error.h"
#include "hixl/hixl.h"
#include "hixl/hixl_c.h"

namespace {

using namespace hixl::capi;  // NOLINT: the handle table's vocabulary

HixlStatus Transfer(HixlEngine engine, HixlTransferOp op, const HixlTransferDesc* descs,
                    size_t count, const HixlTransferOptions* options, void* stream, bool async,
                    HixlRequest* request) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (op != HIXL_OP_READ && op != HIXL_OP_WRITE) return Invalid("unknown transfer op");
  if (descs == nullptr || count == 0) return Invalid("no descriptors (NULL or count 0)");
  if (async && request == nullptr) return Invalid("request output pointer is NULL");
  hixl::TransferArgs args;
  args.stream = stream;
  int32_t sync_timeout_ms = e->transfer_timeout_ms;
  if (options != nullptr) {
    if (options->timeout_ms < 0)
      return Invalid("options->timeout_ms must be >= 0 (0: the default)");
    if (async) {
      args.timeout_ms = options->timeout_ms;
    } else if (options->timeout_ms > 0) {
      sync_timeout_ms = options->timeout_ms;
    }
    if (options->notify_name != nullptr) {
      hixl::NotifyDesc n;
      if (HixlStatus st =
              MakeNotify(options->notify_name, options->notify_msg, options->notify_msg_len, n);
          st != HIXL_SUCCESS) {
        return st;
      }
      args.notify = std::move(n);
    } else if (options->notify_msg != nullptr || options->notify_msg_len != 0) {
      return Invalid("options->notify_msg is set but notify_name is NULL");
    }
  }
  const uint32_t need = op == HIXL_OP_WRITE ? HIXL_MEM_PERM_WRITE : HIXL_MEM_PERM_READ;
  std::string remote;
  uint64_t generation = 0;
  std::vector<hixl::TransferOpDesc> cxx;
  cxx.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const HixlTransferDesc& d = descs[i];
    std::string at = count > 1 ? "descriptor " + std::to_string(i) + ": " : std::string();
    if (d.local == nullptr) return Invalid(at + "local address is NULL");
    if (d.size == 0) return Invalid(at + "size is 0");
    auto* m = Lookup<HixlMemHandleObj>(d.remote, Kind::kMem);
    if (m == nullptr) return Invalid(at + "remote memory handle is NULL or not live");
    if (m->owner != e) return Invalid(at + "remote memory handle belongs to another engine");
    if (m->engine_addr.empty()) {
      return Invalid(at + "memory handle of a client-only engine cannot be accessed");
    }
    if (d.remote_offset > m->len || d.size > m->len - d.remote_offset) {
      return Invalid(at + "offset " + std::to_string(d.remote_offset) + " + size " +
                     std::to_string(d.size) + " exceeds the region's " + std::to_string(m->len) +
                     " bytes");
    }
    if ((m->perms & need) == 0) {
      return Invalid(at + "the remote region does not allow " +
                     (op == HIXL_OP_WRITE ? "WRITE" : "READ"));
    }
    if (remote.empty()) {
      remote = m->engine_addr;
      generation = m->generation;
    } else if (remote != m->engine_addr) {
      return Invalid(at + "all descriptors of a batch must name the same remote engine");
    } else if (generation != m->generation) {
      return Invalid(at + "the batch's handles come from different incarnations (generations " +
                     std::to_string(generation) + " and " + std::to_string(m->generation) +
                     ") of engine " + remote + ": it restarted; use handles of its current one");
    }
    cxx.push_back({reinterpret_cast<uintptr_t>(d.local),
                   static_cast<uintptr_t>(m->addr + d.remote_offset), d.size});
  }
  // Every transfer names the incarnation its handles came from: addresses of
  // an engine that since restarted on the same address are refused.
  args.remote_generation = generation;
  const auto cop = op == HIXL_OP_WRITE ? hixl::TransferOp::WRITE : hixl::TransferOp::READ;
  hixl::TransferReq req = 0;
  hixl::Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    s = EnsureConnected(e, remote);
    if (!s.ok()) return FromCxx(s);
    if (async) {
      s = e->engine.TransferAsync(remote, cop, cxx, args, req);
    } else {
      s = e->engine.TransferSync(remote, cop, cxx, args, sync_timeout_ms);
    }
    if (s.code() != hixl::StatusCode::kNotConnected) break;
    // The peer went away (maybe restarted): reconnect once. Not for a blocking
    // transfer with a notification, which may have lost its link after the
    // data moved: doing it again could deliver the notification twice.
    if (!async && args.notify) break;
    ForgetConnection(e, remote);
  }
  if (!s.ok()) return FromCxx(s);
  if (request != nullptr) {
    RequestImpl* r = NewRequest(e, async ? req : 0, async ? HIXL_IN_PROGRESS : HIXL_SUCCESS);
    *request = &r->pub;
  }
  return HIXL_SUCCESS;
}

HixlStatus Single(HixlEngine engine, HixlTransferOp op, const void* local, size_t size,
                  HixlMemHandle remote, uint64_t off, bool async, HixlRequest* request) {
  HixlTransferDesc d{const_cast<void*>(local), remote, off, size};
  return Transfer(engine, op, &d, 1, nullptr, nullptr, async, request);
}

}  // namespace

extern "C" {

HixlStatus hixlWriteRemote(HixlEngine engine, const void* local, size_t size, HixlMemHandle remote,
                           uint64_t remote_offset, HixlRequest* request) {
  return Single(engine, HIXL_OP_WRITE, local, size, remote, remote_offset, false, request);
}
HixlStatus hixlReadRemote(HixlEngine engine, void* local, size_t size, HixlMemHandle remote,
                          uint64_t remote_offset, HixlRequest* request) {
  return Single(engine, HIXL_OP_READ, local, size, remote, remote_offset, false, request);
}
HixlStatus hixlWriteRemoteAsync(HixlEngine engine, const void* local, size_t size,
                                HixlMemHandle remote, uint64_t remote_offset,
                                HixlRequest* request) {
  return Single(engine, HIXL_OP_WRITE, local, size, remote, remote_offset, true, request);
}
HixlStatus hixlReadRemoteAsync(HixlEngine engine, void* local, size_t size, HixlMemHandle remote,
                               uint64_t remote_offset, HixlRequest* request) {
  return Single(engine, HIXL_OP_READ, local, size, remote, remote_offset, true, request);
}
HixlStatus hixlTransferBatch(HixlEngine engine, HixlTransferOp op, const HixlTransferDesc* descs,
                             size_t count, HixlRequest* request) {
  return Transfer(engine, op, descs, count, nullptr, nullptr, false, request);
}
HixlStatus hixlTransferBatchAsync(HixlEngine engine, HixlTransferOp op,
                                  const HixlTransferDesc* descs, size_t count,
                                  HixlRequest* request) {
  return Transfer(engine, op, descs, count, nullptr, nullptr, true, request);
}
HixlStatus hixlTransferBatchEx(HixlEngine engine, HixlTransferOp op, const HixlTransferDesc* descs,
                               size_t count, const HixlTransferOptions* options, int async,
                               HixlRequest* request) {
  return Transfer(engine, op, descs, count, options, nullptr, async != 0, request);
}

HixlStatus hixlTransferBatchOnStream(HixlEngine engine, HixlTransferOp op,
                                     const HixlTransferDesc* descs, size_t count,
                                     const HixlTransferOptions* options, void* stream, int async,
                                     HixlRequest* request) {
  return Transfer(engine, op, descs, count, options, stream, async != 0, request);
}

HixlStatus hixlPollRequest(HixlEngine engine, HixlRequest request) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  auto* r = Lookup<RequestImpl>(request, Kind::kRequest);
  if (r == nullptr) return Invalid("request is NULL, destroyed or not a request handle");
  std::lock_guard<std::mutex> l(r->mu);
  if (r->engine != e) return Invalid("request belongs to another engine");
  RefreshLocked(r);
  if (r->final_status != HIXL_SUCCESS && r->final_status != HIXL_IN_PROGRESS) {
    LastError() = r->reason;
  }
  return r->final_status;
}

HixlStatus hixlWaitRequest(HixlEngine engine, HixlRequest request, int32_t timeout_ms) {
  if (timeout_ms < HIXL_WAIT_FOREVER)
    return Invalid("timeout_ms must be >= 0 or HIXL_WAIT_FOREVER");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int64_t sleep_us = 10;
  for (;;) {
    HixlStatus s = hixlPollRequest(engine, request);
    if (s != HIXL_IN_PROGRESS) return s;
    if (timeout_ms != HIXL_WAIT_FOREVER && std::chrono::steady_clock::now() >= deadline) {
      LastError() = "IN_PROGRESS: the wait timed out; the request is still running";
      return HIXL_IN_PROGRESS;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min<int64_t>(sleep_us * 2, 1000);
  }
}

HixlStatus hixlCancelRequest(HixlEngine engine, HixlRequest request) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  auto* r = Lookup<RequestImpl>(request, Kind::kRequest);
  if (r == nullptr) return Invalid("request is NULL, destroyed or not a request handle");
  // r->mu is held throughout: the engine forgets a request once its end was
  // reported, so no poll may slip in between the check and the cancel. The
  // cancel itself is bounded (see hixl.h).
  std::lock_guard<std::mutex> l(r->mu);
  if (r->engine != e) return Invalid("request belongs to another engine");
  RefreshLocked(r);
  if (r->final_status != HIXL_IN_PROGRESS) return HIXL_SUCCESS;  // already ended: unchanged
  hixl::Status s = e->engine.CancelTransfer(r->cxx);
  if (!s.ok()) return FromCxx(s);
  RefreshLocked(r);
  if (r->final_status == HIXL_IN_PROGRESS) {
    // CancelTransfer returns once the request stopped; never seen, but never
    // leave a request running behind a successful cancel either.
    return Fail(HIXL_FAILED, "FAILED: the request still runs after CancelTransfer returned");
  }
  return HIXL_SUCCESS;
}

}  // extern "C"
