// tests/device/test_cuda.h — the tests' own access to the CUDA driver that
// HIXL_CUDA_DRIVER names (the fake driver of tests/fake_cuda in CI):
// src/device/driver_client.h, a client independent of hixl's device layer,
// so that the tests check hixl's copies through a path of their own.
#ifndef HIXL_TESTS_DEVICE_TEST_CUDA_H_
#define HIXL_TESTS_DEVICE_TEST_CUDA_H_

#include "device/driver_client.h"

namespace hixl_test {

using TestCuda = hixl::device::DriverClient;

}  // namespace hixl_test

#endif  // HIXL_TESTS_DEVICE_TEST_CUDA_H_
