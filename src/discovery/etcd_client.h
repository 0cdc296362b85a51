// A small blocking client of etcd 3.4's v3 JSON gateway (HTTP POST of JSON to
// /v3/kv/*, /v3/lease/*, /v3/watch) over libcurl: key/value puts, ranges,
// deletes, a put-if-absent transaction, leases and a streaming watch.
//
// Every call takes a timeout in milliseconds that bounds the whole call; on a
// connection failure the next endpoint is tried within the same deadline, and
// the endpoint that answered last is tried first next time. Every byte etcd
// sends is validated (HTTP status, JSON syntax and nesting depth, types,
// base64, sizes) before use: a malformed answer is an error, never a crash.
//
// Errors: PARAM_INVALID for a bad argument, TIMEOUT when the deadline passed,
// FAILED for anything else (etcd unreachable, an etcd error, a malformed
// answer); the message names the endpoint and says what happened.
//
// Thread safety: an EtcdClient may be used from any number of threads at once.
// A WatchStop is shared between the thread in Watch and the one stopping it.
// Ownership: the client owns its curl handles; results are plain values.
#ifndef HIXL_DISCOVERY_ETCD_CLIENT_H_
#define HIXL_DISCOVERY_ETCD_CLIENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hixl/status.h"

namespace hixl::discovery {

inline constexpr size_t kMaxEtcdEndpoints = 16;
inline constexpr size_t kMaxResponseBytes = 16u << 20;      // one unary answer
inline constexpr size_t kMaxWatchMessageBytes = 16u << 20;  // one watch message

struct EtcdEndpoint {
  std::string host;  // host name, IPv4 or IPv6 literal (no brackets)
  int port = 0;      // 1..65535
  std::string ToString() const;  // "host:port" or "[v6]:port"
};

// Parses "etcd://host:port[,host:port...]" (1..16 endpoints, each with a port).
// Anything else is PARAM_INVALID naming what is wrong.
Status ParseEtcdEndpoints(const std::string& spec, std::vector<EtcdEndpoint>& out);

// Standard base64 with padding. Decode refuses anything not produced by
// Encode (bad characters, bad length, bad padding, non-zero trailing bits).
std::string Base64Encode(const std::string& bytes);
bool Base64Decode(const std::string& text, std::string& out);

// The range end that selects every key starting with prefix ("\0" for "").
std::string PrefixRangeEnd(const std::string& prefix);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: no lease
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // the store's revision when the range was read
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete only key and mod_revision are set
};

// One message of a watch stream.
struct WatchMessage {
  int64_t revision = 0;          // header revision
  bool created = false;          // the watch was just set up
  bool canceled = false;         // etcd ended the watch (see the next two)
  int64_t compact_revision = 0;  // > 0: start_revision was compacted away
  std::string cancel_reason;
  std::vector<WatchEvent> events;
};

// Stops a Watch from another thread, promptly (it wakes the watch's poll).
class WatchStop {
 public:
  void Stop();
  bool stopped() const { return stop_.load(std::memory_order_acquire); }
  // Allows the object to be used for another Watch.
  void Reset() { stop_.store(false, std::memory_order_release); }

 private:
  friend class EtcdClient;
  std::mutex mu_;
  void* multi_ = nullptr;  // CURLM* of the running watch, under mu_
  std::atomic<bool> stop_{false};
};

class EtcdClient {
 public:
  // Validates the endpoints string (see ParseEtcdEndpoints) into *out.
  static Status Create(const std::string& endpoints, std::unique_ptr<EtcdClient>* out);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::vector<EtcdEndpoint>& endpoints() const { return endpoints_; }

  // lease_id 0: no lease. revision (optional): the store revision after it.
  Status Put(const std::string& key, const std::string& value, int64_t lease_id, int timeout_ms,
             int64_t* revision = nullptr);
  // Puts key only if it does not exist (a txn comparing create_revision with
  // 0). created tells which; when not created, existing holds the present kv.
  Status PutIfAbsent(const std::string& key, const std::string& value, int64_t lease_id,
                     int timeout_ms, bool& created, KeyValue& existing);
  // Replaces key with value (bound to lease_id) only while the key's
  // mod_revision is still mod_revision, i.e. nobody changed it since it was
  // read (a txn comparing it). replaced tells which; when not replaced,
  // found says whether the key exists now and current holds it.
  Status PutIfUnchanged(const std::string& key, const std::string& value, int64_t lease_id,
                        int64_t mod_revision, int timeout_ms, bool& replaced, bool& found,
                        KeyValue& current);
  // One key: found false when it does not exist.
  Status Get(const std::string& key, int timeout_ms, bool& found, KeyValue& out,
             int64_t* revision = nullptr);
  // Every key starting with prefix, in key order.
  Status Range(const std::string& prefix, int timeout_ms, RangeResult& out);
  // deleted (optional): how many keys went.
  Status Delete(const std::string& key, int timeout_ms, int64_t* deleted = nullptr);
  // Compacts the store's history up to revision (tests use it).
  Status Compact(int64_t revision, int timeout_ms);

  Status LeaseGrant(int64_t ttl_s, int timeout_ms, int64_t& id, int64_t& ttl_out);
  // OK with ttl_out > 0 while the lease lives; OK with ttl_out == 0 once it
  // has expired or was revoked (etcd's own answer); an error only when etcd
  // could not be asked.
  Status LeaseKeepAlive(int64_t id, int timeout_ms, int64_t& ttl_out);
  // OK also when the lease no longer exists.
  Status LeaseRevoke(int64_t id, int timeout_ms);

  // Watches [key, range_end) from start_revision (0: from now), calling cb
  // on this thread for each message. Returns when:
  //   cb returned false                  -> OK
  //   stop.Stop() was called             -> CANCELLED
  //   etcd canceled the watch (e.g. compaction; cb saw the message first),
  //   the stream ended, or it broke      -> FAILED
  //   no connection within connect_timeout_ms -> TIMEOUT / FAILED
  // Once set up the stream has no deadline (TCP keepalive detects a dead peer).
  using WatchCallback = std::function<bool(const WatchMessage&)>;
  Status Watch(const std::string& key, const std::string& range_end, int64_t start_revision,
               int connect_timeout_ms, WatchStop& stop, const WatchCallback& cb);

 private:
  explicit EtcdClient(std::vector<EtcdEndpoint> endpoints) : endpoints_(std::move(endpoints)) {}
  struct Reply;
  // POSTs body to path; on success *reply holds the parsed JSON object.
  Status Post(const char* path, const std::string& body, int timeout_ms, Reply* reply);
  // A txn: puts key = value (with lease_id) when the key's `target` revision
  // (CREATE or MOD; `field` create_revision or mod_revision) equals expect,
  // else reads the key (found: it exists, current: its kv).
  Status CompareAndPut(const std::string& key, const std::string& value, int64_t lease_id,
                       const char* target, const char* field, const std::string& expect,
                       int timeout_ms, bool& put, bool& found, KeyValue& current);

  std::vector<EtcdEndpoint> endpoints_;
  std::atomic<size_t> preferred_{0};  // index of the endpoint that answered last
  std::mutex pool_mu_;
  std::vector<void*> pool_;  // idle CURL* easy handles (keep their connections)
};

}  // namespace hixl::discovery

#endif  // HIXL_DISCOVERY_ETCD_CLIENT_H_
