// The C API's discovery (hixlListEngines) against a real etcd: engines made
// with hixlCreateEngine and HIXL_OPTION_METADATA_SERVER list each other;
// counts, a short array, the size query, bad arguments, no metadata server.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "etcd_process.h"
#include "hixl/hixl_c.h"

namespace {

class CApiDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    ASSERT_TRUE(etcd_.Start(why)) << why;
  }
  void TearDown() override {
    for (HixlEngine e : engines_) hixlDestroyEngine(e);
  }
  // name empty: a client-only engine (publishes nothing).
  HixlEngine Make(const std::string& name, bool with_etcd = true) {
    HixlConfig cfg = nullptr;
    HixlEngine e = nullptr;
    EXPECT_EQ(hixlCreateConfig(&cfg), HIXL_SUCCESS);
    EXPECT_EQ(hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, "127.0.0.1"), HIXL_SUCCESS);
    if (!name.empty()) {
      EXPECT_EQ(hixlConfigSetInt(cfg, HIXL_OPTION_LOCAL_PORT, 0), HIXL_SUCCESS);
      EXPECT_EQ(hixlConfigSetString(cfg, HIXL_OPTION_ENGINE_NAME, name.c_str()), HIXL_SUCCESS);
    }
    if (with_etcd) {
      EXPECT_EQ(hixlConfigSetString(cfg, HIXL_OPTION_METADATA_SERVER, etcd_.endpoints().c_str()),
                HIXL_SUCCESS);
    }
    EXPECT_EQ(hixlCreateEngine(cfg, &e), HIXL_SUCCESS) << hixlGetLastErrorMessage();
    hixlDestroyConfig(cfg);
    if (e != nullptr) engines_.push_back(e);
    return e;
  }

  hixl::testing::EtcdProcess etcd_;
  std::vector<HixlEngine> engines_;
};

TEST_F(CApiDiscoveryTest, ListsEnginesByName) {
  HixlEngine a = Make("alpha");
  HixlEngine b = Make("beta");
  HixlEngine client = Make("");
  ASSERT_TRUE(a && b && client);

  // The size query, then the full list (the watch may lag a moment).
  size_t count = 0;
  for (int i = 0; i < 3000 && count < 2; ++i) {
    ASSERT_EQ(hixlListEngines(client, nullptr, 0, &count), HIXL_SUCCESS)
        << hixlGetLastErrorMessage();
    if (count < 2) usleep(1000);
  }
  ASSERT_EQ(count, 2u);
  std::vector<HixlEngineRecord> out(4);
  std::memset(out.data(), 0x7f, out.size() * sizeof(HixlEngineRecord));
  ASSERT_EQ(hixlListEngines(client, out.data(), out.size(), &count), HIXL_SUCCESS);
  ASSERT_EQ(count, 2u);
  EXPECT_STREQ(out[0].name, "alpha");  // name order
  EXPECT_STREQ(out[1].name, "beta");
  EXPECT_STREQ(out[0].address, hixlGetLocalEngine(a));
  EXPECT_STREQ(out[1].address, hixlGetLocalEngine(b));
  EXPECT_NE(out[0].generation, 0u);
  EXPECT_NE(out[0].generation, out[1].generation);
  // Records past the count are untouched.
  EXPECT_EQ(static_cast<unsigned char>(out[2].name[0]), 0x7f);

  // A short array: the first records, and the total.
  HixlEngineRecord one;
  ASSERT_EQ(hixlListEngines(client, &one, 1, &count), HIXL_SUCCESS);
  EXPECT_EQ(count, 2u);
  EXPECT_STREQ(one.name, "alpha");
  // The name works in place of an address.
  EXPECT_EQ(hixlConnect(client, "beta", 3000), HIXL_SUCCESS) << hixlGetLastErrorMessage();
  // A listed engine lists itself.
  ASSERT_EQ(hixlListEngines(a, out.data(), out.size(), &count), HIXL_SUCCESS);
  EXPECT_EQ(count, 2u);
}

TEST_F(CApiDiscoveryTest, BadArgumentsAndNoMetadataServer) {
  HixlEngine client = Make("");
  ASSERT_NE(client, nullptr);
  HixlEngineRecord rec;
  size_t count = 7;
  EXPECT_EQ(hixlListEngines(nullptr, &rec, 1, &count), HIXL_PARAM_INVALID);
  EXPECT_EQ(hixlListEngines(client, nullptr, 1, &count), HIXL_PARAM_INVALID);
  EXPECT_EQ(hixlListEngines(client, &rec, 1, nullptr), HIXL_PARAM_INVALID);
  EXPECT_EQ(count, 7u);
  HixlEngine plain = Make("", /*with_etcd=*/false);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(hixlListEngines(plain, &rec, 1, &count), HIXL_UNSUPPORTED);
  EXPECT_NE(std::string(hixlGetLastErrorMessage()).find("MetadataServer"), std::string::npos)
      << hixlGetLastErrorMessage();
  // A destroyed engine is not a live handle.
  ASSERT_EQ(hixlDestroyEngine(plain), HIXL_SUCCESS);
  engines_.pop_back();
  EXPECT_EQ(hixlListEngines(plain, &rec, 1, &count), HIXL_PARAM_INVALID);
}

}  // namespace
