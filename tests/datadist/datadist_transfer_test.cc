// tests/datadist/datadist_transfer_test.cc — LLM-DataDist data movement
// between a prefill and a decode peer process, over shm and tcp: paged caches
// with random block tables (runs, scattered blocks, a 10^4-block list), whole
// caches by batch index, size and request key, layer ranges, and layer-wise
// TransferCacheAsync with gates, caches shared by mapping
// (llm.ShareCachesByMapping). Every moved byte is checked by hashing both
// sides; bytes that must stay untouched are checked against a snapshot.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dd_harness.h"

namespace dd_test {
namespace {


class DdTransfer : public DdTest {};
INSTANTIATE_TEST_SUITE_P(Links, DdTransfer, ::testing::ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);

std::string Blocks(const std::vector<uint64_t>& src, const std::vector<uint64_t>& dst) {
  return "src=" + FormatList(src) + " dst=" + FormatList(dst);
}

struct BlockCase {
  const char* what;
  std::vector<uint64_t> src, dst;
};

// Block tables of several kinds into disjoint destination blocks of a
// destination with >= 200 blocks, from a source with >= 256 blocks.
std::vector<BlockCase> BlockCases() {
  const std::vector<uint64_t> pool = [] {
    std::vector<uint64_t> v = RandomBlocks(2, 100, 100);
    for (auto& b : v) b += 100;  // destination blocks 100..199, shuffled
    return v;
  }();
  auto take = [&](size_t from, size_t n) {
    return std::vector<uint64_t>(pool.begin() + static_cast<long>(from),
                                 pool.begin() + static_cast<long>(from + n));
  };
  return {
      {"one contiguous run", Range(10, 32), Range(0, 32)},
      {"scattered into scattered", RandomBlocks(1, 40, 256), take(0, 40)},
      {"runs and singles", Concat(Concat(Range(200, 8), {3, 5}), Range(60, 5)),
       Concat(Concat({90}, Range(40, 6)), Concat({88}, Range(50, 7)))},
      {"a single block", {255}, take(40, 1)},
      {"a run into scattered", Range(128, 16), take(41, 16)},
      {"scattered into a run", RandomBlocks(3, 16, 256), Range(70, 16)},
      {"descending run", {20, 19, 18, 17}, {99, 98, 97, 96}},
  };
}

// Paged pulls (push=false: decode pulls from prefill) or pushes (prefill
// pushes into decode) of every BlockCase; `explicit_addrs` passes the local
// Cache's tensor addresses for every second case.
void RunPagedCases(DdPeer& p, DdPeer& d, bool push) {
  const CacheRef src = p.Cache("kv", 8, "fp16", {256, 4, 64}, push ? "mem=onehost" : "");
  const CacheRef dst = d.Cache("kv", 8, "fp16", {200, 4, 64}, push ? "" : "mem=host");
  ASSERT_GT(src.id, 0);
  ASSERT_GT(dst.id, 0);
  p.Fill("kv", 7);
  const auto cases = BlockCases();
  std::vector<uint64_t> used;
  for (const auto& c : cases) used = Concat(used, c.dst);
  const std::vector<uint64_t> untouched = Complement(used, 200);
  const std::string untouched_before = d.HashBlocks("kv", 0, 7, untouched);
  if (push) {
    DD_ASSERT_OK(p.Link(d));
  } else {
    DD_ASSERT_OK(d.Link(p));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    SCOPED_TRACE(c.what);
    const std::string ex = i % 2 ? " explicit=1" : "";
    if (push) {
      DD_EXPECT_OK(p.Xfer("pushb", "kv", "cluster=2 cache=" + std::to_string(dst.id) + " " +
                                             Blocks(c.src, c.dst) + ex));
    } else {
      DD_EXPECT_OK(d.Xfer("pullb", "kv", "cluster=1 cache=" + std::to_string(src.id) + " " +
                                             Blocks(c.src, c.dst) + ex));
    }
    EXPECT_EQ(d.HashBlocks("kv", 0, 7, c.dst), p.HashBlocks("kv", 0, 7, c.src));
  }
  // Every case still holds its data (no later case wrote over it) and no
  // other block was touched.
  for (const auto& c : cases) {
    EXPECT_EQ(d.HashBlocks("kv", 0, 7, c.dst), p.HashBlocks("kv", 0, 7, c.src)) << c.what;
  }
  EXPECT_EQ(d.HashBlocks("kv", 0, 7, untouched), untouched_before);
}

TEST_P(DdTransfer, PagedPullWithRandomBlockTables) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder");
  ASSERT_NE(d, nullptr);
  RunPagedCases(*p, *d, /*push=*/false);
}

TEST_P(DdTransfer, PagedPushWithRandomBlockTables) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder");
  ASSERT_NE(d, nullptr);
  RunPagedCases(*p, *d, /*push=*/true);
}

TEST_P(DdTransfer, PagedCachesFoundByBlocksCacheKey) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder");
  ASSERT_NE(d, nullptr);
  // Two paged caches per side; the model id picks one.
  ASSERT_GT(p->Cache("other", 4, "fp16", {64, 8, 16}, "model=6").id, 0);
  ASSERT_GT(p->Cache("kv", 4, "fp16", {64, 8, 16}, "model=7").id, 0);
  ASSERT_GT(d->Cache("other", 4, "fp16", {48, 8, 16}, "model=8").id, 0);
  ASSERT_GT(d->Cache("kv", 4, "fp16", {48, 8, 16}, "model=9").id, 0);
  p->Fill("kv", 11);
  p->Fill("other", 12);
  const auto other_before = d->HashTensors("other");
  DD_ASSERT_OK(d->Link(*p));
  DD_ASSERT_OK(p->Link(*d));
  const auto s1 = RandomBlocks(21, 20, 64), d1 = RandomBlocks(22, 20, 48);
  DD_EXPECT_OK(d->Xfer("pullb", "kv", "bkey=1:7 " + Blocks(s1, d1)));
  EXPECT_EQ(d->HashBlocks("kv", 0, 3, d1), p->HashBlocks("kv", 0, 3, s1));
  p->Fill("kv", 13);
  const auto s2 = Range(30, 12), d2 = Range(0, 12);
  DD_EXPECT_OK(p->Xfer("pushb", "kv", "bkey=2:9 " + Blocks(s2, d2)));
  EXPECT_EQ(d->HashBlocks("kv", 0, 3, d2), p->HashBlocks("kv", 0, 3, s2));
  EXPECT_EQ(d->HashTensors("other"), other_before) << "the other model's cache was written";
}

// 12000 blocks of 64 bytes: one transfer of 10^4 scattered blocks (pull) and
// one of a 10^4-block run (push).
TEST_P(DdTransfer, TenThousandBlockLists) {
  // A pull of 10^4 scattered blocks over UCX took over the default 1 s
  // (llm.SyncKvCacheWaitTime) on a loaded machine: the deadline here only
  // bounds a hang.
  PeerSpec slow;
  slow.wait_ms = 30000;
  DdPeer* p = Spawn(1, "prompt", slow);
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder", slow);
  ASSERT_NE(d, nullptr);
  constexpr uint64_t kBlocks = 12000;
  const CacheRef src = p->Cache("kv", 2, "fp16", {kBlocks, 32});
  const CacheRef dst = d->Cache("kv", 2, "fp16", {kBlocks, 32});
  ASSERT_GT(src.id, 0);
  ASSERT_GT(dst.id, 0);
  p->Fill("kv", 31);
  DD_ASSERT_OK(d->Link(*p));
  DD_ASSERT_OK(p->Link(*d));
  const auto s1 = RandomBlocks(41, 10000, kBlocks), d1 = RandomBlocks(42, 10000, kBlocks);
  const auto rest = Complement(d1, kBlocks);
  const std::string rest_before = d->HashBlocks("kv", 0, 1, rest);
  const Res r1 = d->Xfer("pullb", "kv", "cluster=1 cache=" + std::to_string(src.id) + " " +
                                           Blocks(s1, d1), 60000);
  DD_EXPECT_OK(r1);
  std::cout << "pull of 10000 scattered blocks: " << r1.value << " us" << std::endl;
  EXPECT_EQ(d->HashBlocks("kv", 0, 1, d1), p->HashBlocks("kv", 0, 1, s1));
  EXPECT_EQ(d->HashBlocks("kv", 0, 1, rest), rest_before);

  p->Fill("kv", 32);
  const auto s2 = Range(0, 10000), d2 = Range(2000, 10000);
  const Res r2 = p->Xfer("pushb", "kv", "cluster=2 cache=" + std::to_string(dst.id) + " " +
                                           Blocks(s2, d2), 60000);
  DD_EXPECT_OK(r2);
  std::cout << "push of a 10000-block run: " << r2.value << " us" << std::endl;
  EXPECT_EQ(d->HashBlocks("kv", 0, 1, d2), p->HashBlocks("kv", 0, 1, s2));
  // The owners' events name every block.
  const auto pe = p->Events(1, 3000);
  ASSERT_EQ(pe.size(), 1u);
  EXPECT_TRUE(SameBlocks(pe[0].blocks, s1)) << pe[0].blocks.size() << " blocks in the event";
  const auto de = d->Events(1, 3000);
  ASSERT_EQ(de.size(), 1u);
  EXPECT_TRUE(SameBlocks(de[0].blocks, d2)) << de[0].blocks.size() << " blocks in the event";
}

// Whole caches: batch entries by index, full and partial sizes.
TEST_P(DdTransfer, WholeCacheBatchIndexAndSize) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder");
  ASSERT_NE(d, nullptr);
  constexpr size_t kEntry = 128 * 16 * 2;  // bytes per batch entry per tensor
  const CacheRef src = p->Cache("kv", 6, "fp16", {4, 128, 16});
  const CacheRef dst = d->Cache("kv", 6, "fp16", {3, 128, 16}, "mem=host");
  ASSERT_GT(src.id, 0);
  ASSERT_GT(dst.id, 0);
  p->Fill("kv", 3);
  d->Fill("kv", 50);  // a known baseline that differs from the source
  DD_ASSERT_OK(d->Link(*p));
  DD_ASSERT_OK(p->Link(*d));
  const std::string sid = " cache=" + std::to_string(src.id);
  const std::string did = " cache=" + std::to_string(dst.id);

  // Full entry: source entry 2 -> local entry 1; entries 0 and 2 untouched.
  const std::string e0 = d->HashEntry("kv", 0, 5, 0), e2 = d->HashEntry("kv", 0, 5, 2);
  DD_EXPECT_OK(d->Xfer("pullc", "kv", "cluster=1" + sid + " batch=2 lbatch=1"));
  EXPECT_EQ(d->HashEntry("kv", 0, 5, 1), p->HashEntry("kv", 0, 5, 2));
  EXPECT_EQ(d->HashEntry("kv", 0, 5, 0), e0);
  EXPECT_EQ(d->HashEntry("kv", 0, 5, 2), e2);

  // Partial: the first 1000 bytes of source entry 3 -> local entry 0; the
  // rest of local entry 0 keeps its bytes.
  const std::string tail0 = d->HashRange("kv", 0, 5, 1000, kEntry - 1000);
  DD_EXPECT_OK(d->Xfer("pullc", "kv", "cluster=1" + sid + " batch=3 lbatch=0 size=1000"));
  EXPECT_EQ(d->HashEntry("kv", 0, 5, 0, 1000), p->HashEntry("kv", 0, 5, 3, 1000));
  EXPECT_EQ(d->HashRange("kv", 0, 5, 1000, kEntry - 1000), tail0);

  // size == one whole entry, and a single byte.
  DD_EXPECT_OK(d->Xfer("pullc", "kv", "cluster=1" + sid + " batch=0 lbatch=2 size=" +
                                          std::to_string(kEntry)));
  EXPECT_EQ(d->HashEntry("kv", 0, 5, 2), p->HashEntry("kv", 0, 5, 0));
  DD_EXPECT_OK(d->Xfer("pullc", "kv", "cluster=1" + sid + " batch=1 lbatch=1 size=1"));
  EXPECT_EQ(d->HashEntry("kv", 0, 5, 1, 1), p->HashEntry("kv", 0, 5, 1, 1));
  EXPECT_EQ(d->HashRange("kv", 0, 5, kEntry + 1, kEntry - 1),
            p->HashRange("kv", 0, 5, 2 * kEntry + 1, kEntry - 1))
      << "bytes after the first of entry 1 must still be source entry 2's";

  // Pushes: prefill entry 1 -> decode entry 2 (whole), then 2048 bytes of
  // prefill entry 3 -> decode entry 0.
  p->Fill("kv", 4);
  DD_EXPECT_OK(p->Xfer("pushc", "kv", "cluster=2" + did + " batch=2 lbatch=1"));
  EXPECT_EQ(d->HashEntry("kv", 0, 5, 2), p->HashEntry("kv", 0, 5, 1));
  const std::string tail = d->HashRange("kv", 0, 5, 2048, kEntry - 2048);
  DD_EXPECT_OK(p->Xfer("pushc", "kv", "cluster=2" + did + " batch=0 lbatch=3 size=2048"));
  EXPECT_EQ(d->HashEntry("kv", 0, 5, 0, 2048), p->HashEntry("kv", 0, 5, 3, 2048));
  EXPECT_EQ(d->HashRange("kv", 0, 5, 2048, kEntry - 2048), tail);
}

// Whether [addr, addr+1) of process pid is mapped from one of the engine's
// memfds for moved application memory ("/memfd:hixl-user" in its maps).
bool InEngineMemfd(pid_t pid, uint64_t addr) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uint64_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64, &lo, &hi) != 2) continue;
    if (addr >= lo && addr < hi) return line.find("memfd:hixl-user") != std::string::npos;
  }
  return false;
}

// llm.ShareCachesByMapping=1 on both sides: RegisterKvCache moves the
// application's (malloc) tensors into the engine's sealed memfds in place;
// pulls and pushes move exactly the same bytes; UnregisterKvCache moves the
// pages back with their contents.
TEST_P(DdTransfer, CachesSharedByMappingMoveTheSameBytesAndGoBack) {
  PeerSpec spec;
  spec.extra = {"llm.ShareCachesByMapping=1"};
  DdPeer* p = Spawn(1, "prompt", spec);
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder", spec);
  ASSERT_NE(d, nullptr);
  const CacheRef src = p->Cache("kv", 4, "fp16", {8, 64, 64});  // 64 KiB per entry
  const CacheRef dst = d->Cache("kv", 4, "fp16", {8, 64, 64});
  ASSERT_GT(src.id, 0);
  ASSERT_GT(dst.id, 0);
  for (uint64_t a : src.addrs) EXPECT_TRUE(InEngineMemfd(p->pid(), a)) << a;
  for (uint64_t a : dst.addrs) EXPECT_TRUE(InEngineMemfd(d->pid(), a)) << a;
  p->Fill("kv", 21);
  d->Fill("kv", 22);
  DD_ASSERT_OK(d->Link(*p));
  DD_ASSERT_OK(p->Link(*d));
  const std::string sid = " cache=" + std::to_string(src.id);
  const std::string did = " cache=" + std::to_string(dst.id);
  DD_EXPECT_OK(d->Xfer("pullc", "kv", "cluster=1" + sid + " batch=5 lbatch=2"));
  EXPECT_EQ(d->HashEntry("kv", 0, 3, 2), p->HashEntry("kv", 0, 3, 5));
  DD_EXPECT_OK(p->Xfer("pushc", "kv", "cluster=2" + did + " batch=7 lbatch=1"));
  EXPECT_EQ(d->HashEntry("kv", 0, 3, 7), p->HashEntry("kv", 0, 3, 1));
  const auto before = p->HashTensors("kv");
  EXPECT_TRUE(p->Cmd("unreg kv").ok);
  for (uint64_t a : src.addrs) EXPECT_FALSE(InEngineMemfd(p->pid(), a)) << a;
  EXPECT_EQ(p->HashTensors("kv"), before) << "the moved pages came back with their bytes";
  EXPECT_EQ(d->Xfer("pullc", "kv", "cluster=1" + sid + " batch=5 lbatch=2").code,
            "LLM_KV_CACHE_NOT_EXIST");
}

// Whole caches named by request keys: key i is batch entry i.
TEST_P(DdTransfer, WholeCacheByRequestKey) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder");
  ASSERT_NE(d, nullptr);
  ASSERT_GT(p->Cache("kv", 4, "bf16", {4, 64, 8}, "keys=1:100:0;1:101:0;1:102:0;1:103:0").id, 0);
  ASSERT_GT(d->Cache("kv", 4, "bf16", {3, 64, 8}, "keys=2:200:5;2:201:5;2:202:5").id, 0);
  p->Fill("kv", 60);
  DD_ASSERT_OK(d->Link(*p));
  DD_ASSERT_OK(p->Link(*d));
  DD_EXPECT_OK(d->Xfer("pullc", "kv", "key=1:102:0 lbatch=0"));
  EXPECT_EQ(d->HashEntry("kv", 0, 3, 0), p->HashEntry("kv", 0, 3, 2));
  DD_EXPECT_OK(d->Xfer("pullc", "kv", "key=1:100:0 lbatch=2 size=100"));
  EXPECT_EQ(d->HashEntry("kv", 0, 3, 2, 100), p->HashEntry("kv", 0, 3, 0, 100));
  DD_EXPECT_OK(p->Xfer("pushc", "kv", "key=2:201:5 lbatch=3"));
  EXPECT_EQ(d->HashEntry("kv", 0, 3, 1), p->HashEntry("kv", 0, 3, 3));
}

// Layer ranges of equal length at different offsets; every tensor and block
// outside the destination range keeps its bytes.
TEST_P(DdTransfer, LayerRangesMoveOnlyTheirLayers) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder");
  ASSERT_NE(d, nullptr);
  // 4 layers x (K, V); paged and whole.
  const CacheRef ps = p->Cache("pg", 8, "fp16", {64, 4, 32});
  const CacheRef pd = d->Cache("pg", 8, "fp16", {64, 4, 32});
  const CacheRef ws = p->Cache("wh", 8, "fp16", {2, 64, 32});
  const CacheRef wd = d->Cache("wh", 8, "fp16", {2, 64, 32});
  ASSERT_TRUE(ps.id > 0 && pd.id > 0 && ws.id > 0 && wd.id > 0);
  p->Fill("pg", 1);
  p->Fill("wh", 2);
  d->Fill("pg", 9);
  d->Fill("wh", 10);
  DD_ASSERT_OK(d->Link(*p));
  DD_ASSERT_OK(p->Link(*d));

  // Source layers 1..2 (tensors 2..5) -> destination layers 0..1 (tensors 0..3).
  auto before = d->HashTensors("pg");
  const auto s1 = RandomBlocks(5, 10, 64), d1 = Range(20, 10);
  const auto rest1 = Complement(d1, 64);
  const std::string rest1_before = d->HashBlocks("pg", 0, 3, rest1);
  DD_EXPECT_OK(d->Xfer("pullb", "pg", "cluster=1 cache=" + std::to_string(ps.id) + " " +
                                          Blocks(s1, d1) + " sl=1:2 dl=0:1"));
  EXPECT_EQ(d->HashBlocks("pg", 0, 3, d1), p->HashBlocks("pg", 2, 5, s1));
  EXPECT_EQ(d->HashBlocks("pg", 0, 3, rest1), rest1_before);
  auto after = d->HashTensors("pg");
  ASSERT_EQ(after.size(), 8u);
  for (size_t t = 4; t < 8; ++t) EXPECT_EQ(after[t], before[t]) << "tensor " << t << " touched";

  // Push source layer 3 -> destination layer 2 (tensors 4..5).
  before = after;
  const auto s2 = Range(0, 5), d2 = Range(59, 5);
  DD_EXPECT_OK(p->Xfer("pushb", "pg", "cluster=2 cache=" + std::to_string(pd.id) + " " +
                                          Blocks(s2, d2) + " sl=3:3 dl=2:2"));
  EXPECT_EQ(d->HashBlocks("pg", 4, 5, d2), p->HashBlocks("pg", 6, 7, s2));
  after = d->HashTensors("pg");
  for (size_t t : {0, 1, 2, 3, 6, 7}) EXPECT_EQ(after[t], before[t]) << "tensor " << t << " touched";

  // One tensor per layer: source layers 5..6 -> destination layers 0..1.
  before = after;
  const auto s3 = Range(40, 3), d3 = Range(40, 3);
  DD_EXPECT_OK(d->Xfer("pullb", "pg", "cluster=1 cache=" + std::to_string(ps.id) + " " +
                                          Blocks(s3, d3) + " sl=5:6 dl=0:1 tpl=1"));
  EXPECT_EQ(d->HashBlocks("pg", 0, 1, d3), p->HashBlocks("pg", 5, 6, s3));
  after = d->HashTensors("pg");
  for (size_t t = 2; t < 8; ++t) EXPECT_EQ(after[t], before[t]) << "tensor " << t << " touched";

  // Whole caches: source layers 0..1 -> destination layers 2..3, entry 1 -> 0.
  before = d->HashTensors("wh");
  const std::string other_entry = d->HashEntry("wh", 4, 7, 1);
  DD_EXPECT_OK(d->Xfer("pullc", "wh", "cluster=1 cache=" + std::to_string(ws.id) +
                                          " batch=1 lbatch=0 sl=0:1 dl=2:3"));
  EXPECT_EQ(d->HashEntry("wh", 4, 7, 0), p->HashEntry("wh", 0, 3, 1));
  EXPECT_EQ(d->HashEntry("wh", 4, 7, 1), other_entry);
  after = d->HashTensors("wh");
  for (size_t t = 0; t < 4; ++t) EXPECT_EQ(after[t], before[t]) << "tensor " << t << " touched";
  // And back: push source layer 2 entry 0 -> destination layer 0 entry 1.
  before = after;
  DD_EXPECT_OK(p->Xfer("pushc", "wh", "cluster=2 cache=" + std::to_string(wd.id) +
                                          " batch=1 lbatch=0 sl=2:2 dl=0:0"));
  EXPECT_EQ(d->HashEntry("wh", 0, 1, 1), p->HashEntry("wh", 4, 5, 0));
  after = d->HashTensors("wh");
  for (size_t t = 2; t < 8; ++t) EXPECT_EQ(after[t], before[t]) << "tensor " << t << " touched";
}

// Caches of different layer counts exchange equal-length layer ranges that
// lie inside both.
TEST_P(DdTransfer, LayerRangesBetweenCachesOfDifferentDepths) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder");
  ASSERT_NE(d, nullptr);
  const CacheRef deep = p->Cache("pg", 8, "fp16", {16, 4, 32});     // 4 layers
  const CacheRef shallow = d->Cache("pg", 6, "fp16", {16, 4, 32});  // 3 layers
  ASSERT_GT(deep.id, 0);
  ASSERT_GT(shallow.id, 0);
  p->Fill("pg", 1);
  d->Fill("pg", 2);
  DD_ASSERT_OK(d->Link(*p));
  DD_ASSERT_OK(p->Link(*d));
  DD_EXPECT_OK(d->Xfer("pullb", "pg", "cluster=1 cache=" + std::to_string(deep.id) +
                                          " src=0-3 dst=4-7 sl=1:3 dl=0:2"));
  EXPECT_EQ(d->HashBlocks("pg", 0, 5, Range(4, 4)), p->HashBlocks("pg", 2, 7, Range(0, 4)));
  DD_EXPECT_OK(p->Xfer("pushb", "pg", "cluster=2 cache=" + std::to_string(shallow.id) +
                                          " src=8 dst=9 sl=3:3 dl=2:2"));
  EXPECT_EQ(d->HashBlocks("pg", 4, 5, {9}), p->HashBlocks("pg", 6, 7, {8}));
}

// ---------------------------------------------------------------------------
// TransferCacheAsync: layer-wise pushes behind gates.

// The fields of an "async" reply ("first=.. donefirst=.. final=.. done=..
// results=.. gates=.. msg=...").
struct AsyncReply {
  std::map<std::string, std::string> f;
  std::string msg;
};
AsyncReply ParseAsync(const Res& r) {
  AsyncReply a;
  const size_t m = r.value.find(" msg=");
  std::istringstream in(r.value.substr(0, m));
  if (m != std::string::npos) a.msg = r.value.substr(m + 5);
  std::string tok;
  while (in >> tok) {
    const size_t eq = tok.find('=');
    if (eq != std::string::npos) a.f[tok.substr(0, eq)] = tok.substr(eq + 1);
  }
  return a;
}

// "times=" of an async reply: every layer of `layers`, in order, posted only
// after its gate opened and completed after it was posted.
void ExpectLayerTimes(const AsyncReply& a, const std::vector<uint64_t>& layers) {
  std::vector<uint64_t> seen;
  std::stringstream ss(a.f.count("times") ? a.f.at("times") : "");
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "none") break;
    long long layer = -1, after_gate = -1, took = -1;
    if (std::sscanf(item.c_str(), "%lld/%lld/%lld", &layer, &after_gate, &took) != 3) {
      ADD_FAILURE() << "bad times item " << item;
      continue;
    }
    seen.push_back(static_cast<uint64_t>(layer));
    EXPECT_GE(after_gate, 0) << "layer " << layer << " was posted " << -after_gate
                             << " ns before its gate opened";
    EXPECT_GE(took, 0) << "layer " << layer << " completed before it was posted";
  }
  EXPECT_EQ(seen, layers) << "LayerTimes() must name every layer moved, in order";
}

// The destination's one event for a layer-wise push (after all its layers).
void ExpectOneAsyncEvent(DdPeer& d, int64_t cache, const std::string& tag,
                         const std::vector<uint64_t>& blocks, const std::string& layers) {
  std::vector<Event> evs = d.Events(1, 3000);
  SleepMs(100);
  const auto more = d.Events();
  evs.insert(evs.end(), more.begin(), more.end());
  ASSERT_EQ(evs.size(), 1u) << "one event per owner and task";
  EXPECT_EQ(evs[0].kind, "pushed") << evs[0];
  EXPECT_EQ(evs[0].peer, 1u) << evs[0];
  EXPECT_EQ(evs[0].cache, cache) << evs[0];
  EXPECT_EQ(evs[0].tag, tag) << evs[0];
  EXPECT_TRUE(SameBlocks(evs[0].blocks, blocks)) << evs[0];
  if (!layers.empty()) {
    EXPECT_EQ(evs[0].layers, layers) << evs[0];
  }
}

class DdAsync : public DdTest {
 protected:
  // Prefill (1) with a paged and a whole cache of 4 layers; decodes 2 and 3
  // with matching caches; the prefill links both.
  void SetUpPeers() {
    p_ = Spawn(1, "prompt");
    ASSERT_NE(p_, nullptr);
    d_ = Spawn(2, "decoder");
    ASSERT_NE(d_, nullptr);
    d2_ = Spawn(3, "decoder");
    ASSERT_NE(d2_, nullptr);
    ASSERT_GT(p_->Cache("pg", 8, "fp16", {32, 4, 32}).id, 0);
    ASSERT_GT(p_->Cache("wh", 8, "fp16", {2, 64, 32}).id, 0);
    for (DdPeer* d : {d_, d2_}) {
      dpg_.push_back(d->Cache("pg", 8, "fp16", {48, 4, 32}));
      dwh_.push_back(d->Cache("wh", 8, "fp16", {3, 64, 32}, "keys=" + std::to_string(d->cluster()) +
                                                                ":7:0;" + std::to_string(d->cluster()) +
                                                                ":8:0;" + std::to_string(d->cluster()) +
                                                                ":9:0"));
      ASSERT_GT(dpg_.back().id, 0);
      ASSERT_GT(dwh_.back().id, 0);
      d->Fill("pg", 70 + d->cluster());
      d->Fill("wh", 80 + d->cluster());
      DD_ASSERT_OK(p_->Link(*d));
    }
    p_->Fill("pg", 1);
    p_->Fill("wh", 2);
  }
  DdPeer* p_ = nullptr;
  DdPeer* d_ = nullptr;
  DdPeer* d2_ = nullptr;
  std::vector<CacheRef> dpg_, dwh_;
};
INSTANTIATE_TEST_SUITE_P(Links, DdAsync, ::testing::ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);

// The gate of layer i refills layer i's source tensors just before it
// answers true: the destination holds the refilled bytes of every layer only
// if no layer moved before its gate.
TEST_P(DdAsync, EveryLayerMovesOnlyAfterItsGate) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  const auto src = Concat(Range(4, 6), RandomBlocks(9, 10, 32));
  std::vector<uint64_t> dst = RandomBlocks(10, 16, 48);
  const auto rest = Complement(dst, 48);
  const std::string rest_before = d_->HashBlocks("pg", 0, 7, rest);
  const std::string stale = p_->HashBlocks("pg", 0, 7, src);
  const Res r = p_->Cmd("async pg " + Blocks(src, dst) + " fillseed=100 cfg=cluster=2/cache=" +
                        std::to_string(dpg_[0].id) + "/tag=lw1");
  DD_ASSERT_OK(r);
  const AsyncReply a = ParseAsync(r);
  EXPECT_EQ(a.f.at("final"), "LLM_SUCCESS") << r.raw;
  EXPECT_EQ(a.f.at("done"), "1") << r.raw;
  EXPECT_EQ(a.f.at("results"), "LLM_SUCCESS") << r.raw;
  EXPECT_EQ(a.f.at("gates"), "0-3") << "gates must be asked once per layer, in order: " << r.raw;
  ASSERT_NE(p_->HashBlocks("pg", 0, 7, src), stale) << "the gates did not refill the source";
  for (size_t layer = 0; layer < 4; ++layer) {
    EXPECT_EQ(d_->HashBlocks("pg", 2 * layer, 2 * layer + 1, dst),
              p_->HashBlocks("pg", 2 * layer, 2 * layer + 1, src))
        << "layer " << layer << " at the destination is not the data its gate released";
  }
  EXPECT_EQ(d_->HashBlocks("pg", 0, 7, rest), rest_before);
  ExpectLayerTimes(a, {0, 1, 2, 3});
  ExpectOneAsyncEvent(*d_, dpg_[0].id, "lw1", dst, "");
  EXPECT_TRUE(d2_->Events().empty()) << "an event at a decode the task did not push to";
}

// Two destinations with a layer range: one result per config; gates are asked
// for the source layers of the range only.
TEST_P(DdAsync, TwoDestinationsWithLayerRangesResultsPerConfig) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  const auto src = RandomBlocks(11, 12, 32), dst = Range(30, 12);
  const auto before2 = d_->HashTensors("pg");
  const auto before3 = d2_->HashTensors("pg");
  const Res r = p_->Cmd("async pg " + Blocks(src, dst) + " fillseed=200" +
                        " cfg=cluster=2/cache=" + std::to_string(dpg_[0].id) + "/sl=1:3/dl=0:2/tag=to2" +
                        " cfg=cluster=3/cache=" + std::to_string(dpg_[1].id) + "/sl=1:3/dl=1:3/tag=to3");
  DD_ASSERT_OK(r);
  const AsyncReply a = ParseAsync(r);
  EXPECT_EQ(a.f.at("final"), "LLM_SUCCESS") << r.raw;
  EXPECT_EQ(a.f.at("results"), "LLM_SUCCESS,LLM_SUCCESS") << r.raw;
  EXPECT_EQ(a.f.at("gates"), "1-3") << r.raw;
  EXPECT_EQ(d_->HashBlocks("pg", 0, 5, dst), p_->HashBlocks("pg", 2, 7, src));
  EXPECT_EQ(d2_->HashBlocks("pg", 2, 7, dst), p_->HashBlocks("pg", 2, 7, src));
  const auto after2 = d_->HashTensors("pg");
  const auto after3 = d2_->HashTensors("pg");
  EXPECT_EQ(after2[6], before2[6]);
  EXPECT_EQ(after2[7], before2[7]);
  EXPECT_EQ(after3[0], before3[0]);
  EXPECT_EQ(after3[1], before3[1]);
  ExpectLayerTimes(a, {1, 2, 3});
  ExpectOneAsyncEvent(*d_, dpg_[0].id, "to2", dst, "0:2");
  ExpectOneAsyncEvent(*d2_, dpg_[1].id, "to3", dst, "1:3");
}

// Whole-cache layer-wise pushes to a request key's entry and to raw
// destination tensor addresses.
TEST_P(DdAsync, WholeCacheToKeyAndToAddresses) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  const Res r = p_->Cmd("async wh fillseed=300 cfg=cluster=2/key=2:8:0/sb=1" +
                        std::string(" cfg=cluster=3/addrs=") + FormatList(dwh_[1].addrs) +
                        "/sb=0/db=2");
  DD_ASSERT_OK(r);
  const AsyncReply a = ParseAsync(r);
  EXPECT_EQ(a.f.at("final"), "LLM_SUCCESS") << r.raw;
  EXPECT_EQ(a.f.at("results"), "LLM_SUCCESS,LLM_SUCCESS") << r.raw;
  EXPECT_EQ(a.f.at("gates"), "0-3") << r.raw;
  EXPECT_EQ(d_->HashEntry("wh", 0, 7, 1), p_->HashEntry("wh", 0, 7, 1));   // key 2:8:0 = entry 1
  EXPECT_EQ(d2_->HashEntry("wh", 0, 7, 2), p_->HashEntry("wh", 0, 7, 0));
}

// A gate answering false fails the task with a clear status; later layers
// never reach the destination and their gates are not asked.
TEST_P(DdAsync, GateReturningFalseFailsTheTask) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  const auto src = Range(0, 8), dst = Range(10, 8);
  const std::string l23_before = d_->HashBlocks("pg", 4, 7, dst);
  const std::string l23_before2 = d2_->HashBlocks("pg", 4, 7, dst);
  const Res r = p_->Cmd("async pg " + Blocks(src, dst) + " fillseed=400 failat=2" +
                        " cfg=cluster=2/cache=" + std::to_string(dpg_[0].id) +
                        " cfg=cluster=3/cache=" + std::to_string(dpg_[1].id));
  DD_ASSERT_OK(r);
  const AsyncReply a = ParseAsync(r);
  EXPECT_NE(a.f.at("final"), "LLM_SUCCESS") << r.raw;
  EXPECT_FALSE(a.msg.empty()) << "a failed task must say why: " << r.raw;
  EXPECT_EQ(a.f.at("done"), "1") << r.raw;
  EXPECT_EQ(a.f.at("gates"), "0-2") << r.raw;
  const std::string res = a.f.at("results");
  EXPECT_EQ(res.find("LLM_SUCCESS"), std::string::npos)
      << "every config of a failed task must report the failure: " << r.raw;
  EXPECT_EQ(d_->HashBlocks("pg", 4, 7, dst), l23_before) << "layers 2..3 moved after a false gate";
  EXPECT_EQ(d2_->HashBlocks("pg", 4, 7, dst), l23_before2);
  EXPECT_NE(a.msg.find('2'), std::string::npos) << "the message must name the layer: " << a.msg;
  std::cout << "gate false: " << a.msg << std::endl;
  // Not every layer landed: no owner is told the push happened.
  SleepMs(200);
  for (DdPeer* d : {d_, d2_}) {
    for (const auto& e : d->Events()) ADD_FAILURE() << "event for a failed task: " << e;
  }
}

// Wait with a timeout while a gate holds the task: LLM_TIMEOUT, not done;
// the task then completes.
TEST_P(DdAsync, WaitTimesOutWhileAGateHolds) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  const auto src = Range(0, 4), dst = Range(0, 4);
  const Res r = p_->Cmd("async pg " + Blocks(src, dst) + " sleep0=600 waitfirst=50 cfg=cluster=2/cache=" +
                        std::to_string(dpg_[0].id));
  DD_ASSERT_OK(r);
  const AsyncReply a = ParseAsync(r);
  EXPECT_EQ(a.f.at("first"), "LLM_TIMEOUT") << r.raw;
  EXPECT_EQ(a.f.at("donefirst"), "0") << r.raw;
  EXPECT_EQ(a.f.at("final"), "LLM_SUCCESS") << r.raw;
  EXPECT_EQ(a.f.at("results"), "LLM_SUCCESS") << r.raw;
  EXPECT_EQ(d_->HashBlocks("pg", 0, 7, dst), p_->HashBlocks("pg", 0, 7, src));
}

// The destination unregisters its cache while a layer-wise push to it waits
// between layers: the task fails, and once UnregisterKvCache has returned no
// later layer lands in the (now the decode's own) memory.
TEST_P(DdAsync, DestinationUnregisteredMidTask) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  const auto blocks = Range(0, 8);
  Res r;
  std::thread pusher([&] {
    r = p_->Cmd("async pg " + Blocks(blocks, blocks) + " sleepall=150 cfg=cluster=2/cache=" +
                std::to_string(dpg_[0].id));
  });
  SleepMs(200);  // layer 0 has been released (and moves); layers 1..3 wait
  const Res u = d_->Cmd("unreg pg");
  DD_EXPECT_OK(u);
  DD_EXPECT_OK(d_->Cmd("fillbyte pg 0x5a"));
  const auto snapshot = d_->HashTensors("pg");
  pusher.join();
  SleepMs(100);
  EXPECT_EQ(d_->HashTensors("pg"), snapshot)
      << "a layer landed after the destination's UnregisterKvCache returned";
  DD_ASSERT_OK(r);
  const AsyncReply a = ParseAsync(r);
  EXPECT_NE(a.f.at("final"), "LLM_SUCCESS") << r.raw;
  EXPECT_FALSE(a.msg.empty()) << r.raw;
  EXPECT_NE(a.f.at("results"), "LLM_SUCCESS") << r.raw;
  EXPECT_EQ(a.f.at("done"), "1") << r.raw;
}

}  // namespace
}  // namespace dd_test
