// The initiator side of the tcp transport's data lanes: ClientLane sends
// request headers (and WRITE payloads) and receives the target's answers in
// order (READ payloads straight into the caller's memory); TcpChannel cuts
// each transfer into slices and stripes them over a link's lanes.
// Thread safety: see ClientLane and TcpChannel in tcp_internal.h.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/cpu_relax.h"
#include "device/cuda.h"
#include "transport/tcp/tcp_internal.h"

namespace hixl::transport::tcp {

void ClientLane::SetEventsLocked(uint32_t ev) {
  if (ev == events_) return;
  events_ = ev;
  if (registered_ && !broken_) loop_->ModifyFd(fd_.get(), loop_id_, ev);
}

bool ClientLane::Enqueue(std::vector<Piece>& pieces, bool claim_reader) {
  Completions done;
  bool failed = false;
  bool claimed = false;
  Status why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_ || draining_) {
      Status why =
          broken_ ? broken_reason_ : Status::NotConnected("link to " + engine_ + " is closing");
      for (auto& p : pieces) done.emplace_back(std::move(p.t), why);
    } else {
      if (claim_reader && !caller_reads_ && fd_.valid()) {
        // Before the pieces go out, so that the answers find the loop
        // thread not watching for them.
        caller_reads_ = claimed = true;
        SetEventsLocked(ReadEventsLocked() | (events_ & EPOLLOUT));
      }
      for (auto& p : pieces) {
        p.hdr.seq = next_seq_++;
        sendq_.push_back(std::move(p));
      }
      if (!(events_ & EPOLLOUT)) FlushLocked(done);
    }
    failed = broken_;
    why = broken_reason_;
  }
  for (auto& [t, s] : done) t->PartDone(s);
  if (failed) Fail(why);
  return claimed;
}

void ClientLane::FlushLocked(Completions& done) {
  size_t stages = 0, staged_bytes = 0;
  while (!sendq_.empty()) {
    // A transfer told to stop sends nothing more that it has not begun.
    while (!sendq_.empty() && sendq_.front().off == 0 && sendq_.front().t->StopRequested()) {
      Status why = sendq_.front().t->CheckContinue();
      done.emplace_back(std::move(sendq_.front().t), std::move(why));
      sendq_.pop_front();
    }
    if (sendq_.empty()) break;
    if (const Piece& f = sendq_.front(); f.hdr.op == kOpWrite && f.device >= 0 && !f.staged) {
      if (stages >= kDeviceStagesPerFlush || staged_bytes >= kDeviceStage) {
        SetEventsLocked(ReadEventsLocked() | EPOLLOUT);  // the loop thread goes on
        return;
      }
      ++stages;
      staged_bytes += f.len;
    }
    if (!StageFront(done)) continue;
    iovec iov[kMaxIov];
    size_t n = 0;
    for (auto it = sendq_.begin(); it != sendq_.end() && n + 2 <= kMaxIov; ++it) {
      bool write = it->hdr.op == kOpWrite;
      // A device WRITE goes out once it is first (its bytes staged then).
      if (write && it->device >= 0 && !it->staged) break;
      if (it->off < sizeof(ReqHdr)) {
        iov[n++] = {reinterpret_cast<char*>(&it->hdr) + it->off, sizeof(ReqHdr) - it->off};
        if (write) iov[n++] = {it->local, it->len};
      } else {
        size_t p = it->off - sizeof(ReqHdr);
        iov[n++] = {it->local + p, it->len - p};
      }
    }
    if (n == 0) break;
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t r;
    {
      [[maybe_unused]] PayloadAccess quiet;
      r = ::sendmsg(fd_.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        SetEventsLocked(ReadEventsLocked() | EPOLLOUT);
        return;
      }
      if (errno == EFAULT) {
        // A local buffer is not readable: that piece fails; the stream is now
        // out of step, so the lane goes too.
        broken_reason_ = Status::Failed("a local buffer is not readable (EFAULT)");
      } else {
        broken_reason_ = net::ErrnoStatus("tcp send to " + engine_, errno);
      }
      broken_ = true;
      broken_seen_.store(true, std::memory_order_release);
      return;
    }
    size_t left = static_cast<size_t>(r);
    while (left > 0) {
      Piece& p = sendq_.front();
      size_t total = sizeof(ReqHdr) + (p.hdr.op == kOpWrite ? p.len : 0);
      size_t rest = total - p.off;
      if (left >= rest) {
        left -= rest;
        p.off = total;
        inflight_.push_back(std::move(p));
        sendq_.pop_front();
      } else {
        p.off += left;
        left = 0;
      }
    }
  }
  SetEventsLocked(ReadEventsLocked());
}

bool ClientLane::StageFront(Completions& done) {
  Piece& p = sendq_.front();
  if (p.hdr.op != kOpWrite || p.device < 0 || p.staged) return true;
  // The piece before it has been handed to the socket whole: its bytes
  // travel while this one is copied out of the device.
  if (wstage_.size() < p.len) wstage_.resize(p.len);
  Status s = device::Copy(wstage_.data(), p.local, p.len, p.device, p.t->after);
  if (!s.ok()) {
    done.emplace_back(std::move(p.t),
                      Status::Failed("reading local device memory to send it: " + s.message()));
    sendq_.pop_front();
    return false;
  }
  p.local = wstage_.data();
  p.staged = true;
  return true;
}

void ClientLane::Fail(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) {
      broken_ = true;
      broken_reason_ = why;
      broken_seen_.store(true, std::memory_order_release);
    }
  }
  drained_cv_.notify_all();
  if (loop_->InLoop()) {
    FailNow();
    return;
  }
  auto self = shared_from_this();
  // A stopped loop runs nothing any more, so failing here races with nothing.
  if (!loop_->Post([self] { self->FailNow(); })) FailNow();
}

void ClientLane::FailNow() {
  Completions done;
  Completions fenced;  // WRITE pieces whose bytes may be on their way
  {
    std::lock_guard<std::mutex> read_lock(read_mu_);  // no one is receiving now
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_.valid() && (!sendq_.empty() || !inflight_.empty())) {
      // Abandoning pieces on the wire: reset the connection rather than
      // closing it, so bytes still in our send buffer are never delivered
      // and the target sees the hang-up before anything it has not applied.
      linger lg{1, 0};
      setsockopt(fd_.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    for (auto& p : sendq_) {
      if (!p.t) continue;
      (p.off > 0 && p.hdr.op == kOpWrite ? fenced : done).emplace_back(std::move(p.t),
                                                                      broken_reason_);
    }
    for (auto& p : inflight_) {
      if (!p.t) continue;
      (p.hdr.op == kOpWrite ? fenced : done).emplace_back(std::move(p.t), broken_reason_);
    }
    sendq_.clear();
    inflight_.clear();
    if (registered_ && loop_->InLoop()) loop_->Remove(loop_id_);
    registered_ = false;
    fd_.Reset();
    rleft_ = 0;
  }
  drained_cv_.notify_all();
  for (auto& [t, s] : done) t->PartDone(s);
  if (fenced.empty()) return;
  // The target may not have applied everything these pieces sent yet: they
  // end once it confirmed that this link's lanes are closed.
  auto end = [fenced = std::move(fenced)]() mutable {
    for (auto& [t, s] : fenced) t->PartDone(s);
    fenced.clear();
  };
  if (fence_) {
    fence_(std::move(end));
  } else {
    end();
  }
}

void ClientLane::Poll() {
  Status why;
  {
    // A lane busy sending is making progress: its stopped transfers are
    // looked at on a later tick, and the control thread never waits here
    // (its heartbeats would wait with it).
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || broken_) return;
    bool waiting = false;
    for (const auto& p : inflight_) waiting = waiting || (p.t && p.t->StopRequested());
    if (!sendq_.empty() && sendq_.front().off > 0 && sendq_.front().t &&
        sendq_.front().t->StopRequested()) {
      waiting = true;
    }
    if (!waiting) {
      stop_seen_.reset();
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!stop_seen_) stop_seen_ = now;
    if (now - *stop_seen_ < stop_grace_) return;
    why = Status::Timeout("tcp lane to " + engine_ + ": no answer " +
                          std::to_string(stop_grace_.count()) +
                          " ms after the transfer was stopped; the lane was reset");
  }
  Fail(why);
}

void ClientLane::DetachStoppedReads() {
  Completions done;
  {
    std::lock_guard<std::mutex> read_lock(read_mu_);
    std::lock_guard<std::mutex> lock(mu_);
    bool front = true;
    for (auto& p : inflight_) {
      if (p.t && p.hdr.op == kOpRead && p.t->StopRequested()) {
        // Its reply, or what is left of it, goes to the sink.
        if (front && rleft_ > 0) rdst_ = nullptr;
        Status why = p.t->CheckContinue();
        done.emplace_back(std::move(p.t), std::move(why));
      }
      front = false;
    }
  }
  drained_cv_.notify_all();
  for (auto& [t, s] : done) t->PartDone(s);
}

void ClientLane::PurgeStopped() {
  if (loop_->InLoop()) {
    DetachStoppedReads();
  } else {
    auto self = shared_from_this();
    loop_->Post([self] { self->DetachStoppedReads(); });
  }
  Completions done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = sendq_.begin(); it != sendq_.end();) {
      if (it->off == 0 && it->t->StopRequested()) {
        Status why = it->t->CheckContinue();
        done.emplace_back(std::move(it->t), std::move(why));
        it = sendq_.erase(it);
      } else {
        ++it;
      }
    }
  }
  drained_cv_.notify_all();
  for (auto& [t, s] : done) t->PartDone(s);
}

bool ClientLane::ReadResponses(Completions& done) {
  size_t moved = 0;
  in_.Rearm();
  for (;;) {
    if (moved >= kFairnessBytes) {  // let other lanes run, then come back
      auto self = shared_from_this();
      loop_->Post([self] { self->OnEvent(EPOLLIN); });
      return true;
    }
    if (rleft_ > 0) {  // a READ reply's payload, straight into local memory
      ssize_t r;
      if (rdst_ == nullptr) {  // detached: the caller's buffer is not touched
        if (sink_.empty()) sink_.resize(kStaging);
        r = in_.Payload(fd_.get(), sink_.data(), std::min(rleft_, sink_.size()));
      } else if (rdev_ != nullptr) {  // device memory: through the staging buffer
        r = in_.Payload(fd_.get(), rstage_.data() + rstaged_,
                        std::min(rleft_, rstage_.size() - rstaged_));
      } else {
        [[maybe_unused]] PayloadAccess quiet;
        r = in_.Payload(fd_.get(), rdst_, rleft_);
      }
      if (r == -1) return true;
      if (r <= 0) return false;
      rleft_ -= static_cast<size_t>(r);
      moved += static_cast<size_t>(r);
      if (rdst_ != nullptr && rdev_ != nullptr) {
        rstaged_ += static_cast<size_t>(r);
        if (rstaged_ == rstage_.size() || rleft_ == 0) {
          // Detaching takes read_mu_, held here: a piece still attached now
          // ends only after this copy, so a stopped transfer sees no late
          // write.
          if (rdev_err_.ok()) {
            if (Status s = device::Copy(rdev_, rstage_.data(), rstaged_, rdev_ord_, rdev_after_);
                !s.ok()) {
              rdev_err_ =
                  Status::Failed("writing the reply to local device memory: " + s.message());
            }
          }
          rdev_ += rstaged_;
          rstaged_ = 0;
        }
      } else if (rdst_ != nullptr) {
        rdst_ += r;
      }
      if (rleft_ == 0) {
        Status end = rdev_ != nullptr ? rdev_err_ : Status::Ok();
        rdev_ = nullptr;
        rdev_after_.reset();
        std::lock_guard<std::mutex> lock(mu_);
        if (inflight_.front().t) done.emplace_back(std::move(inflight_.front().t), std::move(end));
        inflight_.pop_front();
      }
      continue;
    }
    if (in_.avail() < sizeof(RespHdr)) {
      ssize_t r = in_.Fill(fd_.get());
      if (r == -1) return true;
      if (r <= 0) return false;
      continue;
    }
    RespHdr h;
    std::memcpy(&h, in_.data(), sizeof(h));
    in_.Consume(sizeof(h));
    std::lock_guard<std::mutex> lock(mu_);
    if (h.magic != kRespMagic || inflight_.empty() || inflight_.front().hdr.seq != h.seq ||
        inflight_.front().hdr.op != h.op) {
      broken_reason_ =
          Status::Failed("tcp: target " + engine_ + " sent a response out of sequence");
      return false;
    }
    Piece& p = inflight_.front();
    if (h.status != kOk) {
      if (p.t) {
        const std::string what =
            std::string("target ") + engine_ +
            (h.status == kCopyFailed ? " could not move a slice: " : " refused a slice: ") +
            StatusText(h.status);
        done.emplace_back(std::move(p.t), h.status == kCopyFailed ? Status::Failed(what)
                                                                  : Status::ParamInvalid(what));
      }
      inflight_.pop_front();
      // After a refusal the target closes the lane next and the rest fail
      // then; after a failed device copy it goes on answering in order.
      continue;
    }
    if (h.op == kOpRead) {
      if (h.len != p.len) {
        broken_reason_ =
            Status::Failed("tcp: target " + engine_ + " sent a reply of the wrong length");
        return false;
      }
      rdst_ = p.t ? p.local : nullptr;
      rleft_ = p.len;
      rdev_ = nullptr;
      if (p.t && p.device >= 0) {
        rdev_ = p.local;
        rdev_ord_ = p.device;
        rdev_after_ = p.t->after;
        rdev_err_ = Status::Ok();
        rstaged_ = 0;
        const size_t want = std::min<size_t>(p.len, kDeviceStage);
        if (rstage_.size() < want) rstage_.resize(want);
      }
    } else {
      if (p.t) done.emplace_back(std::move(p.t), Status::Ok());
      inflight_.pop_front();
    }
  }
  return true;
}

void ClientLane::Drain(const Status& why, net::Deadline deadline) {
  Completions done;
  {
    std::unique_lock<std::mutex> lock(mu_);
    draining_ = true;
    // Pieces not begun never go out; one partly sent must finish (the target
    // would otherwise wait for the rest of its payload).
    for (auto it = sendq_.begin(); it != sendq_.end();) {
      if (it->off == 0) {
        done.emplace_back(std::move(it->t), why);
        it = sendq_.erase(it);
      } else {
        ++it;
      }
    }
    lock.unlock();
    for (auto& [t, s] : done) t->PartDone(s);
    lock.lock();
    drained_cv_.wait_until(lock, deadline,
                           [this] { return broken_ || (sendq_.empty() && inflight_.empty()); });
  }
  Fail(why);
}

void ClientLane::OnEvent(uint32_t ev) {
  Completions done;
  bool ok = true;
  if (ev & EPOLLOUT) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) FlushLocked(done);
    ok = !broken_;
  }
  bool broke = false;
  bool read = ok && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR));
  if (read && !(ev & (EPOLLHUP | EPOLLERR))) {
    std::lock_guard<std::mutex> lock(mu_);
    if (caller_reads_) {
      // The target half-closed while a caller receives the answers: the
      // caller reads up to the end itself, so that every answer before it
      // (a refusal, say) ends its piece before the lane fails the rest.
      // Watched again once the caller is done (level-triggered: it fires
      // then if the loop still has to act).
      SetEventsLocked(events_ & EPOLLOUT);
      read = false;
    }
  }
  if (read) Receive(done, broke);
  for (auto& [t, s] : done) t->PartDone(s);
  if (!ok || broke) Fail(ClosedReason());
}

Status ClientLane::ClosedReason() {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_reason_.ok() ? Status::NotConnected("tcp lane to " + engine_ + " closed")
                             : broken_reason_;
}

bool ClientLane::Receive(Completions& done, bool& broke) {
  std::lock_guard<std::mutex> read_lock(read_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Broken: it is being failed (or was: the socket is gone); nothing more
    // is received.
    if (broken_ || !fd_.valid()) return false;
  }
  broke = !ReadResponses(done);
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_ && sendq_.empty() && inflight_.empty()) drained_cv_.notify_all();
  return !broke;
}

void ClientLane::ReceiveAsCaller(const Transfer& t, std::chrono::microseconds spin,
                                 net::Deadline deadline) {
  int fd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd = fd_.get();
  }
  const auto start = net::Clock::now();
  const auto window = caller_spin_.Window(spin);
  const auto spin_until = std::min<net::Deadline>(start + window, deadline);
  const auto block_until = std::min<net::Deadline>(spin_until + kCallerReadFor, deadline);
  bool broke = false;
  bool slept = false;  // the window ran out before the answer came
  for (;;) {
    Completions done;
    const bool readable = Receive(done, broke);
    for (auto& [tr, s] : done) tr->PartDone(s);
    if (!readable || t.PartsDone()) break;
    const auto now = net::Clock::now();
    if (now >= block_until) break;
    if (now < spin_until) {
      for (int i = 0; i < 16; ++i) CpuRelax();
      continue;
    }
    slept = true;
    // The socket may be closed (and its number reused) by a failing lane
    // meanwhile: this only waits; Receive checks the lane before reading.
    const auto left = std::min<std::chrono::nanoseconds>(block_until - now, kCallerReadSlice);
    timespec ts{0, static_cast<long>(left.count())};
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    ::ppoll(&p, 1, &ts, nullptr);
  }
  if (window.count() > 0 && !broke) {
    if (slept) {
      caller_spin_.Miss();  // the window only kept the target's threads off a core
    } else if (t.PartsDone()) {
      caller_spin_.Hit();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    caller_reads_ = false;
    // Level-triggered: what arrived meanwhile wakes the loop thread now.
    SetEventsLocked(ReadEventsLocked() | (events_ & EPOLLOUT));
  }
  if (broke) Fail(ClosedReason());
}

// ---- TcpChannel -------------------------------------------------------------

void TcpChannel::Close(net::Deadline drain_until) {
  if (closed_.exchange(true)) return;
  // Pieces already sent are answered before the lanes close (until
  // drain_until); after that the lanes are abandoned and the target drops
  // what it has not applied (ServerLane::Abandoned).
  for (auto& l : lanes_)
    l->Drain(Status::NotConnected("link to " + engine_ + " was closed"), drain_until);
}

namespace {
// A number for the calling thread, given out in turn on first use.
size_t ThreadOrdinal() {
  static std::atomic<size_t> next{0};
  thread_local const size_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine;
}
}  // namespace

void TcpChannel::Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) {
  const size_t slice = std::clamp<size_t>(static_cast<size_t>(ctx_.Setting(options::kTcpSliceSize)), 4096, kMaxSlice);
  size_t count = 0;
  for (const auto& s : t->slices) count += (s.len + slice - 1) / slice;
  t->SetParts(static_cast<int>(count));
  if (closed_.load()) {
    for (size_t i = 0; i < count; ++i)
      t->PartDone(Status::NotConnected("link to " + engine_ + " was closed"));
    return;
  }
  // Lanes take consecutive runs of pieces (lane k the k-th 1/L of them), so
  // each lane's pieces go out in few sends and are answered in few reads; a
  // transfer smaller than two slices uses one lane. That is the next in turn,
  // except for a caller that waits: it keeps to its own lane (by thread), so
  // that back-to-back transfers find the target's I/O thread for that lane
  // still polling; alternating lanes would meet a thread that fell asleep
  // after its last turn, and waking it costs more than the round trip here.
  const size_t use = t->bytes() < 2 * slice ? 1 : std::min(lanes_.size(), count);
  const size_t first =
      (use == 1 && caller_waits ? ThreadOrdinal() : rr_.fetch_add(1)) % lanes_.size();
  std::vector<std::vector<Piece>> per_lane(lanes_.size());
  const uint8_t op = t->op == TransferOp::WRITE ? kOpWrite : kOpRead;
  size_t index = 0;
  for (const auto& s : t->slices) {
    for (size_t off = 0; off < s.len; off += slice, ++index) {
      size_t len = std::min(slice, s.len - off);
      Piece p;
      p.t = t;
      p.hdr = ReqHdr{kReqMagic, op, {0, 0, 0}, 0, s.remote + off, len};
      p.local = reinterpret_cast<char*>(s.local + off);
      p.len = len;
      p.device = s.local_device;
      per_lane[(first + index * use / count) % lanes_.size()].push_back(std::move(p));
    }
  }
  // A stop (deadline, cancel) drops what has not gone out yet; pieces on the
  // wire are answered in order, so the transfer ends once the last of them is.
  std::vector<std::weak_ptr<ClientLane>> used;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (!per_lane[i].empty()) used.push_back(lanes_[i]);
  }
  t->SetStopHook([used] {
    for (const auto& w : used) {
      if (auto l = w.lock()) l->PurgeStopped();
    }
  });
  // A caller waiting for a transfer on one lane receives its answer itself:
  // one wake-up (its own) instead of the loop thread's and then its own.
  const bool caller_reads = caller_waits && use == 1;
  bool claimed = false;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (!per_lane[i].empty()) claimed = lanes_[i]->Enqueue(per_lane[i], caller_reads) || claimed;
  }
  if (!claimed) return;
  // It polls for PollSpinUs plus the time the bytes take at a slow
  // loopback rate (a 64 KiB answer is ~25 us away, past the default spin),
  // up to 256 KiB's worth; PollSpinUs=0 never polls.
  std::chrono::microseconds spin(ctx_.poll_spin_us);
  if (spin.count() > 0) {
    spin +=
        std::chrono::microseconds(std::min<size_t>(t->bytes(), kSpinBytesMax) / kSpinBytesPerUs);
  }
  lanes_[first]->ReceiveAsCaller(*t, spin, t->deadline);
}

}  // namespace hixl::transport::tcp
