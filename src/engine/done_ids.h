// Request ids of async transfers that ended successfully before
// TransferAsync returned (small shm transfers run on the caller's thread)
// and whose end has not been reported yet. One bit each, in a window that
// starts at the oldest unreported one: no object per request, and an
// application that never reaps a request costs a bit per later request.
// Thread safety: none; the engine guards it with its request lock.
#ifndef HIXL_ENGINE_DONE_IDS_H_
#define HIXL_ENGINE_DONE_IDS_H_

#include <cstddef>
#include <cstdint>
#include <deque>

namespace hixl::engine {

class DoneIds {
 public:
  // Marks id, which must be larger than every id given to Add before.
  void Add(uint64_t id) {
    if (words_.empty()) base_ = id & ~uint64_t{63};
    const uint64_t word = (id - base_) / 64;
    while (words_.size() <= word) words_.push_back(0);
    words_[word] |= uint64_t{1} << (id % 64);
    ++count_;
  }
  bool Has(uint64_t id) const {
    if (id < base_ || (id - base_) / 64 >= words_.size()) return false;
    return (words_[(id - base_) / 64] >> (id % 64)) & 1u;
  }
  // Unmarks id; true if it was marked.
  bool Take(uint64_t id) {
    if (!Has(id)) return false;
    words_[(id - base_) / 64] &= ~(uint64_t{1} << (id % 64));
    --count_;
    // Words below the oldest marked id hold nothing any more: no later Add
    // can fall into them (ids only grow), so the window moves past them.
    while (!words_.empty() && words_.front() == 0) {
      words_.pop_front();
      base_ += 64;
    }
    return true;
  }
  size_t size() const { return count_; }
  size_t words() const { return words_.size(); }

 private:
  uint64_t base_ = 0;  // the id of bit 0 of words_.front(); a multiple of 64
  std::deque<uint64_t> words_;
  size_t count_ = 0;
};

}  // namespace hixl::engine

#endif  // HIXL_ENGINE_DONE_IDS_H_
