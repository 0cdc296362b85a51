// The tcp transport object: its I/O threads, the data-lane listener and the
// per-peer tokens on the target side, connecting a link's lanes (lane hello
// and reply) on the initiator side, and the factory the transport registry
// uses (MakeTcpTransport). The lanes themselves: tcp_target.cc and
// tcp_initiator.cc; the wire format: tcp_wire.h.
// Thread safety: see TcpTransport in tcp_internal.h.
#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "common/host.h"
#include "common/log.h"
#include "transport/tcp/tcp_internal.h"

namespace hixl::transport::tcp {

Status TcpTransport::Start() {
  size_t n = static_cast<size_t>(std::max<int64_t>(1, ctx_.Setting(options::kTcpIoThreads)));
  for (size_t i = 0; i < n; ++i) {
    auto loop = std::make_unique<EventLoop>();
    if (i == 0 && ctx_.listening) loop->SetTicker([this] { ExpireHellos(); }, 100);
    loop->SetSpin(std::chrono::microseconds(ctx_.poll_spin_us));
    loop->SetStallBound(stall_fence());
    if (Status s = loop->Start("hixl-tcp" + std::to_string(i)); !s.ok()) return s;
    loops_.push_back(std::move(loop));
  }
  if (ctx_.listening) {
    net::HostPort hp{ctx_.listen_host, 0};
    if (Status s = net::TcpListen(hp, listen_, data_port_); !s.ok()) return s;
    int lfd = listen_.get();
    loops_[0]->Post(
        [this, lfd] { loops_[0]->Add(lfd, EPOLLIN, [this](uint32_t) { OnAccept(); }); });
  }
  return Status::Ok();
}

void TcpTransport::Stop() {
  for (auto& l : loops_) l->Stop();  // drops every lane with its loop registration
  loops_.clear();
  listen_.Reset();
}

void TcpTransport::DescribeForPeer(uint64_t conn_id, const auth::Key* link_key,
                                   wire::Msg& info) {
  if (data_port_ <= 0) return;
  uint64_t token = host::RandomU64();
  {
    std::lock_guard<std::mutex> lock(mu_);
    TokenInfo& t = tokens_[token];
    t.conn_id = conn_id;
    t.keyed = link_key != nullptr;
    if (link_key != nullptr) t.key = *link_key;
  }
  info = wire::Msg::object();
  info["port"] = static_cast<uint64_t>(data_port_);
  info["token"] = token;
}

void TcpTransport::ForgetPeer(uint64_t conn_id) {
  std::vector<std::weak_ptr<ServerLane>> lanes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(tokens_, [&](const auto& kv) { return kv.second.conn_id == conn_id; });
    auto it = lanes_.find(conn_id);
    if (it != lanes_.end()) {
      lanes = std::move(it->second);
      lanes_.erase(it);
    }
  }
  for (auto& w : lanes) {
    if (auto l = w.lock()) l->Close("its control link ended", false);
  }
}

void TcpTransport::RevokeRegion(uintptr_t addr, size_t len) {
  // Every lane checks itself on its own loop thread; wait until all have.
  std::vector<std::shared_ptr<ServerLane>> lanes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [conn, v] : lanes_) {
      for (auto& w : v) {
        if (auto l = w.lock()) lanes.push_back(std::move(l));
      }
    }
  }
  OnLaneLoops(lanes, [addr, len](ServerLane& l) { l.Revoke(addr, len); });
}

void TcpTransport::FenceLanes(uint64_t conn_id) {
  std::vector<std::shared_ptr<ServerLane>> lanes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = lanes_.find(conn_id); it != lanes_.end()) {
      for (auto& w : it->second) {
        if (auto l = w.lock()) lanes.push_back(std::move(l));
      }
    }
  }
  OnLaneLoops(lanes, [](ServerLane& l) {
    l.Close("its initiator fenced the link's lanes (it gave up a transfer)", false);
  });
}

void TcpTransport::OnLaneLoops(const std::vector<std::shared_ptr<ServerLane>>& lanes,
                               const std::function<void(ServerLane&)>& fn) {
  if (lanes.empty()) return;
  struct Latch {
    std::mutex mu;
    std::condition_variable cv;
    size_t left;
  };
  auto latch = std::make_shared<Latch>();
  latch->left = lanes.size();
  auto count_down = [latch] {
    std::lock_guard<std::mutex> lock(latch->mu);
    if (--latch->left == 0) latch->cv.notify_all();
  };
  for (auto& l : lanes) {
    if (!l->loop()->Post([l, fn, count_down] {
          fn(*l);
          count_down();
        })) {
      count_down();
    }
  }
  std::unique_lock<std::mutex> lock(latch->mu);
  latch->cv.wait(lock, [&] { return latch->left == 0; });
}

bool TcpTransport::CanReach(const PeerInfo& peer, std::string& why) const {
  if (peer.info == nullptr || !peer.info->is_object()) {
    why = "peer " + peer.engine + " offers no tcp endpoint";
    return false;
  }
  return true;
}

Status TcpTransport::Connect(const PeerInfo& peer, net::Deadline deadline,
                             std::unique_ptr<Channel>& out) {
  uint64_t port = 0, token = 0;
  if (!wire::GetU64(*peer.info, "port", port) || port == 0 || port > 65535 ||
      !wire::GetU64(*peer.info, "token", token)) {
    return Status::Failed("peer " + peer.engine + " sent a malformed tcp endpoint");
  }
  std::vector<std::shared_ptr<ClientLane>> lanes;
  for (int64_t i = 0; i < std::max<int64_t>(1, ctx_.Setting(options::kTcpLanes)); ++i) {
    net::Fd fd;
    net::HostPort hp{peer.address, static_cast<int>(port)};
    if (Status s = net::TcpConnect(hp, deadline, fd); !s.ok()) {
      return Status(s.code(), "tcp lane to " + hp.ToString() + ": " + s.message());
    }
    const auto hello = EncodeLaneHello(
        MakeLaneHello(token, peer.generation, static_cast<uint32_t>(i), peer.link_key));
    LaneReply r{};
    Status s = net::WriteFull(fd.get(), hello.data(), hello.size(), deadline);
    if (s.ok()) s = net::ReadFull(fd.get(), &r, sizeof(r), deadline);
    if (s.ok() && !LaneReplyAccepts(r)) s = Status::Failed("target refused the data lane");
    if (s.ok()) s = net::SetNonBlocking(fd.get(), true);
    if (!s.ok()) return Status(s.code(), "tcp lane to " + hp.ToString() + ": " + s.message());
    EventLoop* loop = loops_[(next_loop_++) % loops_.size()].get();
    auto lane = std::make_shared<ClientLane>(loop, std::move(fd), peer.engine, peer.fence,
                                             std::max(1000, ctx_.hb_bound_ms));
    if (!lane->Start()) return Status::Failed("engine is shutting down");
    lanes.push_back(std::move(lane));
  }
  out = std::make_unique<TcpChannel>(ctx_, peer.engine, std::move(lanes));
  return Status::Ok();
}

bool TcpTransport::CheckToken(const LaneHello& h, uint64_t& conn_id,
                              const std::shared_ptr<ServerLane>& lane) {
  if (h.generation != ctx_.generation) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tokens_.find(h.token);
  if (it == tokens_.end()) return false;
  TokenInfo& t = it->second;
  if (t.keyed) {
    // The token travelled in clear: only the link key's tag admits a lane,
    // and each lane index once, so a recorded hello opens nothing.
    if (h.lane >= kMaxLanes || (t.used_lanes >> h.lane & 1u) != 0) return false;
    const auth::Tag want = LaneTag(t.key, h.token, h.generation, h.lane);
    if (!auth::TagEquals(want, h.tag, sizeof(h.tag))) return false;
    t.used_lanes |= uint64_t{1} << h.lane;
  }
  conn_id = t.conn_id;
  lanes_[conn_id].push_back(lane);
  return true;
}

void TcpTransport::OnAccept() {
  for (;;) {
    int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    EventLoop* loop = loops_[(next_loop_++) % loops_.size()].get();
    auto lane = std::make_shared<ServerLane>(this, loop, net::Fd(fd));
    ExpireHellos();
    if (pending_.size() >= kMaxPendingLanes) {
      HIXL_LOG(WARN) << "tcp: refusing a data connection: " << pending_.size()
                     << " accepted connections have not sent their lane hello yet";
      continue;  // the lane (and its descriptor) is dropped unstarted
    }
    pending_.push_back(PendingLane{
        std::chrono::steady_clock::now() + std::chrono::milliseconds(ctx_.handshake_timeout_ms),
        lane});
    if (loop == loops_[0].get()) {
      lane->Start();
    } else {
      loop->Post([lane] { lane->Start(); });
    }
  }
}

void TcpTransport::ExpireHellos() {
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(pending_, [&](const PendingLane& p) {
    auto lane = p.lane.lock();
    if (!lane || lane->proven()) return true;
    if (now < p.deadline) return false;
    lane->CloseIfNoHello("no valid lane hello within HandshakeTimeoutMs (" +
                         std::to_string(ctx_.handshake_timeout_ms) + " ms)");
    return true;
  });
}

std::vector<TransportOption> TcpOptions() {
  return {
      {options::kTcpLanes, 1, 64, 2, "an integer 1..64"},
      {options::kTcpSliceSize, 4096, 64 << 20, 1 << 20, "bytes 4096..67108864"},
      {options::kTcpIoThreads, 1, 16, 2, "an integer 1..16"},
  };
}

std::unique_ptr<Transport> MakeTcpTransport(const TransportContext& ctx) {
  return std::make_unique<TcpTransport>(ctx);
}

}  // namespace hixl::transport::tcp
