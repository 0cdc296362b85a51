// The serialized form of a C API memory handle (hixlMemHandleSerialize /
// hixlMemHandleDeserialize): "hixl-mem2;e=ENGINE;g=GEN;a=HEXADDR;l=LEN;p=PERMS;c=CHECKSUM".
#include "capi/mem_handle_string.h"

#include <cinttypes>
#include <climits>
#include <cstdio>
#include <vector>

#include "common/net.h"

namespace hixl::capi {
namespace {

// FNV-1a 64 of a string: the serialized handle's checksum.
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Format tag: hixl-mem2 added the owner's generation (g=); other tags
// (hixl-mem1 included) are refused.
constexpr char kHandlePrefix[] = "hixl-mem2;";

}  // namespace

std::string SerializeMemHandle(const MemHandleFields& m) {
  char buf[160];
  std::snprintf(buf, sizeof buf, ";g=%" PRIu64 ";a=%" PRIx64 ";l=%" PRIu64 ";p=%u", m.generation,
                m.addr, m.len, m.perms);
  std::string body = std::string(kHandlePrefix) + "e=" + m.engine_addr + buf;
  char sum[32];
  std::snprintf(sum, sizeof sum, ";c=%016" PRIx64, Fnv1a(body));
  return body + sum;
}

bool ParseHexU64(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  out = v;
  return true;
}

// Decimal uint64 without sign or leading zeros ("0" itself is fine).
bool ParseDecU64(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  out = v;
  return true;
}

Status ParseMemHandle(const std::string& s, MemHandleFields& m) {
  auto bad = [&](const std::string& why) {
    return Status::ParamInvalid("memory handle string is invalid (" + why + ")");
  };
  if (s.size() > 512) return bad("too long");
  if (s.compare(0, sizeof(kHandlePrefix) - 1, kHandlePrefix) != 0) {
    return bad(
        s.compare(0, 9, "hixl-mem1") == 0
            ? "format hixl-mem1 of an older hixl: serialize the handle again with this version"
            : "wrong prefix (expected hixl-mem2)");
  }
  size_t cpos = s.rfind(";c=");
  if (cpos == std::string::npos) return bad("no checksum");
  uint64_t sum = 0;
  std::string sum_text = s.substr(cpos + 3);
  if (sum_text.size() != 16 || !ParseHexU64(sum_text, sum)) return bad("malformed checksum");
  std::string body = s.substr(0, cpos);
  if (Fnv1a(body) != sum) return bad("checksum mismatch: truncated or altered");
  // body: prefix e=ENGINE;g=DEC;a=HEX;l=DEC;p=DEC
  std::vector<std::string> parts;
  size_t start = sizeof(kHandlePrefix) - 1;
  for (;;) {
    size_t semi = body.find(';', start);
    parts.push_back(
        body.substr(start, semi == std::string::npos ? std::string::npos : semi - start));
    if (semi == std::string::npos) break;
    start = semi + 1;
  }
  if (parts.size() != 5) return bad("expected 5 fields");
  const char* names[] = {"e=", "g=", "a=", "l=", "p="};
  for (size_t i = 0; i < 5; ++i) {
    if (parts[i].compare(0, 2, names[i]) != 0) return bad(std::string("missing ") + names[i]);
    parts[i] = parts[i].substr(2);
  }
  net::HostPort hp;
  if (!net::ParseHostPort(parts[0], hp).ok() || hp.port <= 0) return bad("engine address");
  uint64_t len = 0, perms = 0;
  if (!ParseDecU64(parts[1], m.generation)) return bad("generation");
  if (!ParseHexU64(parts[2], m.addr) || m.addr == 0) return bad("address");
  if (!ParseDecU64(parts[3], len) || len == 0 || len > static_cast<uint64_t>(INT64_MAX)) {
    return bad("length");
  }
  if (!ParseDecU64(parts[4], perms) || perms < 1 || perms > 3) return bad("permissions");
  if (m.addr + len < m.addr) return bad("region wraps around");
  m.engine_addr = hp.ToString();
  m.len = len;
  m.perms = static_cast<uint32_t>(perms);
  return Status::Ok();
}

}  // namespace hixl::capi
