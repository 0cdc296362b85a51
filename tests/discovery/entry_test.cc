// The registry entry codec and name rules (no etcd needed).
#include "discovery/entry.h"

#include <gtest/gtest.h>

namespace hixl::discovery {
namespace {

EngineEntry Sample() {
  return EngineEntry{"prefill-0", "10.0.0.1:5000", 42, "host-abc", 1234};
}

TEST(EngineName, AcceptsAndRefuses) {
  EXPECT_TRUE(CheckEngineName("a").ok());
  EXPECT_TRUE(CheckEngineName("10.0.0.1:5000").ok());
  EXPECT_TRUE(CheckEngineName("decode_1.x-y").ok());
  EXPECT_TRUE(CheckEngineName(std::string(128, 'n')).ok());
  EXPECT_EQ(CheckEngineName("").code(), StatusCode::kParamInvalid);
  EXPECT_EQ(CheckEngineName(std::string(129, 'n')).code(), StatusCode::kParamInvalid);
  EXPECT_EQ(CheckEngineName("a/b").code(), StatusCode::kParamInvalid);
  EXPECT_EQ(CheckEngineName("a b").code(), StatusCode::kParamInvalid);
  EXPECT_EQ(CheckEngineName(std::string("a\0b", 3)).code(), StatusCode::kParamInvalid);
  EXPECT_EQ(CheckEngineName("[::1]:5").code(), StatusCode::kParamInvalid);
}

TEST(Entry, RoundTrip) {
  EngineEntry e = Sample();
  EngineEntry got;
  ASSERT_TRUE(DecodeEntry(e.name, EncodeEntry(e), got).ok());
  EXPECT_EQ(got, e);
  e.address = "[::1]:7000";
  e.generation = ~0ull;
  ASSERT_TRUE(DecodeEntry(e.name, EncodeEntry(e), got).ok());
  EXPECT_EQ(got, e);
}

TEST(Entry, RefusesMalformedAndForeignValues) {
  const std::string name = "prefill-0";
  EngineEntry got;
  auto refused = [&](const std::string& value) {
    Status s = DecodeEntry(name, value, got);
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << value;
    EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
  };
  refused("");
  refused("not json");
  refused("[1,2]");
  refused("{\"v\":1");
  refused(std::string(100, '[') + std::string(100, ']'));
  refused(std::string(5000, ' ') + EncodeEntry(Sample()));  // too large
  const std::string good_tail =
      ",\"address\":\"10.0.0.1:5000\",\"generation\":42,\"host_id\":\"h\",\"pid\":1}";
  refused("{\"v\":2,\"name\":\"prefill-0\"" + good_tail);
  refused("{\"v\":\"1\",\"name\":\"prefill-0\"" + good_tail);
  refused("{\"name\":\"prefill-0\"" + good_tail);
  refused("{\"v\":1,\"name\":\"other\"" + good_tail);
  refused("{\"v\":1,\"name\":7" + good_tail);
  refused("{\"v\":1,\"name\":\"prefill-0\",\"address\":\"host:5000\",\"generation\":42,"
          "\"host_id\":\"h\",\"pid\":1}");
  refused("{\"v\":1,\"name\":\"prefill-0\",\"address\":\"10.0.0.1\",\"generation\":42,"
          "\"host_id\":\"h\",\"pid\":1}");
  refused("{\"v\":1,\"name\":\"prefill-0\",\"address\":\"10.0.0.1:5000\",\"generation\":0,"
          "\"host_id\":\"h\",\"pid\":1}");
  refused("{\"v\":1,\"name\":\"prefill-0\",\"address\":\"10.0.0.1:5000\",\"generation\":-1,"
          "\"host_id\":\"h\",\"pid\":1}");
  refused("{\"v\":1,\"name\":\"prefill-0\",\"address\":\"10.0.0.1:5000\",\"generation\":1.5,"
          "\"host_id\":\"h\",\"pid\":1}");
  refused("{\"v\":1,\"name\":\"prefill-0\",\"address\":\"10.0.0.1:5000\",\"generation\":4,"
          "\"host_id\":\"h\",\"pid\":0}");
  refused("{\"v\":1,\"name\":\"prefill-0\",\"address\":\"10.0.0.1:5000\",\"generation\":4,"
          "\"host_id\":\"" + std::string(300, 'h') + "\",\"pid\":3}");
  refused("{\"v\":1,\"name\":\"prefill-0\",\"address\":\"10.0.0.1:5000\",\"generation\":4,"
          "\"pid\":3}");
}

TEST(Entry, CheckEntryRefusesBadEntries) {
  EngineEntry e = Sample();
  EXPECT_TRUE(CheckEntry(e).ok());
  e.generation = 0;
  EXPECT_EQ(CheckEntry(e).code(), StatusCode::kParamInvalid);
  e = Sample();
  e.address = "10.0.0.1:0";
  EXPECT_EQ(CheckEntry(e).code(), StatusCode::kParamInvalid);
  e = Sample();
  e.pid = -5;
  EXPECT_EQ(CheckEntry(e).code(), StatusCode::kParamInvalid);
}

}  // namespace
}  // namespace hixl::discovery
