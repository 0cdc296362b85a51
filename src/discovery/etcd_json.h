// Validating readers of etcd's JSON answers (internal to src/discovery):
// a bounded incremental splitter of a stream of JSON objects, a nesting-depth
// check that keeps nlohmann's recursive parser safe, and typed field getters
// that never throw (int64 fields as etcd's JSON strings or as numbers, bytes
// fields as base64).
// Thread safety: a JsonStreamSplitter is owned by one thread; the functions
// are stateless.
#ifndef HIXL_DISCOVERY_ETCD_JSON_H_
#define HIXL_DISCOVERY_ETCD_JSON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "discovery/etcd_client.h"

namespace hixl::discovery::etcdjson {

inline constexpr int kMaxDepth = 32;

// Parses text as one JSON object of at most kMaxDepth levels into out;
// false (with why) for anything else. Never throws.
bool ParseObject(std::string_view text, nlohmann::json& out, std::string& why);

// Splits a byte stream into top-level JSON values (objects, here), whatever
// separates them. Feed returns false once the stream is unusable: a value
// over max_bytes, nesting over kMaxDepth, or bytes outside a value that are
// not whitespace.
class JsonStreamSplitter {
 public:
  explicit JsonStreamSplitter(size_t max_bytes) : max_bytes_(max_bytes) {}
  bool Feed(const char* data, size_t n, std::vector<std::string>& complete, std::string& why);

 private:
  size_t max_bytes_;
  std::string cur_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
};

// Field getters: absent fields give the default (etcd omits zero values);
// present fields of the wrong type or form are an error (false, why set).
bool GetInt64(const nlohmann::json& obj, const char* field, int64_t& out, std::string& why);
bool GetBool(const nlohmann::json& obj, const char* field, bool& out, std::string& why);
bool GetString(const nlohmann::json& obj, const char* field, std::string& out, std::string& why);
bool GetBytes(const nlohmann::json& obj, const char* field, size_t max_bytes, std::string& out,
              std::string& why);
// A field that must be an object if present; null when absent.
const nlohmann::json* GetObject(const nlohmann::json& obj, const char* field, std::string& why,
                                bool& ok);
// A mvccpb.KeyValue.
bool ParseKeyValue(const nlohmann::json& obj, KeyValue& out, std::string& why);
// header.revision of an answer (0 when absent).
bool HeaderRevision(const nlohmann::json& obj, int64_t& rev, std::string& why);

}  // namespace hixl::discovery::etcdjson

#endif  // HIXL_DISCOVERY_ETCD_JSON_H_
