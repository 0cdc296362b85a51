#include "common/stream_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hixl {
namespace {

#if defined(__x86_64__)
// Both loops copy a head with memcpy up to the destination's vector
// alignment, then whole 64- or 128-byte steps with unaligned loads and
// aligned streaming stores, then the tail with memcpy.
void StreamSse2(char* d, const char* s, size_t n) {
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; d += 64, s += 64, n -= 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n);
}

__attribute__((target("avx2"))) void StreamAvx2(char* d, const char* s, size_t n) {
  size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 128; d += 128, s += 128, n -= 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
  }
  std::memcpy(d, s, n);
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

}  // namespace

void StreamCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (HasAvx2()) {
    StreamAvx2(d, s, n);
  } else {
    StreamSse2(d, s, n);
  }
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

size_t ParseCacheSize(const std::string& text) {
  size_t i = 0, v = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (v > (SIZE_MAX >> 20) / 10) return 0;
    v = v * 10 + static_cast<size_t>(text[i++] - '0');
  }
  if (i == 0) return 0;
  size_t unit = 1;
  if (i < text.size() && (text[i] == 'K' || text[i] == 'k')) {
    unit = size_t{1} << 10;
    ++i;
  } else if (i < text.size() && text[i] == 'M') {
    unit = size_t{1} << 20;
    ++i;
  }
  while (i < text.size() && (text[i] == '\n' || text[i] == ' ')) ++i;
  return i == text.size() ? v * unit : 0;
}

size_t LastLevelCacheBytes() {
  static const size_t bytes = [] {
    size_t best = 0;
    int best_level = 0;
    for (int k = 0; k < 16; ++k) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(k);
      std::ifstream level_in(dir + "/level"), type_in(dir + "/type"), size_in(dir + "/size");
      int level = 0;
      std::string type, size;
      if (!(level_in >> level) || !(type_in >> type) || !std::getline(size_in, size)) continue;
      if (type == "Instruction") continue;
      const size_t b = ParseCacheSize(size);
      if (b != 0 && level >= best_level) {
        best = level > best_level ? b : std::max(best, b);
        best_level = level;
      }
    }
    return best;
  }();
  return bytes;
}

}  // namespace hixl
