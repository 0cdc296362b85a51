// Hixl::Impl — the engine: local regions, peers, requests, the control plane
// (listener, handshake, region updates) and the transports. Implemented in
// engine.cc and control_plane.cc (the loop thread's part).
//
// Threads: the caller's threads run transfers (small ones inline); the copy
// pool runs parts of large and async transfers; one event-loop thread owns
// every control connection; each transport may run its own threads (shm: the
// Unix-socket server that hands out memfds).
#ifndef HIXL_ENGINE_ENGINE_H_
#define HIXL_ENGINE_ENGINE_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/event_loop.h"
#include "common/net.h"
#include "common/thread_pool.h"
#include "common/wire.h"
#include "control/protocol.h"
#include "device/cuda.h"
#include "engine/done_ids.h"
#include "engine/naming.h"
#include "engine/notify_inbox.h"
#include "engine/options.h"
#include "hixl/hixl.h"
#include "memory/local_regions.h"
#include "memory/remote_regions.h"
#include "memory/user_share.h"
#include "transport/transport.h"

namespace hixl {

// Shared by engine.cc and control_plane.cc.
namespace engine_detail {
inline constexpr int kIdleTickMs = 50;  // control-loop tick with nothing pending
inline constexpr int kBusyTickMs = 1;   // while region revokes wait for acknowledgements
}  // namespace engine_detail

class Hixl::Impl {
 public:
  Impl() = default;
  ~Impl() { Finalize(); }

  Status Initialize(const std::string& local_engine,
                    const std::map<std::string, std::string>& opts);
  void Finalize();
  std::string LocalEngine() const;

  Status RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle, uint32_t perms,
                     uint32_t flags);
  Status DeregisterMem(MemHandle handle);
  Status AllocMem(size_t size, MemType type, void** ptr);
  Status FreeMem(void* ptr);
  Status GetMemHandle(void* ptr, MemHandle& handle) const;

  Status Connect(const std::string& remote, int32_t timeout_ms);
  Status ConnectAsync(const std::string& remote, int32_t timeout_ms);
  Status GetConnectStatus(const std::string& remote, ConnectStatus& status, Status* reason) const;
  Status Disconnect(const std::string& remote, int32_t timeout_ms);
  Status GetLinkType(const std::string& remote, LinkType& type) const;
  Status GetPeerGeneration(const std::string& remote, uint64_t& generation) const;
  Status ListEngines(std::vector<EngineRecord>& out) const;
  Status GetTransports(std::vector<TransportInfo>& out) const;
  Status GetPeerStats(const std::string& remote, PeerStats& out) const;
  uint64_t Generation() const { return initialized_.load() ? generation_ : 0; }
  Status SetLocalInfo(const std::string& info);
  Status GetPeerInfo(const std::string& remote, std::string& info) const;

  Status TransferSync(const std::string& remote, TransferOp op,
                      const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                      int32_t timeout_ms);
  Status TransferAsync(const std::string& remote, TransferOp op,
                       const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                       TransferReq& req);
  Status GetTransferStatus(TransferReq req, TransferStatus& status, Status* reason);
  Status CancelTransfer(TransferReq req);

  Status SendNotify(const std::string& remote, const NotifyDesc& notify, int32_t timeout_ms);
  Status GetNotifies(std::vector<NotifyDesc>& out);
  Status SetNotifyCallback(NotifyCallback cb);

 private:
  using Options = engine::Options;
  struct Tx;
  // A peer this engine connected to (we initiate transfers to it).
  struct Peer {
    std::string name;
    uint64_t generation = 0;
    int64_t pid = 0;
    std::string info;  // its SetLocalInfo string, from the welcome
    memory::RemoteRegionTable regions;
    std::unique_ptr<transport::Channel> channel;
    const char* channel_transport = nullptr;  // the transport that made channel (its name)
    std::atomic<bool> alive{true};
    // Set while MaxPeers eviction decides on the peer (peers_mu_ held): a
    // thread taking it from its peer cache backs off (AcquirePeer).
    std::atomic<bool> evicting{false};
    std::atomic<uint64_t> conn_id{0};   // its control connection (set on the loop)
    std::shared_ptr<Tx> tx;             // its control connection's sending half (set before use)
    std::atomic<int> active{0};         // transfers and notifications in flight
    std::atomic<int64_t> last_used{0};  // logical use time, for least-recently-used eviction
    std::atomic<int> ctl_notifies{0};   // notifications sent on the control link, unanswered
    bool authenticated = false;         // the link authenticated both ways
    std::atomic<int> hb_ms{0};          // the link's heartbeat interval
    std::atomic<int64_t> last_rx_ns{0};  // steady clock, when its control link last got bytes
  };
  // Releases Peer::active when the last copy goes (held by a transfer).
  static std::shared_ptr<const void> ActiveToken(const std::shared_ptr<Peer>& p);
  // The sending half of a control connection, shared by the loop thread and
  // by threads that send a notification straight away (no hop through the
  // loop). Frames go out whole and in order; what the socket does not take at
  // once waits in outq for EPOLLOUT.
  struct Tx {
    std::mutex mu;
    int fd = -1;           // -1 once the connection closed
    uint64_t loop_id = 0;  // 0 until the loop registered the connection
    bool out_armed = false;
    std::deque<std::vector<uint8_t>> outq;
    size_t out_off = 0;
  };
  // A control connection; owned by the loop thread.
  struct Conn {
    uint64_t id = 0;
    net::Fd fd;
    uint64_t loop_id = 0;
    bool accepted = false;     // a peer connected to us
    bool established = false;  // handshake done
    net::Deadline hello_deadline = net::Deadline::max();
    std::string peer_name;
    wire::FrameReader reader;
    std::shared_ptr<Tx> tx = std::make_shared<Tx>();
    std::shared_ptr<Peer> peer;  // outbound connections
    int hb_ms = 1000;            // this link's heartbeat interval: min of both sides'
    // Accepted links: the initiator's host, pid and LinkType (its hello).
    transport::LostPeer peer_view;
    int64_t peer_pid = 0;
    // Accepted connections while the target waits for the initiator's proof
    // (after its challenge): the hello, and the target's nonce.
    bool awaiting_auth = false;
    bool probed = false;  // its first message was a probe: nothing more is accepted
    control::Hello hello;
    auth::Nonce sn{};
    // The link authenticated both ways; its key binds the data connections.
    bool authenticated = false;
    auth::Key link_key{};
    net::Clock::time_point last_rx = net::Clock::now();
    net::Clock::time_point last_tx = net::Clock::now();
  };
  // A notification sent, waiting for the target's answer.
  // One that passed its deadline has reported TIMEOUT (done is empty) but
  // stays until the target answers or the link closes: its frame may still
  // be delivered, and no later notification may overtake it (answered runs
  // then).
  struct PendingNotify {
    std::shared_ptr<Tx> tx;  // the link it went out on
    net::Deadline deadline;
    std::function<void(Status)> done;
    bool fence = false;  // a lane fence (lfence) rather than a notification
    std::function<void()> answered;  // once the frame is answered or its link gone
  };
  struct ConnectAttempt {
    ConnectStatus state = ConnectStatus::CONNECTING;
    Status reason;
  };
  // A peer's removal of regions, acknowledged once no transfer references
  // any of them (each weak reference has expired).
  struct Revoke {
    uint64_t conn_id;
    uint64_t seq;
    std::vector<std::weak_ptr<memory::RemoteRegion>> regions;
  };
  // An accepted link this engine dropped (hung, silent, did not confirm a
  // removal) while its peer may still have had writes on their way.
  struct DroppedPeer {
    transport::LostPeer view;
    int64_t pid = 0;
  };
  struct DeregWait {
    bool sent = false;
    std::set<uint64_t> waiting;  // accepted connections yet to acknowledge
    std::map<uint64_t, std::pair<std::string, DroppedPeer>> who;  // their peers
  };
  struct Alloc {
    int memfd = -1;
    size_t mapped_len = 0;
    MemHandle handle = 0;
    // The transport whose memory it is (Transport::AllocHost), or null: the
    // engine's own mapping. A transport's memory goes with the transport
    // at Finalize, never by munmap.
    transport::Transport* by = nullptr;
    bool device = false;  // CUDA device memory (device::Alloc)
  };
  // Gives back the memory of an allocation that never reached the application.
  static void ReleaseAlloc(void* p, const Alloc& a);

  // One of a thread's recent peers (AcquirePeer): found again without the
  // peer table's lock, with the region the thread last resolved against.
  // Weak references: a cache keeps nothing alive.
  struct PeerCacheEntry {
    const Impl* engine = nullptr;
    uint64_t serial = 0;  // the engine's (an address may be reused)
    std::string remote;   // as the caller named it
    std::weak_ptr<Peer> peer;
    memory::RegionHint region;
  };
  static constexpr size_t kPeerCacheSize = 4;
  static PeerCacheEntry* ThreadPeerCache();  // kPeerCacheSize entries

  Status CheckInitialized() const;
  std::shared_ptr<Peer> FindPeer(const std::string& remote) const;
  // Finds (or with AutoConnect, connects) the peer and counts one activity on
  // it (Peer::active) so it is not evicted; the caller releases it. hint
  // (optional) gets the calling thread's region hint for that peer, valid
  // until this thread's next AcquirePeer.
  Status AcquirePeer(const std::string& remote, net::Deadline deadline, std::shared_ptr<Peer>& out,
                     memory::RegionHint** hint = nullptr);
  // Checks a transfer's arguments, acquires its peer (one activity counted)
  // and resolves the descriptors against the peer's regions into slices and
  // pins (RemoteRegionTable::Resolve). On success the caller owns the count
  // and the pins, and after holds TransferArgs::stream's event (null without
  // a stream; the calling thread has waited for it when some local memory is
  // host memory); on failure nothing is held.
  Status Resolve(const std::string& remote, TransferOp op, const std::vector<TransferOpDesc>& descs,
                 const TransferArgs& args, net::Deadline deadline, std::shared_ptr<Peer>& peer,
                 std::vector<memory::Slice>& slices, std::vector<memory::RegionRef>& pins,
                 device::StreamEvent& after);
  // True when the resolved transfer may run through Channel::RunInline (no
  // notification, within the channel's InlineLimit; for a caller that does
  // not wait, only on a channel whose RunInline never waits for the peer).
  static bool CanRunInline(const Peer& peer, const std::vector<memory::Slice>& slices,
                           const TransferArgs& args, bool caller_waits);
  // TransferArgs::stream: records its event (see Resolve).
  static Status AfterStream(void* stream, const std::vector<memory::Slice>& slices,
                            device::StreamEvent& after);
  // The request object of a resolved transfer; it takes over the pins and
  // the peer's activity count (slices and pins are left empty).
  std::shared_ptr<transport::Transfer> MakeTransfer(const std::shared_ptr<Peer>& peer,
                                                    TransferOp op, const TransferArgs& args,
                                                    net::Deadline deadline,
                                                    std::vector<memory::Slice>& slices,
                                                    std::vector<memory::RegionRef>& pins);
  // Evicts idle peers when a new link would pass MaxPeers (peers_mu_ held).
  Status MakeRoomLocked(std::vector<std::shared_ptr<Peer>>& evicted);
  void DropPeer(const std::shared_ptr<Peer>& peer, net::Deadline drain_until,
                const std::string& why);
  // Sends a notification over peer's control link; done runs exactly once.
  void PostNotify(const std::shared_ptr<Peer>& peer, const NotifyDesc& d, net::Deadline deadline,
                  std::function<void(Status)> done);
  // The initiator's side of the handshake; *link_key is set when the link
  // authenticated (AuthSecret).
  Status Handshake(const net::HostPort& to, net::Deadline deadline, net::Fd& fd,
                   control::Welcome& welcome, std::optional<auth::Key>* link_key);
  int LinkHeartbeatMs(uint32_t peer_hb_ms) const {
    return std::min(opts_.hb_interval_ms, static_cast<int>(peer_hb_ms));
  }
  Status MakePeer(const std::string& name, const std::string& address, const control::Welcome& w,
                  const std::optional<auth::Key>& link_key, net::Deadline deadline,
                  std::shared_ptr<Peer>& out);
  void AddRemoteRegions(Peer& peer, const std::vector<control::RegionDesc>& regions);
  // peer.channel's transport cannot reach device memory (UCX without CUDA):
  // pairs it with tcp lanes to the same peer, opened on the first transfer
  // that touches device memory (transport/device_lanes.h). Left alone where
  // the peer offers no tcp endpoint (device transfers are then refused).
  void PairWithDeviceLanes(Peer& peer, const transport::PeerInfo& info,
                           const control::Welcome& w, const std::optional<auth::Key>& link_key);
  void BroadcastRegionAdd(std::vector<control::RegionDesc> regions);
  // r's entry for peers, with each transport's part (Transport::DescribeRegion).
  control::RegionDesc ToDesc(const memory::LocalRegion& r) const;
  // RegisterMem's check that the memory is of the type it names; fills dev
  // for device memory.
  static Status CheckMemType(const MemDesc& mem, MemType type, uint32_t flags,
                             device::PtrInfo& dev);
  Status RegisterDevice(const MemDesc& mem, uint32_t perms, const device::PtrInfo& dev,
                        MemHandle& handle);
  Status AllocDevice(size_t size, void** ptr);
  // After Resolve: marks the slices whose local side lies in registered
  // device memory, and refuses device memory a link cannot move.
  Status CheckDevice(const Peer& peer, const std::string& remote,
                     std::vector<memory::Slice>& slices) const;
  // Lets every transport prepare a just-added region; on an error undoes it
  // (the region is removed again) and returns the error.
  Status PrepareLocalRegion(const memory::LocalRegion& r);
  // Tells every accepted peer that region_id is gone and waits (up to
  // DeregisterTimeoutMs) for each to confirm; the links of those that did
  // not are dropped (and remembered in dropped_).
  void RevokeFromPeers(uint64_t region_id);
  // The transports through which peers whose links this engine dropped may
  // still reach r ("shm, ucx"; names in *who); empty when none can.
  std::string StillReachable(const memory::LocalRegion& r, std::vector<std::string>* who);
  void FreeAllocs();

  // Loop thread only.
  void OnAccept();
  void AddConn(std::unique_ptr<Conn> c);
  void OnConnEvent(uint64_t id, uint32_t events);
  void Send(Conn& c, const wire::Msg& m);
  // Any thread: queues a frame on tx and sends what the socket takes now.
  // False when the connection has closed.
  bool SendFrame(Tx& tx, std::vector<uint8_t> frame);
  bool FlushLocked(Tx& tx);  // tx.mu held; false on a socket error
  void CloseTx(Tx& tx);
  Status HandleMessage(Conn& c, const wire::Msg& m);
  Status HandleHello(Conn& c, const wire::Msg& m);
  Status HandleAuth(Conn& c, const wire::Msg& m);
  // Target side: the handshake succeeded (authenticated or not needed).
  void SendWelcome(Conn& c, const control::Hello& h);
  void CloseConn(uint64_t id, const std::string& why, bool quiet);
  void CheckRevokes();
  void OnTick();
  void TightenTick(int hb_ms);
  void FailPendingNotifies(const Tx* tx, const Status& why);  // nullptr: all
  // Sends lfence on peer's control connection; done runs once the target
  // answered, the link closed, or the heartbeat bound passed.
  void PostLaneFence(const std::shared_ptr<Peer>& peer, std::function<void()> done);
  bool FencePending(const Tx* tx);
  Status HandleNotify(Conn& c, const wire::Msg& m);

  Options opts_;
  const uint64_t serial_ = NextSerial();
  static uint64_t NextSerial();
  std::atomic<bool> initialized_{false};
  std::string local_engine_;
  bool listening_ = false;
  uint64_t generation_ = 0;
  mutable std::mutex info_mu_;
  std::string local_info_;  // handed to peers in the welcome

  memory::LocalRegions regions_;
  ThreadPool copy_pool_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  // Where a remote engine string leads: an "ip:port" is itself (key: its
  // canonical form, want_gen 0); with MetadataServer, a name resolves to the
  // registered address and generation (key: the name).
  Status ResolveRemote(const std::string& remote, const char* what, net::HostPort& hp,
                       std::string& key, uint64_t& want_gen);
  engine::Naming naming_;
  std::string unavailable_;  // why transports that failed to start did (set in Initialize)
  std::vector<TransportInfo> transport_infos_;  // every transport's state (set in Initialize)
  EventLoop loop_;
  net::Fd listen_fd_;

  // Loop-thread state.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::vector<Revoke> revokes_;
  uint64_t next_conn_id_ = 1;

  mutable std::mutex peers_mu_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  std::set<std::string> connecting_;

  std::mutex req_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<transport::Transfer>> reqs_;
  size_t deadline_reqs_ = 0;  // requests in reqs_ with a deadline
  engine::DoneIds done_ids_;  // requests that ended inside TransferAsync, unreported
  uint64_t next_req_ = 1;

  std::mutex alloc_mu_;
  std::unordered_map<void*, Alloc> allocs_;
  // FreeMem'd ranges that a dropped peer may still write (StillReachable):
  // fresh throwaway pages, unmapped by Finalize once the transports stopped.
  std::vector<std::pair<void*, size_t>> quarantined_;
  // Device memory FreeMem could not release yet (a dropped peer may still
  // copy into it): freed at Finalize.
  std::vector<void*> held_device_;
  // Registered device regions: transfers look their local side up only
  // while there are any.
  std::atomic<int> device_regions_{0};
  // Registered application memory local peers map (memory/user_share.h),
  // by handle. share_mu_ serializes RegisterMem/DeregisterMem of such
  // memory: a move of pages must not race another on the same pages.
  std::mutex share_mu_;
  std::unordered_map<MemHandle, std::unique_ptr<memory::UserShare>> shares_;

  // Notifications awaiting the target's answer.
  std::mutex pending_mu_;
  std::unordered_map<uint64_t, PendingNotify> pending_notifies_;
  std::atomic<uint64_t> next_notify_seq_{1};
  int idle_tick_ms_ = 50;

  // Received notifications.
  engine::NotifyInbox inbox_;

  mutable std::mutex connect_mu_;
  std::unordered_map<std::string, ConnectAttempt> attempts_;
  struct ConnectThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<ConnectThread> connect_threads_;

  std::mutex dereg_mu_;
  std::condition_variable dereg_cv_;
  std::unordered_map<uint64_t, DeregWait> dereg_waits_;
  // By engine name, until it links again or (same host) its process is gone.
  std::map<std::string, DroppedPeer> dropped_;
  uint64_t next_seq_ = 1;
};

}  // namespace hixl

#endif  // HIXL_ENGINE_ENGINE_H_
