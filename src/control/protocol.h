// The control protocol between engines (over the listener's TCP socket).
//
//   initiator -> target: hello    {v, engine, gen, host, pid, hb, auth?}
//   target -> initiator: challenge {sn, proof}        only when the target authenticates
//   initiator -> target: auth      {proof}            the initiator's answer
//   target -> initiator: welcome  {v, engine, gen, host, pid, hb, regions[], tp{name: info}, info?}
// auth: the initiator's nonce cn (hex), present when it has a secret. A
// target with a secret answers with its nonce sn and its proof
// (auth::TargetProof); the initiator checks it and answers with its own
// (auth::InitiatorProof); only then does the welcome (regions, transport
// tokens) go out. See auth/auth.h.
// info: the target's application string (Hixl::SetLocalInfo), optional.
// hb: the sender's heartbeat interval (ms, optional, default 1000). A link
// beats at the smaller of the two: each side sends `hb` when it has sent
// nothing for that long, and gives the peer up after its own miss count.
//                     or reject   {reason}
//   target -> initiator: radd     {regions[]}         regions registered later
//   target -> initiator: rdel     {seq, ids[]}        regions being removed
//   initiator -> target: rdel_ack {seq}               no transfer uses them any more
//   initiator -> target: notify   {seq, n, m}         a notification (n, m: bytes)
//   target -> initiator: nack      {seq, code, why}    notify answered: queued (code 0) or refused
//   initiator -> target: lfence    {seq}              close this link's data lanes now
//   target -> initiator: lfenced   {seq}              done: nothing more lands from them
//   either way:          hb       {}                  heartbeat, sent when a link is otherwise idle
//   either way:          bye      {}
//
// Instead of a hello, a connection's first message may be a probe: who is
// listening here? It needs no authentication and links nothing:
//   prober -> target: probe    {v}
//   target -> prober: ident    {v, engine, gen}   then the prober closes
// The registry uses it to tell a dead name holder from a live one; hixl-info
// to name what listens at an address. It tells only what the engine's own
// address and handle strings tell (its address and generation).
//
// A region is {id, addr, len, perm, fd, tp?}; fd=true means shareable memory
// the shm transport can map; tp (optional) is {transport name: info}. Every decoder checks types,
// ranges and limits. Thread safety: stateless functions.
#ifndef HIXL_CONTROL_PROTOCOL_H_
#define HIXL_CONTROL_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "auth/auth.h"
#include "common/wire.h"
#include "hixl/hixl.h"
#include "hixl/status.h"

namespace hixl::control {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kMaxRegionsPerMessage = 1u << 20;
inline constexpr size_t kMaxRegionTransports = 8;
inline constexpr size_t kMaxEngineName = 256;
inline constexpr size_t kMaxLocalInfo = 131072;
inline constexpr uint32_t kDefaultHeartbeatMs = 1000;
inline constexpr uint32_t kMinHeartbeatMs = 10;
inline constexpr uint32_t kMaxHeartbeatMs = 600000;

struct RegionDesc {
  uint64_t id = 0;
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t perms = 0;
  bool shareable = false;
  bool device = false;  // device memory: only a transport that says how reaches it
  // What each transport needs to reach the region ({name: info}, e.g. UCX's
  // packed remote key); an object of at most kMaxRegionTransports entries.
  wire::Msg tp = wire::Msg::object();
};

struct Hello {
  uint32_t version = kProtocolVersion;
  std::string engine;  // the initiator's own address ("ip" or "ip:port")
  uint64_t generation = 0;
  std::string host;
  int64_t pid = 0;
  uint32_t hb_ms = kDefaultHeartbeatMs;
  bool has_auth = false;  // the initiator offers authentication with nonce cn
  auth::Nonce cn{};
  // The initiator's LinkType option: the transports it may use toward the
  // target (AUTO: any; absent on the wire means AUTO).
  LinkType link = LinkType::AUTO;
};

struct Challenge {
  auth::Nonce sn{};
  auth::Tag proof{};
};

struct Welcome {
  uint32_t version = kProtocolVersion;
  std::string engine;
  uint64_t generation = 0;
  std::string host;
  int64_t pid = 0;
  uint32_t hb_ms = kDefaultHeartbeatMs;
  std::vector<RegionDesc> regions;
  wire::Msg transports = wire::Msg::object();
  std::string info;  // at most kMaxLocalInfo bytes
};

// The answer to a probe: the listening engine's identity.
struct Ident {
  uint32_t version = kProtocolVersion;
  std::string engine;  // its address ("ip:port")
  uint64_t generation = 0;
};

// The message's type ("hello", ...); every decoded message has one.
std::string TypeOf(const wire::Msg& m);

wire::Msg EncodeHello(const Hello& h);
Status DecodeHello(const wire::Msg& m, Hello& out);

wire::Msg EncodeChallenge(const Challenge& c);
Status DecodeChallenge(const wire::Msg& m, Challenge& out);

wire::Msg EncodeAuth(const auth::Tag& proof);
Status DecodeAuth(const wire::Msg& m, auth::Tag& out);

wire::Msg EncodeWelcome(const Welcome& w);
Status DecodeWelcome(const wire::Msg& m, Welcome& out);

wire::Msg EncodeReject(const std::string& reason);
std::string DecodeRejectReason(const wire::Msg& m);

wire::Msg EncodeRegionAdd(const std::vector<RegionDesc>& regions);
Status DecodeRegionAdd(const wire::Msg& m, std::vector<RegionDesc>& out);

wire::Msg EncodeRegionDel(uint64_t seq, const std::vector<uint64_t>& ids);
Status DecodeRegionDel(const wire::Msg& m, uint64_t& seq, std::vector<uint64_t>& ids);

wire::Msg EncodeRegionDelAck(uint64_t seq);
Status DecodeRegionDelAck(const wire::Msg& m, uint64_t& seq);

inline constexpr size_t kMaxNotifyField = 1024;
wire::Msg EncodeNotify(uint64_t seq, const std::string& name, const std::string& msg);
Status DecodeNotify(const wire::Msg& m, uint64_t& seq, std::string& name, std::string& msg);

// code is a StatusCode value; 0 = queued.
wire::Msg EncodeNotifyAck(uint64_t seq, uint32_t code, const std::string& why);
Status DecodeNotifyAck(const wire::Msg& m, uint64_t& seq, uint32_t& code, std::string& why);

// A lane fence (lfence) and its answer (lfenced).
wire::Msg EncodeLaneFence(uint64_t seq);
wire::Msg EncodeLaneFenced(uint64_t seq);
Status DecodeLaneFenceSeq(const wire::Msg& m, uint64_t& seq);

wire::Msg EncodeProbe();
wire::Msg EncodeIdent(const Ident& id);
Status DecodeIdent(const wire::Msg& m, Ident& out);

wire::Msg EncodeHeartbeat();
wire::Msg EncodeBye();

}  // namespace hixl::control

#endif  // HIXL_CONTROL_PROTOCOL_H_
