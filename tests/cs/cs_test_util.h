/* Helpers shared by the HiXL CS test programs (C99): the byte pattern both
 * sides agree on and endpoint parsing. */
#ifndef HIXL_TESTS_CS_CS_TEST_UTIL_H_
#define HIXL_TESTS_CS_CS_TEST_UTIL_H_

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hixl/hixl_cs.h"

/* Byte i of the pattern for seed s. */
static inline uint8_t CsPattern(uint64_t i, uint32_t s) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)s * 0xBF58476D1CE4E5B9ull);
  return (uint8_t)(x >> 56);
}

static inline void CsFill(uint8_t* p, uint64_t n, uint32_t seed) {
  uint64_t i;
  for (i = 0; i < n; ++i) p[i] = CsPattern(i, seed);
}

/* The first index that differs from the pattern, or n. */
static inline uint64_t CsFirstMismatch(const uint8_t* p, uint64_t n, uint32_t seed) {
  uint64_t i;
  for (i = 0; i < n; ++i) {
    if (p[i] != CsPattern(i, seed)) return i;
  }
  return n;
}

/* "tcp", "shm", "ucx", "hccs", "roce", "pcie" -> CommProtocol; -1 unknown. */
static inline int CsProtocol(const char* s) {
  if (strcmp(s, "tcp") == 0) return COMM_PROTOCOL_TCP;
  if (strcmp(s, "shm") == 0) return COMM_PROTOCOL_SHM;
  if (strcmp(s, "ucx") == 0) return COMM_PROTOCOL_UCX;
  if (strcmp(s, "hccs") == 0) return COMM_PROTOCOL_HCCS;
  if (strcmp(s, "roce") == 0) return COMM_PROTOCOL_ROCE;
  if (strcmp(s, "pcie") == 0) return COMM_PROTOCOL_PCIE;
  return -1;
}

static inline void CsDie(const char* what, HixlStatus st) {
  fprintf(stderr, "%s: %s (%s)\n", what, hixlGetErrorString(st), hixlGetLastErrorMessage());
  exit(2);
}

#endif /* HIXL_TESTS_CS_CS_TEST_UTIL_H_ */
