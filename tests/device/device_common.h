// What the device tests share: hashes of host and device bytes, the fake
// driver's controls, and the fixture that links this process's engine to a
// hixl_test_peer process (tests/device/device_test.cc, device_tcp_test.cc).
#ifndef HIXL_TESTS_DEVICE_DEVICE_COMMON_H_
#define HIXL_TESTS_DEVICE_DEVICE_COMMON_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "device/test_cuda.h"
#include "hixl/hixl.h"
#include "peer_process.h"

namespace hixl_device_test {

using hixl::MemType;
using hixl::StatusCode;
using hixl::TransferOp;
using hixl_test::PeerLaunch;
using hixl_test::PeerProcess;
using hixl_test::TestCuda;

inline std::string Hash(const void* p, size_t n) {
  return hixl_test::HashHex(hixl_test::Fnv1a64(p, n));
}
inline std::string PatternHash(size_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  hixl_test::FillPattern(v.data(), n, seed);
  return Hash(v.data(), n);
}
// Device memory's bytes, read through the tests' own driver client.
inline std::string DevHash(uintptr_t p, size_t n) {
  std::vector<unsigned char> v(n);
  if (!TestCuda::Get().Copy(v.data(), reinterpret_cast<void*>(p), n)) return "copy failed";
  return Hash(v.data(), n);
}
inline bool DevFillPattern(uintptr_t p, size_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  hixl_test::FillPattern(v.data(), n, seed);
  return TestCuda::Get().Copy(reinterpret_cast<void*>(p), v.data(), n);
}
inline uintptr_t Num(const std::string& reply) {
  return static_cast<uintptr_t>(std::stoull(hixl_test::OkValue(reply)));
}

// HIXL_TEST_REAL_CUDA=1 (scripts/gpu-check.sh): the real driver instead of
// the fake one; cases that need the fake's controls skip.
inline bool RealDriver() { return std::getenv("HIXL_TEST_REAL_CUDA") != nullptr; }
#define SKIP_ON_REAL_DRIVER() \
  if (RealDriver()) GTEST_SKIP() << "needs the fake driver's controls"

template <typename T>
T Control(const char* name) {
  return reinterpret_cast<T>(TestCuda::Get().Symbol(name));
}
inline int LiveIpcMappings() { return Control<int (*)()>("hixl_fake_cuda_live_ipc_mappings")(); }
inline int LiveAllocs() { return Control<int (*)()>("hixl_fake_cuda_live_allocs")(); }
inline void SetCopyDelayUs(unsigned us) {
  Control<void (*)(unsigned)>("hixl_fake_cuda_set_copy_delay_us")(us);
}
inline void FailCopiesAfter(long long n) {
  Control<void (*)(long long)>("hixl_fake_cuda_fail_copies_after")(n);
}

// The links device memory moves over, as LinkType names: shm, tcp and, in
// builds with UCX, UCX (whose device transfers take tcp lanes to the peer).
#if defined(HIXL_TEST_UCX)
#define HIXL_DEVICE_LINKS ::testing::Values("SHM", "TCP", "UCX")
#else
#define HIXL_DEVICE_LINKS ::testing::Values("SHM", "TCP")
#endif

// Waits (bounded) until pred holds.
template <typename P>
bool Eventually(P pred, int ms = 5000) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

class DeviceShm : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(TestCuda::Get().ok()) << TestCuda::Get().error();
    ASSERT_TRUE(peer_.Start());
  }
  // Regions the peer registers before the link are in its welcome; later
  // ones reach this engine asynchronously. Tests make them first.
  void Link(const std::string& type, std::map<std::string, std::string> opts = {}) {
    opts[hixl::options::kLinkType] = type;
    HIXL_ASSERT_OK(e_.Initialize("127.0.0.1", opts));
    HIXL_ASSERT_OK(e_.Connect(peer_.engine(), 5000));
  }
  hixl::Status Move(TransferOp op, std::vector<hixl::TransferOpDesc> d) {
    return e_.TransferSync(peer_.engine(), op, d, 10000);
  }

  PeerProcess peer_;
  hixl::Hixl e_;
};

}  // namespace hixl_device_test

#endif  // HIXL_TESTS_DEVICE_DEVICE_COMMON_H_
