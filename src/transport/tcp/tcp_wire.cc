// The tcp data-lane wire format: encoding the lane hello, and the pure
// checks of the hello and of request headers (see tcp_wire.h).
// Thread safety: stateless; CheckRequestHeader relies on LocalRegions' own
// locking.
#include "transport/tcp/tcp_wire.h"

#include <cstring>

namespace hixl::transport::tcp {

const char* StatusText(uint8_t status) {
  switch (status) {
    case kOk: return "ok";
    case kBadRange: return "range outside the target's registered regions";
    case kDenied: return "the target's region does not permit this operation";
    case kCopyFailed: return "the target's copy to or from its device memory failed";
    default: return "malformed request";
  }
}

auth::Tag LaneTag(const auth::Key& link_key, uint64_t token, uint64_t generation, uint32_t lane) {
  uint8_t b[20];
  std::memcpy(b, &token, 8);
  std::memcpy(b + 8, &generation, 8);
  std::memcpy(b + 16, &lane, 4);
  return auth::Hmac(auth::View(link_key), "hixl-auth-v1 lane",
                    std::string_view(reinterpret_cast<const char*>(b), sizeof(b)));
}

LaneHello MakeLaneHello(uint64_t token, uint64_t generation, uint32_t lane,
                        const auth::Key* link_key) {
  LaneHello h{kLaneMagic, kLaneVersion, token, generation, lane, 0, {}};
  if (link_key != nullptr) {
    const auth::Tag t = LaneTag(*link_key, token, generation, lane);
    std::memcpy(h.tag, t.data(), sizeof(h.tag));
  }
  return h;
}

std::array<uint8_t, kLaneHelloSize> EncodeLaneHello(const LaneHello& h) {
  std::array<uint8_t, kLaneHelloSize> out{};
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

const char* HelloVerdictText(HelloVerdict v) {
  switch (v) {
    case HelloVerdict::kOk: return "ok";
    case HelloVerdict::kShort: return "lane hello too short";
    case HelloVerdict::kBadMagic: return "not a hixl data lane";
    case HelloVerdict::kBadVersion: return "unsupported data-lane version";
  }
  return "invalid lane hello";
}

ParsedHello ParseLaneHello(std::span<const uint8_t> bytes) {
  ParsedHello p;
  if (bytes.size() < kLaneHelloSize) return p;
  std::memcpy(&p.hello, bytes.data(), kLaneHelloSize);
  if (p.hello.magic != kLaneMagic) {
    p.verdict = HelloVerdict::kBadMagic;
  } else if (p.hello.version != kLaneVersion) {
    p.verdict = HelloVerdict::kBadVersion;
  } else {
    p.verdict = HelloVerdict::kOk;
  }
  return p;
}

bool LaneReplyAccepts(const LaneReply& r) { return r.magic == kLaneMagic && r.status == 0; }

std::optional<ReqHdr> ParseRequestHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < kReqHdrSize) return std::nullopt;
  ReqHdr h;
  std::memcpy(&h, bytes.data(), kReqHdrSize);
  return h;
}

RequestVerdict CheckRequestHeader(const ReqHdr& h, const memory::LocalRegions& regions) {
  if (h.magic != kReqMagic || (h.op != kOpRead && h.op != kOpWrite) || h.len == 0 ||
      h.len > kMaxSlice || h.addr == 0 || h.addr + h.len < h.addr) {
    return {kBadRequest, "malformed request header"};
  }
  std::optional<memory::LocalRegion> region = regions.FindContaining(h.addr, h.len);
  if (!region) return {kBadRange, "request outside every registered region"};
  if ((region->perms & (h.op == kOpWrite ? MEM_PERM_WRITE : MEM_PERM_READ)) == 0) {
    return {kDenied, "request against the region's permission"};
  }
  RequestVerdict ok;
  // Device memory is never touched by the lane's socket calls: the lane
  // stages it through host memory with the driver's copies.
  if (region->type == MemType::MEM_DEVICE)
    ok.device = region->dev.ordinal < 0 ? 0 : region->dev.ordinal;
  return ok;
}

}  // namespace hixl::transport::tcp
