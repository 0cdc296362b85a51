#include "engine/options.h"

#include "auth/auth.h"
#include "transport/transport.h"
#ifdef HIXL_HAVE_ETCD
#include "discovery/entry.h"
#include "discovery/etcd_client.h"
#endif

#include <cstdint>
#include <functional>
#include <string_view>

namespace hixl::engine {
namespace {

bool ParseInt(const std::string& s, int64_t lo, int64_t hi, int64_t& out) {
  if (s.empty() || s.size() > 12) return false;
  size_t i = (s[0] == '-') ? 1 : 0;
  if (i == s.size()) return false;
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  if (s[0] == '-') v = -v;
  if (v < lo || v > hi) return false;
  out = v;
  return true;
}

// One option: an integer in [lo, hi] (a flag is 0..1) stored by `set`, or,
// with a custom parser, anything else.
struct Spec {
  const char* key;
  int64_t lo, hi;
  const char* expect;  // what the error message says a value must be
  std::function<void(Options&, int64_t)> set;
  std::function<Status(Options&, const std::string&)> parse = nullptr;
};

Status ParseLinkType(Options& o, const std::string& value) {
  if (value == "AUTO") {
    o.link = LinkType::AUTO;
  } else if (value == "SHM" || value == "HCCS") {
    o.link = LinkType::SHM;
  } else if (value == "TCP") {
    o.link = LinkType::TCP;
  } else if (value == "UCX" || value == "RDMA") {
#ifdef HIXL_HAVE_UCX
    o.link = LinkType::UCX;
    return Status::Ok();
#endif
    return Status::Unsupported(std::string("option ") + options::kLinkType + "='" + value +
                               "': this build has no such transport (available: AUTO, SHM, TCP)");
  } else {
    return Status::ParamInvalid(std::string("option ") + options::kLinkType + "='" + value +
                                "': expected AUTO, SHM, HCCS, TCP, UCX or RDMA");
  }
  return Status::Ok();
}

// The secret's own value never appears in an error message.
Status ParseAuthSecret(Options& o, const std::string& value) {
  if (Status s = auth::CheckSecret(value, options::kAuthSecret); !s.ok()) return s;
  o.auth_secret = value;
  return Status::Ok();
}

Status ParseAuthSecretFile(Options& o, const std::string& value) {
  return auth::ReadSecretFile(value, o.auth_secret);
}

Status ParseMetadataServer(Options& o, const std::string& value) {
#ifdef HIXL_HAVE_ETCD
  std::vector<discovery::EtcdEndpoint> eps;
  if (Status s = discovery::ParseEtcdEndpoints(value, eps); !s.ok()) {
    return Status::ParamInvalid(std::string("option ") + options::kMetadataServer + ": " +
                                s.message());
  }
  o.metadata_server = value;
  return Status::Ok();
#else
  (void)o;
  (void)value;
  return Status::Unsupported(std::string("option ") + options::kMetadataServer +
                             ": this build has no etcd discovery (HIXL_WITH_ETCD)");
#endif
}

Status ParseMetadataPrefix(Options& o, const std::string& value) {
  bool ok = !value.empty() && value.size() <= 200;
  for (char c : value) ok = ok && c > 0x20 && c < 0x7f;
  if (!ok) {
    return Status::ParamInvalid(std::string("option ") + options::kMetadataPrefix +
                                ": expected 1..200 printable ASCII characters without spaces");
  }
  o.metadata_prefix = value;
  return Status::Ok();
}

Status ParseEngineName(Options& o, const std::string& value) {
  bool ok = !value.empty() && value.size() <= 128;
  for (char c : value) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == ':' || c == '-');
  }
  if (!ok) {
    return Status::ParamInvalid(std::string("option ") + options::kEngineName + "='" +
                                value.substr(0, 140) + "': expected 1..128 of [A-Za-z0-9._:-]");
  }
  o.engine_name = value;
  return Status::Ok();
}

template <typename T>
std::function<void(Options&, int64_t)> Field(T Options::*field) {
  return [field](Options& o, int64_t v) { o.*field = static_cast<T>(v); };
}

const std::vector<Spec>& Specs() {
  static const std::vector<Spec> specs = {
      {options::kLinkType, 0, 0, "AUTO, SHM, HCCS, TCP, UCX or RDMA", nullptr, ParseLinkType},
      {options::kCopyThreads, 1, 64, "an integer 1..64", Field(&Options::copy_threads)},
      {options::kPollSpinUs, 0, 1000, "microseconds 0..1000", Field(&Options::poll_spin_us)},
      {options::kEnableUseFabricMem, 0, 1, "0 or 1", Field(&Options::fabric_mem)},
      {options::kDeregisterTimeoutMs, 1, 3600000, "milliseconds 1..3600000",
       Field(&Options::dereg_timeout_ms)},
      {options::kHandshakeTimeoutMs, 1, 3600000, "milliseconds 1..3600000",
       Field(&Options::handshake_timeout_ms)},
      {options::kHeartbeatIntervalMs, 10, 600000, "milliseconds 10..600000",
       Field(&Options::hb_interval_ms)},
      {options::kHeartbeatMisses, 1, 1000, "an integer 1..1000", Field(&Options::hb_misses)},
      {options::kAutoConnect, 0, 1, "0 or 1", Field(&Options::auto_connect)},
      {options::kConnectTimeoutMs, 1, 3600000, "milliseconds 1..3600000",
       Field(&Options::connect_timeout_ms)},
      {options::kMaxPeers, 0, 1000000, "an integer 0..1000000", Field(&Options::max_peers)},
      {options::kPeersLowWater, 0, 1000000, "an integer 0..1000000", Field(&Options::low_water)},
      {options::kNotifyQueueDepth, 1, 1 << 20, "an integer 1..1048576",
       Field(&Options::notify_depth)},
      {options::kAuthSecret, 0, 0, "a secret of 16..4096 bytes", nullptr, ParseAuthSecret},
      {options::kAuthSecretFile, 0, 0, "a file holding the secret", nullptr, ParseAuthSecretFile},
      {options::kAuthRequired, 0, 1, "0 or 1", Field(&Options::auth_required)},
      {options::kMetadataServer, 0, 0, "etcd://host:port[,host:port...]", nullptr,
       ParseMetadataServer},
      {options::kMetadataPrefix, 0, 0, "a key prefix", nullptr, ParseMetadataPrefix},
      {options::kEngineName, 0, 0, "a name of [A-Za-z0-9._:-]", nullptr, ParseEngineName},
      {options::kMetadataTtlS, 2, 3600, "seconds 2..3600", Field(&Options::metadata_ttl_s)},
  };
  return specs;
}

}  // namespace

const std::vector<std::string>& OptionKeys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& s : Specs()) k.emplace_back(s.key);
    for (const auto& t : transport::TransportRegistry::Global().Options()) k.emplace_back(t.key);
    return k;
  }();
  return keys;
}

namespace {
// A transport's own option: fills o.transport_settings; false when key is
// no transport's.
bool ParseTransportOption(const std::string& key, const std::string& value, Options& o,
                          Status& st) {
  for (const auto& t : transport::TransportRegistry::Global().Options()) {
    if (key != t.key) continue;
    int64_t v = 0;
    if (!t.choices.empty()) {
      bool found = false;
      for (size_t i = 0; i < t.choices.size(); ++i) {
        if (value == t.choices[i]) {
          v = static_cast<int64_t>(i);
          found = true;
        }
      }
      if (!found) {
        st = Status::ParamInvalid("option " + key + "='" + value + "': expected " + t.expect);
        return true;
      }
    } else if (!ParseInt(value, t.lo, t.hi, v)) {
      st = Status::ParamInvalid("option " + key + "='" + value + "': expected " + t.expect);
      return true;
    }
    o.transport_settings[key] = v;
    st = Status::Ok();
    return true;
  }
  return false;
}
}  // namespace

Status ParseOptions(const std::map<std::string, std::string>& in, Options& out) {
  Options o;
  for (const auto& t : transport::TransportRegistry::Global().Options()) {
    o.transport_settings[t.key] = t.def;
  }
  if (in.count(options::kAuthSecret) != 0 && in.count(options::kAuthSecretFile) != 0) {
    return Status::ParamInvalid(std::string("options ") + options::kAuthSecret + " and " +
                                options::kAuthSecretFile + " exclude each other: give one");
  }
  for (const auto& [key, value] : in) {
    const Spec* spec = nullptr;
    for (const auto& s : Specs()) {
      if (key == s.key) spec = &s;
    }
    if (spec == nullptr) {
      Status st;
      if (ParseTransportOption(key, value, o, st)) {
        if (!st.ok()) return st;
        continue;
      }
      return Status::ParamInvalid("unknown option '" + key + "'");
    }
    if (spec->parse) {
      if (Status s = spec->parse(o, value); !s.ok()) return s;
      continue;
    }
    int64_t v = 0;
    if (!ParseInt(value, spec->lo, spec->hi, v)) {
      return Status::ParamInvalid("option " + key + "='" + value + "': expected " + spec->expect);
    }
    spec->set(o, v);
  }
  if (in.count(options::kAuthRequired) == 0) {
    o.auth_required = !o.auth_secret.empty();
  } else if (o.auth_required && o.auth_secret.empty()) {
    return Status::ParamInvalid(std::string("option ") + options::kAuthRequired + "=1 needs " +
                                options::kAuthSecret + " or " + options::kAuthSecretFile);
  }
  for (const char* k : {options::kMetadataPrefix, options::kEngineName, options::kMetadataTtlS}) {
    if (in.count(k) != 0 && o.metadata_server.empty()) {
      return Status::ParamInvalid(std::string("option ") + k + " needs " +
                                  options::kMetadataServer);
    }
  }
  const bool low_water_set = in.count(options::kPeersLowWater) != 0;
  if (low_water_set && o.max_peers == 0) {
    return Status::ParamInvalid(std::string("option ") + options::kPeersLowWater + " needs " +
                                options::kMaxPeers);
  }
  if (o.max_peers > 0) {
    if (!low_water_set) o.low_water = o.max_peers * 3 / 4;
    if (o.low_water >= o.max_peers) {
      return Status::ParamInvalid(std::string("option ") + options::kPeersLowWater +
                                  " must be below " + options::kMaxPeers);
    }
  }
  out = o;
  return Status::Ok();
}

}  // namespace hixl::engine
