// hixl-bench: one point of the bandwidth/latency sweep — hixl beside the
// references measured in the same run, rep by rep (A B C A B C ...):
//   A  hixl TransferSync of the descriptors
//   B  memcpy of the same bytes between two private buffers (shm), a plain
//      socket pair (tcp), or ucx_perftest (ucx); tcp adds the staged path
//   C  shm only: bare process_vm_writev/readv of the same bytes into the
//      target's region, split over the same threads (baselines.h, Mover)
// with the CPU time of both processes over each timed loop (cpu.h). --stream
// (stream.cc) shares the Context.
#pragma once

#include <hixl/hixl.h>

#include <string>
#include <vector>

#include "bench/baselines.h"
#include "bench/common.h"
#include "bench/options.h"
#include "bench/process.h"
#include "bench/ucx_perftest.h"

namespace hixl_bench {

// Everything one (mem, threads) pass needs.
struct Context {
  const Options* opt;
  hixl::Hixl* engine;
  Child* child;
  Target target;
  Buffer* local;    // the transfer's local buffer
  Buffer* scratch;  // second private buffer: memcpy partner, verify read-back
  CopyPool* pool;
  std::string transport, mem;
  uint64_t threads;
  SocketBaseline* sock = nullptr;         // tcp: the wire's practical limit
  const UcxPerftest* perftest = nullptr;  // ucx: UCX's own benchmark, same environment
  PingPong* ping = nullptr;               // tcp latency rows: a 4 KiB / 16 B round trip
  PingPong* ping_spin = nullptr;          // the same, both sides polling
  bool cma = false;                       // shm: the cross-memory attach leg runs
  // shm: memfd mappings of the region's size in this process before Connect
  // (so a new one means the engine mapped the target's region); -1: not checked
  int maps_before = -1;
  const UcxPerftest* stream_perftest = nullptr;  // --stream: ucp_put_bw, its own UCX_TLS
};

void Transfer(Context& c, hixl::TransferOp op, const std::vector<hixl::TransferOpDesc>& descs);
std::vector<hixl::TransferOpDesc> MakeDescs(uintptr_t local, uintptr_t remote, uint64_t block,
                                            uint64_t batch);
const char* OpName(hixl::TransferOp op);

// Shared file mappings of memfds (/memfd:...) at least min_len long in this
// process: how the bench sees whether the engine mapped a peer's region.
int SharedMemfdMappings(size_t min_len);

// Checks the bytes one transfer of this shape moves (and, with c.cma, those
// the cross-memory attach reference moves); throws on a mismatch.
void VerifyOnce(Context& c, hixl::TransferOp op, uint64_t block, uint64_t batch, uint64_t seed);

// One (op, block, batch) point: warm-up, then reps of [A, B, C] interleaved.
Measurement Measure(Context& c, hixl::TransferOp op, uint64_t block, uint64_t batch, uint64_t iters,
                    const std::string& mode);

// A baseline run that failed for a row (not the missing binary: said once).
void WarnBaseline(const Measurement& m, const UcxPerftest* perftest);

// stream.cc --stream: async WRITEs (or READs) of one block each, a window of
// --window in flight, beside ucx_perftest ucp_put_bw (ucp_get) with as many
// outstanding; the local buffer must hold StreamSlots(o, block) blocks.
uint64_t StreamSlots(const Options& o, uint64_t block);
Measurement MeasureStream(Context& c, hixl::TransferOp op, uint64_t block, uint64_t transfers);
void PrintStreamHeader();
void PrintStreamRow(const Measurement& m);

}  // namespace hixl_bench
