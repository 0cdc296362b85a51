// The wire format of the tcp transport's data lanes, and the pure checks a
// target applies to the bytes an initiator sends on them.
//
// Everything about the layout of the lane hello and of the request and
// response headers lives here: their structs, sizes and constants, the
// status codes and their texts, and the functions that turn received bytes
// into a verdict. ParseLaneHello and CheckRequestHeader have no side effects
// (CheckRequestHeader only looks regions up), so a fuzzer drives exactly the
// code a target runs (tests/fuzz/fuzz_lane.cc).
//
// Layout (little endian, fixed size, no padding between fields):
//   lane hello  {u32 magic 'HXL2', u32 version, u64 token, u64 generation,
//                u32 lane, u32 flags (0), u8 tag[32]}
//   lane reply  {u32 magic 'HXL2', u32 status (0: accepted)}
//   request     {u32 magic 'HXLQ', u8 op, u8 pad[3], u64 seq, u64 addr, u64 len}
//   response    {u32 magic 'HXLR', u8 op, u8 status, u16 pad, u64 seq, u64 len}
// tag: on a link that authenticated (auth/auth.h), LaneTag of the link key
// over token, generation and lane index; the target admits each lane index
// of a link once. On an unauthenticated link the tag is zero and not read.
// Thread safety: all functions are thread-safe (no state of their own).
#ifndef HIXL_TRANSPORT_TCP_TCP_WIRE_H_
#define HIXL_TRANSPORT_TCP_TCP_WIRE_H_

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "auth/auth.h"
#include "memory/local_regions.h"

namespace hixl::transport::tcp {

static_assert(std::endian::native == std::endian::little,
              "the data-lane protocol is little endian");

constexpr uint32_t kLaneMagic = 0x324C5848;  // "HXL2"
constexpr uint32_t kReqMagic = 0x514C5848;   // "HXLQ"
constexpr uint32_t kRespMagic = 0x524C5848;  // "HXLR"
constexpr uint32_t kLaneVersion = 2;
// Lane indexes an authenticated link may open (each once).
constexpr uint32_t kMaxLanes = 64;
// The largest slice one request may move.
constexpr uint64_t kMaxSlice = 64u << 20;

enum : uint8_t { kOpRead = 0, kOpWrite = 1 };
// Response status codes.
// kCopyFailed: the request was valid but the target's copy between its
// device memory and its host staging buffer failed (nothing, or only part
// of a WRITE, reached the device; a READ sent no payload).
enum : uint8_t { kOk = 0, kBadRange = 1, kDenied = 2, kBadRequest = 3, kCopyFailed = 4 };

struct LaneHello {
  uint32_t magic;
  uint32_t version;
  uint64_t token;       // from the target's handshake (DescribeForPeer)
  uint64_t generation;  // the target engine's generation the initiator knows
  uint32_t lane;        // 0.. the initiator's lane count - 1
  uint32_t flags;       // 0
  uint8_t tag[32];      // LaneTag on an authenticated link, else zero
};
struct LaneReply {
  uint32_t magic;
  uint32_t status;
};
struct ReqHdr {
  uint32_t magic;
  uint8_t op;
  uint8_t pad[3];
  uint64_t seq;
  uint64_t addr;
  uint64_t len;
};
struct RespHdr {
  uint32_t magic;
  uint8_t op;
  uint8_t status;
  uint16_t pad;
  uint64_t seq;
  uint64_t len;
};

// Bytes each message occupies on the wire.
constexpr size_t kLaneHelloSize = 64;
constexpr size_t kLaneReplySize = 8;
constexpr size_t kReqHdrSize = 32;
constexpr size_t kRespHdrSize = 24;
static_assert(sizeof(LaneHello) == kLaneHelloSize && sizeof(LaneReply) == kLaneReplySize &&
              sizeof(ReqHdr) == kReqHdrSize && sizeof(RespHdr) == kRespHdrSize);

// What a response status means, for error messages.
const char* StatusText(uint8_t status);

// ---- lane hello --------------------------------------------------------------

// The tag binding a lane to its authenticated link.
auth::Tag LaneTag(const auth::Key& link_key, uint64_t token, uint64_t generation, uint32_t lane);

// The hello an initiator sends first on lane `lane` of a link; link_key:
// the link's key when it authenticated, else null (zero tag).
LaneHello MakeLaneHello(uint64_t token, uint64_t generation, uint32_t lane = 0,
                        const auth::Key* link_key = nullptr);
std::array<uint8_t, kLaneHelloSize> EncodeLaneHello(const LaneHello& h);

enum class HelloVerdict : uint8_t {
  kOk,          // well formed; the token and generation are still to be checked
  kShort,       // fewer than kLaneHelloSize bytes
  kBadMagic,    // not a hixl data lane
  kBadVersion,  // a data-lane protocol this build does not speak
};
const char* HelloVerdictText(HelloVerdict v);

struct ParsedHello {
  HelloVerdict verdict = HelloVerdict::kShort;
  LaneHello hello{};  // the decoded fields (meaningful unless kShort)
};
// Decodes the first kLaneHelloSize bytes of bytes as a lane hello and checks
// what can be checked without the target's state (magic, version).
ParsedHello ParseLaneHello(std::span<const uint8_t> bytes);

// Whether the target's reply to a hello accepts the lane.
bool LaneReplyAccepts(const LaneReply& r);

// ---- request headers ---------------------------------------------------------

// Decodes the first kReqHdrSize bytes of bytes; nullopt if there are fewer.
std::optional<ReqHdr> ParseRequestHeader(std::span<const uint8_t> bytes);

struct RequestVerdict {
  uint8_t status = kOk;       // the response status: kOk, kBadRequest, kBadRange, kDenied
  const char* why = nullptr;  // what is wrong (null when kOk)
  // kOk against device memory (MEM_DEVICE): the device's ordinal, so that
  // the lane moves the bytes through a host staging buffer; -1 for host.
  int device = -1;
  bool ok() const { return status == kOk; }
};
// Checks a request header against the target's region table: well formed
// (magic, op, 0 < len <= kMaxSlice, addr != 0, [addr, addr+len) does not
// wrap), wholly inside one registered region, and that region permits the
// operation (READ needs MEM_PERM_READ, WRITE needs MEM_PERM_WRITE). Only a
// request this accepts may touch memory; one against device memory is
// accepted with `device` set, and only the driver may touch that memory.
RequestVerdict CheckRequestHeader(const ReqHdr& h, const memory::LocalRegions& regions);

}  // namespace hixl::transport::tcp

#endif  // HIXL_TRANSPORT_TCP_TCP_WIRE_H_
