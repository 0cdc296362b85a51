// Unit tests of what LLM-DataDist instances tell each other
// (src/datadist/metadata.*): the cache table, its root, the handshake info
// and transfer events — round trips, and hostile bytes refused.
#include "datadist/metadata.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace llm_datadist::internal {
namespace {

Table Sample() {
  Table t;
  t.version = 7;
  t.cluster_id = 42;
  CacheEntry c;
  c.id = 3;
  c.num_tensors = 2;
  c.data_type = DT_BF16;
  c.shape = {16, 8, 128};
  c.addrs = {0x10000, 0x90000};
  c.keys = {{42, 100, 0}, {42, 101, 0}};
  c.key_batches = {0, 5};
  c.blocks_model_id = 9;
  c.fence = 0x7000;
  t.caches.push_back(c);
  t.released.push_back({{42, 99, 0}, "released: its lease of 10 ms expired"});
  return t;
}

TEST(DatadistMetadata, TableRoundTrip) {
  auto bytes = EncodeTable(Sample());
  Table t;
  ASSERT_TRUE(DecodeTable(bytes.data(), bytes.size(), t).ok());
  EXPECT_EQ(t.version, 7u);
  EXPECT_EQ(t.cluster_id, 42u);
  ASSERT_EQ(t.caches.size(), 1u);
  EXPECT_EQ(t.caches[0].shape, (std::vector<int64_t>{16, 8, 128}));
  EXPECT_EQ(t.caches[0].addrs, (std::vector<uint64_t>{0x10000, 0x90000}));
  EXPECT_EQ(t.caches[0].key_batches, (std::vector<uint32_t>{0, 5}));
  EXPECT_EQ(*t.caches[0].blocks_model_id, 9u);
  ASSERT_EQ(t.released.size(), 1u);
  EXPECT_EQ(t.released[0].key.req_id, 99u);
}

TEST(DatadistMetadata, EveryCorruptedByteIsCaught) {
  auto good = EncodeTable(Sample());
  for (size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= 0x5A;
    Table t;
    EXPECT_FALSE(DecodeTable(bad.data(), bad.size(), t).ok()) << "byte " << i;
  }
  for (size_t n = 0; n < good.size(); ++n) {
    Table t;
    EXPECT_FALSE(DecodeTable(good.data(), n, t).ok()) << "length " << n;
  }
}

TEST(DatadistMetadata, WellFormedButWrongFieldsAreRefused) {
  // A table whose checksum is right but whose content lies: key batch past
  // the cache's entries, zero address, bad shape.
  auto refused = [](Table t) {
    auto b = EncodeTable(t);
    Table out;
    return !DecodeTable(b.data(), b.size(), out).ok();
  };
  Table t = Sample();
  t.caches[0].key_batches[1] = 16;
  EXPECT_TRUE(refused(t));
  t = Sample();
  t.caches[0].addrs[0] = 0;
  EXPECT_TRUE(refused(t));
  t = Sample();
  t.caches[0].shape = {16, 0};
  EXPECT_TRUE(refused(t));
  t = Sample();
  t.caches[0].addrs.pop_back();
  EXPECT_TRUE(refused(t));
  t = Sample();
  t.caches[0].id = 0;
  EXPECT_TRUE(refused(t));
  t = Sample();
  t.caches[0].fence = 0;
  EXPECT_TRUE(refused(t));
}

TEST(DatadistMetadata, RootAndInfo) {
  uint8_t b[kRootSize];
  EncodeRoot({5, 0x7000, 4096}, b);
  Root r;
  ASSERT_TRUE(DecodeRoot(b, r));
  EXPECT_EQ(r.version, 5u);
  EXPECT_EQ(r.table_addr, 0x7000u);
  b[17] ^= 1;  // torn address
  EXPECT_FALSE(DecodeRoot(b, r));

  InstanceInfo i;
  ASSERT_TRUE(DecodeInfo(EncodeInfo({9, 2, 0x1234}), i).ok());
  EXPECT_EQ(i.cluster_id, 9u);
  EXPECT_EQ(i.root_addr, 0x1234u);
  EXPECT_FALSE(DecodeInfo("", i).ok());
  EXPECT_FALSE(DecodeInfo("{\"llmdd\":2,\"cluster\":1,\"role\":1,\"root\":5}", i).ok());
  EXPECT_FALSE(DecodeInfo("{\"llmdd\":1,\"cluster\":-1,\"role\":1,\"root\":5}", i).ok());
  EXPECT_FALSE(DecodeInfo("{\"llmdd\":1,\"cluster\":1,\"role\":1,\"root\":0}", i).ok());
}

EventMsg Event(std::vector<uint64_t> blocks) {
  EventMsg e;
  e.kind = KvTransferEvent::Kind::kPushed;
  e.sender_cluster = 5;
  e.seq = 77;
  e.cache_id = 2;
  e.key = CacheKey{1, 2, 3};
  e.first_layer = 1;
  e.last_layer = 4;
  e.user_tag = "req-17";
  e.blocks = std::move(blocks);
  return e;
}

TEST(DatadistMetadata, SmallEventIsOneNotification) {
  auto parts = EncodeEvent(Event({4, 5, 6, 1}));
  ASSERT_EQ(parts.size(), 1u);
  EventAssembler a;
  EventMsg out;
  std::string why;
  ASSERT_TRUE(a.Feed("peer", parts[0], out, why)) << why;
  EXPECT_EQ(out.blocks, (std::vector<uint64_t>{4, 5, 6, 1}));
  EXPECT_EQ(out.user_tag, "req-17");
  EXPECT_EQ(out.key->model_id, 3u);
  EXPECT_EQ(out.last_layer, 4);
}

TEST(DatadistMetadata, LongBlockListsTravelInParts) {
  std::vector<uint64_t> blocks(100000);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937_64(3));
  auto parts = EncodeEvent(Event(blocks));
  ASSERT_GT(parts.size(), 1u);
  EventAssembler a;
  EventMsg out;
  std::string why;
  for (size_t i = 0; i < parts.size(); ++i) {
    ASSERT_LE(parts[i].size(), 1024u);
    bool done = a.Feed("peer", parts[i], out, why);
    ASSERT_EQ(done, i + 1 == parts.size()) << why;
  }
  // So many scattered blocks travel as a bitmap (ascending), in few parts.
  EXPECT_LE(parts.size(), 16u);
  std::sort(blocks.begin(), blocks.end());
  EXPECT_EQ(out.blocks, blocks);
}

TEST(DatadistMetadata, HostileEventsAreDropped) {
  EventAssembler a;
  EventMsg out;
  std::string why;
  auto parts = EncodeEvent(Event({1, 2, 3}));
  for (size_t n = 0; n < parts[0].size(); ++n) {
    std::string cut = parts[0].substr(0, n);
    (void)a.Feed("peer", cut, out, why);  // must not crash; short prefixes fail
  }
  std::string bad = parts[0];
  bad[0] = 9;  // unknown format
  EXPECT_FALSE(a.Feed("peer", bad, out, why));
  // A later part without its beginning.
  std::vector<uint64_t> many(20000);
  std::iota(many.begin(), many.end(), 0);
  std::shuffle(many.begin(), many.end(), std::mt19937_64(1));
  auto long_parts = EncodeEvent(Event(many));
  ASSERT_GT(long_parts.size(), 2u);
  EXPECT_FALSE(a.Feed("other", long_parts[1], out, why));
  // Parts out of order.
  EXPECT_FALSE(a.Feed("p2", long_parts[0], out, why));
  EXPECT_FALSE(a.Feed("p2", long_parts[2], out, why));
  EXPECT_FALSE(a.Feed("p2", long_parts[1], out, why));
}

}  // namespace
}  // namespace llm_datadist::internal
