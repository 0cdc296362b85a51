/* hixl/hixl_c.h — the C API of hixl (included by hixl/hixl.h, usable from C99
 * and C++). A thin wrapper over the C++ engine hixl::Hixl; see hixl.h for the
 * transfer semantics (bounds/permission checks at the target, async contract).
 *
 * Rules (as in leveldb's c.h):
 *  - Every object is an opaque handle created by a hixlCreate..., Register or
 *    Deserialize call and released by its matching Destroy/Unregister call.
 *  - Every function returns a HixlStatus (HIXL_SUCCESS is 0) except the few
 *    that return a string. Output parameters come last and are written only
 *    on success.
 *  - Every function checks its arguments: NULL handles and pointers, zero or
 *    out-of-range sizes return HIXL_PARAM_INVALID, never crash. Handles are
 *    looked up in a table of live handles before use, so a handle that was
 *    destroyed (e.g. a request polled after hixlDestroyRequest) is reported as
 *    HIXL_PARAM_INVALID instead of being dereferenced.
 *  - hixlGetLastErrorMessage() returns the detailed message of the last
 *    failing call made by the calling thread.
 *
 * Thread safety: every function may be called from any thread; an engine may
 * be used by many threads at once. Destroying a handle while another thread
 * still uses it is a caller error (it is detected when possible).
 *
 * Ownership: the engine owns the memory handles it registered or deserialized
 * (hixlDestroyEngine releases the remaining ones) and memory from
 * hixlAllocMemory. Requests belong to the caller until hixlDestroyRequest;
 * they stay valid (and report HIXL_FAILED if unfinished) after their engine is
 * destroyed. Memory passed to hixlRegisterMemory stays the caller's.
 */
#ifndef HIXL_HIXL_C_H_
#define HIXL_HIXL_C_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define HIXL_C_EXPORT __attribute__((visibility("default")))
#else
#define HIXL_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ status */

/* One code per hixl::StatusCode (same numbers), plus HIXL_IN_PROGRESS. */
typedef enum HixlStatus {
  HIXL_SUCCESS = 0,
  HIXL_PARAM_INVALID = 1,      /* an argument is wrong: fix the call */
  HIXL_TIMEOUT = 2,            /* a deadline passed */
  HIXL_NOT_CONNECTED = 3,      /* no link to that peer (or the peer is gone) */
  HIXL_ALREADY_CONNECTED = 4,  /* connect to a peer that is already connected */
  HIXL_NOTIFY_FAILED = 5,      /* a notification could not be delivered */
  HIXL_UNSUPPORTED = 6,        /* not possible with this build, link or peer */
  HIXL_RESOURCE_EXHAUSTED = 7, /* a limit or queue is full: retry later */
  HIXL_FAILED = 8,             /* anything else: see hixlGetLastErrorMessage */
  HIXL_CANCELLED = 9,          /* the request was cancelled (hixlCancelRequest) */
  HIXL_IN_PROGRESS = 1000      /* the request has not finished yet */
} HixlStatus;

/* Static description of a status, e.g. "PARAM_INVALID: an argument is wrong".
 * Never NULL (unknown values give "UNKNOWN"). */
HIXL_C_EXPORT const char* hixlGetErrorString(HixlStatus status);
/* The detailed message of the calling thread's last failing call ("" when
 * none). Valid until the thread's next hixl call. */
HIXL_C_EXPORT const char* hixlGetLastErrorMessage(void);

/* ------------------------------------------------------------------ handles */

typedef struct HixlConfigObj* HixlConfig;
typedef struct HixlEngineObj* HixlEngine;
typedef struct HixlMemHandleObj* HixlMemHandle;

/* A request's public part: read-only fields the caller may look at. The
 * object is larger than this; never copy or allocate it yourself. */
struct HixlRequestObj {
  uint64_t request_id; /* unique in this process, assigned when posted */
};
typedef struct HixlRequestObj* HixlRequest;

/* hixlWaitRequest: wait without limit. */
#define HIXL_WAIT_FOREVER (-1)

/* ------------------------------------------------------------------ config */

/* Keys. Values are strings (hixlConfigSetString) or integers
 * (hixlConfigSetInt; integer keys also accept decimal strings). */
/* IPv4/IPv6 literal to listen on / connect from (default "127.0.0.1"). */
#define HIXL_OPTION_LOCAL_IP "LocalIp"
/* 0..65535: listen on this port (0 picks a free one, see
 * hixlGetLocalEngine). Unset: a client-only engine that accepts no peers. */
#define HIXL_OPTION_LOCAL_PORT "LocalPort"
/* The default peer (set both or neither): the engine connects to it when
 * created, or, if it is not up yet, on the first transfer that needs it. */
#define HIXL_OPTION_REMOTE_IP "RemoteIp"
#define HIXL_OPTION_REMOTE_PORT "RemotePort"
/* "AUTO", "SHM", "TCP", "UCX"; "HCCS" = the intra-host link (SHM), "RDMA" =
 * the RDMA-capable one (UCX; HIXL_UNSUPPORTED in builds without it). */
#define HIXL_OPTION_LINK_TYPE "LinkType"
/* "1": hixlAllocMemory returns shareable memory peers map ("0": private). */
#define HIXL_OPTION_ENABLE_USE_FABRIC_MEM "EnableUseFabricMem"
/* A JSON object whose keys are C++ engine options (hixl::options), values
 * strings or integers, e.g. {"CopyThreads":"4","TcpLanes":2}. Unknown keys
 * and non-scalar values are rejected when set. */
#define HIXL_OPTION_GLOBAL_RESOURCE_CONFIG "GlobalResourceConfig"
/* Milliseconds a connect may take (1..3600000, default 3000). */
#define HIXL_OPTION_CONNECT_TIMEOUT_MS "ConnectTimeoutMs"
/* Milliseconds a synchronous transfer may take (0 = no limit, default 60000). */
#define HIXL_OPTION_TRANSFER_TIMEOUT_MS "TransferTimeoutMs"
/* The C++ option keys ("CopyThreads", "TcpLanes", ...) are accepted as keys
 * too; their values are checked by hixlCreateEngine. Among them (see hixl.h,
 * hixl::options): */
/* Milliseconds between heartbeats (10..600000, default 1000), and intervals a
 * peer may stay silent before it is declared dead (1..1000, default 3). */
#define HIXL_OPTION_HEARTBEAT_INTERVAL_MS "HeartbeatIntervalMs"
#define HIXL_OPTION_HEARTBEAT_MISSES "HeartbeatMisses"
/* Most peers kept linked (0 = no limit) and links kept after an eviction. */
#define HIXL_OPTION_MAX_PEERS "MaxPeers"
#define HIXL_OPTION_PEERS_LOW_WATER "PeersLowWater"
/* Notifications queued per sending peer before further ones are refused with
 * HIXL_RESOURCE_EXHAUSTED (1..1048576, default 4096). */
#define HIXL_OPTION_NOTIFY_QUEUE_DEPTH "NotifyQueueDepth"
/* Authentication of peers (docs/SECURITY.md): the shared secret inline
 * (16..4096 bytes) or the path of a file holding it (not accessible to other
 * users); "1" (default with a secret) refuses peers that do not
 * authenticate, "0" also links with peers that have no secret. */
#define HIXL_OPTION_AUTH_SECRET "AuthSecret"
#define HIXL_OPTION_AUTH_SECRET_FILE "AuthSecretFile"
#define HIXL_OPTION_AUTH_REQUIRED "AuthRequired"
/* UCX's error handling: "AUTO", "PEER" or "NONE" (hixl.h, kUcxErrorHandling). */
#define HIXL_OPTION_UCX_ERROR_HANDLING "UcxErrorHandling"
/* Where AllocMem takes host memory from: "AUTO", "UCX" or "ENGINE" (hixl.h, kUcxAllocMem). */
#define HIXL_OPTION_UCX_ALLOC_MEM "UcxAllocMem"
/* Discovery through etcd (hixl.h, kMetadataServer...): "etcd://host:port[,...]",
 * the key prefix, this engine's name, the entry's lease in seconds. */
#define HIXL_OPTION_METADATA_SERVER "MetadataServer"
#define HIXL_OPTION_METADATA_PREFIX "MetadataPrefix"
#define HIXL_OPTION_ENGINE_NAME "EngineName"
#define HIXL_OPTION_METADATA_TTL_S "MetadataTtlS"
/* ("AutoConnect" is accepted too; the C API connects on demand anyway.
 * HIXL_OPTION_CONNECT_TIMEOUT_MS also bounds the engine's own connects.) */

HIXL_C_EXPORT HixlStatus hixlCreateConfig(HixlConfig* config);
/* Unknown keys and malformed values: HIXL_PARAM_INVALID (config unchanged). */
HIXL_C_EXPORT HixlStatus hixlConfigSetString(HixlConfig config, const char* key, const char* value);
HIXL_C_EXPORT HixlStatus hixlConfigSetInt(HixlConfig config, const char* key, int64_t value);
HIXL_C_EXPORT HixlStatus hixlDestroyConfig(HixlConfig config);

/* ------------------------------------------------------------------ engine */

/* Creates and initializes an engine. The config may be destroyed afterwards. */
HIXL_C_EXPORT HixlStatus hixlCreateEngine(HixlConfig config, HixlEngine* engine);
/* Finalizes the engine (unfinished requests end HIXL_FAILED), releases its
 * memory handles and hixlAllocMemory memory. */
HIXL_C_EXPORT HixlStatus hixlDestroyEngine(HixlEngine engine);
/* The engine's address "ip:port" (or "ip" for a client-only engine); owned by
 * the engine. NULL for an invalid engine. */
HIXL_C_EXPORT const char* hixlGetLocalEngine(HixlEngine engine);
/* Explicit link management (transfers connect on demand; these are optional).
 * remote: "ip:port". hixlConnect to a connected peer: HIXL_ALREADY_CONNECTED. */
HIXL_C_EXPORT HixlStatus hixlConnect(HixlEngine engine, const char* remote, int32_t timeout_ms);
HIXL_C_EXPORT HixlStatus hixlDisconnect(HixlEngine engine, const char* remote, int32_t timeout_ms);

/* ------------------------------------------------------------------ memory */

#define HIXL_MEM_PERM_READ 0x1u  /* peers may read it */
#define HIXL_MEM_PERM_WRITE 0x2u /* peers may write it */

/* Registers [addr, addr+size) for remote access. perms: a non-zero
 * combination of HIXL_MEM_PERM_*. Memory from hixlAllocMemory is already
 * registered READ|WRITE by the engine; registering (part of) it returns a
 * handle naming that part. */
HIXL_C_EXPORT HixlStatus hixlRegisterMemory(HixlEngine engine, void* addr, size_t size,
                                            uint32_t perms, HixlMemHandle* handle);

/* hixlRegisterMemoryFlags flags (hixl::RegisterFlags in C++). */
/* Local peers map the memory instead of reaching it by cross-memory attach:
 * a shared file mapping is mapped as it is (the caller promises not to
 * truncate it), private memory (malloc) is moved in place into a sealed
 * memfd -- same addresses, contents kept -- and moved back when its last
 * handle is unregistered. docs/USER_MEMORY.md. */
#define HIXL_REGISTER_SHARE_BY_MAPPING 0x1u
/* hixlRegisterMemory with flags (0, or HIXL_REGISTER_*); memory that cannot
 * be shared that way is HIXL_PARAM_INVALID, nothing moved. */
HIXL_C_EXPORT HixlStatus hixlRegisterMemoryFlags(HixlEngine engine, void* addr, size_t size,
                                                 uint32_t perms, uint32_t flags,
                                                 HixlMemHandle* handle);
/* Memory types (hixl::MemType in C++). HIXL_MEM_DEVICE: CUDA device memory,
 * in a build with CUDA on a host with a driver and a device (otherwise
 * HIXL_UNSUPPORTED, saying which); docs/GPU.md. */
#define HIXL_MEM_DEVICE 0u
#define HIXL_MEM_HOST 1u
/* hixlRegisterMemoryFlags for memory of type mem_type (HIXL_MEM_*): device
 * memory registered as host memory, or the reverse, is HIXL_PARAM_INVALID. */
HIXL_C_EXPORT HixlStatus hixlRegisterMemoryTyped(HixlEngine engine, void* addr, size_t size,
                                                 uint32_t mem_type, uint32_t perms,
                                                 uint32_t flags, HixlMemHandle* handle);
/* Releases a handle of this engine: a registered region is deregistered (see
 * hixl.h for the guarantee); a deserialized handle is simply released. */
HIXL_C_EXPORT HixlStatus hixlUnregisterMemory(HixlEngine engine, HixlMemHandle handle);
/* Engine-owned shareable host memory (page-aligned, zeroed). */
HIXL_C_EXPORT HixlStatus hixlAllocMemory(HixlEngine engine, size_t size, void** ptr);
HIXL_C_EXPORT HixlStatus hixlFreeMemory(HixlEngine engine, void* ptr);
/* hixlAllocMemory of type mem_type: HIXL_MEM_DEVICE gives device memory on
 * the device current on the calling thread (device 0 when none is),
 * registered READ|WRITE, released with hixlFreeMemory. */
HIXL_C_EXPORT HixlStatus hixlAllocMemoryTyped(HixlEngine engine, size_t size, uint32_t mem_type,
                                              void** ptr);

/* A printable string naming the handle's engine ("ip:port") and its
 * generation, region address, length, permissions and a checksum; owned by
 * the handle. NULL for an
 * invalid handle or a handle of a client-only engine (peers cannot reach it).
 */
HIXL_C_EXPORT const char* hixlMemHandleSerialize(HixlMemHandle handle);
/* Parses a string from hixlMemHandleSerialize (of any engine) into a handle
 * owned by `engine`. Checks syntax, ranges and checksum (a truncated or
 * altered string: HIXL_PARAM_INVALID); it does not contact the owner: the
 * first transfer connects (a dead owner then gives HIXL_NOT_CONNECTED). */
HIXL_C_EXPORT HixlStatus hixlMemHandleDeserialize(HixlEngine engine, const char* str,
                                                  HixlMemHandle* handle);
/* Size in bytes of the region a handle names (0 for an invalid handle). */
HIXL_C_EXPORT size_t hixlMemHandleGetSize(HixlMemHandle handle);
/* The address ("ip:port") of the engine whose memory a handle names, e.g. to
 * send that engine a notification; owned by the handle. NULL for an invalid
 * handle or a handle of a client-only engine.
 *
 * Serialized handles carry the owner engine's generation (its incarnation):
 * a transfer through a deserialized handle is refused (HIXL_PARAM_INVALID,
 * the message says the engine restarted) when the engine now serving that
 * address is a new incarnation, e.g. restarted on the same port. Fetch a
 * fresh handle string from it. */
HIXL_C_EXPORT const char* hixlMemHandleGetEngine(HixlMemHandle handle);

/* ------------------------------------------------------------------ transfers */

/* Blocking: returns when the bytes are in the remote memory (or the transfer
 * failed). remote_offset + size must lie inside the handle's region and the
 * region must allow the access. request may be NULL; otherwise it receives a
 * completed request (free it with hixlDestroyRequest). */
HIXL_C_EXPORT HixlStatus hixlWriteRemote(HixlEngine engine, const void* local, size_t size,
                                         HixlMemHandle remote, uint64_t remote_offset,
                                         HixlRequest* request);
HIXL_C_EXPORT HixlStatus hixlReadRemote(HixlEngine engine, void* local, size_t size,
                                        HixlMemHandle remote, uint64_t remote_offset,
                                        HixlRequest* request);
/* Non-blocking: validates, posts and returns a request at once. The local
 * buffer must stay valid until the request has ended. */
HIXL_C_EXPORT HixlStatus hixlWriteRemoteAsync(HixlEngine engine, const void* local, size_t size,
                                              HixlMemHandle remote, uint64_t remote_offset,
                                              HixlRequest* request);
HIXL_C_EXPORT HixlStatus hixlReadRemoteAsync(HixlEngine engine, void* local, size_t size,
                                             HixlMemHandle remote, uint64_t remote_offset,
                                             HixlRequest* request);

/* Batches: many descriptors in one request. Every descriptor's handle must
 * name the same remote engine; one bad descriptor fails the whole batch and
 * nothing moves. */
typedef enum HixlTransferOp { HIXL_OP_READ = 0, HIXL_OP_WRITE = 1 } HixlTransferOp;
typedef struct HixlTransferDesc {
  void* local;            /* address in this process */
  HixlMemHandle remote;   /* remote region */
  uint64_t remote_offset; /* offset inside the remote region */
  size_t size;            /* bytes (> 0) */
} HixlTransferDesc;
HIXL_C_EXPORT HixlStatus hixlTransferBatch(HixlEngine engine, HixlTransferOp op,
                                           const HixlTransferDesc* descs, size_t count,
                                           HixlRequest* request);
HIXL_C_EXPORT HixlStatus hixlTransferBatchAsync(HixlEngine engine, HixlTransferOp op,
                                                const HixlTransferDesc* descs, size_t count,
                                                HixlRequest* request);

/* Batches with options. options NULL: the defaults (all fields 0/NULL).
 *  timeout_ms: 0 = the engine's HIXL_OPTION_TRANSFER_TIMEOUT_MS for a blocking
 *    transfer, no deadline for an async one; > 0 = this deadline (an async
 *    request then ends HIXL_TIMEOUT once it passed); < 0: HIXL_PARAM_INVALID.
 *  notify_name: non-NULL attaches a notification (NUL-terminated name of at
 *    most HIXL_MAX_NOTIFY_LEN bytes, message notify_msg/notify_msg_len, any
 *    bytes, at most HIXL_MAX_NOTIFY_LEN; notify_msg may be NULL only with
 *    length 0) that the remote engine receives only after all of the
 *    transfer's data is in its memory; the transfer ends HIXL_SUCCESS only
 *    once the remote engine has queued it (else the error says the data
 *    was written but the notification was not delivered).
 * async: 0 blocks like hixlTransferBatch, non-zero posts like
 * hixlTransferBatchAsync (request then required). */
typedef struct HixlTransferOptions {
  int32_t timeout_ms;
  const char* notify_name;
  const void* notify_msg;
  size_t notify_msg_len;
} HixlTransferOptions;
HIXL_C_EXPORT HixlStatus hixlTransferBatchEx(HixlEngine engine, HixlTransferOp op,
                                             const HixlTransferDesc* descs, size_t count,
                                             const HixlTransferOptions* options, int async,
                                             HixlRequest* request);
/* hixlTransferBatchEx ordered after a CUDA stream of this process (a
 * CUstream; CU_STREAM_LEGACY for the legacy default stream): the work queued
 * on it so far, e.g. the kernel that wrote the blocks, finishes before the
 * transfer touches its local memory. hixl records an event on the stream when
 * the transfer is posted; device memory is copied after that event without
 * blocking the calling thread, and when some local memory is host memory the
 * calling thread waits for the event first. stream NULL is exactly
 * hixlTransferBatchEx (the local data must then be complete when posted).
 * A handle the driver does not know, or a build or host without CUDA:
 * HIXL_PARAM_INVALID / HIXL_UNSUPPORTED and nothing moves. docs/GPU.md. */
HIXL_C_EXPORT HixlStatus hixlTransferBatchOnStream(HixlEngine engine, HixlTransferOp op,
                                                   const HixlTransferDesc* descs, size_t count,
                                                   const HixlTransferOptions* options,
                                                   void* stream, int async,
                                                   HixlRequest* request);

/* HIXL_SUCCESS when done, HIXL_IN_PROGRESS while running, else the failure
 * (HIXL_TIMEOUT, HIXL_NOT_CONNECTED, HIXL_CANCELLED, ...). An ended request
 * keeps answering the same. A request of another engine or a destroyed one:
 * HIXL_PARAM_INVALID. */
HIXL_C_EXPORT HixlStatus hixlPollRequest(HixlEngine engine, HixlRequest request);
/* Waits up to timeout_ms (HIXL_WAIT_FOREVER: no limit) for the request to end
 * and returns what hixlPollRequest then answers: HIXL_IN_PROGRESS means the
 * wait timed out and the request is still running. */
HIXL_C_EXPORT HixlStatus hixlWaitRequest(HixlEngine engine, HixlRequest request,
                                         int32_t timeout_ms);
/* Stops an unfinished async request and returns once it has stopped: no byte
 * of it moves afterwards, its buffers may be reused, and hixlPollRequest
 * answers HIXL_CANCELLED (or its real end if it ended first). A request that
 * had already ended: HIXL_SUCCESS, its answer unchanged. */
HIXL_C_EXPORT HixlStatus hixlCancelRequest(HixlEngine engine, HixlRequest request);
/* Releases a request. An unfinished one is waited for first, so its buffers
 * may be reused once this returns. */
HIXL_C_EXPORT HixlStatus hixlDestroyRequest(HixlRequest request);

/* ------------------------------------------------------------------ notifications */

/* Most bytes of a notification's name, and of its message. */
#define HIXL_MAX_NOTIFY_LEN 1024

/* Sends a short named message to the engine at remote ("ip:port"; connected
 * on demand) and returns once that engine has queued it. name: NUL-terminated,
 * at most HIXL_MAX_NOTIFY_LEN bytes; msg: msg_len (<= HIXL_MAX_NOTIFY_LEN)
 * bytes of any value, NULL only with msg_len 0; timeout_ms > 0.
 * HIXL_RESOURCE_EXHAUSTED: the remote engine's queue for this engine is full
 * (HIXL_OPTION_NOTIFY_QUEUE_DEPTH; nothing was queued, retry later).
 * HIXL_TIMEOUT / HIXL_NOT_CONNECTED: no answer / the link was lost (it may
 * still have been delivered). */
HIXL_C_EXPORT HixlStatus hixlSendNotify(HixlEngine engine, const char* remote, const char* name,
                                        const void* msg, size_t msg_len, int32_t timeout_ms);

/* A received notification. name and msg are NUL-terminated copies; name_len
 * and msg_len are their exact lengths (msg may contain any bytes, NUL too).
 * from: the sender's engine address ("ip:port", or "ip" for a client-only
 * engine). */
typedef struct HixlNotify {
  char name[HIXL_MAX_NOTIFY_LEN + 1];
  size_t name_len;
  char msg[HIXL_MAX_NOTIFY_LEN + 1];
  size_t msg_len;
  char from[257];
} HixlNotify;

/* Copies up to capacity (> 0) of the oldest received notifications into
 * out[0..*count) (*count = 0 when none) and removes them; the rest stay
 * queued, in order, for the next call. Never blocks. Notifications this
 * layer holds for a later call no longer count against the sender's
 * HIXL_OPTION_NOTIFY_QUEUE_DEPTH; it takes new ones from the engine only
 * when it cannot fill out otherwise, so at most about twice that many wait
 * per sender. */
HIXL_C_EXPORT HixlStatus hixlGetNotifies(HixlEngine engine, HixlNotify* out, size_t capacity,
                                         size_t* count);

/* ------------------------------------------------------------------ discovery */

/* Most bytes of an engine name (HIXL_OPTION_ENGINE_NAME) and of an engine
 * address ("ip:port" or "[v6]:port"). */
#define HIXL_MAX_ENGINE_NAME_LEN 128
#define HIXL_MAX_ADDRESS_LEN 64

/* An engine registered in etcd discovery: its name, the address of its
 * control listener and its generation (a new one each time it starts). Any
 * call that takes a remote engine accepts the name in place of the address. */
typedef struct HixlEngineRecord {
  char name[HIXL_MAX_ENGINE_NAME_LEN + 1];
  char address[HIXL_MAX_ADDRESS_LEN + 1];
  uint64_t generation;
} HixlEngineRecord;

/* With HIXL_OPTION_METADATA_SERVER: the engines registered under this
 * engine's HIXL_OPTION_METADATA_PREFIX (itself included, when it listens), as
 * its registry watch last saw them, in name order. Writes the first
 * min(capacity, total) records to out and sets *count to the total: when
 * *count > capacity the list did not fit (call again with a larger array; it
 * may have changed in between). out may be NULL when capacity is 0 (to learn
 * the count). Never blocks on etcd. Without a metadata server:
 * HIXL_UNSUPPORTED. */
HIXL_C_EXPORT HixlStatus hixlListEngines(HixlEngine engine, HixlEngineRecord* out, size_t capacity,
                                         size_t* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HIXL_HIXL_C_H_ */
