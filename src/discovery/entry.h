// The engine registry's entry: what an engine publishes about itself under
// <prefix>engines/<name> in etcd, and the strict codec between that entry and
// the JSON value stored there ({"v":1,"name":..,"address":..,"generation":..,
// "host_id":..,"pid":..}). Values written by anything else (another version,
// another program, a hand-edited key) are refused with a clear reason.
// Thread safety: stateless functions. Ownership: plain values.
#ifndef HIXL_DISCOVERY_ENTRY_H_
#define HIXL_DISCOVERY_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "hixl/status.h"

namespace hixl::discovery {

inline constexpr int kEntryVersion = 1;
inline constexpr size_t kMaxEngineNameLen = 128;
inline constexpr size_t kMaxHostIdLen = 256;
inline constexpr size_t kMaxEntryValueBytes = 4096;

struct EngineEntry {
  std::string name;     // the engine's name (the key's last part)
  std::string address;  // ip:port (or [v6]:port) of its control listener
  uint64_t generation = 0;  // never 0: a new value each time the engine starts
  std::string host_id;  // host::HostIdentity() of its host
  int64_t pid = 0;      // > 0

  bool operator==(const EngineEntry&) const = default;
};

// 1..128 characters of [A-Za-z0-9._:-] ("10.0.0.1:5000" is a valid name).
Status CheckEngineName(const std::string& name);

// The value to store. The entry is expected to be valid (see DecodeEntry).
std::string EncodeEntry(const EngineEntry& e);

// Parses value read under the key whose name part is key_name. PARAM_INVALID
// naming the reason for: bad or oversized JSON, another version, missing or
// mistyped fields, a name that differs from key_name, an address that is not
// ip:port, generation 0, pid <= 0, over-long fields. out is set only on OK.
Status DecodeEntry(const std::string& key_name, const std::string& value, EngineEntry& out);

// The same checks on an entry about to be published.
Status CheckEntry(const EngineEntry& e);

}  // namespace hixl::discovery

#endif  // HIXL_DISCOVERY_ENTRY_H_
