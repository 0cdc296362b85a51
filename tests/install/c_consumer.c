/* tests/install/c_consumer.c: a C99 program built against an installed hixl
 * through pkg-config alone (`cc $(pkg-config --cflags --libs hixl)`): one
 * engine writes into its own registered buffer through a loopback link and
 * reads it back. Exit 0 when the bytes match. */
#include <hixl/hixl_c.h>
#include <stdio.h>
#include <string.h>

#define TRY(call)                                                                                 \
  do {                                                                                            \
    HixlStatus s_ = (call);                                                                       \
    if (s_ != HIXL_SUCCESS) {                                                                     \
      fprintf(stderr, "%s: %s (%s)\n", #call, hixlGetErrorString(s_), hixlGetLastErrorMessage()); \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

int main(void) {
  static char target[8192], src[8192], back[8192];
  HixlConfig cfg = NULL;
  HixlEngine engine = NULL;
  HixlMemHandle mine = NULL, remote = NULL;
  memset(src, 'x', sizeof src);
  TRY(hixlCreateConfig(&cfg));
  TRY(hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, "127.0.0.1"));
  TRY(hixlConfigSetInt(cfg, HIXL_OPTION_LOCAL_PORT, 0));
  TRY(hixlCreateEngine(cfg, &engine));
  TRY(hixlDestroyConfig(cfg));
  TRY(hixlRegisterMemory(engine, target, sizeof target, HIXL_MEM_PERM_READ | HIXL_MEM_PERM_WRITE,
                         &mine));
  TRY(hixlMemHandleDeserialize(engine, hixlMemHandleSerialize(mine), &remote));
  TRY(hixlWriteRemote(engine, src, sizeof src, remote, 0, NULL));
  TRY(hixlReadRemote(engine, back, sizeof back, remote, 0, NULL));
  if (memcmp(target, src, sizeof src) != 0 || memcmp(back, src, sizeof src) != 0) {
    fprintf(stderr, "c_consumer: the bytes differ\n");
    return 1;
  }
  TRY(hixlUnregisterMemory(engine, remote));
  TRY(hixlUnregisterMemory(engine, mine));
  TRY(hixlDestroyEngine(engine));
  printf("c_consumer: %s moved %zu bytes through the installed libhixl\n", "hixl", sizeof src);
  return 0;
}
