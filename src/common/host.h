// Identity of this host and process, for deciding whether two engines can
// share memory directly. Thread-safe.
#ifndef HIXL_COMMON_HOST_H_
#define HIXL_COMMON_HOST_H_

#include <cstdint>
#include <string>

namespace hixl::host {

// Same string ⇔ same kernel boot, network namespace and pid namespace: the
// conditions under which memfd passing over an abstract Unix socket and
// cross-memory attach by pid can work.
const std::string& HostIdentity();

// 64 random bits, never 0 (a new engine generation, a token).
uint64_t RandomU64();

}  // namespace hixl::host

#endif  // HIXL_COMMON_HOST_H_
