// Fuzz target: what etcd discovery reads from etcd — registry entries
// (DecodeEntry) and the gateway's JSON answers (the object parser with its
// depth limit, the streaming splitter of watch responses, key-value and
// header readers). Byte 0 picks the parser; any crash, sanitizer report or
// an accepted entry that breaks the entry rules aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "discovery/entry.h"
#include "discovery/etcd_json.h"

using namespace hixl::discovery;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t which = data[0] % 3;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string why;
  if (which == 0) {
    // "name\nvalue": the key's name and the stored value.
    const size_t nl = text.find('\n');
    const std::string name = nl == std::string::npos ? "e" : text.substr(0, nl);
    const std::string value = nl == std::string::npos ? text : text.substr(nl + 1);
    EngineEntry e;
    if (DecodeEntry(name, value, e).ok()) {
      if (e.name != name || e.generation == 0 || e.pid <= 0 || !CheckEntry(e).ok()) abort();
      EngineEntry again;
      if (!DecodeEntry(name, EncodeEntry(e), again).ok() || !(again == e)) abort();
    }
  } else if (which == 1) {
    nlohmann::json j;
    if (etcdjson::ParseObject(text, j, why)) {
      int64_t rev = 0;
      (void)etcdjson::HeaderRevision(j, rev, why);
      bool ok = true;
      if (const nlohmann::json* kv = etcdjson::GetObject(j, "kv", why, ok)) {
        KeyValue out;
        (void)etcdjson::ParseKeyValue(*kv, out, why);
      }
      if (auto it = j.find("kvs"); it != j.end() && it->is_array()) {
        for (const auto& e : *it) {
          KeyValue out;
          if (e.is_object()) (void)etcdjson::ParseKeyValue(e, out, why);
        }
      }
      std::string s;
      (void)etcdjson::GetBytes(j, "value", 4096, s, why);
      (void)etcdjson::GetString(j, "TTL", s, why);
    }
  } else {
    // A watch stream cut into chunks of varying size.
    etcdjson::JsonStreamSplitter split(1 << 16);
    std::vector<std::string> complete;
    size_t pos = 0, step = 1;
    while (pos < text.size()) {
      const size_t n = std::min(step, text.size() - pos);
      if (!split.Feed(text.data() + pos, n, complete, why)) break;
      pos += n;
      step = step * 3 % 61 + 1;
    }
    for (const auto& c : complete) {
      nlohmann::json j;
      (void)etcdjson::ParseObject(c, j, why);
    }
  }
  return 0;
}
