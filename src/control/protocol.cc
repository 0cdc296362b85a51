#include "control/protocol.h"

#include "hixl/hixl.h"

namespace hixl::control {
namespace {

wire::Msg EncodeRegions(const std::vector<RegionDesc>& regions) {
  wire::Msg arr = wire::Msg::array();
  for (const auto& r : regions) {
    wire::Msg e = {
        {"id", r.id}, {"addr", r.addr}, {"len", r.len}, {"perm", r.perms}, {"fd", r.shareable}};
    if (r.device) e["dev"] = true;
    if (r.tp.is_object() && !r.tp.empty()) e["tp"] = r.tp;
    arr.push_back(std::move(e));
  }
  return arr;
}

Status DecodeRegions(const wire::Msg& m, std::vector<RegionDesc>& out) {
  const wire::Msg* arr = wire::GetArray(m, "regions", kMaxRegionsPerMessage);
  if (arr == nullptr) return Status::ParamInvalid("regions: missing or too many");
  std::vector<RegionDesc> v;
  v.reserve(arr->size());
  for (const auto& e : *arr) {
    RegionDesc r;
    if (!e.is_object() || !wire::GetU64(e, "id", r.id) || !wire::GetU64(e, "addr", r.addr) ||
        !wire::GetU64(e, "len", r.len) || !wire::GetU32(e, "perm", r.perms) ||
        !wire::GetBool(e, "fd", r.shareable)) {
      return Status::ParamInvalid("malformed region entry");
    }
    if (r.id == 0 || r.addr == 0 || r.len == 0 || r.addr + r.len < r.addr ||
        (r.perms & ~static_cast<uint32_t>(MEM_PERM_READ_WRITE)) != 0) {
      return Status::ParamInvalid("region entry " + std::to_string(r.id) + " out of range");
    }
    if (auto it = e.find("dev"); it != e.end()) {
      if (!it->is_boolean()) {
        return Status::ParamInvalid("region entry " + std::to_string(r.id) + ": malformed dev");
      }
      r.device = it->get<bool>();
    }
    if (auto it = e.find("tp"); it != e.end()) {
      if (!it->is_object() || it->size() > kMaxRegionTransports) {
        return Status::ParamInvalid("region entry " + std::to_string(r.id) +
                                    ": malformed transport section");
      }
      r.tp = *it;
    }
    v.push_back(r);
  }
  out = std::move(v);
  return Status::Ok();
}

Status DecodeIdentity(const wire::Msg& m, uint32_t& version, std::string& engine, uint64_t& gen,
                      std::string& host, int64_t& pid) {
  if (!wire::GetU32(m, "v", version)) return Status::ParamInvalid("missing protocol version");
  if (version != kProtocolVersion) {
    return Status::Unsupported("protocol version " + std::to_string(version) +
                               " (this build speaks " + std::to_string(kProtocolVersion) + ")");
  }
  if (!wire::GetStr(m, "engine", engine, kMaxEngineName) || !wire::GetU64(m, "gen", gen) ||
      gen == 0 || !wire::GetStr(m, "host", host, 512) || !wire::GetI64(m, "pid", pid) || pid <= 0) {
    return Status::ParamInvalid("malformed engine identity");
  }
  return Status::Ok();
}

}  // namespace

std::string TypeOf(const wire::Msg& m) {
  std::string t;
  wire::GetStr(m, "t", t, 32);
  return t;
}

wire::Msg EncodeHello(const Hello& h) {
  wire::Msg m = {{"t", "hello"},   {"v", h.version}, {"engine", h.engine}, {"gen", h.generation},
                 {"host", h.host}, {"pid", h.pid},   {"hb", h.hb_ms}};
  if (h.has_auth) m["auth"] = auth::Hex(h.cn.data(), h.cn.size());
  if (h.link != LinkType::AUTO) m["lt"] = static_cast<uint32_t>(h.link);
  return m;
}

namespace {
// A fixed-size binary field carried as hex.
template <size_t N>
bool GetHex(const wire::Msg& m, const char* key, std::array<uint8_t, N>& out) {
  std::string s;
  return wire::GetStr(m, key, s, 2 * N) && auth::FromHex(s, out.data(), N);
}
}  // namespace

wire::Msg EncodeChallenge(const Challenge& c) {
  return {{"t", "challenge"},
          {"sn", auth::Hex(c.sn.data(), c.sn.size())},
          {"proof", auth::Hex(c.proof.data(), c.proof.size())}};
}

Status DecodeChallenge(const wire::Msg& m, Challenge& out) {
  if (TypeOf(m) != "challenge") return Status::ParamInvalid("expected challenge");
  Challenge c;
  if (!GetHex(m, "sn", c.sn) || !GetHex(m, "proof", c.proof)) {
    return Status::ParamInvalid("malformed challenge");
  }
  out = c;
  return Status::Ok();
}

wire::Msg EncodeAuth(const auth::Tag& proof) {
  return {{"t", "auth"}, {"proof", auth::Hex(proof.data(), proof.size())}};
}

Status DecodeAuth(const wire::Msg& m, auth::Tag& out) {
  if (TypeOf(m) != "auth") return Status::ParamInvalid("expected auth");
  if (!GetHex(m, "proof", out)) return Status::ParamInvalid("malformed auth answer");
  return Status::Ok();
}

namespace {
// The optional heartbeat interval; absent means the default.
Status DecodeHeartbeatMs(const wire::Msg& m, uint32_t& out) {
  out = kDefaultHeartbeatMs;
  if (m.find("hb") == m.end()) return Status::Ok();
  uint32_t v = 0;
  if (!wire::GetU32(m, "hb", v) || v < kMinHeartbeatMs || v > kMaxHeartbeatMs) {
    return Status::ParamInvalid("malformed heartbeat interval");
  }
  out = v;
  return Status::Ok();
}
}  // namespace

Status DecodeHello(const wire::Msg& m, Hello& out) {
  if (TypeOf(m) != "hello") return Status::ParamInvalid("expected hello");
  Hello h;
  if (Status s = DecodeIdentity(m, h.version, h.engine, h.generation, h.host, h.pid); !s.ok()) {
    return s;
  }
  if (Status s = DecodeHeartbeatMs(m, h.hb_ms); !s.ok()) return s;
  if (m.contains("auth")) {
    if (!GetHex(m, "auth", h.cn)) return Status::ParamInvalid("malformed auth nonce");
    h.has_auth = true;
  }
  if (m.contains("lt")) {
    uint32_t lt = 0;
    if (!wire::GetU32(m, "lt", lt) || lt > static_cast<uint32_t>(LinkType::UCX)) {
      return Status::ParamInvalid("malformed link type");
    }
    h.link = static_cast<LinkType>(lt);
  }
  out = std::move(h);
  return Status::Ok();
}

wire::Msg EncodeWelcome(const Welcome& w) {
  wire::Msg m = {{"t", "welcome"},     {"v", w.version},
                 {"engine", w.engine}, {"gen", w.generation},
                 {"host", w.host},     {"pid", w.pid},
                 {"hb", w.hb_ms},      {"regions", EncodeRegions(w.regions)},
                 {"tp", w.transports}};
  if (!w.info.empty()) m["info"] = w.info;
  return m;
}

Status DecodeWelcome(const wire::Msg& m, Welcome& out) {
  if (TypeOf(m) != "welcome") return Status::ParamInvalid("expected welcome");
  Welcome w;
  if (Status s = DecodeIdentity(m, w.version, w.engine, w.generation, w.host, w.pid); !s.ok()) {
    return s;
  }
  if (Status s = DecodeHeartbeatMs(m, w.hb_ms); !s.ok()) return s;
  if (Status s = DecodeRegions(m, w.regions); !s.ok()) return s;
  auto tp = m.find("tp");
  if (tp == m.end() || !tp->is_object() || tp->size() > 16) {
    return Status::ParamInvalid("malformed transport table");
  }
  w.transports = *tp;
  if (m.contains("info") && !wire::GetStr(m, "info", w.info, kMaxLocalInfo)) {
    return Status::ParamInvalid("malformed info: not a string of at most 128 KiB");
  }
  out = std::move(w);
  return Status::Ok();
}

wire::Msg EncodeReject(const std::string& reason) { return {{"t", "reject"}, {"reason", reason}}; }

std::string DecodeRejectReason(const wire::Msg& m) {
  std::string r;
  if (!wire::GetStr(m, "reason", r, 1024)) r = "(no reason given)";
  return r;
}

wire::Msg EncodeRegionAdd(const std::vector<RegionDesc>& regions) {
  return {{"t", "radd"}, {"regions", EncodeRegions(regions)}};
}

Status DecodeRegionAdd(const wire::Msg& m, std::vector<RegionDesc>& out) {
  return DecodeRegions(m, out);
}

wire::Msg EncodeRegionDel(uint64_t seq, const std::vector<uint64_t>& ids) {
  return {{"t", "rdel"}, {"seq", seq}, {"ids", ids}};
}

Status DecodeRegionDel(const wire::Msg& m, uint64_t& seq, std::vector<uint64_t>& ids) {
  const wire::Msg* arr = wire::GetArray(m, "ids", kMaxRegionsPerMessage);
  if (!wire::GetU64(m, "seq", seq) || arr == nullptr) return Status::ParamInvalid("malformed rdel");
  std::vector<uint64_t> v;
  for (const auto& e : *arr) {
    if (!e.is_number_unsigned()) return Status::ParamInvalid("malformed rdel id");
    v.push_back(e.get<uint64_t>());
  }
  ids = std::move(v);
  return Status::Ok();
}

wire::Msg EncodeRegionDelAck(uint64_t seq) { return {{"t", "rdel_ack"}, {"seq", seq}}; }

Status DecodeRegionDelAck(const wire::Msg& m, uint64_t& seq) {
  if (!wire::GetU64(m, "seq", seq)) return Status::ParamInvalid("malformed rdel_ack");
  return Status::Ok();
}

wire::Msg EncodeLaneFence(uint64_t seq) { return {{"t", "lfence"}, {"seq", seq}}; }
wire::Msg EncodeLaneFenced(uint64_t seq) { return {{"t", "lfenced"}, {"seq", seq}}; }
Status DecodeLaneFenceSeq(const wire::Msg& m, uint64_t& seq) {
  if (!wire::GetU64(m, "seq", seq)) return Status::ParamInvalid("malformed lane fence");
  return Status::Ok();
}

namespace {
bool GetBytes(const wire::Msg& m, const char* key, std::string& out, size_t max_len) {
  auto it = m.find(key);
  if (it == m.end() || !it->is_binary() || it->get_binary().size() > max_len) return false;
  const auto& b = it->get_binary();
  out.assign(b.begin(), b.end());
  return true;
}
wire::Msg Bytes(const std::string& s) {
  return wire::Msg::binary(std::vector<uint8_t>(s.begin(), s.end()));
}
}  // namespace

wire::Msg EncodeNotify(uint64_t seq, const std::string& name, const std::string& msg) {
  return {{"t", "notify"}, {"seq", seq}, {"n", Bytes(name)}, {"m", Bytes(msg)}};
}

Status DecodeNotify(const wire::Msg& m, uint64_t& seq, std::string& name, std::string& msg) {
  if (!wire::GetU64(m, "seq", seq) || !GetBytes(m, "n", name, kMaxNotifyField) ||
      !GetBytes(m, "m", msg, kMaxNotifyField)) {
    return Status::ParamInvalid("malformed notify");
  }
  return Status::Ok();
}

wire::Msg EncodeNotifyAck(uint64_t seq, uint32_t code, const std::string& why) {
  return {{"t", "nack"}, {"seq", seq}, {"code", code}, {"why", why}};
}

Status DecodeNotifyAck(const wire::Msg& m, uint64_t& seq, uint32_t& code, std::string& why) {
  if (!wire::GetU64(m, "seq", seq) || !wire::GetU32(m, "code", code) || code > 64 ||
      !wire::GetStr(m, "why", why, 1024)) {
    return Status::ParamInvalid("malformed nack");
  }
  return Status::Ok();
}

wire::Msg EncodeProbe() { return {{"t", "probe"}, {"v", kProtocolVersion}}; }

wire::Msg EncodeIdent(const Ident& id) {
  return {{"t", "ident"}, {"v", id.version}, {"engine", id.engine}, {"gen", id.generation}};
}

Status DecodeIdent(const wire::Msg& m, Ident& out) {
  if (TypeOf(m) != "ident") return Status::ParamInvalid("expected ident, got '" + TypeOf(m) + "'");
  Ident id;
  if (!wire::GetU32(m, "v", id.version)) return Status::ParamInvalid("missing protocol version");
  if (id.version != kProtocolVersion) {
    return Status::Unsupported("protocol version " + std::to_string(id.version) +
                               " (this build speaks " + std::to_string(kProtocolVersion) + ")");
  }
  if (!wire::GetStr(m, "engine", id.engine, kMaxEngineName) ||
      !wire::GetU64(m, "gen", id.generation) || id.generation == 0) {
    return Status::ParamInvalid("malformed engine identity");
  }
  out = std::move(id);
  return Status::Ok();
}

wire::Msg EncodeHeartbeat() { return {{"t", "hb"}}; }

wire::Msg EncodeBye() { return {{"t", "bye"}}; }

}  // namespace hixl::control
