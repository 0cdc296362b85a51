// ucx: one-sided READ and WRITE through UCX (UCP put/get), for RDMA
// clusters (InfiniBand / RoCE), and wherever else UCX reaches (shared
// memory, cma, tcp) when it is chosen explicitly.
//
// Every engine owns one UCP worker (thread mode MULTI) and a progress thread
// that sleeps on the worker's event fd; without RDMA hardware UCX emulates
// put/get with active messages, which the *target's* progress thread serves.
// The target maps each registered region (ucp_mem_map, remote access as its
// permissions allow) and sends its packed remote key with the region's entry
// (welcome, radd); its worker address travels in the welcome. The initiator
// makes one endpoint per link and unpacks each key once. A transfer posts one
// put/get per slice and then flushes the endpoint; it completes when the
// flush does, so every byte is in the target's memory (or, for READ, in
// ours) before the request reports COMPLETED and before a notification
// attached to it is sent (on the control link).
//
// Selection: LinkType "UCX" (the C API's "RDMA"), or AUTO on a host with an
// RDMA device (/sys/class/infiniband), after shm and before tcp.
// Option UcxErrorHandling: AUTO (default: PEER across hosts, NONE on one host
// -- UCX 1.13 refuses shared memory under PEER), PEER or NONE.
// Option UcxAllocMem: AllocMem's memory allocated by UCX (AUTO: when LinkType
// is UCX), so UCX's shared-memory layer can map it into peers on this host.
#ifndef HIXL_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define HIXL_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <memory>
#include <vector>

#include "transport/transport.h"

namespace hixl::transport::ucx {

using options::kUcxErrorHandling;
enum ErrorMode : int64_t { kErrAuto = 0, kErrPeer = 1, kErrNone = 2 };
enum AllocMode : int64_t { kAllocAuto = 0, kAllocUcx = 1, kAllocEngine = 2 };

std::unique_ptr<Transport> MakeUcxTransport(const TransportContext& ctx);
std::vector<TransportOption> UcxOptions();

}  // namespace hixl::transport::ucx

#endif  // HIXL_TRANSPORT_UCX_UCX_TRANSPORT_H_
