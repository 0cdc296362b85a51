// SpinBudget: how long a thread that just had work polls for more before it
// sleeps, adapted to whether polling has been paying off.
//
// Polling after activity saves a sleep and a wake-up when the next piece of
// work comes within the window (a request answered microseconds later). When
// it does not, the window is a core taken from the threads that would bring
// that work, which on a host with few cores (or an application that spins on
// one of them) makes everything slower. So after kOff windows in a row that
// ended with nothing, the thread stops polling and sleeps at once; then one
// activity in kProbeEvery polls again, and a window that finds work turns
// polling back on. (Shorter windows would not help: work that usually comes
// just inside the full window would come just outside a shorter one.)
//
// Thread safety: none; one budget belongs to one polling thread.
#ifndef HIXL_COMMON_SPIN_BUDGET_H_
#define HIXL_COMMON_SPIN_BUDGET_H_

#include <chrono>
#include <cstdint>

namespace hixl {

class SpinBudget {
 public:
  static constexpr uint32_t kProbeEvery = 32;  // activities between probes when off
  static constexpr int kOff = 5;               // misses in a row that turn polling off

  // The window to poll for after the activity that just happened: `full`,
  // or 0 (sleep at once) while polling is off. Its end is reported with Hit
  // or Miss.
  std::chrono::microseconds Window(std::chrono::microseconds full) {
    if (misses_ < kOff) return full;
    if (++skipped_ < kProbeEvery) return std::chrono::microseconds(0);
    skipped_ = 0;
    return full;  // a probe: a Hit turns polling back on
  }
  // The window found work before it ended.
  void Hit() { misses_ = 0; }
  // The window ended with nothing.
  void Miss() {
    if (misses_ < kOff) ++misses_;  // a failed probe leaves polling off
  }
  bool off() const { return misses_ >= kOff; }

 private:
  int misses_ = 0;  // windows in a row that ended with nothing, up to kOff
  uint32_t skipped_ = 0;
};

}  // namespace hixl

#endif  // HIXL_COMMON_SPIN_BUDGET_H_
