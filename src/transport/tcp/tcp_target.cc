// The target side of the tcp transport's data lanes: ServerLane reads an
// initiator's lane hello and request headers, checks each with the pure
// tcp_wire checks (ParseLaneHello, CheckRequestHeader) before any byte
// moves, receives WRITE payloads straight into registered memory, and
// answers in order, sending READ replies straight from it.
// Thread safety: a lane runs on its EventLoop thread; Close may be called
// from any thread (it posts to the loop).
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "common/log.h"
#include "device/cuda.h"
#include "transport/tcp/tcp_internal.h"

namespace hixl::transport::tcp {

void ServerLane::Close(const std::string& why, bool warn) {
  auto self = shared_from_this();
  auto doit = [self, why, warn] {
    if (self->closed_) return;
    self->closed_ = true;
    if (warn) {
      HIXL_LOG(WARN) << "tcp: dropping data lane: " << why;
    } else {
      HIXL_LOG(INFO) << "tcp: data lane closed: " << why;
    }
    self->loop_->Remove(self->loop_id_);
    self->fd_.Reset();
    self->outq_.clear();  // nothing more leaves registered memory through this lane
    self->out_bytes_ = 0;
    self->left_ = 0;
    self->dev_ = -1;
  };
  if (loop_->InLoop()) {
    doit();
  } else {
    loop_->Post(doit);
  }
}

void ServerLane::CloseIfNoHello(const std::string& why) {
  auto self = shared_from_this();
  loop_->Post([self, why] {
    if (!self->hello_done_) self->Close(why, true);
  });
}

bool ServerLane::Abandoned(bool force) {
  auto now = std::chrono::steady_clock::now();
  if (!force && now - last_alive_check_ < kAliveCheckInterval) return false;
  last_alive_check_ = now;
  pollfd p{fd_.get(), POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR))) return false;
  Close(left_ > 0 || in_.avail() > 0 ? "initiator abandoned the lane; unapplied bytes dropped"
                                     : "initiator closed the lane",
        false);
  return true;
}

bool ServerLane::FencedAfterStall() {
  if (loop_->Checkpoint() == stalls_seen_) return false;
  // This process could not run for longer than its peers wait before they
  // give it up (stopped, or starved) while the lane existed: they may have
  // reported transfers on it as failed, so nothing it holds may be applied
  // now. Every lane of the loop sees the same count, so a stall noticed by
  // another lane's step fences this one too.
  Close("this engine could not run for longer than " + std::to_string(tp_->stall_fence().count()) +
            " ms, past the heartbeat bound: unapplied bytes dropped",
        true);
  return true;
}

void ServerLane::OnEvent(uint32_t ev) {
  if (closed_) return;
  if (FencedAfterStall()) return;
  if (!closing_ && (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
    // An initiator closes a lane only once every piece it sent was answered,
    // or when it gave this engine up: in both cases nothing queued here may
    // be applied any more.
    Close(left_ > 0 || in_.avail() > 0 ? "initiator abandoned the lane; unapplied bytes dropped"
                                       : "initiator closed the lane",
          false);
    return;
  }
  if ((ev & EPOLLOUT) && !Flush()) return;
  if (closing_) {
    if (outq_.empty() || (ev & (EPOLLHUP | EPOLLERR))) {
      Close(closing_why_, true);
      return;
    }
  } else if ((ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) || in_.avail() > 0) {
    // (Requests already buffered here raise no epoll event: serve them too.)
    if (!Process()) return;
    if (closing_ && outq_.empty()) {
      Close(closing_why_, true);
      return;
    }
  }
  UpdateEvents();
}

void ServerLane::Revoke(uintptr_t addr, size_t len) {
  if (closed_) return;
  auto overlaps = [&](uintptr_t a, size_t n) { return a < addr + len && addr < a + n; };
  bool touching = left_ > 0 && overlaps(cur_.addr, cur_.len);
  for (const Out& o : outq_)
    touching = touching || (o.len > 0 && overlaps(reinterpret_cast<uintptr_t>(o.data), o.len));
  if (touching) Close("a region it was still moving bytes of was deregistered", true);
}

void ServerLane::UpdateEvents() {
  if (closed_) return;
  uint32_t want = EPOLLRDHUP;
  if (!closing_ && out_bytes_ < kMaxQueuedReplyBytes)
    want |= EPOLLIN;  // back-pressure on READ replies
  if (!outq_.empty()) want |= EPOLLOUT;
  if (want != events_) {
    events_ = want;
    loop_->Modify(loop_id_, want);
  }
}

bool ServerLane::Process() {
  // Answers queue while requests keep coming and go out together when the
  // input runs dry: one send for a batch of small WRITEs, not one each.
  for (int round = 0;; ++round) {
    if (!ProcessRequests() || closed_) return false;
    if (outq_.empty()) return true;
    const bool limited = out_bytes_ >= kMaxQueuedReplyBytes;  // requests may still be buffered
    if (!Flush()) return false;
    // The send made room, and no event will come for requests already
    // buffered here: serve them now (a few rounds, then let other lanes run).
    if (!limited || closing_ || out_bytes_ >= kMaxQueuedReplyBytes || in_.avail() == 0) return true;
    if (round == 8) {
      auto self = shared_from_this();
      loop_->Post([self] { self->OnEvent(EPOLLIN); });
      return true;
    }
  }
}

bool ServerLane::ProcessRequests() {
  size_t moved = 0;
  in_.Rearm();
  while (!closing_ && out_bytes_ < kMaxQueuedReplyBytes) {
    // Steps follow each other at once; a long gap means this process was
    // stopped between two of them (see OnEvent): fence before the next.
    if (FencedAfterStall()) return false;
    if (moved >= kFairnessBytes) {  // let other lanes run, then come back
      auto self = shared_from_this();
      loop_->Post([self] { self->OnEvent(EPOLLIN); });
      return true;
    }
    if (left_ > 0) {  // receiving a WRITE payload straight into registered memory
      if (Abandoned(false)) return false;
      if (FencedAfterStall()) return false;  // the last check before bytes land, no syscall between
      ssize_t r;
      if (dev_ >= 0) {  // device memory: into the staging buffer
        r = in_.Payload(fd_.get(), stage_.data() + staged_,
                        std::min(left_, stage_.size() - staged_));
      } else {
        [[maybe_unused]] PayloadAccess quiet;
        r = in_.Payload(fd_.get(), dst_, left_);
      }
      if (r == -1) return true;
      if (r <= 0) {
        Close(r == 0 ? "initiator closed the lane mid-payload" : std::strerror(errno), r != 0);
        return false;
      }
      left_ -= static_cast<size_t>(r);
      moved += static_cast<size_t>(r);
      if (dev_ >= 0) {
        staged_ += static_cast<size_t>(r);
        if ((staged_ == stage_.size() || left_ == 0) && !LandStaged()) return false;
      } else {
        dst_ += r;
      }
      if (left_ == 0) {
        Reply(cur_.seq, kOpWrite, dev_failed_ ? kCopyFailed : kOk, nullptr, 0);
        dev_ = -1;
      }
      continue;
    }
    size_t need = hello_done_ ? kReqHdrSize : kLaneHelloSize;
    if (in_.avail() < need) {
      ssize_t r = in_.Fill(fd_.get());
      if (r == -1) return true;
      if (r <= 0) {
        Close(r == 0 ? "initiator closed the lane" : std::strerror(errno), r != 0);
        return false;
      }
      continue;
    }
    if (!hello_done_) {
      if (!OnHello()) return false;
      continue;
    }
    const ReqHdr h = *ParseRequestHeader(in_.bytes());  // kReqHdrSize are buffered
    if (h.op == kOpWrite && Abandoned(false)) return false;
    in_.Consume(kReqHdrSize);
    OnHeader(h);
  }
  return !closed_;
}

bool ServerLane::OnHello() {
  const ParsedHello p = ParseLaneHello(in_.bytes());
  in_.Consume(kLaneHelloSize);
  LaneReply rep{kLaneMagic, 0};
  if (p.verdict != HelloVerdict::kOk ||
      !tp_->CheckToken(p.hello, conn_id_, shared_from_this())) {
    rep.status = 1;
    ssize_t w = ::send(fd_.get(), &rep, sizeof(rep), MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)w;
    Close("lane hello without a valid token or tag (not a hixl peer, a stale one, or a replay)",
          true);
    return false;
  }
  hello_done_ = true;
  proven_.store(true, std::memory_order_release);
  ssize_t w = ::send(fd_.get(), &rep, sizeof(rep), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (w != static_cast<ssize_t>(sizeof(rep))) {
    Close("cannot answer lane hello", true);
    return false;
  }
  return true;
}

bool ServerLane::OnHeader(const ReqHdr& h) {
  const RequestVerdict v = CheckRequestHeader(h, *tp_->regions());
  if (!v.ok()) {
    // Requests before this one are answered in order, then the refusal; the
    // payload that may follow cannot be skipped safely, so the lane closes.
    closing_ = true;
    closing_why_ = std::string(v.why) + " (addr " + std::to_string(h.addr) + ", len " +
                   std::to_string(h.len) + ")";
    Reply(h.seq, h.op, v.status, nullptr, 0);
    return false;
  }
  if (h.op == kOpWrite) {
    cur_ = h;
    dst_ = reinterpret_cast<char*>(h.addr);
    left_ = h.len;
    dev_ = v.device;
    if (dev_ >= 0) {
      dev_failed_ = false;
      staged_ = 0;
      const size_t want = std::min<size_t>(h.len, kDeviceStage);
      if (stage_.size() < want) stage_.resize(want);
    }
  } else if (v.device >= 0) {
    // Device memory is read by the driver into a buffer the reply owns;
    // the region is not touched again once this returns.
    auto staged = std::make_shared<std::vector<char>>(h.len);
    Status s = device::Copy(staged->data(), reinterpret_cast<const void*>(h.addr), h.len, v.device);
    if (!s.ok()) {
      HIXL_LOG(WARN) << "tcp: reading device memory for a peer failed: " << s.message();
      Reply(h.seq, kOpRead, kCopyFailed, nullptr, 0);
    } else {
      const char* data = staged->data();
      Reply(h.seq, kOpRead, kOk, data, h.len, std::move(staged));
    }
  } else {
    Reply(h.seq, kOpRead, kOk, reinterpret_cast<const char*>(h.addr), h.len);
  }
  return true;
}

bool ServerLane::LandStaged() {
  const size_t n = staged_;
  staged_ = 0;
  if (dev_failed_) return true;  // received only to keep the stream in step
  // The bytes land now: the same checks as before a host payload's receive.
  if (Abandoned(false) || FencedAfterStall()) return false;
  Status s = device::Copy(dst_, stage_.data(), n, dev_);
  if (!s.ok()) {
    HIXL_LOG(WARN) << "tcp: writing a peer's bytes to device memory failed: " << s.message();
    dev_failed_ = true;
  }
  dst_ += n;
  return true;
}

void ServerLane::Reply(uint64_t seq, uint8_t op, uint8_t status, const char* data, size_t len,
                       std::shared_ptr<std::vector<char>> staged) {
  Out o{RespHdr{kRespMagic, op, status, 0, seq, len}, data, len, 0, std::move(staged)};
  outq_.push_back(std::move(o));
  out_bytes_ += sizeof(RespHdr) + len;  // sent at the end of this batch (Process)
}

bool ServerLane::Flush() {
  while (!outq_.empty()) {
    iovec iov[kMaxIov];
    size_t n = 0;
    for (auto it = outq_.begin(); it != outq_.end() && n + 2 <= kMaxIov; ++it) {
      if (it->off < sizeof(RespHdr)) {
        iov[n++] = {reinterpret_cast<char*>(&it->hdr) + it->off, sizeof(RespHdr) - it->off};
        if (it->len > 0) iov[n++] = {const_cast<char*>(it->data), it->len};
      } else {
        size_t p = it->off - sizeof(RespHdr);
        iov[n++] = {const_cast<char*>(it->data) + p, it->len - p};
      }
    }
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
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      Close(std::string("send failed: ") + std::strerror(errno),
            errno != EPIPE && errno != ECONNRESET);
      return false;
    }
    size_t left = static_cast<size_t>(r);
    out_bytes_ -= left;
    while (left > 0) {
      Out& o = outq_.front();
      size_t rest = sizeof(RespHdr) + o.len - o.off;
      if (left >= rest) {
        left -= rest;
        outq_.pop_front();
      } else {
        o.off += left;
        left = 0;
      }
    }
  }
  return true;
}

}  // namespace hixl::transport::tcp
