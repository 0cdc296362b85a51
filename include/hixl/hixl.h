// hixl/hixl.h — the hixl transfer engine: one-sided READ and WRITE into memory
// that another engine registered. From C this header declares the C API
// (hixl/hixl_c.h); from C++ it also declares the class hixl::Hixl below.
//
// An engine (hixl::Hixl) owns a set of registered memory regions and a set of
// links to peer engines. The initiator of a transfer names the peer's own
// virtual addresses inside a region the peer registered; the peer's
// application takes no part in moving the bytes. Every descriptor is checked
// against the peer's region table (bounds and READ/WRITE permission) before
// any byte moves: a batch with one bad descriptor fails whole and touches
// nothing.
//
// Links are directional: after A.Connect(B), A may read from and write to the
// memory B registered. For B to access A's memory, B connects to A.
// Regions registered or deregistered after Connect reach connected peers.
// DeregisterMem returns only after every connected peer has stopped using the
// region: transfers already checked against it have finished, later ones fail.
// A peer that does not confirm within DeregisterTimeoutMs loses its link. Its
// process may still write what it had issued where it writes by itself (shm's
// cross-memory attach on this host; UCX's software RMA and cma): DeregisterMem
// then returns TIMEOUT and the application must keep the memory unused until
// Finalize or until that peer links again; FreeMem keeps the address range
// reserved (fresh pages) until Finalize. tcp, and UCX over RDMA hardware from
// another host, stop such a peer at the target.
//
// Local addresses (TransferOpDesc::local_addr) are plain pointers in the
// calling process; they need not be registered for the shm transport.
//
// Async contract: TransferAsync validates and posts, then returns a TransferReq.
// GetTransferStatus reports WAITING until the request ends, then COMPLETED
// (the data is in the destination memory), FAILED, TIMEOUT or CANCELLED; once
// it has reported an end state the TransferReq is released and further
// queries answer PARAM_INVALID. Local buffers must stay valid until the
// request has ended. Over shm a transfer of up to 64 KiB without a
// notification is copied before TransferAsync returns (its request has
// ended by then; it is still reported once, like any other) and keeps no
// request object: a stream of small ones costs little more than the copies.
//
// Failure semantics: a request that ends TIMEOUT, FAILED or CANCELLED has
// stopped — no byte of it is written afterwards into either side's memory, so
// the caller may reuse its buffers at once. Bytes already on their way when
// it was stopped are let land (or, when the peer is declared dead, are
// discarded by the peer) before the end is reported. Links send heartbeats: a
// peer silent for HeartbeatIntervalMs * HeartbeatMisses is declared dead, its
// requests end FAILED and its metadata is dropped. A restarted peer is a new
// incarnation (new generation): Connect to it again.
//
// Notifications: SendNotify queues a short named message at the peer, which
// takes it with GetNotifies (or a callback). A notification attached to a
// transfer (TransferArgs::notify) is sent only after all of the transfer's
// data is in the target's memory, and the transfer reports COMPLETED only
// once the target has queued the notification.
//
// Thread safety: every method may be called from any thread concurrently,
// except Initialize and Finalize, which must not race with other calls on the
// same object. Ownership: the engine owns memory it returns from AllocMem
// (released by FreeMem or Finalize); memory passed to RegisterMem stays the
// caller's and must outlive its registration. No exceptions cross this API.
#ifndef HIXL_HIXL_H_
#define HIXL_HIXL_H_

// The C API (hixlCreateEngine, hixlWriteRemote, ...), for C and C++ alike.
#include "hixl/hixl_c.h"

#ifdef __cplusplus

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hixl/status.h"

namespace hixl {

enum class MemType : uint32_t { MEM_DEVICE = 0, MEM_HOST = 1 };

// Access a remote peer is permitted on a region (bit flags).
enum MemPerm : uint32_t {
  MEM_PERM_NONE = 0,
  MEM_PERM_READ = 1u << 0,   // peers may READ from it
  MEM_PERM_WRITE = 1u << 1,  // peers may WRITE into it
  MEM_PERM_READ_WRITE = MEM_PERM_READ | MEM_PERM_WRITE,
};

// How RegisterMem may make a region reachable to peers on this host (bit
// flags). Without flags, memory that already is a sealed memfd mapping is
// mapped by local peers (plain memory copies); any other memory is reached by
// cross-memory attach (process_vm_writev/readv), which costs a system call per
// transfer and runs at about half of memcpy speed. See docs/USER_MEMORY.md.
enum RegisterFlag : uint32_t {
  REGISTER_DEFAULT = 0,
  // Let local peers map the region. Shared file mappings (a /dev/shm file, an
  // unsealed memfd, a torch shared-memory tensor) are shared as they are: the
  // caller must not truncate the file while it is registered. Private
  // anonymous memory (malloc, numpy, torch CPU tensors) is moved in place
  // into an engine memfd: the pages covering the region keep their addresses
  // and contents and are moved back by DeregisterMem. No thread may write the
  // region during RegisterMem or DeregisterMem; while registered the pages are
  // shared with a fork()ed child instead of copied on write, and
  // MADV_DONTNEED no longer zeroes them.
  REGISTER_SHARE_BY_MAPPING = 1u << 0,
};

struct MemDesc {
  uintptr_t addr = 0;
  size_t len = 0;
};

// Opaque handle of a local registered region. 0 is never a valid handle.
using MemHandle = uint64_t;

enum class TransferOp : uint32_t { READ = 0, WRITE = 1 };

struct TransferOpDesc {
  uintptr_t local_addr = 0;   // in this process
  uintptr_t remote_addr = 0;  // the peer's virtual address, inside a region it registered
  size_t len = 0;
};

// A notification: a short named message for a peer. On receipt `from` holds
// the sender's engine name ("ip:port"; a client-only engine is named by its
// IP alone, so several of them on one host look alike).
inline constexpr size_t kMaxNotifyNameLen = 1024;  // bytes
inline constexpr size_t kMaxNotifyMsgLen = 1024;   // bytes (any byte values)
inline constexpr size_t kMaxLocalInfoLen = 131072; // bytes (SetLocalInfo)
struct NotifyDesc {
  std::string name;
  std::string notify_msg;
  std::string from;  // set by the receiving engine; ignored when sending
};

struct TransferArgs {
  uint64_t user_data = 0;  // carried with the request, unused by the engine
  // TransferAsync: > 0 ends the request TIMEOUT this many milliseconds after
  // it was posted; 0: no deadline. TransferSync uses its timeout_ms instead.
  int32_t timeout_ms = 0;
  // Delivered to the target after all of this transfer's data is in its memory.
  std::optional<NotifyDesc> notify;
  // When non-zero, the transfer is refused unless the peer's current
  // incarnation has this generation (see GetPeerGeneration): addresses learned
  // from an earlier life of a restarted peer are never used.
  uint64_t remote_generation = 0;
  // A CUDA stream (a CUstream of this process; CU_STREAM_LEGACY for the
  // legacy default stream) whose work queued so far must finish before the
  // transfer touches its local memory, e.g. the kernel that wrote the KV
  // blocks. hixl records an event on it when the transfer is posted; copies
  // of device memory wait for that event on the device, so the calling
  // thread does not block for them. When some local memory of the transfer
  // is host memory, the calling thread waits for the event before posting
  // (the CPU copies that memory). nullptr (default): the local data must be
  // complete when the transfer is posted. docs/GPU.md.
  void* stream = nullptr;
};

// Opaque handle of an async request. 0 is never a valid handle.
using TransferReq = uint64_t;

enum class TransferStatus : uint32_t {
  WAITING = 0,
  COMPLETED = 1,
  TIMEOUT = 2,
  FAILED = 3,
  CANCELLED = 4,
};

enum class ConnectStatus : uint32_t {
  NOT_CONNECTED = 0,  // no link and no attempt under way (or the link was lost)
  CONNECTING = 1,     // ConnectAsync is under way
  CONNECTED = 2,
  FAILED = 3,  // the last ConnectAsync failed (the reason says why)
};

// An engine registered in etcd discovery (ListEngines).
struct EngineRecord {
  std::string name;        // its EngineName (default: its address)
  std::string address;     // "ip:port" of its control listener
  uint64_t generation = 0;  // its incarnation (see GetPeerGeneration)
};

// Transport a link uses. AUTO picks shm when both engines share a host.
enum class LinkType : uint32_t { AUTO = 0, SHM = 1, TCP = 2, UCX = 3 };
HIXL_EXPORT const char* LinkTypeName(LinkType t);

// The library's version ("0.1.0"), and how it was built: optional parts,
// sanitizer and build type ("ucx=on etcd=on sanitizer=none type=Release").
HIXL_EXPORT const char* Version();
HIXL_EXPORT const char* BuildInfo();

// A transport this build has (GetTransports): whether it started on this
// host, and why not or what it runs on.
struct TransportInfo {
  std::string name;  // "shm", "tcp", "ucx"
  LinkType type = LinkType::AUTO;
  bool usable = false;
  std::string detail;  // not usable: why; usable: what it runs on (may be empty)
};

// One region a connected peer registered (PeerStats::regions).
struct PeerRegionInfo {
  uint64_t addr = 0;  // in the peer's address space
  uint64_t len = 0;
  uint32_t perms = 0;  // MemPerm bits
};

// What an engine knows of a connected peer (GetPeerStats): diagnostics.
struct PeerStats {
  uint64_t generation = 0;
  int64_t pid = 0;
  LinkType link = LinkType::AUTO;  // the transport the link uses
  bool authenticated = false;      // both sides proved the shared secret (AuthSecret)
  size_t region_count = 0;         // the peer's regions this engine may reach
  uint64_t region_bytes = 0;
  // Each region's address, length and permissions: only on an authenticated
  // link (empty otherwise; the count and bytes above are always given).
  std::vector<PeerRegionInfo> regions;
  int32_t heartbeat_ms = 0;   // the link's heartbeat interval (the smaller side's)
  int64_t last_heard_ms = 0;  // since the peer last sent anything, heartbeats included
  int32_t in_flight = 0;      // this engine's transfers and notifications to it now
};

// Option keys for Initialize. Unknown keys and malformed values are rejected.
namespace options {
// "AUTO" (default: shm when both engines share a host, else UCX where this
// host has an RDMA device and the build has UCX, else tcp), "SHM", "TCP",
// "UCX"; "HCCS" is accepted as SHM, "RDMA" as UCX (builds without UCX answer
// UNSUPPORTED).
inline constexpr const char kLinkType[] = "LinkType";
// Threads that copy one large transfer in parallel (1..64, default 2).
inline constexpr const char kCopyThreads[] = "CopyThreads";
// Microseconds the engine's I/O threads (control, tcp) keep polling after
// network activity, and a TransferSync caller keeps checking for its answer,
// before they sleep (0..1000, default 20; 0: sleep at once). Polling is
// bounded and only follows activity: an idle engine sleeps. A sleeping
// thread's wake-up costs 5-60 us on small or virtual machines, more than a
// small transfer itself; the polling costs CPU only while traffic flows.
inline constexpr const char kPollSpinUs[] = "PollSpinUs";
// "1"/"0": memory from AllocMem is shareable (memfd) memory peers map (default "1").
inline constexpr const char kEnableUseFabricMem[] = "EnableUseFabricMem";
// Milliseconds DeregisterMem waits for peers to stop using a region (default 5000).
inline constexpr const char kDeregisterTimeoutMs[] = "DeregisterTimeoutMs";
// Milliseconds an accepted peer has to complete its handshake (default 5000).
inline constexpr const char kHandshakeTimeoutMs[] = "HandshakeTimeoutMs";
// tcp: TCP connections per link (1..64, default 2).
inline constexpr const char kTcpLanes[] = "TcpLanes";
// tcp: bytes per slice a transfer is cut into (4096..64 MiB, default 1 MiB).
inline constexpr const char kTcpSliceSize[] = "TcpSliceSize";
// tcp: I/O threads serving all lanes of this engine (1..16, default 2).
inline constexpr const char kTcpIoThreads[] = "TcpIoThreads";
// shm: "1" (default) posts notifications to a peer on this host through a
// ring in memory both processes map (no round trip, ordered after the data);
// "0" sends them over the control link like every other transport.
inline constexpr const char kShmNotifyRing[] = "ShmNotifyRing";
// shm: a copy thread whose part of a transfer (the transfer divided over
// CopyThreads, parts of at least 1 MiB) is at least this many bytes copies
// with non-temporal stores, which bypass the caches: past the last-level
// cache they move bytes faster than memcpy and leave the cache to the
// application. -1 (default): half the last-level cache that sysfs reports
// (16 MiB when it reports none); 0: never; N: from N bytes up.
inline constexpr const char kShmStreamCopyBytes[] = "ShmStreamCopyBytes";
// Milliseconds between heartbeats on every link (10..600000, default 1000).
inline constexpr const char kHeartbeatIntervalMs[] = "HeartbeatIntervalMs";
// Heartbeat intervals a peer may stay silent before it is declared dead
// (1..1000, default 3): a dead or hung peer is detected within
// interval * (misses + 1).
inline constexpr const char kHeartbeatMisses[] = "HeartbeatMisses";
// "1": transfers and notifications to an unconnected peer connect on demand
// (default "0").
inline constexpr const char kAutoConnect[] = "AutoConnect";
// Milliseconds an on-demand connect may take (1..3600000, default 3000).
inline constexpr const char kConnectTimeoutMs[] = "ConnectTimeoutMs";
// Most peers this engine keeps links to (0 = no limit, default 0). Connecting
// beyond it first evicts idle links (least recently used first, never one
// with transfers in flight) down to PeersLowWater; with none idle, Connect
// answers RESOURCE_EXHAUSTED.
inline constexpr const char kMaxPeers[] = "MaxPeers";
// Links kept after an eviction (0..MaxPeers-1; default 3/4 of MaxPeers).
inline constexpr const char kPeersLowWater[] = "PeersLowWater";
// Notifications queued per sending peer before further ones are refused
// with RESOURCE_EXHAUSTED (1..1048576, default 4096).
inline constexpr const char kNotifyQueueDepth[] = "NotifyQueueDepth";
// Authentication of peers (docs/SECURITY.md). The shared secret (16..4096
// bytes), given inline ...
inline constexpr const char kAuthSecret[] = "AuthSecret";
// ... or as the path of a file holding it (trailing newlines dropped; the
// file must not be accessible to other users). With a secret, every link
// starts with a mutual HMAC-SHA256 challenge-response; nothing that gives
// access (regions, transport tokens, notifications) crosses a link that did
// not authenticate.
inline constexpr const char kAuthSecretFile[] = "AuthSecretFile";
// "1" (default with a secret): refuse peers that do not authenticate, in
// both directions. "0": also link with peers that have no secret (a rolling
// upgrade); a peer that offers a wrong proof is refused either way.
inline constexpr const char kAuthRequired[] = "AuthRequired";
// ucx (builds with HIXL_WITH_UCX; docs/UCX.md): how UCX learns of a lost peer.
// "AUTO" (default: "NONE" on one host where shared memory carries the link,
// else "PEER"), "PEER" (UCX error handling; UCX 1.13 then refuses shared
// memory), "NONE" (this engine's heartbeats are the only liveness check).
inline constexpr const char kUcxErrorHandling[] = "UcxErrorHandling";
// ucx: where AllocMem takes host memory from. "UCX": UCX allocates it
// (ucp_mem_map), so UCX's shared-memory layer maps it into a peer on this
// host and puts and gets are plain copies, 5-7x faster than on memory UCX is
// handed (which it moves by cross-memory attach); "ENGINE": the engine's own
// shareable memory (EnableUseFabricMem). "AUTO" (default): "UCX" when
// LinkType is UCX, else "ENGINE". Memory UCX cannot allocate falls back to
// the engine's.
inline constexpr const char kUcxAllocMem[] = "UcxAllocMem";
// Discovery through etcd (builds with HIXL_WITH_ETCD; docs/DISCOVERY.md):
// "etcd://host:port[,host:port...]". The engine publishes itself under
// MetadataPrefix + "engines/" + EngineName with a lease it keeps alive, and
// Connect (and every call naming a remote engine) also accepts engine names.
inline constexpr const char kMetadataServer[] = "MetadataServer";
// Key prefix in etcd (default "hixl/"); engines with the same prefix see each other.
inline constexpr const char kMetadataPrefix[] = "MetadataPrefix";
// This engine's name, unique under the prefix: 1..128 of [A-Za-z0-9._:-]
// (default: its bound "ip:port").
inline constexpr const char kEngineName[] = "EngineName";
// Seconds the registry entry outlives this engine if it dies (2..3600, default 10).
inline constexpr const char kMetadataTtlS[] = "MetadataTtlS";
}  // namespace options

class HIXL_EXPORT Hixl {
 public:
  Hixl();
  ~Hixl();  // calls Finalize
  Hixl(const Hixl&) = delete;
  Hixl& operator=(const Hixl&) = delete;

  // local_engine: "ip:port" to listen (port 0 picks a free port; see
  // LocalEngine()), "ip" for a client-only engine, or "[v6addr]:port".
  Status Initialize(const std::string& local_engine,
                    const std::map<std::string, std::string>& options = {});
  // Disconnects every peer, fails every unfinished request, releases AllocMem
  // memory and stops all threads. Safe to call twice.
  void Finalize();

  // The bound "ip:port" (or "ip" for a client-only engine); empty before Initialize.
  std::string LocalEngine() const;

  // Registers [addr, addr+len) for remote access with the given permissions.
  // Registering the same addr and len again returns the same handle; a region
  // that partly overlaps an existing one is rejected.
  // flags: RegisterFlag bits (how local peers reach the region).
  Status RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle,
                     uint32_t perms = MEM_PERM_READ_WRITE, uint32_t flags = REGISTER_DEFAULT);
  // Removes a registration (see the class comment for the guarantee).
  // Deregistering an unknown or already removed handle is a no-op; the handle
  // of AllocMem memory is refused (PARAM_INVALID): release it with FreeMem.
  // TIMEOUT: deregistered, but a peer whose link was dropped may still write
  // into the memory (the message names it): do not free or reuse it yet.
  Status DeregisterMem(MemHandle handle);

  // Allocates engine-owned shareable memory (memfd, huge pages when the
  // system offers them), registered READ|WRITE; local peers map it, so their
  // accesses are plain memory copies. *ptr is page-aligned.
  Status AllocMem(size_t size, MemType type, void** ptr);
  // Deregisters and releases memory from AllocMem (its address range stays
  // reserved until Finalize while a dropped peer may still write into it).
  Status FreeMem(void* ptr);
  // The handle AllocMem registered for ptr (the region's start address).
  Status GetMemHandle(void* ptr, MemHandle& handle) const;

  Status Connect(const std::string& remote_engine, int32_t timeout_ms = 1000);
  // Starts connecting and returns at once; GetConnectStatus tells how it went.
  // ALREADY_CONNECTED when a link exists or an attempt is under way.
  Status ConnectAsync(const std::string& remote_engine, int32_t timeout_ms = 1000);
  // reason (optional) holds why the last ConnectAsync failed.
  Status GetConnectStatus(const std::string& remote_engine, ConnectStatus& status,
                          Status* reason = nullptr) const;
  // Closes the link. Pieces of transfers already on the wire are let land
  // (waiting up to timeout_ms); transfers not finished end FAILED.
  Status Disconnect(const std::string& remote_engine, int32_t timeout_ms = 1000);
  // The transport a connected link uses ("shm", ...).
  Status GetLinkType(const std::string& remote_engine, LinkType& type) const;
  // The generation (incarnation id) of a connected peer, and of this engine.
  // A restarted peer has a new one.
  Status GetPeerGeneration(const std::string& remote_engine, uint64_t& generation) const;
  uint64_t Generation() const;

  // With MetadataServer: every engine registered under this engine's
  // MetadataPrefix (this one included), as the registry watch last saw them —
  // an engine that finalized is gone at once, one that died within its
  // MetadataTtlS, and a restarted one is back with a new generation. Without
  // it: UNSUPPORTED. Any call that names a remote engine also accepts such a
  // name in place of "ip:port"; Connect checks that the engine it reaches has
  // the generation the registry names.
  Status ListEngines(std::vector<EngineRecord>& engines) const;

  // Every transport of this build, in the order AUTO prefers them: which
  // started on this host, and why the others did not.
  Status GetTransports(std::vector<TransportInfo>& transports) const;
  // What this engine knows of a connected peer: NOT_CONNECTED when it has no
  // link to it. Cheap; meant for diagnostics (hixl-info).
  Status GetPeerStats(const std::string& remote_engine, PeerStats& stats) const;

  // A short application string (at most kMaxLocalInfoLen bytes) this engine
  // hands to every peer that connects to it, in the handshake: how a layer
  // above tells its peers where its own metadata lives. Peers that connected
  // before a change keep the value they were given.
  Status SetLocalInfo(const std::string& info);
  // The string a connected peer handed us (empty if it set none).
  Status GetPeerInfo(const std::string& remote_engine, std::string& info) const;

  // Moves every descriptor and returns when all bytes are in the destination.
  // timeout_ms <= 0 waits without limit.
  Status TransferSync(const std::string& remote_engine, TransferOp op,
                      const std::vector<TransferOpDesc>& descs, int32_t timeout_ms = 1000);
  // The same with TransferArgs (notification, remote_generation);
  // args.timeout_ms is not used (timeout_ms is the deadline).
  Status TransferSync(const std::string& remote_engine, TransferOp op,
                      const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                      int32_t timeout_ms = 1000);
  Status TransferAsync(const std::string& remote_engine, TransferOp op,
                       const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                       TransferReq& req);
  Status GetTransferStatus(TransferReq req, TransferStatus& status);
  // Like GetTransferStatus, and on FAILED/TIMEOUT/CANCELLED also the reason.
  Status GetTransferStatus(TransferReq req, TransferStatus& status, Status& reason);
  // Stops an async request and returns once it has stopped (no byte of it
  // moves afterwards). Its end is then reported by GetTransferStatus:
  // CANCELLED; or COMPLETED when every byte reached its destination anyway
  // (e.g. a tcp WRITE whose slices were all on the wire: they land, and the
  // request is whole); or FAILED/TIMEOUT if it had ended so first.
  Status CancelTransfer(TransferReq req);

  // Sends a notification and returns once the peer has queued it.
  // RESOURCE_EXHAUSTED: the peer's queue for this engine is full (nothing was
  // queued). TIMEOUT: no answer in time (it may still be delivered).
  Status SendNotify(const std::string& remote_engine, const NotifyDesc& notify,
                    int32_t timeout_ms = 1000);
  // Moves every queued notification to the end of notifies: each sender's in
  // the order it posted them (oldest first); different senders' may come
  // grouped by sender rather than interleaved by arrival time.
  Status GetNotifies(std::vector<NotifyDesc>& notifies);
  // With a callback set, notifications go to it (one engine thread calls it,
  // each sender's in order) instead of the queue; nullptr goes back to the
  // queue.
  // The callback must not call Finalize.
  using NotifyCallback = std::function<void(const NotifyDesc&)>;
  Status SetNotifyCallback(NotifyCallback callback);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hixl

#endif  // __cplusplus

#endif  // HIXL_HIXL_H_
