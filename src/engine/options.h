// The engine's Initialize options: one table of every key (hixl::options),
// its accepted values and where it goes. The C API takes its list of engine
// keys from here, so the two never drift apart.
// Thread safety: stateless functions over constant data.
#ifndef HIXL_ENGINE_OPTIONS_H_
#define HIXL_ENGINE_OPTIONS_H_

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "hixl/hixl.h"

namespace hixl::engine {

struct Options {
  LinkType link = LinkType::AUTO;
  int copy_threads = 2;
  int poll_spin_us = 20;
  bool fabric_mem = true;
  int dereg_timeout_ms = 5000;
  int handshake_timeout_ms = 5000;
  int hb_interval_ms = 1000;
  int hb_misses = 3;
  bool auto_connect = false;
  int connect_timeout_ms = 3000;
  size_t max_peers = 0;  // 0: no limit
  size_t low_water = 0;  // derived from max_peers unless given
  size_t notify_depth = 4096;
  std::string auth_secret;     // empty: no authentication
  bool auth_required = false;  // refuse peers that do not authenticate
  std::string metadata_server;           // "etcd://..."; empty: no discovery
  std::string metadata_prefix = "hixl/";
  std::string engine_name;               // empty: the bound ip:port
  int metadata_ttl_s = 10;
  // Options a transport declares for itself (transport::TransportOption),
  // each with its value or declared default.
  std::map<std::string, int64_t> transport_settings;
};

// Every key Initialize accepts, in documentation order (the engine's own,
// then each built-in transport's).
const std::vector<std::string>& OptionKeys();

// Parses Initialize's options: unknown keys, malformed or out-of-range
// values and inconsistent combinations are PARAM_INVALID (a transport this
// build lacks: UNSUPPORTED).
Status ParseOptions(const std::map<std::string, std::string>& in, Options& out);

}  // namespace hixl::engine

#endif  // HIXL_ENGINE_OPTIONS_H_
