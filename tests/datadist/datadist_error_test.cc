// tests/datadist/datadist_error_test.cc — LLM-DataDist refusals, over shm
// and tcp: every bad request fails whole with the documented status and a
// message, and writes nothing (both sides' caches are hashed before and
// after). Unknown caches and keys, unlinked clusters, block / batch / layer
// indices out of range, mismatched descriptions, oversize transfers, bad
// layer-wise configs, link errors, and bad Initialize options.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "dd_harness.h"

namespace dd_test {
namespace {

namespace ld = llm_datadist;

std::string Id(int64_t id) { return std::to_string(id); }

// Prefill (1) and decode (2), linked both ways, each with a paged and a
// whole cache of 4 layers (8 tensors) plus, on the decode, caches whose
// description differs from the prefill's in one way each.
class DdErrors : public DdTest {
 protected:
  void SetUpPeers() {
    p_ = Spawn(1, "prompt");
    ASSERT_NE(p_, nullptr);
    d_ = Spawn(2, "decoder");
    ASSERT_NE(d_, nullptr);
    ppg_ = p_->Cache("pg", 8, "fp16", {64, 4, 32}, "model=5");
    pwh_ = p_->Cache("wh", 8, "fp16", {4, 64, 32}, "keys=1:10:0;1:11:0;1:12:0;1:13:0");
    dpg_ = d_->Cache("pg", 8, "fp16", {64, 4, 32}, "model=6");
    dwh_ = d_->Cache("wh", 8, "fp16", {4, 64, 32}, "keys=2:20:0;2:21:0");
    ASSERT_TRUE(ppg_.id > 0 && pwh_.id > 0 && dpg_.id > 0 && dwh_.id > 0);
    ASSERT_GT(d_->Cache("pg_shape", 8, "fp16", {64, 4, 16}).id, 0);      // smaller blocks
    ASSERT_GT(d_->Cache("pg_dims", 8, "fp16", {64, 8, 16}).id, 0);       // same bytes, other shape
    ASSERT_GT(d_->Cache("pg_dtype", 8, "bf16", {64, 4, 32}).id, 0);      // same bytes, other type
    ASSERT_GT(d_->Cache("pg_count", 6, "fp16", {64, 4, 32}).id, 0);      // 3 layers
    ASSERT_GT(d_->Cache("wh_shape", 8, "fp16", {4, 32, 64}).id, 0);      // same bytes, other shape
    ASSERT_GT(d_->Cache("wh_dtype", 8, "fp32", {4, 32, 32}).id, 0);      // same bytes, other type
    for (const char* n : {"pg", "wh"}) p_->Fill(n, 1);
    for (const char* n : {"pg", "wh", "pg_shape", "pg_dims", "pg_dtype", "pg_count", "wh_shape", "wh_dtype"})
      d_->Fill(n, 2);
    DD_ASSERT_OK(d_->Link(*p_));
    DD_ASSERT_OK(p_->Link(*d_));
    Snapshot();
  }
  void Snapshot() {
    snap_.clear();
    for (const char* n : {"pg", "wh"}) snap_["p." + std::string(n)] = p_->HashTensors(n);
    for (const char* n : {"pg", "wh", "pg_shape", "pg_dims", "pg_dtype", "pg_count", "wh_shape", "wh_dtype"})
      snap_["d." + std::string(n)] = d_->HashTensors(n);
  }
  // Nothing changed on either side since Snapshot().
  void ExpectNothingWritten(const std::string& what) {
    for (const auto& [k, v] : snap_) {
      DdPeer* peer = k[0] == 'p' ? p_ : d_;
      EXPECT_EQ(peer->HashTensors(k.substr(2)), v) << what << ": cache " << k << " was written";
    }
  }
  // The request fails with `code` (and a message) and writes nothing.
  // No refused request was announced to either side.
  void ExpectNoEvents() {
    for (DdPeer* peer : {p_, d_}) {
      for (const auto& e : peer->Events(0, 100)) ADD_FAILURE() << "event for a refused request: " << e;
    }
  }
  void TearDown() override {
    if (p_ && d_ && !HasFatalFailure()) ExpectNoEvents();
    DdTest::TearDown();
  }
  void ExpectRefused(const std::string& code, DdPeer* who, const std::string& op,
                     const std::string& cache, const std::string& args) {
    SCOPED_TRACE(op + " " + cache + " " + args);
    DD_EXPECT_ERR(code, who->Xfer(op, cache, args));
    ExpectNothingWritten(op + " " + args);
  }
  std::string PullPg() const { return "cluster=1 cache=" + Id(ppg_.id) + " "; }
  std::string PullWh() const { return "cluster=1 cache=" + Id(pwh_.id) + " "; }
  std::string PushPg() const { return "cluster=2 cache=" + Id(dpg_.id) + " "; }
  std::string PushWh() const { return "cluster=2 cache=" + Id(dwh_.id) + " "; }

  DdPeer* p_ = nullptr;
  DdPeer* d_ = nullptr;
  CacheRef ppg_, pwh_, dpg_, dwh_;
  std::map<std::string, std::vector<std::string>> snap_;
};
INSTANTIATE_TEST_SUITE_P(Links, DdErrors, ::testing::ValuesIn(hixl_test::AllLinkTypes()),
                         LinkParamName);

constexpr const char* kNotExist = "LLM_KV_CACHE_NOT_EXIST";
constexpr const char* kInvalid = "LLM_PARAM_INVALID";
constexpr const char* kNotLinked = "LLM_NOT_YET_LINK";

TEST_P(DdErrors, UnknownCacheIdOrKey) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  ExpectRefused(kNotExist, d_, "pullb", "pg", "cluster=1 cache=999 src=0 dst=0");
  ExpectRefused(kNotExist, d_, "pullc", "wh", "cluster=1 cache=999 batch=0");
  ExpectRefused(kNotExist, d_, "pullc", "wh", "key=1:99:0");
  ExpectRefused(kNotExist, d_, "pullc", "wh", "key=1:10:1");  // other model id
  ExpectRefused(kNotExist, d_, "pullb", "pg", "bkey=1:99 src=0 dst=0");
  ExpectRefused(kNotExist, p_, "pushb", "pg", "cluster=2 cache=999 src=0 dst=0");
  ExpectRefused(kNotExist, p_, "pushc", "wh", "cluster=2 cache=999 batch=0");
  ExpectRefused(kNotExist, p_, "pushc", "wh", "key=2:99:0");
  ExpectRefused(kNotExist, p_, "pushb", "pg", "bkey=2:99 src=0 dst=0");
  // A local cache id that is not registered.
  DD_ASSERT_OK(d_->Cmd("cache loose 8 fp16 64,4,32 noreg=1"));
  DD_EXPECT_NOT_OK_MSG(d_->Xfer("pullb", "loose", PullPg() + "src=0 dst=0"));
  ExpectNothingWritten("pull into an unregistered local cache");
}

TEST_P(DdErrors, UnlinkedCluster) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  ExpectRefused(kNotLinked, d_, "pullb", "pg", "cluster=77 cache=" + Id(ppg_.id) + " src=0 dst=0");
  ExpectRefused(kNotLinked, d_, "pullc", "wh", "key=77:10:0");
  ExpectRefused(kNotLinked, d_, "pullb", "pg", "bkey=77:5 src=0 dst=0");
  ExpectRefused(kNotLinked, p_, "pushb", "pg", "cluster=77 cache=" + Id(dpg_.id) + " src=0 dst=0");
  ExpectRefused(kNotLinked, p_, "pushc", "wh", "key=77:20:0");
  // A third instance that never linked to the prefill.
  DdPeer* e = Spawn(3, "decoder");
  ASSERT_NE(e, nullptr);
  ASSERT_GT(e->Cache("pg", 8, "fp16", {64, 4, 32}).id, 0);
  const auto before = e->HashTensors("pg");
  DD_EXPECT_ERR(kNotLinked, e->Xfer("pullb", "pg", PullPg() + "src=0 dst=0"));
  EXPECT_EQ(e->HashTensors("pg"), before);
  ExpectNothingWritten("pull by an unlinked instance");
}

TEST_P(DdErrors, BlockIndexOutOfRange) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  ExpectRefused(kInvalid, d_, "pullb", "pg", PullPg() + "src=64 dst=0");
  ExpectRefused(kInvalid, d_, "pullb", "pg", PullPg() + "src=0 dst=64");
  ExpectRefused(kInvalid, d_, "pullb", "pg", PullPg() + "src=0-9,1099511627776 dst=0-10");
  ExpectRefused(kInvalid, d_, "pullb", "pg", PullPg() + "src=0-9 dst=0-9,4294967296");
  ExpectRefused(kInvalid, d_, "pullb", "pg", PullPg() + "src=0-3 dst=0-2");  // lengths differ
  ExpectRefused(kInvalid, p_, "pushb", "pg", PushPg() + "src=64 dst=0");
  ExpectRefused(kInvalid, p_, "pushb", "pg", PushPg() + "src=0-5 dst=60-65");
  ExpectRefused(kInvalid, p_, "pushb", "pg", PushPg() + "src=0 dst=0,1");
  // The bad block last in a long list: nothing before it moves either.
  ExpectRefused(kInvalid, d_, "pullb", "pg", PullPg() + "src=0-62,70 dst=0-63");
}

TEST_P(DdErrors, BatchIndexAndSizeOutOfRange) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  const std::string entry = std::to_string(64 * 32 * 2);
  const std::string over = std::to_string(64 * 32 * 2 + 1);
  ExpectRefused(kInvalid, d_, "pullc", "wh", PullWh() + "batch=4");
  ExpectRefused(kInvalid, d_, "pullc", "wh", PullWh() + "batch=0 lbatch=4");
  ExpectRefused(kInvalid, d_, "pullc", "wh", PullWh() + "batch=0 size=" + over);
  ExpectRefused(kInvalid, d_, "pullc", "wh", PullWh() + "batch=3 size=1000000");
  ExpectRefused(kInvalid, d_, "pullc", "wh", "key=1:13:0 size=" + over);
  ExpectRefused(kInvalid, p_, "pushc", "wh", PushWh() + "batch=4");
  ExpectRefused(kInvalid, p_, "pushc", "wh", PushWh() + "batch=0 lbatch=9");
  ExpectRefused(kInvalid, p_, "pushc", "wh", PushWh() + "batch=1 size=" + over);
  ExpectRefused(kInvalid, d_, "pullc", "wh", PullWh() + "batch=0 size=-5");
  ExpectRefused(kInvalid, p_, "pushc", "wh", PushWh() + "batch=0 size=-2");
  // The boundary itself is fine.
  DD_EXPECT_OK(d_->Xfer("pullc", "wh", PullWh() + "batch=3 lbatch=3 size=" + entry));
  EXPECT_EQ(d_->HashEntry("wh", 0, 7, 3), p_->HashEntry("wh", 0, 7, 3));
  EXPECT_EQ(p_->Events(1, 3000).size(), 1u);  // the boundary pull's event
}

TEST_P(DdErrors, LayerRangesOutOfRangeOrOfDifferentLengths) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  for (const char* r : {"sl=0:4 dl=0:4", "sl=3:4 dl=0:1", "sl=0:1 dl=3:4", "sl=0:1 dl=0:2",
                               "sl=2:1 dl=2:1", "sl=-1:-1 dl=0:1", "sl=0:1 dl=-1:-1", "sl=-2:0 dl=0:2",
                               "tpl=0", "tpl=3", "tpl=16"}) {
    ExpectRefused(kInvalid, d_, "pullb", "pg", PullPg() + "src=0 dst=0 " + std::string(r));
    ExpectRefused(kInvalid, d_, "pullc", "wh", PullWh() + "batch=0 " + std::string(r));
    ExpectRefused(kInvalid, p_, "pushb", "pg", PushPg() + "src=0 dst=0 " + std::string(r));
    ExpectRefused(kInvalid, p_, "pushc", "wh", PushWh() + "batch=0 " + std::string(r));
  }
}

TEST_P(DdErrors, DescriptionMismatch) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  for (const char* c : {"pg_shape", "pg_dims", "pg_dtype", "pg_count"}) {
    ExpectRefused(kInvalid, d_, "pullb", c, PullPg() + "src=0-3 dst=0-3");
  }
  for (const char* c : {"wh_shape", "wh_dtype"}) {
    ExpectRefused(kInvalid, d_, "pullc", c, PullWh() + "batch=1 lbatch=1");
  }
  // A whole cache's entries are not the paged cache's blocks.
  ExpectRefused(kInvalid, d_, "pullb", "pg", PullWh() + "src=0 dst=0");
}

TEST_P(DdErrors, MismatchedPushes) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  // Decode caches of other descriptions as push destinations.
  const CacheRef shape = d_->Cache("push_shape", 8, "fp16", {64, 4, 16});
  const CacheRef dtype = d_->Cache("push_dtype", 8, "bf16", {64, 4, 32});
  const CacheRef count = d_->Cache("push_count", 6, "fp16", {64, 4, 32});
  ASSERT_TRUE(shape.id > 0 && dtype.id > 0 && count.id > 0);
  const auto b1 = d_->HashTensors("push_shape"), b2 = d_->HashTensors("push_dtype"),
             b3 = d_->HashTensors("push_count");
  for (const CacheRef* c : {&shape, &dtype, &count}) {
    DD_EXPECT_ERR(kInvalid, p_->Xfer("pushb", "pg", "cluster=2 cache=" + Id(c->id) + " src=0-3 dst=0-3"));
  }
  EXPECT_EQ(d_->HashTensors("push_shape"), b1);
  EXPECT_EQ(d_->HashTensors("push_dtype"), b2);
  EXPECT_EQ(d_->HashTensors("push_count"), b3);
  ExpectNothingWritten("mismatched pushes");
}

TEST_P(DdErrors, BadLayerwiseConfigsAreRefusedUpFront) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  const std::string ok_cfg = " cfg=cluster=2/cache=" + Id(dpg_.id);
  for (const std::string& bad :
       {std::string("src=0 dst=0 cfg=cluster=2/cache=999"), std::string("src=0 dst=0 cfg=cluster=77/cache=1"),
        "src=64 dst=0" + ok_cfg, "src=0 dst=64" + ok_cfg, "src=0,1 dst=0" + ok_cfg,
        "src=0 dst=0 cfg=cluster=2/cache=" + Id(dpg_.id) + "/sl=0:1/dl=0:2",
        "src=0 dst=0 cfg=cluster=2/cache=" + Id(dpg_.id) + "/sl=3:4/dl=3:4",
        // The second config is bad: the first must not run either.
        "src=0 dst=0" + ok_cfg + " cfg=cluster=2/cache=999",
        std::string("cfg=cluster=2/key=2:99:0"), "cfg=cluster=2/cache=" + Id(dwh_.id) + "/sb=4",
        "cfg=cluster=2/cache=" + Id(dwh_.id) + "/db=4"}) {
    SCOPED_TRACE(bad);
    const std::string cache = bad.rfind("src=", 0) == 0 ? "pg" : "wh";
    const Res r = p_->Cmd("async " + cache + " fillseed=9 " + bad);
    EXPECT_FALSE(r.ok) << r.raw;
    EXPECT_FALSE(r.msg.empty()) << r.raw;
    // No gate ran (the prefill keeps its bytes too) and nothing moved.
    ExpectNothingWritten("bad layer-wise config");
  }
}

TEST_P(DdErrors, OversizeUserTag) {
  ASSERT_NO_FATAL_FAILURE(SetUpPeers());
  ExpectRefused(kInvalid, d_, "pullb", "pg", PullPg() + "src=0 dst=0 tag=" + std::string(257, 't'));
  ExpectRefused(kInvalid, p_, "pushc", "wh", PushWh() + "batch=0 tag=" + std::string(300, 't'));
}

TEST_P(DdErrors, LinkErrors) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder");
  ASSERT_NE(d, nullptr);
  DD_EXPECT_ERR("LLM_LINK_FAILED", d->Link(99, p->addr()));  // the instance there is cluster 1
  DD_EXPECT_ERR(kNotLinked, d->Unlink(*p));
  DD_EXPECT_ERR("LLM_LINK_FAILED",
                d->Link(1, "127.0.0.1:" + std::to_string(hixl_test::UnusedTcpPort()), 500));
  DD_ASSERT_OK(d->Link(*p));
  DD_EXPECT_ERR("LLM_ALREADY_LINK", d->Link(*p));
  // The link still works after the refusals.
  const CacheRef src = p->Cache("kv", 2, "fp16", {4, 8, 16});
  ASSERT_GT(d->Cache("kv", 2, "fp16", {4, 8, 16}).id, 0);
  p->Fill("kv", 5);
  DD_EXPECT_OK(d->Xfer("pullb", "kv", "cluster=1 cache=" + Id(src.id) + " src=0-3 dst=0-3"));
  EXPECT_EQ(d->HashTensors("kv"), p->HashTensors("kv"));
  // A link-out-only instance links out.
  PeerSpec no_listen;
  no_listen.listen = false;
  DdPeer* c = Spawn(3, "decoder", no_listen);
  ASSERT_NE(c, nullptr);
  ASSERT_GT(c->Cache("kv", 2, "fp16", {4, 8, 16}).id, 0);
  DD_ASSERT_OK(c->Link(*p));
  DD_EXPECT_OK(c->Xfer("pullb", "kv", "cluster=1 cache=" + Id(src.id) + " src=0-3 dst=0-3"));
  EXPECT_EQ(c->HashTensors("kv"), p->HashTensors("kv"));
}

// Several clusters in one LinkLlmClusters call: one status per cluster, the
// call answers the first failure.
TEST_P(DdErrors, PerClusterLinkStatuses) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* q = Spawn(3, "prompt");
  ASSERT_NE(q, nullptr);
  ld::LlmDataDist d(2, ld::LlmRole::kDecoder);
  LLM_ASSERT_OK(d.Initialize(InstanceOptions(link(), "")));
  auto info = [](uint64_t id, const std::string& addr) {
    ld::ClusterInfo ci;
    ci.remote_cluster_id = id;
    ci.remote_ip_infos.push_back({"127.0.0.1", static_cast<uint16_t>(hixl_test::PortOf(addr))});
    return ci;
  };
  std::vector<ld::Status> rets;
  LLM_EXPECT_OK(d.LinkLlmClusters({info(1, p->addr())}, rets, 3000));
  const ld::Status s =
      d.LinkLlmClusters({info(1, p->addr()), info(44, q->addr()), info(3, q->addr())}, rets, 3000);
  LLM_EXPECT_CODE(ld::LLM_ALREADY_LINK, s);
  ASSERT_EQ(rets.size(), 3u);
  LLM_EXPECT_CODE(ld::LLM_ALREADY_LINK, rets[0]);
  LLM_EXPECT_CODE(ld::LLM_LINK_FAILED, rets[1]);
  LLM_EXPECT_OK(rets[2]);
  EXPECT_FALSE(rets[1].message().empty());
  // Unlink: one linked, one not.
  const ld::Status u = d.UnlinkLlmClusters({info(3, q->addr()), info(44, q->addr())}, rets, 3000);
  LLM_EXPECT_CODE(ld::LLM_NOT_YET_LINK, u);
  ASSERT_EQ(rets.size(), 2u);
  LLM_EXPECT_OK(rets[0]);
  LLM_EXPECT_CODE(ld::LLM_NOT_YET_LINK, rets[1]);
  // Several addresses for one cluster: the first reachable one is linked.
  ld::ClusterInfo two = info(3, q->addr());
  two.remote_ip_infos.insert(two.remote_ip_infos.begin(),
                             {"127.0.0.1", static_cast<uint16_t>(hixl_test::UnusedTcpPort())});
  LLM_EXPECT_OK(d.LinkLlmClusters({two}, rets, 3000));
  // No address at all.
  ld::ClusterInfo none;
  none.remote_cluster_id = 5;
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, d.LinkLlmClusters({none}, rets, 1000));
  d.Finalize();
}

// LinkLlmClusters to an instance that does not answer keeps its timeout.
TEST_P(DdErrors, LinkToAHungInstanceKeepsItsTimeout) {
  DdPeer* p = Spawn(1, "prompt");
  ASSERT_NE(p, nullptr);
  DdPeer* d = Spawn(2, "decoder");
  ASSERT_NE(d, nullptr);
  ASSERT_NO_FATAL_FAILURE(Stop(*p));
  const auto t0 = std::chrono::steady_clock::now();
  const Res r = d->Link(*p, 500);
  const long long ms = ElapsedMs(t0);
  EXPECT_EQ(r.code, "LLM_LINK_FAILED") << r.raw;
  EXPECT_LT(ms, 3000) << "the 500 ms link timeout was not kept";
  Cont(*p);
  Res again = d->Link(*p, 3000);
  DD_EXPECT_OK(again);
}

// ---------------------------------------------------------------------------
// In-process: options and calls before Initialize.

TEST(DdOptions, BadInitializeOptionsAreParamInvalid) {
  const std::vector<std::map<std::string, std::string>> bad = {
      {{"llm.NoSuchOption", "1"}},
      {{"LinkType", "TCP"}},  // an engine option belongs in llm.GlobalResourceConfig
      {{ld::options::kSyncKvCacheWaitTime, "abc"}},
      {{ld::options::kSyncKvCacheWaitTime, "-5"}},
      {{ld::options::kListenIpInfo, "not-an-address"}},
      {{ld::options::kListenIpInfo, "127.0.0.1:99999"}},
      {{ld::options::kEnableSwitchRole, "maybe"}},
      {{ld::options::kGlobalResourceConfig, "{not json"}},
      {{ld::options::kGlobalResourceConfig, "[1,2]"}},
      {{ld::options::kGlobalResourceConfig, R"({"NoSuchEngineOption":"1"})"}},
      {{ld::options::kGlobalResourceConfig, R"({"LinkType":"CARRIER_PIGEON"})"}},
      {{ld::options::kTransferBackend, "nccl"}},
      {{ld::options::kCacheLeaseMs, "x"}},
      {{ld::options::kShareCachesByMapping, "yes"}},
      {{ld::options::kShareCachesByMapping, "2"}},
  };
  for (const auto& opts : bad) {
    ld::LlmDataDist d(1, ld::LlmRole::kPrompt);
    const ld::Status s = d.Initialize(opts);
    EXPECT_EQ(s.code(), ld::LLM_PARAM_INVALID) << opts.begin()->first << "=" << opts.begin()->second
                                               << " -> " << s.ToString();
    EXPECT_FALSE(s.message().empty()) << opts.begin()->first;
  }
  // Accepted values.
  ld::LlmDataDist d(1, ld::LlmRole::kPrompt);
  LLM_EXPECT_OK(d.Initialize({{ld::options::kDeviceId, "0"},
                              {ld::options::kTransferBackend, "hixl"},
                              {ld::options::kSyncKvCacheWaitTime, "500"},
                              {ld::options::kShareCachesByMapping, "0"},
                              {ld::options::kListenIpInfo, "127.0.0.1:0"}}));
  EXPECT_NE(hixl_test::PortOf(d.LocalAddress()), 0) << d.LocalAddress();
}

TEST(DdOptions, SetRoleNeedsEnableSwitchRole) {
  ld::LlmDataDist d(1, ld::LlmRole::kPrompt);
  LLM_ASSERT_OK(d.Initialize({}));
  LLM_EXPECT_CODE(ld::LLM_FEATURE_NOT_ENABLED, d.SetRole(ld::LlmRole::kDecoder));
  EXPECT_EQ(d.Role(), ld::LlmRole::kPrompt);
  ld::LlmDataDist e(2, ld::LlmRole::kPrompt);
  LLM_ASSERT_OK(e.Initialize({{ld::options::kEnableSwitchRole, "1"}, {ld::options::kListenIpInfo, "127.0.0.1:0"}}));
  LLM_EXPECT_OK(e.SetRole(ld::LlmRole::kDecoder));
  EXPECT_EQ(e.Role(), ld::LlmRole::kDecoder);
  LLM_EXPECT_OK(e.SetRole(ld::LlmRole::kMix, {{ld::options::kListenIpInfo, "127.0.0.1:0"}}));
  EXPECT_EQ(e.Role(), ld::LlmRole::kMix);
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, e.SetRole(ld::LlmRole::kPrompt, {{ld::options::kListenIpInfo, "127.0.0.1:1"}}));
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, e.SetRole(ld::LlmRole::kPrompt, {{"llm.NoSuchOption", "1"}}));
  EXPECT_EQ(e.Role(), ld::LlmRole::kMix);
}

// The address the instance listens on (LocalAddress()) is its current
// listening address, whether it was configured with port 0 or not.
TEST(DdOptions, SetRoleAcceptsTheBoundListenAddress) {
  ld::LlmDataDist e(2, ld::LlmRole::kPrompt);
  LLM_ASSERT_OK(e.Initialize({{ld::options::kEnableSwitchRole, "1"}, {ld::options::kListenIpInfo, "127.0.0.1:0"}}));
  LLM_EXPECT_OK(e.SetRole(ld::LlmRole::kDecoder, {{ld::options::kListenIpInfo, e.LocalAddress()}}));
  EXPECT_EQ(e.Role(), ld::LlmRole::kDecoder);
}

TEST(DdOptions, RegisterRejectsBadDescriptions) {
  ld::LlmDataDist d(1, ld::LlmRole::kPrompt);
  LLM_ASSERT_OK(d.Initialize({}));
  std::vector<unsigned char> mem(4 * 4096);
  const uint64_t a = reinterpret_cast<uint64_t>(mem.data());
  auto desc = [](uint32_t nt, ld::DataType dt, std::vector<int64_t> shape) {
    ld::CacheDesc c;
    c.num_tensors = nt;
    c.data_type = dt;
    c.shape = std::move(shape);
    return c;
  };
  int64_t id = 0;
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, d.RegisterKvCache(desc(2, ld::DT_FLOAT16, {4, 16}), {a}, {}, id));
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, d.RegisterKvCache(desc(1, ld::DT_FLOAT16, {0, 16}), {a}, {}, id));
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, d.RegisterKvCache(desc(1, ld::DT_FLOAT16, {}), {a}, {}, id));
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, d.RegisterKvCache(desc(1, static_cast<ld::DataType>(99), {4, 16}), {a}, {}, id));
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, d.RegisterKvCache(desc(1, ld::DT_FLOAT16, {4, 16}), {0}, {}, id));
  ld::RegisterCfg too_many_keys;
  too_many_keys.cache_keys.resize(5);
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, d.RegisterKvCache(desc(1, ld::DT_FLOAT16, {4, 16}), {a}, too_many_keys, id));
  ld::RegisterCfg model;
  model.blocks_model_id = 3;
  LLM_EXPECT_OK(d.RegisterKvCache(desc(1, ld::DT_FLOAT16, {4, 16}), {a}, model, id));
  int64_t id2 = 0;
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID,
                  d.RegisterKvCache(desc(1, ld::DT_FLOAT16, {4, 16}), {a + 4096}, model, id2));
  LLM_EXPECT_CODE(ld::LLM_KV_CACHE_NOT_EXIST, d.UnregisterKvCache(12345));
  LLM_EXPECT_OK(d.UnregisterKvCache(id));
}

TEST(DdOptions, StatusNamesAndSizes) {
  EXPECT_STREQ(ld::StatusCodeName(ld::LLM_SUCCESS), "LLM_SUCCESS");
  EXPECT_STREQ(ld::StatusCodeName(ld::LLM_PARAM_INVALID), "LLM_PARAM_INVALID");
  EXPECT_STREQ(ld::StatusCodeName(ld::LLM_KV_CACHE_NOT_EXIST), "LLM_KV_CACHE_NOT_EXIST");
  EXPECT_STREQ(ld::StatusCodeName(0x12345u), "LLM_UNKNOWN");
  EXPECT_EQ(ld::DataTypeSize(ld::DT_FLOAT16), 2u);
  EXPECT_EQ(ld::DataTypeSize(ld::DT_BF16), 2u);
  EXPECT_EQ(ld::DataTypeSize(ld::DT_DOUBLE), 8u);
  EXPECT_EQ(ld::DataTypeSize(5), 0u);
  const ld::Status s(ld::LLM_PARAM_INVALID, "block 7 is out of range");
  EXPECT_EQ(s.ToString().rfind("LLM_PARAM_INVALID (0x5010b005): block 7", 0), 0u) << s.ToString();
  EXPECT_EQ(ld::Status().ToString(), "LLM_SUCCESS");
}

TEST(DdOptions, CallsBeforeInitializeFail) {
  ld::LlmDataDist d(1, ld::LlmRole::kPrompt);
  std::vector<ld::Status> rets;
  ld::ClusterInfo ci;
  ci.remote_cluster_id = 2;
  ci.remote_ip_infos.push_back({"127.0.0.1", 1});
  EXPECT_FALSE(d.LinkLlmClusters({ci}, rets, 100).ok());
  ld::Cache c;
  c.cache_id = 1;
  EXPECT_FALSE(d.PullKvBlocks(ld::CacheIndex{2, 1, 0}, c, {0}, {0}).ok());
  std::vector<ld::KvTransferEvent> evs;
  (void)d.GetKvTransferEvents(evs);
  EXPECT_TRUE(evs.empty());
  d.Finalize();
  d.Finalize();
}

}  // namespace
}  // namespace dd_test
