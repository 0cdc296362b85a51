/* hixl/hixl_cs.h — HiXL CS: the client/server layer between the engine
 * (hixl/hixl.h) and LLM-DataDist, with the published HiXL CS names. A server
 * offers tagged memory on one or more endpoints; a client connects, fetches
 * the server's memory list once, and moves batches of one-sided puts and gets
 * into and out of that memory. With several endpoint pairs (links) a client
 * stripes every batch over all of them, each link's share by its measured
 * speed, and moves the pieces of a link that fails to the others.
 * Usable from C99 and C++; in libhixl. docs/CS.md tells the whole story.
 *
 * Mapping to the engine: every endpoint is one hixl engine (hixl::Hixl) bound
 * to the endpoint's address; a link is a connected pair of engines forced to
 * the endpoint's transport: COMM_PROTOCOL_TCP the tcp transport,
 * COMM_PROTOCOL_SHM (and HCCS, the intra-host link) shared memory,
 * COMM_PROTOCOL_UCX (and ROCE, RDMA) UCX. A protocol this build has no
 * transport for is refused with HIXL_UNSUPPORTED, never replaced.
 *
 * Status codes: the functions return hixl's HixlStatus (hixl/hixl_c.h). The
 * names are the published ones (HIXL_SUCCESS, HIXL_PARAM_INVALID,
 * HIXL_TIMEOUT, HIXL_FAILED, ...); their numbers are hixl's, so compare by
 * name. hixlGetLastErrorMessage() gives the calling thread's last message.
 *
 * Thread safety: every function may be called from any thread. Handles are
 * looked up in a table of live handles before use: NULL, foreign and
 * destroyed handles give HIXL_PARAM_INVALID and are never dereferenced.
 * Destroying a client while another thread transfers on it fails that
 * transfer; it does not crash.
 *
 * Ownership: servers and clients belong to the caller until their Destroy
 * call, which also ends their memory handles and unqueried completion
 * handles. Memory passed to RegMem stays the caller's and must stay valid
 * until UnregMem or Destroy. Lists from HixlCSClientGetRemoteMem belong to
 * the library and stay valid until the next GetRemoteMem or Destroy of that
 * client. */
#ifndef HIXL_HIXL_CS_H_
#define HIXL_HIXL_CS_H_

#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ endpoints */

typedef enum CommProtocol {
  COMM_PROTOCOL_HCCS = 0, /* the intra-host link: hixl's shared-memory transport */
  COMM_PROTOCOL_ROCE = 1, /* RDMA: hixl's UCX transport (UNSUPPORTED without UCX) */
  COMM_PROTOCOL_PCIE = 2, /* not provided by hixl: UNSUPPORTED */
  COMM_PROTOCOL_SIO = 3,  /* not provided by hixl: UNSUPPORTED */
  COMM_PROTOCOL_UB = 4,   /* not provided by hixl: UNSUPPORTED */
  COMM_PROTOCOL_TCP = 16, /* hixl's tcp transport */
  COMM_PROTOCOL_SHM = 17, /* the same as COMM_PROTOCOL_HCCS */
  COMM_PROTOCOL_UCX = 18  /* the same as COMM_PROTOCOL_ROCE */
} CommProtocol;

typedef enum EndpointLocation {
  END_POINT_LOCATION_HOST = 0,  /* the endpoint moves host memory */
  END_POINT_LOCATION_DEVICE = 1 /* device memory: UNSUPPORTED in this version */
} EndpointLocation;

/* One endpoint: a transport on one of this host's addresses. Both ends of a
 * link must map to the same transport (HCCS and SHM are one, ROCE and UCX
 * are one). reserved must be zero. */
typedef struct EndpointDesc {
  CommProtocol protocol;
  EndpointLocation location;
  const char* addr; /* an IPv4 or IPv6 literal of a local interface, e.g. "10.0.0.1" */
  uint32_t reserved[8];
} EndpointDesc;

/* ------------------------------------------------------------------ memory */

typedef enum CommMemType {
  COMM_MEM_TYPE_DEVICE = 0, /* UNSUPPORTED in this version */
  COMM_MEM_TYPE_HOST = 1
} CommMemType;

typedef struct CommMem {
  CommMemType type;
  void* addr;
  uint64_t size; /* > 0 */
} CommMem;

/* Memory tags are non-empty strings of at most HIXL_CS_MAX_TAG_LEN bytes of
 * printable ASCII, unique per server. A server offers at most
 * HIXL_CS_MAX_MEMS regions (fewer when their tags are long: the list must
 * fit 128 KiB; RegMem says HIXL_RESOURCE_EXHAUSTED when it would not). */
#define HIXL_CS_MAX_TAG_LEN 127
#define HIXL_CS_MAX_MEMS 512

/* ------------------------------------------------------------------ descriptions */

/* global_resource_config: NULL, or a JSON object of hixl engine options
 * (hixl.h, hixl::options) applied to every engine of the server or client,
 * e.g. {"HeartbeatIntervalMs":"200","TcpLanes":2}. reserved must be zero. */
typedef struct HixlServerConfig {
  const char* global_resource_config;
  uint8_t reserved[64];
} HixlServerConfig;

typedef struct HixlClientConfig {
  const char* global_resource_config;
  uint8_t reserved[64];
} HixlClientConfig;

/* A server: its endpoints (1..HIXL_CS_MAX_ENDPOINTS) and the address clients
 * connect to. server_ip must be the addr of one of the endpoints; that
 * endpoint listens on server_port (the others on free ports clients learn at
 * Connect). server_port 0: the server does not listen (clients cannot reach
 * it; its memory can still be registered). */
typedef struct HixlServerDesc {
  const EndpointDesc* endpoint_list;
  const char* server_ip;
  uint32_t server_port; /* 0..65535 */
  uint32_t endpoint_list_num;
} HixlServerDesc;

#define HIXL_CS_MAX_ENDPOINTS 16

/* A client: one link (local_endpoint to remote_endpoint, one of the server's
 * endpoints), or, with endpoint_list_num > 0, one link per pair
 * (local_endpoint_list[i], remote_endpoint_list[i]); then local_endpoint and
 * remote_endpoint must be zero or equal to the first pair. server_ip and
 * server_port (1..65535) name the server. tc (0..255) and sl (0..15) are the
 * RDMA traffic class and service level: checked, and applied by no transport
 * of this version. */
typedef struct HixlClientDesc {
  EndpointDesc local_endpoint;
  EndpointDesc remote_endpoint;
  const char* server_ip;
  uint32_t server_port;
  uint32_t tc;
  uint32_t sl;
  /* hixl: multi-link aggregation (0: one link, the pair above) */
  uint32_t endpoint_list_num;
  const EndpointDesc* local_endpoint_list;
  const EndpointDesc* remote_endpoint_list;
} HixlClientDesc;

/* One put or get: len bytes between local_buf (inside memory the client
 * registered) and remote_buf (inside memory of the server's list). */
typedef struct HixlOneSideOpDesc {
  void* remote_buf;
  void* local_buf;
  uint64_t len;
} HixlOneSideOpDesc;

typedef enum HixlCompleteStatus {
  HIXL_COMPLETE_STATUS_WAITING = 0,
  HIXL_COMPLETE_STATUS_COMPLETED = 1,
  HIXL_COMPLETE_STATUS_TIMEOUT = 2,
  HIXL_COMPLETE_STATUS_FAILED = 3
} HixlCompleteStatus;

typedef void* HixlServerHandle;
typedef void* HixlClientHandle;
typedef void* MemHandle;
typedef void* CompleteHandle;

/* At most this many async batches per client may be posted and not yet
 * queried to their end; one more gives HIXL_RESOURCE_EXHAUSTED. */
#define HIXL_CS_MAX_ASYNC_BATCHES 4096

/* ------------------------------------------------------------------ server */

/* Creates a server (config may be NULL). Checks every endpoint; starts no
 * engine yet (HixlCSServerListen does). */
HIXL_C_EXPORT HixlStatus HixlCSServerCreate(const HixlServerDesc* desc,
                                            const HixlServerConfig* config,
                                            HixlServerHandle* server);
/* Offers mem under mem_tag to clients, READ and WRITE. Before or after
 * Listen; a client sees the memory registered before its Connect. */
HIXL_C_EXPORT HixlStatus HixlCSServerRegMem(HixlServerHandle server, const char* mem_tag,
                                            const CommMem* mem, MemHandle* mem_handle);
/* Starts one engine per endpoint and accepts clients. backlog: 1..65535,
 * checked (each engine's listener keeps the system's queue length). Once
 * per server. */
HIXL_C_EXPORT HixlStatus HixlCSServerListen(HixlServerHandle server, uint32_t backlog);
/* Withdraws memory: it returns once no transfer touches it (HIXL_TIMEOUT: a
 * client whose link was lost may still write; see hixl.h DeregisterMem).
 * Other calls on this server wait meanwhile. */
HIXL_C_EXPORT HixlStatus HixlCSServerUnregMem(HixlServerHandle server, MemHandle mem_handle);
/* Stops the server: its memory is withdrawn first (the call returns once no
 * transfer touches it; HIXL_TIMEOUT as UnregMem: the server is destroyed
 * anyway, but do not free that memory yet), then clients' transfers to it
 * fail (they do not hang). */
HIXL_C_EXPORT HixlStatus HixlCSServerDestroy(HixlServerHandle server);

/* ------------------------------------------------------------------ client */

HIXL_C_EXPORT HixlStatus HixlCSClientCreate(const HixlClientDesc* desc,
                                            const HixlClientConfig* config,
                                            HixlClientHandle* client);
/* Links every pair and fetches the server's memory list; timeout_ms > 0
 * bounds the whole call. Once per client. */
HIXL_C_EXPORT HixlStatus HixlCSClientConnect(HixlClientHandle client, uint32_t timeout_ms);
/* The server's memory as fetched by Connect: *list_num entries, tags in the
 * same order. timeout_ms is accepted for the published signature (nothing
 * here waits). */
HIXL_C_EXPORT HixlStatus HixlCSClientGetRemoteMem(HixlClientHandle client, CommMem** mem_list,
                                                  char*** mem_tag_list, uint32_t* list_num,
                                                  uint32_t timeout_ms);
/* Registers local memory for transfers (before Connect; mem_tag may be NULL). */
HIXL_C_EXPORT HixlStatus HixlCSClientRegMem(HixlClientHandle client, const char* mem_tag,
                                            const CommMem* mem, MemHandle* mem_handle);
/* Refused (HIXL_PARAM_INVALID) while a batch of this client runs: an async
 * batch runs until a query reported its end. */
HIXL_C_EXPORT HixlStatus HixlCSClientUnregMem(HixlClientHandle client, MemHandle mem_handle);

/* Posts a batch of list_num (1..1048576) puts (local -> remote) or gets
 * (remote -> local); *complete_handle is queried with
 * HixlCSClientQueryCompleteStatus. Every descriptor is checked first:
 * nothing moves when one is wrong. */
HIXL_C_EXPORT HixlStatus HixlCSClientBatchPutAsync(HixlClientHandle client, uint32_t list_num,
                                                   const HixlOneSideOpDesc* desc_list,
                                                   CompleteHandle* complete_handle);
HIXL_C_EXPORT HixlStatus HixlCSClientBatchGetAsync(HixlClientHandle client, uint32_t list_num,
                                                   const HixlOneSideOpDesc* desc_list,
                                                   CompleteHandle* complete_handle);
/* The same, returning when every byte arrived (HIXL_SUCCESS), timeout_ms > 0
 * passed (HIXL_TIMEOUT), or the batch failed (HIXL_FAILED; also when no link
 * to the server is up). Wrong arguments give HIXL_PARAM_INVALID before
 * anything moves. After TIMEOUT or FAILED nothing of the batch moves any
 * more. */
HIXL_C_EXPORT HixlStatus HixlCSClientBatchPutSync(HixlClientHandle client, uint32_t list_num,
                                                  const HixlOneSideOpDesc* desc_list,
                                                  uint32_t timeout_ms);
HIXL_C_EXPORT HixlStatus HixlCSClientBatchGetSync(HixlClientHandle client, uint32_t list_num,
                                                  const HixlOneSideOpDesc* desc_list,
                                                  uint32_t timeout_ms);
/* Where an async batch stands. A final status (COMPLETED, TIMEOUT, FAILED)
 * is reported once: the handle is released by that call. A link that failed
 * is replaced by the others while the batch is being queried. Async batches
 * have no deadline of their own: a link whose server stops answering is
 * declared dead by the engines' heartbeats (HeartbeatIntervalMs x
 * HeartbeatMisses, 3 s by default), which ends or moves its part. */
HIXL_C_EXPORT HixlStatus HixlCSClientQueryCompleteStatus(HixlClientHandle client,
                                                         CompleteHandle complete_handle,
                                                         HixlCompleteStatus* status);
/* Disconnects and frees the client; its unqueried batches are stopped. */
HIXL_C_EXPORT HixlStatus HixlCSClientDestroy(HixlClientHandle client);

/* hixl: what each link of a client has done, in link order. */
typedef struct HixlCSLinkStats {
  char local_addr[64];
  char remote_engine[80]; /* the server engine's "ip:port" */
  CommProtocol protocol;
  int32_t up;              /* 1 while the link is used, 0 after it failed */
  uint64_t bytes;          /* moved over this link, all batches */
  uint64_t pieces;         /* transfers posted on it */
  double bytes_per_second; /* its measured speed (0: not measured yet) */
} HixlCSLinkStats;
HIXL_C_EXPORT HixlStatus HixlCSClientGetLinkStats(HixlClientHandle client, HixlCSLinkStats* out,
                                                  uint32_t capacity, uint32_t* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HIXL_HIXL_CS_H_ */
