#include "discovery/etcd_json.h"

#include <charconv>
#include <limits>

namespace hixl::discovery::etcdjson {
namespace {

constexpr size_t kMaxKeyBytes = 64u << 10;

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Checks the nesting depth outside strings (nlohmann's parser recurses).
bool DepthOk(std::string_view text) {
  int depth = 0;
  bool in_string = false, escape = false;
  for (char c : text) {
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

}  // namespace

bool ParseObject(std::string_view text, nlohmann::json& out, std::string& why) {
  if (!DepthOk(text)) {
    why = "JSON nested deeper than " + std::to_string(kMaxDepth) + " levels";
    return false;
  }
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) {
    why = "not valid JSON";
    return false;
  }
  if (!j.is_object()) {
    why = "JSON is not an object";
    return false;
  }
  out = std::move(j);
  return true;
}

bool JsonStreamSplitter::Feed(const char* data, size_t n, std::vector<std::string>& complete,
                              std::string& why) {
  for (size_t i = 0; i < n; ++i) {
    char c = data[i];
    if (depth_ == 0) {
      if (IsSpace(c)) continue;
      if (c != '{') {
        why = "watch stream: unexpected byte outside a JSON object";
        return false;
      }
    }
    if (cur_.size() >= max_bytes_) {
      why = "watch stream: message larger than " + std::to_string(max_bytes_) + " bytes";
      return false;
    }
    cur_.push_back(c);
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      if (++depth_ > kMaxDepth) {
        why = "watch stream: JSON nested too deep";
        return false;
      }
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) {
        complete.push_back(std::move(cur_));
        cur_.clear();
      }
    }
  }
  return true;
}

bool GetInt64(const nlohmann::json& obj, const char* field, int64_t& out, std::string& why) {
  out = 0;
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return true;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() &&
        it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      why = std::string("field '") + field + "' out of range";
      return false;
    }
    out = it->get<int64_t>();
    return true;
  }
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size()) {
      why = std::string("field '") + field + "' is not an int64";
      return false;
    }
    out = v;
    return true;
  }
  why = std::string("field '") + field + "' has the wrong type";
  return false;
}

bool GetBool(const nlohmann::json& obj, const char* field, bool& out, std::string& why) {
  out = false;
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return true;
  if (!it->is_boolean()) {
    why = std::string("field '") + field + "' is not a boolean";
    return false;
  }
  out = it->get<bool>();
  return true;
}

bool GetString(const nlohmann::json& obj, const char* field, std::string& out, std::string& why) {
  out.clear();
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return true;
  if (!it->is_string()) {
    why = std::string("field '") + field + "' is not a string";
    return false;
  }
  out = it->get<std::string>();
  return true;
}

bool GetBytes(const nlohmann::json& obj, const char* field, size_t max_bytes, std::string& out,
              std::string& why) {
  std::string text;
  if (!GetString(obj, field, text, why)) return false;
  if (text.size() / 4 * 3 > max_bytes + 2) {
    why = std::string("field '") + field + "' is too large";
    return false;
  }
  if (!Base64Decode(text, out)) {
    why = std::string("field '") + field + "' is not valid base64";
    return false;
  }
  if (out.size() > max_bytes) {
    why = std::string("field '") + field + "' is too large";
    return false;
  }
  return true;
}

const nlohmann::json* GetObject(const nlohmann::json& obj, const char* field, std::string& why,
                                bool& ok) {
  ok = true;
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return nullptr;
  if (!it->is_object()) {
    why = std::string("field '") + field + "' is not an object";
    ok = false;
    return nullptr;
  }
  return &*it;
}

bool ParseKeyValue(const nlohmann::json& obj, KeyValue& out, std::string& why) {
  if (!obj.is_object()) {
    why = "a kv is not an object";
    return false;
  }
  KeyValue kv;
  if (!GetBytes(obj, "key", kMaxKeyBytes, kv.key, why) ||
      !GetBytes(obj, "value", kMaxResponseBytes, kv.value, why) ||
      !GetInt64(obj, "create_revision", kv.create_revision, why) ||
      !GetInt64(obj, "mod_revision", kv.mod_revision, why) ||
      !GetInt64(obj, "lease", kv.lease, why)) {
    return false;
  }
  if (kv.key.empty()) {
    why = "a kv has no key";
    return false;
  }
  if (kv.create_revision < 0 || kv.mod_revision < 0) {
    why = "a kv has a negative revision";
    return false;
  }
  out = std::move(kv);
  return true;
}

bool HeaderRevision(const nlohmann::json& obj, int64_t& rev, std::string& why) {
  rev = 0;
  bool ok = true;
  const nlohmann::json* h = GetObject(obj, "header", why, ok);
  if (!ok) return false;
  if (h == nullptr) return true;
  if (!GetInt64(*h, "revision", rev, why)) return false;
  if (rev < 0) {
    why = "negative header revision";
    return false;
  }
  return true;
}

}  // namespace hixl::discovery::etcdjson
