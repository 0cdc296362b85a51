#include "cs/cs_info.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "common/net.h"

namespace hixl::cs {
namespace {

using Json = nlohmann::json;

bool IsIp(const std::string& s) {
  if (s.empty() || s.size() > 63 || s.find_first_of("[]") != std::string::npos) return false;
  net::HostPort hp;
  return net::ParseHostPort(s, hp).ok() && hp.port < 0;
}

bool IsEngineAddress(const std::string& s) {
  if (s.empty() || s.size() > 79) return false;
  net::HostPort hp;
  return net::ParseHostPort(s, hp).ok() && hp.port > 0;
}

bool GetU64(const Json& j, const char* key, uint64_t& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  out = it->get<uint64_t>();
  return true;
}

bool GetStr(const Json& j, const char* key, size_t max, std::string& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return false;
  const auto& s = it->get_ref<const std::string&>();
  if (s.empty() || s.size() > max) return false;
  out = s;
  return true;
}

}  // namespace

Status MapProtocol(uint32_t protocol, LinkType& link, std::string& name) {
  switch (protocol) {
    case COMM_PROTOCOL_HCCS:
    case COMM_PROTOCOL_SHM:
      link = LinkType::SHM;
      name = "shm";
      return Status::Ok();
    case COMM_PROTOCOL_TCP:
      link = LinkType::TCP;
      name = "tcp";
      return Status::Ok();
    case COMM_PROTOCOL_ROCE:
    case COMM_PROTOCOL_UCX:
      link = LinkType::UCX;
      name = "ucx";
      return Status::Ok();
    case COMM_PROTOCOL_PCIE:
      return Status::Unsupported(
          "protocol PCIE: hixl has no transport for it (use TCP, SHM or UCX)");
    case COMM_PROTOCOL_SIO:
      return Status::Unsupported(
          "protocol SIO: hixl has no transport for it (use TCP, SHM or UCX)");
    case COMM_PROTOCOL_UB:
      return Status::Unsupported("protocol UB: hixl has no transport for it (use TCP, SHM or UCX)");
    default:
      return Status::ParamInvalid("protocol " + std::to_string(protocol) +
                                  " is not a CommProtocol value");
  }
}

Status CheckEndpoint(const EndpointDesc& ep, const std::string& what) {
  LinkType link;
  std::string name;
  Status s = MapProtocol(Raw(ep.protocol), link, name);
  if (!s.ok()) return Status(s.code(), what + ": " + s.message());
  const uint32_t location = Raw(ep.location);
  if (location == END_POINT_LOCATION_DEVICE) {
    return Status::Unsupported(what +
                               ": device endpoints are not supported yet (host memory only)");
  }
  if (location != END_POINT_LOCATION_HOST) {
    return Status::ParamInvalid(what + ": location " + std::to_string(location) +
                                " is not an EndpointLocation value");
  }
  if (ep.addr == nullptr) return Status::ParamInvalid(what + ": addr is NULL");
  if (!IsIp(ep.addr)) {
    return Status::ParamInvalid(what + ": addr \"" + std::string(ep.addr).substr(0, 64) +
                                "\" is not an IPv4 or IPv6 literal");
  }
  for (uint32_t r : ep.reserved) {
    if (r != 0) return Status::ParamInvalid(what + ": reserved fields must be zero");
  }
  return Status::Ok();
}

Status CheckMem(const CommMem* mem) {
  if (mem == nullptr) return Status::ParamInvalid("mem is NULL");
  const uint32_t type = Raw(mem->type);
  if (type == COMM_MEM_TYPE_DEVICE) {
    return Status::Unsupported("device memory is not supported yet (host memory only)");
  }
  if (type != COMM_MEM_TYPE_HOST)
    return Status::ParamInvalid("mem->type is not a CommMemType value");
  if (mem->addr == nullptr || mem->size == 0)
    return Status::ParamInvalid("mem has a NULL addr or size 0");
  const uint64_t a = reinterpret_cast<uintptr_t>(mem->addr);
  if (a + mem->size < a) return Status::ParamInvalid("mem wraps around the address space");
  return Status::Ok();
}

Status CheckTag(const char* tag, std::string& out) {
  if (tag == nullptr) return Status::ParamInvalid("mem_tag is NULL");
  size_t n = strnlen(tag, HIXL_CS_MAX_TAG_LEN + 1);
  if (n == 0) return Status::ParamInvalid("mem_tag is empty");
  if (n > HIXL_CS_MAX_TAG_LEN) {
    return Status::ParamInvalid("mem_tag is longer than " + std::to_string(HIXL_CS_MAX_TAG_LEN) +
                                " bytes");
  }
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(tag[i]);
    if (c < 0x20 || c > 0x7e) {
      return Status::ParamInvalid("mem_tag must be printable ASCII (byte " + std::to_string(i) +
                                  " is not)");
    }
  }
  out.assign(tag, n);
  return Status::Ok();
}

std::string EncodeInfo(const ServerInfo& info) {
  Json eps = Json::array();
  for (const auto& e : info.endpoints)
    eps.push_back({{"p", e.transport}, {"a", e.addr}, {"e", e.engine}});
  Json mems = Json::array();
  for (const auto& m : info.mems) mems.push_back({{"t", m.tag}, {"a", m.addr}, {"n", m.size}});
  Json j = {{"hixlcs", kInfoVersion}, {"eps", std::move(eps)}, {"mems", std::move(mems)}};
  return j.dump();
}

Status DecodeInfo(const std::string& text, ServerInfo& out) {
  auto bad = [](const std::string& why) {
    return Status::ParamInvalid("the server's description is malformed: " + why);
  };
  if (text.empty())
    return Status::ParamInvalid("the peer is not a HiXL CS server (it sent no description)");
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  auto v = j.find("hixlcs");
  if (v == j.end()) return Status::ParamInvalid("the peer is not a HiXL CS server");
  if (!v->is_number_unsigned() || v->get<uint64_t>() != kInfoVersion) {
    return Status::Unsupported("the server speaks another HiXL CS version");
  }
  auto eps = j.find("eps");
  auto mems = j.find("mems");
  if (eps == j.end() || !eps->is_array() || eps->empty() || eps->size() > HIXL_CS_MAX_ENDPOINTS) {
    return bad("eps must list 1.." + std::to_string(HIXL_CS_MAX_ENDPOINTS) + " endpoints");
  }
  if (mems == j.end() || !mems->is_array() || mems->size() > HIXL_CS_MAX_MEMS) {
    return bad("mems must list at most " + std::to_string(HIXL_CS_MAX_MEMS) + " regions");
  }
  ServerInfo info;
  for (const auto& e : *eps) {
    InfoEndpoint ep;
    if (!e.is_object() || !GetStr(e, "p", 8, ep.transport) || !GetStr(e, "a", 63, ep.addr) ||
        !GetStr(e, "e", 79, ep.engine)) {
      return bad("an endpoint lacks p, a or e");
    }
    if (ep.transport != "shm" && ep.transport != "tcp" && ep.transport != "ucx") {
      return bad("unknown transport \"" + ep.transport + "\"");
    }
    if (!IsIp(ep.addr) || !IsEngineAddress(ep.engine)) {
      return bad("an endpoint address is not ip / ip:port");
    }
    net::HostPort engine_at, addr_at;
    if (!net::ParseHostPort(ep.engine, engine_at).ok() ||
        !net::ParseHostPort(ep.addr, addr_at).ok() || engine_at.host != addr_at.host) {
      return bad("endpoint " + ep.addr + " names an engine on another address (" + ep.engine + ")");
    }
    info.endpoints.push_back(std::move(ep));
  }
  std::set<std::string> tags;
  for (const auto& m : *mems) {
    InfoMem mem;
    if (!m.is_object() || !GetStr(m, "t", HIXL_CS_MAX_TAG_LEN, mem.tag) ||
        !GetU64(m, "a", mem.addr) || !GetU64(m, "n", mem.size)) {
      return bad("a region lacks t, a or n");
    }
    std::string tag;
    if (!CheckTag(mem.tag.c_str(), tag).ok() || tag.size() != mem.tag.size()) {
      return bad("a tag is not printable ASCII");
    }
    if (mem.addr == 0 || mem.size == 0 || mem.addr + mem.size < mem.addr) {
      return bad("region \"" + mem.tag + "\" has an empty or wrapping range");
    }
    if (!tags.insert(mem.tag).second) return bad("tag \"" + mem.tag + "\" appears twice");
    info.mems.push_back(std::move(mem));
  }
  std::vector<const InfoMem*> by_addr;
  for (const auto& m : info.mems) by_addr.push_back(&m);
  std::sort(by_addr.begin(), by_addr.end(),
            [](const InfoMem* a, const InfoMem* b) { return a->addr < b->addr; });
  for (size_t i = 1; i < by_addr.size(); ++i) {
    if (by_addr[i - 1]->addr + by_addr[i - 1]->size > by_addr[i]->addr) {
      return bad("regions \"" + by_addr[i - 1]->tag + "\" and \"" + by_addr[i]->tag + "\" overlap");
    }
  }
  out = std::move(info);
  return Status::Ok();
}

}  // namespace hixl::cs
