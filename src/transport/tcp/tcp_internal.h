// Internal declarations of the tcp transport, shared by its files:
//   tcp_wire.{h,cc}   the data-lane wire format and its pure checks
//   tcp_target.cc     ServerLane: the target side of one data lane
//   tcp_initiator.cc  ClientLane and TcpChannel: the initiator side
//   tcp_transport.cc  TcpTransport: listening, tokens, connecting, registration
// plus what both lane sides use: the buffered header reader (Inbound), the
// I/O limits, and the TSan guard for payload socket calls.
// Thread safety: every lane is driven by one EventLoop thread; what other
// threads may call is noted at each class.
#ifndef HIXL_TRANSPORT_TCP_TCP_INTERNAL_H_
#define HIXL_TRANSPORT_TCP_TCP_INTERNAL_H_

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/event_loop.h"
#include "common/spin_budget.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace hixl::transport::tcp {

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

constexpr size_t kStaging = 64u << 10;  // header reads; payloads go direct
constexpr size_t kMaxIov = 256;
// Device memory (MEM_DEVICE) never meets a socket call: its bytes pass
// through host staging buffers of at most this many bytes per step (a
// target's WRITE payload and an initiator's READ reply are copied to the
// device in steps of this size as they arrive).
constexpr size_t kDeviceStage = 4u << 20;
// An initiator stages at most this many device WRITE pieces (or kDeviceStage
// bytes of them) per flush under its lane's lock; the loop thread goes on with
// the rest. The control thread's health poll takes that lock: thousands of
// small pieces copied one by one must not hold it for seconds (the link's
// heartbeats would stop, and the peer would drop it).
constexpr size_t kDeviceStagesPerFlush = 64;
constexpr size_t kFairnessBytes = 8u << 20;  // per event, so lanes share a thread
constexpr size_t kMaxQueuedReplyBytes = 64u << 20;
// Accepted data connections that have not sent a valid hello yet, at most.
constexpr size_t kMaxPendingLanes = 1024;
// A lane checks whether its initiator abandoned it (closed it without waiting
// for answers: it declared this engine dead) when this long has passed since
// the last check, e.g. after this process was stopped or starved.
constexpr auto kAliveCheckInterval = std::chrono::milliseconds(2);
// How long a caller waiting for its answers in ReceiveAsCaller blocks in
// ppoll at most (in slices of kCallerReadSlice, so it notices a transfer
// ended or a lane failed by someone else) before leaving them to the loop.
constexpr auto kCallerReadFor = std::chrono::milliseconds(5);
constexpr auto kCallerReadSlice = std::chrono::microseconds(500);
// A caller's polling (before it blocks) grows with the transfer's size by
// one microsecond per kSpinBytesPerUs bytes (about 2 GB/s), for at most
// kSpinBytesMax of them.
constexpr size_t kSpinBytesPerUs = 2048;
constexpr size_t kSpinBytesMax = 256u << 10;

// Buffered reader for headers; payloads are moved by the caller, first from
// what is buffered, then straight from the socket into their destination.
// Thread safety: none (one lane's loop thread).
class Inbound {
 public:
  Inbound() : buf_(kStaging) {}
  size_t avail() const { return end_ - beg_; }
  const uint8_t* data() const { return buf_.data() + beg_; }
  std::span<const uint8_t> bytes() const { return {data(), avail()}; }
  void Consume(size_t n) {
    beg_ += n;
    if (beg_ == end_) beg_ = end_ = 0;
  }
  // Starts a pass over the socket (an event, or one poll of a waiting
  // caller): the next Fill or Payload asks the socket again.
  void Rearm() { dry_ = false; }
  // >0: bytes read; 0: peer closed; -1: would block; -2: error (errno set).
  // A receive that returned less than it asked for emptied the socket: until
  // Rearm, the next one answers "would block" without a system call (a
  // reader driven by a level-triggered epoll hears of later bytes there).
  ssize_t Fill(int fd) {
    if (beg_ > 0 && end_ == buf_.size()) {
      std::memmove(buf_.data(), buf_.data() + beg_, end_ - beg_);
      end_ -= beg_;
      beg_ = 0;
    }
    const size_t want = buf_.size() - end_;
    if (dry_) return -1;
    ssize_t r = ::recv(fd, buf_.data() + end_, want, MSG_DONTWAIT);
    if (r > 0) end_ += static_cast<size_t>(r);
    return Result(r, want);
  }
  // Moves up to n payload bytes into dst.
  ssize_t Payload(int fd, char* dst, size_t n) {
    if (avail() > 0) {
      size_t k = std::min(n, avail());
      std::memcpy(dst, data(), k);
      Consume(k);
      return static_cast<ssize_t>(k);
    }
    if (dry_) return -1;
    return Result(::recv(fd, dst, n, MSG_DONTWAIT), n);
  }

 private:
  ssize_t Result(ssize_t r, size_t want) {
    if (r > 0) {
      dry_ = static_cast<size_t>(r) < want;
      return r;
    }
    if (r == 0) return 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return -1;
    return -2;
  }
  std::vector<uint8_t> buf_;
  size_t beg_ = 0, end_ = 0;
  bool dry_ = false;  // the last receive of this pass emptied the socket
};

class TcpTransport;

// ---- target side: one data connection from an initiator (tcp_target.cc) ----

// Reads the lane hello, then request headers, validating each with the
// tcp_wire checks before any byte moves; WRITE payloads are received straight
// into registered memory, READ replies are sent straight from it, in order.
// Thread safety: everything runs on the lane's loop thread, except Close,
// which may be called from any thread (it posts to the loop).
class ServerLane : public std::enable_shared_from_this<ServerLane> {
 public:
  ServerLane(TcpTransport* tp, EventLoop* loop, net::Fd fd)
      : tp_(tp), loop_(loop), fd_(std::move(fd)) {}
  void Start() {
    stalls_seen_ = loop_->stalls();
    auto self = shared_from_this();
    loop_id_ =
        loop_->Add(fd_.get(), EPOLLIN | EPOLLRDHUP, [self](uint32_t ev) { self->OnEvent(ev); });
  }
  void Close(const std::string& why, bool warn);
  // Any thread: closes the lane unless its hello has been accepted by now.
  void CloseIfNoHello(const std::string& why);
  // Any thread: its hello was accepted.
  bool proven() const { return proven_.load(std::memory_order_acquire); }
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
    // A READ of device memory: the bytes, copied out by the driver (data
    // points here).
    std::shared_ptr<std::vector<char>> staged;
  };
  void OnEvent(uint32_t ev);
  bool Process();          // serves what arrived, then sends the answers; false: closed
  bool ProcessRequests();  // false: closed
  // One lane hello (kLaneHelloSize bytes buffered). False: refused, closed.
  bool OnHello();
  // True (and the lane closed) when the initiator has hung up: it gave the
  // lane up, so nothing still queued on it may be applied.
  bool Abandoned(bool force);
  bool OnHeader(const ReqHdr& h);
  // A WRITE into device memory: moves the staged bytes to the device. False
  // when the lane was fenced or abandoned instead (closed).
  bool LandStaged();
  // Right before a step that applies or answers what the lane read: true
  // (and the lane closed) once its loop saw a stall past the heartbeat
  // fence since the lane started (see OnEvent).
  bool FencedAfterStall();
  void Reply(uint64_t seq, uint8_t op, uint8_t status, const char* data, size_t len,
             std::shared_ptr<std::vector<char>> staged = nullptr);
  bool Flush();
  void UpdateEvents();

  TcpTransport* tp_;
  EventLoop* loop_;
  net::Fd fd_;
  uint64_t loop_id_ = 0;
  uint64_t conn_id_ = 0;
  bool hello_done_ = false;
  std::atomic<bool> proven_{false};  // hello_done_, readable from other threads
  bool closed_ = false;
  bool closing_ = false;  // after a refused request: send what is queued, then close
  std::string closing_why_;
  Inbound in_;
  char* dst_ = nullptr;  // WRITE payload destination, while receiving it
  size_t left_ = 0;
  ReqHdr cur_{};
  // A WRITE into device memory (cur_): the payload lands in stage_ and goes
  // to the device (dst_, device dev_) each time stage_ fills.
  int dev_ = -1;
  bool dev_failed_ = false;  // a copy failed: the rest is received, not applied
  std::vector<char> stage_;
  size_t staged_ = 0;
  std::deque<Out> outq_;
  size_t out_bytes_ = 0;
  uint32_t events_ = EPOLLIN | EPOLLRDHUP;
  uint64_t stalls_seen_ = 0;  // the loop's stall count when the lane started
  std::chrono::steady_clock::time_point last_alive_check_ = std::chrono::steady_clock::now();
};

// ---- initiator side: one data connection to a target (tcp_initiator.cc) ----

struct Piece {
  std::shared_ptr<Transfer> t;  // null once detached: a stopped READ whose answer is discarded
  ReqHdr hdr;
  char* local;
  size_t len;
  size_t off = 0;  // bytes sent of header + (WRITE) payload
  // local is device memory (MEM_DEVICE) of this device ordinal: a WRITE's
  // bytes are copied to the lane's staging buffer before it is sent
  // (staged), a READ's reply is received there and copied to the device.
  int device = -1;
  bool staged = false;
};
using Completions = std::vector<std::pair<std::shared_ptr<Transfer>, Status>>;

// Sends pieces (request header + WRITE payload) and receives their answers
// in order. Thread safety: Enqueue, Fail, PurgeStopped, Drain and
// ReceiveAsCaller may be called from any thread (mu_ guards the queues);
// receiving runs on the lane's loop thread or on one caller at a time
// (read_mu_). Pieces end (Transfer::PartDone) outside both locks.
class ClientLane : public std::enable_shared_from_this<ClientLane> {
 public:
  // fence: PeerInfo::fence (may be empty); stop_grace_ms: how long answers
  // of a stopped transfer's pieces on the wire are awaited before the lane
  // is reset (Poll).
  ClientLane(EventLoop* loop, net::Fd fd, std::string engine,
             std::function<void(std::function<void()>)> fence, int stop_grace_ms)
      : loop_(loop),
        fd_(std::move(fd)),
        engine_(std::move(engine)),
        fence_(std::move(fence)),
        stop_grace_(stop_grace_ms) {}
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
  // Queues pieces and sends what the socket takes now. With claim_reader,
  // the calling thread also becomes this lane's reader (see ReceiveAsCaller)
  // before anything is sent, unless another caller already is or the lane is
  // broken or closing: true when it did, and it must then call
  // ReceiveAsCaller.
  bool Enqueue(std::vector<Piece>& pieces, bool claim_reader = false);
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
  // Any thread (the engine's control loop): resets the lane when a stopped
  // transfer's pieces on the wire stayed unanswered for stop_grace_ms.
  void Poll();
  // The calling thread (one waiting in TransferSync, which claimed the
  // reader's place in Enqueue) receives the lane's answers itself until
  // every part of t is answered, instead of the loop thread receiving them
  // and waking it: it polls the socket for spin (less while such polls keep
  // ending before the answer: SpinBudget), then waits in ppoll for at most
  // kCallerReadFor (never past deadline). While it does, the loop thread
  // watches the socket for a hang-up only. Whatever is left when it returns
  // is received by the loop thread as usual.
  void ReceiveAsCaller(const Transfer& t, std::chrono::microseconds spin, net::Deadline deadline);
  // Any thread: OK, or why the lane broke.
  // Never waits for a lane busy sending (the control thread asks on every
  // tick, between its heartbeats).
  Status Health() {
    if (!broken_seen_.load(std::memory_order_acquire)) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu_);
    return broken_reason_;
  }

 private:
  void OnEvent(uint32_t ev);
  void FailNow();
  void DetachStoppedReads();
  void FlushLocked(Completions& done);
  // The first piece to send is a device WRITE not yet staged: copies its
  // bytes to wstage_ (mu_ held). False: the copy failed and the piece ended.
  bool StageFront(Completions& done);
  void SetEventsLocked(uint32_t ev);
  // What the loop thread watches for answers: a hang-up only while a caller
  // receives them itself or none is awaited (so a lane used by waiting
  // callers, one transfer after another, never changes its epoll mask).
  uint32_t ReadEventsLocked() const {
    return caller_reads_ || inflight_.empty() ? EPOLLRDHUP : EPOLLIN | EPOLLRDHUP;
  }
  // Receives what has arrived (takes read_mu_). False: the lane can't be
  // read any more; broke is set if that happened here (the caller fails it).
  bool Receive(Completions& done, bool& broke);
  bool ReadResponses(Completions& done);  // read_mu_ held
  Status ClosedReason();

  EventLoop* loop_;
  std::mutex mu_;
  net::Fd fd_;
  std::string engine_;
  std::function<void(std::function<void()>)> fence_;
  std::chrono::milliseconds stop_grace_;
  std::optional<std::chrono::steady_clock::time_point> stop_seen_;  // a stopped piece waits
  uint64_t loop_id_ = 0;
  bool registered_ = false;
  bool broken_ = false;
  std::atomic<bool> broken_seen_{false};  // broken_, for Health without the lock
  bool draining_ = false;
  std::condition_variable drained_cv_;
  Status broken_reason_;
  uint32_t events_ = EPOLLRDHUP;
  uint64_t next_seq_ = 1;
  std::deque<Piece> sendq_;
  std::deque<Piece> inflight_;
  bool caller_reads_ = false;  // a caller receives this lane's answers (ReceiveAsCaller)
  SpinBudget caller_spin_;     // touched only by the caller that set caller_reads_
  // Held by whoever receives (the loop thread or a caller) and by what
  // changes the receive state or closes the socket; taken before mu_.
  std::mutex read_mu_;
  // Receive state (read_mu_).
  Inbound in_;
  char* rdst_ = nullptr;  // nullptr while rleft_ > 0: discard (detached piece)
  size_t rleft_ = 0;
  std::vector<char> sink_;
  // A READ reply for device memory: received into rstage_, copied to rdev_
  // (device rdev_ord_) each time it fills; rdev_err_ once a copy failed.
  char* rdev_ = nullptr;
  int rdev_ord_ = -1;
  std::vector<char> rstage_;
  size_t rstaged_ = 0;
  Status rdev_err_;
  device::StreamEvent rdev_after_;  // the piece's TransferArgs::stream event
  // A device WRITE's bytes while it is the first piece to send (mu_).
  std::vector<char> wstage_;
};

// A link to one target: its lanes, over which each transfer's slices are
// striped. Thread safety: Submit and Close may be called from any thread.
class TcpChannel final : public Channel {
 public:
  TcpChannel(const TransportContext& ctx, std::string engine,
             std::vector<std::shared_ptr<ClientLane>> lanes)
      : ctx_(ctx), engine_(std::move(engine)), lanes_(std::move(lanes)) {}
  ~TcpChannel() override { Close(net::Clock::now()); }
  LinkType link_type() const override { return LinkType::TCP; }
  Status PrepareRegion(memory::RemoteRegion&, const wire::Msg*) override { return Status::Ok(); }
  void Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) override;
  void Close(net::Deadline drain_until) override;
  Status Health() const override {
    if (closed_.load()) return Status::Ok();  // being closed on purpose: not a failure
    for (const auto& l : lanes_) {
      if (Status s = l->Health(); !s.ok()) return s;
    }
    return Status::Ok();
  }
  void Poll() override {
    for (const auto& l : lanes_) l->Poll();
  }

 private:
  TransportContext ctx_;
  std::string engine_;
  std::vector<std::shared_ptr<ClientLane>> lanes_;
  std::atomic<bool> closed_{false};
  std::atomic<size_t> rr_{0};
};

// ---- the transport (tcp_transport.cc) ---------------------------------------

// Thread safety: the Transport methods may be called from any thread;
// CheckToken is called by ServerLanes on their loop threads (mu_ guards the
// token and lane tables).
class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportContext& ctx) : ctx_(ctx) {}
  ~TcpTransport() override { Stop(); }
  const char* name() const override { return "tcp"; }
  LinkType link_type() const override { return LinkType::TCP; }
  Status Start() override;
  void Stop() override;
  void DescribeForPeer(uint64_t conn_id, const auth::Key* link_key, wire::Msg& info) override;
  void ForgetPeer(uint64_t conn_id) override;
  void RevokeRegion(uintptr_t addr, size_t len) override;
  void FenceLanes(uint64_t conn_id) override;
  bool CanReach(const PeerInfo& peer, std::string& why) const override;
  Status Connect(const PeerInfo& peer, net::Deadline deadline,
                 std::unique_ptr<Channel>& out) override;

  // Target-side services for ServerLane (loop threads). CheckToken: whether
  // a lane hello's token and generation (and, on an authenticated link, its
  // tag and unused lane index) admit the lane; if so, sets conn_id to the
  // control connection it belongs to and records the lane under it.
  bool CheckToken(const LaneHello& h, uint64_t& conn_id, const std::shared_ptr<ServerLane>& lane);
  memory::LocalRegions* regions() const { return ctx_.regions; }
  // How long a lane's loop may have been unable to run before its lanes are
  // fenced (EventLoop::SetStallBound): a peer gives this engine up `bound`
  // after the last heartbeat it heard, which this engine sent at most one
  // interval before it stopped, with 100 ms to spare; at least half the
  // bound.
  std::chrono::milliseconds stall_fence() const {
    return std::chrono::milliseconds(
        std::max(ctx_.hb_bound_ms / 2, ctx_.hb_bound_ms - ctx_.hb_interval_ms - 100));
  }

 private:
  void OnAccept();
  // Runs fn on each lane's loop thread; returns once all have run.
  void OnLaneLoops(const std::vector<std::shared_ptr<ServerLane>>& lanes,
                   const std::function<void(ServerLane&)>& fn);
  // Loop 0: closes accepted lanes that sent no valid hello in time.
  void ExpireHellos();

  TransportContext ctx_;
  std::vector<std::unique_ptr<EventLoop>> loops_;
  std::atomic<size_t> next_loop_{0};
  net::Fd listen_;
  int data_port_ = 0;
  std::mutex mu_;
  struct TokenInfo {
    uint64_t conn_id = 0;     // the control connection the token was handed to
    bool keyed = false;       // that link authenticated: lanes must carry its tag
    auth::Key key{};
    uint64_t used_lanes = 0;  // lane indexes already admitted (keyed links)
  };
  std::unordered_map<uint64_t, TokenInfo> tokens_;  // token -> its link
  // Lanes accepted but not yet proven (loop 0 only), oldest first: each must
  // send a valid hello within handshake_timeout_ms, and at most
  // kMaxPendingLanes wait at once (a flood of idle connections is refused).
  struct PendingLane {
    std::chrono::steady_clock::time_point deadline;
    std::weak_ptr<ServerLane> lane;
  };
  std::deque<PendingLane> pending_;
  std::unordered_map<uint64_t, std::vector<std::weak_ptr<ServerLane>>> lanes_;
};

}  // namespace hixl::transport::tcp

#endif  // HIXL_TRANSPORT_TCP_TCP_INTERNAL_H_
