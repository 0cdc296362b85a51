// tests/discovery/datadist_discovery_test.cc — LLM-DataDist over etcd
// discovery: with MetadataServer in llm.GlobalResourceConfig a listening
// instance is published as "llm-cluster-<id>" and LinkLlmClusters links a
// cluster by its id alone (empty remote_ip_infos); the cluster id the peer
// reports is still checked. A real etcd on free loopback ports.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "etcd_process.h"
#include "llm_datadist/llm_datadist.h"

namespace {

using llm_datadist::ClusterInfo;
using llm_datadist::LlmDataDist;
using llm_datadist::LlmRole;

std::string Config(const std::string& endpoints, const std::string& extra = "") {
  return "{\"MetadataServer\":\"" + endpoints + "\"" + extra + "}";
}

TEST(DataDistDiscovery, LinksAClusterByIdAlone) {
  hixl::testing::EtcdProcess etcd;
  std::string why;
  ASSERT_TRUE(etcd.Start(why)) << why;
  LlmDataDist prompt(1, LlmRole::kPrompt);
  ASSERT_TRUE(prompt
                  .Initialize({{llm_datadist::options::kListenIpInfo, "127.0.0.1:0"},
                               {llm_datadist::options::kGlobalResourceConfig,
                                Config(etcd.endpoints())}})
                  .ok());
  LlmDataDist decoder(2, LlmRole::kDecoder);
  ASSERT_TRUE(decoder
                  .Initialize({{llm_datadist::options::kGlobalResourceConfig,
                                Config(etcd.endpoints())}})
                  .ok());
  ClusterInfo by_id;
  by_id.remote_cluster_id = 1;
  ClusterInfo missing;
  missing.remote_cluster_id = 99;
  std::vector<llm_datadist::Status> rets;
  (void)decoder.LinkLlmClusters({by_id, missing}, rets, 3000);
  ASSERT_EQ(rets.size(), 2u);
  EXPECT_TRUE(rets[0].ok()) << rets[0].ToString();
  EXPECT_FALSE(rets[1].ok());
  EXPECT_NE(rets[1].ToString().find("llm-cluster-99"), std::string::npos) << rets[1].ToString();
  // Linked once: a second link of the same cluster says so.
  (void)decoder.LinkLlmClusters({by_id}, rets, 3000);
  ASSERT_EQ(rets.size(), 1u);
  EXPECT_EQ(rets[0].code(), llm_datadist::LLM_ALREADY_LINK) << rets[0].ToString();
}

TEST(DataDistDiscovery, ANameThatIsAnotherClusterIsRefused) {
  hixl::testing::EtcdProcess etcd;
  std::string why;
  ASSERT_TRUE(etcd.Start(why)) << why;
  // Cluster 7 publishes itself under the name cluster 8 would have.
  LlmDataDist impostor(7, LlmRole::kPrompt);
  ASSERT_TRUE(impostor
                  .Initialize({{llm_datadist::options::kListenIpInfo, "127.0.0.1:0"},
                               {llm_datadist::options::kGlobalResourceConfig,
                                Config(etcd.endpoints(), ",\"EngineName\":\"llm-cluster-8\"")}})
                  .ok());
  LlmDataDist decoder(2, LlmRole::kDecoder);
  ASSERT_TRUE(decoder
                  .Initialize({{llm_datadist::options::kGlobalResourceConfig,
                                Config(etcd.endpoints())}})
                  .ok());
  ClusterInfo c;
  c.remote_cluster_id = 8;
  std::vector<llm_datadist::Status> rets;
  (void)decoder.LinkLlmClusters({c}, rets, 3000);
  ASSERT_EQ(rets.size(), 1u);
  EXPECT_FALSE(rets[0].ok());
  EXPECT_NE(rets[0].ToString().find("is cluster 7"), std::string::npos) << rets[0].ToString();
}

TEST(DataDistDiscovery, EmptyAddressesWithoutDiscoveryAreRefused) {
  LlmDataDist decoder(2, LlmRole::kDecoder);
  ASSERT_TRUE(decoder.Initialize({}).ok());
  ClusterInfo c;
  c.remote_cluster_id = 1;
  std::vector<llm_datadist::Status> rets;
  (void)decoder.LinkLlmClusters({c}, rets, 1000);
  ASSERT_EQ(rets.size(), 1u);
  EXPECT_EQ(rets[0].code(), llm_datadist::LLM_PARAM_INVALID) << rets[0].ToString();
}

}  // namespace
