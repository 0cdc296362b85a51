// StreamCopy: a memory copy with non-temporal stores, for transfers larger
// than the last-level cache. A plain memcpy of many 1 MiB pieces that add up
// to more than the cache writes every destination line through the cache and
// evicts lines it will need again; stores that bypass the cache move the same
// bytes at a higher rate (docs/PERFORMANCE.md, "Beside NIXL and Mooncake").
// glibc's memcpy makes that choice per call, from the size of one call, so a
// transfer of many descriptors never gets it.
//
// Thread-safe: StreamCopy touches only the memory it is given;
// LastLevelCacheBytes reads sysfs once (a function-local static).
#ifndef HIXL_COMMON_STREAM_COPY_H_
#define HIXL_COMMON_STREAM_COPY_H_

#include <cstddef>
#include <string>

namespace hixl {

// Copies n bytes from src to dst (the ranges must not overlap) with
// non-temporal stores where the CPU has them (x86-64: AVX2 when present,
// else SSE2), else with memcpy. The stores are fenced before it returns, so
// whatever the caller publishes afterwards (a completion, an answer) is
// ordered after the data.
void StreamCopy(void* dst, const void* src, size_t n);

// The size in bytes of the largest cache the first CPU reports in
// /sys/devices/system/cpu/cpu0/cache (sysconf's figures are wrong in some
// virtual machines), or 0 when it reports none.
size_t LastLevelCacheBytes();

// Parses a sysfs cache size ("32768K", "1M", "512"); 0 when malformed.
size_t ParseCacheSize(const std::string& text);

}  // namespace hixl

#endif  // HIXL_COMMON_STREAM_COPY_H_
