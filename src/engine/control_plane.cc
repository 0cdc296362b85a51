// Hixl::Impl's control plane, run by the loop thread: accepting peers, the
// target's side of the handshake, control messages (region updates and
// their acknowledgements, notifications), heartbeats and closing links.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/host.h"
#include "common/log.h"
#include "engine/engine.h"

namespace hixl {

using engine_detail::kBusyTickMs;
using engine_detail::kIdleTickMs;

// ---------------------------------------------------------------- control plane (loop thread)

void Hixl::Impl::OnAccept() {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        HIXL_LOG(WARN) << "accept failed: " << std::strerror(errno);
      }
      return;
    }
    auto c = std::make_unique<Conn>();
    c->fd.Reset(fd);
    c->accepted = true;
    c->hello_deadline = net::DeadlineAfterMs(opts_.handshake_timeout_ms);
    AddConn(std::move(c));
  }
}

void Hixl::Impl::AddConn(std::unique_ptr<Conn> c) {
  uint64_t id = next_conn_id_++;
  c->id = id;
  c->loop_id = loop_.Add(c->fd.get(), EPOLLIN | EPOLLRDHUP,
                         [this, id](uint32_t ev) { OnConnEvent(id, ev); });
  {
    std::lock_guard<std::mutex> lock(c->tx->mu);
    c->tx->fd = c->fd.get();
    c->tx->loop_id = c->loop_id;
    // Frames a sender queued before the loop knew the connection.
    if (!c->tx->outq.empty()) FlushLocked(*c->tx);
  }
  c->last_rx = c->last_tx = net::Clock::now();
  if (c->peer) c->peer->conn_id.store(id, std::memory_order_release);
  if (c->established) TightenTick(c->hb_ms);
  conns_[id] = std::move(c);
}

void Hixl::Impl::OnConnEvent(uint64_t id, uint32_t events) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (events & EPOLLOUT) {
    bool ok;
    {
      std::lock_guard<std::mutex> lock(c.tx->mu);
      ok = c.tx->fd < 0 || FlushLocked(*c.tx);
    }
    if (!ok) {
      CloseConn(id, "send failed", false);
      return;
    }
  }
  if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))) return;
  uint8_t buf[64 * 1024];
  for (;;) {
    ssize_t r = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (r > 0) {
      c.last_rx = net::Clock::now();
      if (c.peer) {
        c.peer->last_rx_ns.store(c.last_rx.time_since_epoch().count(), std::memory_order_relaxed);
      }
      c.reader.Append(buf, static_cast<size_t>(r));
      if (static_cast<size_t>(r) < sizeof(buf)) break;
      continue;
    }
    if (r == 0) {
      CloseConn(id, "peer closed the connection", c.accepted);
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    CloseConn(id, std::string("receive failed: ") + std::strerror(errno), false);
    return;
  }
  for (;;) {
    wire::Msg m;
    bool has = false;
    Status s = c.reader.Next(m, has);
    if (s.ok() && has) s = HandleMessage(c, m);
    if (!s.ok()) {
      CloseConn(id, "protocol error: " + s.message(), false);
      return;
    }
    if (!has || conns_.count(id) == 0) return;
  }
}

void Hixl::Impl::Send(Conn& c, const wire::Msg& m) {
  c.last_tx = net::Clock::now();
  SendFrame(*c.tx, wire::EncodeFrame(m));  // a socket error shows up as a read error next
}

bool Hixl::Impl::SendFrame(Tx& tx, std::vector<uint8_t> frame) {
  std::lock_guard<std::mutex> lock(tx.mu);
  if (tx.fd < 0) return false;
  tx.outq.push_back(std::move(frame));
  if (tx.outq.size() == 1) FlushLocked(tx);
  return true;
}

bool Hixl::Impl::FlushLocked(Tx& tx) {
  while (!tx.outq.empty()) {
    auto& f = tx.outq.front();
    ssize_t r =
        ::send(tx.fd, f.data() + tx.out_off, f.size() - tx.out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!tx.out_armed && tx.loop_id != 0) {
          loop_.ModifyFd(tx.fd, tx.loop_id, EPOLLIN | EPOLLRDHUP | EPOLLOUT);
          tx.out_armed = true;
        }
        return true;
      }
      return false;
    }
    tx.out_off += static_cast<size_t>(r);
    if (tx.out_off == f.size()) {
      tx.outq.pop_front();
      tx.out_off = 0;
    }
  }
  if (tx.out_armed) {
    loop_.ModifyFd(tx.fd, tx.loop_id, EPOLLIN | EPOLLRDHUP);
    tx.out_armed = false;
  }
  return true;
}

void Hixl::Impl::CloseTx(Tx& tx) {
  std::lock_guard<std::mutex> lock(tx.mu);
  tx.fd = -1;  // the Conn owns and closes the descriptor itself
  tx.loop_id = 0;
  tx.outq.clear();
}

Status Hixl::Impl::HandleHello(Conn& c, const wire::Msg& m) {
  control::Hello h;
  if (Status s = control::DecodeHello(m, h); !s.ok()) {
    Send(c, control::EncodeReject(s.message()));
    return s;
  }
  if (opts_.auth_secret.empty()) {
    SendWelcome(c, h);  // an offered nonce is ignored: the initiator decides
    return Status::Ok();
  }
  if (!h.has_auth) {
    if (!opts_.auth_required) {
      HIXL_LOG(INFO) << "linking " << h.engine << " without authentication (AuthRequired=0)";
      SendWelcome(c, h);
      return Status::Ok();
    }
    const std::string why = "this engine requires authentication (AuthSecret) and " + h.engine +
                            " offered none";
    Send(c, control::EncodeReject(why));
    return Status::Failed(why);
  }
  control::Challenge ch;
  if (Status s = auth::RandomNonce(ch.sn); !s.ok()) {
    Send(c, control::EncodeReject(s.message()));
    return s;
  }
  ch.proof = auth::TargetProof(opts_.auth_secret, h.cn, ch.sn);
  c.sn = ch.sn;
  c.hello = std::move(h);
  c.awaiting_auth = true;
  Send(c, control::EncodeChallenge(ch));
  return Status::Ok();
}

Status Hixl::Impl::HandleAuth(Conn& c, const wire::Msg& m) {
  auth::Tag proof{};
  if (Status s = control::DecodeAuth(m, proof); !s.ok()) {
    Send(c, control::EncodeReject(s.message()));
    return s;
  }
  const auth::Tag want = auth::InitiatorProof(opts_.auth_secret, c.hello.cn, c.sn);
  if (!auth::TagEquals(want, proof.data(), proof.size())) {
    const std::string why =
        "authentication failed: " + c.hello.engine + "'s proof does not match this engine's secret";
    Send(c, control::EncodeReject("authentication failed: the proof does not match the target's "
                                  "secret (AuthSecret differs)"));
    HIXL_LOG(WARN) << why;
    return Status::Failed(why);
  }
  c.awaiting_auth = false;
  c.authenticated = true;
  c.link_key = auth::LinkKey(opts_.auth_secret, c.hello.cn, c.sn);
  const control::Hello h = c.hello;
  SendWelcome(c, h);
  return Status::Ok();
}

void Hixl::Impl::SendWelcome(Conn& c, const control::Hello& h) {
  control::Welcome w;
  w.engine = local_engine_;
  w.generation = generation_;
  w.host = host::HostIdentity();
  w.pid = getpid();
  w.hb_ms = static_cast<uint32_t>(opts_.hb_interval_ms);
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    w.info = local_info_;
  }
  c.hb_ms = LinkHeartbeatMs(h.hb_ms);
  TightenTick(c.hb_ms);
  for (const auto& r : regions_.Snapshot()) w.regions.push_back(ToDesc(r));
  // Open before any transport can attach a ring to it.
  inbox_.OpenConn(c.id, h.engine);
  for (auto& t : transports_) {
    wire::Msg info;
    t->DescribeForPeer(c.id, c.authenticated ? &c.link_key : nullptr, info);
    if (!info.is_null()) w.transports[t->name()] = std::move(info);
  }
  c.established = true;
  c.peer_name = h.engine;
  c.peer_view = transport::LostPeer{h.host == host::HostIdentity(), h.link};
  c.peer_pid = h.pid;
  {
    // Linked again: it noticed the old link's loss, which ended its writes.
    std::lock_guard<std::mutex> lock(dereg_mu_);
    dropped_.erase(h.engine);
  }
  Send(c, control::EncodeWelcome(w));
  HIXL_LOG(INFO) << "accepted link from " << h.engine << " (pid " << h.pid << ")"
                 << (c.authenticated ? ", authenticated" : "");
}

Status Hixl::Impl::HandleMessage(Conn& c, const wire::Msg& m) {
  const std::string type = control::TypeOf(m);
  if (c.accepted && !c.established) {
    // Nothing but the handshake is accepted before it completed.
    if (c.awaiting_auth) {
      if (type != "auth") return Status::ParamInvalid("expected auth, got '" + type + "'");
      return HandleAuth(c, m);
    }
    if (c.probed) return Status::ParamInvalid("nothing is accepted after a probe");
    if (type == "probe") {
      // Who listens here: answered without a link; the prober closes.
      control::Ident id;
      id.engine = local_engine_;
      id.generation = generation_;
      c.probed = true;
      Send(c, control::EncodeIdent(id));
      return Status::Ok();
    }
    if (type != "hello") return Status::ParamInvalid("expected hello, got '" + type + "'");
    return HandleHello(c, m);
  }
  if (type == "hb") return Status::Ok();  // arrival itself refreshed last_rx
  if (type == "bye") {
    CloseConn(c.id, "peer said goodbye", true);
    return Status::Ok();
  }
  if (c.accepted) {
    if (type == "notify") return HandleNotify(c, m);
    if (type == "lfence") {
      uint64_t seq = 0;
      if (Status s = control::DecodeLaneFenceSeq(m, seq); !s.ok()) return s;
      for (auto& t : transports_) t->FenceLanes(c.id);
      Send(c, control::EncodeLaneFenced(seq));
      return Status::Ok();
    }
    if (type == "rdel_ack") {
      uint64_t seq = 0;
      if (Status s = control::DecodeRegionDelAck(m, seq); !s.ok()) return s;
      std::lock_guard<std::mutex> lock(dereg_mu_);
      if (auto it = dereg_waits_.find(seq); it != dereg_waits_.end())
        it->second.waiting.erase(c.id);
      dereg_cv_.notify_all();
      return Status::Ok();
    }
    return Status::ParamInvalid("unexpected message '" + type + "' from an initiator");
  }
  // Outbound connection: messages from a peer we transfer to.
  if (type == "radd") {
    std::vector<control::RegionDesc> regions;
    if (Status s = control::DecodeRegionAdd(m, regions); !s.ok()) return s;
    AddRemoteRegions(*c.peer, regions);
    return Status::Ok();
  }
  if (type == "lfenced") {
    uint64_t seq = 0;
    if (Status s = control::DecodeLaneFenceSeq(m, seq); !s.ok()) return s;
    std::function<void(Status)> done;
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      auto it = pending_notifies_.find(seq);
      if (it == pending_notifies_.end() || it->second.tx != c.tx || !it->second.fence) {
        return Status::Ok();  // already ended (bound passed)
      }
      done = std::move(it->second.done);
      pending_notifies_.erase(it);
    }
    done(Status::Ok());
    return Status::Ok();
  }
  if (type == "nack") {
    uint64_t seq = 0;
    uint32_t code = 0;
    std::string why;
    if (Status s = control::DecodeNotifyAck(m, seq, code, why); !s.ok()) return s;
    std::function<void(Status)> done;
    std::function<void()> answered;
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      auto it = pending_notifies_.find(seq);
      if (it == pending_notifies_.end() || it->second.tx != c.tx || it->second.fence) {
        return Status::Ok();
      }
      done = std::move(it->second.done);  // empty when it already reported TIMEOUT
      answered = std::move(it->second.answered);
      pending_notifies_.erase(it);
    }
    if (answered) answered();
    if (done) {
      done(code == 0 ? Status::Ok()
                     : Status(static_cast<StatusCode>(code),
                              c.peer_name + " refused the notification: " + why));
    }
    return Status::Ok();
  }
  if (type == "rdel") {
    uint64_t seq = 0;
    std::vector<uint64_t> ids;
    if (Status s = control::DecodeRegionDel(m, seq, ids); !s.ok()) return s;
    Revoke r{c.id, seq, {}};
    for (auto& region : c.peer->regions.Remove(ids)) r.regions.emplace_back(region);
    revokes_.push_back(std::move(r));  // the table's references are gone here
    CheckRevokes();
    return Status::Ok();
  }
  return Status::ParamInvalid("unexpected message '" + type + "' from a target");
}

Status Hixl::Impl::HandleNotify(Conn& c, const wire::Msg& m) {
  uint64_t seq = 0;
  NotifyDesc d;
  if (Status s = control::DecodeNotify(m, seq, d.name, d.notify_msg); !s.ok()) return s;
  d.from = c.peer_name;
  uint32_t code = 0;
  std::string why;
  if (!inbox_.Push(c.id, std::move(d), why)) {
    code = static_cast<uint32_t>(StatusCode::kResourceExhausted);
  }
  Send(c, control::EncodeNotifyAck(seq, code, why));
  return Status::Ok();
}

void Hixl::Impl::TightenTick(int hb_ms) {
  // The tick sends heartbeats and checks silence: a few per interval.
  int want = std::clamp(hb_ms / 4, 2, kIdleTickMs);
  if (want >= idle_tick_ms_) return;
  idle_tick_ms_ = want;
  if (revokes_.empty()) loop_.SetTickInterval(idle_tick_ms_);
}

void Hixl::Impl::CheckRevokes() {
  for (auto it = revokes_.begin(); it != revokes_.end();) {
    bool idle = true;
    for (const auto& r : it->regions) idle = idle && r.expired();
    auto conn = conns_.find(it->conn_id);
    if (conn == conns_.end()) {
      it = revokes_.erase(it);
    } else if (idle) {
      // The last transfer's release of a region (its reference count's
      // decrement) happens before the acknowledgement. (ThreadSanitizer does
      // not model fences; nothing it tracks depends on this one.)
#if !defined(__SANITIZE_THREAD__)
      std::atomic_thread_fence(std::memory_order_acquire);
#endif
      Send(*conn->second, control::EncodeRegionDelAck(it->seq));
      it = revokes_.erase(it);
    } else {
      ++it;
    }
  }
  loop_.SetTickInterval(revokes_.empty() ? idle_tick_ms_ : kBusyTickMs);
}

void Hixl::Impl::OnTick() {
  if (!revokes_.empty()) CheckRevokes();
  auto now = net::Clock::now();
  std::vector<std::pair<uint64_t, std::string>> drop;
  for (auto& [id, c] : conns_) {
    if (!c->established) {
      if (c->accepted && now >= c->hello_deadline)
        drop.emplace_back(id, "no handshake before the deadline");
      continue;
    }
    const auto interval = std::chrono::milliseconds(c->hb_ms);
    if (now - c->last_rx >= interval * opts_.hb_misses) {
      drop.emplace_back(id, "nothing heard for " + std::to_string(c->hb_ms * opts_.hb_misses) +
                                " ms (peer dead or hung)");
      continue;
    }
    if (c->peer && c->peer->alive.load(std::memory_order_acquire)) {
      c->peer->channel->Poll();
      // A link whose data connection broke cannot move bytes: it is lost
      // (once the target confirmed the broken lanes are fenced).
      if (Status h = c->peer->channel->Health(); !h.ok() && !FencePending(c->tx.get())) {
        drop.emplace_back(id, "its data connection failed (" + h.message() + ")");
        continue;
      }
    }
    if (now - c->last_tx >= interval) Send(*c, control::EncodeHeartbeat());
  }
  for (auto& [id, why] : drop) CloseConn(id, why, false);
  // Notifications nobody answered in time.
  std::vector<std::function<void(Status)>> late;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    for (auto it = pending_notifies_.begin(); it != pending_notifies_.end();) {
      if (now < it->second.deadline) {
        ++it;
        continue;
      }
      late.push_back(std::move(it->second.done));
      if (it->second.answered) {
        // Reported now; kept until answered, so nothing overtakes its frame.
        it->second.done = nullptr;
        it->second.deadline = net::Deadline::max();
        ++it;
      } else {
        it = pending_notifies_.erase(it);
      }
    }
  }
  for (auto& f : late) f(Status::Timeout("no answer to the notification before the deadline"));
  // Async requests past their deadline stop (and end TIMEOUT once stopped).
  std::vector<std::shared_ptr<transport::Transfer>> expired;
  {
    std::lock_guard<std::mutex> lock(req_mu_);
    if (deadline_reqs_ > 0) {
      for (auto& [id, t] : reqs_) {
        if (t->deadline != net::Deadline::max() && now >= t->deadline && !t->Done() &&
            !t->StopRequested()) {
          expired.push_back(t);
        }
      }
    }
  }
  for (auto& t : expired) t->RequestStop(Status::Timeout("request deadline passed"));
}

void Hixl::Impl::CloseConn(uint64_t id, const std::string& why, bool quiet) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  std::unique_ptr<Conn> c = std::move(it->second);
  conns_.erase(it);
  CloseTx(*c->tx);  // no sender uses the descriptor (or its registration) any more
  loop_.Remove(c->loop_id);
  if (quiet || !initialized_.load(std::memory_order_acquire)) {  // (finalizing: expected)
    HIXL_LOG(INFO) << "link " << (c->peer_name.empty() ? "(unnamed)" : c->peer_name)
                   << " closed: " << why;
  } else {
    HIXL_LOG(WARN) << "dropping link "
                   << (c->peer_name.empty() ? "(before handshake)" : c->peer_name) << ": " << why;
  }
  if (c->accepted) {
    for (auto& t : transports_) t->ForgetPeer(id);  // no ring is attached to it after this
    inbox_.CloseConn(id);                           // what its ring holds is still delivered
    std::lock_guard<std::mutex> lock(dereg_mu_);
    for (auto& [seq, w] : dereg_waits_) w.waiting.erase(id);
    // A link dropped here (hung, silent, misbehaving) may still have bytes
    // on their way; one its peer closed (goodbye, exit) has none to send.
    if (!quiet && c->established) dropped_[c->peer_name] = DroppedPeer{c->peer_view, c->peer_pid};
    dereg_cv_.notify_all();
  } else if (c->peer) {
    // The peer is gone, hung or misbehaved: its metadata goes, its transfers
    // stop. Nothing is awaited (this thread serves every link); what is still
    // on the wire is abandoned and the peer drops it.
    FailPendingNotifies(c->tx.get(),
                        Status::NotConnected("link to " + c->peer_name + " lost: " + why));
    c->peer->alive.store(false);
    c->peer->channel->Close(net::Clock::now());
    std::lock_guard<std::mutex> lock(peers_mu_);
    auto p = peers_.find(c->peer->name);
    if (p != peers_.end() && p->second == c->peer) peers_.erase(p);
  }
}

}  // namespace hixl
