#include "discovery/entry.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/net.h"
#include "discovery/etcd_json.h"

namespace hixl::discovery {

using nlohmann::json;

Status CheckEngineName(const std::string& name) {
  if (name.empty() || name.size() > kMaxEngineNameLen) {
    return Status::ParamInvalid("engine name must be 1.." + std::to_string(kMaxEngineNameLen) +
                                " characters (got " + std::to_string(name.size()) + ")");
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) {
      return Status::ParamInvalid("engine name '" + name.substr(0, kMaxEngineNameLen) +
                                  "': only A-Z a-z 0-9 . _ : - are allowed");
    }
  }
  return Status::Ok();
}

namespace {

Status CheckAddress(const std::string& a) {
  net::HostPort hp;
  if (a.empty() || a.size() > 64 || !net::ParseHostPort(a, hp).ok() || hp.port <= 0) {
    return Status::ParamInvalid("address '" + a.substr(0, 64) +
                                "' is not ip:port (or [v6]:port) with a port 1..65535");
  }
  return Status::Ok();
}

}  // namespace

Status CheckEntry(const EngineEntry& e) {
  Status s = CheckEngineName(e.name);
  if (!s.ok()) return s;
  s = CheckAddress(e.address);
  if (!s.ok()) return s;
  if (e.generation == 0) return Status::ParamInvalid("entry generation must not be 0");
  if (e.pid <= 0) return Status::ParamInvalid("entry pid must be > 0");
  if (e.host_id.empty() || e.host_id.size() > kMaxHostIdLen) {
    return Status::ParamInvalid("entry host_id must be 1.." + std::to_string(kMaxHostIdLen) +
                                " bytes");
  }
  if (!std::all_of(e.host_id.begin(), e.host_id.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) {
    return Status::ParamInvalid("entry host_id must be printable ASCII");
  }
  return Status::Ok();
}

std::string EncodeEntry(const EngineEntry& e) {
  json j = {{"v", kEntryVersion},          {"name", e.name},       {"address", e.address},
            {"generation", e.generation}, {"host_id", e.host_id}, {"pid", e.pid}};
  return j.dump();
}

Status DecodeEntry(const std::string& key_name, const std::string& value, EngineEntry& out) {
  auto bad = [&](const std::string& why) {
    return Status::ParamInvalid("registry entry '" + key_name.substr(0, kMaxEngineNameLen) +
                                "': " + why);
  };
  if (value.size() > kMaxEntryValueBytes) {
    return bad("value larger than " + std::to_string(kMaxEntryValueBytes) + " bytes");
  }
  json j;
  std::string why;
  if (!etcdjson::ParseObject(value, j, why)) return bad(why);
  auto v = j.find("v");
  if (v == j.end() || !v->is_number_integer() || v->get<int64_t>() != kEntryVersion) {
    return bad("not a version " + std::to_string(kEntryVersion) + " hixl entry");
  }
  auto str = [&](const char* f, std::string& dst) {
    auto it = j.find(f);
    if (it == j.end() || !it->is_string()) return false;
    dst = it->get<std::string>();
    return true;
  };
  EngineEntry e;
  if (!str("name", e.name)) return bad("'name' missing or not a string");
  if (!str("address", e.address)) return bad("'address' missing or not a string");
  if (!str("host_id", e.host_id)) return bad("'host_id' missing or not a string");
  auto g = j.find("generation");
  if (g == j.end() || !g->is_number_unsigned()) return bad("'generation' missing or not a uint64");
  e.generation = g->get<uint64_t>();
  auto p = j.find("pid");
  if (p == j.end() || !p->is_number_integer() ||
      (p->is_number_unsigned() &&
       p->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    return bad("'pid' missing or not an integer");
  }
  e.pid = p->get<int64_t>();
  if (e.name != key_name) return bad("its name '" + e.name.substr(0, 128) + "' differs from the key's");
  Status s = CheckEntry(e);
  if (!s.ok()) return bad(s.message());
  out = std::move(e);
  return Status::Ok();
}

}  // namespace hixl::discovery
