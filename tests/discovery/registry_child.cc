// A process running one Registry until stdin closes (then it Stops) or it is
// killed: registry_test's "crashed engine".
//   hixl_discovery_test_registry <endpoints> <prefix> <name> <address> <ttl_s>
// Prints "READY <lease id>" once registered, or "ERROR <status>".
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "discovery/registry.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s endpoints prefix name address ttl_s\n", argv[0]);
    return 2;
  }
  hixl::discovery::RegistryConfig cfg;
  cfg.endpoints = argv[1];
  cfg.prefix = argv[2];
  cfg.self = {argv[3], argv[4], 7, "child-host", static_cast<int64_t>(getpid())};
  cfg.ttl_s = std::atoi(argv[5]);
  cfg.request_timeout_ms = 1000;
  hixl::discovery::Registry reg;
  hixl::Status s = reg.Start(cfg);
  if (!s.ok()) {
    std::printf("ERROR %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("READY %lld\n", static_cast<long long>(reg.lease_id()));
  std::fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
  reg.Stop();
  return 0;
}
