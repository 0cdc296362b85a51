// Unit tests of the local region table and of descriptor validation against
// a peer's regions.
#include <gtest/gtest.h>

#include <random>

#include "memory/local_regions.h"
#include "memory/remote_regions.h"

namespace hixl {
namespace {

memory::LocalRegion Region(uintptr_t addr, size_t len) {
  memory::LocalRegion r;
  r.addr = addr;
  r.len = len;
  r.perms = MEM_PERM_READ_WRITE;
  return r;
}

// A region being deregistered keeps answering lookups (in-flight requests
// peers checked before they heard of the removal), is hidden from new peers,
// and cannot be registered again until it is gone.
TEST(LocalRegions, RetiringRegionServesLookupsButNotNewPeers) {
  memory::LocalRegions t;
  memory::LocalRegion r;
  r.addr = 0x100000;
  r.len = 0x1000;
  r.perms = MEM_PERM_READ_WRITE;
  uint64_t id = 0;
  bool added = false;
  ASSERT_TRUE(t.Add(r, id, added).ok());
  ASSERT_TRUE(t.Retire(id).has_value());
  EXPECT_FALSE(t.Retire(id).has_value()) << "retiring twice";
  EXPECT_TRUE(t.FindContaining(0x100010, 16).has_value());
  EXPECT_TRUE(t.Snapshot().empty());
  uint64_t again = 0;
  EXPECT_EQ(t.Add(r, again, added).code(), StatusCode::kParamInvalid);
  ASSERT_TRUE(t.Remove(id).has_value());
  EXPECT_FALSE(t.FindContaining(0x100010, 16).has_value());
  ASSERT_TRUE(t.Add(r, again, added).ok());
  EXPECT_TRUE(added);
  EXPECT_NE(again, id);
}

TEST(LocalRegions, OverlapRules) {
  memory::LocalRegions t;
  uint64_t a = 0, b = 0, c = 0;
  bool added = false;
  ASSERT_TRUE(t.Add(Region(0x10000, 0x1000), a, added).ok());
  EXPECT_TRUE(added);
  ASSERT_TRUE(t.Add(Region(0x10000, 0x1000), b, added).ok());  // identical: same handle
  EXPECT_FALSE(added);
  EXPECT_EQ(a, b);
  EXPECT_FALSE(t.Add(Region(0x10800, 0x1000), c, added).ok());  // tail overlap
  EXPECT_FALSE(t.Add(Region(0xf800, 0x1000), c, added).ok());   // head overlap
  EXPECT_FALSE(t.Add(Region(0x10000, 0x800), c, added).ok());   // inside, other length
  EXPECT_FALSE(t.Add(Region(0xf000, 0x3000), c, added).ok());   // covers it
  EXPECT_TRUE(t.Add(Region(0x11000, 0x1000), c, added).ok());   // adjacent is fine
  EXPECT_NE(a, c);
  EXPECT_FALSE(t.Add(Region(0, 10), c, added).ok());
  EXPECT_FALSE(t.Add(Region(0x20000, 0), c, added).ok());
  EXPECT_FALSE(t.Add(Region(UINTPTR_MAX - 10, 100), c, added).ok());
  EXPECT_TRUE(t.Remove(a).has_value());
  EXPECT_FALSE(t.Remove(a).has_value());
  uint64_t d = 0;
  ASSERT_TRUE(t.Add(Region(0x10000, 0x1000), d, added).ok());
  EXPECT_NE(d, a);  // ids are never reused
  EXPECT_TRUE(t.FindContaining(0x11000, 0x1000).has_value());
  EXPECT_FALSE(t.FindContaining(0x11800, 0x1000).has_value());
}

class ResolveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    table.Insert(std::make_shared<memory::RemoteRegion>(1, 0x100000, 0x1000, MEM_PERM_READ_WRITE, false));
    table.Insert(std::make_shared<memory::RemoteRegion>(2, 0x101000, 0x1000, MEM_PERM_READ, false));
    table.Insert(std::make_shared<memory::RemoteRegion>(3, 0x200000, 0x1000, MEM_PERM_WRITE, false));
  }
  Status Try(TransferOp op, std::vector<TransferOpDesc> d, memory::RegionHint* hint = nullptr) {
    slices.clear();
    pins.clear();
    return table.Resolve(op, d, slices, pins, hint);
  }
  memory::RemoteRegionTable table;
  std::vector<memory::Slice> slices;
  std::vector<memory::RegionRef> pins;
};

TEST_F(ResolveTest, AcceptsDescriptorsInsideRegionsAndPinsThem) {
  ASSERT_TRUE(Try(TransferOp::WRITE, {{1, 0x100000, 0x1000}, {1, 0x100010, 16}, {1, 0x200ff0, 16}}).ok());
  EXPECT_EQ(slices.size(), 3u);
  EXPECT_EQ(pins.size(), 2u);
  for (auto& p : pins) EXPECT_EQ(p.use_count(), 2);  // the table's and the pin
  memory::Unpin(pins);
  auto removed = table.Remove({1, 3});
  ASSERT_EQ(removed.size(), 2u);
  for (auto& r : removed) {
    EXPECT_EQ(r.use_count(), 1);
    EXPECT_TRUE(r->revoked.load());
  }
}

// The hint resolves without the table when it holds every descriptor, with
// the same checks; it keeps nothing alive and takes no transfer once the
// region is revoked.
TEST_F(ResolveTest, HintResolvesTheSameWayAndStopsAtRevocation) {
  memory::RegionHint hint;
  ASSERT_TRUE(Try(TransferOp::WRITE, {{1, 0x100000, 0x1000}}, &hint).ok());
  ASSERT_FALSE(hint.expired());
  EXPECT_EQ(hint.lock()->id, 1u);
  EXPECT_EQ(hint.use_count(), 2);  // table + pin: the hint is weak
  memory::Unpin(pins);
  // Through the hint: the same results and errors as through the table.
  ASSERT_TRUE(Try(TransferOp::WRITE, {{1, 0x100800, 0x800}, {2, 0x100000, 16}}, &hint).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[1].region->id, 1u);
  ASSERT_EQ(pins.size(), 1u);
  for (const auto& bad : std::vector<std::vector<TransferOpDesc>>{
           {{1, 0x100ff8, 16}},                           // runs into region 2
           {{1, 0x100000, 0}},                            // zero length
           {{0, 0x100000, 8}},                            // null local
           {{UINTPTR_MAX - 10, 0x100000, 100}},           // local wraps
           {{1, 0x100000, 8}, {1, 0x100000, 0x2000}}}) {  // the second runs past
    memory::RegionHint none;
    Status plain = Try(TransferOp::WRITE, bad, &none);
    Status hinted = Try(TransferOp::WRITE, bad, &hint);
    EXPECT_EQ(hinted.code(), StatusCode::kParamInvalid);
    EXPECT_EQ(hinted.message(), plain.message());
    EXPECT_TRUE(slices.empty());
    EXPECT_TRUE(pins.empty());
  }
  // Region 2 is read-only: the hint moves to it only for a READ.
  EXPECT_FALSE(Try(TransferOp::WRITE, {{1, 0x101000, 8}}, &hint).ok());
  EXPECT_EQ(hint.lock()->id, 1u);
  ASSERT_TRUE(Try(TransferOp::READ, {{1, 0x101000, 8}}, &hint).ok());
  EXPECT_EQ(hint.lock()->id, 2u);
  // A transfer over two regions leaves the hint as it was.
  ASSERT_TRUE(Try(TransferOp::WRITE, {{1, 0x100000, 8}, {1, 0x200000, 8}}, &hint).ok());
  EXPECT_EQ(hint.lock()->id, 2u);
  memory::Unpin(pins);
  // Revoked while the hint still names it (and a transfer still pins it):
  // no new transfer resolves against it.
  ASSERT_TRUE(Try(TransferOp::READ, {{1, 0x101000, 8}}, &hint).ok());
  std::vector<memory::RegionRef> held = pins;
  auto removed = table.Remove({2});
  ASSERT_EQ(removed.size(), 1u);
  removed.clear();
  EXPECT_FALSE(hint.expired());  // the held pin keeps it
  Status s = Try(TransferOp::READ, {{1, 0x101000, 8}}, &hint);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid);
  EXPECT_NE(s.message().find("not inside any region"), std::string::npos) << s.message();
  held.clear();
  EXPECT_TRUE(hint.expired());  // the last pin was the last reference
}

// Random descriptor lists, mostly valid and a few bad in every way: the
// table, with and without the thread's hint, accepts exactly the lists a
// plain reading of the rules accepts, slices them as given, and names the
// first bad descriptor.
TEST_F(ResolveTest, RandomListsAgreeWithTheRulesWithAndWithoutTheHint) {
  struct Ref {
    uintptr_t addr;
    size_t len;
    uint32_t perms;
  };
  const Ref regions[] = {{0x100000, 0x1000, MEM_PERM_READ_WRITE},
                         {0x101000, 0x1000, MEM_PERM_READ},
                         {0x200000, 0x1000, MEM_PERM_WRITE}};
  auto fits = [&](const TransferOpDesc& d, TransferOp op) {
    if (d.len == 0 || d.local_addr == 0 || d.local_addr + d.len < d.local_addr ||
        d.remote_addr + d.len < d.remote_addr)
      return false;
    const uint32_t need = op == TransferOp::WRITE ? MEM_PERM_WRITE : MEM_PERM_READ;
    for (const Ref& r : regions) {
      if (d.remote_addr >= r.addr && d.remote_addr + d.len <= r.addr + r.len)
        return (r.perms & need) != 0;
    }
    return false;
  };
  std::mt19937_64 rng(13);
  auto pick = [&](uint64_t n) { return static_cast<uint64_t>(rng() % n); };
  auto desc = [&]() -> TransferOpDesc {
    const Ref& r = regions[pick(3)];
    TransferOpDesc d{0x7000 + pick(64) * 8, r.addr + pick(r.len / 8) * 8, 8 + pick(64) * 8};
    switch (pick(24)) {  // one in four or so bad in one way
      case 0: d.len = 0; break;
      case 1: d.local_addr = 0; break;
      case 2: d.local_addr = UINTPTR_MAX - 4; break;
      case 3: d.remote_addr = UINTPTR_MAX - 4; break;
      case 4: d.remote_addr = r.addr + r.len - 4; break;  // runs past, or into the next
      case 5: d.remote_addr = r.addr - 8; break;          // just before
      default: break;
    }
    return d;
  };
  memory::RegionHint hint;
  int accepted = 0, refused = 0;
  for (int round = 0; round < 4000; ++round) {
    std::vector<TransferOpDesc> list(1 + pick(round % 2 == 0 ? 3 : 40));
    for (auto& d : list) d = desc();
    const TransferOp op = pick(2) == 0 ? TransferOp::WRITE : TransferOp::READ;
    size_t first_bad = list.size();
    for (size_t i = 0; i < list.size() && first_bad == list.size(); ++i) {
      if (!fits(list[i], op)) first_bad = i;
    }
    memory::RegionHint none;
    Status plain = Try(op, list, &none);
    std::vector<memory::Slice> plain_slices = slices;
    memory::Unpin(pins);
    Status hinted = Try(op, list, &hint);
    ASSERT_EQ(hinted.ok(), plain.ok()) << round;
    ASSERT_EQ(hinted.message(), plain.message()) << round;
    if (first_bad == list.size()) {
      ASSERT_TRUE(hinted.ok()) << round << ": " << hinted.message();
      ++accepted;
      ASSERT_EQ(slices.size(), list.size());
      for (size_t i = 0; i < list.size(); ++i) {
        ASSERT_EQ(slices[i].local, list[i].local_addr);
        ASSERT_EQ(slices[i].remote, list[i].remote_addr);
        ASSERT_EQ(slices[i].len, list[i].len);
        ASSERT_EQ(slices[i].region, plain_slices[i].region);
        const memory::RemoteRegion& g = *slices[i].region;
        ASSERT_TRUE(list[i].remote_addr >= g.addr &&
                    list[i].remote_addr + list[i].len <= g.addr + g.len);
        bool pinned = false;
        for (const auto& p : pins) pinned = pinned || p.get() == &g;
        ASSERT_TRUE(pinned) << round;
      }
      memory::Unpin(pins);
    } else {
      ASSERT_FALSE(hinted.ok()) << round;
      ++refused;
      ASSERT_EQ(hinted.code(), StatusCode::kParamInvalid);
      ASSERT_EQ(hinted.message().rfind("descriptor " + std::to_string(first_bad) + " ", 0), 0u)
          << round << ": " << hinted.message();
      ASSERT_TRUE(slices.empty());
      ASSERT_TRUE(pins.empty());
    }
  }
  EXPECT_GT(accepted, 500);
  EXPECT_GT(refused, 500);
}

TEST_F(ResolveTest, RejectsBadDescriptorsAndPinsNothing) {
  EXPECT_FALSE(Try(TransferOp::WRITE, {}).ok());
  EXPECT_FALSE(Try(TransferOp::WRITE, {{1, 0x100000, 0}}).ok());                 // zero length
  EXPECT_FALSE(Try(TransferOp::WRITE, {{0, 0x100000, 8}}).ok());                 // null local
  EXPECT_FALSE(Try(TransferOp::WRITE, {{1, 0x0fffff, 8}}).ok());                 // before
  EXPECT_FALSE(Try(TransferOp::WRITE, {{1, 0x100ff8, 16}}).ok());                // spans 1 and 2
  EXPECT_FALSE(Try(TransferOp::WRITE, {{1, 0x201000, 1}}).ok());                 // just past
  EXPECT_FALSE(Try(TransferOp::WRITE, {{1, UINTPTR_MAX - 10, 100}}).ok());       // wraps
  EXPECT_FALSE(Try(TransferOp::WRITE, {{UINTPTR_MAX - 10, 0x100000, 100}}).ok()); // local wraps
  EXPECT_FALSE(Try(TransferOp::WRITE, {{1, 0x101000, 8}}).ok());                 // read-only region
  EXPECT_FALSE(Try(TransferOp::READ, {{1, 0x200000, 8}}).ok());                  // write-only region
  Status s = Try(TransferOp::WRITE, {{1, 0x100000, 8}, {1, 0x100000, 8}, {1, 0x300000, 8}});
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid);
  EXPECT_NE(s.message().find("descriptor 2"), std::string::npos) << s.message();
  EXPECT_TRUE(slices.empty());
  auto all = table.RemoveAll();
  for (auto& r : all) EXPECT_EQ(r.use_count(), 1) << "region " << r->id;
}

}  // namespace
}  // namespace hixl
