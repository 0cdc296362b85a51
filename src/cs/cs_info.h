// What a HiXL CS server tells its clients, and the endpoint vocabulary.
//
// Every engine of a server hands the same description to the clients that
// link to it (Hixl::SetLocalInfo, in the handshake), a JSON object:
//   {"hixlcs":1, "eps":[{"p":"tcp","a":"10.0.0.1","e":"10.0.0.1:4711"}, ...],
//    "mems":[{"t":"kv0","a":140234...,"n":1048576}, ...]}
// eps: each endpoint's transport, its address and its engine's "ip:port";
// mems: the tagged memory, in registration order. A client decodes it as
// hostile bytes: counts, lengths, ranges and addresses are checked first.
// Thread safety: stateless functions.
#ifndef HIXL_CS_CS_INFO_H_
#define HIXL_CS_CS_INFO_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "hixl/hixl.h"
#include "hixl/hixl_cs.h"

namespace hixl::cs {

inline constexpr int kInfoVersion = 1;

// The value of an enum field the caller filled in, read as the integer it
// holds: a C caller may store any value, and loading one outside the enum's
// range as the C++ enum type is undefined.
template <typename E>
uint32_t Raw(const E& field) {
  static_assert(sizeof(E) == sizeof(uint32_t), "a 32-bit enum field");
  uint32_t v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

// Checks a CommMem a caller passed (host memory, non-NULL, size > 0, no wrap).
Status CheckMem(const CommMem* mem);

// The transport an endpoint protocol maps to: ok with its LinkType and name
// ("shm", "tcp", "ucx"), UNSUPPORTED for protocols hixl has no transport for,
// PARAM_INVALID for values outside the enum.
Status MapProtocol(uint32_t protocol, LinkType& link, std::string& name);

// Checks one endpoint (protocol, location, addr an IP literal, reserved
// zero); `what` names it in the message.
Status CheckEndpoint(const EndpointDesc& ep, const std::string& what);

struct InfoEndpoint {
  std::string transport;  // "shm", "tcp", "ucx"
  std::string addr;       // the endpoint's IP literal
  std::string engine;     // its engine's "ip:port"
};
struct InfoMem {
  std::string tag;
  uint64_t addr = 0;
  uint64_t size = 0;
};
struct ServerInfo {
  std::vector<InfoEndpoint> endpoints;
  std::vector<InfoMem> mems;
};

std::string EncodeInfo(const ServerInfo& info);
// Parses and checks; PARAM_INVALID (saying what is wrong) on anything off.
Status DecodeInfo(const std::string& text, ServerInfo& out);

// A memory tag: 1..HIXL_CS_MAX_TAG_LEN bytes of printable ASCII.
Status CheckTag(const char* tag, std::string& out);

}  // namespace hixl::cs

#endif  // HIXL_CS_CS_INFO_H_
