#include "discovery/etcd_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/net.h"
#include "discovery/etcd_json.h"

namespace hixl::discovery {

using nlohmann::json;

// ---- endpoints, base64, prefixes -----------------------------------------

std::string EtcdEndpoint::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {

bool ParsePortNumber(const std::string& s, int& port) {
  if (s.empty() || s.size() > 5) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < 1 || v > 65535) return false;
  port = v;
  return true;
}

bool IsHostName(const std::string& h) {
  if (h.empty() || h.size() > 253 || h.front() == '-' || h.front() == '.') return false;
  return std::all_of(h.begin(), h.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '.';
  });
}

}  // namespace

Status ParseEtcdEndpoints(const std::string& spec, std::vector<EtcdEndpoint>& out) {
  static constexpr char kScheme[] = "etcd://";
  if (spec.rfind(kScheme, 0) != 0) {
    return Status::ParamInvalid("etcd endpoints '" + spec +
                                "': expected etcd://host:port[,host:port...]");
  }
  std::string rest = spec.substr(sizeof(kScheme) - 1);
  if (rest.empty()) return Status::ParamInvalid("etcd endpoints '" + spec + "': no endpoint");
  std::vector<EtcdEndpoint> eps;
  size_t start = 0;
  while (true) {
    size_t comma = rest.find(',', start);
    std::string item = rest.substr(start, comma == std::string::npos ? std::string::npos
                                                                     : comma - start);
    const std::string where = "etcd endpoints '" + spec + "': endpoint '" + item + "'";
    if (item.empty()) return Status::ParamInvalid(where + " is empty");
    if (eps.size() == kMaxEtcdEndpoints) {
      return Status::ParamInvalid("etcd endpoints '" + spec + "': more than " +
                                  std::to_string(kMaxEtcdEndpoints) + " endpoints");
    }
    EtcdEndpoint ep;
    std::string port;
    if (item.front() == '[') {
      size_t close = item.find(']');
      if (close == std::string::npos || close + 1 >= item.size() || item[close + 1] != ':') {
        return Status::ParamInvalid(where + ": expected [v6]:port");
      }
      ep.host = item.substr(1, close - 1);
      port = item.substr(close + 2);
      net::HostPort hp;
      if (!net::ParseHostPort(ep.host, hp).ok() || hp.host.find(':') == std::string::npos) {
        return Status::ParamInvalid(where + ": not an IPv6 address in brackets");
      }
    } else {
      size_t colon = item.rfind(':');
      if (colon == std::string::npos) return Status::ParamInvalid(where + " has no port");
      ep.host = item.substr(0, colon);
      port = item.substr(colon + 1);
      if (!IsHostName(ep.host)) {
        return Status::ParamInvalid(where + ": bad host (a name, IPv4 or [IPv6])");
      }
    }
    if (!ParsePortNumber(port, ep.port)) {
      return Status::ParamInvalid(where + ": bad port (expected 1..65535)");
    }
    eps.push_back(std::move(ep));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  out = std::move(eps);
  return Status::Ok();
}

static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64Encode(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(in[k])); };
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = b(i) << 16 | b(i + 1) << 8 | b(i + 2);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kB64[(v >> s) & 63]);
  }
  if (in.size() - i == 1) {
    uint32_t v = b(i) << 16;
    out += {kB64[v >> 18 & 63], kB64[v >> 12 & 63], '=', '='};
  } else if (in.size() - i == 2) {
    uint32_t v = b(i) << 16 | b(i + 1) << 8;
    out += {kB64[v >> 18 & 63], kB64[v >> 12 & 63], kB64[v >> 6 & 63], '='};
  }
  return out;
}

bool Base64Decode(const std::string& in, std::string& out) {
  if (in.size() % 4 != 0) return false;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string res;
  res.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int pad = 0;
    if (last && in[i + 3] == '=') pad = in[i + 2] == '=' ? 2 : 1;
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      int d = k >= 4 - pad ? 0 : val(in[i + k]);
      if (d < 0) return false;
      v = v << 6 | static_cast<uint32_t>(d);
    }
    if (pad == 2 && (v & 0xffff) != 0) return false;  // non-canonical trailing bits
    if (pad == 1 && (v & 0xff) != 0) return false;
    res.push_back(static_cast<char>(v >> 16));
    if (pad < 2) res.push_back(static_cast<char>(v >> 8 & 0xff));
    if (pad < 1) res.push_back(static_cast<char>(v & 0xff));
  }
  out = std::move(res);
  return true;
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// ---- HTTP ----------------------------------------------------------------

namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string Int(int64_t v) { return std::to_string(v); }

struct Body {
  std::string data;
  bool too_big = false;
};

size_t CollectBody(char* p, size_t size, size_t n, void* ud) {
  auto* b = static_cast<Body*>(ud);
  size_t len = size * n;
  if (b->data.size() + len > kMaxResponseBytes) {
    b->too_big = true;
    return CURL_WRITEFUNC_ERROR;
  }
  b->data.append(p, len);
  return len;
}

// The gateway's error body: {"error":"..","message":"..","code":N} or, in a
// stream, {"error":{"grpc_code":N,"http_code":N,"message":".."}}.
std::string ErrorText(const json& j) {
  std::string why, msg;
  auto it = j.find("error");
  if (it != j.end() && it->is_object()) {
    json::const_iterator m = it->find("message");
    if (m != it->end() && m->is_string()) msg = m->get<std::string>();
  } else if (!etcdjson::GetString(j, "message", msg, why) || msg.empty()) {
    etcdjson::GetString(j, "error", msg, why);
  }
  if (msg.size() > 512) msg.resize(512);
  return msg.empty() ? "(no message)" : msg;
}

void SetCommon(CURL* h, const std::string& url, curl_slist* headers) {
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 5L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 2L);
}

bool IsConnectFailure(CURL* h, CURLcode rc) {
  if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST) return true;
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    curl_off_t connect_us = 0;
    curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &connect_us);
    return connect_us == 0;  // never connected
  }
  return false;
}

struct Headers {
  Headers() {
    list = curl_slist_append(list, "Content-Type: application/json");
    list = curl_slist_append(list, "Expect:");
  }
  ~Headers() { curl_slist_free_all(list); }
  curl_slist* list = nullptr;
};

}  // namespace

struct EtcdClient::Reply {
  json j;
};

Status EtcdClient::Create(const std::string& endpoints, std::unique_ptr<EtcdClient>* out) {
  std::vector<EtcdEndpoint> eps;
  Status s = ParseEtcdEndpoints(endpoints, eps);
  if (!s.ok()) return s;
  GlobalInit();
  out->reset(new EtcdClient(std::move(eps)));
  return Status::Ok();
}

EtcdClient::~EtcdClient() {
  for (void* h : pool_) curl_easy_cleanup(static_cast<CURL*>(h));
}

Status EtcdClient::Post(const char* path, const std::string& body, int timeout_ms, Reply* reply) {
  if (timeout_ms <= 0) return Status::ParamInvalid("etcd request timeout must be > 0 ms");
  const auto deadline = net::DeadlineAfterMs(timeout_ms);
  CURL* h = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!pool_.empty()) {
      h = static_cast<CURL*>(pool_.back());
      pool_.pop_back();
    }
  }
  if (h == nullptr) h = curl_easy_init();
  if (h == nullptr) return Status::Failed("curl_easy_init failed");
  Headers headers;
  const size_t n = endpoints_.size();
  const size_t first = preferred_.load(std::memory_order_relaxed) % n;
  std::string errors;
  Status result;
  bool done = false;
  for (size_t k = 0; k < n && !done; ++k) {
    const size_t idx = (first + k) % n;
    const EtcdEndpoint& ep = endpoints_[idx];
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - net::Clock::now()).count();
    if (left <= 0) break;
    const int64_t connect_ms = std::max<int64_t>(std::min<int64_t>(left, 100), left / (n - k));
    Body resp;
    std::string url = "http://" + ep.ToString() + path;
    SetCommon(h, url, headers.list);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, CollectBody);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &resp);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(left));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect_ms));
    CURLcode rc = curl_easy_perform(h);
    const std::string where = "etcd at " + ep.ToString() + " (" + path + ")";
    if (rc != CURLE_OK) {
      if (IsConnectFailure(h, rc)) {
        errors += (errors.empty() ? "" : "; ") + ep.ToString() + ": " + curl_easy_strerror(rc);
        continue;  // the next endpoint
      }
      done = true;
      if (resp.too_big) {
        result = Status::Failed(where + ": answer larger than " +
                                std::to_string(kMaxResponseBytes) + " bytes");
      } else if (rc == CURLE_OPERATION_TIMEDOUT) {
        result = Status::Timeout(where + ": no answer within " + std::to_string(timeout_ms) +
                                 " ms");
      } else {
        result = Status::Failed(where + ": " + curl_easy_strerror(rc));
      }
      break;
    }
    done = true;
    preferred_.store(idx, std::memory_order_relaxed);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    json j;
    std::string why;
    const bool parsed = etcdjson::ParseObject(resp.data, j, why);
    if (code != 200) {
      result = Status::Failed(where + ": HTTP " + std::to_string(code) + ": " +
                              (parsed ? ErrorText(j) : "(unreadable error body)"));
    } else if (!parsed) {
      result = Status::Failed(where + ": malformed answer: " + why);
    } else if (j.contains("error")) {
      result = Status::Failed(where + ": " + ErrorText(j));
    } else {
      reply->j = std::move(j);
    }
  }
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_.push_back(h);
  }
  if (done) return result;
  if (errors.empty()) {
    return Status::Timeout("etcd (" + std::string(path) + "): no endpoint answered within " +
                           std::to_string(timeout_ms) + " ms");
  }
  return Status::Failed("etcd unreachable (" + std::string(path) + "): " + errors);
}

// ---- KV ------------------------------------------------------------------

namespace {

Status Malformed(const char* what, const std::string& why) {
  return Status::Failed(std::string("etcd ") + what + ": malformed answer: " + why);
}

}  // namespace

Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease_id,
                       int timeout_ms, int64_t* revision) {
  if (key.empty()) return Status::ParamInvalid("etcd put: empty key");
  json req = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease_id != 0) req["lease"] = Int(lease_id);
  Reply r;
  Status s = Post("/v3/kv/put", req.dump(), timeout_ms, &r);
  if (!s.ok()) return s;
  int64_t rev = 0;
  std::string why;
  if (!etcdjson::HeaderRevision(r.j, rev, why)) return Malformed("put", why);
  if (revision != nullptr) *revision = rev;
  return Status::Ok();
}

Status EtcdClient::CompareAndPut(const std::string& key, const std::string& value, int64_t lease_id,
                                 const char* target, const char* field, const std::string& expect,
                                 int timeout_ms, bool& put, bool& found, KeyValue& current) {
  if (key.empty()) return Status::ParamInvalid("etcd txn: empty key");
  const std::string k = Base64Encode(key);
  json request_put = {{"key", k}, {"value", Base64Encode(value)}};
  if (lease_id != 0) request_put["lease"] = Int(lease_id);
  json req = {
      {"compare",
       json::array({{{"key", k}, {"result", "EQUAL"}, {"target", target}, {field, expect}}})},
      {"success", json::array({{{"request_put", request_put}}})},
      {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
  Reply r;
  Status s = Post("/v3/kv/txn", req.dump(), timeout_ms, &r);
  if (!s.ok()) return s;
  std::string why;
  bool succeeded = false;
  if (!etcdjson::GetBool(r.j, "succeeded", succeeded, why)) return Malformed("txn", why);
  put = succeeded;
  found = false;
  if (succeeded) return Status::Ok();
  // The failure branch: responses[0].response_range.kvs[0], or no kvs.
  auto it = r.j.find("responses");
  if (it == r.j.end() || !it->is_array() || it->size() != 1 || !(*it)[0].is_object()) {
    return Malformed("txn", "no range response");
  }
  bool ok = true;
  const json* rr = etcdjson::GetObject((*it)[0], "response_range", why, ok);
  if (!ok || rr == nullptr) return Malformed("txn", ok ? "no range response" : why);
  auto kvs = rr->find("kvs");
  if (kvs == rr->end() || kvs->is_null()) return Status::Ok();  // the key is absent
  if (!kvs->is_array()) return Malformed("txn", "'kvs' is not an array");
  if (kvs->empty()) return Status::Ok();
  KeyValue kv;
  if (!etcdjson::ParseKeyValue((*kvs)[0], kv, why)) return Malformed("txn", why);
  current = std::move(kv);
  found = true;
  return Status::Ok();
}

Status EtcdClient::PutIfAbsent(const std::string& key, const std::string& value, int64_t lease_id,
                               int timeout_ms, bool& created, KeyValue& existing) {
  bool found = false;
  Status s = CompareAndPut(key, value, lease_id, "CREATE", "create_revision", "0", timeout_ms,
                           created, found, existing);
  // Deleted between the compare and the range: cannot happen in one txn.
  if (s.ok() && !created && !found) return Malformed("txn", "compare failed but the key is absent");
  return s;
}

Status EtcdClient::PutIfUnchanged(const std::string& key, const std::string& value,
                                  int64_t lease_id, int64_t mod_revision, int timeout_ms,
                                  bool& replaced, bool& found, KeyValue& current) {
  if (mod_revision <= 0) return Status::ParamInvalid("etcd txn: mod_revision must be > 0");
  return CompareAndPut(key, value, lease_id, "MOD", "mod_revision", Int(mod_revision), timeout_ms,
                       replaced, found, current);
}

namespace {

Status ParseRange(const json& j, RangeResult& out) {
  std::string why;
  RangeResult res;
  if (!etcdjson::HeaderRevision(j, res.revision, why)) return Malformed("range", why);
  auto kvs = j.find("kvs");
  if (kvs != j.end() && !kvs->is_null()) {
    if (!kvs->is_array()) return Malformed("range", "'kvs' is not an array");
    res.kvs.reserve(kvs->size());
    for (const json& e : *kvs) {
      KeyValue kv;
      if (!etcdjson::ParseKeyValue(e, kv, why)) return Malformed("range", why);
      res.kvs.push_back(std::move(kv));
    }
  }
  out = std::move(res);
  return Status::Ok();
}

}  // namespace

Status EtcdClient::Get(const std::string& key, int timeout_ms, bool& found, KeyValue& out,
                       int64_t* revision) {
  if (key.empty()) return Status::ParamInvalid("etcd get: empty key");
  json req = {{"key", Base64Encode(key)}};
  Reply r;
  Status s = Post("/v3/kv/range", req.dump(), timeout_ms, &r);
  if (!s.ok()) return s;
  RangeResult res;
  s = ParseRange(r.j, res);
  if (!s.ok()) return s;
  if (res.kvs.size() > 1 || (res.kvs.size() == 1 && res.kvs[0].key != key)) {
    return Malformed("range", "answer for another key");
  }
  found = !res.kvs.empty();
  if (found) out = std::move(res.kvs[0]);
  if (revision != nullptr) *revision = res.revision;
  return Status::Ok();
}

Status EtcdClient::Range(const std::string& prefix, int timeout_ms, RangeResult& out) {
  json req = {{"key", Base64Encode(prefix.empty() ? std::string(1, '\0') : prefix)},
              {"range_end", Base64Encode(PrefixRangeEnd(prefix))}};
  Reply r;
  Status s = Post("/v3/kv/range", req.dump(), timeout_ms, &r);
  if (!s.ok()) return s;
  RangeResult res;
  s = ParseRange(r.j, res);
  if (!s.ok()) return s;
  for (const KeyValue& kv : res.kvs) {
    if (kv.key.compare(0, prefix.size(), prefix) != 0) {
      return Malformed("range", "a key outside the prefix");
    }
  }
  out = std::move(res);
  return Status::Ok();
}

Status EtcdClient::Delete(const std::string& key, int timeout_ms, int64_t* deleted) {
  if (key.empty()) return Status::ParamInvalid("etcd delete: empty key");
  json req = {{"key", Base64Encode(key)}};
  Reply r;
  Status s = Post("/v3/kv/deleterange", req.dump(), timeout_ms, &r);
  if (!s.ok()) return s;
  int64_t n = 0;
  std::string why;
  if (!etcdjson::GetInt64(r.j, "deleted", n, why)) return Malformed("deleterange", why);
  if (deleted != nullptr) *deleted = n;
  return Status::Ok();
}

Status EtcdClient::Compact(int64_t revision, int timeout_ms) {
  json req = {{"revision", Int(revision)}, {"physical", true}};
  Reply r;
  return Post("/v3/kv/compaction", req.dump(), timeout_ms, &r);
}

// ---- leases ----------------------------------------------------------------

Status EtcdClient::LeaseGrant(int64_t ttl_s, int timeout_ms, int64_t& id, int64_t& ttl_out) {
  if (ttl_s <= 0) return Status::ParamInvalid("etcd lease TTL must be > 0 s");
  json req = {{"TTL", Int(ttl_s)}, {"ID", "0"}};
  Reply r;
  Status s = Post("/v3/lease/grant", req.dump(), timeout_ms, &r);
  if (!s.ok()) return s;
  int64_t got_id = 0, got_ttl = 0;
  std::string why;
  if (!etcdjson::GetInt64(r.j, "ID", got_id, why) || !etcdjson::GetInt64(r.j, "TTL", got_ttl, why)) {
    return Malformed("lease grant", why);
  }
  if (got_id == 0 || got_ttl <= 0) return Malformed("lease grant", "no lease ID or TTL");
  id = got_id;
  ttl_out = got_ttl;
  return Status::Ok();
}

Status EtcdClient::LeaseKeepAlive(int64_t id, int timeout_ms, int64_t& ttl_out) {
  json req = {{"ID", Int(id)}};
  Reply r;
  Status s = Post("/v3/lease/keepalive", req.dump(), timeout_ms, &r);
  if (!s.ok()) return s;
  std::string why;
  bool ok = true;
  const json* res = etcdjson::GetObject(r.j, "result", why, ok);
  if (!ok || res == nullptr) return Malformed("lease keepalive", ok ? "no 'result'" : why);
  int64_t got_id = 0, ttl = 0;
  if (!etcdjson::GetInt64(*res, "ID", got_id, why) || !etcdjson::GetInt64(*res, "TTL", ttl, why)) {
    return Malformed("lease keepalive", why);
  }
  if (got_id != id) return Malformed("lease keepalive", "answer for another lease");
  ttl_out = std::max<int64_t>(ttl, 0);
  return Status::Ok();
}

Status EtcdClient::LeaseRevoke(int64_t id, int timeout_ms) {
  json req = {{"ID", Int(id)}};
  Reply r;
  Status s = Post("/v3/lease/revoke", req.dump(), timeout_ms, &r);
  if (!s.ok() && s.message().find("requested lease not found") != std::string::npos) {
    return Status::Ok();
  }
  return s;
}

}  // namespace hixl::discovery
