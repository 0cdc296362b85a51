// tests/load/load_common.h — what the load driver (hixl_load_peer, see
// load_peer.cc) and the load tests (load_test.cc, bounds_test.cc) share:
// command arguments as key=value words, the notification format, pattern
// checks at an offset, the fixed bounds, and /proc readings of a process's
// resources (file descriptors, threads, memory, mappings).
//
// Notification format. Every transfer of the load carries a notification
//   name "<kind>.<initiator>.<seq>"   kind: w  WRITE into the initiator's slot
//                                            b  READ back of that slot
//                                            p  READ of the target's pattern region
//   msg  "<offset>:<len>:<hash>"     hash: hixl_test::Fnv1a64 as 16 hex digits
// and the target hashes the named bytes the moment the notification appears
// (offset: in the initiator's slice for w/b, in the pattern region for p).
// seq counts 0, 1, 2, ... per initiator and target over the life of the
// initiator process, so the target can tell a lost, a repeated and an
// unknown notification apart.
#ifndef HIXL_TESTS_LOAD_LOAD_COMMON_H_
#define HIXL_TESTS_LOAD_LOAD_COMMON_H_

#include <dirent.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../peer_process.h"

namespace hixl_load {

// ---------------------------------------------------------------------------
// key=value arguments ("run id=3 target=127.0.0.1:4000 count=200").

class Args {
 public:
  // Parses the remaining words of `in`; words without '=' are errors.
  bool Parse(std::istringstream& in, std::string* error) {
    std::string w;
    while (in >> w) {
      size_t eq = w.find('=');
      if (eq == std::string::npos || eq == 0) {
        if (error) *error = "bad argument '" + w + "' (want key=value)";
        return false;
      }
      kv_[w.substr(0, eq)] = w.substr(eq + 1);
    }
    return true;
  }
  bool Has(const std::string& k) const { return kv_.count(k) != 0; }
  std::string Str(const std::string& k, const std::string& def = "") const {
    auto it = kv_.find(k);
    return it == kv_.end() ? def : it->second;
  }
  // Unsigned number (decimal or 0x...); `ok` turns false when present and bad.
  uint64_t U64(const std::string& k, uint64_t def, bool* ok = nullptr) const {
    auto it = kv_.find(k);
    if (it == kv_.end()) return def;
    char* end = nullptr;
    uint64_t v = std::strtoull(it->second.c_str(), &end, 0);
    if (it->second.empty() || *end != '\0') {
      if (ok) *ok = false;
      return def;
    }
    return v;
  }

 private:
  std::map<std::string, std::string> kv_;
};

// Splits "a,b,c" (empty parts dropped).
inline std::vector<std::string> SplitList(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// The value of "key=value" inside a reply line such as
// "OK sent=10 bytes=4096 ..." (empty when absent). Values hold no spaces,
// except the last key "first=", which runs to the end of the line.
inline std::string Field(const std::string& line, const std::string& key) {
  const std::string pat = key + "=";
  size_t pos = 0;
  for (;;) {
    pos = line.find(pat, pos);
    if (pos == std::string::npos) return "";
    if (pos == 0 || line[pos - 1] == ' ') break;
    pos += pat.size();
  }
  size_t start = pos + pat.size();
  if (key == "first") return line.substr(start);
  size_t end = line.find(' ', start);
  return line.substr(start, end == std::string::npos ? std::string::npos : end - start);
}
inline uint64_t FieldU64(const std::string& line, const std::string& key) {
  return std::strtoull(Field(line, key).c_str(), nullptr, 10);
}

// ---------------------------------------------------------------------------
// Patterns at an offset. A region filled with hixl_test::FillPattern(p, size,
// seed) holds little-endian words PatternWord(seed, k); these give the bytes,
// hash and check of any range [off, off+len) with off a multiple of 8,
// without a copy of the region.

// Fnv1a64 of the pattern bytes [off, off+len) (off % 8 == 0), equal to
// hixl_test::Fnv1a64 over those bytes of a FillPattern'ed buffer.
inline uint64_t PatternRangeHash(uint64_t seed, size_t off, size_t len) {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t h = 0xcbf29ce484222325ull;
  const uint64_t k0 = off / 8;
  const size_t words = len / 8;
  for (size_t j = 0; j < words; ++j) {
    h ^= hixl_test::PatternWord(seed, k0 + j);
    h *= kPrime;
  }
  if (len % 8 != 0) {
    uint64_t w = hixl_test::PatternWord(seed, k0 + words);
    unsigned char b[8];
    std::memcpy(b, &w, 8);
    for (size_t i = 0; i < len % 8; ++i) {
      h ^= b[i];
      h *= kPrime;
    }
  }
  return h;
}

// Index of the first byte of buf[0, len) that differs from the pattern bytes
// [off, off+len) (off % 8 == 0), or -1 when all match.
inline long long PatternMismatch(const void* buf, uint64_t seed, size_t off, size_t len) {
  const auto* p = static_cast<const unsigned char*>(buf);
  const uint64_t k0 = off / 8;
  const size_t words = len / 8;
  for (size_t j = 0; j < words; ++j) {
    uint64_t want = hixl_test::PatternWord(seed, k0 + j);
    uint64_t have;
    std::memcpy(&have, p + j * 8, 8);
    if (have != want) {
      for (size_t i = 0; i < 8; ++i) {
        if (reinterpret_cast<unsigned char*>(&have)[i] !=
            reinterpret_cast<unsigned char*>(&want)[i])
          return static_cast<long long>(j * 8 + i);
      }
    }
  }
  if (len % 8 != 0) {
    uint64_t w = hixl_test::PatternWord(seed, k0 + words);
    const auto* b = reinterpret_cast<const unsigned char*>(&w);
    for (size_t i = 0; i < len % 8; ++i) {
      if (p[words * 8 + i] != b[i]) return static_cast<long long>(words * 8 + i);
    }
  }
  return -1;
}

// ---------------------------------------------------------------------------
// Resources of a process, from /proc/PID. -1 where a value could not be read.

struct Usage {
  long fds = -1;        // entries of /proc/PID/fd
  long threads = -1;    // "Threads:" of /proc/PID/status
  long rss_kib = -1;    // "VmRSS:"
  long anon_kib = -1;   // "RssAnon:"
  long shmem_kib = -1;  // "RssShmem:"
  long maps = -1;       // lines of /proc/PID/maps
};

inline long CountDirEntries(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  long n = 0;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
  }
  closedir(d);
  return n;
}

inline Usage ReadUsage(pid_t pid) {
  Usage u;
  const std::string base = "/proc/" + std::to_string(pid);
  u.fds = CountDirEntries(base + "/fd");
  std::ifstream st(base + "/status");
  std::string line;
  auto value = [&](const char* key, long& out) {
    const size_t n = std::strlen(key);
    if (line.compare(0, n, key) == 0) out = std::strtol(line.c_str() + n, nullptr, 10);
  };
  while (std::getline(st, line)) {
    value("Threads:", u.threads);
    value("VmRSS:", u.rss_kib);
    value("RssAnon:", u.anon_kib);
    value("RssShmem:", u.shmem_kib);
  }
  std::ifstream maps(base + "/maps");
  if (maps) {
    long n = 0;
    while (std::getline(maps, line)) ++n;
    u.maps = n;
  }
  return u;
}

inline std::string UsageString(const Usage& u) {
  std::ostringstream o;
  o << "fds=" << u.fds << " threads=" << u.threads << " rss=" << u.rss_kib / 1024 << "MiB"
    << " (anon " << u.anon_kib / 1024 << "MiB, shmem " << u.shmem_kib / 1024 << "MiB)"
    << " maps=" << u.maps;
  return o.str();
}

}  // namespace hixl_load

#endif  // HIXL_TESTS_LOAD_LOAD_COMMON_H_
