/* hixl_cs_test_server: a HiXL CS server for the tests, driven over stdin.
 *
 *   hixl_cs_test_server --port P --size N --ep PROTO:IP [--ep ...] [--config JSON]
 *
 * Registers N bytes (malloc) under the tag "region", listens, prints "ready",
 * then answers one command per line:
 *   fill SEED   fills the region with the test pattern of SEED   -> "ok"
 *   check SEED [LEN]  compares the region (its first LEN bytes) with it
 *               -> "match" or "mismatch AT"
 *   destroy     HixlCSServerDestroy           -> "ok"
 *   quit        exits 0 (also on end of input) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cs_test_util.h"

#define MAX_EPS 16

int main(int argc, char** argv) {
  EndpointDesc eps[MAX_EPS];
  char ips[MAX_EPS][64];
  uint32_t neps = 0, port = 0;
  uint64_t size = 0;
  const char* config_json = NULL;
  int i;
  memset(eps, 0, sizeof(eps));
  for (i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--port") == 0) {
      port = (uint32_t)strtoul(argv[i + 1], NULL, 10);
    } else if (strcmp(argv[i], "--size") == 0) {
      size = strtoull(argv[i + 1], NULL, 10);
    } else if (strcmp(argv[i], "--config") == 0) {
      config_json = argv[i + 1];
    } else if (strcmp(argv[i], "--ep") == 0 && neps < MAX_EPS) {
      char proto[16];
      const char* colon = strchr(argv[i + 1], ':');
      if (colon == NULL || (size_t)(colon - argv[i + 1]) >= sizeof(proto)) {
        fprintf(stderr, "bad --ep %s\n", argv[i + 1]);
        return 2;
      }
      memcpy(proto, argv[i + 1], (size_t)(colon - argv[i + 1]));
      proto[colon - argv[i + 1]] = '\0';
      snprintf(ips[neps], sizeof(ips[neps]), "%s", colon + 1);
      eps[neps].protocol = (CommProtocol)CsProtocol(proto);
      eps[neps].location = END_POINT_LOCATION_HOST;
      eps[neps].addr = ips[neps];
      ++neps;
    } else {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (neps == 0 || size == 0 || port == 0) {
    fprintf(stderr, "usage: %s --port P --size N --ep PROTO:IP [--ep ...] [--config JSON]\n", argv[0]);
    return 2;
  }
  uint8_t* region = (uint8_t*)malloc(size);
  if (region == NULL) return 2;
  memset(region, 0, size);

  HixlServerDesc desc;
  memset(&desc, 0, sizeof(desc));
  desc.endpoint_list = eps;
  desc.endpoint_list_num = neps;
  desc.server_ip = ips[0];
  desc.server_port = port;
  HixlServerConfig config;
  memset(&config, 0, sizeof(config));
  config.global_resource_config = config_json;
  HixlServerHandle server = NULL;
  HixlStatus st = HixlCSServerCreate(&desc, &config, &server);
  if (st != HIXL_SUCCESS) CsDie("HixlCSServerCreate", st);
  CommMem mem = {COMM_MEM_TYPE_HOST, region, size};
  MemHandle handle = NULL;
  st = HixlCSServerRegMem(server, "region", &mem, &handle);
  if (st != HIXL_SUCCESS) CsDie("HixlCSServerRegMem", st);
  st = HixlCSServerListen(server, 64);
  if (st != HIXL_SUCCESS) CsDie("HixlCSServerListen", st);
  printf("ready\n");
  fflush(stdout);

  char line[256];
  while (fgets(line, sizeof(line), stdin) != NULL) {
    unsigned seed = 0;
    unsigned long long len = 0;
    if (sscanf(line, "check %u %llu", &seed, &len) == 2 && len <= size) {
      uint64_t at = CsFirstMismatch(region, len, seed);
      if (at == len) {
        printf("match\n");
      } else {
        printf("mismatch %llu\n", (unsigned long long)at);
      }
    } else if (sscanf(line, "fill %u", &seed) == 1) {
      CsFill(region, size, seed);
      printf("ok\n");
    } else if (sscanf(line, "check %u", &seed) == 1) {
      uint64_t at = CsFirstMismatch(region, size, seed);
      if (at == size) {
        printf("match\n");
      } else {
        printf("mismatch %llu\n", (unsigned long long)at);
      }
    } else if (strncmp(line, "destroy", 7) == 0) {
      st = server != NULL ? HixlCSServerDestroy(server) : HIXL_SUCCESS;
      server = NULL;
      printf(st == HIXL_SUCCESS ? "ok\n" : "failed\n");
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    } else {
      printf("unknown\n");
    }
    fflush(stdout);
  }
  if (server != NULL) HixlCSServerDestroy(server);
  free(region);
  return 0;
}
