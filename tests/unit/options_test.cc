// Unit tests of the engine's option table (engine/options.h).
#include "engine/options.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

namespace hixl {
namespace {

using engine::Options;
using engine::ParseOptions;

Status Parse(std::map<std::string, std::string> in, Options* out = nullptr) {
  Options o;
  Status s = ParseOptions(in, o);
  if (out != nullptr) *out = o;
  return s;
}

TEST(Options, EveryPublicKeyIsKnownOnce) {
  const auto& keys = engine::OptionKeys();
  std::set<std::string> unique(keys.begin(), keys.end());
  EXPECT_EQ(unique.size(), keys.size());
  for (const char* k : {options::kLinkType,
                        options::kCopyThreads,
                        options::kEnableUseFabricMem,
                        options::kDeregisterTimeoutMs,
                        options::kHandshakeTimeoutMs,
                        options::kTcpLanes,
                        options::kTcpSliceSize,
                        options::kTcpIoThreads,
                        options::kHeartbeatIntervalMs,
                        options::kHeartbeatMisses,
                        options::kAutoConnect,
                        options::kConnectTimeoutMs,
                        options::kMaxPeers,
                        options::kPeersLowWater,
                        options::kNotifyQueueDepth,
                        options::kAuthSecret,
                        options::kAuthSecretFile,
                        options::kAuthRequired,
                        options::kMetadataServer,
                        options::kMetadataPrefix,
                        options::kEngineName,
                        options::kMetadataTtlS,
                        options::kPollSpinUs,
                        options::kShmNotifyRing,
                        options::kShmStreamCopyBytes}) {
    EXPECT_EQ(unique.count(k), 1u) << k;
  }
#ifdef HIXL_HAVE_UCX
  EXPECT_EQ(unique.count(options::kUcxErrorHandling), 1u);
  EXPECT_EQ(unique.count(options::kUcxAllocMem), 1u);
  EXPECT_EQ(keys.size(), 27u) << "a key was added: list it above too";
#else
  EXPECT_EQ(keys.size(), 25u) << "a key was added: list it above too";
#endif
}

TEST(Options, DiscoverySettings) {
  Options o;
#ifdef HIXL_HAVE_ETCD
  ASSERT_TRUE(Parse({{"MetadataServer", "etcd://127.0.0.1:2379,10.0.0.2:2379"},
                     {"EngineName", "decode-3"},
                     {"MetadataTtlS", "5"}},
                    &o)
                  .ok());
  EXPECT_EQ(o.engine_name, "decode-3");
  EXPECT_EQ(o.metadata_prefix, "hixl/");
  EXPECT_EQ(o.metadata_ttl_s, 5);
  EXPECT_EQ(Parse({{"MetadataServer", "http://127.0.0.1:2379"}}).code(),
            StatusCode::kParamInvalid);
  EXPECT_EQ(Parse({{"MetadataServer", "etcd://127.0.0.1:2379"}, {"EngineName", "a b"}}).code(),
            StatusCode::kParamInvalid);
  EXPECT_EQ(Parse({{"MetadataServer", "etcd://127.0.0.1:2379"}, {"MetadataPrefix", ""}}).code(),
            StatusCode::kParamInvalid);
#else
  EXPECT_EQ(Parse({{"MetadataServer", "etcd://127.0.0.1:2379"}}).code(), StatusCode::kUnsupported);
#endif
  EXPECT_EQ(Parse({{"EngineName", "decode-3"}}).code(), StatusCode::kParamInvalid)
      << "EngineName needs MetadataServer";
}

TEST(Options, AuthenticationSettings) {
  Options o;
  ASSERT_TRUE(Parse({{"AuthSecret", "0123456789abcdef"}}, &o).ok());
  EXPECT_EQ(o.auth_secret, "0123456789abcdef");
  EXPECT_TRUE(o.auth_required) << "a secret requires authentication by default";
  ASSERT_TRUE(Parse({{"AuthSecret", "0123456789abcdef"}, {"AuthRequired", "0"}}, &o).ok());
  EXPECT_FALSE(o.auth_required);
  EXPECT_FALSE(Parse({{"AuthRequired", "1"}}, &o).ok());
  EXPECT_TRUE(Parse({{"AuthRequired", "0"}}, &o).ok());
  EXPECT_FALSE(Parse({{"AuthSecret", "0123456789abcde"}}, &o).ok()) << "15 bytes";
}

TEST(Options, DefaultsAndValues) {
  Options o;
  ASSERT_TRUE(Parse({}, &o).ok());
  EXPECT_EQ(o.link, LinkType::AUTO);
  EXPECT_EQ(o.hb_interval_ms, 1000);
  EXPECT_EQ(o.hb_misses, 3);
  EXPECT_FALSE(o.auto_connect);
  EXPECT_TRUE(o.auth_secret.empty());
  EXPECT_FALSE(o.auth_required);
  EXPECT_EQ(o.max_peers, 0u);
  ASSERT_TRUE(Parse({{"LinkType", "HCCS"},
                     {"HeartbeatIntervalMs", "10"},
                     {"AutoConnect", "1"},
                     {"TcpSliceSize", "67108864"},
                     {"NotifyQueueDepth", "1"}},
                    &o)
                  .ok());
  EXPECT_EQ(o.link, LinkType::SHM);
  EXPECT_EQ(o.hb_interval_ms, 10);
  EXPECT_TRUE(o.auto_connect);
  EXPECT_EQ(o.transport_settings.at("TcpSliceSize"), int64_t{64} << 20);
  EXPECT_EQ(o.transport_settings.at("TcpLanes"), 2);  // a transport option's default
  EXPECT_EQ(o.notify_depth, 1u);
}

TEST(Options, BadValuesAreRefused) {
  EXPECT_EQ(Parse({{"Nope", "1"}}).code(), StatusCode::kParamInvalid);
#ifdef HIXL_HAVE_UCX
  EXPECT_TRUE(Parse({{"LinkType", "RDMA"}}).ok());
  EXPECT_EQ(Parse({{"UcxErrorHandling", "SOMETIMES"}}).code(), StatusCode::kParamInvalid);
#else
  EXPECT_EQ(Parse({{"LinkType", "RDMA"}}).code(), StatusCode::kUnsupported);
#endif
  EXPECT_EQ(Parse({{"LinkType", "shm"}}).code(), StatusCode::kParamInvalid);
  for (const auto& [k, v] :
       std::map<std::string, std::string>{{"HeartbeatIntervalMs", "9"},
                                          {"HeartbeatMisses", "0"},
                                          {"AutoConnect", "2"},
                                          {"CopyThreads", "65"},
                                          {"TcpSliceSize", "4095"},
                                          {"MaxPeers", "-1"},
                                          {"NotifyQueueDepth", "0"},
                                          {"ConnectTimeoutMs", "1e3"},
                                          {"TcpLanes", ""},
                                          {"TcpIoThreads", "99999999999999"}}) {
    EXPECT_EQ(Parse({{k, v}}).code(), StatusCode::kParamInvalid) << k << "=" << v;
  }
}

TEST(Options, PeerWaterMarks) {
  Options o;
  ASSERT_TRUE(Parse({{"MaxPeers", "8"}}, &o).ok());
  EXPECT_EQ(o.low_water, 6u);  // 3/4 by default
  ASSERT_TRUE(Parse({{"MaxPeers", "8"}, {"PeersLowWater", "0"}}, &o).ok());
  EXPECT_EQ(o.low_water, 0u);
  EXPECT_FALSE(Parse({{"MaxPeers", "8"}, {"PeersLowWater", "8"}}).ok());
  EXPECT_FALSE(Parse({{"PeersLowWater", "2"}}).ok());  // needs MaxPeers
}

}  // namespace
}  // namespace hixl
