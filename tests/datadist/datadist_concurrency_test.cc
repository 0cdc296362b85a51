// tests/datadist/datadist_concurrency_test.cc — LLM-DataDist under
// concurrency, over shm and tcp: several prefill instances (peer processes
// plus one instance in this process pushing from several threads) push many
// requests into one decode instance at once, and several decode instances
// pull from one prefill at once. Every request's bytes are verified, and the
// decode's KvTransferEvents name each push once.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dd_harness.h"

namespace dd_test {
namespace {

namespace ld = llm_datadist;

class DdConcurrency : public DdTest {};
INSTANTIATE_TEST_SUITE_P(Links, DdConcurrency, ::testing::ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);

struct Request {
  uint64_t from = 0;  // prefill cluster
  std::vector<uint64_t> src, dst;
  std::string tag;
  bool ok = false;
  std::string reply;
};

constexpr int64_t kBlockElems = 4 * 32;  // fp16 [*, 4, 32]: 256 bytes per block
constexpr size_t kBlockBytes = kBlockElems * 2;
constexpr uint32_t kTensors = 4;
constexpr uint64_t kSrcBlocks = 128;
constexpr uint64_t kDstBlocks = 900;

TEST_P(DdConcurrency, ManyPrefillsPushIntoOneDecode) {
  DdPeer* d = Spawn(20, "decoder");
  ASSERT_NE(d, nullptr);
  const CacheRef dst = d->Cache("kv", kTensors, "fp16", {kDstBlocks, 4, 32}, "mem=host");
  ASSERT_GT(dst.id, 0);
  std::vector<DdPeer*> prefills;
  for (uint64_t c : {11, 12, 13}) {
    DdPeer* p = Spawn(c, "prompt");
    ASSERT_NE(p, nullptr);
    ASSERT_GT(p->Cache("kv", kTensors, "fp16", {kSrcBlocks, 4, 32}).id, 0);
    p->Fill("kv", c);
    DD_ASSERT_OK(p->Link(*d));
    prefills.push_back(p);
  }

  // An instance in this process (cluster 14), linking out only; its memory
  // outlives it.
  std::vector<std::unique_ptr<hixl_test::Buffer>> tensors;
  std::vector<uint64_t> addrs;
  ld::LlmDataDist local(14, ld::LlmRole::kPrompt);
  LLM_ASSERT_OK(local.Initialize(InstanceOptions(link(), "")));
  for (uint32_t t = 0; t < kTensors; ++t) {
    tensors.push_back(std::make_unique<hixl_test::Buffer>(kSrcBlocks * kBlockBytes));
    hixl_test::FillPattern(tensors.back()->data(), kSrcBlocks * kBlockBytes, TensorSeed(14, t));
    addrs.push_back(tensors.back()->addr());
  }
  ld::CacheDesc desc;
  desc.num_tensors = kTensors;
  desc.data_type = ld::DT_FLOAT16;
  desc.shape = {static_cast<int64_t>(kSrcBlocks), 4, 32};
  int64_t local_id = 0;
  LLM_ASSERT_OK(local.RegisterKvCache(desc, addrs, {}, local_id));
  {
    std::vector<ld::Status> rets;
    ld::ClusterInfo ci;
    ci.remote_cluster_id = 20;
    ci.remote_ip_infos.push_back({"127.0.0.1", static_cast<uint16_t>(hixl_test::PortOf(d->addr()))});
    LLM_ASSERT_OK(local.LinkLlmClusters({ci}, rets, 3000));
  }

  // Requests: 3 peers x 12 and 3 local threads x 6, 4..19 blocks each, into
  // disjoint destination blocks.
  const std::vector<uint64_t> pool = RandomBlocks(777, kDstBlocks, kDstBlocks);
  size_t next = 0;
  std::mt19937_64 rng(5);
  std::vector<Request> reqs;
  auto add = [&](uint64_t from, int i) {
    Request r;
    r.from = from;
    const size_t n = 4 + rng() % 16;
    r.src = RandomBlocks(rng(), n, kSrcBlocks);
    r.dst.assign(pool.begin() + static_cast<long>(next), pool.begin() + static_cast<long>(next + n));
    next += n;
    r.tag = "p" + std::to_string(from) + "r" + std::to_string(i);
    reqs.push_back(r);
  };
  for (uint64_t c : {11, 12, 13}) {
    for (int i = 0; i < 12; ++i) add(c, i);
  }
  for (int i = 0; i < 18; ++i) add(14, i);
  ASSERT_LE(next, kDstBlocks);

  std::vector<std::thread> threads;
  for (DdPeer* p : prefills) {
    threads.emplace_back([&, p] {
      for (auto& r : reqs) {
        if (r.from != p->cluster()) continue;
        const Res res = p->Xfer("pushb", "kv", "cluster=20 cache=" + std::to_string(dst.id) +
                                                   " src=" + FormatList(r.src) + " dst=" +
                                                   FormatList(r.dst) + " tag=" + r.tag);
        r.ok = res.ok;
        r.reply = res.raw;
      }
    });
  }
  for (int k = 0; k < 3; ++k) {
    threads.emplace_back([&, k] {
      ld::Cache cache;
      cache.cache_id = local_id;
      int i = 0;
      for (auto& r : reqs) {
        if (r.from != 14 || i++ % 3 != k) continue;
        ld::CacheIndex idx;
        idx.cluster_id = 20;
        idx.cache_id = dst.id;
        ld::KvCacheExtParam ext;
        ext.user_tag = r.tag;
        const ld::Status s = local.PushKvBlocks(cache, idx, r.src, r.dst, ext);
        r.ok = s.ok();
        r.reply = s.ToString();
      }
    });
  }
  for (auto& t : threads) t.join();

  for (const auto& r : reqs) {
    SCOPED_TRACE(r.tag);
    EXPECT_TRUE(r.ok) << r.reply;
    if (r.from == 14) {
      std::vector<uint64_t> hs;
      for (uint32_t t = 0; t < kTensors; ++t) {
        for (uint64_t b : r.src) hs.push_back(hixl_test::Fnv1a64(tensors[t]->data() + b * kBlockBytes, kBlockBytes));
      }
      EXPECT_EQ(d->HashBlocks("kv", 0, kTensors - 1, r.dst), hixl_test::HashHex(CombineHashes(hs)));
    } else {
      DdPeer* p = prefills[r.from - 11];
      EXPECT_EQ(d->HashBlocks("kv", 0, kTensors - 1, r.dst), p->HashBlocks("kv", 0, kTensors - 1, r.src));
    }
  }
  // Blocks no request named are still zero.
  std::vector<uint64_t> used;
  for (const auto& r : reqs) used = Concat(used, r.dst);
  const auto rest = Complement(used, kDstBlocks);
  if (!rest.empty()) {
    std::vector<uint64_t> zero_hs;
    std::vector<unsigned char> zero(kBlockBytes, 0);
    for (uint32_t t = 0; t < kTensors; ++t) {
      for (size_t i = 0; i < rest.size(); ++i) zero_hs.push_back(hixl_test::Fnv1a64(zero.data(), zero.size()));
    }
    EXPECT_EQ(d->HashBlocks("kv", 0, kTensors - 1, rest), hixl_test::HashHex(CombineHashes(zero_hs)));
  }

  // The decode saw every push exactly once, naming pusher, blocks and tag.
  const std::vector<Event> evs = d->Events(reqs.size(), 5000);
  std::map<std::string, Event> by_tag;
  for (const auto& e : evs) {
    EXPECT_EQ(e.kind, "pushed") << e;
    EXPECT_EQ(e.cache, dst.id) << e;
    EXPECT_TRUE(by_tag.emplace(e.tag, e).second) << "two events for " << e;
  }
  EXPECT_EQ(evs.size(), reqs.size());
  for (const auto& r : reqs) {
    auto it = by_tag.find(r.tag);
    if (it == by_tag.end()) {
      ADD_FAILURE() << "no event for " << r.tag;
      continue;
    }
    EXPECT_EQ(it->second.peer, r.from) << it->second;
    EXPECT_TRUE(SameBlocks(it->second.blocks, r.dst))
        << it->second << " expected blocks " << FormatList(r.dst);
  }
  local.Finalize();
}

// Three decode instances pull different requests from one prefill at once,
// by cache index and by request key.
TEST_P(DdConcurrency, SeveralDecodesPullFromOnePrefill) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  std::string keys;
  for (int i = 0; i < 8; ++i) keys += (keys.empty() ? "" : ";") + std::string("1:") + std::to_string(500 + i) + ":0";
  const CacheRef pg = p->Cache("pg", kTensors, "fp16", {kSrcBlocks, 4, 32});
  const CacheRef wh = p->Cache("wh", kTensors, "fp16", {8, 16, 32}, "keys=" + keys);
  ASSERT_GT(pg.id, 0);
  ASSERT_GT(wh.id, 0);
  p->Fill("pg", 90);
  p->Fill("wh", 91);
  std::vector<DdPeer*> decodes;
  for (uint64_t c : {2, 3, 4}) {
    DdPeer* d = Spawn(c, "decoder");
    ASSERT_NE(d, nullptr);
    ASSERT_GT(d->Cache("pg", kTensors, "fp16", {kSrcBlocks, 4, 32}).id, 0);
    ASSERT_GT(d->Cache("wh", kTensors, "fp16", {8, 16, 32}).id, 0);
    DD_ASSERT_OK(d->Link(*p));
    decodes.push_back(d);
  }
  struct Pull {
    std::vector<uint64_t> src, dst;
  };
  std::vector<std::vector<Pull>> plan(decodes.size());
  std::mt19937_64 rng(8);
  for (size_t k = 0; k < decodes.size(); ++k) {
    const auto pool = RandomBlocks(100 + k, kSrcBlocks, kSrcBlocks);
    for (size_t i = 0; i < 8; ++i) {
      Pull pl;
      pl.src = RandomBlocks(rng(), 10, kSrcBlocks);
      pl.dst.assign(pool.begin() + static_cast<long>(i * 10), pool.begin() + static_cast<long>(i * 10 + 10));
      plan[k].push_back(pl);
    }
  }
  std::vector<std::string> failures(decodes.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < decodes.size(); ++k) {
    threads.emplace_back([&, k] {
      for (size_t i = 0; i < plan[k].size(); ++i) {
        const Res b = decodes[k]->Xfer("pullb", "pg", "cluster=1 cache=" + std::to_string(pg.id) +
                                                          " src=" + FormatList(plan[k][i].src) +
                                                          " dst=" + FormatList(plan[k][i].dst));
        const Res c = decodes[k]->Xfer("pullc", "wh", "key=1:" + std::to_string(500 + (i + k) % 8) +
                                                          ":0 lbatch=" + std::to_string(i));
        if (!b.ok) failures[k] += " pullb#" + std::to_string(i) + ": " + b.raw;
        if (!c.ok) failures[k] += " pullc#" + std::to_string(i) + ": " + c.raw;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t k = 0; k < decodes.size(); ++k) {
    SCOPED_TRACE("decode " + std::to_string(decodes[k]->cluster()));
    EXPECT_EQ(failures[k], "");
    for (size_t i = 0; i < plan[k].size(); ++i) {
      EXPECT_EQ(decodes[k]->HashBlocks("pg", 0, kTensors - 1, plan[k][i].dst),
                p->HashBlocks("pg", 0, kTensors - 1, plan[k][i].src));
      EXPECT_EQ(decodes[k]->HashEntry("wh", 0, kTensors - 1, i),
                p->HashEntry("wh", 0, kTensors - 1, (i + k) % 8));
    }
  }
  // The owner learned of all 48 pulls.
  const auto evs = p->Events(48, 5000);
  EXPECT_EQ(EventsOf(evs, "pulled", pg.id).size(), 24u);
  EXPECT_EQ(EventsOf(evs, "pulled", wh.id).size(), 24u);
}

// ---------------------------------------------------------------------------
// In one process: every method from several threads at once, and Finalize
// while a layer-wise task runs.

struct Tensors {
  std::vector<std::unique_ptr<hixl_test::Buffer>> t;
  std::vector<uint64_t> addrs;
  Tensors(uint32_t n, size_t bytes, uint64_t seed) {
    for (uint32_t i = 0; i < n; ++i) {
      t.push_back(std::make_unique<hixl_test::Buffer>(bytes));
      if (seed) hixl_test::FillPattern(t.back()->data(), bytes, TensorSeed(seed, i));
      addrs.push_back(t.back()->addr());
    }
  }
  std::string Hash(const std::vector<uint64_t>& blocks, size_t block_bytes) const {
    std::vector<uint64_t> hs;
    for (const auto& b : t) {
      for (uint64_t k : blocks) hs.push_back(hixl_test::Fnv1a64(b->data() + k * block_bytes, block_bytes));
    }
    return hixl_test::HashHex(CombineHashes(hs));
  }
};

ld::CacheDesc PagedDesc(uint32_t nt, int64_t blocks) {
  ld::CacheDesc d;
  d.num_tensors = nt;
  d.data_type = ld::DT_FLOAT16;
  d.shape = {blocks, 4, 32};  // 256-byte blocks
  return d;
}

ld::ClusterInfo InfoOf(const ld::LlmDataDist& to) {
  ld::ClusterInfo ci;
  ci.remote_cluster_id = to.ClusterId();
  ci.remote_ip_infos.push_back({"127.0.0.1", static_cast<uint16_t>(hixl_test::PortOf(to.LocalAddress()))});
  return ci;
}

TEST_P(DdConcurrency, EveryMethodFromSeveralThreadsOfOneInstance) {
  Tensors xs(4, kSrcBlocks * kBlockBytes, 1), xd(4, kSrcBlocks * kBlockBytes, 0);
  Tensors ys(4, kSrcBlocks * kBlockBytes, 2), yd(4, kSrcBlocks * kBlockBytes, 0);
  std::vector<std::unique_ptr<Tensors>> churn;
  for (int i = 0; i < 20; ++i) churn.push_back(std::make_unique<Tensors>(2, 16 * kBlockBytes, 0));
  ld::LlmDataDist x(1, ld::LlmRole::kPrompt);
  ld::LlmDataDist y(2, ld::LlmRole::kDecoder);
  LLM_ASSERT_OK(x.Initialize(InstanceOptions(link(), "127.0.0.1:0")));
  LLM_ASSERT_OK(y.Initialize(InstanceOptions(link(), "")));
  int64_t xs_id = 0, xd_id = 0, ys_id = 0, yd_id = 0;
  LLM_ASSERT_OK(x.RegisterKvCache(PagedDesc(4, kSrcBlocks), xs.addrs, {}, xs_id));
  LLM_ASSERT_OK(x.RegisterKvCache(PagedDesc(4, kSrcBlocks), xd.addrs, {}, xd_id));
  LLM_ASSERT_OK(y.RegisterKvCache(PagedDesc(4, kSrcBlocks), ys.addrs, {}, ys_id));
  LLM_ASSERT_OK(y.RegisterKvCache(PagedDesc(4, kSrcBlocks), yd.addrs, {}, yd_id));
  std::vector<ld::Status> rets;
  LLM_ASSERT_OK(y.LinkLlmClusters({InfoOf(x)}, rets, 3000));

  constexpr int kOps = 64;
  std::vector<std::string> errors[3];
  std::atomic<size_t> events{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> th;
  th.emplace_back([&] {  // pulls of x's source into y's destination, block i -> i
    ld::Cache dst;
    dst.cache_id = yd_id;
    for (int i = 0; i < kOps; ++i) {
      const uint64_t b = static_cast<uint64_t>(i) % kSrcBlocks;
      const ld::Status s = y.PullKvBlocks(ld::CacheIndex{1, xs_id, 0}, dst, {b}, {b});
      if (!s.ok()) errors[0].push_back(s.ToString());
    }
  });
  th.emplace_back([&] {  // pushes of y's source into x's destination
    ld::Cache src;
    src.cache_id = ys_id;
    for (int i = 0; i < kOps; ++i) {
      const uint64_t b = static_cast<uint64_t>(i) % kSrcBlocks;
      const ld::Status s = y.PushKvBlocks(src, ld::CacheIndex{1, xd_id, 0}, {b}, {b});
      if (!s.ok()) errors[1].push_back(s.ToString());
    }
  });
  th.emplace_back([&] {  // y's own table changes meanwhile
    for (auto& c : churn) {
      int64_t id = 0;
      ld::Status s = y.RegisterKvCache(PagedDesc(2, 16), c->addrs, {}, id);
      if (s.ok()) s = y.UnregisterKvCache(id);
      if (!s.ok()) errors[2].push_back(s.ToString());
    }
  });
  th.emplace_back([&] {  // x's owner side drains its events meanwhile
    while (!done) {
      std::vector<ld::KvTransferEvent> evs;
      (void)x.GetKvTransferEvents(evs);
      events += evs.size();
      (void)x.Role();
      (void)x.LocalAddress();
      SleepMs(1);
    }
  });
  for (size_t i = 0; i + 1 < th.size(); ++i) th[i].join();
  const auto t0 = std::chrono::steady_clock::now();
  while (events < 2 * kOps && ElapsedMs(t0) < 5000) SleepMs(5);
  done = true;
  th.back().join();
  for (const auto& e : errors) EXPECT_TRUE(e.empty()) << e.size() << " failures; first: " << e[0];
  const auto blocks = Range(0, std::min<uint64_t>(kOps, kSrcBlocks));
  EXPECT_EQ(yd.Hash(blocks, kBlockBytes), xs.Hash(blocks, kBlockBytes));
  EXPECT_EQ(xd.Hash(blocks, kBlockBytes), ys.Hash(blocks, kBlockBytes));
  EXPECT_EQ(events.load(), 2u * kOps) << "x's events: one per pull and per push";
  y.Finalize();
  x.Finalize();
}

// Finalize of the pushing instance while its layer-wise task waits at a
// gate: Finalize returns in bounded time, the task has ended, and nothing of
// it lands afterwards; the task object outlives the instance.
TEST_P(DdConcurrency, FinalizeWhileALayerwiseTaskRuns) {
  if (const std::string why = hixl_test::SkipUcxTargetHere(GetParam()); !why.empty()) GTEST_SKIP() << why;
  Tensors src(8, 16 * kBlockBytes, 5), dst(8, 16 * kBlockBytes, 0);
  auto a = std::make_unique<ld::LlmDataDist>(1, ld::LlmRole::kPrompt);
  ld::LlmDataDist b(2, ld::LlmRole::kDecoder);
  LLM_ASSERT_OK(a->Initialize(InstanceOptions(link(), "")));
  LLM_ASSERT_OK(b.Initialize(InstanceOptions(link(), "127.0.0.1:0")));
  int64_t sid = 0, did = 0;
  LLM_ASSERT_OK(a->RegisterKvCache(PagedDesc(8, 16), src.addrs, {}, sid));
  LLM_ASSERT_OK(b.RegisterKvCache(PagedDesc(8, 16), dst.addrs, {}, did));
  std::vector<ld::Status> rets;
  LLM_ASSERT_OK(a->LinkLlmClusters({InfoOf(b)}, rets, 3000));
  std::atomic<int> gates{0};
  ld::LayerGate gate = [&](uint32_t, int32_t) {
    ++gates;
    SleepMs(100);
    return true;
  };
  ld::LayerTransferConfig cfg;
  cfg.dst_cluster_id = 2;
  cfg.dst_cache_id = did;
  ld::Cache c;
  c.cache_id = sid;
  std::shared_ptr<ld::KvTransferTask> task;
  LLM_ASSERT_OK(a->TransferCacheAsync(c, gate, {cfg}, Range(0, 16), Range(0, 16), task));
  ASSERT_NE(task, nullptr);
  SleepMs(150);
  const auto t0 = std::chrono::steady_clock::now();
  a->Finalize();
  const long long ms = ElapsedMs(t0);
  EXPECT_LT(ms, 3000) << "Finalize did not return in bounded time";
  EXPECT_TRUE(task->Done()) << "Finalize returned while its task still ran";
  const std::string after = dst.Hash(Range(0, 16), kBlockBytes);
  SleepMs(300);
  EXPECT_EQ(dst.Hash(Range(0, 16), kBlockBytes), after) << "bytes of the task landed after Finalize";
  EXPECT_LE(gates.load(), 4);
  a.reset();  // the task outlives its instance
  const ld::Status w = task->Wait(1000);
  EXPECT_NE(w.code(), ld::LLM_TIMEOUT) << w.ToString();
  EXPECT_EQ(task->Results().size(), 1u);
  (void)task->LayerTimes();
  task.reset();
  b.Finalize();
}

}  // namespace
}  // namespace dd_test
