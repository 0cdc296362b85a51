/* tests/capi/c_api_test.c — the C API used from a real C99 file (compiled by
 * the C compiler): two engines in this process, one registers memory and
 * serializes its handle, the other deserializes it and WRITEs and READs
 * through it, blocking, async and batched; notifications (round trip, a full
 * queue, partial hixlGetNotifies, a transfer that carries one); cancelling;
 * a handle of an engine restarted on the same port; then a few bad calls.
 * Exit 0 on success. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hixl/hixl.h"

static int failures = 0;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              hixlGetLastErrorMessage());                                                      \
      failures++;                                                                              \
    }                                                                                          \
  } while (0)

#define CHECK_STATUS(expected, call)                                                            \
  do {                                                                                          \
    HixlStatus s_ = (call);                                                                     \
    if (s_ != (expected)) {                                                                     \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__, __LINE__, #call,   \
              hixlGetErrorString(s_), hixlGetErrorString(expected), hixlGetLastErrorMessage()); \
      failures++;                                                                               \
    }                                                                                           \
  } while (0)

/* port < 0: client-only; queue_depth > 0 sets HIXL_OPTION_NOTIFY_QUEUE_DEPTH. */
static HixlEngine make_engine_on(int port, int queue_depth) {
  HixlConfig cfg = NULL;
  HixlEngine engine = NULL;
  CHECK_STATUS(HIXL_SUCCESS, hixlCreateConfig(&cfg));
  CHECK_STATUS(HIXL_SUCCESS, hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, "127.0.0.1"));
  if (port >= 0) CHECK_STATUS(HIXL_SUCCESS, hixlConfigSetInt(cfg, HIXL_OPTION_LOCAL_PORT, port));
  if (queue_depth > 0) {
    CHECK_STATUS(HIXL_SUCCESS, hixlConfigSetInt(cfg, HIXL_OPTION_NOTIFY_QUEUE_DEPTH, queue_depth));
  }
  CHECK_STATUS(HIXL_SUCCESS, hixlConfigSetString(cfg, HIXL_OPTION_GLOBAL_RESOURCE_CONFIG,
                                                 "{\"CopyThreads\":\"2\"}"));
  CHECK_STATUS(HIXL_SUCCESS, hixlCreateEngine(cfg, &engine));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyConfig(cfg));
  return engine;
}

static HixlEngine make_engine(int listen) { return make_engine_on(listen ? 0 : -1, 0); }

static int port_of(HixlEngine e) {
  const char* a = hixlGetLocalEngine(e);
  const char* colon = a != NULL ? strrchr(a, ':') : NULL;
  return colon != NULL ? atoi(colon + 1) : -1;
}

static HixlNotify notes[8];

/* Notifications between two engines of this process. */
static void test_notifications(void) {
  HixlEngine rx = make_engine_on(0, 3);
  HixlEngine tx = make_engine(1);
  const char* to;
  size_t count = 99;
  char too_long[HIXL_MAX_NOTIFY_LEN + 2];
  if (rx == NULL || tx == NULL) return;
  to = hixlGetLocalEngine(rx);

  /* Round trip: exact bytes (a NUL inside), exact lengths, the sender. */
  CHECK_STATUS(HIXL_SUCCESS, hixlSendNotify(tx, to, "ready", "a\0b", 3, 2000));
  CHECK_STATUS(HIXL_SUCCESS, hixlGetNotifies(rx, notes, 8, &count));
  CHECK(count == 1);
  CHECK(strcmp(notes[0].name, "ready") == 0 && notes[0].name_len == 5);
  CHECK(notes[0].msg_len == 3 && memcmp(notes[0].msg, "a\0b", 4) == 0);
  CHECK(strcmp(notes[0].from, hixlGetLocalEngine(tx)) == 0);
  CHECK_STATUS(HIXL_SUCCESS, hixlGetNotifies(rx, notes, 8, &count));
  CHECK(count == 0);

  /* A full queue (depth 3): the fourth is refused; takes of 2 then the rest. */
  CHECK_STATUS(HIXL_SUCCESS, hixlSendNotify(tx, to, "n1", NULL, 0, 2000));
  CHECK_STATUS(HIXL_SUCCESS, hixlSendNotify(tx, to, "n2", NULL, 0, 2000));
  CHECK_STATUS(HIXL_SUCCESS, hixlSendNotify(tx, to, "n3", NULL, 0, 2000));
  CHECK_STATUS(HIXL_RESOURCE_EXHAUSTED, hixlSendNotify(tx, to, "n4", NULL, 0, 2000));
  CHECK_STATUS(HIXL_SUCCESS, hixlGetNotifies(rx, notes, 2, &count));
  CHECK(count == 2 && strcmp(notes[0].name, "n1") == 0 && strcmp(notes[1].name, "n2") == 0);
  CHECK_STATUS(HIXL_SUCCESS, hixlSendNotify(tx, to, "n5", "x", 1, 2000));
  CHECK_STATUS(HIXL_SUCCESS, hixlGetNotifies(rx, notes, 8, &count));
  CHECK(count == 2 && strcmp(notes[0].name, "n3") == 0 && strcmp(notes[1].name, "n5") == 0);
  CHECK(notes[1].msg_len == 1 && notes[1].msg[0] == 'x' && notes[1].msg[1] == '\0');

  /* Bad input. */
  memset(too_long, 'x', sizeof too_long);
  too_long[sizeof too_long - 1] = '\0';
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlSendNotify(NULL, to, "n", "m", 1, 1000));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlSendNotify(tx, NULL, "n", "m", 1, 1000));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlSendNotify(tx, to, NULL, "m", 1, 1000));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlSendNotify(tx, to, too_long, "m", 1, 1000));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlSendNotify(tx, to, "n", NULL, 5, 1000));
  CHECK_STATUS(HIXL_PARAM_INVALID,
               hixlSendNotify(tx, to, "n", too_long, HIXL_MAX_NOTIFY_LEN + 1, 1000));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlSendNotify(tx, to, "n", "m", 1, 0));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlGetNotifies(NULL, notes, 8, &count));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlGetNotifies(rx, NULL, 8, &count));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlGetNotifies(rx, notes, 0, &count));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlGetNotifies(rx, notes, 8, NULL));
  CHECK_STATUS(HIXL_SUCCESS, hixlGetNotifies(rx, notes, 8, &count));
  CHECK(count == 0);

  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyEngine(tx));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyEngine(rx));
}

/* An engine restarted on the same port: its old handles are refused, new
 * ones work. */
static void test_restart(void) {
  enum { kLen = 4096 };
  static unsigned char old_mem[kLen], new_mem[kLen], src[kLen];
  HixlEngine first = make_engine(1), second = NULL, init = make_engine(0);
  HixlMemHandle h = NULL, stale = NULL, fresh = NULL;
  char old_str[512];
  int port, i;
  HixlStatus s = HIXL_SUCCESS;
  if (first == NULL || init == NULL) return;
  port = port_of(first);
  memset(src, 0x42, sizeof src);
  CHECK_STATUS(HIXL_SUCCESS, hixlRegisterMemory(first, old_mem, kLen, HIXL_MEM_PERM_WRITE, &h));
  if (hixlMemHandleSerialize(h) == NULL) return;
  strncpy(old_str, hixlMemHandleSerialize(h), sizeof old_str - 1);
  old_str[sizeof old_str - 1] = '\0';
  CHECK(strstr(old_str, ";g=") != NULL);
  CHECK_STATUS(HIXL_SUCCESS, hixlMemHandleDeserialize(init, old_str, &stale));
  CHECK(strcmp(hixlMemHandleGetEngine(stale), hixlGetLocalEngine(first)) == 0);
  CHECK_STATUS(HIXL_SUCCESS, hixlWriteRemote(init, src, kLen, stale, 0, NULL));
  CHECK(old_mem[0] == 0x42);
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyEngine(first));
  second = make_engine_on(port, 0);
  if (second == NULL) return;
  CHECK(port_of(second) == port);
  CHECK_STATUS(HIXL_SUCCESS, hixlRegisterMemory(second, new_mem, kLen, HIXL_MEM_PERM_WRITE, &h));
  /* Bounded: the initiator notices the old link closed, then reconnects. */
  for (i = 0; i < 500; ++i) {
    struct timespec ten_ms = {0, 10 * 1000 * 1000};
    s = hixlWriteRemote(init, src, 16, stale, 0, NULL);
    if (s != HIXL_SUCCESS) break;
    nanosleep(&ten_ms, NULL);
  }
  CHECK_STATUS(HIXL_PARAM_INVALID, s);
  CHECK(strstr(hixlGetLastErrorMessage(), "restarted") != NULL);
  CHECK(new_mem[0] == 0);
  CHECK_STATUS(HIXL_SUCCESS, hixlMemHandleDeserialize(init, hixlMemHandleSerialize(h), &fresh));
  CHECK_STATUS(HIXL_SUCCESS, hixlWriteRemote(init, src, kLen, fresh, 0, NULL));
  CHECK(new_mem[0] == 0x42 && new_mem[kLen - 1] == 0x42);
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyEngine(init));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyEngine(second));
}

int main(void) {
  enum { kSize = 1 << 20 };
  unsigned char* target = NULL;
  unsigned char* src = (unsigned char*)malloc(kSize);
  unsigned char* back = (unsigned char*)calloc(1, kSize);
  HixlEngine decode = make_engine(1);
  HixlEngine prefill = make_engine(0);
  HixlMemHandle mine = NULL, theirs = NULL;
  HixlRequest req = NULL;
  HixlTransferDesc descs[4];
  const char* str;
  char* copy;
  size_t i;

  if (decode == NULL || prefill == NULL || src == NULL || back == NULL) return 1;
  for (i = 0; i < kSize; ++i) src[i] = (unsigned char)(i * 7 + 3);

  /* Decode side: engine-allocated shareable memory, registered for peers. */
  CHECK_STATUS(HIXL_SUCCESS, hixlAllocMemory(decode, kSize, (void**)&target));
  CHECK(target != NULL);
  CHECK_STATUS(HIXL_SUCCESS, hixlRegisterMemory(decode, target, kSize,
                                                HIXL_MEM_PERM_READ | HIXL_MEM_PERM_WRITE, &mine));
  str = hixlMemHandleSerialize(mine);
  CHECK(str != NULL && strlen(str) > 0);
  if (str == NULL) return 1;
  copy = (char*)malloc(strlen(str) + 1);
  strcpy(copy, str);

  /* Prefill side: the string arrives over some control plane. */
  CHECK_STATUS(HIXL_SUCCESS, hixlMemHandleDeserialize(prefill, copy, &theirs));
  CHECK(hixlMemHandleGetSize(theirs) == kSize);

  /* Blocking write of the whole buffer. */
  CHECK_STATUS(HIXL_SUCCESS, hixlWriteRemote(prefill, src, kSize, theirs, 0, &req));
  CHECK(req != NULL && req->request_id != 0);
  CHECK_STATUS(HIXL_SUCCESS, hixlWaitRequest(prefill, req, HIXL_WAIT_FOREVER));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyRequest(req));
  CHECK(memcmp(src, target, kSize) == 0);

  /* Async read back. */
  req = NULL;
  CHECK_STATUS(HIXL_SUCCESS, hixlReadRemoteAsync(prefill, back, kSize, theirs, 0, &req));
  CHECK_STATUS(HIXL_SUCCESS, hixlWaitRequest(prefill, req, 10000));
  CHECK_STATUS(HIXL_SUCCESS, hixlPollRequest(prefill, req));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyRequest(req));
  CHECK(memcmp(src, back, kSize) == 0);
  /* Polled after destroy: an error, not a crash. */
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlPollRequest(prefill, req));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlDestroyRequest(req));

  /* Batch: four 4 KiB pieces at offsets 0, 8K, 16K, 24K, written async. */
  memset(target, 0, kSize);
  for (i = 0; i < 4; ++i) {
    descs[i].local = src + i * 4096;
    descs[i].remote = theirs;
    descs[i].remote_offset = i * 8192;
    descs[i].size = 4096;
  }
  req = NULL;
  CHECK_STATUS(HIXL_SUCCESS, hixlTransferBatchAsync(prefill, HIXL_OP_WRITE, descs, 4, &req));
  CHECK_STATUS(HIXL_SUCCESS, hixlWaitRequest(prefill, req, HIXL_WAIT_FOREVER));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyRequest(req));
  for (i = 0; i < 4; ++i) CHECK(memcmp(target + i * 8192, src + i * 4096, 4096) == 0);
  CHECK(target[4096] == 0);

  /* A batch that carries a notification: once the target sees it, the bytes
   * are in place. */
  {
    HixlTransferOptions opt;
    size_t count = 0;
    memset(&opt, 0, sizeof opt);
    memset(target, 0, kSize);
    opt.notify_name = "batch/done";
    opt.notify_msg = "4";
    opt.notify_msg_len = 1;
    opt.timeout_ms = 10000;
    req = NULL;
    CHECK_STATUS(HIXL_SUCCESS,
                 hixlTransferBatchEx(prefill, HIXL_OP_WRITE, descs, 4, &opt, 1, &req));
    CHECK_STATUS(HIXL_SUCCESS, hixlWaitRequest(prefill, req, HIXL_WAIT_FOREVER));
    CHECK_STATUS(HIXL_SUCCESS, hixlDestroyRequest(req));
    CHECK_STATUS(HIXL_SUCCESS, hixlGetNotifies(decode, notes, 8, &count));
    CHECK(count == 1 && strcmp(notes[0].name, "batch/done") == 0 && notes[0].msg[0] == '4');
    for (i = 0; i < 4; ++i) CHECK(memcmp(target + i * 8192, src + i * 4096, 4096) == 0);
    /* To the engine a handle names. */
    CHECK_STATUS(HIXL_SUCCESS,
                 hixlSendNotify(prefill, hixlMemHandleGetEngine(theirs), "hi", NULL, 0, 2000));
    CHECK_STATUS(HIXL_SUCCESS, hixlGetNotifies(decode, notes, 8, &count));
    CHECK(count == 1 && strcmp(notes[0].name, "hi") == 0 && notes[0].msg_len == 0);
    opt.timeout_ms = -1;
    CHECK_STATUS(HIXL_PARAM_INVALID,
                 hixlTransferBatchEx(prefill, HIXL_OP_WRITE, descs, 4, &opt, 0, NULL));
    /* On a stream: NULL is hixlTransferBatchEx (streams themselves:
     * tests/device/device_capi_test.cc, against the fake driver). */
    memset(target, 0, kSize);
    CHECK_STATUS(HIXL_SUCCESS,
                 hixlTransferBatchOnStream(prefill, HIXL_OP_WRITE, descs, 1, NULL, NULL, 0, NULL));
    CHECK(memcmp(target, src, 4096) == 0);
    CHECK_STATUS(HIXL_PARAM_INVALID,
                 hixlTransferBatchOnStream(prefill, HIXL_OP_WRITE, descs, 0, NULL, NULL, 0, NULL));
  }

  /* Cancelling: an ended request keeps its answer; one cancelled at once has
   * stopped when hixlCancelRequest returns (CANCELLED, or it finished first). */
  req = NULL;
  CHECK_STATUS(HIXL_SUCCESS, hixlWriteRemoteAsync(prefill, src, 4096, theirs, 0, &req));
  CHECK_STATUS(HIXL_SUCCESS, hixlWaitRequest(prefill, req, 10000));
  CHECK_STATUS(HIXL_SUCCESS, hixlCancelRequest(prefill, req));
  CHECK_STATUS(HIXL_SUCCESS, hixlPollRequest(prefill, req));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlCancelRequest(NULL, req));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlCancelRequest(decode, req));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyRequest(req));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlCancelRequest(prefill, req));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlCancelRequest(prefill, NULL));
  req = NULL;
  CHECK_STATUS(HIXL_SUCCESS, hixlWriteRemoteAsync(prefill, src, kSize, theirs, 0, &req));
  CHECK_STATUS(HIXL_SUCCESS, hixlCancelRequest(prefill, req));
  {
    HixlStatus s = hixlPollRequest(prefill, req);
    CHECK(s == HIXL_SUCCESS || s == HIXL_CANCELLED);
    CHECK(hixlPollRequest(prefill, req) == s);
  }
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyRequest(req));
  CHECK(strcmp(hixlGetErrorString(HIXL_CANCELLED), "CANCELLED: the request was cancelled") == 0);

  /* Bad input. */
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlWriteRemote(prefill, src, kSize + 1, theirs, 0, NULL));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlWriteRemote(prefill, src, 16, theirs, kSize - 8, NULL));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlWriteRemote(prefill, NULL, 16, theirs, 0, NULL));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlWriteRemote(NULL, src, 16, theirs, 0, NULL));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlWriteRemote(prefill, src, 16, NULL, 0, NULL));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlWriteRemoteAsync(prefill, src, 16, theirs, 0, NULL));
  copy[strlen(copy) - 1] = copy[strlen(copy) - 1] == '0' ? '1' : '0';
  {
    HixlMemHandle bad = NULL;
    CHECK_STATUS(HIXL_PARAM_INVALID, hixlMemHandleDeserialize(prefill, copy, &bad));
    CHECK(bad == NULL);
  }
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlConfigSetString(NULL, HIXL_OPTION_LOCAL_IP, "1.2.3.4"));
  CHECK(strlen(hixlGetErrorString(HIXL_PARAM_INVALID)) > 0);

  CHECK_STATUS(HIXL_SUCCESS, hixlUnregisterMemory(prefill, theirs));
  CHECK_STATUS(HIXL_SUCCESS, hixlUnregisterMemory(decode, mine));
  CHECK_STATUS(HIXL_SUCCESS, hixlFreeMemory(decode, target));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyEngine(prefill));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyEngine(decode));
  CHECK_STATUS(HIXL_PARAM_INVALID, hixlDestroyEngine(decode));
  test_notifications();
  test_restart();
  free(copy);
  free(src);
  free(back);
  if (failures != 0) {
    fprintf(stderr, "c_api_test: %d failure(s)\n", failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
