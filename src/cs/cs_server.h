// A HiXL CS server: one engine per endpoint, the tagged memory it offers,
// and the description every engine hands to the clients that link to it
// (cs_info.h). Engines start at Listen; memory registered before is
// registered on each of them then, memory registered after at once.
// Thread safety: every method may be called from any thread (one mutex).
// Ownership: the server owns its engines; registered memory stays the caller's.
#ifndef HIXL_CS_CS_SERVER_H_
#define HIXL_CS_CS_SERVER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cs/cs_info.h"
#include "hixl/hixl.h"
#include "hixl/hixl_cs.h"

namespace hixl::cs {

// Parses a global_resource_config (NULL: none) into engine options, checked
// as Initialize would check them. Keys the CS layer sets itself (LinkType,
// EngineName, MetadataServer, MetadataPrefix, MetadataTtlS) are refused.
Status ParseResourceConfig(const char* json, std::map<std::string, std::string>& out);

// A HixlServerConfig or HixlClientConfig (NULL: none): reserved bytes zero,
// then its global_resource_config.
template <typename Config>
Status ParseConfig(const Config* config, std::map<std::string, std::string>& out) {
  out.clear();
  if (config == nullptr) return Status::Ok();
  for (uint8_t b : config->reserved) {
    if (b != 0) return Status::ParamInvalid("config: reserved bytes must be zero");
  }
  return ParseResourceConfig(config->global_resource_config, out);
}

class Server {
 public:
  struct Mem {
    std::string tag;
    uint64_t addr = 0;
    uint64_t size = 0;
    std::vector<hixl::MemHandle> handles;  // one per engine, once listening
  };

  static Status Create(const HixlServerDesc& desc, const HixlServerConfig* config,
                       std::unique_ptr<Server>& out);
  ~Server();

  Status RegMem(const char* tag, const CommMem* mem, Mem*& out);
  Status Listen(uint32_t backlog);
  Status UnregMem(Mem* mem);
  // Withdraws the memory (TIMEOUT as UnregMem), then finalizes every engine:
  // links close, clients' transfers fail.
  Status Shutdown();

 private:
  struct Endpoint {
    std::string transport;
    std::string addr;
    std::unique_ptr<Hixl> engine;
    std::string engine_addr;  // "ip:port" once listening
  };
  Server() = default;
  ServerInfo InfoLocked() const;
  Status PublishLocked();

  std::mutex mu_;
  std::map<std::string, std::string> options_;
  std::vector<Endpoint> endpoints_;
  size_t primary_ = 0;  // the endpoint listening on port_
  uint32_t port_ = 0;
  bool listening_ = false;
  bool shut_ = false;
  std::vector<std::unique_ptr<Mem>> mems_;  // registration order
};

}  // namespace hixl::cs

#endif  // HIXL_CS_CS_SERVER_H_
