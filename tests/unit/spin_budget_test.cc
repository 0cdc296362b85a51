// Unit tests of SpinBudget, the adaptive length of the polling windows after
// activity (event loops, a tcp caller waiting for its answer, the
// notification thread).
#include "common/spin_budget.h"

#include <gtest/gtest.h>

namespace hixl {
namespace {

using std::chrono::microseconds;
constexpr microseconds kFull(20);

TEST(SpinBudget, PollsTheFullWindowWhilePollingPays) {
  SpinBudget b;
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(b.Window(kFull), kFull) << i;
    // Misses short of kOff in a row, then a hit: never off.
    if (i % SpinBudget::kOff == SpinBudget::kOff - 1) {
      b.Hit();
    } else {
      b.Miss();
    }
    ASSERT_FALSE(b.off()) << i;
  }
  EXPECT_EQ(b.Window(microseconds(0)), microseconds(0)) << "a zero window stays zero";
}

TEST(SpinBudget, StopsAfterMissesInARowAndProbesNowAndThen) {
  SpinBudget b;
  for (int i = 0; i < SpinBudget::kOff; ++i) {
    ASSERT_EQ(b.Window(kFull), kFull);
    b.Miss();
  }
  EXPECT_TRUE(b.off());
  // Off: no window, except one probe in kProbeEvery activities; a failed
  // probe leaves it off.
  for (int round = 0; round < 3; ++round) {
    for (uint32_t i = 1; i < SpinBudget::kProbeEvery; ++i)
      ASSERT_EQ(b.Window(kFull), microseconds(0)) << round << " " << i;
    ASSERT_EQ(b.Window(kFull), kFull) << "probe of round " << round;
    b.Miss();
    ASSERT_TRUE(b.off());
  }
  // A probe that finds work turns polling back on at once.
  for (uint32_t i = 1; i < SpinBudget::kProbeEvery; ++i)
    ASSERT_EQ(b.Window(kFull), microseconds(0));
  ASSERT_EQ(b.Window(kFull), kFull);
  b.Hit();
  EXPECT_FALSE(b.off());
  EXPECT_EQ(b.Window(kFull), kFull);
  EXPECT_EQ(b.Window(kFull), kFull);
}

TEST(SpinBudget, OneMissAfterAHitDoesNotTurnItOff) {
  SpinBudget b;
  for (int i = 0; i < SpinBudget::kOff - 1; ++i) b.Miss();
  b.Hit();
  b.Miss();
  EXPECT_FALSE(b.off());
  EXPECT_EQ(b.Window(kFull), kFull);
}

}  // namespace
}  // namespace hixl
