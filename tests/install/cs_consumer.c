/* tests/install/cs_consumer.c: a C99 program built against an installed hixl
 * through pkg-config alone, using HiXL CS (hixl/hixl_cs.h, docs/CS.md) as a
 * user would: in one process a server offers 1 MiB under "kv" on one tcp
 * endpoint at 127.0.0.1:PORT, a client connects over one tcp link, finds
 * "kv" in the server's list, puts two descriptors synchronously, gets them
 * back asynchronously, and checks the bytes and a few refusals.
 *
 *   cs_consumer PORT      (1..65535, a free port)
 *
 * Prints "cs_consumer: OK" and exits 0 when every check passed; otherwise a
 * message on stderr and exit 1. */
#define _POSIX_C_SOURCE 200809L
#include <hixl/hixl_cs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB (1024u * 1024u)
#define HALF (MIB / 2u)

static void Die(const char* what) {
  fprintf(stderr, "cs_consumer: FAILED: %s\n", what);
  fflush(stderr);
  _Exit(1); /* no library teardown from a half-done state */
}

#define TRY(call)                                                                          \
  do {                                                                                     \
    HixlStatus s_ = (call);                                                                \
    if (s_ != HIXL_SUCCESS) {                                                              \
      fprintf(stderr, "cs_consumer: FAILED: %s: %s (%s)\n", #call, hixlGetErrorString(s_), \
              hixlGetLastErrorMessage());                                                  \
      fflush(stderr);                                                                      \
      _Exit(1);                                                                            \
    }                                                                                      \
  } while (0)

#define EXPECT(call, want)                                                     \
  do {                                                                         \
    HixlStatus s_ = (call);                                                    \
    if (s_ != (want)) {                                                        \
      fprintf(stderr, "cs_consumer: FAILED: %s gave %s, expected %s\n", #call, \
              hixlGetErrorString(s_), #want);                                  \
      fflush(stderr);                                                          \
      _Exit(1);                                                                \
    }                                                                          \
  } while (0)

static double NowSeconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static unsigned char Pattern(size_t i, unsigned seed) {
  return (unsigned char)((i * 131u + seed * 7u + (i >> 9)) & 0xffu);
}

static void Fill(unsigned char* p, size_t n, unsigned seed) {
  size_t i;
  for (i = 0; i < n; ++i) p[i] = Pattern(i, seed);
}

/* 1 when p[0..n) holds the pattern of `seed` starting at index `from`. */
static int Holds(const unsigned char* p, size_t n, unsigned seed, size_t from) {
  size_t i;
  for (i = 0; i < n; ++i) {
    if (p[i] != Pattern(from + i, seed)) return 0;
  }
  return 1;
}

static EndpointDesc TcpEndpoint(void) {
  EndpointDesc ep;
  memset(&ep, 0, sizeof ep); /* reserved fields must be zero */
  ep.protocol = COMM_PROTOCOL_TCP;
  ep.location = END_POINT_LOCATION_HOST;
  ep.addr = "127.0.0.1";
  return ep;
}

int main(int argc, char** argv) {
  unsigned char* kv;
  unsigned char* local;
  char* end = NULL;
  unsigned long port;
  EndpointDesc server_ep;
  HixlServerDesc sdesc;
  HixlClientDesc cdesc;
  CommMem mem;
  CommMem* remote = NULL;
  char** tags = NULL;
  uint32_t num = 0;
  HixlServerHandle server = NULL;
  HixlClientHandle client = NULL;
  MemHandle server_mem = NULL, client_mem = NULL;
  HixlOneSideOpDesc ops[2];
  CompleteHandle done = NULL;
  HixlCompleteStatus st = HIXL_COMPLETE_STATUS_WAITING;
  HixlCSLinkStats stats[2];
  uint32_t links = 0;
  struct timespec pause = {0, 200000}; /* 200 us */
  double deadline;

  if (argc != 2) {
    fprintf(stderr, "usage: cs_consumer PORT\n");
    return 2;
  }
  port = strtoul(argv[1], &end, 10);
  if (end == argv[1] || *end != '\0' || port == 0 || port > 65535) Die("PORT must be 1..65535");

  kv = (unsigned char*)malloc(MIB);
  local = (unsigned char*)malloc(MIB);
  if (kv == NULL || local == NULL) Die("out of memory");
  memset(kv, 0, MIB);
  Fill(local, MIB, 1);

  /* The server: one tcp endpoint, listening on PORT; 1 MiB under "kv". */
  server_ep = TcpEndpoint();
  memset(&sdesc, 0, sizeof sdesc);
  sdesc.endpoint_list = &server_ep;
  sdesc.endpoint_list_num = 1;
  sdesc.server_ip = "127.0.0.1";
  sdesc.server_port = (uint32_t)port;
  TRY(HixlCSServerCreate(&sdesc, NULL, &server));
  mem.type = COMM_MEM_TYPE_HOST;
  mem.addr = kv;
  mem.size = MIB;
  TRY(HixlCSServerRegMem(server, "kv", &mem, &server_mem));
  TRY(HixlCSServerListen(server, 16));

  /* The client: one tcp link from 127.0.0.1 to the server's endpoint. */
  memset(&cdesc, 0, sizeof cdesc);
  cdesc.local_endpoint = TcpEndpoint();
  cdesc.remote_endpoint = TcpEndpoint();
  cdesc.server_ip = "127.0.0.1";
  cdesc.server_port = (uint32_t)port;
  TRY(HixlCSClientCreate(&cdesc, NULL, &client));
  mem.addr = local;
  TRY(HixlCSClientRegMem(client, "local", &mem, &client_mem)); /* before Connect */
  TRY(HixlCSClientConnect(client, 5000));

  TRY(HixlCSClientGetRemoteMem(client, &remote, &tags, &num, 1000));
  if (num != 1) Die("the server's list does not hold exactly one region");
  if (tags == NULL || tags[0] == NULL || strcmp(tags[0], "kv") != 0)
    Die("the region is not tagged \"kv\"");
  if (remote == NULL || remote[0].addr != (void*)kv || remote[0].size != MIB) {
    Die("the \"kv\" entry does not describe the server's buffer");
  }

  /* Refusals: list_num 0, a NULL handle, memory registered after Connect. */
  ops[0].remote_buf = remote[0].addr;
  ops[0].local_buf = local;
  ops[0].len = 4096;
  EXPECT(HixlCSClientBatchPutSync(client, 0, ops, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientBatchGetAsync(client, 0, ops, &done), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientBatchPutSync(NULL, 1, ops, 1000), HIXL_PARAM_INVALID);
  {
    static unsigned char late[4096];
    CommMem late_mem;
    MemHandle late_handle = NULL;
    late_mem.type = COMM_MEM_TYPE_HOST;
    late_mem.addr = late;
    late_mem.size = sizeof late;
    EXPECT(HixlCSClientRegMem(client, NULL, &late_mem, &late_handle), HIXL_PARAM_INVALID);
  }

  /* Put, two descriptors: local's halves swapped into kv. */
  ops[0].remote_buf = (char*)remote[0].addr + HALF;
  ops[0].local_buf = local;
  ops[0].len = HALF;
  ops[1].remote_buf = remote[0].addr;
  ops[1].local_buf = local + HALF;
  ops[1].len = HALF;
  TRY(HixlCSClientBatchPutSync(client, 2, ops, 10000));
  if (!Holds(kv + HALF, HALF, 1, 0) || !Holds(kv, HALF, 1, HALF))
    Die("the put left wrong bytes in kv");

  /* Get, asynchronously: kv (a new pattern) into local, halves swapped back. */
  Fill(kv, MIB, 2);
  memset(local, 0, MIB);
  TRY(HixlCSClientBatchGetAsync(client, 2, ops, &done));
  deadline = NowSeconds() + 10.0;
  for (;;) {
    TRY(HixlCSClientQueryCompleteStatus(client, done, &st));
    if (st != HIXL_COMPLETE_STATUS_WAITING) break;
    if (NowSeconds() > deadline) Die("the async get did not end within 10 s");
    nanosleep(&pause, NULL);
  }
  if (st != HIXL_COMPLETE_STATUS_COMPLETED) {
    fprintf(stderr, "cs_consumer: FAILED: the async get ended %d (%s)\n", (int)st,
            hixlGetLastErrorMessage());
    fflush(stderr);
    _Exit(1);
  }
  if (!Holds(local, HALF, 2, HALF) || !Holds(local + HALF, HALF, 2, 0))
    Die("the get brought wrong bytes");
  /* The handle was released by the final status. */
  EXPECT(HixlCSClientQueryCompleteStatus(client, done, &st), HIXL_PARAM_INVALID);

  TRY(HixlCSClientGetLinkStats(client, stats, 2, &links));
  if (links != 1 || stats[0].up != 1 || stats[0].bytes < 2u * MIB)
    Die("the link stats are not as expected");

  TRY(HixlCSClientUnregMem(client, client_mem));
  TRY(HixlCSClientDestroy(client));
  EXPECT(HixlCSClientConnect(client, 1000), HIXL_PARAM_INVALID); /* destroyed handle */
  TRY(HixlCSServerUnregMem(server, server_mem));
  TRY(HixlCSServerDestroy(server));
  EXPECT(HixlCSServerDestroy(server), HIXL_PARAM_INVALID);
  free(local);
  free(kv);
  printf("cs_consumer: OK\n");
  return 0;
}
