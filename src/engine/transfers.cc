// Hixl::Impl's transfers: resolving descriptors against a peer's regions
// (bounds, permissions, device memory, the application's stream), the
// transfer object, TransferSync/TransferAsync, their status and
// cancellation. The rest of Hixl::Impl is in engine.cc, links.cc and
// control_plane.cc.
#include <algorithm>
#include <chrono>

#include "engine/engine.h"

namespace hixl {

namespace {
// TransferSync polls for the answer of transfers up to this size (larger
// ones take longer than the polling would last).
constexpr size_t kSpinMaxBytes = 256u << 10;
}  // namespace

namespace {
// The calling thread's resolved slices and pins, reused from transfer to
// transfer; a transfer that outlives the call takes them with it.
struct Scratch {
  std::vector<memory::Slice> slices;
  std::vector<memory::RegionRef> pins;
  device::StreamEvent after;
};
thread_local Scratch tl_scratch;

// Drops what Resolve gave when the transfer did not take it: the pins and
// the peer's activity count.
struct ResolvedGuard {
  std::vector<memory::RegionRef>& pins;
  std::atomic<int>* active;
  ~ResolvedGuard() {
    memory::Unpin(pins);
    if (active) active->fetch_sub(1, std::memory_order_acq_rel);
  }
};
}  // namespace

Status Hixl::Impl::Resolve(const std::string& remote, TransferOp op,
                           const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                           net::Deadline deadline, std::shared_ptr<Peer>& peer,
                           std::vector<memory::Slice>& slices, std::vector<memory::RegionRef>& pins,
                           device::StreamEvent& after) {
  after.reset();
  if (Status s = CheckInitialized(); !s.ok()) return s;
  if (op != TransferOp::READ && op != TransferOp::WRITE) {
    return Status::ParamInvalid("unknown transfer op");
  }
  if (args.timeout_ms < 0) return Status::ParamInvalid("TransferArgs.timeout_ms must be >= 0");
  if (args.notify) {
    if (args.notify->name.size() > kMaxNotifyNameLen ||
        args.notify->notify_msg.size() > kMaxNotifyMsgLen) {
      return Status::ParamInvalid("notification name and message are limited to 1024 bytes each");
    }
  }
  memory::RegionHint* hint = nullptr;
  if (Status s = AcquirePeer(remote, deadline, peer, &hint); !s.ok()) return s;
  // AcquirePeer counted one activity on the peer: the caller releases it
  // (or the transfer it makes), this guard on a failure here.
  struct ActiveGuard {
    std::atomic<int>* n;
    ~ActiveGuard() {
      if (n) n->fetch_sub(1, std::memory_order_acq_rel);
    }
  } active{&peer->active};
  if (args.remote_generation != 0 && args.remote_generation != peer->generation) {
    return Status::ParamInvalid(
        "transfer to " + remote + " refused: it names generation " +
        std::to_string(args.remote_generation) + " but the peer now runs generation " +
        std::to_string(peer->generation) + " (it restarted; its old addresses are stale)");
  }
  if (Status s = peer->regions.Resolve(op, descs, slices, pins, hint); !s.ok()) {
    return Status(s.code(), "transfer to " + remote + ": " + s.message());
  }
  Status s = CheckDevice(*peer, remote, slices);
  if (s.ok() && args.stream != nullptr) s = AfterStream(args.stream, slices, after);
  if (!s.ok()) {
    memory::Unpin(pins);
    slices.clear();
    return s;
  }
  active.n = nullptr;  // the caller's now
  return Status::Ok();
}

Status Hixl::Impl::AfterStream(void* stream, const std::vector<memory::Slice>& slices,
                               device::StreamEvent& after) {
  if (Status s = device::RecordOn(stream, after); !s.ok()) {
    return Status(s.code() == StatusCode::kFailed ? StatusCode::kParamInvalid : s.code(),
                  "TransferArgs.stream: " + s.message());
  }
  // The CPU copies host memory: it waits for the application's work here.
  for (const auto& sl : slices) {
    if (sl.local_device < 0) {
      if (Status s = device::WaitOnCpu(after); !s.ok()) {
        after.reset();
        return Status(s.code(), "TransferArgs.stream: " + s.message());
      }
      break;
    }
  }
  return Status::Ok();
}

Status Hixl::Impl::CheckDevice(const Peer& peer, const std::string& remote,
                               std::vector<memory::Slice>& slices) const {
  // Local device memory is looked for only while some is registered, or a
  // CUDA driver is loaded (then unregistered device memory is refused
  // before memcpy or process_vm_* would fault on it).
  const bool registered = device_regions_.load(std::memory_order_acquire) > 0;
  const bool driver = registered || device::DriverLoaded();
  bool any = false;
  for (size_t i = 0; i < slices.size(); ++i) {
    memory::Slice& s = slices[i];
    auto where = [&] { return "transfer to " + remote + ": descriptor " + std::to_string(i); };
    if (driver) {
      auto r = registered ? regions_.FindContaining(s.local, s.len) : std::nullopt;
      if (r && r->type == MemType::MEM_DEVICE) {
        s.local_device = r->dev.ordinal;
        any = true;
      } else if (!r) {
        auto o = registered ? regions_.FindOverlapping(s.local, s.len) : std::nullopt;
        device::PtrInfo info;
        if ((o && o->type == MemType::MEM_DEVICE) ||
            (device::Query(s.local, info).ok() && info.device)) {
          return Status::ParamInvalid(where() +
                                      ": the local buffer is device memory that no MEM_DEVICE "
                                      "registration of this engine wholly contains; register it "
                                      "with RegisterMem(MEM_DEVICE)");
        }
      }
    }
    const memory::RemoteRegion& g = *s.region;
    if (g.device) {
      const LinkType link = peer.channel->device_link_type();
      if ((link != LinkType::SHM && link != LinkType::TCP) ||
          (link == LinkType::SHM && g.mapped == nullptr)) {
        return Status::Unsupported(
            where() + ": region " + std::to_string(g.id) + " of the peer is device memory, which " +
            "this link cannot reach" + (g.unreachable.empty() ? "" : " (" + g.unreachable + ")") +
            "; device memory moves over shm and tcp links (and UCX links through tcp lanes) in "
            "this version");
      }
      any = true;
    }
  }
  const LinkType link = peer.channel->device_link_type();
  if (any && link != LinkType::SHM && link != LinkType::TCP) {
    return Status::Unsupported("transfer to " + remote +
                               ": device memory moves over shm and tcp links (and over UCX links "
                               "through tcp lanes) in this version; this link is " +
                               LinkTypeName(peer.channel->link_type()) +
                               (peer.channel->link_type() == LinkType::UCX
                                    ? " and the peer offers no tcp endpoint"
                                    : ""));
  }
  return Status::Ok();
}

bool Hixl::Impl::CanRunInline(const Peer& peer, const std::vector<memory::Slice>& slices,
                              const TransferArgs& args, bool caller_waits) {
  if (args.notify || args.stream != nullptr) return false;
  if (!caller_waits && peer.channel->InlineMayWait()) return false;
  const size_t limit = peer.channel->InlineLimit();
  // Device transfers of a link that sends them elsewhere go through Submit.
  const bool elsewhere = peer.channel->device_link_type() != peer.channel->link_type();
  size_t bytes = 0;
  for (const auto& s : slices) {
    bytes += s.len;
    if (bytes > limit) return false;
    if (elsewhere && (s.local_device >= 0 || s.region->device)) return false;
  }
  return true;
}

std::shared_ptr<transport::Transfer> Hixl::Impl::MakeTransfer(
    const std::shared_ptr<Peer>& peer, TransferOp op, const TransferArgs& args,
    net::Deadline deadline, std::vector<memory::Slice>& slices,
    std::vector<memory::RegionRef>& pins) {
  // The transfer takes over the pins and the peer's activity count.
  auto t = std::make_shared<transport::Transfer>(op, std::move(slices), std::move(pins), deadline,
                                                 std::shared_ptr<const void>(peer), &peer->active);
  slices.clear();  // moved-from: make them plainly empty for the next transfer
  pins.clear();
  if (args.notify) {
    NotifyDesc d = *args.notify;
    std::weak_ptr<Peer> wp = peer;
    t->SetThen([this, wp, d, deadline](std::shared_ptr<transport::Transfer> tr) {
      auto p = wp.lock();
      if (!p) {
        tr->Finish(
            Status::NotConnected("the data was written; the link closed before the notification"));
        return;
      }
      PostNotify(p, d, deadline, [tr](Status s) {
        if (!s.ok())
          s = Status(s.code(),
                     "the data was written but the notification was not delivered: " + s.message());
        tr->Finish(std::move(s));
      });
    });
  }
  return t;
}

Status Hixl::Impl::TransferSync(const std::string& remote, TransferOp op,
                                const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                                int32_t timeout_ms) {
  auto deadline = timeout_ms > 0 ? net::DeadlineAfterMs(timeout_ms) : net::Deadline::max();
  std::shared_ptr<Peer> peer;
  Scratch& sc = tl_scratch;
  if (Status s = Resolve(remote, op, descs, args, deadline, peer, sc.slices, sc.pins, sc.after);
      !s.ok())
    return s;
  if (CanRunInline(*peer, sc.slices, args, /*caller_waits=*/true)) {
    // Small shm copies: no request object, no hand-off.
    ResolvedGuard g{sc.pins, &peer->active};
    return peer->channel->RunInline(op, sc.slices.data(), sc.slices.size(), deadline);
  }
  auto t = MakeTransfer(peer, op, args, deadline, sc.slices, sc.pins);
  t->after = std::move(sc.after);
  peer->channel->Submit(t, /*caller_waits=*/true);
  // A small transfer's answer (tcp, UCX) is usually microseconds away:
  // spinning for it, bounded, saves this thread a sleep and a wake-up, which
  // cost more than the wait on one host. Not with a notification attached:
  // its answer crosses both control threads, which need the core it would
  // take.
  if (!args.notify && !t->Done() && t->bytes() <= kSpinMaxBytes && opts_.poll_spin_us > 0) {
    t->SpinUntilDone(std::chrono::microseconds(opts_.poll_spin_us));
  }
  if (!t->WaitDone(deadline)) {
    // Stop every part and wait until they have: after TIMEOUT no byte moves.
    // (Bounded: pieces on the wire are answered, or the peer is declared
    // dead by the heartbeat and the link abandoned.)
    t->RequestStop(Status::Timeout("TransferSync to " + remote + " exceeded " +
                                   std::to_string(timeout_ms) + " ms"));
    t->WaitDone(net::Deadline::max());
  }
  return t->reason();
}

Status Hixl::Impl::TransferAsync(const std::string& remote, TransferOp op,
                                 const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                                 TransferReq& req) {
  auto deadline =
      args.timeout_ms > 0 ? net::DeadlineAfterMs(args.timeout_ms) : net::Deadline::max();
  std::shared_ptr<Peer> peer;
  Scratch& sc = tl_scratch;
  if (Status s = Resolve(remote, op, descs, args, deadline, peer, sc.slices, sc.pins, sc.after);
      !s.ok())
    return s;
  if (CanRunInline(*peer, sc.slices, args, /*caller_waits=*/false)) {
    // A small shm copy ends here, before the request exists: a success is
    // one bit until GetTransferStatus reports it; a failure is kept as an
    // ended request with its reason.
    Status end;
    {
      ResolvedGuard g{sc.pins, &peer->active};
      end = peer->channel->RunInline(op, sc.slices.data(), sc.slices.size(), deadline);
    }
    std::shared_ptr<transport::Transfer> failed;
    if (!end.ok()) {
      // Ended already: no deadline (deadline_reqs_ counts only requests the
      // sweep may still have to stop, and GetTransferStatus uncounts by it).
      failed = std::make_shared<transport::Transfer>(
          op, std::vector<memory::Slice>{}, std::vector<memory::RegionRef>{}, net::Deadline::max());
      failed->Finish(std::move(end));
    }
    std::lock_guard<std::mutex> lock(req_mu_);
    req = next_req_++;
    if (failed) {
      reqs_[req] = std::move(failed);
    } else {
      done_ids_.Add(req);
    }
    return Status::Ok();
  }
  auto t = MakeTransfer(peer, op, args, deadline, sc.slices, sc.pins);
  t->after = std::move(sc.after);
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(req_mu_);
    id = next_req_++;
    reqs_[id] = t;
    if (deadline != net::Deadline::max()) ++deadline_reqs_;
  }
  peer->channel->Submit(t, /*caller_waits=*/false);
  req = id;
  return Status::Ok();
}

namespace {
Status UnknownRequest(TransferReq req) {
  return Status::ParamInvalid("unknown TransferReq " + std::to_string(req) +
                              " (never issued, or already reported as ended)");
}
}  // namespace

Status Hixl::Impl::GetTransferStatus(TransferReq req, TransferStatus& status, Status* reason) {
  std::shared_ptr<transport::Transfer> t;
  {
    std::lock_guard<std::mutex> lock(req_mu_);
    if (done_ids_.Take(req)) {
      status = TransferStatus::COMPLETED;
      if (reason != nullptr) *reason = Status::Ok();
      return Status::Ok();
    }
    auto it = reqs_.find(req);
    if (it == reqs_.end()) return UnknownRequest(req);
    t = it->second;
    // One reading of the state decides both what is reported and whether the
    // request is released: read twice, a transfer ending in between would be
    // reported ended and yet stay known.
    status = t->state();
    if (status != TransferStatus::WAITING) {  // single use: released once its end is reported
      if (t->deadline != net::Deadline::max()) --deadline_reqs_;
      reqs_.erase(it);
    }
  }
  if (reason != nullptr) {
    // Final once the state left WAITING; still running means no reason yet.
    *reason = status == TransferStatus::WAITING ? Status::Ok() : t->reason();
  }
  return Status::Ok();
}

Status Hixl::Impl::CancelTransfer(TransferReq req) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  std::shared_ptr<transport::Transfer> t;
  {
    std::lock_guard<std::mutex> lock(req_mu_);
    if (done_ids_.Has(req)) return Status::Ok();  // it ended already
    auto it = reqs_.find(req);
    if (it == reqs_.end()) return UnknownRequest(req);
    t = it->second;
  }
  t->RequestStop(Status::Cancelled("request " + std::to_string(req) + " was cancelled"));
  t->WaitDone(net::Deadline::max());  // bounded like a TIMEOUT (see TransferSync)
  return Status::Ok();
}

}  // namespace hixl
