#include "transport/shm/shm_transport.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/host.h"
#include "common/log.h"
#include "common/stream_copy.h"
#include "device/cuda.h"
#include "transport/shm/shm_device.h"

namespace hixl::transport::shm {
namespace {

constexpr size_t kChunk = 16u << 20;   // stop/deadline checks at least this often
constexpr size_t kMinPart = 1u << 20;  // never hand a thread less than this
constexpr size_t kIovMax = 1024;       // IOV_MAX on Linux
constexpr size_t kInlineBytes = 64u << 10;  // async transfers up to this run on the caller
constexpr int kUdsRequestMs = 500;
constexpr size_t kMaxUdsClients = 1024;

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

// The ShmStreamCopyBytes setting as a byte threshold (0: never stream).
size_t StreamCopyMin(int64_t setting) {
  if (setting >= 0) return static_cast<size_t>(setting);
  const size_t llc = LastLevelCacheBytes();
  return llc != 0 ? llc / 2 : size_t{16} << 20;
}

// The tag an authenticated link's getfd request carries: the link key over
// the token and the region id.
auth::Tag ShmRequestTag(const auth::Key& key, uint64_t token, uint64_t id) {
  uint8_t b[16];
  std::memcpy(b, &token, 8);
  std::memcpy(b + 8, &id, 8);
  return auth::Hmac(auth::View(key), "hixl-auth-v1 shm",
                    std::string_view(reinterpret_cast<const char*>(b), sizeof(b)));
}

// The id a ring request's tag covers (no region has it).
constexpr uint64_t kRingRequestId = UINT64_MAX;

// Reads one reply frame from a Unix socket, with the descriptor the target
// attached (if any).
Status ReadReply(int sock, wire::Msg& reply, net::Fd& fd, net::Deadline d) {
  uint8_t hdr[wire::kFrameHeaderSize];
  uint32_t len = 0;
  Status s = net::RecvWithFd(sock, hdr, sizeof(hdr), &fd, d);
  if (s.ok()) s = wire::DecodeFrameHeader(hdr, len);
  if (s.ok() && len > 4096) s = Status::ParamInvalid("reply too large");
  std::vector<uint8_t> body(len);
  if (s.ok()) s = net::RecvWithFd(sock, body.data(), len, &fd, d);
  if (s.ok()) s = wire::DecodeBody(body.data(), body.size(), reply);
  return s;
}

// Sends one request and reads its reply.
Status Ask(int sock, const wire::Msg& req, wire::Msg& reply, net::Fd& fd, net::Deadline d) {
  auto frame = wire::EncodeFrame(req);
  if (Status s = net::WriteFull(sock, frame.data(), frame.size(), d); !s.ok()) return s;
  return ReadReply(sock, reply, fd, d);
}

// ---- target side: serves memfds to peers holding a token -------------------

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const TransportContext& ctx) : ctx_(ctx), probe_value_(ctx.generation) {}
  ~ShmTransport() override { Stop(); }

  const char* name() const override { return "shm"; }
  LinkType link_type() const override { return LinkType::SHM; }

  Status Start() override {
    if (!ctx_.listening) return Status::Ok();
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(ctx_.generation));
    uds_name_ = "hixl-shm." + std::to_string(getpid()) + "." + hex;
    if (Status s = net::UnixListen(uds_name_, listen_); !s.ok()) return s;
    stop_efd_.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!stop_efd_.valid()) return net::ErrnoStatus("eventfd", errno);
    server_ = std::thread([this] { Serve(); });
    return Status::Ok();
  }

  std::string Describe() const override {
    // Cross-memory attach reaches any memory of a peer of the same user
    // unless Yama restricts ptrace; memory shared by mapping always works.
    std::string scope = "none";
    if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
      int v = -1;
      if (std::fscanf(f, "%d", &v) == 1) scope = std::to_string(v);
      std::fclose(f);
    }
    return "peers on this host: memfd-shared memory by mapping, other memory by cross-memory "
           "attach (same user; Yama ptrace_scope " +
           scope +
           (scope == "none" || scope == "0" ? ")"
                                            : ": may refuse it; AllocMem memory still works)");
  }

  void Stop() override {
    if (server_.joinable()) {
      uint64_t one = 1;
      ssize_t r = ::write(stop_efd_.get(), &one, sizeof(one));
      (void)r;
      server_.join();
    }
    listen_.Reset();
  }

  void DescribeForPeer(uint64_t conn_id, const auth::Key* link_key, wire::Msg& info) override {
    if (uds_name_.empty()) return;
    uint64_t token = host::RandomU64();
    {
      std::lock_guard<std::mutex> lock(mu_);
      tokens_[token] = TokenInfo{conn_id, link_key != nullptr, link_key ? *link_key : auth::Key{}};
    }
    info = wire::Msg::object();
    info["uds"] = uds_name_;
    info["token"] = token;
    info["probe"] = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&probe_value_));
  }

  void ForgetPeer(uint64_t conn_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(tokens_, [&](const auto& kv) { return kv.second.conn_id == conn_id; });
  }

  void DescribeRegion(const memory::LocalRegion& r, wire::Msg& info) const override {
    if (r.type == MemType::MEM_DEVICE && !uds_name_.empty()) DescribeDeviceRegion(r, info);
  }

  bool LostPeerMayReach(const memory::LocalRegion& r, const LostPeer& peer) const override {
    // Peers map a shared region's file: once it is gone their copies land
    // in pages nobody else uses. Bytes they reach by cross-memory attach are
    // written by their own process, straight into this one.
    if (uds_name_.empty() || !peer.same_host) return false;
    if (peer.link != LinkType::AUTO && peer.link != LinkType::SHM) return false;
    return !(r.share.fd >= 0 && r.share.region_off == 0 && r.share.len == r.len);
  }

  bool CanReach(const PeerInfo& peer, std::string& why) const override {
    if (peer.host_id != host::HostIdentity()) {
      why = "shm needs both engines on one host (same kernel, network and pid namespace); peer " +
            peer.engine + " is on another host";
      return false;
    }
    if (peer.info == nullptr || !peer.info->is_object()) {
      why = "peer " + peer.engine + " offers no shm endpoint";
      return false;
    }
    return true;
  }

  Status Connect(const PeerInfo& peer, net::Deadline deadline,
                 std::unique_ptr<Channel>& out) override;

 private:
  void Serve();
  // Answers getring: a new ring for link conn_id, attached to the engine's
  // inbox, and its doorbell. False: drop the client.
  bool ServeRing(int sock, uint64_t conn_id);

  TransportContext ctx_;
  const uint64_t probe_value_;  // peers read it by cross-memory attach to prove CMA works
  std::string uds_name_;
  net::Fd listen_;
  net::Fd stop_efd_;
  std::thread server_;
  std::mutex mu_;
  struct TokenInfo {
    uint64_t conn_id;   // the accepted control connection
    bool keyed;         // its link authenticated: requests carry a tag
    auth::Key key;
  };
  std::unordered_map<uint64_t, TokenInfo> tokens_;
};

bool ShmTransport::ServeRing(int sock, uint64_t conn_id) {
  // Two answers: the ring's memfd, then its doorbell's sending end.
  wire::Msg reply = wire::Msg::object();
  net::Fd ring_fd, bell_fd;
  Status s = ctx_.notify_sink != nullptr
                 ? Status::Ok()
                 : Status::Unsupported("this engine takes no notifications by ring");
  std::unique_ptr<NotifyRing> ring;
  if (s.ok()) s = NotifyRing::Create(NotifyRing::kDefaultDataBytes, 0, ring, ring_fd, bell_fd);
  // One ring per link: a second request is refused by AttachRing.
  if (s.ok() && !ctx_.notify_sink->AttachRing(conn_id, std::move(ring))) {
    s = Status::Failed("the link has a ring already, or is closing");
  }
  const auto d = net::DeadlineAfterMs(kUdsRequestMs);
  if (!s.ok()) {
    reply["t"] = "err";
    reply["reason"] = s.message();
    auto frame = wire::EncodeFrame(reply);
    return net::SendWithFd(sock, frame.data(), frame.size(), -1, d).ok();
  }
  reply["t"] = "ring";
  auto frame = wire::EncodeFrame(reply);
  if (!net::SendWithFd(sock, frame.data(), frame.size(), ring_fd.get(), d).ok()) return false;
  reply["t"] = "bell";
  frame = wire::EncodeFrame(reply);
  return net::SendWithFd(sock, frame.data(), frame.size(), bell_fd.get(), d).ok();
}

void ShmTransport::Serve() {
  std::vector<net::Fd> conns;
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({stop_efd_.get(), POLLIN, 0});
    fds.push_back({listen_.get(), POLLIN, 0});
    for (auto& c : conns) fds.push_back({c.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      HIXL_LOG(ERROR) << "shm server poll failed: " << std::strerror(errno);
      return;
    }
    if (fds[0].revents != 0) return;
    net::Fd accepted;  // joins conns after this round: fds has no entry for it yet
    if (fds[1].revents & POLLIN) {
      accepted.Reset(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (conns.size() >= kMaxUdsClients) accepted.Reset();
    }
    std::vector<net::Fd> keep;
    for (size_t i = 0; i < conns.size(); ++i) {
      short ev = fds[i + 2].revents;
      if (ev & (POLLERR | POLLHUP | POLLNVAL)) continue;  // closed: drop
      if (ev & POLLIN) {
        // A bad or slow request closes that connection only.
        uint8_t hdr[wire::kFrameHeaderSize];
        auto d = net::DeadlineAfterMs(kUdsRequestMs);
        uint32_t len = 0;
        wire::Msg req;
        std::vector<uint8_t> body;
        Status s = net::ReadFull(conns[i].get(), hdr, sizeof(hdr), d);
        if (s.ok()) s = wire::DecodeFrameHeader(hdr, len);
        if (s.ok() && len > 4096) s = Status::ParamInvalid("shm request too large");
        if (s.ok()) {
          body.resize(len);
          s = net::ReadFull(conns[i].get(), body.data(), len, d);
        }
        if (s.ok()) s = wire::DecodeBody(body.data(), body.size(), req);
        if (!s.ok()) {
          if (s.code() != StatusCode::kNotConnected) {
            HIXL_LOG(WARN) << "shm: dropping unix-socket client: " << s.ToString();
          }
          continue;
        }
        uint64_t token = 0, id = 0, conn_id = 0;
        std::string type;
        wire::GetStr(req, "t", type, 16);
        wire::Msg reply = wire::Msg::object();
        memory::SharedPart part;
        bool token_ok = false;
        const bool ring_req = type == "getring";
        const bool vmm_req = type == "getvmm";
        if ((type == "getfd" || ring_req || vmm_req) && wire::GetU64(req, "token", token) &&
            wire::GetU64(req, "id", id) && (!ring_req || id == kRingRequestId)) {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = tokens_.find(token);
          if (it != tokens_.end()) {
            token_ok = true;
            conn_id = it->second.conn_id;
            if (it->second.keyed) {
              // An authenticated link: the token alone (seen in the welcome)
              // is not enough, the request must be tagged with the link key.
              std::string hex;
              auth::Tag tag{};
              token_ok = wire::GetStr(req, "tag", hex, 2 * auth::kTagSize) &&
                         auth::FromHex(hex, tag.data(), tag.size()) &&
                         auth::TagEquals(ShmRequestTag(it->second.key, token, id), tag.data(),
                                         tag.size());
            }
          }
        }
        if (!token_ok) {
          HIXL_LOG(WARN) << "shm: unix-socket request without a valid token refused";
          continue;  // close: this client never completed a handshake
        }
        if (ring_req) {
          if (!ServeRing(conns[i].get(), conn_id)) continue;
          keep.push_back(std::move(conns[i]));
          continue;
        }
        if (vmm_req) {
          // A device region's physical memory (cuMemCreate), as a descriptor.
          std::optional<memory::LocalRegion> reg = ctx_.regions->Find(id);
          Status e = reg ? ExportDeviceRegion(*reg, part.fd)
                         : Status::ParamInvalid("region " + std::to_string(id) +
                                                " is not registered");
          if (e.ok()) {
            reply["t"] = "vmm";
            reply["id"] = id;
          } else {
            reply["t"] = "err";
            reply["reason"] = e.message();
          }
        } else if ((part = ctx_.regions->DupShared(id)).fd < 0) {
          reply["t"] = "err";
          reply["reason"] =
              "region " + std::to_string(id) + " is not a registered shareable region";
        } else {
          // The region's bytes [lo, lo+n) are the file's from off.
          reply["t"] = "fd";
          reply["id"] = id;
          reply["lo"] = static_cast<uint64_t>(part.region_off);
          reply["n"] = static_cast<uint64_t>(part.len);
          reply["off"] = part.file_off;
          reply["unsealed"] = !part.sealed;
        }
        auto frame = wire::EncodeFrame(reply);
        s = net::SendWithFd(conns[i].get(), frame.data(), frame.size(), part.fd,
                            net::DeadlineAfterMs(kUdsRequestMs));
        if (part.fd >= 0) ::close(part.fd);
        if (!s.ok()) continue;
      }
      keep.push_back(std::move(conns[i]));
    }
    if (accepted.valid()) keep.push_back(std::move(accepted));
    conns = std::move(keep);
  }
}

// ---- initiator side ---------------------------------------------------------

class ShmChannel final : public Channel {
 public:
  ShmChannel(const TransportContext& ctx, const PeerInfo& peer, net::Fd uds, uint64_t token)
      : ctx_(ctx),
        engine_(peer.engine),
        pid_(static_cast<pid_t>(peer.pid)),
        uds_(std::move(uds)),
        token_(token),
        keyed_(peer.link_key != nullptr),
        key_(peer.link_key ? *peer.link_key : auth::Key{}),
        stream_min_(StreamCopyMin(ctx.Setting(options::kShmStreamCopyBytes))),
        imports_(peer.engine) {}

  LinkType link_type() const override { return LinkType::SHM; }

  void SetCma(bool ok, std::string why) {
    cma_ok_ = ok;
    cma_error_ = std::move(why);
  }
  // Asks the target for a notification ring and its doorbell (on a socket
  // of its own, so a target that refuses leaves the region socket alone).
  Status OpenRing(const std::string& uds, net::Deadline deadline);

  NotifyPath TryNotify(std::string_view name, std::string_view msg) override {
    if (!ring_ || closed_.load(std::memory_order_acquire)) return NotifyPath::kUnavailable;
    switch (ring_->Push(name, msg)) {
      case NotifyRing::PushResult::kPosted: return NotifyPath::kPosted;
      case NotifyRing::PushResult::kClosed: return NotifyPath::kClosed;
      case NotifyRing::PushResult::kRaced: return NotifyPath::kMaybe;
      case NotifyRing::PushResult::kBroken:
        if (!ring_broken_.exchange(true)) {
          HIXL_LOG(WARN) << "shm: the notification ring of " << engine_
                         << " is inconsistent; notifications go over the control link";
        }
        return NotifyPath::kUnavailable;
      case NotifyRing::PushResult::kFull: break;
    }
    return NotifyPath::kUnavailable;
  }

  Status PrepareRegion(memory::RemoteRegion& r, const wire::Msg* info) override;
  // The physical memory of the peer's VMM device region id, as a descriptor.
  Status FetchVmm(uint64_t id, net::Fd& fd);
  void Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) override;
  size_t InlineLimit() const override { return kInlineBytes; }
  Status RunInline(TransferOp op, const memory::Slice* slices, size_t n,
                   net::Deadline deadline) override {
    if (n == 0) return Status::Ok();
    return RunPart(op, slices, Part{0, n, 0, slices[n - 1].len}, nullptr, deadline);
  }
  void Close(net::Deadline) override {
    // Copies are done by this process: each part stops at its next chunk and
    // its transfer ends only after that, so there is nothing to drain.
    closed_.store(true, std::memory_order_release);
  }

 private:
  // Runs slices[begin, end) where the first slice starts first_off bytes in
  // and the last one ends at last_len (0: whole).
  struct Part {
    size_t begin = 0, end = 0;
    size_t first_off = 0;
    size_t last_end = 0;  // bytes of slices[end-1] to cover, from its start
    bool stream = false;  // copy mapped memory with StreamCopy
  };
  // Whether each of `parts` equal parts of a transfer of `bytes` is large
  // enough to stream past the cache. Per part, not per transfer: copy
  // threads that each move less than that from and to memory the cache
  // still holds are faster with memcpy (2 threads, 16 MiB: 35 against
  // 26 GB/s on the machine of docs/PERFORMANCE.md).
  bool StreamParts(size_t bytes, size_t parts) const {
    return stream_min_ != 0 && bytes / std::max<size_t>(1, parts) >= stream_min_;
  }
  // t: the transfer the slices belong to (its stop flag is checked), or
  // null for one run inline (only the deadline is).
  Status RunPart(TransferOp op, const memory::Slice* slices, const Part& p, const Transfer* t,
                 net::Deadline deadline) const;
  Status RunPart(const Transfer& t, const Part& p) const {
    return RunPart(t.op, t.slices.data(), p, &t, t.deadline);
  }
  static void CopyMapped(TransferOp op, const memory::RemoteRegion& g, uintptr_t local,
                         uintptr_t remote, size_t len, bool stream);
  // A piece where either side is device memory (local_device: the local
  // side's device, or -1); after: the transfer's TransferArgs::stream event.
  Status CopyWithDevice(TransferOp op, const memory::RemoteRegion& g, int local_device,
                        uintptr_t local, uintptr_t remote, size_t len,
                        const device::StreamEvent& after) const;
  Status CopyCma(TransferOp op, const iovec* local, const iovec* remote, size_t n,
                 size_t bytes) const;
  std::vector<Part> Split(const Transfer& t) const;

  TransportContext ctx_;
  std::string engine_;
  pid_t pid_;
  std::mutex uds_mu_;
  net::Fd uds_;
  uint64_t token_;
  bool keyed_;
  auth::Key key_;
  bool cma_ok_ = false;
  std::string cma_error_;
  std::atomic<bool> closed_{false};
  std::unique_ptr<NotifyRing> ring_;  // set in Connect, before the channel is shared
  std::atomic<bool> ring_broken_{false};
  size_t stream_min_;  // transfers of at least this many bytes stream past the cache
  DeviceImports imports_;  // the peer's device memory opened here
};

Status ShmChannel::OpenRing(const std::string& uds, net::Deadline deadline) {
  net::Fd sock;
  if (Status s = net::UnixConnect(uds, deadline, sock); !s.ok()) return s;
  wire::Msg req = wire::Msg::object();
  req["t"] = "getring";
  req["token"] = token_;
  req["id"] = kRingRequestId;
  if (keyed_) {
    const auth::Tag tag = ShmRequestTag(key_, token_, kRingRequestId);
    req["tag"] = auth::Hex(tag.data(), tag.size());
  }
  auto frame = wire::EncodeFrame(req);
  if (Status s = net::WriteFull(sock.get(), frame.data(), frame.size(), deadline); !s.ok()) {
    return s;
  }
  // Two answers: the ring, then its doorbell.
  net::Fd fds[2];
  for (int k = 0; k < 2; ++k) {
    wire::Msg reply;
    if (Status s = ReadReply(sock.get(), reply, fds[k], deadline); !s.ok()) return s;
    std::string type, reason;
    wire::GetStr(reply, "t", type, 16);
    if (type != (k == 0 ? "ring" : "bell") || !fds[k].valid()) {
      wire::GetStr(reply, "reason", reason);
      return Status::Unsupported("the peer offers no notification ring" +
                                 (reason.empty() ? "" : ": " + reason));
    }
  }
  return NotifyRing::Attach(std::move(fds[0]), std::move(fds[1]), ring_);
}

Status ShmTransport::Connect(const PeerInfo& peer, net::Deadline deadline,
                             std::unique_ptr<Channel>& out) {
  std::string uds;
  uint64_t token = 0, probe = 0;
  if (!wire::GetStr(*peer.info, "uds", uds, 100) || !wire::GetU64(*peer.info, "token", token) ||
      !wire::GetU64(*peer.info, "probe", probe)) {
    return Status::Failed("peer " + peer.engine + " sent a malformed shm endpoint");
  }
  net::Fd sock;
  if (Status s = net::UnixConnect(uds, deadline, sock); !s.ok()) {
    return Status::Unsupported("shm: cannot reach peer " + peer.engine + "'s unix socket (" +
                               s.message() + ")");
  }
  auto ch = std::make_unique<ShmChannel>(ctx_, peer, std::move(sock), token);
  // Prove cross-memory attach works on this very process: read its
  // generation from the address it told us.
  uint64_t got = 0;
  iovec l{&got, sizeof(got)};
  iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(probe)), sizeof(got)};
  ssize_t n = process_vm_readv(static_cast<pid_t>(peer.pid), &l, 1, &r, 1, 0);
  if (n == static_cast<ssize_t>(sizeof(got)) && got == peer.generation) {
    ch->SetCma(true, "");
  } else {
    int err = n < 0 ? errno : 0;
    std::string why =
        n < 0 ? std::string(std::strerror(err)) : "probe mismatch (pid not the peer's)";
    std::string msg = "cross-memory attach (process_vm_writev/readv) to peer " + peer.engine +
                      " (pid " + std::to_string(peer.pid) + ") is refused: " + why +
                      (err == EPERM ? " (ptrace permission: same user needed; check "
                                      "/proc/sys/kernel/yama/ptrace_scope)"
                                    : "") +
                      "; only memory from the peer's AllocMem is reachable";
    HIXL_LOG(INFO) << msg;
    ch->SetCma(false, msg);
  }
  if (ctx_.Setting(options::kShmNotifyRing) != 0) {
    if (Status s = ch->OpenRing(uds, deadline); !s.ok()) {
      HIXL_LOG(INFO) << "shm: notifications to " << peer.engine
                     << " go over the control link: " << s.message();
    }
  }
  out = std::move(ch);
  return Status::Ok();
}

Status ShmChannel::FetchVmm(uint64_t id, net::Fd& fd) {
  wire::Msg req = wire::Msg::object();
  req["t"] = "getvmm";
  req["token"] = token_;
  req["id"] = id;
  if (keyed_) {
    const auth::Tag tag = ShmRequestTag(key_, token_, id);
    req["tag"] = auth::Hex(tag.data(), tag.size());
  }
  wire::Msg reply;
  {
    std::lock_guard<std::mutex> lock(uds_mu_);
    if (Status s = Ask(uds_.get(), req, reply, fd, net::DeadlineAfterMs(2000)); !s.ok()) {
      return Status::Failed("asking " + engine_ + " for its memory: " + s.message());
    }
  }
  std::string type;
  uint64_t got = 0;
  wire::GetStr(reply, "t", type, 16);
  if (type != "vmm" || !wire::GetU64(reply, "id", got) || got != id || !fd.valid()) {
    std::string reason;
    wire::GetStr(reply, "reason", reason);
    fd = net::Fd();
    return Status::Failed("peer " + engine_ + " did not pass its memory" +
                          (reason.empty() ? "" : ": " + reason));
  }
  return Status::Ok();
}

Status ShmChannel::PrepareRegion(memory::RemoteRegion& r, const wire::Msg* info) {
  if (r.device) {
    return imports_.Prepare(r, info, [this](uint64_t id, net::Fd& fd) { return FetchVmm(id, fd); });
  }
  if (!r.shareable) return Status::Ok();
  wire::Msg req = wire::Msg::object();
  req["t"] = "getfd";
  req["token"] = token_;
  req["id"] = r.id;
  if (keyed_) {
    const auth::Tag tag = ShmRequestTag(key_, token_, r.id);
    req["tag"] = auth::Hex(tag.data(), tag.size());
  }
  net::Fd memfd;
  wire::Msg reply;
  {
    std::lock_guard<std::mutex> lock(uds_mu_);
    if (Status s = Ask(uds_.get(), req, reply, memfd, net::DeadlineAfterMs(2000)); !s.ok()) {
      return Status::Failed("shm: requesting region " + std::to_string(r.id) + " from " + engine_ +
                            ": " + s.message());
    }
  }
  std::string type;
  wire::GetStr(reply, "t", type, 16);
  uint64_t id = 0, lo = 0, n = 0, off = 0;
  bool unsealed = false;
  if (type != "fd" || !wire::GetU64(reply, "id", id) || id != r.id ||
      !wire::GetU64(reply, "lo", lo) || !wire::GetU64(reply, "n", n) ||
      !wire::GetU64(reply, "off", off) || !wire::GetBool(reply, "unsealed", unsealed) ||
      !memfd.valid()) {
    std::string reason;
    wire::GetStr(reply, "reason", reason);
    return Status::Failed("shm: peer " + engine_ + " did not pass region " + std::to_string(r.id) +
                          (reason.empty() ? "" : ": " + reason));
  }
  const std::string what = "shm: region " + std::to_string(r.id) + " from " + engine_;
  // The mapped part lies inside the region, and inside the file.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (n == 0 || lo > r.len || n > r.len - lo || off > UINT64_MAX - n ||
      off + n > static_cast<uint64_t>(INT64_MAX)) {
    return Status::Failed(what + ": the peer described a mapping outside the region");
  }
  // Never map something that could shrink under us (SIGBUS) or is shorter
  // than what we map. A file its owner cannot seal is mapped only when the
  // owner registered it with REGISTER_SHARE_BY_MAPPING, promising not to
  // truncate it.
  struct stat st;
  int seals = fcntl(memfd.get(), F_GET_SEALS);
  bool sealed = seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
  if (fstat(memfd.get(), &st) != 0 || !S_ISREG(st.st_mode) || (!sealed && !unsealed) ||
      static_cast<uint64_t>(st.st_size) < off + n) {
    return Status::Failed(what + " is not a sealed file covering the region; refusing to map it");
  }
  const uint64_t base_off = off / page * page;
  const size_t map_len = static_cast<size_t>((off - base_off) + n);
  void* p = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(),
                 static_cast<off_t>(base_off));
  if (p == MAP_FAILED) return net::ErrnoStatus(what + ": mmap", errno);
  r.map_base = p;
  r.map_len = map_len;
  r.mapped = static_cast<char*>(p) + (off - base_off);
  r.map_lo = r.addr + lo;
  r.map_hi = r.map_lo + n;
  return Status::Ok();
}

std::vector<ShmChannel::Part> ShmChannel::Split(const Transfer& t) const {
  const size_t total = t.bytes();
  size_t n = static_cast<size_t>(std::max(1, ctx_.copy_threads));
  n = std::min(n, std::max<size_t>(1, total / kMinPart));
  const size_t per = (total + n - 1) / n;
  std::vector<Part> parts;
  size_t i = 0, off = 0;  // where the next part starts: slice i, byte off
  for (size_t k = 0; k < n && i < t.slices.size(); ++k) {
    size_t want = (k + 1 == n) ? SIZE_MAX : per;
    Part p;
    p.begin = i;
    p.first_off = off;
    while (i < t.slices.size() && want > 0) {
      size_t left = t.slices[i].len - off;
      if (left <= want) {
        want -= left;
        p.last_end = t.slices[i].len;
        ++i;
        off = 0;
        p.end = i;
      } else {  // the part ends inside slice i; the next one resumes there
        off += want;
        p.last_end = off;
        p.end = i + 1;
        want = 0;
      }
    }
    parts.push_back(p);
  }
  return parts;
}

void ShmChannel::CopyMapped(TransferOp op, const memory::RemoteRegion& g, uintptr_t local,
                            uintptr_t remote, size_t len, bool stream) {
  char* mine = reinterpret_cast<char*>(local);
  char* theirs = g.mapped + (remote - g.map_lo);
  char* to = op == TransferOp::WRITE ? theirs : mine;
  const char* from = op == TransferOp::WRITE ? mine : theirs;
  if (stream) {
    StreamCopy(to, from, len);
  } else {
    std::memcpy(to, from, len);
  }
}

Status ShmChannel::CopyWithDevice(TransferOp op, const memory::RemoteRegion& g, int local_device,
                                  uintptr_t local, uintptr_t remote, size_t len,
                                  const device::StreamEvent& after) const {
  if (g.device) {
    // Imported whole (DeviceImports::Prepare): remote lies in the mapping.
    if (g.mapped == nullptr) {
      return Status::Unsupported("region " + std::to_string(g.id) + " of " + engine_ +
                                 " is device memory this process could not open");
    }
    return CopyDevice(op, local, g.mapped + (remote - g.map_lo), len, g.device_ordinal, after);
  }
  // Local device memory; the peer's host memory mapped here where it is,
  // else reached by cross-memory attach through a host buffer.
  const uintptr_t b = remote + len;
  const uintptr_t m0 = g.mapped ? std::min(std::max(g.map_lo, remote), b) : b;
  const uintptr_t m1 = g.mapped ? std::max(std::min(g.map_hi, b), m0) : b;
  auto staged = [&](uintptr_t from, uintptr_t to) -> Status {
    char* buf = StagingBuffer();
    for (uintptr_t x = from; x < to;) {
      const size_t n = std::min<size_t>(to - x, kStageBytes);
      void* dev = reinterpret_cast<void*>(local + (x - remote));
      iovec l{buf, n};
      iovec r{reinterpret_cast<void*>(x), n};
      if (op == TransferOp::WRITE) {
        if (Status s = device::Copy(buf, dev, n, local_device, after); !s.ok()) return s;
        if (Status s = CopyCma(op, &l, &r, 1, n); !s.ok()) return s;
      } else {
        if (Status s = CopyCma(op, &l, &r, 1, n); !s.ok()) return s;
        if (Status s = device::Copy(dev, buf, n, local_device, after); !s.ok()) return s;
      }
      x += n;
    }
    return Status::Ok();
  };
  if (m0 > remote) {
    if (Status s = staged(remote, m0); !s.ok()) return s;
  }
  if (m1 > m0) {
    Status s = CopyDevice(op, local + (m0 - remote), g.mapped + (m0 - g.map_lo), m1 - m0,
                          local_device, after);
    if (!s.ok()) return s;
  }
  if (b > m1) return staged(m1, b);
  return Status::Ok();
}

Status ShmChannel::CopyCma(TransferOp op, const iovec* local, const iovec* remote, size_t n,
                           size_t bytes) const {
  if (!cma_ok_) return Status::Unsupported(cma_error_);
  // process_vm_* moves fewer bytes than asked only when it meets a fault.
  ssize_t r = op == TransferOp::WRITE ? process_vm_writev(pid_, local, n, remote, n, 0)
                                      : process_vm_readv(pid_, local, n, remote, n, 0);
  if (r < 0) {
    int err = errno;
    if (err == ESRCH) return Status::NotConnected("peer " + engine_ + " process is gone");
    if (err == EFAULT) {
      return Status::Failed("cross-memory attach to " + engine_ +
                            " hit unmapped memory (a local buffer is invalid, or the peer freed a "
                            "region it had registered)");
    }
    return net::ErrnoStatus("cross-memory attach to " + engine_, err);
  }
  if (static_cast<size_t>(r) != bytes) {
    return Status::Failed("cross-memory attach to " + engine_ + " moved " + std::to_string(r) +
                          " of " + std::to_string(bytes) +
                          " bytes (part of a local buffer or of the peer's region is not mapped)");
  }
  return Status::Ok();
}

Status ShmChannel::RunPart(TransferOp op, const memory::Slice* slices, const Part& p,
                           const Transfer* t, net::Deadline deadline) const {
  iovec liov[kIovMax], riov[kIovMax];
  size_t n = 0, batch_bytes = 0;
  auto flush = [&]() -> Status {
    if (n == 0) return Status::Ok();
    Status s = CopyCma(op, liov, riov, n, batch_bytes);
    n = 0;
    batch_bytes = 0;
    return s;
  };
  auto cma = [&](uintptr_t local, uintptr_t remote, size_t len) -> Status {
    liov[n] = {reinterpret_cast<void*>(local), len};
    riov[n] = {reinterpret_cast<void*>(remote), len};
    ++n;
    batch_bytes += len;
    return (n == kIovMax || batch_bytes >= kChunk) ? flush() : Status::Ok();
  };
  size_t since_check = 0;
  bool first = true;
  for (size_t i = p.begin; i < p.end; ++i) {
    const memory::Slice& s = slices[i];
    const memory::RemoteRegion& g = *s.region;
    size_t off = (i == p.begin) ? p.first_off : 0;
    size_t end = (i + 1 == p.end) ? p.last_end : s.len;
    while (off < end) {
      size_t len = std::min(end - off, kChunk);
      if (since_check >= kChunk || (i - p.begin) % 1024 == 0) {
        // The first check skips the clock: the deadline was just set, and a
        // timeout reaches a running part as a stop request anyway.
        Status c;
        if (t != nullptr) {
          c = first ? t->CheckStop() : t->CheckContinue();
        } else if (!first && deadline != net::Deadline::max() && net::Clock::now() >= deadline) {
          c = Status::Timeout("transfer deadline passed");
        }
        first = false;
        if (!c.ok()) return c;
        if (closed_.load(std::memory_order_acquire)) {
          return Status::NotConnected("link to " + engine_ + " was closed");
        }
        since_check = 0;
      }
      const uintptr_t a = s.remote + off, b = a + len, local = s.local + off;
      if (g.device || s.local_device >= 0) {
        if (Status st = flush(); !st.ok()) return st;  // keep the descriptors' order
        const device::StreamEvent none;
        Status st = CopyWithDevice(op, g, s.local_device, local, a, len, t ? t->after : none);
        if (!st.ok()) return st;
      } else if (g.mapped == nullptr) {
        if (Status st = cma(local, a, len); !st.ok()) return st;
      } else {
        // The mapped part [m0, m1) is a memory copy; bytes of the region
        // outside it (a page it shares with other memory) go by CMA.
        const uintptr_t m0 = std::min(std::max(g.map_lo, a), b);
        const uintptr_t m1 = std::max(std::min(g.map_hi, b), m0);
        if (m0 > a) {
          if (Status st = cma(local, a, m0 - a); !st.ok()) return st;
        }
        if (m1 > m0) {
          if (Status st = flush(); !st.ok()) return st;  // keep the descriptors' order
          CopyMapped(op, g, local + (m0 - a), m0, m1 - m0, p.stream);
        }
        if (b > m1) {
          if (Status st = cma(local + (m1 - a), m1, b - m1); !st.ok()) return st;
        }
      }
      off += len;
      since_check += len;
    }
  }
  return flush();
}

void ShmChannel::Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) {
  // A small transfer runs on the calling thread even when the caller does not
  // wait for it: handing it to a copy thread (a wake-up) costs more than the
  // copy, and a copy never blocks on the peer.
  if (t->bytes() <= kInlineBytes) caller_waits = true;
  if (ctx_.copy_threads <= 1 || t->bytes() < 2 * kMinPart) {  // one part: no split
    const Part whole{0, t->slices.size(), 0, t->slices.empty() ? 0 : t->slices.back().len,
                     StreamParts(t->bytes(), 1)};
    t->SetParts(1);
    if (caller_waits) {
      t->PartDone(RunPart(*t, whole));
    } else if (!ctx_.copy_pool->Submit([this, t, whole] { t->PartDone(RunPart(*t, whole)); })) {
      t->PartDone(Status::Failed("engine is shutting down"));
    }
    return;
  }
  std::vector<Part> parts = Split(*t);
  t->SetParts(static_cast<int>(parts.size()));
  const bool stream = StreamParts(t->bytes(), parts.size());
  for (Part& p : parts) p.stream = stream;
  size_t first_pooled = caller_waits ? 1 : 0;
  for (size_t i = first_pooled; i < parts.size(); ++i) {
    Part p = parts[i];
    bool queued = ctx_.copy_pool->Submit([this, t, p] { t->PartDone(RunPart(*t, p)); });
    if (!queued) t->PartDone(Status::Failed("engine is shutting down"));
  }
  if (caller_waits) t->PartDone(RunPart(*t, parts[0]));
}

}  // namespace

std::vector<TransportOption> ShmOptions() {
  return {{options::kShmNotifyRing, 0, 1, 1, "0 or 1"},
          {options::kShmStreamCopyBytes, -1, INT64_MAX, -1, "-1 (auto), 0 (never) or bytes"}};
}

std::unique_ptr<Transport> MakeShmTransport(const TransportContext& ctx) {
  return std::make_unique<ShmTransport>(ctx);
}

Status AllocShareable(size_t size, int& memfd, void*& addr, size_t& mapped_len) {
  constexpr size_t kHuge = 2u << 20;
  // Huge pages first when the size suits them; the system may have none.
  for (bool huge : {true, false}) {
    if (huge && size < kHuge) continue;
    size_t len = RoundUp(size, huge ? kHuge : static_cast<size_t>(sysconf(_SC_PAGESIZE)));
    unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0u);
    net::Fd fd(memfd_create("hixl-mem", flags));
    if (!fd.valid()) {
      if (huge) continue;
      return net::ErrnoStatus("memfd_create", errno);
    }
    if (ftruncate(fd.get(), static_cast<off_t>(len)) != 0) {
      if (huge) continue;
      return net::ErrnoStatus("ftruncate of memfd", errno);
    }
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
      if (huge) continue;
      return net::ErrnoStatus("mmap of memfd", errno);
    }
    // Commit the pages now (as a device allocator would): the first transfer
    // into fresh memory would otherwise pay for allocating every page, and
    // huge pages could SIGBUS later if the pool ran dry.
    if (madvise(p, len, MADV_POPULATE_WRITE) != 0) {
      int err = errno;
      munmap(p, len);
      if (huge) continue;
      return net::ErrnoStatus("committing shareable memory", err);
    }
    if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      munmap(p, len);
      if (huge) continue;
      return net::ErrnoStatus("sealing memfd", errno);
    }
    memfd = fd.release();
    addr = p;
    mapped_len = len;
    return Status::Ok();
  }
  return Status::ResourceExhausted("cannot allocate shareable memory");
}

}  // namespace hixl::transport::shm
