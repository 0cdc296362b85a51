// Fuzz target: the bytes an initiator sends on a tcp data lane, through the
// same pure checks a target's ServerLane applies (transport/tcp/tcp_wire.h):
// the first kLaneHelloSize bytes as a lane hello (ParseLaneHello), the rest
// as request headers back to back (ParseRequestHeader, then
// CheckRequestHeader against a small region table, lane_regions.h). Payloads
// are not part of the input: the checks never see them.
//
// Every verdict is compared with an independent model of the rules, and a
// request the checks accept must lie wholly inside one registered region
// that permits its operation: any mismatch aborts, so it is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "lane_regions.h"
#include "memory/local_regions.h"
#include "transport/tcp/tcp_wire.h"

namespace {

namespace tcp = hixl::transport::tcp;

#define LANE_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "fuzz_lane: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

uint64_t Le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

const hixl::memory::LocalRegions& Regions() {
  static const hixl::memory::LocalRegions* table = [] {
    auto* t = new hixl::memory::LocalRegions();
    for (const auto& r : hixl_fuzz::kLaneRegions) {
      hixl::memory::LocalRegion lr;
      lr.addr = r.addr;
      lr.len = r.len;
      lr.perms = r.perms;
      uint64_t id = 0;
      bool added = false;
      LANE_CHECK(t->Add(lr, id, added).ok() && added);
    }
    return t;
  }();
  return *table;
}

// The model: the region of the table wholly containing [addr, addr+len).
const hixl_fuzz::LaneRegion* Containing(uint64_t addr, uint64_t len) {
  for (const auto& r : hixl_fuzz::kLaneRegions) {
    if (addr >= r.addr && addr - r.addr <= r.len && len <= r.len - (addr - r.addr)) return &r;
  }
  return nullptr;
}

uint8_t ExpectedStatus(const tcp::ReqHdr& h) {
  const bool wraps = h.addr + h.len < h.addr;  // also ending exactly at 2^64
  if (h.magic != tcp::kReqMagic || h.op > tcp::kOpWrite || h.len == 0 || h.len > tcp::kMaxSlice ||
      h.addr == 0 || wraps) {
    return tcp::kBadRequest;
  }
  const hixl_fuzz::LaneRegion* r = Containing(h.addr, h.len);
  if (r == nullptr) return tcp::kBadRange;
  const uint32_t need = h.op == tcp::kOpWrite ? hixl::MEM_PERM_WRITE : hixl::MEM_PERM_READ;
  return (r->perms & need) != 0 ? tcp::kOk : tcp::kDenied;
}

void CheckHello(std::span<const uint8_t> in) {
  const tcp::ParsedHello p = tcp::ParseLaneHello(in);
  if (in.size() < tcp::kLaneHelloSize) {
    LANE_CHECK(p.verdict == tcp::HelloVerdict::kShort);
    return;
  }
  const uint8_t* b = in.data();
  LANE_CHECK(p.hello.magic == Le(b, 4) && p.hello.version == Le(b + 4, 4));
  LANE_CHECK(p.hello.token == Le(b + 8, 8) && p.hello.generation == Le(b + 16, 8));
  const tcp::HelloVerdict want = p.hello.magic != tcp::kLaneMagic ? tcp::HelloVerdict::kBadMagic
                                 : p.hello.version != tcp::kLaneVersion
                                     ? tcp::HelloVerdict::kBadVersion
                                     : tcp::HelloVerdict::kOk;
  LANE_CHECK(p.verdict == want);
  LANE_CHECK(tcp::HelloVerdictText(p.verdict) != nullptr);
  // What an initiator would send for these fields is these bytes.
  const auto again = tcp::EncodeLaneHello(p.hello);
  LANE_CHECK(std::memcmp(again.data(), b, tcp::kLaneHelloSize) == 0);
}

void CheckRequest(std::span<const uint8_t> in) {
  const std::optional<tcp::ReqHdr> ph = tcp::ParseRequestHeader(in);
  if (in.size() < tcp::kReqHdrSize) {
    LANE_CHECK(!ph);
    return;
  }
  LANE_CHECK(ph.has_value());
  const tcp::ReqHdr& h = *ph;
  const uint8_t* b = in.data();
  LANE_CHECK(h.magic == Le(b, 4) && h.op == b[4] && h.seq == Le(b + 8, 8));
  LANE_CHECK(h.addr == Le(b + 16, 8) && h.len == Le(b + 24, 8));

  const tcp::RequestVerdict v = tcp::CheckRequestHeader(h, Regions());
  LANE_CHECK(v.ok() == (v.why == nullptr));
  LANE_CHECK(tcp::StatusText(v.status) != nullptr);
  if (v.ok()) {
    // The property the target relies on before any byte moves.
    const hixl_fuzz::LaneRegion* r = Containing(h.addr, h.len);
    LANE_CHECK(r != nullptr);
    LANE_CHECK(h.len > 0 && h.len <= tcp::kMaxSlice);
    LANE_CHECK((r->perms & (h.op == tcp::kOpWrite ? hixl::MEM_PERM_WRITE : hixl::MEM_PERM_READ)) !=
               0);
  }
  LANE_CHECK(v.status == ExpectedStatus(h));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  CheckHello(in);
  if (size < tcp::kLaneHelloSize) {
    CheckRequest(in);  // a short header is no header
    return 0;
  }
  for (size_t off = tcp::kLaneHelloSize; off < size; off += tcp::kReqHdrSize) {
    CheckRequest(in.subspan(off));
  }
  return 0;
}
