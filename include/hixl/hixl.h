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
//
// Local addresses (TransferOpDesc::local_addr) are plain pointers in the
// calling process; they need not be registered for the shm transport.
//
// Async contract: TransferAsync validates and posts, then returns a TransferReq.
// GetTransferStatus reports WAITING until the request ends, then COMPLETED
// (the data is in the destination memory) or FAILED/TIMEOUT; once it has
// reported an end state the TransferReq is released and further queries answer
// PARAM_INVALID. Local buffers must stay valid until the request has ended.
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
#include <map>
#include <memory>
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

struct TransferArgs {
  uint64_t user_data = 0;  // carried with the request, unused by the engine
};

// Opaque handle of an async request. 0 is never a valid handle.
using TransferReq = uint64_t;

enum class TransferStatus : uint32_t { WAITING = 0, COMPLETED = 1, TIMEOUT = 2, FAILED = 3 };

// Transport a link uses. AUTO picks shm when both engines share a host.
enum class LinkType : uint32_t { AUTO = 0, SHM = 1, TCP = 2, UCX = 3 };
HIXL_EXPORT const char* LinkTypeName(LinkType t);

// Option keys for Initialize. Unknown keys and malformed values are rejected.
namespace options {
// "AUTO" (default: shm when both engines share a host, else tcp), "SHM",
// "TCP"; "HCCS" is accepted as SHM.
inline constexpr const char kLinkType[] = "LinkType";
// Threads that copy one large transfer in parallel (1..64, default 2).
inline constexpr const char kCopyThreads[] = "CopyThreads";
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
  Status RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle,
                     uint32_t perms = MEM_PERM_READ_WRITE);
  // Removes a registration (see the class comment for the guarantee).
  // Deregistering an unknown or already removed handle is a no-op; the handle
  // of AllocMem memory is refused (PARAM_INVALID): release it with FreeMem.
  Status DeregisterMem(MemHandle handle);

  // Allocates engine-owned shareable memory (memfd, huge pages when the
  // system offers them), registered READ|WRITE; local peers map it, so their
  // accesses are plain memory copies. *ptr is page-aligned.
  Status AllocMem(size_t size, MemType type, void** ptr);
  // Deregisters and releases memory from AllocMem.
  Status FreeMem(void* ptr);
  // The handle AllocMem registered for ptr (the region's start address).
  Status GetMemHandle(void* ptr, MemHandle& handle) const;

  Status Connect(const std::string& remote_engine, int32_t timeout_ms = 1000);
  Status Disconnect(const std::string& remote_engine, int32_t timeout_ms = 1000);
  // The transport a connected link uses ("shm", ...).
  Status GetLinkType(const std::string& remote_engine, LinkType& type) const;

  // Moves every descriptor and returns when all bytes are in the destination.
  // timeout_ms <= 0 waits without limit.
  Status TransferSync(const std::string& remote_engine, TransferOp op,
                      const std::vector<TransferOpDesc>& descs, int32_t timeout_ms = 1000);
  Status TransferAsync(const std::string& remote_engine, TransferOp op,
                       const std::vector<TransferOpDesc>& descs, const TransferArgs& args,
                       TransferReq& req);
  Status GetTransferStatus(TransferReq req, TransferStatus& status);
  // Like GetTransferStatus, and on FAILED/TIMEOUT also the reason.
  Status GetTransferStatus(TransferReq req, TransferStatus& status, Status& reason);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hixl

#endif  // __cplusplus

#endif  // HIXL_HIXL_H_
