/* hixl_cs_test_client: a HiXL CS client for the tests and the aggregation
 * figures. Moves --size bytes between its registered buffer and the
 * server's region "region" in one batch of --desc-size descriptors.
 *
 *   hixl_cs_test_client --server IP:PORT --link PROTO:LOCAL_IP:REMOTE_IP [--link ...]
 *       --size N --op put|get --seed S [--desc-size B] [--timeout-ms T]
 *       [--repeat R] [--async] [--config JSON] [--label L] [--ready-file F]
 *
 * put: fills its buffer with the pattern of S first (the caller then asks the
 * server to check); get: checks its buffer against the pattern of S after
 * (the caller filled the server first). --ready-file: created once connected,
 * right before the first batch. One JSON line per batch:
 *   {"label":..,"op":..,"links":K,"bytes":N,"seconds":T,"mb_per_s":X,
 *    "status":"COMPLETED"|"FAILED"|"TIMEOUT"|"STUCK","verified":true|false,
 *    "link_bytes":[..],"link_up":[..]}
 * Exit: 0 all completed (and verified), 3 a batch ended FAILED or TIMEOUT,
 * 4 wrong bytes, 5 an async batch did not end within --timeout-ms, 2 usage
 * or setup errors. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cs_test_util.h"

#define MAX_LINKS 16

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void SleepMs(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

/* "proto:a:b" -> endpoints; IPv4 only here. */
static int ParseLink(const char* s, EndpointDesc* local, EndpointDesc* remote, char* lip, char* rip) {
  char proto[16];
  const char* c1 = strchr(s, ':');
  const char* c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
  if (c1 == NULL || c2 == NULL || (size_t)(c1 - s) >= sizeof(proto) || c2 - c1 - 1 >= 63) return -1;
  memcpy(proto, s, (size_t)(c1 - s));
  proto[c1 - s] = '\0';
  memcpy(lip, c1 + 1, (size_t)(c2 - c1 - 1));
  lip[c2 - c1 - 1] = '\0';
  snprintf(rip, 64, "%s", c2 + 1);
  memset(local, 0, sizeof(*local));
  memset(remote, 0, sizeof(*remote));
  local->protocol = remote->protocol = (CommProtocol)CsProtocol(proto);
  local->location = remote->location = END_POINT_LOCATION_HOST;
  local->addr = lip;
  remote->addr = rip;
  return 0;
}

int main(int argc, char** argv) {
  EndpointDesc locals[MAX_LINKS], remotes[MAX_LINKS];
  char lips[MAX_LINKS][64], rips[MAX_LINKS][64], server_ip[64] = "";
  uint32_t nlinks = 0, port = 0, seed = 1, repeat = 1, timeout_ms = 30000;
  uint64_t size = 0, desc_size = 1 << 20;
  int put = 1, async = 0, i, rc = 0;
  const char *config_json = NULL, *label = "", *ready_file = NULL;
  for (i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--async") == 0) {
      async = 1;
      continue;
    }
    if (v == NULL) {
      fprintf(stderr, "%s needs a value\n", a);
      return 2;
    }
    ++i;
    if (strcmp(a, "--server") == 0) {
      const char* colon = strrchr(v, ':');
      if (colon == NULL || colon - v >= 63) return 2;
      memcpy(server_ip, v, (size_t)(colon - v));
      server_ip[colon - v] = '\0';
      port = (uint32_t)strtoul(colon + 1, NULL, 10);
    } else if (strcmp(a, "--link") == 0 && nlinks < MAX_LINKS) {
      if (ParseLink(v, &locals[nlinks], &remotes[nlinks], lips[nlinks], rips[nlinks]) != 0) {
        fprintf(stderr, "bad --link %s\n", v);
        return 2;
      }
      ++nlinks;
    } else if (strcmp(a, "--size") == 0) {
      size = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--desc-size") == 0) {
      desc_size = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--op") == 0) {
      put = strcmp(v, "put") == 0;
    } else if (strcmp(a, "--seed") == 0) {
      seed = (uint32_t)strtoul(v, NULL, 10);
    } else if (strcmp(a, "--timeout-ms") == 0) {
      timeout_ms = (uint32_t)strtoul(v, NULL, 10);
    } else if (strcmp(a, "--repeat") == 0) {
      repeat = (uint32_t)strtoul(v, NULL, 10);
    } else if (strcmp(a, "--config") == 0) {
      config_json = v;
    } else if (strcmp(a, "--label") == 0) {
      label = v;
    } else if (strcmp(a, "--ready-file") == 0) {
      ready_file = v;
    } else {
      fprintf(stderr, "unknown argument %s\n", a);
      return 2;
    }
  }
  if (nlinks == 0 || size == 0 || port == 0 || desc_size == 0 || server_ip[0] == '\0') {
    fprintf(stderr, "usage: see the comment at the top of cs_test_client.c\n");
    return 2;
  }

  HixlClientDesc desc;
  memset(&desc, 0, sizeof(desc));
  desc.server_ip = server_ip;
  desc.server_port = port;
  if (nlinks == 1) {
    desc.local_endpoint = locals[0];
    desc.remote_endpoint = remotes[0];
  } else {
    desc.endpoint_list_num = nlinks;
    desc.local_endpoint_list = locals;
    desc.remote_endpoint_list = remotes;
  }
  HixlClientConfig config;
  memset(&config, 0, sizeof(config));
  config.global_resource_config = config_json;
  HixlClientHandle client = NULL;
  HixlStatus st = HixlCSClientCreate(&desc, &config, &client);
  if (st != HIXL_SUCCESS) CsDie("HixlCSClientCreate", st);
  uint8_t* local = (uint8_t*)malloc(size);
  if (local == NULL) return 2;
  memset(local, 0, size);
  CommMem mem = {COMM_MEM_TYPE_HOST, local, size};
  MemHandle mh = NULL;
  st = HixlCSClientRegMem(client, NULL, &mem, &mh);
  if (st != HIXL_SUCCESS) CsDie("HixlCSClientRegMem", st);
  st = HixlCSClientConnect(client, 10000);
  if (st != HIXL_SUCCESS) CsDie("HixlCSClientConnect", st);
  CommMem* list = NULL;
  char** tags = NULL;
  uint32_t n = 0, k;
  st = HixlCSClientGetRemoteMem(client, &list, &tags, &n, 1000);
  if (st != HIXL_SUCCESS) CsDie("HixlCSClientGetRemoteMem", st);
  uint8_t* remote = NULL;
  for (k = 0; k < n; ++k) {
    if (strcmp(tags[k], "region") == 0 && list[k].size >= size) remote = (uint8_t*)list[k].addr;
  }
  if (remote == NULL) {
    fprintf(stderr, "the server has no region of %llu bytes tagged \"region\"\n", (unsigned long long)size);
    return 2;
  }

  uint32_t ndesc = (uint32_t)((size + desc_size - 1) / desc_size);
  HixlOneSideOpDesc* descs = (HixlOneSideOpDesc*)calloc(ndesc, sizeof(*descs));
  for (k = 0; k < ndesc; ++k) {
    uint64_t off = (uint64_t)k * desc_size;
    descs[k].local_buf = local + off;
    descs[k].remote_buf = remote + off;
    descs[k].len = size - off < desc_size ? size - off : desc_size;
  }
  if (put) CsFill(local, size, seed);
  if (ready_file != NULL) {
    FILE* f = fopen(ready_file, "w");
    if (f == NULL) return 2;
    fclose(f);
  }

  uint32_t r;
  for (r = 0; r < repeat && rc == 0; ++r) {
    const char* status = "COMPLETED";
    if (!put) memset(local, 0, size);
    double t0 = Now();
    if (!async) {
      st = put ? HixlCSClientBatchPutSync(client, ndesc, descs, timeout_ms)
               : HixlCSClientBatchGetSync(client, ndesc, descs, timeout_ms);
      if (st == HIXL_TIMEOUT) status = "TIMEOUT";
      else if (st != HIXL_SUCCESS) status = "FAILED";
    } else {
      CompleteHandle h = NULL;
      st = put ? HixlCSClientBatchPutAsync(client, ndesc, descs, &h)
               : HixlCSClientBatchGetAsync(client, ndesc, descs, &h);
      if (st != HIXL_SUCCESS) {
        status = "FAILED";
      } else {
        HixlCompleteStatus cs = HIXL_COMPLETE_STATUS_WAITING;
        while (cs == HIXL_COMPLETE_STATUS_WAITING) {
          st = HixlCSClientQueryCompleteStatus(client, h, &cs);
          if (st != HIXL_SUCCESS) CsDie("HixlCSClientQueryCompleteStatus", st);
          if (cs != HIXL_COMPLETE_STATUS_WAITING) break;
          if (Now() - t0 > timeout_ms / 1000.0) {
            status = "STUCK";
            break;
          }
          SleepMs(1);
        }
        if (cs == HIXL_COMPLETE_STATUS_TIMEOUT) status = "TIMEOUT";
        if (cs == HIXL_COMPLETE_STATUS_FAILED) status = "FAILED";
      }
    }
    double secs = Now() - t0;
    int completed = strcmp(status, "COMPLETED") == 0;
    int verified = completed && (put || CsFirstMismatch(local, size, seed) == size);
    if (strcmp(status, "STUCK") == 0) rc = 5;
    else if (!completed) rc = 3;
    else if (!verified) rc = 4;
    if (!completed) fprintf(stderr, "batch ended %s: %s\n", status, hixlGetLastErrorMessage());

    HixlCSLinkStats stats[MAX_LINKS];
    uint32_t count = 0;
    st = HixlCSClientGetLinkStats(client, stats, MAX_LINKS, &count);
    if (st != HIXL_SUCCESS) CsDie("HixlCSClientGetLinkStats", st);
    printf("{\"label\":\"%s\",\"op\":\"%s\",\"links\":%u,\"bytes\":%llu,\"seconds\":%.6f,"
           "\"mb_per_s\":%.1f,\"status\":\"%s\",\"verified\":%s,\"link_bytes\":[",
           label, put ? "put" : "get", nlinks, (unsigned long long)size, secs,
           (double)size / secs / 1e6, status, verified ? "true" : "false");
    for (k = 0; k < count; ++k) printf("%s%llu", k ? "," : "", (unsigned long long)stats[k].bytes);
    printf("],\"link_up\":[");
    for (k = 0; k < count; ++k) printf("%s%d", k ? "," : "", stats[k].up);
    printf("]}\n");
    fflush(stdout);
  }
  HixlCSClientDestroy(client);
  free(descs);
  free(local);
  return rc;
}
