// The engine's names: with MetadataServer, the engine publishes itself in
// etcd (discovery::Registry) and resolves other engines' names to their
// addresses; without it, or in builds without etcd (HIXL_WITH_ETCD), names
// are plain "ip:port" strings and nothing else changes.
// Thread safety: Start/Stop from one thread (Initialize, Finalize); Resolve
// and List from any thread in between.
#ifndef HIXL_ENGINE_NAMING_H_
#define HIXL_ENGINE_NAMING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/options.h"
#include "hixl/hixl.h"

namespace hixl::engine {

class Naming {
 public:
  Naming();
  ~Naming();
  // Publishes this engine (name: EngineName, or its address) when the options
  // name a MetadataServer; no-op otherwise. listening: the engine accepts
  // peers (a client-only engine resolves names but publishes nothing).
  Status Start(const Options& o, const std::string& address, uint64_t generation,
               bool listening);
  void Stop();
  bool enabled() const;
  // The name this engine is published under (empty when not published).
  std::string self_name() const;
  // The address and generation registered for an engine name.
  Status Resolve(const std::string& name, std::string& address, uint64_t& generation);
  Status List(std::vector<EngineRecord>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hixl::engine

#endif  // HIXL_ENGINE_NAMING_H_
