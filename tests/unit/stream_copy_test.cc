// StreamCopy against memcpy: every head alignment, tail length and size
// around the vector steps, with guard bytes on both sides of the
// destination; and the sysfs cache-size parser.
#include "common/stream_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace hixl {
namespace {

TEST(StreamCopy, MatchesMemcpyAtEveryAlignmentAndLength) {
  constexpr size_t kGuard = 64;
  std::vector<uint8_t> src(8192 + 256), dst(8192 + 256 + 2 * kGuard);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  const size_t lengths[] = {0,  1,   15,  16,  17,  31,   32,   63,   64,
                            65, 127, 128, 129, 200, 4095, 4096, 8191, 8192};
  for (size_t n : lengths) {
    for (size_t dst_off = 0; dst_off < 40; ++dst_off) {
      for (size_t src_off : {size_t{0}, size_t{1}, size_t{3}, size_t{16}, size_t{33}}) {
        std::memset(dst.data(), 0xEE, dst.size());
        uint8_t* d = dst.data() + kGuard + dst_off;
        StreamCopy(d, src.data() + src_off, n);
        ASSERT_EQ(std::memcmp(d, src.data() + src_off, n), 0)
            << "n=" << n << " dst_off=" << dst_off << " src_off=" << src_off;
        for (size_t g = 0; g < kGuard + dst_off; ++g) ASSERT_EQ(dst[g], 0xEE) << "before, n=" << n;
        for (size_t g = kGuard + dst_off + n; g < dst.size(); ++g) {
          ASSERT_EQ(dst[g], 0xEE) << "after, n=" << n << " dst_off=" << dst_off;
        }
      }
    }
  }
}

TEST(StreamCopy, CopiesSeveralMegabytes) {
  std::vector<uint64_t> src((48u << 20) / 8), dst(src.size() + 1, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = i * 0x9E3779B97F4A7C15ull;
  // One byte in, so the destination is not vector-aligned.
  auto* d = reinterpret_cast<uint8_t*>(dst.data()) + 1;
  StreamCopy(d, src.data(), src.size() * 8);
  ASSERT_EQ(std::memcmp(d, src.data(), src.size() * 8), 0);
}

TEST(StreamCopy, ParsesSysfsCacheSizes) {
  EXPECT_EQ(ParseCacheSize("32768K\n"), size_t{32} << 20);
  EXPECT_EQ(ParseCacheSize("1M"), size_t{1} << 20);
  EXPECT_EQ(ParseCacheSize("512"), 512u);
  EXPECT_EQ(ParseCacheSize(""), 0u);
  EXPECT_EQ(ParseCacheSize("K"), 0u);
  EXPECT_EQ(ParseCacheSize("12X"), 0u);
  EXPECT_EQ(ParseCacheSize("99999999999999999999999K"), 0u);
}

TEST(StreamCopy, ReadsTheLastLevelCacheFromSysfs) {
  // Whatever this machine has; where sysfs reports caches, it is the largest
  // data or unified one, never an instruction cache alone.
  const size_t llc = LastLevelCacheBytes();
  if (llc == 0) GTEST_SKIP() << "sysfs reports no caches here";
  EXPECT_GE(llc, size_t{4} << 10);
  EXPECT_EQ(LastLevelCacheBytes(), llc);
}

}  // namespace
}  // namespace hixl
