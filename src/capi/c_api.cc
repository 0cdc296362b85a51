// The C API (hixl/hixl_c.h): a thin wrapper over hixl::Hixl.
//
// Every handle handed to the caller is recorded in one table of live handles
// (capi/handles.h: pointer -> kind, object); every entry point looks its handles up there
// before touching them, so NULL, foreign and already destroyed handles are
// reported as HIXL_PARAM_INVALID and never dereferenced.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "capi/capi_util.h"
#include "capi/handles.h"
#include "capi/last_error.h"
#include "capi/mem_handle_string.h"
#include "common/net.h"
#include "engine/options.h"
#include "hixl/hixl.h"

static_assert(HIXL_SUCCESS == static_cast<int>(hixl::StatusCode::kSuccess));
static_assert(HIXL_PARAM_INVALID == static_cast<int>(hixl::StatusCode::kParamInvalid));
static_assert(HIXL_TIMEOUT == static_cast<int>(hixl::StatusCode::kTimeout));
static_assert(HIXL_NOT_CONNECTED == static_cast<int>(hixl::StatusCode::kNotConnected));
static_assert(HIXL_ALREADY_CONNECTED == static_cast<int>(hixl::StatusCode::kAlreadyConnected));
static_assert(HIXL_NOTIFY_FAILED == static_cast<int>(hixl::StatusCode::kNotifyFailed));
static_assert(HIXL_UNSUPPORTED == static_cast<int>(hixl::StatusCode::kUnsupported));
static_assert(HIXL_RESOURCE_EXHAUSTED == static_cast<int>(hixl::StatusCode::kResourceExhausted));
static_assert(HIXL_FAILED == static_cast<int>(hixl::StatusCode::kFailed));
static_assert(HIXL_CANCELLED == static_cast<int>(hixl::StatusCode::kCancelled));
static_assert(HIXL_MAX_NOTIFY_LEN == hixl::kMaxNotifyNameLen);
static_assert(HIXL_MAX_NOTIFY_LEN == hixl::kMaxNotifyMsgLen);
static_assert(HIXL_MEM_PERM_READ == hixl::MEM_PERM_READ);
static_assert(HIXL_MEM_PERM_WRITE == hixl::MEM_PERM_WRITE);

namespace hixl::capi {
std::string& LastError() {
  thread_local std::string message;
  return message;
}
}  // namespace hixl::capi

namespace {

using namespace hixl::capi;  // NOLINT: the handle table's vocabulary

std::atomic<uint64_t> g_next_request_id{1};

bool ParseInt64(const std::string& s, int64_t lo, int64_t hi, int64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size() || v < lo || v > hi) return false;
  if (!(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-')) return false;
  out = v;
  return true;
}

bool IsIpLiteral(const std::string& s) {
  if (s.empty() || s.find_first_of("[]") != std::string::npos) return false;
  hixl::net::HostPort hp;
  if (!hixl::net::ParseHostPort(s, hp).ok()) return false;
  return hp.port < 0;
}

std::string JoinHostPort(const std::string& ip, int64_t port) {
  if (ip.find(':') != std::string::npos) return "[" + ip + "]:" + std::to_string(port);
  return ip + ":" + std::to_string(port);
}

// The C++ engine option keys a config (or GLOBAL_RESOURCE_CONFIG) may carry:
// every key Initialize accepts (engine/options.h).
const std::set<std::string>& EngineOptionKeys() {
  static const std::set<std::string> keys(hixl::engine::OptionKeys().begin(),
                                          hixl::engine::OptionKeys().end());
  return keys;
}
static_assert(std::string_view(HIXL_OPTION_CONNECT_TIMEOUT_MS) == hixl::options::kConnectTimeoutMs);
static_assert(std::string_view(HIXL_OPTION_HEARTBEAT_INTERVAL_MS) ==
              hixl::options::kHeartbeatIntervalMs);
static_assert(std::string_view(HIXL_OPTION_HEARTBEAT_MISSES) == hixl::options::kHeartbeatMisses);
static_assert(std::string_view(HIXL_OPTION_MAX_PEERS) == hixl::options::kMaxPeers);
static_assert(std::string_view(HIXL_OPTION_PEERS_LOW_WATER) == hixl::options::kPeersLowWater);
static_assert(std::string_view(HIXL_OPTION_NOTIFY_QUEUE_DEPTH) == hixl::options::kNotifyQueueDepth);
static_assert(std::string_view(HIXL_OPTION_AUTH_SECRET) == hixl::options::kAuthSecret);
static_assert(std::string_view(HIXL_OPTION_AUTH_SECRET_FILE) == hixl::options::kAuthSecretFile);
static_assert(std::string_view(HIXL_OPTION_AUTH_REQUIRED) == hixl::options::kAuthRequired);

// Canonical "ip:port" of an engine address (the engine's own peer key), or
// the string itself when it does not parse.
std::string Canon(const std::string& remote) {
  hixl::net::HostPort hp;
  if (hixl::net::ParseHostPort(remote, hp).ok() && hp.port > 0) return hp.ToString();
  return remote;
}

// True when the engine holds a live link to addr (it drops links whose peer
// closed or stopped answering heartbeats).
bool Linked(HixlEngineObj* e, const std::string& addr) {
  uint64_t generation = 0;
  return e->engine.GetPeerGeneration(addr, generation).ok();
}

bool Known(HixlEngineObj* e, const std::string& addr) {
  std::lock_guard<std::mutex> l(e->mu);
  return e->connected.count(addr) != 0;
}

}  // namespace

namespace hixl::capi {

HixlStatus Fail(HixlStatus code, std::string msg) {
  LastError() = std::move(msg);
  return code;
}
HixlStatus FromCxx(const hixl::Status& s) {
  if (s.ok()) return HIXL_SUCCESS;
  LastError() = s.ToString();
  return static_cast<HixlStatus>(s.code());
}
HixlStatus Invalid(const std::string& what) { return Fail(HIXL_PARAM_INVALID, what); }

// Connects to addr unless a live link exists. A link this layer made that the
// engine has since dropped (the peer went away) is replaced by a new one.
hixl::Status EnsureConnected(HixlEngineObj* e, const std::string& addr) {
  if (Known(e, addr) && Linked(e, addr)) return hixl::Status::Ok();
  std::lock_guard<std::mutex> serial(e->connect_mu);
  if (Known(e, addr)) {
    if (Linked(e, addr)) return hixl::Status::Ok();
    (void)e->engine.Disconnect(addr, 100);  // whatever is left of the dead link
    std::lock_guard<std::mutex> l(e->mu);
    e->connected.erase(addr);
  }
  hixl::Status s = e->engine.Connect(addr, e->connect_timeout_ms);
  if (!s.ok() && s.code() != hixl::StatusCode::kAlreadyConnected) return s;
  std::lock_guard<std::mutex> l(e->mu);
  e->connected.insert(addr);
  return hixl::Status::Ok();
}

void ForgetConnection(HixlEngineObj* e, const std::string& addr) {
  // Drop the stale link so the next Connect makes a fresh one.
  (void)e->engine.Disconnect(addr, 100);
  std::lock_guard<std::mutex> l(e->mu);
  e->connected.erase(addr);
}

RequestImpl* NewRequest(HixlEngineObj* e, hixl::TransferReq cxx, HixlStatus final_status) {
  auto* r = new RequestImpl;
  r->pub.request_id = g_next_request_id.fetch_add(1);
  r->engine = e;
  r->cxx = cxx;
  r->final_status = final_status;
  {
    std::lock_guard<std::mutex> l(e->mu);
    e->requests.insert(r);
  }
  Track(&r->pub, Kind::kRequest, r);
  return r;
}

// Asks the engine about an unfinished request; r->mu held.
void RefreshLocked(RequestImpl* r) {
  if (r->final_status != HIXL_IN_PROGRESS) return;
  if (r->engine == nullptr || r->cxx == 0) {
    r->final_status = HIXL_FAILED;
    r->reason = "FAILED: the request's engine was destroyed before it ended";
    return;
  }
  hixl::TransferStatus st;
  hixl::Status reason;
  hixl::Status s = r->engine->engine.GetTransferStatus(r->cxx, st, reason);
  if (!s.ok()) {
    r->final_status = HIXL_FAILED;
    r->reason = s.ToString();
    return;
  }
  switch (st) {
    case hixl::TransferStatus::WAITING: return;
    case hixl::TransferStatus::COMPLETED: r->final_status = HIXL_SUCCESS; return;
    case hixl::TransferStatus::TIMEOUT:
      r->final_status = HIXL_TIMEOUT;
      r->reason = reason.ok() ? "TIMEOUT: the transfer timed out" : reason.ToString();
      return;
    case hixl::TransferStatus::CANCELLED:
      r->final_status = HIXL_CANCELLED;
      r->reason = reason.ok() ? "CANCELLED: the request was cancelled" : reason.ToString();
      return;
    case hixl::TransferStatus::FAILED:
    default:
      r->final_status = reason.ok() ? HIXL_FAILED : static_cast<HixlStatus>(reason.code());
      r->reason = reason.ok() ? "FAILED: the transfer failed" : reason.ToString();
      return;
  }
}

void DeleteRequest(RequestImpl* r) {
  r->pub.request_id = 0;
  delete r;
}

// Checks a notification's name (NUL-terminated, at most HIXL_MAX_NOTIFY_LEN
// bytes) and message (NULL only with length 0) and builds it.
HixlStatus MakeNotify(const char* name, const void* msg, size_t msg_len, hixl::NotifyDesc& out) {
  if (name == nullptr) return Invalid("notification name is NULL");
  const size_t name_len = strnlen(name, HIXL_MAX_NOTIFY_LEN + 1);
  if (name_len > HIXL_MAX_NOTIFY_LEN) {
    return Invalid("notification name is longer than HIXL_MAX_NOTIFY_LEN (" +
                   std::to_string(HIXL_MAX_NOTIFY_LEN) + ") bytes");
  }
  if (msg == nullptr && msg_len != 0)
    return Invalid("notification message is NULL but its length is not 0");
  if (msg_len > HIXL_MAX_NOTIFY_LEN) {
    return Invalid("notification message is " + std::to_string(msg_len) +
                   " bytes; at most HIXL_MAX_NOTIFY_LEN (" + std::to_string(HIXL_MAX_NOTIFY_LEN) +
                   ")");
  }
  out.name.assign(name, name_len);
  out.notify_msg.assign(static_cast<const char*>(msg), msg_len);  // (nullptr, 0) is fine
  out.from.clear();
  return HIXL_SUCCESS;
}

}  // namespace hixl::capi


extern "C" {

const char* hixlGetErrorString(HixlStatus status) {
  switch (status) {
    case HIXL_SUCCESS: return "SUCCESS";
    case HIXL_PARAM_INVALID: return "PARAM_INVALID: an argument is invalid";
    case HIXL_TIMEOUT: return "TIMEOUT: a deadline passed";
    case HIXL_NOT_CONNECTED: return "NOT_CONNECTED: no link to the peer";
    case HIXL_ALREADY_CONNECTED: return "ALREADY_CONNECTED: the peer is already connected";
    case HIXL_NOTIFY_FAILED: return "NOTIFY_FAILED: a notification could not be delivered";
    case HIXL_UNSUPPORTED: return "UNSUPPORTED: not possible with this build, link or peer";
    case HIXL_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED: a limit was reached";
    case HIXL_FAILED: return "FAILED: the operation failed";
    case HIXL_CANCELLED: return "CANCELLED: the request was cancelled";
    case HIXL_IN_PROGRESS: return "IN_PROGRESS: the request has not finished";
  }
  return "UNKNOWN: not a hixl status code";
}

const char* hixlGetLastErrorMessage(void) { return LastError().c_str(); }

// ---------------------------------------------------------------- config

HixlStatus hixlCreateConfig(HixlConfig* config) {
  if (config == nullptr) return Invalid("config output pointer is NULL");
  auto* c = new HixlConfigObj;
  Track(c, Kind::kConfig, c);
  *config = c;
  return HIXL_SUCCESS;
}

HixlStatus hixlConfigSetString(HixlConfig config, const char* key, const char* value) {
  auto* c = Lookup<HixlConfigObj>(config, Kind::kConfig);
  if (c == nullptr) return Invalid("config is NULL or not a live config handle");
  if (key == nullptr) return Invalid("option key is NULL");
  if (value == nullptr) return Invalid(std::string("value of option ") + key + " is NULL");
  const std::string k = key;
  const std::string v = value;
  auto bad = [&](const std::string& expect) {
    return Invalid("option " + k + "='" + v + "': expected " + expect);
  };
  int64_t n = 0;
  if (k == HIXL_OPTION_LOCAL_IP || k == HIXL_OPTION_REMOTE_IP) {
    if (!IsIpLiteral(v)) return bad("an IPv4 or IPv6 address");
    c->c_opts[k] = v;
  } else if (k == HIXL_OPTION_LOCAL_PORT) {
    if (!ParseInt64(v, 0, 65535, n)) return bad("a port 0..65535");
    c->c_opts[k] = std::to_string(n);
  } else if (k == HIXL_OPTION_REMOTE_PORT) {
    if (!ParseInt64(v, 1, 65535, n)) return bad("a port 1..65535");
    c->c_opts[k] = std::to_string(n);
  } else if (k == HIXL_OPTION_CONNECT_TIMEOUT_MS) {
    // Both this layer's connects and the engine's own (AutoConnect).
    if (!ParseInt64(v, 1, 3600000, n)) return bad("milliseconds 1..3600000");
    c->c_opts[k] = std::to_string(n);
    c->engine_opts[k] = std::to_string(n);
  } else if (k == HIXL_OPTION_TRANSFER_TIMEOUT_MS) {
    if (!ParseInt64(v, 0, INT32_MAX, n)) return bad("milliseconds 0..2147483647 (0: no limit)");
    c->c_opts[k] = std::to_string(n);
  } else if (k == HIXL_OPTION_LINK_TYPE) {
    static const std::set<std::string> kLinks = {"AUTO", "SHM", "TCP", "UCX", "HCCS", "RDMA"};
    if (kLinks.count(v) == 0) return bad("AUTO, SHM, TCP, UCX, HCCS or RDMA");
    c->engine_opts[k] = v;
  } else if (k == HIXL_OPTION_ENABLE_USE_FABRIC_MEM) {
    if (v != "0" && v != "1") return bad("0 or 1");
    c->engine_opts[k] = v;
  } else if (k == HIXL_OPTION_GLOBAL_RESOURCE_CONFIG) {
    nlohmann::json j = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return bad("a JSON object");
    std::map<std::string, std::string> parsed;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (EngineOptionKeys().count(it.key()) == 0) {
        return bad("known engine options only; '" + it.key() + "' is not one");
      }
      const auto& val = it.value();
      if (val.is_string()) {
        parsed[it.key()] = val.get<std::string>();
      } else if (val.is_number_integer()) {
        parsed[it.key()] = std::to_string(val.get<int64_t>());
      } else if (val.is_boolean()) {
        parsed[it.key()].assign(val.get<bool>() ? "1" : "0", 1);
      } else {
        return bad("string, integer or boolean values; '" + it.key() + "' is not");
      }
    }
    auto ct = parsed.find(HIXL_OPTION_CONNECT_TIMEOUT_MS);
    if (ct != parsed.end() && !ParseInt64(ct->second, 1, 3600000, n)) {
      return bad(std::string(HIXL_OPTION_CONNECT_TIMEOUT_MS) + " in milliseconds 1..3600000");
    }
    for (auto& [pk, pv] : parsed) c->engine_opts[pk] = pv;
    if (ct != parsed.end()) c->c_opts[HIXL_OPTION_CONNECT_TIMEOUT_MS] = std::to_string(n);
  } else if (EngineOptionKeys().count(k) != 0) {
    if (v.empty()) return bad("a value");
    c->engine_opts[k] = v;  // checked by hixlCreateEngine (Initialize)
  } else {
    return Invalid("unknown option key '" + k + "'");
  }
  return HIXL_SUCCESS;
}

HixlStatus hixlConfigSetInt(HixlConfig config, const char* key, int64_t value) {
  if (Lookup<HixlConfigObj>(config, Kind::kConfig) == nullptr) {
    return Invalid("config is NULL or not a live config handle");
  }
  if (key == nullptr) return Invalid("option key is NULL");
  const std::string k = key;
  if (k == HIXL_OPTION_LOCAL_IP || k == HIXL_OPTION_REMOTE_IP || k == HIXL_OPTION_LINK_TYPE ||
      k == HIXL_OPTION_GLOBAL_RESOURCE_CONFIG) {
    return Invalid("option " + k + " takes a string (hixlConfigSetString)");
  }
  return hixlConfigSetString(config, key, std::to_string(value).c_str());
}

HixlStatus hixlDestroyConfig(HixlConfig config) {
  if (config == nullptr || !Untrack(config, Kind::kConfig)) {
    return Invalid("config is NULL or not a live config handle");
  }
  delete config;
  return HIXL_SUCCESS;
}

// ---------------------------------------------------------------- engine

HixlStatus hixlCreateEngine(HixlConfig config, HixlEngine* engine) {
  auto* c = Lookup<HixlConfigObj>(config, Kind::kConfig);
  if (c == nullptr) return Invalid("config is NULL or not a live config handle");
  if (engine == nullptr) return Invalid("engine output pointer is NULL");
  auto get = [&](const char* k) {
    auto it = c->c_opts.find(k);
    return it == c->c_opts.end() ? std::string() : it->second;
  };
  std::string ip = get(HIXL_OPTION_LOCAL_IP);
  if (ip.empty()) ip = "127.0.0.1";
  std::string port = get(HIXL_OPTION_LOCAL_PORT);
  std::string local = port.empty() ? ip : JoinHostPort(ip, std::stoll(port));
  std::string rip = get(HIXL_OPTION_REMOTE_IP), rport = get(HIXL_OPTION_REMOTE_PORT);
  if (rip.empty() != rport.empty()) {
    return Invalid("set both " HIXL_OPTION_REMOTE_IP " and " HIXL_OPTION_REMOTE_PORT
                   ", or neither");
  }
  auto e = std::make_unique<HixlEngineObj>();
  if (!get(HIXL_OPTION_CONNECT_TIMEOUT_MS).empty()) {
    e->connect_timeout_ms = static_cast<int32_t>(std::stoll(get(HIXL_OPTION_CONNECT_TIMEOUT_MS)));
  }
  if (!get(HIXL_OPTION_TRANSFER_TIMEOUT_MS).empty()) {
    e->transfer_timeout_ms = static_cast<int32_t>(std::stoll(get(HIXL_OPTION_TRANSFER_TIMEOUT_MS)));
  }
  if (hixl::Status s = e->engine.Initialize(local, c->engine_opts); !s.ok()) return FromCxx(s);
  e->local = e->engine.LocalEngine();
  if (!rip.empty()) {
    e->default_remote = JoinHostPort(rip, std::stoll(rport));
    // Best effort now; a peer that is not up yet is connected on first use.
    (void)EnsureConnected(e.get(), e->default_remote);
  }
  HixlEngineObj* raw = e.release();
  Track(raw, Kind::kEngine, raw);
  *engine = raw;
  return HIXL_SUCCESS;
}

HixlStatus hixlDestroyEngine(HixlEngine engine) {
  if (engine == nullptr || !Untrack(engine, Kind::kEngine)) {
    return Invalid("engine is NULL or not a live engine handle");
  }
  HixlEngineObj* e = engine;
  std::set<RequestImpl*> reqs;
  std::set<HixlMemHandleObj*> handles;
  {
    std::lock_guard<std::mutex> l(e->mu);
    reqs.swap(e->requests);
    handles.swap(e->handles);
  }
  // Learn the end state of requests that ended already, then fail the rest.
  for (RequestImpl* r : reqs) {
    std::lock_guard<std::mutex> l(r->mu);
    RefreshLocked(r);
  }
  e->engine.Finalize();
  for (RequestImpl* r : reqs) {
    std::lock_guard<std::mutex> l(r->mu);
    if (r->final_status == HIXL_IN_PROGRESS) {
      r->final_status = HIXL_FAILED;
      r->reason = "FAILED: the request's engine was destroyed before it ended";
    }
    r->engine = nullptr;
  }
  for (HixlMemHandleObj* m : handles) {
    Untrack(m, Kind::kMem);
    delete m;
  }
  delete e;
  return HIXL_SUCCESS;
}

const char* hixlGetLocalEngine(HixlEngine engine) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) {
    Invalid("engine is NULL or not a live engine handle");
    return nullptr;
  }
  return e->local.c_str();
}

HixlStatus hixlConnect(HixlEngine engine, const char* remote, int32_t timeout_ms) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (remote == nullptr) return Invalid("remote engine address is NULL");
  hixl::Status s = e->engine.Connect(remote, timeout_ms);
  if (s.ok()) {
    std::lock_guard<std::mutex> l(e->mu);
    e->connected.insert(Canon(remote));
  }
  return FromCxx(s);
}

HixlStatus hixlDisconnect(HixlEngine engine, const char* remote, int32_t timeout_ms) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (remote == nullptr) return Invalid("remote engine address is NULL");
  hixl::Status s = e->engine.Disconnect(remote, timeout_ms);
  {
    std::lock_guard<std::mutex> l(e->mu);
    e->connected.erase(Canon(remote));
  }
  return FromCxx(s);
}

// ---------------------------------------------------------------- memory

HixlStatus hixlRegisterMemory(HixlEngine engine, void* addr, size_t size, uint32_t perms,
                              HixlMemHandle* handle) {
  return hixlRegisterMemoryFlags(engine, addr, size, perms, 0, handle);
}

HixlStatus hixlRegisterMemoryFlags(HixlEngine engine, void* addr, size_t size, uint32_t perms,
                                   uint32_t flags, HixlMemHandle* handle) {
  return hixlRegisterMemoryTyped(engine, addr, size, HIXL_MEM_HOST, perms, flags, handle);
}

namespace {
bool ToMemType(uint32_t t, hixl::MemType& out) {
  static_assert(HIXL_MEM_DEVICE == static_cast<uint32_t>(hixl::MemType::MEM_DEVICE));
  static_assert(HIXL_MEM_HOST == static_cast<uint32_t>(hixl::MemType::MEM_HOST));
  if (t != HIXL_MEM_DEVICE && t != HIXL_MEM_HOST) return false;
  out = static_cast<hixl::MemType>(t);
  return true;
}
}  // namespace

HixlStatus hixlRegisterMemoryTyped(HixlEngine engine, void* addr, size_t size, uint32_t mem_type,
                                   uint32_t perms, uint32_t flags, HixlMemHandle* handle) {
  hixl::MemType type;
  if (!ToMemType(mem_type, type)) return Invalid("mem_type must be HIXL_MEM_HOST or HIXL_MEM_DEVICE");
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (addr == nullptr) return Invalid("memory address is NULL");
  if (size == 0) return Invalid("memory size is 0");
  if (reinterpret_cast<uintptr_t>(addr) + size < reinterpret_cast<uintptr_t>(addr)) {
    return Invalid("memory range wraps around");
  }
  if (perms == 0 || (perms & ~(HIXL_MEM_PERM_READ | HIXL_MEM_PERM_WRITE)) != 0) {
    return Invalid("perms must be a non-zero combination of HIXL_MEM_PERM_READ/WRITE");
  }
  if ((flags & ~HIXL_REGISTER_SHARE_BY_MAPPING) != 0) {
    return Invalid("flags must be 0 or HIXL_REGISTER_SHARE_BY_MAPPING");
  }
  if (handle == nullptr) return Invalid("handle output pointer is NULL");
  auto m = std::make_unique<HixlMemHandleObj>();
  m->owner = e;
  m->local = true;
  m->addr = reinterpret_cast<uintptr_t>(addr);
  m->len = size;
  m->perms = perms;
  {
    std::lock_guard<std::mutex> l(e->mu);
    auto it = e->allocs.upper_bound(m->addr);
    if (it != e->allocs.begin()) {
      --it;
      if (m->addr >= it->first && m->addr - it->first < it->second.size &&
          size <= it->second.size - (m->addr - it->first)) {
        if (it->second.mem_type != mem_type) {
          return Invalid(mem_type == HIXL_MEM_DEVICE
                             ? "the memory is host memory from hixlAllocMemory, not device memory"
                             : "the memory is device memory from hixlAllocMemoryTyped "
                               "(HIXL_MEM_DEVICE): register it with that type");
        }
        m->alloc_backed = true;
        if (hixl::Status s = e->engine.GetMemHandle(reinterpret_cast<void*>(it->first), m->cxx);
            !s.ok()) {
          return FromCxx(s);
        }
      }
    }
  }
  if (!m->alloc_backed) {
    static_assert(HIXL_REGISTER_SHARE_BY_MAPPING == hixl::REGISTER_SHARE_BY_MAPPING);
    hixl::Status s = e->engine.RegisterMem({m->addr, size}, type, m->cxx, perms, flags);
    if (!s.ok()) return FromCxx(s);
  }
  hixl::net::HostPort hp;
  if (hixl::net::ParseHostPort(e->local, hp).ok() && hp.port > 0) {
    m->engine_addr = e->local;
    m->generation = e->engine.Generation();
    m->serialized = hixl::capi::SerializeMemHandle({m->engine_addr, m->generation, m->addr, m->len, m->perms});
  }
  HixlMemHandleObj* raw = m.release();
  {
    std::lock_guard<std::mutex> l(e->mu);
    e->handles.insert(raw);
    if (!raw->alloc_backed) e->registrations[raw->cxx]++;
  }
  Track(raw, Kind::kMem, raw);
  *handle = raw;
  return HIXL_SUCCESS;
}

HixlStatus hixlUnregisterMemory(HixlEngine engine, HixlMemHandle handle) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  auto* m = Lookup<HixlMemHandleObj>(handle, Kind::kMem);
  if (m == nullptr) return Invalid("memory handle is NULL or not live");
  if (m->owner != e) return Invalid("memory handle belongs to another engine");
  bool deregister = false;
  if (m->local && !m->alloc_backed) {
    std::lock_guard<std::mutex> l(e->mu);
    deregister = e->registrations[m->cxx] == 1;
  }
  if (deregister) {
    // On failure the handle stays live so the caller may retry.
    if (hixl::Status s = e->engine.DeregisterMem(m->cxx); !s.ok()) return FromCxx(s);
  }
  if (!Untrack(m, Kind::kMem)) return Invalid("memory handle is not live");
  {
    std::lock_guard<std::mutex> l(e->mu);
    e->handles.erase(m);
    if (m->local && !m->alloc_backed && --e->registrations[m->cxx] <= 0) {
      e->registrations.erase(m->cxx);
    }
  }
  delete m;
  return HIXL_SUCCESS;
}

HixlStatus hixlAllocMemory(HixlEngine engine, size_t size, void** ptr) {
  return hixlAllocMemoryTyped(engine, size, HIXL_MEM_HOST, ptr);
}

HixlStatus hixlAllocMemoryTyped(HixlEngine engine, size_t size, uint32_t mem_type, void** ptr) {
  hixl::MemType type;
  if (!ToMemType(mem_type, type)) return Invalid("mem_type must be HIXL_MEM_HOST or HIXL_MEM_DEVICE");
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (size == 0) return Invalid("size is 0");
  if (ptr == nullptr) return Invalid("ptr output pointer is NULL");
  void* p = nullptr;
  if (hixl::Status s = e->engine.AllocMem(size, type, &p); !s.ok()) {
    return FromCxx(s);
  }
  {
    std::lock_guard<std::mutex> l(e->mu);
    e->allocs[reinterpret_cast<uintptr_t>(p)] = {size, mem_type};
  }
  *ptr = p;
  return HIXL_SUCCESS;
}

HixlStatus hixlFreeMemory(HixlEngine engine, void* ptr) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (ptr == nullptr) return Invalid("ptr is NULL");
  const auto start = reinterpret_cast<uintptr_t>(ptr);
  size_t size = 0;
  {
    std::lock_guard<std::mutex> l(e->mu);
    auto it = e->allocs.find(start);
    if (it == e->allocs.end())
      return Invalid("ptr was not returned by hixlAllocMemory of this engine");
    size = it->second.size;
  }
  if (hixl::Status s = e->engine.FreeMem(ptr); !s.ok()) return FromCxx(s);
  std::vector<HixlMemHandleObj*> dead;
  {
    std::lock_guard<std::mutex> l(e->mu);
    e->allocs.erase(start);
    // Handles naming parts of this memory die with it.
    for (auto* m : e->handles) {
      if (m->alloc_backed && m->addr >= start && m->addr - start < size) dead.push_back(m);
    }
    for (auto* m : dead) e->handles.erase(m);
  }
  for (auto* m : dead) {
    Untrack(m, Kind::kMem);
    delete m;
  }
  return HIXL_SUCCESS;
}

const char* hixlMemHandleSerialize(HixlMemHandle handle) {
  auto* m = Lookup<HixlMemHandleObj>(handle, Kind::kMem);
  if (m == nullptr) {
    Invalid("memory handle is NULL or not live");
    return nullptr;
  }
  if (m->serialized.empty()) {
    Invalid("the handle's engine is client-only (no LOCAL_PORT): peers cannot reach it");
    return nullptr;
  }
  return m->serialized.c_str();
}

HixlStatus hixlMemHandleDeserialize(HixlEngine engine, const char* str, HixlMemHandle* handle) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (str == nullptr) return Invalid("handle string is NULL");
  if (handle == nullptr) return Invalid("handle output pointer is NULL");
  auto m = std::make_unique<HixlMemHandleObj>();
  hixl::capi::MemHandleFields f;
  if (hixl::Status s = hixl::capi::ParseMemHandle(str, f); !s.ok()) return FromCxx(s);
  m->engine_addr = f.engine_addr;
  m->generation = f.generation;
  m->addr = f.addr;
  m->len = f.len;
  m->perms = f.perms;
  m->owner = e;
  m->serialized = str;
  HixlMemHandleObj* raw = m.release();
  {
    std::lock_guard<std::mutex> l(e->mu);
    e->handles.insert(raw);
  }
  Track(raw, Kind::kMem, raw);
  *handle = raw;
  return HIXL_SUCCESS;
}

size_t hixlMemHandleGetSize(HixlMemHandle handle) {
  auto* m = Lookup<HixlMemHandleObj>(handle, Kind::kMem);
  if (m == nullptr) {
    Invalid("memory handle is NULL or not live");
    return 0;
  }
  return static_cast<size_t>(m->len);
}

const char* hixlMemHandleGetEngine(HixlMemHandle handle) {
  auto* m = Lookup<HixlMemHandleObj>(handle, Kind::kMem);
  if (m == nullptr) {
    Invalid("memory handle is NULL or not live");
    return nullptr;
  }
  if (m->engine_addr.empty()) {
    Invalid("the handle's engine is client-only (no LOCAL_PORT): it has no address peers reach");
    return nullptr;
  }
  return m->engine_addr.c_str();
}

// ---------------------------------------------------------------- notifications

HixlStatus hixlSendNotify(HixlEngine engine, const char* remote, const char* name, const void* msg,
                          size_t msg_len, int32_t timeout_ms) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (remote == nullptr) return Invalid("remote engine address is NULL");
  hixl::net::HostPort hp;
  if (!hixl::net::ParseHostPort(remote, hp).ok() || hp.port <= 0) {
    return Invalid(std::string("remote engine address '") + remote + "' is not \"ip:port\"");
  }
  if (timeout_ms <= 0) return Invalid("timeout_ms must be > 0");
  hixl::NotifyDesc n;
  if (HixlStatus st = MakeNotify(name, msg, msg_len, n); st != HIXL_SUCCESS) return st;
  const std::string to = hp.ToString();
  // No second attempt after a lost link: the notification may have arrived.
  hixl::Status s = EnsureConnected(e, to);
  if (s.ok()) s = e->engine.SendNotify(to, n, timeout_ms);
  return FromCxx(s);
}

HixlStatus hixlGetNotifies(HixlEngine engine, HixlNotify* out, size_t capacity, size_t* count) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (out == nullptr) return Invalid("out is NULL");
  if (capacity == 0) return Invalid("capacity is 0");
  if (count == nullptr) return Invalid("count output pointer is NULL");
  std::lock_guard<std::mutex> l(e->notify_mu);
  if (e->notifies.size() < capacity) {
    // Take what the engine holds only when ours cannot fill out: what waits
    // here no longer counts against the sender's NotifyQueueDepth.
    std::vector<hixl::NotifyDesc> got;
    if (hixl::Status s = e->engine.GetNotifies(got); !s.ok()) return FromCxx(s);
    for (auto& d : got) e->notifies.push_back(std::move(d));
  }
  size_t n = 0;
  while (n < capacity && !e->notifies.empty()) {
    const hixl::NotifyDesc& d = e->notifies.front();
    HixlNotify& o = out[n];
    // Lengths were checked by the sender's and this engine's decoders; clamp anyway.
    o.name_len = std::min<size_t>(d.name.size(), HIXL_MAX_NOTIFY_LEN);
    std::memcpy(o.name, d.name.data(), o.name_len);
    o.name[o.name_len] = '\0';
    o.msg_len = std::min<size_t>(d.notify_msg.size(), HIXL_MAX_NOTIFY_LEN);
    std::memcpy(o.msg, d.notify_msg.data(), o.msg_len);
    o.msg[o.msg_len] = '\0';
    const size_t from_len = std::min(d.from.size(), sizeof(o.from) - 1);
    std::memcpy(o.from, d.from.data(), from_len);
    o.from[from_len] = '\0';
    e->notifies.pop_front();
    ++n;
  }
  *count = n;
  return HIXL_SUCCESS;
}

HixlStatus hixlListEngines(HixlEngine engine, HixlEngineRecord* out, size_t capacity,
                           size_t* count) {
  auto* e = Lookup<HixlEngineObj>(engine, Kind::kEngine);
  if (e == nullptr) return Invalid("engine is NULL or not a live engine handle");
  if (out == nullptr && capacity != 0) return Invalid("out is NULL with a capacity above 0");
  if (count == nullptr) return Invalid("count output pointer is NULL");
  std::vector<hixl::EngineRecord> list;
  if (hixl::Status s = e->engine.ListEngines(list); !s.ok()) return FromCxx(s);
  for (size_t i = 0; i < list.size() && i < capacity; ++i) {
    HixlEngineRecord& o = out[i];
    // Names and addresses were checked when decoded; clamp anyway.
    const size_t nl = std::min(list[i].name.size(), sizeof(o.name) - 1);
    std::memcpy(o.name, list[i].name.data(), nl);
    o.name[nl] = '\0';
    const size_t al = std::min(list[i].address.size(), sizeof(o.address) - 1);
    std::memcpy(o.address, list[i].address.data(), al);
    o.address[al] = '\0';
    o.generation = list[i].generation;
  }
  *count = list.size();
  return HIXL_SUCCESS;
}

HixlStatus hixlDestroyRequest(HixlRequest request) {
  auto* r = Lookup<RequestImpl>(request, Kind::kRequest);
  if (r == nullptr) return Invalid("request is NULL, destroyed or not a request handle");
  // Wait for an unfinished request so the caller may reuse its buffers.
  int64_t sleep_us = 10;
  for (;;) {
    {
      std::lock_guard<std::mutex> l(r->mu);
      if (r->engine != nullptr && Lookup<HixlEngineObj>(r->engine, Kind::kEngine) == nullptr) {
        // The engine is being destroyed right now; it fails the request.
      } else {
        RefreshLocked(r);
        if (r->final_status != HIXL_IN_PROGRESS) break;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min<int64_t>(sleep_us * 2, 1000);
  }
  if (!Untrack(request, Kind::kRequest)) return Invalid("request was destroyed concurrently");
  HixlEngineObj* e = nullptr;
  {
    std::lock_guard<std::mutex> l(r->mu);
    e = r->engine;
  }
  if (e != nullptr) {
    std::lock_guard<std::mutex> l(e->mu);
    e->requests.erase(r);
  }
  DeleteRequest(r);
  return HIXL_SUCCESS;
}

}  // extern "C"
