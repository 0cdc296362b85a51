// Hixl::Impl's links: the initiator's side of the handshake (with
// authentication), turning a welcome into a peer and its transport channel,
// Connect / ConnectAsync / Disconnect, the peer limit (MaxPeers eviction),
// and looking peers up for transfers and notifications.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>

#include "common/host.h"
#include "common/log.h"
#include "engine/engine.h"
#include "transport/device_lanes.h"

namespace hixl {

namespace {

// A logical clock for least-recently-used order (cheaper than reading the
// time on every transfer, and never ties).
std::atomic<int64_t> g_use_clock{0};
int64_t UseTick() { return g_use_clock.fetch_add(1, std::memory_order_relaxed) + 1; }

// Marks p as used now. A peer that took the last tick is the most recently
// used already: a stream to one peer does not touch the shared clock.
template <typename P>
void Touch(P& p) {
  if (p.last_used.load(std::memory_order_relaxed) != g_use_clock.load(std::memory_order_relaxed)) {
    p.last_used.store(UseTick(), std::memory_order_relaxed);
  }
}

std::atomic<uint64_t> g_engine_serial{0};

// Canonical "ip:port" of a remote engine string, or the string itself.
std::string PeerKey(const std::string& remote) {
  net::HostPort hp;
  if (net::ParseHostPort(remote, hp).ok() && hp.port > 0) return hp.ToString();
  return remote;
}

}  // namespace

// ---------------------------------------------------------------- links

namespace {
// Reads one control message from a blocking socket.
Status ReadMessage(int fd, net::Deadline deadline, wire::Msg& m) {
  uint8_t hdr[wire::kFrameHeaderSize];
  uint32_t len = 0;
  if (Status s = net::ReadFull(fd, hdr, sizeof(hdr), deadline); !s.ok()) return s;
  if (Status s = wire::DecodeFrameHeader(hdr, len); !s.ok()) return s;
  std::vector<uint8_t> body(len);
  if (Status s = net::ReadFull(fd, body.data(), len, deadline); !s.ok()) return s;
  return wire::DecodeBody(body.data(), len, m);
}

Status WriteMessage(int fd, net::Deadline deadline, const wire::Msg& m) {
  auto frame = wire::EncodeFrame(m);
  return net::WriteFull(fd, frame.data(), frame.size(), deadline);
}
}  // namespace

Status Hixl::Impl::Handshake(const net::HostPort& to, net::Deadline deadline, net::Fd& fd,
                             control::Welcome& welcome, std::optional<auth::Key>* link_key) {
  if (Status s = net::TcpConnect(to, deadline, fd); !s.ok()) return s;
  control::Hello h;
  h.engine = local_engine_;
  h.generation = generation_;
  h.host = host::HostIdentity();
  h.pid = getpid();
  h.hb_ms = static_cast<uint32_t>(opts_.hb_interval_ms);
  h.link = opts_.link;
  const bool have_secret = !opts_.auth_secret.empty();
  if (have_secret) {
    if (Status s = auth::RandomNonce(h.cn); !s.ok()) return s;
    h.has_auth = true;
  }
  if (Status s = WriteMessage(fd.get(), deadline, control::EncodeHello(h)); !s.ok()) return s;
  wire::Msg m;
  if (Status s = ReadMessage(fd.get(), deadline, m); !s.ok()) return s;
  if (control::TypeOf(m) == "challenge") {
    if (!have_secret) return Status::Failed("the peer sent a challenge this engine never asked for");
    control::Challenge ch;
    if (Status s = control::DecodeChallenge(m, ch); !s.ok()) return s;
    const auth::Tag want = auth::TargetProof(opts_.auth_secret, h.cn, ch.sn);
    if (!auth::TagEquals(want, ch.proof.data(), ch.proof.size())) {
      return Status::Failed(
          "authentication failed: the target's proof does not match this engine's secret "
          "(AuthSecret differs, or it is not the engine it claims to be)");
    }
    const auth::Tag mine = auth::InitiatorProof(opts_.auth_secret, h.cn, ch.sn);
    if (Status s = WriteMessage(fd.get(), deadline, control::EncodeAuth(mine)); !s.ok()) return s;
    if (Status s = ReadMessage(fd.get(), deadline, m); !s.ok()) return s;
    if (control::TypeOf(m) == "welcome") *link_key = auth::LinkKey(opts_.auth_secret, h.cn, ch.sn);
  } else if (control::TypeOf(m) == "welcome" && have_secret && opts_.auth_required) {
    return Status::Failed(
        "the target does not authenticate (it has no AuthSecret) and this engine requires it "
        "(AuthRequired)");
  }
  if (control::TypeOf(m) == "reject") {
    return Status::Failed("peer refused the link: " + control::DecodeRejectReason(m));
  }
  return control::DecodeWelcome(m, welcome);
}

Status Hixl::Impl::MakePeer(const std::string& name, const std::string& address,
                            const control::Welcome& w, const std::optional<auth::Key>& link_key,
                            net::Deadline deadline, std::shared_ptr<Peer>& out) {
  auto peer = std::make_shared<Peer>();
  peer->name = name;
  peer->generation = w.generation;
  peer->pid = w.pid;
  peer->info = w.info;
  peer->authenticated = link_key.has_value();
  peer->last_rx_ns.store(net::Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  transport::PeerInfo info;
  info.engine = name;
  info.address = address;
  info.generation = w.generation;
  info.host_id = w.host;
  info.pid = w.pid;
  info.link_key = link_key ? &*link_key : nullptr;
  info.fence = [this, weak = std::weak_ptr<Peer>(peer)](std::function<void()> done) {
    PostLaneFence(weak.lock(), std::move(done));
  };
  std::string reasons;
  info.chosen = opts_.link != LinkType::AUTO;
  for (auto& t : transports_) {
    if (opts_.link != LinkType::AUTO && t->link_type() != opts_.link) continue;
    auto it = w.transports.find(t->name());
    info.info = it == w.transports.end() ? nullptr : &*it;
    std::string why;
    if (!t->CanReach(info, why)) {
      reasons += (reasons.empty() ? "" : "; ") + why;
      continue;
    }
    Status s = t->Connect(info, deadline, peer->channel);
    if (s.ok()) {
      peer->channel_transport = t->name();
      if (!t->ReachesDeviceMemory()) PairWithDeviceLanes(*peer, info, w, link_key);
      break;
    }
    reasons += (reasons.empty() ? "" : "; ") + s.message();
  }
  if (!peer->channel) {
    if (reasons.empty() && !unavailable_.empty()) reasons = unavailable_;
    return Status::Unsupported("no transport can reach " + name + " (LinkType " +
                               LinkTypeName(opts_.link) +
                               "): " + (reasons.empty() ? "no transport available" : reasons));
  }
  AddRemoteRegions(*peer, w.regions);
  out = std::move(peer);
  return Status::Ok();
}

void Hixl::Impl::PairWithDeviceLanes(Peer& peer, const transport::PeerInfo& info,
                                      const control::Welcome& w,
                                      const std::optional<auth::Key>& link_key) {
  transport::Transport* tcp = nullptr;
  for (auto& t : transports_) {
    if (t->link_type() == LinkType::TCP) tcp = t.get();
  }
  auto it = w.transports.find("tcp");
  if (tcp == nullptr || it == w.transports.end()) return;  // device transfers are refused
  transport::PeerInfo p = info;
  auto section = std::make_shared<const wire::Msg>(*it);
  auto key = link_key ? std::make_shared<const auth::Key>(*link_key) : nullptr;
  p.info = nullptr;
  p.link_key = nullptr;
  p.chosen = true;
  std::string why;
  {
    transport::PeerInfo probe = p;
    probe.info = section.get();
    if (!tcp->CanReach(probe, why)) return;
  }
  // The tcp transport outlives every channel: Finalize closes the peers'
  // channels (no opening after that) before it stops the transports.
  auto open = [tcp, p, section, key](net::Deadline deadline,
                                     std::unique_ptr<transport::Channel>& out) {
    transport::PeerInfo q = p;
    q.info = section.get();
    q.link_key = key.get();
    return tcp->Connect(q, deadline, out);
  };
  peer.channel = std::make_unique<transport::DeviceLanesChannel>(
      std::move(peer.channel), LinkType::TCP, std::move(open), peer.name,
      std::chrono::milliseconds(opts_.handshake_timeout_ms));
}

void Hixl::Impl::AddRemoteRegions(Peer& peer, const std::vector<control::RegionDesc>& regions) {
  for (const auto& d : regions) {
    if (peer.regions.Contains(d.id)) continue;
    auto r = std::make_shared<memory::RemoteRegion>(d.id, d.addr, d.len, d.perms, d.shareable);
    r->device = d.device;
    const char* tname = peer.channel_transport;
    auto it = tname == nullptr ? d.tp.end() : d.tp.find(tname);
    if (Status s = peer.channel->PrepareRegion(*r, it == d.tp.end() ? nullptr : &*it); !s.ok()) {
      HIXL_LOG(WARN) << "region " << d.id << " of " << peer.name
                     << " is unusable: " << s.ToString();
      if (!r->device) continue;
      // Kept, unreachable, so that a transfer into it is told why.
      r->unreachable = s.message();
      r->mapped = nullptr;
    }
    peer.regions.Insert(std::move(r));
  }
}

std::shared_ptr<const void> Hixl::Impl::ActiveToken(const std::shared_ptr<Peer>& p) {
  return std::shared_ptr<const void>(p.get(), [p](const void*) {
    Touch(*p);
    p->active.fetch_sub(1, std::memory_order_acq_rel);
  });
}

Status Hixl::Impl::MakeRoomLocked(std::vector<std::shared_ptr<Peer>>& evicted) {
  if (opts_.max_peers == 0 || peers_.size() + connecting_.size() < opts_.max_peers) {
    return Status::Ok();
  }
  std::vector<std::shared_ptr<Peer>> idle;
  for (const auto& [name, p] : peers_) {
    if (p->active.load(std::memory_order_acquire) == 0) idle.push_back(p);
  }
  std::sort(idle.begin(), idle.end(), [](const auto& a, const auto& b) {
    return a->last_used.load(std::memory_order_relaxed) <
           b->last_used.load(std::memory_order_relaxed);
  });
  for (auto& p : idle) {
    if (peers_.size() + connecting_.size() <= opts_.low_water) break;
    // A thread may be taking p from its peer cache (AcquirePeer) without
    // peers_mu_: it counts itself active, then looks at evicting.
    p->evicting.store(true, std::memory_order_seq_cst);
    if (p->active.load(std::memory_order_seq_cst) != 0) {
      p->evicting.store(false, std::memory_order_seq_cst);
      continue;
    }
    peers_.erase(p->name);
    p->alive.store(false, std::memory_order_release);
    evicted.push_back(std::move(p));
  }
  if (peers_.size() + connecting_.size() >= opts_.max_peers) {
    return Status::ResourceExhausted("MaxPeers (" + std::to_string(opts_.max_peers) +
                                     ") links exist and every one has transfers in flight");
  }
  return Status::Ok();
}

void Hixl::Impl::DropPeer(const std::shared_ptr<Peer>& peer, net::Deadline drain_until,
                          const std::string& why) {
  peer->alive.store(false, std::memory_order_release);
  peer->channel->Close(drain_until);
  loop_.Post([this, peer, why] {
    uint64_t id = peer->conn_id.load(std::memory_order_acquire);
    auto it = conns_.find(id);
    if (it != conns_.end() && it->second->peer == peer) {
      Send(*it->second, control::EncodeBye());
      CloseConn(id, why, true);
    }
  });
}

Status Hixl::Impl::ResolveRemote(const std::string& remote, const char* what, net::HostPort& hp,
                                 std::string& key, uint64_t& want_gen) {
  want_gen = 0;
  Status parsed = net::ParseHostPort(remote, hp);
  if (parsed.ok() && hp.port > 0) {
    key = hp.ToString();
    return Status::Ok();
  }
  if (!naming_.enabled()) {
    if (!parsed.ok()) {
      return Status::ParamInvalid(std::string(what) + ": '" + remote +
                                  "' is not an ip:port address (" + parsed.message() +
                                  "; engine names need the MetadataServer option)");
    }
    return Status::ParamInvalid(std::string(what) + ": '" + remote + "' names no port");
  }
  std::string address;
  if (Status s = naming_.Resolve(remote, address, want_gen); !s.ok()) {
    return Status(s.code(), std::string(what) + ": " + s.message());
  }
  if (Status s = net::ParseHostPort(address, hp); !s.ok() || hp.port <= 0) {
    return Status::Failed(std::string(what) + ": the registry entry of '" + remote +
                          "' has an unusable address '" + address + "'");
  }
  key = remote;
  return Status::Ok();
}

Status Hixl::Impl::Connect(const std::string& remote, int32_t timeout_ms) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  if (timeout_ms <= 0) return Status::ParamInvalid("Connect: timeout_ms must be > 0");
  net::HostPort hp;
  std::string key;
  uint64_t want_gen = 0;
  if (Status s = ResolveRemote(remote, "Connect", hp, key, want_gen); !s.ok()) return s;
  std::vector<std::shared_ptr<Peer>> evicted;
  Status room;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    if (auto it = peers_.find(key);
        it != peers_.end() && !it->second->alive.load(std::memory_order_acquire)) {
      peers_.erase(it);  // a link being torn down (its peer is gone): make a new one
    }
    if (peers_.count(key) != 0 || connecting_.count(key) != 0) {
      return Status::AlreadyConnected("already connected (or connecting) to " + key);
    }
    room = MakeRoomLocked(evicted);
    if (room.ok()) connecting_.insert(key);
  }
  for (auto& p : evicted) {
    HIXL_LOG(INFO) << "evicting idle link to " << p->name << " (MaxPeers " << opts_.max_peers
                   << ")";
    DropPeer(p, net::Clock::now(), "evicted (idle, MaxPeers reached)");
  }
  if (!room.ok()) return Status(room.code(), "Connect to " + key + ": " + room.message());
  auto deadline = net::DeadlineAfterMs(timeout_ms);
  net::Fd fd;
  control::Welcome w;
  std::shared_ptr<Peer> peer;
  std::optional<auth::Key> link_key;
  Status s = Handshake(hp, deadline, fd, w, &link_key);
  if (!s.ok()) {
    s = Status(s.code() == StatusCode::kTimeout ? StatusCode::kTimeout : StatusCode::kFailed,
               "Connect to " + key + ": handshake failed: " + s.message());
  } else if (want_gen != 0 && w.generation != want_gen) {
    // Never link to a wrong engine: the registry's entry names another
    // incarnation than the one answering at its address.
    s = Status::Failed("Connect to " + key + ": the engine at " + hp.ToString() +
                       " has generation " + std::to_string(w.generation) +
                       ", the registry names generation " + std::to_string(want_gen) +
                       " (a stale entry, or another engine now holds that address)");
  } else {
    s = MakePeer(key, hp.host, w, link_key, deadline, peer);
  }
  if (s.ok()) s = net::SetNonBlocking(fd.get(), true);
  std::lock_guard<std::mutex> lock(peers_mu_);
  connecting_.erase(key);
  if (!s.ok()) return s;
  auto c = std::make_unique<Conn>();
  c->fd = std::move(fd);
  c->tx->fd = c->fd.get();
  peer->tx = c->tx;  // before the peer is published: notifications go out on it directly
  c->established = true;
  c->peer_name = key;
  c->peer = peer;
  c->hb_ms = LinkHeartbeatMs(w.hb_ms);
  peer->hb_ms.store(c->hb_ms, std::memory_order_relaxed);
  peer->last_used.store(UseTick(), std::memory_order_relaxed);
  // The loop owns the connection from here; conn ids are loop-assigned.
  auto holder = std::make_shared<std::unique_ptr<Conn>>(std::move(c));
  if (!loop_.Post([this, holder] { AddConn(std::move(*holder)); })) {
    return Status::Failed("engine is shutting down");
  }
  peers_[key] = peer;
  HIXL_LOG(INFO) << "connected to " << key << " over " << LinkTypeName(peer->channel->link_type())
                 << ", " << peer->regions.size() << " regions (generation " << w.generation << ")"
                 << (link_key ? ", authenticated" : "");
  return Status::Ok();
}

Status Hixl::Impl::ConnectAsync(const std::string& remote, int32_t timeout_ms) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  if (timeout_ms <= 0) return Status::ParamInvalid("ConnectAsync: timeout_ms must be > 0");
  net::HostPort hp;
  std::string key;
  uint64_t want_gen = 0;
  if (Status s = ResolveRemote(remote, "ConnectAsync", hp, key, want_gen); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> plock(peers_mu_);
    if (peers_.count(key) != 0 || connecting_.count(key) != 0) {
      return Status::AlreadyConnected("already connected (or connecting) to " + key);
    }
  }
  std::lock_guard<std::mutex> lock(connect_mu_);
  auto it = attempts_.find(key);
  if (it != attempts_.end() && it->second.state == ConnectStatus::CONNECTING) {
    return Status::AlreadyConnected("a connect to " + key + " is under way");
  }
  // Threads of attempts that ended are joined here (and the rest by Finalize).
  for (auto t = connect_threads_.begin(); t != connect_threads_.end();) {
    if (t->done->load(std::memory_order_acquire)) {
      t->thread.join();
      t = connect_threads_.erase(t);
    } else {
      ++t;
    }
  }
  attempts_[key] = ConnectAttempt{};
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread th([this, key, timeout_ms, done] {
    Status s = Connect(key, timeout_ms);
    std::lock_guard<std::mutex> l(connect_mu_);
    auto a = attempts_.find(key);
    if (a != attempts_.end()) {
      if (s.ok()) {
        attempts_.erase(a);  // the link itself tells from now on
      } else {
        a->second.state = ConnectStatus::FAILED;
        a->second.reason = s;
      }
    }
    done->store(true, std::memory_order_release);
  });
  connect_threads_.push_back(ConnectThread{std::move(th), std::move(done)});
  return Status::Ok();
}

Status Hixl::Impl::GetConnectStatus(const std::string& remote, ConnectStatus& status,
                                    Status* reason) const {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  const std::string key = PeerKey(remote);
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    auto it = peers_.find(key);
    if (it != peers_.end() && it->second->alive.load(std::memory_order_acquire)) {
      status = ConnectStatus::CONNECTED;
      if (reason) *reason = Status::Ok();
      return Status::Ok();
    }
  }
  std::lock_guard<std::mutex> lock(connect_mu_);
  auto it = attempts_.find(key);
  status = it == attempts_.end() ? ConnectStatus::NOT_CONNECTED : it->second.state;
  if (reason) *reason = it == attempts_.end() ? Status::Ok() : it->second.reason;
  return Status::Ok();
}

Status Hixl::Impl::Disconnect(const std::string& remote, int32_t timeout_ms) {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  if (timeout_ms < 0) return Status::ParamInvalid("Disconnect: timeout_ms must be >= 0");
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    auto it = peers_.find(PeerKey(remote));
    if (it == peers_.end()) return Status::NotConnected("not connected to " + remote);
    peer = it->second;
    peers_.erase(it);
  }
  DropPeer(peer, net::DeadlineAfterMs(timeout_ms), "disconnected");
  return Status::Ok();
}

Status Hixl::Impl::ListEngines(std::vector<EngineRecord>& out) const {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  return naming_.List(out);
}

Status Hixl::Impl::GetLinkType(const std::string& remote, LinkType& type) const {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  auto p = FindPeer(remote);
  if (!p) return Status::NotConnected("not connected to " + remote);
  type = p->channel->link_type();
  return Status::Ok();
}

Status Hixl::Impl::SetLocalInfo(const std::string& info) {
  if (info.size() > kMaxLocalInfoLen) {
    return Status::ParamInvalid("SetLocalInfo: " + std::to_string(info.size()) +
                                " bytes, at most " + std::to_string(kMaxLocalInfoLen));
  }
  std::lock_guard<std::mutex> lock(info_mu_);
  local_info_ = info;
  return Status::Ok();
}

Status Hixl::Impl::GetPeerInfo(const std::string& remote, std::string& info) const {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  auto p = FindPeer(remote);
  if (!p) return Status::NotConnected("not connected to " + remote);
  info = p->info;
  return Status::Ok();
}

Status Hixl::Impl::GetPeerGeneration(const std::string& remote, uint64_t& generation) const {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  auto p = FindPeer(remote);
  if (!p) return Status::NotConnected("not connected to " + remote);
  generation = p->generation;
  return Status::Ok();
}

Status Hixl::Impl::GetTransports(std::vector<TransportInfo>& out) const {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  out = transport_infos_;
  return Status::Ok();
}

Status Hixl::Impl::GetPeerStats(const std::string& remote, PeerStats& out) const {
  if (Status s = CheckInitialized(); !s.ok()) return s;
  auto p = FindPeer(remote);
  if (!p) return Status::NotConnected("not connected to " + remote);
  PeerStats st;
  st.generation = p->generation;
  st.pid = p->pid;
  st.link = p->channel->link_type();
  st.authenticated = p->authenticated;
  for (const auto& r : p->regions.Snapshot()) {
    ++st.region_count;
    st.region_bytes += r->len;
    if (p->authenticated) st.regions.push_back(PeerRegionInfo{r->addr, r->len, r->perms});
  }
  st.heartbeat_ms = p->hb_ms.load(std::memory_order_relaxed);
  const int64_t rx = p->last_rx_ns.load(std::memory_order_relaxed);
  st.last_heard_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         net::Clock::now() - net::Clock::time_point(net::Clock::duration(rx)))
                         .count();
  st.in_flight = p->active.load(std::memory_order_relaxed);
  out = std::move(st);
  return Status::Ok();
}

std::shared_ptr<Hixl::Impl::Peer> Hixl::Impl::FindPeer(const std::string& remote) const {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto it = peers_.find(PeerKey(remote));
  if (it == peers_.end() || !it->second->alive.load(std::memory_order_acquire)) return nullptr;
  return it->second;
}

uint64_t Hixl::Impl::NextSerial() {
  return g_engine_serial.fetch_add(1, std::memory_order_relaxed) + 1;
}

Hixl::Impl::PeerCacheEntry* Hixl::Impl::ThreadPeerCache() {
  thread_local std::array<PeerCacheEntry, kPeerCacheSize> cache;
  return cache.data();
}

Status Hixl::Impl::AcquirePeer(const std::string& remote, net::Deadline deadline,
                               std::shared_ptr<Peer>& out, memory::RegionHint** hint) {
  PeerCacheEntry* cache = ThreadPeerCache();
  PeerCacheEntry* entry = nullptr;
  for (size_t i = 0; i < kPeerCacheSize; ++i) {
    PeerCacheEntry& e = cache[i];
    if (e.engine == this && e.serial == serial_ && e.remote == remote) {
      entry = &e;
      break;
    }
  }
  if (entry != nullptr) {
    // The thread's own recent peer: counted active first, then checked, so
    // that MaxPeers eviction (which marks evicting, then looks at active)
    // either sees this transfer or is seen by it.
    if (std::shared_ptr<Peer> p = entry->peer.lock()) {
      p->active.fetch_add(1, std::memory_order_seq_cst);
      if (p->alive.load(std::memory_order_seq_cst) &&
          !p->evicting.load(std::memory_order_seq_cst)) {
        Touch(*p);
        out = std::move(p);
        if (hint != nullptr) *hint = &entry->region;
        return Status::Ok();
      }
      p->active.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
  // A live peer under key: counted as active (released with the transfer).
  auto take = [&](const std::string& key) {
    std::lock_guard<std::mutex> lock(peers_mu_);
    auto it = peers_.find(key);
    if (it == peers_.end() || !it->second->alive.load(std::memory_order_acquire)) return false;
    out = it->second;
    out->active.fetch_add(1, std::memory_order_acq_rel);
    Touch(*out);
    return true;
  };
  // Remembers the peer for this thread's next transfer to remote.
  auto remember = [&] {
    if (entry == nullptr) {
      static thread_local size_t next = 0;
      entry = &cache[next++ % kPeerCacheSize];
      entry->engine = this;
      entry->serial = serial_;
      entry->remote = remote;
    }
    if (entry->peer.owner_before(out) || out.owner_before(entry->peer)) {
      entry->peer = out;
      entry->region.reset();  // another peer's
    }
    if (hint != nullptr) *hint = &entry->region;
  };
  // The common case first: remote is already the canonical key (as from
  // LocalEngine or a name), so no parsing is needed.
  if (take(remote)) {
    remember();
    return Status::Ok();
  }
  const std::string key = PeerKey(remote);
  const auto give_up = std::min(deadline, net::DeadlineAfterMs(opts_.connect_timeout_ms));
  for (;;) {
    if (take(key)) {
      remember();
      return Status::Ok();
    }
    if (!opts_.auto_connect) {
      return Status::NotConnected("not connected to " + remote + " (call Connect first)");
    }
    auto now = net::Clock::now();
    if (now >= give_up)
      return Status::Timeout("AutoConnect to " + remote + " did not finish in time");
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - now).count();
    Status s = Connect(remote, static_cast<int32_t>(std::clamp<int64_t>(ms, 1, INT32_MAX)));
    if (s.code() == StatusCode::kAlreadyConnected) {
      // Another thread is connecting: wait for it.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else if (!s.ok()) {
      return Status(s.code(), "AutoConnect: " + s.message());
    }
  }
}

}  // namespace hixl
