// The control protocol between engines (over the listener's TCP socket).
//
//   initiator -> target: hello    {v, engine, gen, host, pid}
//   target -> initiator: welcome  {v, engine, gen, host, pid, regions[], tp{name: info}}
//                     or reject   {reason}
//   target -> initiator: radd     {regions[]}         regions registered later
//   target -> initiator: rdel     {seq, ids[]}        regions being removed
//   initiator -> target: rdel_ack {seq}               no transfer uses them any more
//   either way:          bye      {}
//
// A region is {id, addr, len, perm, fd}; fd=true means shareable memory the
// shm transport can map. Every decoder checks types, ranges and limits.
// Thread safety: stateless functions.
#ifndef HIXL_CONTROL_PROTOCOL_H_
#define HIXL_CONTROL_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/wire.h"
#include "hixl/status.h"

namespace hixl::control {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kMaxRegionsPerMessage = 1u << 20;
inline constexpr size_t kMaxEngineName = 256;

struct RegionDesc {
  uint64_t id = 0;
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t perms = 0;
  bool shareable = false;
};

struct Hello {
  uint32_t version = kProtocolVersion;
  std::string engine;  // the initiator's own address ("ip" or "ip:port")
  uint64_t generation = 0;
  std::string host;
  int64_t pid = 0;
};

struct Welcome {
  uint32_t version = kProtocolVersion;
  std::string engine;
  uint64_t generation = 0;
  std::string host;
  int64_t pid = 0;
  std::vector<RegionDesc> regions;
  wire::Msg transports = wire::Msg::object();
};

// The message's type ("hello", ...); every decoded message has one.
std::string TypeOf(const wire::Msg& m);

wire::Msg EncodeHello(const Hello& h);
Status DecodeHello(const wire::Msg& m, Hello& out);

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

wire::Msg EncodeBye();

}  // namespace hixl::control

#endif  // HIXL_CONTROL_PROTOCOL_H_
