/* tests/capi/c_api_test.c — the C API used from a real C99 file (compiled by
 * the C compiler): two engines in this process, one registers memory and
 * serializes its handle, the other deserializes it and WRITEs and READs
 * through it, blocking, async and batched; then a few bad calls. Exit 0 on
 * success. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hixl/hixl.h"

static int failures = 0;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n",        \
              __FILE__, __LINE__, #cond, hixlGetLastErrorMessage());       \
      failures++;                                                          \
    }                                                                      \
  } while (0)

#define CHECK_STATUS(expected, call)                                       \
  do {                                                                     \
    HixlStatus s_ = (call);                                                \
    if (s_ != (expected)) {                                                \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n",         \
              __FILE__, __LINE__, #call, hixlGetErrorString(s_),           \
              hixlGetErrorString(expected), hixlGetLastErrorMessage());    \
      failures++;                                                          \
    }                                                                      \
  } while (0)

static HixlEngine make_engine(int listen) {
  HixlConfig cfg = NULL;
  HixlEngine engine = NULL;
  CHECK_STATUS(HIXL_SUCCESS, hixlCreateConfig(&cfg));
  CHECK_STATUS(HIXL_SUCCESS, hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, "127.0.0.1"));
  if (listen) CHECK_STATUS(HIXL_SUCCESS, hixlConfigSetInt(cfg, HIXL_OPTION_LOCAL_PORT, 0));
  CHECK_STATUS(HIXL_SUCCESS, hixlConfigSetString(cfg, HIXL_OPTION_GLOBAL_RESOURCE_CONFIG,
                                                 "{\"CopyThreads\":\"2\"}"));
  CHECK_STATUS(HIXL_SUCCESS, hixlCreateEngine(cfg, &engine));
  CHECK_STATUS(HIXL_SUCCESS, hixlDestroyConfig(cfg));
  return engine;
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
