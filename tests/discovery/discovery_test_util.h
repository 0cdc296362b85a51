// Helpers shared by the engine-level discovery tests: a bounded poll, a
// substring test and a lookup in an engine's ListEngines.
// Thread safety: plain functions. Ownership: plain values.
#ifndef HIXL_TESTS_DISCOVERY_DISCOVERY_TEST_UTIL_H_
#define HIXL_TESTS_DISCOVERY_DISCOVERY_TEST_UTIL_H_

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"

namespace hixl_test {

// Polls pred every millisecond for up to ms; true as soon as it holds.
inline bool Eventually(const std::function<bool()>& pred, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

inline bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The record of name in engine's ListEngines (false: not listed, or the call failed).
inline bool Listed(const hixl::Hixl& engine, const std::string& name,
                   hixl::EngineRecord* out = nullptr) {
  std::vector<hixl::EngineRecord> list;
  if (!engine.ListEngines(list).ok()) return false;
  for (const auto& r : list) {
    if (r.name == name) {
      if (out) *out = r;
      return true;
    }
  }
  return false;
}

}  // namespace hixl_test

#endif  // HIXL_TESTS_DISCOVERY_DISCOVERY_TEST_UTIL_H_
