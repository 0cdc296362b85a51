/* The HiXL CS C API from C99 (-pedantic-errors): every function and every
 * rule of hixl/hixl_cs.h, in one process (server and clients side by side,
 * over tcp and shm on 127.0.0.1), with the bytes checked. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cs_test_util.h"

static int g_failures = 0;

static void SleepUs(long us) {
  struct timespec ts;
  ts.tv_sec = us / 1000000;
  ts.tv_nsec = (us % 1000000) * 1000;
  nanosleep(&ts, NULL);
}

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              hixlGetLastErrorMessage());                                        \
      ++g_failures;                                                              \
    }                                                                            \
  } while (0)

#define CHECK_ST(expr, want) CHECK((expr) == (want))

#define REGION (1u << 20)

static uint32_t FreePort(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  uint32_t port = 0;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && bind(fd, (struct sockaddr*)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr*)&a, &len) == 0) {
    port = ntohs(a.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

static EndpointDesc Ep(CommProtocol p, const char* addr) {
  EndpointDesc e;
  memset(&e, 0, sizeof(e));
  e.protocol = p;
  e.location = END_POINT_LOCATION_HOST;
  e.addr = addr;
  return e;
}

static void ServerCreateRules(void) {
  EndpointDesc eps[HIXL_CS_MAX_ENDPOINTS + 1];
  HixlServerDesc d;
  HixlServerConfig cfg;
  HixlServerHandle s = NULL;
  int i;
  for (i = 0; i <= HIXL_CS_MAX_ENDPOINTS; ++i) eps[i] = Ep(COMM_PROTOCOL_TCP, "127.0.0.1");
  memset(&d, 0, sizeof(d));
  d.endpoint_list = eps;
  d.endpoint_list_num = 1;
  d.server_ip = "127.0.0.1";
  d.server_port = 1;
  CHECK_ST(HixlCSServerCreate(NULL, NULL, &s), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSServerCreate(&d, NULL, NULL), HIXL_PARAM_INVALID);
  d.endpoint_list_num = 0;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  d.endpoint_list_num = HIXL_CS_MAX_ENDPOINTS + 1;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  d.endpoint_list_num = 1;
  d.endpoint_list = NULL;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  d.endpoint_list = eps;
  d.server_port = 65536;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  d.server_port = 1;
  d.server_ip = "127.0.0.2"; /* not an endpoint's addr */
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  d.server_ip = NULL;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  d.server_ip = "127.0.0.1";
  eps[0].protocol = COMM_PROTOCOL_PCIE; /* a protocol hixl has no transport for */
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_UNSUPPORTED);
  CHECK(strstr(hixlGetLastErrorMessage(), "PCIE") != NULL);
  eps[0].protocol = (CommProtocol)77;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  eps[0].protocol = COMM_PROTOCOL_TCP;
  eps[0].location = END_POINT_LOCATION_DEVICE;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_UNSUPPORTED);
  eps[0].location = END_POINT_LOCATION_HOST;
  eps[0].addr = "localhost"; /* not a literal */
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  eps[0].addr = NULL;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  eps[0].addr = "127.0.0.1";
  eps[0].reserved[3] = 1;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  eps[0].reserved[3] = 0;
  memset(&cfg, 0, sizeof(cfg));
  cfg.global_resource_config = "{not json";
  CHECK_ST(HixlCSServerCreate(&d, &cfg, &s), HIXL_PARAM_INVALID);
  cfg.global_resource_config = "{\"LinkType\":\"TCP\"}"; /* the endpoints decide it */
  CHECK_ST(HixlCSServerCreate(&d, &cfg, &s), HIXL_PARAM_INVALID);
  cfg.global_resource_config = "{\"NoSuchOption\":1}";
  CHECK_ST(HixlCSServerCreate(&d, &cfg, &s), HIXL_PARAM_INVALID);
  cfg.global_resource_config = "{\"HeartbeatIntervalMs\":5}"; /* out of range */
  CHECK_ST(HixlCSServerCreate(&d, &cfg, &s), HIXL_PARAM_INVALID);
  cfg.global_resource_config = NULL;
  cfg.reserved[0] = 1;
  CHECK_ST(HixlCSServerCreate(&d, &cfg, &s), HIXL_PARAM_INVALID);
  CHECK(s == NULL);

  /* Port 0: created and "listening" without a listener. */
  d.server_port = 0;
  CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_SUCCESS);
  CHECK_ST(HixlCSServerListen(s, 16), HIXL_SUCCESS);
  {
    /* Tags: printable ASCII only; the whole list must fit the handshake. */
    static uint8_t slab[HIXL_CS_MAX_MEMS * 64];
    CommMem m = {COMM_MEM_TYPE_HOST, NULL, 64};
    MemHandle h = NULL;
    char tag[HIXL_CS_MAX_TAG_LEN + 1];
    HixlStatus st = HIXL_SUCCESS;
    uint32_t k;
    m.addr = slab;
    CHECK_ST(HixlCSServerRegMem(s, "bad\001tag", &m, &h), HIXL_PARAM_INVALID);
    CHECK_ST(HixlCSServerRegMem(s, "caf\303\251", &m, &h), HIXL_PARAM_INVALID);
    for (k = 0; k < HIXL_CS_MAX_MEMS && st == HIXL_SUCCESS; ++k) {
      memset(tag, '"', sizeof(tag)); /* each escaped as two bytes in the list */
      snprintf(tag + HIXL_CS_MAX_TAG_LEN - 8, 9, "%08u", k);
      m.addr = slab + (size_t)k * 64;
      st = HixlCSServerRegMem(s, tag, &m, &h);
    }
    CHECK_ST(st, HIXL_RESOURCE_EXHAUSTED);
    CHECK(k > 100 && k < HIXL_CS_MAX_MEMS);
  }
  CHECK_ST(HixlCSServerDestroy(s), HIXL_SUCCESS);
  CHECK_ST(HixlCSServerDestroy(s), HIXL_PARAM_INVALID); /* destroyed */
}

static void ClientCreateRules(void) {
  HixlClientDesc d;
  HixlClientHandle c = NULL;
  EndpointDesc ll[2], rl[2];
  memset(&d, 0, sizeof(d));
  d.local_endpoint = Ep(COMM_PROTOCOL_TCP, "127.0.0.1");
  d.remote_endpoint = Ep(COMM_PROTOCOL_TCP, "127.0.0.1");
  d.server_ip = "127.0.0.1";
  d.server_port = 0; /* a client needs 1..65535 */
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_PARAM_INVALID);
  d.server_port = 65536;
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_PARAM_INVALID);
  d.server_port = 5000;
  CHECK_ST(HixlCSClientCreate(NULL, NULL, &c), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientCreate(&d, NULL, NULL), HIXL_PARAM_INVALID);
  d.tc = 256;
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_PARAM_INVALID);
  d.tc = 0;
  d.sl = 16;
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_PARAM_INVALID);
  d.sl = 0;
  d.server_ip = "not-an-ip";
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_PARAM_INVALID);
  d.server_ip = "127.0.0.1";
  d.remote_endpoint.protocol = COMM_PROTOCOL_SHM; /* the two ends differ */
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_PARAM_INVALID);
  d.remote_endpoint.protocol = COMM_PROTOCOL_SIO;
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_UNSUPPORTED);
  d.remote_endpoint.protocol = COMM_PROTOCOL_TCP;
  /* Lists: the single pair must be zero or the first pair. */
  ll[0] = ll[1] = Ep(COMM_PROTOCOL_TCP, "127.0.0.1");
  rl[0] = rl[1] = Ep(COMM_PROTOCOL_TCP, "127.0.0.1");
  rl[1].addr = "127.0.0.2";
  d.endpoint_list_num = 2;
  d.local_endpoint_list = ll;
  d.remote_endpoint_list = NULL;
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_PARAM_INVALID);
  d.remote_endpoint_list = rl;
  d.remote_endpoint.addr = "127.0.0.3";
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_PARAM_INVALID);
  d.remote_endpoint.addr = "127.0.0.1"; /* equal to the first pair */
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_SUCCESS);
  CHECK_ST(HixlCSClientDestroy(c), HIXL_SUCCESS);
  d.endpoint_list_num = HIXL_CS_MAX_ENDPOINTS + 1;
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_PARAM_INVALID);
}

/* A server with a tcp and an shm endpoint on 127.0.0.1 offering two regions. */
static HixlServerHandle StartServer(uint8_t* a, uint8_t* b, uint32_t* port_out) {
  EndpointDesc eps[2];
  HixlServerDesc d;
  HixlServerHandle s = NULL;
  MemHandle ha = NULL, hb = NULL, hx = NULL;
  CommMem ma = {COMM_MEM_TYPE_HOST, NULL, REGION};
  CommMem mb = {COMM_MEM_TYPE_HOST, NULL, REGION};
  CommMem bad;
  char long_tag[HIXL_CS_MAX_TAG_LEN + 2];
  int attempt;
  ma.addr = a;
  mb.addr = b;
  eps[0] = Ep(COMM_PROTOCOL_TCP, "127.0.0.1");
  eps[1] = Ep(COMM_PROTOCOL_SHM, "127.0.0.1");
  for (attempt = 0; attempt < 5; ++attempt) {
    memset(&d, 0, sizeof(d));
    d.endpoint_list = eps;
    d.endpoint_list_num = 2;
    d.server_ip = "127.0.0.1";
    d.server_port = FreePort();
    CHECK_ST(HixlCSServerCreate(&d, NULL, &s), HIXL_SUCCESS);
    if (attempt == 0) {
      /* RegMem rules */
      CHECK_ST(HixlCSServerRegMem(s, NULL, &ma, &ha), HIXL_PARAM_INVALID);
      CHECK_ST(HixlCSServerRegMem(s, "", &ma, &ha), HIXL_PARAM_INVALID);
      memset(long_tag, 'x', sizeof(long_tag) - 1);
      long_tag[sizeof(long_tag) - 1] = '\0';
      CHECK_ST(HixlCSServerRegMem(s, long_tag, &ma, &ha), HIXL_PARAM_INVALID);
      CHECK_ST(HixlCSServerRegMem(s, "a", NULL, &ha), HIXL_PARAM_INVALID);
      CHECK_ST(HixlCSServerRegMem(s, "a", &ma, NULL), HIXL_PARAM_INVALID);
      bad = ma;
      bad.type = COMM_MEM_TYPE_DEVICE;
      CHECK_ST(HixlCSServerRegMem(s, "a", &bad, &ha), HIXL_UNSUPPORTED);
      bad = ma;
      bad.size = 0;
      CHECK_ST(HixlCSServerRegMem(s, "a", &bad, &ha), HIXL_PARAM_INVALID);
      CHECK_ST(HixlCSServerRegMem(NULL, "a", &ma, &ha), HIXL_PARAM_INVALID);
      CHECK_ST(HixlCSServerListen(s, 0), HIXL_PARAM_INVALID);
    }
    CHECK_ST(HixlCSServerRegMem(s, "a", &ma, &ha), HIXL_SUCCESS);
    CHECK_ST(HixlCSServerRegMem(s, "a", &mb, &hx), HIXL_PARAM_INVALID); /* tag taken */
    bad = ma;
    bad.addr = a + 16; /* overlaps "a" */
    bad.size = 16;
    CHECK_ST(HixlCSServerRegMem(s, "c", &bad, &hx), HIXL_PARAM_INVALID);
    if (HixlCSServerListen(s, 16) == HIXL_SUCCESS) {
      /* After Listen: registered at once, seen by clients that connect later. */
      CHECK_ST(HixlCSServerRegMem(s, "b", &mb, &hb), HIXL_SUCCESS);
      CHECK_ST(HixlCSServerListen(s, 16), HIXL_PARAM_INVALID); /* once */
      CHECK_ST(HixlCSServerUnregMem(s, NULL), HIXL_PARAM_INVALID);
      *port_out = d.server_port;
      return s;
    }
    fprintf(stderr, "Listen on %u failed (%s); another port\n", d.server_port, hixlGetLastErrorMessage());
    HixlCSServerDestroy(s);
    s = NULL;
  }
  CHECK(s != NULL);
  return NULL;
}

static HixlClientHandle MakeClient(CommProtocol p, uint32_t port, uint8_t* local, MemHandle* mh) {
  HixlClientDesc d;
  HixlClientHandle c = NULL;
  CommMem m = {COMM_MEM_TYPE_HOST, NULL, REGION};
  m.addr = local;
  memset(&d, 0, sizeof(d));
  d.local_endpoint = Ep(p, "127.0.0.1");
  d.remote_endpoint = Ep(p, "127.0.0.1");
  d.server_ip = "127.0.0.1";
  d.server_port = port;
  CHECK_ST(HixlCSClientCreate(&d, NULL, &c), HIXL_SUCCESS);
  CHECK_ST(HixlCSClientRegMem(c, "local", &m, mh), HIXL_SUCCESS);
  return c;
}

static void Transfers(CommProtocol p, uint32_t port, uint8_t* a, uint8_t* b) {
  uint8_t* local = (uint8_t*)calloc(1, REGION);
  uint8_t* other = (uint8_t*)calloc(1, REGION);
  MemHandle mh = NULL, mh2 = NULL;
  HixlClientHandle c = MakeClient(p, port, local, &mh);
  HixlClientHandle c2 = NULL;
  CommMem* list = NULL;
  char** tags = NULL;
  uint32_t n = 0, i, count = 0;
  HixlOneSideOpDesc desc[2];
  CompleteHandle h = NULL;
  HixlCompleteStatus cs = HIXL_COMPLETE_STATUS_WAITING;
  CommMem late = {COMM_MEM_TYPE_HOST, NULL, 64};
  HixlCSLinkStats stats[4];
  static CompleteHandle many[HIXL_CS_MAX_ASYNC_BATCHES + 1];

  /* Before Connect */
  CHECK_ST(HixlCSClientGetRemoteMem(c, &list, &tags, &n, 100), HIXL_NOT_CONNECTED);
  desc[0].local_buf = local;
  desc[0].remote_buf = a;
  desc[0].len = 64;
  CHECK_ST(HixlCSClientBatchPutSync(c, 1, desc, 1000), HIXL_NOT_CONNECTED);
  CHECK_ST(HixlCSClientConnect(c, 0), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientConnect(NULL, 1000), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientConnect(c, 5000), HIXL_SUCCESS);
  CHECK_ST(HixlCSClientConnect(c, 5000), HIXL_PARAM_INVALID); /* once */
  late.addr = other;
  CHECK_ST(HixlCSClientRegMem(c, NULL, &late, &mh2), HIXL_PARAM_INVALID); /* after Connect */

  CHECK_ST(HixlCSClientGetRemoteMem(c, NULL, &tags, &n, 100), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientGetRemoteMem(c, &list, &tags, &n, 100), HIXL_SUCCESS);
  CHECK(n == 2);
  if (n == 2) {
    CHECK(strcmp(tags[0], "a") == 0 && list[0].addr == a && list[0].size == REGION);
    CHECK(strcmp(tags[1], "b") == 0 && list[1].addr == b && list[1].size == REGION);
    CHECK(list[0].type == COMM_MEM_TYPE_HOST);
  }

  /* Descriptor rules: nothing moves when one is wrong. */
  CHECK_ST(HixlCSClientBatchPutSync(c, 0, desc, 1000), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientBatchPutSync(c, 1, NULL, 1000), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientBatchPutSync(c, 1, desc, 0), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientBatchPutAsync(c, 0, desc, &h), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientBatchGetAsync(c, 1, desc, NULL), HIXL_PARAM_INVALID);
  desc[1].local_buf = local + REGION - 8;
  desc[1].remote_buf = a;
  desc[1].len = 16; /* local end outside */
  memset(a, 0x5a, 64);
  memset(local, 0x11, 64);
  CHECK_ST(HixlCSClientBatchPutSync(c, 2, desc, 1000), HIXL_PARAM_INVALID);
  CHECK(strstr(hixlGetLastErrorMessage(), "desc_list[1]") != NULL);
  CHECK(a[0] == 0x5a); /* descriptor 0 did not move either */
  desc[1].local_buf = local;
  desc[1].remote_buf = a + REGION - 8; /* remote end outside */
  CHECK_ST(HixlCSClientBatchGetSync(c, 2, desc, 1000), HIXL_PARAM_INVALID);
  desc[1].remote_buf = a;
  desc[1].len = 0;
  CHECK_ST(HixlCSClientBatchGetSync(c, 2, desc, 1000), HIXL_PARAM_INVALID);

  /* Put then get, sync, both regions, bytes checked. */
  CsFill(local, REGION, 7);
  desc[0].local_buf = local;
  desc[0].remote_buf = a;
  desc[0].len = REGION / 2;
  desc[1].local_buf = local + REGION / 2;
  desc[1].remote_buf = b + REGION / 2;
  desc[1].len = REGION / 2;
  CHECK_ST(HixlCSClientBatchPutSync(c, 2, desc, 10000), HIXL_SUCCESS);
  CHECK(memcmp(a, local, REGION / 2) == 0);
  CHECK(memcmp(b + REGION / 2, local + REGION / 2, REGION / 2) == 0);
  memset(local, 0, REGION);
  CHECK_ST(HixlCSClientBatchGetSync(c, 2, desc, 10000), HIXL_SUCCESS);
  CHECK(CsFirstMismatch(local, REGION, 7) == REGION);

  /* Async put and get. */
  CsFill(a, REGION, 9);
  memset(local, 0, REGION);
  desc[0].len = REGION;
  CHECK_ST(HixlCSClientBatchGetAsync(c, 1, desc, &h), HIXL_SUCCESS);
  for (i = 0; i < 100000 && cs == HIXL_COMPLETE_STATUS_WAITING; ++i) {
    CHECK_ST(HixlCSClientQueryCompleteStatus(c, h, &cs), HIXL_SUCCESS);
    if (cs == HIXL_COMPLETE_STATUS_WAITING) SleepUs(100);
  }
  CHECK(cs == HIXL_COMPLETE_STATUS_COMPLETED);
  CHECK(CsFirstMismatch(local, REGION, 9) == REGION);
  CHECK_ST(HixlCSClientQueryCompleteStatus(c, h, &cs), HIXL_PARAM_INVALID); /* reported once */
  CsFill(local, REGION, 10);
  CHECK_ST(HixlCSClientBatchPutAsync(c, 1, desc, &h), HIXL_SUCCESS);
  CHECK_ST(HixlCSClientQueryCompleteStatus(c, h, NULL), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientQueryCompleteStatus(c, NULL, &cs), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientUnregMem(c, mh), HIXL_PARAM_INVALID); /* a batch is not queried to its end */
  cs = HIXL_COMPLETE_STATUS_WAITING;
  for (i = 0; i < 100000 && cs == HIXL_COMPLETE_STATUS_WAITING; ++i) {
    CHECK_ST(HixlCSClientQueryCompleteStatus(c, h, &cs), HIXL_SUCCESS);
    if (cs == HIXL_COMPLETE_STATUS_WAITING) SleepUs(100);
  }
  CHECK(cs == HIXL_COMPLETE_STATUS_COMPLETED);
  CHECK(CsFirstMismatch(a, REGION, 10) == REGION);

  /* A second client: handles are not shared between clients. */
  c2 = MakeClient(p, port, other, &mh2);
  CHECK_ST(HixlCSClientConnect(c2, 5000), HIXL_SUCCESS);
  CHECK_ST(HixlCSClientBatchGetAsync(c, 1, desc, &h), HIXL_SUCCESS);
  CHECK_ST(HixlCSClientQueryCompleteStatus(c2, h, &cs), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientUnregMem(c2, mh), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientUnregMem(c, h), HIXL_PARAM_INVALID); /* not a memory handle */
  cs = HIXL_COMPLETE_STATUS_WAITING;
  for (i = 0; i < 100000 && cs == HIXL_COMPLETE_STATUS_WAITING; ++i) {
    CHECK_ST(HixlCSClientQueryCompleteStatus(c, h, &cs), HIXL_SUCCESS);
    if (cs == HIXL_COMPLETE_STATUS_WAITING) SleepUs(100);
  }
  CHECK(cs == HIXL_COMPLETE_STATUS_COMPLETED);

  /* At most HIXL_CS_MAX_ASYNC_BATCHES unqueried async batches. */
  desc[0].len = 8;
  for (i = 0; i < HIXL_CS_MAX_ASYNC_BATCHES; ++i) {
    if (HixlCSClientBatchGetAsync(c, 1, desc, &many[i]) != HIXL_SUCCESS) break;
  }
  CHECK(i == HIXL_CS_MAX_ASYNC_BATCHES);
  CHECK_ST(HixlCSClientBatchGetAsync(c, 1, desc, &many[HIXL_CS_MAX_ASYNC_BATCHES]),
           HIXL_RESOURCE_EXHAUSTED);
  for (i = 0; i < HIXL_CS_MAX_ASYNC_BATCHES; ++i) {
    uint32_t spins = 0;
    cs = HIXL_COMPLETE_STATUS_WAITING;
    while (cs == HIXL_COMPLETE_STATUS_WAITING && spins++ < 100000) {
      if (HixlCSClientQueryCompleteStatus(c, many[i], &cs) != HIXL_SUCCESS) break;
      if (cs == HIXL_COMPLETE_STATUS_WAITING) SleepUs(50);
    }
    CHECK(cs == HIXL_COMPLETE_STATUS_COMPLETED);
    if (cs != HIXL_COMPLETE_STATUS_COMPLETED) break;
  }
  CHECK_ST(HixlCSClientBatchGetAsync(c, 1, desc, &h), HIXL_SUCCESS); /* room again */
  cs = HIXL_COMPLETE_STATUS_WAITING;
  for (i = 0; i < 100000 && cs == HIXL_COMPLETE_STATUS_WAITING; ++i) {
    CHECK_ST(HixlCSClientQueryCompleteStatus(c, h, &cs), HIXL_SUCCESS);
    if (cs == HIXL_COMPLETE_STATUS_WAITING) SleepUs(100);
  }

  /* Link stats */
  CHECK_ST(HixlCSClientGetLinkStats(c, NULL, 0, &count), HIXL_RESOURCE_EXHAUSTED);
  CHECK(count == 1);
  CHECK_ST(HixlCSClientGetLinkStats(c, stats, 4, &count), HIXL_SUCCESS);
  CHECK(count == 1 && stats[0].up == 1 && stats[0].bytes >= 3 * (uint64_t)REGION);
  CHECK(stats[0].protocol == p);

  CHECK_ST(HixlCSClientUnregMem(c, mh), HIXL_SUCCESS);
  CHECK_ST(HixlCSClientUnregMem(c, mh), HIXL_PARAM_INVALID); /* twice */
  CHECK_ST(HixlCSClientDestroy(c), HIXL_SUCCESS);
  CHECK_ST(HixlCSClientDestroy(c), HIXL_PARAM_INVALID);
  CHECK_ST(HixlCSClientBatchPutSync(c, 1, desc, 1000), HIXL_PARAM_INVALID); /* destroyed */
  CHECK_ST(HixlCSClientDestroy(c2), HIXL_SUCCESS);
  free(local);
  free(other);
}

/* The server goes away under a client: its transfers fail, none hangs. */
static void ServerDestroyedUnderClient(void) {
  uint8_t* a = (uint8_t*)calloc(1, REGION);
  uint8_t* b = (uint8_t*)calloc(1, REGION);
  uint8_t* local = (uint8_t*)calloc(1, REGION);
  uint32_t port = 0, i;
  HixlServerHandle s = StartServer(a, b, &port);
  MemHandle mh = NULL;
  HixlClientHandle c;
  HixlOneSideOpDesc desc;
  CompleteHandle h = NULL;
  HixlCompleteStatus cs = HIXL_COMPLETE_STATUS_WAITING;
  HixlStatus st;
  if (s == NULL) return;
  c = MakeClient(COMM_PROTOCOL_TCP, port, local, &mh);
  CHECK_ST(HixlCSClientConnect(c, 5000), HIXL_SUCCESS);
  desc.local_buf = local;
  desc.remote_buf = a;
  desc.len = REGION;
  CHECK_ST(HixlCSClientBatchPutAsync(c, 1, &desc, &h), HIXL_SUCCESS);
  CHECK_ST(HixlCSServerDestroy(s), HIXL_SUCCESS);
  for (i = 0; i < 200000 && cs == HIXL_COMPLETE_STATUS_WAITING; ++i) {
    CHECK_ST(HixlCSClientQueryCompleteStatus(c, h, &cs), HIXL_SUCCESS);
    if (cs == HIXL_COMPLETE_STATUS_WAITING) SleepUs(100);
  }
  CHECK(cs != HIXL_COMPLETE_STATUS_WAITING); /* ended (either way) */
  st = HixlCSClientBatchPutSync(c, 1, &desc, 20000);
  CHECK(st != HIXL_SUCCESS && st != HIXL_TIMEOUT); /* failed at once, did not wait */
  cs = HIXL_COMPLETE_STATUS_WAITING;
  st = HixlCSClientBatchGetAsync(c, 1, &desc, &h);
  if (st == HIXL_SUCCESS) {
    for (i = 0; i < 200000 && cs == HIXL_COMPLETE_STATUS_WAITING; ++i) {
      CHECK_ST(HixlCSClientQueryCompleteStatus(c, h, &cs), HIXL_SUCCESS);
      if (cs == HIXL_COMPLETE_STATUS_WAITING) SleepUs(100);
    }
    CHECK(cs == HIXL_COMPLETE_STATUS_FAILED);
  }
  CHECK_ST(HixlCSClientDestroy(c), HIXL_SUCCESS);
  free(a);
  free(b);
  free(local);
}

/* A client destroyed while another thread transfers on it: that thread's
 * calls fail (FAILED, or PARAM_INVALID once the handle is gone); nothing
 * crashes or hangs. */
struct Mover {
  HixlClientHandle client;
  HixlOneSideOpDesc desc;
  pthread_mutex_t mu; /* guards the counters */
  int calls, ok, failed, invalid;
};

static int MoverOk(struct Mover* m) {
  int ok;
  pthread_mutex_lock(&m->mu);
  ok = m->ok;
  pthread_mutex_unlock(&m->mu);
  return ok;
}

static void* Move(void* arg) {
  struct Mover* m = (struct Mover*)arg;
  int i;
  for (i = 0; i < 100000; ++i) {
    HixlStatus st = (i % 2) ? HixlCSClientBatchPutSync(m->client, 1, &m->desc, 10000)
                            : HixlCSClientBatchGetSync(m->client, 1, &m->desc, 10000);
    pthread_mutex_lock(&m->mu);
    ++m->calls;
    if (st == HIXL_SUCCESS) ++m->ok;
    else if (st == HIXL_PARAM_INVALID) ++m->invalid;
    else ++m->failed;
    pthread_mutex_unlock(&m->mu);
    if (st == HIXL_PARAM_INVALID) break; /* the handle is gone */
  }
  return NULL;
}

static void ClientDestroyedUnderTransfers(CommProtocol p) {
  uint8_t* a = (uint8_t*)calloc(1, REGION);
  uint8_t* b = (uint8_t*)calloc(1, REGION);
  uint8_t* local = (uint8_t*)calloc(1, REGION);
  uint32_t port = 0;
  HixlServerHandle s = StartServer(a, b, &port);
  MemHandle mh = NULL;
  struct Mover m;
  pthread_t t;
  if (s == NULL) return;
  memset(&m, 0, sizeof(m));
  pthread_mutex_init(&m.mu, NULL);
  m.client = MakeClient(p, port, local, &mh);
  CHECK_ST(HixlCSClientConnect(m.client, 5000), HIXL_SUCCESS);
  m.desc.local_buf = local;
  m.desc.remote_buf = a;
  m.desc.len = REGION;
  CHECK(pthread_create(&t, NULL, Move, &m) == 0);
  while (MoverOk(&m) < 3) SleepUs(1000);
  CHECK_ST(HixlCSClientDestroy(m.client), HIXL_SUCCESS);
  pthread_join(t, NULL);
  CHECK(m.invalid == 1); /* ended by the dead handle */
  fprintf(stderr, "destroyed under transfers: %d calls, %d ok, %d failed\n", m.calls, m.ok, m.failed);
  CHECK_ST(HixlCSServerDestroy(s), HIXL_SUCCESS);
  pthread_mutex_destroy(&m.mu);
  free(a);
  free(b);
  free(local);
}

int main(void) {
  uint8_t* a = (uint8_t*)calloc(1, REGION);
  uint8_t* b = (uint8_t*)calloc(1, REGION);
  uint8_t* extra = (uint8_t*)calloc(1, 4096);
  uint32_t port = 0;
  HixlServerHandle s;
  MemHandle hb = NULL;
  CommMem mb = {COMM_MEM_TYPE_HOST, NULL, REGION};

  ServerCreateRules();
  ClientCreateRules();
  s = StartServer(a, b, &port);
  if (s != NULL) {
    fprintf(stderr, "tcp\n");
    Transfers(COMM_PROTOCOL_TCP, port, a, b);
    fprintf(stderr, "shm\n");
    Transfers(COMM_PROTOCOL_SHM, port, a, b);
    fprintf(stderr, "hccs\n");
    Transfers(COMM_PROTOCOL_HCCS, port, a, b);
    /* UnregMem: the tag and the range are free again afterwards. */
    mb.addr = b;
    CHECK_ST(HixlCSServerRegMem(s, "b", &mb, &hb), HIXL_PARAM_INVALID); /* registered */
    mb.addr = extra;
    mb.size = 4096;
    CHECK_ST(HixlCSServerRegMem(s, "c", &mb, &hb), HIXL_SUCCESS);
    CHECK_ST(HixlCSServerUnregMem(s, hb), HIXL_SUCCESS);
    CHECK_ST(HixlCSServerUnregMem(s, hb), HIXL_PARAM_INVALID); /* twice */
    CHECK_ST(HixlCSServerRegMem(s, "c", &mb, &hb), HIXL_SUCCESS);
    CHECK_ST(HixlCSServerDestroy(s), HIXL_SUCCESS);
    CHECK_ST(HixlCSServerRegMem(s, "z", &mb, &hb), HIXL_PARAM_INVALID); /* destroyed */
  }
  ServerDestroyedUnderClient();
  ClientDestroyedUnderTransfers(COMM_PROTOCOL_TCP);
  ClientDestroyedUnderTransfers(COMM_PROTOCOL_SHM);
  free(a);
  free(b);
  free(extra);
  if (g_failures != 0) {
    fprintf(stderr, "cs_api_test: %d check(s) failed\n", g_failures);
    return 1;
  }
  printf("cs_api_test: all checks passed\n");
  return 0;
}
