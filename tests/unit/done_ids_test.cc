// Unit tests of engine::DoneIds, the bit window of async requests that ended
// inside TransferAsync and are not reported yet.
#include "engine/done_ids.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

namespace hixl::engine {
namespace {

TEST(DoneIds, EachIdIsTakenOnceAndUnknownIdsNever) {
  DoneIds d;
  EXPECT_FALSE(d.Take(1));
  d.Add(1);
  d.Add(2);
  d.Add(70);
  EXPECT_EQ(d.size(), 3u);
  EXPECT_TRUE(d.Has(2));
  EXPECT_FALSE(d.Has(3));
  EXPECT_FALSE(d.Has(0));
  EXPECT_FALSE(d.Has(71));
  EXPECT_FALSE(d.Has(UINT64_MAX));
  EXPECT_TRUE(d.Take(2));
  EXPECT_FALSE(d.Take(2));
  EXPECT_TRUE(d.Has(1));  // taking one leaves its neighbours
  EXPECT_TRUE(d.Take(70));
  EXPECT_TRUE(d.Take(1));
  EXPECT_FALSE(d.Take(1));
  EXPECT_EQ(d.size(), 0u);
  EXPECT_EQ(d.words(), 0u);
}

// Ids not given to Add (requests that took the ordinary path) sit between
// marked ones and are never reported as marked.
TEST(DoneIds, GapsBetweenMarkedIdsStayUnmarked) {
  DoneIds d;
  for (uint64_t id = 100; id < 1100; id += 3) d.Add(id);
  for (uint64_t id = 90; id < 1200; ++id) {
    EXPECT_EQ(d.Has(id), id >= 100 && id < 1100 && (id - 100) % 3 == 0) << id;
  }
}

// Reaped in order, the window stays a word or two however many requests
// pass; one request never reaped holds the window open at a bit per later
// request.
TEST(DoneIds, TheWindowFollowsTheOldestUnreported) {
  DoneIds d;
  for (uint64_t id = 1; id <= 100000; ++id) {
    d.Add(id);
    ASSERT_TRUE(d.Take(id));
    ASSERT_LE(d.words(), 1u);
  }
  d.Add(100001);  // never taken
  for (uint64_t id = 100002; id <= 200000; ++id) {
    d.Add(id);
    ASSERT_TRUE(d.Take(id));
  }
  EXPECT_EQ(d.size(), 1u);
  EXPECT_LE(d.words(), 100000u / 64 + 2);
  EXPECT_TRUE(d.Take(100001));
  EXPECT_EQ(d.words(), 0u);
  d.Add(500000);  // a fresh window after it emptied
  EXPECT_TRUE(d.Has(500000));
  EXPECT_FALSE(d.Has(100001));
}

// Against a std::set: random adds (growing ids, with gaps) and takes of
// marked, already-taken and never-added ids.
TEST(DoneIds, MatchesASetUnderRandomUse) {
  std::mt19937_64 rng(7);
  DoneIds d;
  std::set<uint64_t> want;
  uint64_t next = 1;
  for (int step = 0; step < 200000; ++step) {
    if (rng() % 2 == 0) {
      next += 1 + rng() % 5;
      d.Add(next);
      want.insert(next);
    } else {
      uint64_t id = next > 300 ? next - rng() % 300 : 1 + rng() % next;
      ASSERT_EQ(d.Take(id), want.erase(id) == 1) << "step " << step << " id " << id;
    }
    ASSERT_EQ(d.size(), want.size());
  }
  for (uint64_t id = 0; id <= next + 64; ++id) ASSERT_EQ(d.Has(id), want.count(id) == 1) << id;
}

}  // namespace
}  // namespace hixl::engine
