// tcp: one-sided READ and WRITE between hosts over plain TCP.
//
// The target's own I/O threads read each request header, check it against
// the target's region table (bounds, permission), then receive a WRITE's
// payload straight into the registered memory, or send a READ's reply
// straight from it; the target application takes no part. A WRITE completes
// at the initiator only when the target has acknowledged that the bytes are
// in its memory.
//
// A link has several lanes (TCP connections); a transfer is cut into slices
// striped over the lanes, and each lane keeps any number of slices in flight
// (the target answers a lane's requests in order).
//
// Data-lane protocol (little endian, fixed-size headers):
//   lane hello  {magic 'HXL2', version, token, target generation} -> {magic, status}
//   request     {magic, op, seq, remote addr, len} [+ len payload bytes for WRITE]
//   response    {magic, op, status, seq, len}      [+ len payload bytes for READ]
// (Exact layout and the checks a target applies: tcp_wire.h.)
// A request that fails validation is answered with an error status and the
// lane is closed: its payload cannot be skipped safely.
#ifndef HIXL_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define HIXL_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <memory>

#include "transport/transport.h"

namespace hixl::transport::tcp {

std::unique_ptr<Transport> MakeTcpTransport(const TransportContext& ctx);
// The tcp transport's own Initialize options (TcpLanes, TcpSliceSize, TcpIoThreads).
std::vector<TransportOption> TcpOptions();

}  // namespace hixl::transport::tcp

#endif  // HIXL_TRANSPORT_TCP_TCP_TRANSPORT_H_
