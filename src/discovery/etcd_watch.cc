// EtcdClient::Watch: a streaming POST /v3/watch driven by curl_multi so that
// WatchStop::Stop can wake it at once (curl_multi_wakeup).
#include <curl/curl.h>

#include <algorithm>
#include <chrono>

#include "common/net.h"
#include "discovery/etcd_client.h"
#include "discovery/etcd_json.h"

namespace hixl::discovery {

using nlohmann::json;

void WatchStop::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_.store(true, std::memory_order_release);
  if (multi_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(multi_));
}

namespace {

bool IsConnectFailureCode(CURL* h, CURLcode rc) {
  if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST) return true;
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    curl_off_t connect_us = 0;
    curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &connect_us);
    return connect_us == 0;  // never connected
  }
  return false;
}

// Why the stream ended, when the write callback ended it.
enum class End { kNone, kCallbackDone, kCanceled, kBad, kHttpError };

struct WatchState {
  CURL* easy = nullptr;
  const EtcdClient::WatchCallback* cb = nullptr;
  etcdjson::JsonStreamSplitter splitter{kMaxWatchMessageBytes};
  long http_code = 0;
  std::string error_body;  // non-200 answers, bounded
  bool got_bytes = false;
  End end = End::kNone;
  std::string why;
};

bool ParseWatchMessage(const json& j, WatchMessage& m, std::string& why) {
  if (j.contains("error")) {
    why = "etcd ended the watch with an error";
    auto e = j.find("error");
    if (e->is_object() && e->contains("message") && (*e)["message"].is_string()) {
      why += ": " + (*e)["message"].get<std::string>().substr(0, 512);
    }
    return false;
  }
  bool ok = true;
  const json* r = etcdjson::GetObject(j, "result", why, ok);
  if (!ok) return false;
  if (r == nullptr) {
    why = "watch message without 'result'";
    return false;
  }
  if (!etcdjson::HeaderRevision(*r, m.revision, why) ||
      !etcdjson::GetBool(*r, "created", m.created, why) ||
      !etcdjson::GetBool(*r, "canceled", m.canceled, why) ||
      !etcdjson::GetInt64(*r, "compact_revision", m.compact_revision, why) ||
      !etcdjson::GetString(*r, "cancel_reason", m.cancel_reason, why)) {
    return false;
  }
  auto evs = r->find("events");
  if (evs == r->end() || evs->is_null()) return true;
  if (!evs->is_array()) {
    why = "'events' is not an array";
    return false;
  }
  for (const json& e : *evs) {
    if (!e.is_object()) {
      why = "an event is not an object";
      return false;
    }
    WatchEvent ev;
    std::string type;
    if (!etcdjson::GetString(e, "type", type, why)) return false;
    if (type.empty() || type == "PUT") {
      ev.type = WatchEvent::Type::kPut;
    } else if (type == "DELETE") {
      ev.type = WatchEvent::Type::kDelete;
    } else {
      why = "unknown event type";
      return false;
    }
    const json* kv = etcdjson::GetObject(e, "kv", why, ok);
    if (!ok) return false;
    if (kv == nullptr || !etcdjson::ParseKeyValue(*kv, ev.kv, why)) {
      if (why.empty()) why = "an event without kv";
      return false;
    }
    m.events.push_back(std::move(ev));
  }
  return true;
}

size_t OnWatchBytes(char* p, size_t size, size_t n, void* ud) {
  auto* st = static_cast<WatchState*>(ud);
  const size_t len = size * n;
  st->got_bytes = true;
  if (st->http_code == 0) curl_easy_getinfo(st->easy, CURLINFO_RESPONSE_CODE, &st->http_code);
  if (st->http_code != 200) {
    if (st->error_body.size() < 4096) st->error_body.append(p, std::min<size_t>(len, 4096));
    return len;
  }
  std::vector<std::string> msgs;
  std::string stream_error;
  const bool stream_ok = st->splitter.Feed(p, len, msgs, stream_error);
  for (const std::string& text : msgs) {  // those before any bad byte first
    json j;
    WatchMessage m;
    if (!etcdjson::ParseObject(text, j, st->why) || !ParseWatchMessage(j, m, st->why)) {
      st->why = "malformed watch message: " + st->why;
      st->end = End::kBad;
      return CURL_WRITEFUNC_ERROR;
    }
    if (!(*st->cb)(m)) {
      st->end = End::kCallbackDone;
      return CURL_WRITEFUNC_ERROR;
    }
    if (m.canceled) {
      st->end = End::kCanceled;
      st->why = m.compact_revision > 0
                    ? "watch canceled: revisions before " + std::to_string(m.compact_revision) +
                          " were compacted"
                    : "watch canceled by etcd" +
                          (m.cancel_reason.empty() ? "" : ": " + m.cancel_reason.substr(0, 256));
      return CURL_WRITEFUNC_ERROR;
    }
  }
  if (!stream_ok) {
    st->why = stream_error;
    st->end = End::kBad;
    return CURL_WRITEFUNC_ERROR;
  }
  return len;
}

}  // namespace

Status EtcdClient::Watch(const std::string& key, const std::string& range_end,
                         int64_t start_revision, int connect_timeout_ms, WatchStop& stop,
                         const WatchCallback& cb) {
  if (key.empty()) return Status::ParamInvalid("etcd watch: empty key");
  if (connect_timeout_ms <= 0) return Status::ParamInvalid("etcd watch: timeout must be > 0");
  json create = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) create["range_end"] = Base64Encode(range_end);
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  const std::string body = json{{"create_request", create}}.dump();

  CURLM* multi = curl_multi_init();
  if (multi == nullptr) return Status::Failed("curl_multi_init failed");
  {
    std::lock_guard<std::mutex> lock(stop.mu_);
    if (stop.stopped()) {
      curl_multi_cleanup(multi);
      return Status::Cancelled("etcd watch stopped");
    }
    stop.multi_ = multi;
  }
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Expect:");
  const auto deadline = net::DeadlineAfterMs(connect_timeout_ms);
  const size_t n = endpoints_.size();
  const size_t first = preferred_.load(std::memory_order_relaxed) % n;
  std::string errors;
  Status result;
  bool decided = false;
  for (size_t k = 0; k < n && !decided; ++k) {
    const size_t idx = (first + k) % n;
    const EtcdEndpoint& ep = endpoints_[idx];
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - net::Clock::now()).count();
    if (left <= 0) break;
    CURL* easy = curl_easy_init();
    if (easy == nullptr) {
      result = Status::Failed("curl_easy_init failed");
      break;
    }
    WatchState st;
    st.easy = easy;
    st.cb = &cb;
    const std::string url = "http://" + ep.ToString() + "/v3/watch";
    curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, OnWatchBytes);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &st);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(left / (n - k) + 1));
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPINTVL, 2L);
    curl_multi_add_handle(multi, easy);
    CURLcode rc = CURLE_OK;
    bool finished = false, stopped = false;
    while (!finished) {
      if (stop.stopped()) {
        stopped = true;
        break;
      }
      int running = 0;
      curl_multi_perform(multi, &running);
      int queued = 0;
      while (CURLMsg* msg = curl_multi_info_read(multi, &queued)) {
        if (msg->msg == CURLMSG_DONE) {
          rc = msg->data.result;
          finished = true;
        }
      }
      if (finished || running == 0) break;
      curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
    }
    const std::string where = "etcd watch at " + ep.ToString();
    if (stopped) {
      result = Status::Cancelled(where + ": stopped");
      decided = true;
    } else if (st.end == End::kCallbackDone) {
      result = Status::Ok();
      decided = true;
    } else if (st.end == End::kCanceled || st.end == End::kBad) {
      result = Status::Failed(where + ": " + st.why);
      decided = true;
    } else if (rc != CURLE_OK && !st.got_bytes && IsConnectFailureCode(easy, rc)) {
      errors += (errors.empty() ? "" : "; ") + ep.ToString() + ": " + curl_easy_strerror(rc);
    } else if (st.http_code != 200 && st.got_bytes) {
      std::string why;
      json j;
      std::string text = etcdjson::ParseObject(st.error_body, j, why)
                             ? (j.contains("message") && j["message"].is_string()
                                    ? j["message"].get<std::string>().substr(0, 512)
                                    : "(no message)")
                             : "(unreadable error body)";
      result = Status::Failed(where + ": HTTP " + std::to_string(st.http_code) + ": " + text);
      decided = true;
    } else {
      result = Status::Failed(where + ": stream ended" +
                              (rc != CURLE_OK ? std::string(": ") + curl_easy_strerror(rc) : ""));
      decided = true;
      if (st.got_bytes) preferred_.store(idx, std::memory_order_relaxed);
    }
    curl_multi_remove_handle(multi, easy);
    curl_easy_cleanup(easy);
  }
  {
    std::lock_guard<std::mutex> lock(stop.mu_);
    stop.multi_ = nullptr;
  }
  curl_multi_cleanup(multi);
  curl_slist_free_all(headers);
  if (decided || !result.ok()) return result;
  if (errors.empty()) {
    return Status::Timeout("etcd watch: no endpoint answered within " +
                           std::to_string(connect_timeout_ms) + " ms");
  }
  return Status::Failed("etcd unreachable (watch): " + errors);
}

}  // namespace hixl::discovery
