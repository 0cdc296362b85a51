// shm: one-sided copies between processes on one host.
//
// Engine-allocated regions (memfd) are passed to the initiator over an
// abstract Unix socket with SCM_RIGHTS and mapped, so a transfer is a plain
// memcpy. Any other registered memory is reached with cross-memory attach
// (process_vm_writev/readv). Large transfers are split across the engine's
// copy threads. The target's CPU takes no part in either path.
//
// Safety: the initiator maps a memfd only if the target sealed it against
// shrinking (no SIGBUS) and it is at least as long as the region; the Unix
// socket hands memfds only to holders of a token issued in a completed
// handshake.
#ifndef HIXL_TRANSPORT_SHM_SHM_TRANSPORT_H_
#define HIXL_TRANSPORT_SHM_SHM_TRANSPORT_H_

#include <memory>
#include <vector>

#include "transport/transport.h"

namespace hixl::transport::shm {

std::unique_ptr<Transport> MakeShmTransport(const TransportContext& ctx);
std::vector<TransportOption> ShmOptions();

// Creates a sealed memfd of at least size bytes and maps it (huge pages when
// the system has them). Used by AllocMem.
Status AllocShareable(size_t size, int& memfd, void*& addr, size_t& mapped_len);

}  // namespace hixl::transport::shm

#endif  // HIXL_TRANSPORT_SHM_SHM_TRANSPORT_H_
