#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "common/event_loop.h"
#include "common/host.h"
#include "common/log.h"

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace hixl::transport::tcp {
namespace {

// Socket calls that move payload bytes into or out of registered or caller
// memory are ordered with the application's own accesses by the protocol
// (a piece completes only after the peer's answer), through the kernel,
// where ThreadSanitizer cannot see it. Under TSan those calls' memory
// accesses are not tracked; everywhere else this is empty.
struct [[maybe_unused]] PayloadAccess {
#if defined(__SANITIZE_THREAD__)
  PayloadAccess() { __tsan_ignore_thread_begin(); }
  ~PayloadAccess() { __tsan_ignore_thread_end(); }
#endif
};

static_assert(std::endian::native == std::endian::little,
              "the data-lane protocol is little endian");

constexpr uint32_t kLaneMagic = 0x324C5848;  // "HXL2"
constexpr uint32_t kReqMagic = 0x514C5848;   // "HXLQ"
constexpr uint32_t kRespMagic = 0x524C5848;  // "HXLR"
constexpr uint32_t kLaneVersion = 1;
constexpr uint64_t kMaxSlice = 64u << 20;
constexpr size_t kStaging = 64u << 10;  // header reads; payloads go direct
constexpr size_t kMaxIov = 64;
constexpr size_t kFairnessBytes = 8u << 20;  // per event, so lanes share a thread
constexpr size_t kMaxQueuedReplyBytes = 64u << 20;
// A lane checks whether its initiator abandoned it (closed it without waiting
// for answers: it declared this engine dead) when this long has passed since
// the last check, e.g. after this process was stopped or starved.
constexpr auto kAliveCheckInterval = std::chrono::milliseconds(2);

enum : uint8_t { kOpRead = 0, kOpWrite = 1 };
enum : uint8_t { kOk = 0, kBadRange = 1, kDenied = 2, kBadRequest = 3 };

struct LaneHello {
  uint32_t magic;
  uint32_t version;
  uint64_t token;
  uint64_t generation;
};
struct LaneReply {
  uint32_t magic;
  uint32_t status;
};
struct ReqHdr {
  uint32_t magic;
  uint8_t op;
  uint8_t pad[3];
  uint64_t seq;
  uint64_t addr;
  uint64_t len;
};
struct RespHdr {
  uint32_t magic;
  uint8_t op;
  uint8_t status;
  uint16_t pad;
  uint64_t seq;
  uint64_t len;
};
static_assert(sizeof(LaneHello) == 24 && sizeof(ReqHdr) == 32 && sizeof(RespHdr) == 24);

const char* StatusText(uint8_t s) {
  switch (s) {
    case kOk: return "ok";
    case kBadRange: return "range outside the target's registered regions";
    case kDenied: return "the target's region does not permit this operation";
    default: return "malformed request";
  }
}

// Buffered reader for headers; payloads are moved by the caller, first from
// what is buffered, then straight from the socket into their destination.
class Inbound {
 public:
  Inbound() : buf_(kStaging) {}
  size_t avail() const { return end_ - beg_; }
  const uint8_t* data() const { return buf_.data() + beg_; }
  void Consume(size_t n) {
    beg_ += n;
    if (beg_ == end_) beg_ = end_ = 0;
  }
  // >0: bytes read; 0: peer closed; -1: would block; -2: error (errno set).
  ssize_t Fill(int fd) {
    if (beg_ > 0 && end_ == buf_.size()) {
      std::memmove(buf_.data(), buf_.data() + beg_, end_ - beg_);
      end_ -= beg_;
      beg_ = 0;
    }
    ssize_t r = ::recv(fd, buf_.data() + end_, buf_.size() - end_, MSG_DONTWAIT);
    if (r > 0) end_ += static_cast<size_t>(r);
    return Result(r);
  }
  // Moves up to n payload bytes into dst.
  ssize_t Payload(int fd, char* dst, size_t n) {
    if (avail() > 0) {
      size_t k = std::min(n, avail());
      std::memcpy(dst, data(), k);
      Consume(k);
      return static_cast<ssize_t>(k);
    }
    return Result(::recv(fd, dst, n, MSG_DONTWAIT));
  }

 private:
  static ssize_t Result(ssize_t r) {
    if (r >= 0) return r;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return -1;
    return -2;
  }
  std::vector<uint8_t> buf_;
  size_t beg_ = 0, end_ = 0;
};

class TcpTransport;

// ---- target side: one data connection from an initiator -------------------

class ServerLane : public std::enable_shared_from_this<ServerLane> {
 public:
  ServerLane(TcpTransport* tp, EventLoop* loop, net::Fd fd)
      : tp_(tp), loop_(loop), fd_(std::move(fd)) {}
  void Start() {
    auto self = shared_from_this();
    loop_id_ =
        loop_->Add(fd_.get(), EPOLLIN | EPOLLRDHUP, [self](uint32_t ev) { self->OnEvent(ev); });
  }
  void Close(const std::string& why, bool warn);
  uint64_t conn_id() const { return conn_id_; }
  EventLoop* loop() const { return loop_; }
  // Loop thread: closes the lane if it still has bytes to move into or out
  // of [addr, addr+len) (a region being deregistered).
  void Revoke(uintptr_t addr, size_t len);

 private:
  struct Out {
    RespHdr hdr;
    const char* data;
    size_t len;
    size_t off;  // over header + payload
  };
  void OnEvent(uint32_t ev);
  bool Process();  // false: closed
  // True (and the lane closed) when the initiator has hung up: it gave the
  // lane up, so nothing still queued on it may be applied.
  bool Abandoned(bool force);
  bool OnHeader(const ReqHdr& h);
  void Reply(uint64_t seq, uint8_t op, uint8_t status, const char* data, size_t len);
  bool Flush();
  void UpdateEvents();

  TcpTransport* tp_;
  EventLoop* loop_;
  net::Fd fd_;
  uint64_t loop_id_ = 0;
  uint64_t conn_id_ = 0;
  bool hello_done_ = false;
  bool closed_ = false;
  bool closing_ = false;  // after a refused request: send what is queued, then close
  std::string closing_why_;
  Inbound in_;
  char* dst_ = nullptr;  // WRITE payload destination, while receiving it
  size_t left_ = 0;
  ReqHdr cur_{};
  std::deque<Out> outq_;
  size_t out_bytes_ = 0;
  uint32_t events_ = EPOLLIN | EPOLLRDHUP;
  std::chrono::steady_clock::time_point last_alive_check_ = std::chrono::steady_clock::now();
};

// ---- initiator side: one data connection to a target -----------------------

struct Piece {
  std::shared_ptr<Transfer> t;  // null once detached: a stopped READ whose answer is discarded
  ReqHdr hdr;
  char* local;
  size_t len;
  size_t off = 0;  // bytes sent of header + (WRITE) payload
};
using Completions = std::vector<std::pair<std::shared_ptr<Transfer>, Status>>;

class ClientLane : public std::enable_shared_from_this<ClientLane> {
 public:
  ClientLane(EventLoop* loop, net::Fd fd, std::string engine)
      : loop_(loop), fd_(std::move(fd)), engine_(std::move(engine)) {}
  bool Start() {
    auto self = shared_from_this();
    return loop_->Post([self] {
      std::lock_guard<std::mutex> lock(self->mu_);
      if (self->broken_) return;
      self->loop_id_ = self->loop_->Add(self->fd_.get(), self->events_,
                                        [self](uint32_t ev) { self->OnEvent(ev); });
      self->registered_ = true;
    });
  }
  void Enqueue(std::vector<Piece>& pieces);
  // Breaks the lane: every piece ends with why, on the lane's loop thread
  // (so none ends while its reply is being received), and the socket closes.
  void Fail(const Status& why);
  // Drops pieces not yet begun whose transfer was told to stop, and (on the
  // loop thread) detaches its READ pieces on the wire: their answers will be
  // received into a scratch buffer, never into the caller's memory, so the
  // transfer need not wait for them.
  void PurgeStopped();
  // Sends nothing new (unsent pieces fail with why), waits until every piece
  // already on the wire is answered or the deadline passes, then fails the
  // rest and closes. The target answers a lane in order, so once the last
  // piece sent is answered none of them can touch memory any more.
  void Drain(const Status& why, net::Deadline deadline);

 private:
  void OnEvent(uint32_t ev);
  void FailNow();
  void DetachStoppedReads();
  void FlushLocked(Completions& done);
  void SetEventsLocked(uint32_t ev);
  bool ReadResponses(Completions& done);

  EventLoop* loop_;
  std::mutex mu_;
  net::Fd fd_;
  std::string engine_;
  uint64_t loop_id_ = 0;
  bool registered_ = false;
  bool broken_ = false;
  bool draining_ = false;
  std::condition_variable drained_cv_;
  Status broken_reason_;
  uint32_t events_ = EPOLLIN | EPOLLRDHUP;
  uint64_t next_seq_ = 1;
  std::deque<Piece> sendq_;
  std::deque<Piece> inflight_;
  // Receive state (loop thread only).
  Inbound in_;
  char* rdst_ = nullptr;  // nullptr while rleft_ > 0: discard (detached piece)
  size_t rleft_ = 0;
  std::vector<char> sink_;
};

class TcpChannel final : public Channel {
 public:
  TcpChannel(const TransportContext& ctx, std::string engine,
             std::vector<std::shared_ptr<ClientLane>> lanes)
      : ctx_(ctx), engine_(std::move(engine)), lanes_(std::move(lanes)) {}
  ~TcpChannel() override { Close(net::Clock::now()); }
  LinkType link_type() const override { return LinkType::TCP; }
  Status PrepareRegion(memory::RemoteRegion&) override { return Status::Ok(); }
  void Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) override;
  void Close(net::Deadline drain_until) override {
    if (closed_.exchange(true)) return;
    // Pieces already sent are answered before the lanes close (until
    // drain_until); after that the lanes are abandoned and the target drops
    // what it has not applied (ServerLane::Abandoned).
    for (auto& l : lanes_)
      l->Drain(Status::NotConnected("link to " + engine_ + " was closed"), drain_until);
  }

 private:
  TransportContext ctx_;
  std::string engine_;
  std::vector<std::shared_ptr<ClientLane>> lanes_;
  std::atomic<bool> closed_{false};
  std::atomic<size_t> rr_{0};
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportContext& ctx) : ctx_(ctx) {}
  ~TcpTransport() override { Stop(); }
  const char* name() const override { return "tcp"; }
  LinkType link_type() const override { return LinkType::TCP; }

  Status Start() override {
    size_t n = static_cast<size_t>(std::max(1, ctx_.tcp_io_threads));
    for (size_t i = 0; i < n; ++i) {
      auto loop = std::make_unique<EventLoop>();
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

  void Stop() override {
    for (auto& l : loops_) l->Stop();  // drops every lane with its loop registration
    loops_.clear();
    listen_.Reset();
  }

  void DescribeForPeer(uint64_t conn_id, wire::Msg& info) override {
    if (data_port_ <= 0) return;
    uint64_t token = host::RandomU64();
    {
      std::lock_guard<std::mutex> lock(mu_);
      tokens_[token] = conn_id;
    }
    info = wire::Msg::object();
    info["port"] = static_cast<uint64_t>(data_port_);
    info["token"] = token;
  }

  void ForgetPeer(uint64_t conn_id) override {
    std::vector<std::weak_ptr<ServerLane>> lanes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::erase_if(tokens_, [&](const auto& kv) { return kv.second == conn_id; });
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

  void RevokeRegion(uintptr_t addr, size_t len) override {
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
      if (!l->loop()->Post([l, addr, len, count_down] {
            l->Revoke(addr, len);
            count_down();
          })) {
        count_down();
      }
    }
    std::unique_lock<std::mutex> lock(latch->mu);
    latch->cv.wait(lock, [&] { return latch->left == 0; });
  }

  bool CanReach(const PeerInfo& peer, std::string& why) const override {
    if (peer.info == nullptr || !peer.info->is_object()) {
      why = "peer " + peer.engine + " offers no tcp endpoint";
      return false;
    }
    return true;
  }

  Status Connect(const PeerInfo& peer, net::Deadline deadline,
                 std::unique_ptr<Channel>& out) override {
    uint64_t port = 0, token = 0;
    if (!wire::GetU64(*peer.info, "port", port) || port == 0 || port > 65535 ||
        !wire::GetU64(*peer.info, "token", token)) {
      return Status::Failed("peer " + peer.engine + " sent a malformed tcp endpoint");
    }
    std::vector<std::shared_ptr<ClientLane>> lanes;
    for (int i = 0; i < std::max(1, ctx_.tcp_lanes); ++i) {
      net::Fd fd;
      net::HostPort hp{peer.address, static_cast<int>(port)};
      if (Status s = net::TcpConnect(hp, deadline, fd); !s.ok()) {
        return Status(s.code(), "tcp lane to " + hp.ToString() + ": " + s.message());
      }
      LaneHello h{kLaneMagic, kLaneVersion, token, peer.generation};
      LaneReply r{};
      Status s = net::WriteFull(fd.get(), &h, sizeof(h), deadline);
      if (s.ok()) s = net::ReadFull(fd.get(), &r, sizeof(r), deadline);
      if (s.ok() && (r.magic != kLaneMagic || r.status != 0)) {
        s = Status::Failed("target refused the data lane");
      }
      if (s.ok()) s = net::SetNonBlocking(fd.get(), true);
      if (!s.ok()) return Status(s.code(), "tcp lane to " + hp.ToString() + ": " + s.message());
      EventLoop* loop = loops_[(next_loop_++) % loops_.size()].get();
      auto lane = std::make_shared<ClientLane>(loop, std::move(fd), peer.engine);
      if (!lane->Start()) return Status::Failed("engine is shutting down");
      lanes.push_back(std::move(lane));
    }
    out = std::make_unique<TcpChannel>(ctx_, peer.engine, std::move(lanes));
    return Status::Ok();
  }

  // Target-side services for ServerLane (loop threads).
  bool CheckToken(uint64_t token, uint64_t generation, uint64_t& conn_id,
                  const std::shared_ptr<ServerLane>& lane) {
    if (generation != ctx_.generation) return false;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) return false;
    conn_id = it->second;
    lanes_[conn_id].push_back(lane);
    return true;
  }
  memory::LocalRegions* regions() const { return ctx_.regions; }

 private:
  void OnAccept() {
    for (;;) {
      int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      EventLoop* loop = loops_[(next_loop_++) % loops_.size()].get();
      auto lane = std::make_shared<ServerLane>(this, loop, net::Fd(fd));
      if (loop == loops_[0].get()) {
        lane->Start();
      } else {
        loop->Post([lane] { lane->Start(); });
      }
    }
  }

  TransportContext ctx_;
  std::vector<std::unique_ptr<EventLoop>> loops_;
  std::atomic<size_t> next_loop_{0};
  net::Fd listen_;
  int data_port_ = 0;
  std::mutex mu_;
  std::unordered_map<uint64_t, uint64_t> tokens_;  // token -> control connection
  std::unordered_map<uint64_t, std::vector<std::weak_ptr<ServerLane>>> lanes_;
};

// ---- ServerLane -------------------------------------------------------------

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
  };
  if (loop_->InLoop()) {
    doit();
  } else {
    loop_->Post(doit);
  }
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

void ServerLane::OnEvent(uint32_t ev) {
  if (closed_) return;
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
  size_t moved = 0;
  while (!closing_ && out_bytes_ < kMaxQueuedReplyBytes) {
    if (moved >= kFairnessBytes) {  // let other lanes run, then come back
      auto self = shared_from_this();
      loop_->Post([self] { self->OnEvent(EPOLLIN); });
      return true;
    }
    if (left_ > 0) {  // receiving a WRITE payload straight into registered memory
      if (Abandoned(false)) return false;
      ssize_t r;
      {
        [[maybe_unused]] PayloadAccess quiet;
        r = in_.Payload(fd_.get(), dst_, left_);
      }
      if (r == -1) return true;
      if (r <= 0) {
        Close(r == 0 ? "initiator closed the lane mid-payload" : std::strerror(errno), r != 0);
        return false;
      }
      dst_ += r;
      left_ -= static_cast<size_t>(r);
      moved += static_cast<size_t>(r);
      if (left_ == 0) Reply(cur_.seq, kOpWrite, kOk, nullptr, 0);
      continue;
    }
    size_t need = hello_done_ ? sizeof(ReqHdr) : sizeof(LaneHello);
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
      LaneHello h;
      std::memcpy(&h, in_.data(), sizeof(h));
      in_.Consume(sizeof(h));
      LaneReply rep{kLaneMagic, 0};
      if (h.magic != kLaneMagic || h.version != kLaneVersion ||
          !tp_->CheckToken(h.token, h.generation, conn_id_, shared_from_this())) {
        rep.status = 1;
        ssize_t w = ::send(fd_.get(), &rep, sizeof(rep), MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w;
        Close("lane hello without a valid token (not a hixl peer, or a stale one)", true);
        return false;
      }
      hello_done_ = true;
      ssize_t w = ::send(fd_.get(), &rep, sizeof(rep), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w != static_cast<ssize_t>(sizeof(rep))) {
        Close("cannot answer lane hello", true);
        return false;
      }
      continue;
    }
    ReqHdr h;
    std::memcpy(&h, in_.data(), sizeof(h));
    if (h.op == kOpWrite && Abandoned(false)) return false;
    in_.Consume(sizeof(h));
    OnHeader(h);
  }
  return !closed_;
}

bool ServerLane::OnHeader(const ReqHdr& h) {
  uint8_t status = kOk;
  const char* why = nullptr;
  std::optional<memory::LocalRegion> region;
  if (h.magic != kReqMagic || (h.op != kOpRead && h.op != kOpWrite) || h.len == 0 ||
      h.len > kMaxSlice || h.addr == 0 || h.addr + h.len < h.addr) {
    status = kBadRequest;
    why = "malformed request header";
  } else if (!(region = tp_->regions()->FindContaining(h.addr, h.len))) {
    status = kBadRange;
    why = "request outside every registered region";
  } else if ((region->perms & (h.op == kOpWrite ? MEM_PERM_WRITE : MEM_PERM_READ)) == 0) {
    status = kDenied;
    why = "request against the region's permission";
  }
  if (status != kOk) {
    // Requests before this one are answered in order, then the refusal; the
    // payload that may follow cannot be skipped safely, so the lane closes.
    closing_ = true;
    closing_why_ = std::string(why) + " (addr " + std::to_string(h.addr) + ", len " +
                   std::to_string(h.len) + ")";
    Reply(h.seq, h.op, status, nullptr, 0);
    return false;
  }
  if (h.op == kOpWrite) {
    cur_ = h;
    dst_ = reinterpret_cast<char*>(h.addr);
    left_ = h.len;
  } else {
    Reply(h.seq, kOpRead, kOk, reinterpret_cast<const char*>(h.addr), h.len);
  }
  return true;
}

void ServerLane::Reply(uint64_t seq, uint8_t op, uint8_t status, const char* data, size_t len) {
  Out o{RespHdr{kRespMagic, op, status, 0, seq, len}, data, len, 0};
  outq_.push_back(o);
  out_bytes_ += sizeof(RespHdr) + len;
  if (outq_.size() == 1) Flush();
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

// ---- ClientLane -------------------------------------------------------------

void ClientLane::SetEventsLocked(uint32_t ev) {
  if (ev == events_) return;
  events_ = ev;
  if (registered_ && !broken_) loop_->ModifyFd(fd_.get(), loop_id_, ev);
}

void ClientLane::Enqueue(std::vector<Piece>& pieces) {
  Completions done;
  bool failed = false;
  Status why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_ || draining_) {
      Status why =
          broken_ ? broken_reason_ : Status::NotConnected("link to " + engine_ + " is closing");
      for (auto& p : pieces) done.emplace_back(std::move(p.t), why);
    } else {
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
}

void ClientLane::FlushLocked(Completions& done) {
  while (!sendq_.empty()) {
    // A transfer told to stop sends nothing more that it has not begun.
    while (!sendq_.empty() && sendq_.front().off == 0 && sendq_.front().t->StopRequested()) {
      Status why = sendq_.front().t->CheckContinue();
      done.emplace_back(std::move(sendq_.front().t), std::move(why));
      sendq_.pop_front();
    }
    iovec iov[kMaxIov];
    size_t n = 0;
    for (auto it = sendq_.begin(); it != sendq_.end() && n + 2 <= kMaxIov; ++it) {
      bool write = it->hdr.op == kOpWrite;
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
        SetEventsLocked(EPOLLIN | EPOLLRDHUP | EPOLLOUT);
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
  SetEventsLocked(EPOLLIN | EPOLLRDHUP);
}

void ClientLane::Fail(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) {
      broken_ = true;
      broken_reason_ = why;
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_.valid() && (!sendq_.empty() || !inflight_.empty())) {
      // Abandoning pieces on the wire: reset the connection rather than
      // closing it, so bytes still in our send buffer are never delivered
      // and the target sees the hang-up before anything it has not applied.
      linger lg{1, 0};
      setsockopt(fd_.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    for (auto& p : sendq_) {
      if (p.t) done.emplace_back(std::move(p.t), broken_reason_);
    }
    for (auto& p : inflight_) {
      if (p.t) done.emplace_back(std::move(p.t), broken_reason_);
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
}

void ClientLane::DetachStoppedReads() {
  Completions done;
  {
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
      } else {
        [[maybe_unused]] PayloadAccess quiet;
        r = in_.Payload(fd_.get(), rdst_, rleft_);
      }
      if (r == -1) return true;
      if (r <= 0) return false;
      if (rdst_ != nullptr) rdst_ += r;
      rleft_ -= static_cast<size_t>(r);
      moved += static_cast<size_t>(r);
      if (rleft_ == 0) {
        std::lock_guard<std::mutex> lock(mu_);
        if (inflight_.front().t) done.emplace_back(std::move(inflight_.front().t), Status::Ok());
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
        done.emplace_back(std::move(p.t),
                          Status::ParamInvalid(std::string("target ") + engine_ +
                                               " refused a slice: " + StatusText(h.status)));
      }
      inflight_.pop_front();
      continue;  // the target closes the lane next; the rest fail then
    }
    if (h.op == kOpRead) {
      if (h.len != p.len) {
        broken_reason_ =
            Status::Failed("tcp: target " + engine_ + " sent a reply of the wrong length");
        return false;
      }
      rdst_ = p.t ? p.local : nullptr;
      rleft_ = p.len;
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
  if (ok && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) ok = ReadResponses(done);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ && sendq_.empty() && inflight_.empty()) drained_cv_.notify_all();
  }
  for (auto& [t, s] : done) t->PartDone(s);
  if (!ok) {
    Status why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why = broken_reason_.ok() ? Status::NotConnected("tcp lane to " + engine_ + " closed")
                                : broken_reason_;
    }
    Fail(why);
  }
}

// ---- TcpChannel -------------------------------------------------------------

void TcpChannel::Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) {
  (void)caller_waits;
  const size_t slice = std::clamp<size_t>(ctx_.tcp_slice_size, 4096, kMaxSlice);
  size_t count = 0;
  for (const auto& s : t->slices) count += (s.len + slice - 1) / slice;
  t->SetParts(static_cast<int>(count));
  if (closed_.load()) {
    for (size_t i = 0; i < count; ++i)
      t->PartDone(Status::NotConnected("link to " + engine_ + " was closed"));
    return;
  }
  std::vector<std::vector<Piece>> per_lane(lanes_.size());
  size_t lane = rr_.fetch_add(1) % lanes_.size();
  const uint8_t op = t->op == TransferOp::WRITE ? kOpWrite : kOpRead;
  for (const auto& s : t->slices) {
    for (size_t off = 0; off < s.len; off += slice) {
      size_t len = std::min(slice, s.len - off);
      Piece p;
      p.t = t;
      p.hdr = ReqHdr{kReqMagic, op, {0, 0, 0}, 0, s.remote + off, len};
      p.local = reinterpret_cast<char*>(s.local + off);
      p.len = len;
      per_lane[lane].push_back(std::move(p));
      lane = (lane + 1) % lanes_.size();
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
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (!per_lane[i].empty()) lanes_[i]->Enqueue(per_lane[i]);
  }
}

}  // namespace

std::unique_ptr<Transport> MakeTcpTransport(const TransportContext& ctx) {
  return std::make_unique<TcpTransport>(ctx);
}

}  // namespace hixl::transport::tcp
