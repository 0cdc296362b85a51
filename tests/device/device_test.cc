// CUDA device memory (MEM_DEVICE) between two processes on one host, against
// the fake driver of tests/fake_cuda (HIXL_CUDA_DRIVER, set by main below for
// this process and the peers it starts). The fake's device memory faults on
// any CPU access, so a path that forgot to copy through the driver crashes
// the test; it also fails every call made on a thread with no current
// context, so a hixl thread that skipped making one current fails too.
//
// This process is the initiator (its own hixl::Hixl); a hixl_test_peer
// process is the target. Bytes are checked by hashes taken through the
// driver on each side (tests/device/test_cuda.h).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "device/device_common.h"
#include "device/test_cuda.h"
#include "hixl/hixl.h"
#include "peer_process.h"

namespace {

using namespace hixl_device_test;  // NOLINT: the shared helpers

TEST_F(DeviceShm, HostToPeerDeviceAndBack) {
  const size_t n = (1u << 20) + 13;
  const uintptr_t d = Num(peer_.Send("devalloc d " + std::to_string(n)));
  ASSERT_NE(d, 0u);
  Link("SHM");
  std::vector<unsigned char> host(n);
  hixl_test::FillPattern(host.data(), n, 7);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
  // Three pieces of odd sizes, the last one small.
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{h, d, 4099}, {h + 4099, d + 4099, n - 4099 - 5},
                                          {h + n - 5, d + n - 5, 5}}));
  EXPECT_EQ(peer_.Hash("d", 0, n), Hash(host.data(), n));
  ASSERT_TRUE(peer_.Ok("fillpat d 9"));
  std::vector<unsigned char> back(n, 0);
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{reinterpret_cast<uintptr_t>(back.data()), d, n}}));
  EXPECT_EQ(Hash(back.data(), n), PatternHash(n, 9));
}

TEST_F(DeviceShm, LocalDeviceToPeerHostMappedAndByCrossMemoryAttach) {
  const size_t n = (1u << 20) + 5;
  // "alloc": engine memory the initiator maps; "reg": anonymous memory it
  // reaches by cross-memory attach (through a host buffer, for device memory).
  std::map<std::string, uintptr_t> remote;
  for (const char* kind : {"alloc", "reg"}) {
    remote[kind] = Num(peer_.Send(std::string(kind) + " h_" + kind + " " + std::to_string(n)));
    ASSERT_NE(remote[kind], 0u);
  }
  Link("SHM");
  void* mine = nullptr;
  HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &mine));
  const uintptr_t m = reinterpret_cast<uintptr_t>(mine);
  ASSERT_TRUE(DevFillPattern(m, n, 3));
  for (const char* kind : {"alloc", "reg"}) {
    SCOPED_TRACE(kind);
    const std::string name = std::string("h_") + kind;
    const uintptr_t h = remote[kind];
    HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{m, h, n}}));
    EXPECT_EQ(peer_.Hash(name, 0, n), PatternHash(n, 3));
    ASSERT_TRUE(peer_.Ok("fillpat " + name + " 11"));
    HIXL_ASSERT_OK(Move(TransferOp::READ, {{m, h, n}}));
    EXPECT_EQ(DevHash(m, n), PatternHash(n, 11));
    ASSERT_TRUE(DevFillPattern(m, n, 3));
    EXPECT_EQ(peer_.Send("canary " + name), "OK intact");
  }
  HIXL_ASSERT_OK(e_.FreeMem(mine));
}

TEST_F(DeviceShm, DeviceToDeviceInsideLargerAllocations) {
  // Both sides register a part of a bigger allocation, as a tensor inside a
  // caching allocator's segment: the peer's region starts 4099 bytes in.
  const size_t n = 1u << 20;
  const uintptr_t d = Num(peer_.Send("devreg d " + std::to_string(3u << 20) + " 4099 " +
                                     std::to_string(n)));
  ASSERT_NE(d, 0u);
  Link("SHM");
  const uintptr_t base = TestCuda::Get().Alloc(2u << 20);
  ASSERT_NE(base, 0u);
  const uintptr_t m = base + 12345;
  hixl::MemHandle mh = 0;
  HIXL_ASSERT_OK(e_.RegisterMem({m, n}, MemType::MEM_DEVICE, mh));
  ASSERT_TRUE(DevFillPattern(m, n, 21));
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{m, d, n}}));
  EXPECT_EQ(peer_.Hash("d", 0, n), PatternHash(n, 21));
  ASSERT_TRUE(peer_.Ok("fillpat d 22"));
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{m + 1, d + 1, n - 1}}));
  std::vector<unsigned char> want(n);
  hixl_test::FillPattern(want.data(), n, 22);
  EXPECT_EQ(DevHash(m + 1, n - 1), Hash(want.data() + 1, n - 1));
  // One byte past the peer's region (still inside its allocation): refused,
  // nothing written.
  const std::string before = peer_.Hash("d", 0, n);
  hixl::Status s = Move(TransferOp::WRITE, {{m, d, n / 2}, {m, d + n - 4096, 4097}});
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_EQ(peer_.Hash("d", 0, n), before);
  // Past the end of this side's registration: refused too.
  s = Move(TransferOp::WRITE, {{m + n - 8, d, 16}});
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_EQ(peer_.Hash("d", 0, n), before);
  HIXL_ASSERT_OK(e_.DeregisterMem(mh));
  EXPECT_TRUE(TestCuda::Get().Free(base));
}

TEST_F(DeviceShm, LargeTransfersRunOnCopyThreads) {
  // Parts of a large transfer run on the engine's copy threads, which have
  // no CUDA context of their own: hixl makes one current there.
  const size_t n = (48u << 20) / hixl_test::kSanitizerDivisor + 3;
  const uintptr_t d = Num(peer_.Send("devalloc d " + std::to_string(n)));
  Link("SHM", {{hixl::options::kCopyThreads, "2"}});
  void* mine = nullptr;
  HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &mine));
  const uintptr_t m = reinterpret_cast<uintptr_t>(mine);
  ASSERT_TRUE(DevFillPattern(m, n, 5));
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{m, d, n}}));
  EXPECT_EQ(peer_.Hash("d", 0, n), PatternHash(n, 5));
  ASSERT_TRUE(peer_.Ok("fillpat d 6"));
  hixl::TransferReq req = 0;
  HIXL_ASSERT_OK(e_.TransferAsync(peer_.engine(), TransferOp::READ, {{m, d, n}}, {}, req));
  hixl::TransferStatus st = hixl::TransferStatus::WAITING;
  ASSERT_TRUE(Eventually([&] {
    return e_.GetTransferStatus(req, st).ok() && st != hixl::TransferStatus::WAITING;
  }, 20000));
  EXPECT_EQ(st, hixl::TransferStatus::COMPLETED);
  EXPECT_EQ(DevHash(m, n), PatternHash(n, 6));
}

TEST_F(DeviceShm, WrongMemoryTypesAreRefused) {
  const uintptr_t r = Num(peer_.Send("reg r 4096"));
  Link("SHM");
  std::vector<unsigned char> host(8192);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
  hixl::MemHandle mh = 0;
  hixl::Status s = e_.RegisterMem({h, host.size()}, MemType::MEM_DEVICE, mh);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_NE(s.message().find("host memory"), std::string::npos) << s.ToString();

  const uintptr_t base = TestCuda::Get().Alloc(1u << 16);
  ASSERT_NE(base, 0u);
  s = e_.RegisterMem({base, 4096}, MemType::MEM_HOST, mh);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_NE(s.message().find("MEM_DEVICE"), std::string::npos) << s.ToString();
  s = e_.RegisterMem({base + 4096, 1u << 16}, MemType::MEM_DEVICE, mh);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_NE(s.message().find("past the end"), std::string::npos) << s.ToString();
  s = e_.RegisterMem({base, 4096}, MemType::MEM_DEVICE, mh, hixl::MEM_PERM_READ_WRITE,
                     hixl::REGISTER_SHARE_BY_MAPPING);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();

  // Device memory this engine never registered, as the local side of a
  // transfer: refused before anything moves (a CPU copy would fault).
  ASSERT_TRUE(peer_.Ok("fill r 0x5a"));
  const std::string before = peer_.Hash("r", 0, 4096);
  s = Move(TransferOp::WRITE, {{base, r, 4096}});
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_NE(s.message().find("RegisterMem(MEM_DEVICE)"), std::string::npos) << s.ToString();
  s = Move(TransferOp::READ, {{base, r, 4096}});
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_EQ(peer_.Hash("r", 0, 4096), before);
  EXPECT_TRUE(TestCuda::Get().Free(base));
}

TEST_F(DeviceShm, FailedDeviceCopyEndsFailedThenTransfersGoOn) {
  SKIP_ON_REAL_DRIVER();
  const size_t n = 65536;
  const uintptr_t d = Num(peer_.Send("devalloc d " + std::to_string(n)));
  Link("SHM");
  ASSERT_TRUE(peer_.Ok("fill d 0x33"));
  const std::string before = peer_.Hash("d", 0, n);
  std::vector<unsigned char> host(n);
  hixl_test::FillPattern(host.data(), n, 1);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
  FailCopiesAfter(0);  // this process's next copy fails, nothing copied
  hixl::Status s = Move(TransferOp::WRITE, {{h, d, n}});
  FailCopiesAfter(-1);
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  EXPECT_EQ(peer_.Hash("d", 0, n), before);
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{h, d, n}}));
  EXPECT_EQ(peer_.Hash("d", 0, n), Hash(host.data(), n));
}

TEST_F(DeviceShm, PeerMemoryIsOpenedOnceAndClosedWhenThePeerLetsGo) {
  SKIP_ON_REAL_DRIVER();
  const int base_mappings = LiveIpcMappings();
  const size_t n = 1u << 16;
  // Two regions in one allocation of the peer: one import.
  const uintptr_t a = Num(peer_.Send("devreg a " + std::to_string(4 * n) + " 0 " +
                                     std::to_string(n)));
  ASSERT_NE(a, 0u);
  Link("SHM");
  std::vector<unsigned char> host(n, 0x42);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{h, a, n}}));
  EXPECT_EQ(LiveIpcMappings(), base_mappings + 1);
  ASSERT_TRUE(peer_.Ok("free a"));  // deregisters (waits for this engine) and frees
  EXPECT_TRUE(Eventually([&] { return LiveIpcMappings() == base_mappings; }))
      << LiveIpcMappings();
  hixl::Status s = Move(TransferOp::WRITE, {{h, a, n}});
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();

  // Local AllocMem device memory goes back to the driver at FreeMem and,
  // when the application left it, at Finalize.
  const int allocs = LiveAllocs();
  void* x = nullptr;
  void* y = nullptr;
  HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &x));
  HIXL_ASSERT_OK(e_.AllocMem(n, MemType::MEM_DEVICE, &y));
  EXPECT_EQ(LiveAllocs(), allocs + 2);
  HIXL_ASSERT_OK(e_.FreeMem(x));
  s = e_.FreeMem(x);
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_EQ(LiveAllocs(), allocs + 1);
  e_.Finalize();
  EXPECT_EQ(LiveAllocs(), allocs);
}

TEST_F(DeviceShm, ForkedChildIsToldItCannotUseTheDriver) {
  Link("SHM");
  void* mine = nullptr;
  HIXL_ASSERT_OK(e_.AllocMem(4096, MemType::MEM_DEVICE, &mine));
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    void* p = nullptr;
    hixl::Status s = e_.AllocMem(4096, MemType::MEM_DEVICE, &p);
    const bool ok = s.code() == StatusCode::kUnsupported &&
                    s.message().find("fork") != std::string::npos;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_TRUE(Eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 10000));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// Hosts that cannot run device memory: registration says why; host memory
// still works.
PeerLaunch WithDriver(const std::vector<std::string>& env) {
  PeerLaunch l;
  l.exec_prefix = {"/usr/bin/env"};
  for (const auto& e : env) l.exec_prefix.push_back(e);
  return l;
}

void ExpectUnsupported(const std::vector<std::string>& env, const std::string& says) {
  SCOPED_TRACE(says);
  PeerProcess p(WithDriver(env));
  ASSERT_TRUE(p.Start());
  const std::string reply = p.Send("devalloc d 4096");
  EXPECT_EQ(reply.rfind("ERR UNSUPPORTED", 0), 0u) << reply;
  EXPECT_NE(reply.find(says), std::string::npos) << reply;
  EXPECT_NE(p.Reg("r", 4096), 0u);
}

TEST(DeviceErrors, NoDriverStubDriverAndNoDeviceAreUnsupported) {
  SKIP_ON_REAL_DRIVER();
  ExpectUnsupported({"HIXL_CUDA_DRIVER=/nonexistent/libcuda.so.1"}, "no CUDA driver");
  ExpectUnsupported({"HIXL_FAKE_CUDA_DEVICES=0"}, "found no device");
  if (access(HIXL_CUDA_STUB_PATH, R_OK) == 0) {
    ExpectUnsupported({std::string("HIXL_CUDA_DRIVER=") + HIXL_CUDA_STUB_PATH}, "stub library");
  } else {
    std::cout << "[ INFO ] no stub driver at " << HIXL_CUDA_STUB_PATH << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  // This process and every peer it starts load the fake driver (or the real
  // one, default libcuda.so.1, under HIXL_TEST_REAL_CUDA).
  if (RealDriver()) {
    if (std::getenv("HIXL_CUDA_DRIVER") == nullptr) setenv("HIXL_CUDA_DRIVER", "libcuda.so.1", 1);
  } else {
    setenv("HIXL_CUDA_DRIVER", HIXL_FAKE_CUDA_PATH, 1);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
