// The interface every transport implements, and the registry that creates
// them by name.
//
// A Transport is created once per engine. On the target side it adds what a
// peer needs to reach it to the handshake (DescribeForPeer). On the
// initiator side Connect turns the peer's handshake into a Channel, which
// prepares remote regions for access and executes transfers.
// Transports never validate descriptors against the peer's table themselves
// for the initiator (the engine has done it); a transport whose target side
// receives data (tcp) validates again against its own LocalRegions.
// Thread safety: Transport and Channel methods may be called from any thread.
#ifndef HIXL_TRANSPORT_TRANSPORT_H_
#define HIXL_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "auth/auth.h"
#include "common/net.h"
#include "common/thread_pool.h"
#include "common/wire.h"
#include "hixl/hixl.h"
#include "memory/local_regions.h"
#include "memory/remote_regions.h"
#include "transport/notify_ring.h"
#include "transport/transfer.h"

namespace hixl::transport {

// Target side: where notifications that a transport carries by itself land
// (the engine's inbox). Implemented by the engine; may be called from any
// thread of the transport.
class NotifySink {
 public:
  virtual ~NotifySink() = default;
  // Takes the receiving end of a ring the initiator of accepted link conn_id
  // will post into. False when that link is not (or no longer) open: the
  // ring is dropped and must not be handed out.
  virtual bool AttachRing(uint64_t conn_id, std::unique_ptr<NotifyRing> ring) = 0;
};

// What Channel::TryNotify did with a notification.
enum class NotifyPath {
  kPosted,       // it is in the target's queue
  kUnavailable,  // no path of the channel's own now: send it over the control link
  kClosed,       // the target closed the path: its link is closing
  kMaybe,        // the target closed the path while it was posted: it may or may not have it
};

// What the engine learned about a peer in the handshake.
struct PeerInfo {
  std::string engine;
  std::string address;  // the peer's IP as this engine reached it
  uint64_t generation = 0;
  std::string host_id;
  int64_t pid = 0;
  const wire::Msg* info = nullptr;  // this transport's section of the handshake, or null
  // The link's key when it authenticated (auth/auth.h): the transport binds
  // its own connections to it. Null: an unauthenticated link.
  const auth::Key* link_key = nullptr;
  // Asks the target, over the link's control connection, to close this
  // link's data connections, and calls done once it confirmed (or the link
  // is gone, or the heartbeat bound passed). A transport whose bytes may
  // still be on their way to the target when it gives up a connection ends
  // those transfers only from done, so nothing lands after they ended.
  // Never blocks; done may run on another thread.
  std::function<void(std::function<void()> done)> fence;
  // The application chose this transport's LinkType (not AUTO).
  bool chosen = false;
};

// An option a transport declares (its key is accepted by Initialize, its
// value reaches the transport through TransportContext::Setting): an integer
// in [lo, hi], or, with choices, one of those words (stored as its index).
struct TransportOption {
  const char* key;
  int64_t lo, hi, def;
  const char* expect;  // what an error message says a value must be
  std::vector<std::string> choices = {};
};

// Engine services a transport may use. Pointers outlive the transport.
struct TransportContext {
  uint64_t generation = 0;
  bool listening = false;  // the engine accepts peers
  memory::LocalRegions* regions = nullptr;
  ThreadPool* copy_pool = nullptr;
  int copy_threads = 1;
  // PollSpinUs: how long I/O threads keep polling after activity.
  int poll_spin_us = 0;
  std::string listen_host;  // the control listener's IP
  // How long an accepted connection may take to prove it belongs to a link
  // (HandshakeTimeoutMs): the control handshake, a data connection's hello.
  int handshake_timeout_ms = 5000;
  // HeartbeatIntervalMs x HeartbeatMisses: how long peers wait before they
  // give this engine up. A target that could not run for that long fences
  // its data connections (peers have declared it dead); an initiator waits
  // about that long for answers of a stopped transfer before resetting.
  int hb_bound_ms = 3000;
  int hb_interval_ms = 1000;
  // The engine's LinkType option (AUTO, or the transport every link uses).
  LinkType link = LinkType::AUTO;
  // Values of every transport's own options (TransportOption), defaults
  // filled in; keyed by option name.
  std::map<std::string, int64_t> settings;
  // Target side: receives notifications a transport carries itself (null:
  // the transport offers no such path).
  NotifySink* notify_sink = nullptr;
  // The value of option key (its declared default when absent).
  int64_t Setting(const char* key) const;
};

class Channel {
 public:
  virtual ~Channel() = default;
  virtual LinkType link_type() const = 0;
  // The link whose rules device memory follows on this channel: link_type(),
  // unless device transfers go elsewhere (DeviceLanesChannel).
  virtual LinkType device_link_type() const { return link_type(); }
  // Makes a remote region usable (e.g. maps the peer's shared memory) before
  // the engine publishes it to transfers. info: this transport's part of the
  // region's entry (Transport::DescribeRegion on the target), or null.
  virtual Status PrepareRegion(memory::RemoteRegion& r, const wire::Msg* info) = 0;
  // Starts t. When caller_waits the transport may run it on the calling
  // thread. The transport ends t exactly once (through Transfer::PartDone).
  virtual void Submit(const std::shared_ptr<Transfer>& t, bool caller_waits) = 0;
  // Transfers of at most this many bytes (and no notification) may run
  // through RunInline instead of Submit; 0: never.
  virtual size_t InlineLimit() const { return 0; }
  // RunInline may have to wait for the peer (UCX: bytes an emulated put
  // still has on their way): then only a caller that waits anyway
  // (TransferSync) runs a transfer inline, never TransferAsync.
  virtual bool InlineMayWait() const { return false; }
  // Moves slices[0, n) on the calling thread and returns how that ended,
  // with the same checks and ordering as a submitted transfer; no Transfer
  // object exists, so nothing can stop it but the deadline and Close. The
  // caller holds the slices' pins until it returns.
  virtual Status RunInline(TransferOp op, const memory::Slice* slices, size_t n,
                           net::Deadline deadline) {
    (void)op;
    (void)slices;
    (void)n;
    (void)deadline;
    return Status::Unsupported("this transport runs no transfer inline");
  }
  // Stops using the peer: transfers not yet finished end FAILED. Bytes the
  // transport already put on their way are let land first, waiting until
  // drain_until at most (a past deadline: the peer is gone or hung, nothing is
  // awaited and the peer drops what it has not applied yet). No transfer of
  // this channel reports its end while a byte of it may still move, and none
  // writes anywhere once all have ended.
  virtual void Close(net::Deadline drain_until) = 0;
  // OK while the channel can move bytes; otherwise why not (e.g. one of its
  // data connections was reset). The engine then drops the link, so the
  // application sees it lost and can connect again.
  virtual Status Health() const { return Status::Ok(); }
  // Called by the engine's control loop every tick: lets the transport end
  // what a stop left waiting (e.g. answers that never come).
  virtual void Poll() {}
  // Posts a notification into the target's queue by the channel's own path
  // (shm: a ring both processes map), ordered after every transfer of this
  // channel that ended before the call. The engine falls back to the control
  // link on kUnavailable and keeps per-link order between the two paths.
  virtual NotifyPath TryNotify(std::string_view name, std::string_view msg) {
    (void)name;
    (void)msg;
    return NotifyPath::kUnavailable;
  }
};

// What a target knows of a peer whose link it dropped (from its hello).
struct LostPeer {
  bool same_host = false;
  LinkType link = LinkType::AUTO;  // the peer's LinkType option: AUTO may be any
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual LinkType link_type() const = 0;
  // Its channels can reach CUDA device memory (the engine pairs those that
  // cannot with tcp lanes for it: DeviceLanesChannel).
  virtual bool ReachesDeviceMemory() const { return true; }
  virtual Status Start() = 0;
  // After Start: what it runs on, for diagnostics (e.g. UCX's version and
  // transports); may be empty.
  virtual std::string Describe() const { return ""; }
  virtual void Stop() = 0;
  // Target side: fills info with what the accepted peer conn_id needs to
  // use this transport; ForgetPeer revokes it. link_key: the link's key when
  // it authenticated (null otherwise); the transport then accepts only
  // connections that prove they hold it.
  virtual void DescribeForPeer(uint64_t conn_id, const auth::Key* link_key, wire::Msg& info) = 0;
  virtual void ForgetPeer(uint64_t conn_id) = 0;
  // Target side: closes the data connections of conn_id's link and returns
  // once none of them can move another byte (PeerInfo::fence's far end).
  virtual void FenceLanes(uint64_t conn_id) { (void)conn_id; }
  // Target side: r was just registered (before any peer hears of it). A
  // transport that must prepare memory for remote access (UCX: map it, pack
  // its remote key) does it here; an error fails the registration.
  virtual Status AddRegion(const memory::LocalRegion& r) {
    (void)r;
    return Status::Ok();
  }
  // AllocMem: host memory of len bytes that this transport moves faster
  // than memory it is handed (UCX over shared memory reaches only segments
  // it allocated itself; others it moves with cross-memory attach), or null
  // with why empty when it has none to offer (the engine allocates). The
  // memory stays the transport's: FreeHost releases it, and Stop arranges
  // for whatever is left to go once the transport can no longer touch it.
  virtual void* AllocHost(size_t len, std::string& why) {
    (void)len;
    why.clear();
    return nullptr;
  }
  // Releases memory from AllocHost, after RevokeRegion of its region.
  virtual void FreeHost(void* p) { (void)p; }
  // Target side: what a peer needs to reach r with this transport (sent in
  // the region's entry of welcome and radd); leave info null for nothing.
  virtual void DescribeRegion(const memory::LocalRegion& r, wire::Msg& info) const {
    (void)r;
    (void)info;
  }
  // Target side: [addr, addr+len) is no longer registered. Returns once no
  // thread of this transport can still move bytes into or out of it.
  virtual void RevokeRegion(uintptr_t addr, size_t len) {
    (void)addr;
    (void)len;
  }
  // Target side: whether a peer whose link was dropped may still move bytes
  // it had already issued into or out of r -- bytes the peer's own process
  // moves (cross-memory attach, UCX's software and cma paths) that nothing
  // in this process can stop. False: ForgetPeer/FenceLanes and RevokeRegion
  // stop every byte of a dropped peer.
  virtual bool LostPeerMayReach(const memory::LocalRegion& r, const LostPeer& peer) const {
    (void)r;
    (void)peer;
    return false;
  }
  // Initiator side.
  virtual bool CanReach(const PeerInfo& peer, std::string& why) const = 0;
  virtual Status Connect(const PeerInfo& peer, net::Deadline deadline,
                         std::unique_ptr<Channel>& out) = 0;
};

class TransportRegistry {
 public:
  using Factory = std::function<std::unique_ptr<Transport>(const TransportContext&)>;
  struct Entry {
    std::string name;
    LinkType type;
    int preference;  // lower is tried first under LinkType AUTO
    Factory factory;
    std::vector<TransportOption> options = {};
  };

  // The process-wide registry, holding the built-in transports.
  static TransportRegistry& Global();

  void Register(Entry e);
  // Entries sorted by preference.
  std::vector<Entry> Entries() const;
  // Every option of every registered transport.
  std::vector<TransportOption> Options() const;

 private:
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace hixl::transport

#endif  // HIXL_TRANSPORT_TRANSPORT_H_
