// The C API (hixl/hixl_c.h) with device memory: hixlAllocMemoryTyped and
// hixlRegisterMemoryTyped of device memory (the engine's own, and a part of
// the application's allocation), the wrong type refused, handles that name
// device memory moving bytes both ways, and hixlTransferBatchOnStream
// ordered after the application's stream. Two engines of this process,
// over shm and over tcp, against the fake driver (main in device_test.cc).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "device/device_common.h"
#include "hixl/hixl_c.h"

namespace {

using namespace hixl_device_test;  // NOLINT: the shared helpers

#define ASSERT_ST(expected, call) \
  ASSERT_EQ((expected), (call)) << #call << ": " << hixlGetLastErrorMessage()
#define EXPECT_ST(expected, call) \
  EXPECT_EQ((expected), (call)) << #call << ": " << hixlGetLastErrorMessage()

constexpr uint32_t kRW = HIXL_MEM_PERM_READ | HIXL_MEM_PERM_WRITE;

class DeviceCApi : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(TestCuda::Get().ok()) << TestCuda::Get().error();
    ASSERT_ST(HIXL_SUCCESS, Make(&target_));
    ASSERT_ST(HIXL_SUCCESS, Make(&init_));
  }
  void TearDown() override {
    if (init_ != nullptr) {
      EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(init_));
    }
    if (target_ != nullptr) {
      EXPECT_ST(HIXL_SUCCESS, hixlDestroyEngine(target_));
    }
  }
  HixlStatus Make(HixlEngine* e) {
    HixlConfig cfg = nullptr;
    HixlStatus s = hixlCreateConfig(&cfg);
    if (s != HIXL_SUCCESS) return s;
    s = hixlConfigSetString(cfg, HIXL_OPTION_LOCAL_IP, "127.0.0.1");
    if (s == HIXL_SUCCESS) s = hixlConfigSetInt(cfg, HIXL_OPTION_LOCAL_PORT, 0);
    if (s == HIXL_SUCCESS) s = hixlConfigSetString(cfg, HIXL_OPTION_LINK_TYPE, GetParam());
    if (s == HIXL_SUCCESS) s = hixlCreateEngine(cfg, e);
    hixlDestroyConfig(cfg);
    return s;
  }
  // A handle of the target's region `mine` for the initiator, through its
  // string, as a peer process would get it.
  HixlMemHandle Theirs(HixlMemHandle mine) {
    const char* str = hixlMemHandleSerialize(mine);
    EXPECT_NE(str, nullptr) << hixlGetLastErrorMessage();
    HixlMemHandle h = nullptr;
    if (str != nullptr) {
      EXPECT_ST(HIXL_SUCCESS, hixlMemHandleDeserialize(init_, str, &h));
    }
    return h;
  }
  static HixlTransferDesc Desc(const void* local, HixlMemHandle remote, uint64_t off, size_t n) {
    return HixlTransferDesc{const_cast<void*>(local), remote, off, n};
  }
  HixlEngine target_ = nullptr, init_ = nullptr;
};

TEST_P(DeviceCApi, DeviceMemoryOnBothSidesAndTheWrongTypeRefused) {
  const size_t n = 256u << 10;
  auto& cuda = TestCuda::Get();
  // The target: device memory of its engine, and a part of the
  // application's own allocation (a tensor at an offset in a larger one).
  void* engine_mem = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlAllocMemoryTyped(target_, n, HIXL_MEM_DEVICE, &engine_mem));
  const uintptr_t app = cuda.Alloc(n + 8192);
  ASSERT_NE(app, 0u);
  void* tensor = reinterpret_cast<void*>(app + 4096);
  std::vector<unsigned char> around(n + 8192);
  hixl_test::FillPattern(around.data(), around.size(), 60);
  ASSERT_TRUE(cuda.Copy(reinterpret_cast<void*>(app), around.data(), around.size()));
  HixlMemHandle h_engine = nullptr, h_tensor = nullptr, h = nullptr;
  ASSERT_ST(HIXL_SUCCESS,
            hixlRegisterMemoryTyped(target_, engine_mem, n, HIXL_MEM_DEVICE, kRW, 0, &h_engine));
  ASSERT_ST(HIXL_SUCCESS,
            hixlRegisterMemoryTyped(target_, tensor, n, HIXL_MEM_DEVICE, kRW, 0, &h_tensor));

  // The wrong type, either way, and an unknown type: refused, no handle.
  std::vector<unsigned char> host(n, 0);
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemory(target_, engine_mem, n, kRW, &h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemory(target_, tensor, n, kRW, &h));
  EXPECT_ST(HIXL_PARAM_INVALID,
            hixlRegisterMemoryTyped(target_, host.data(), n, HIXL_MEM_DEVICE, kRW, 0, &h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlRegisterMemoryTyped(target_, tensor, n, 7, kRW, 0, &h));
  EXPECT_ST(HIXL_PARAM_INVALID, hixlAllocMemoryTyped(target_, n, 7, &engine_mem));
  EXPECT_EQ(h, nullptr);

  // The initiator's device memory → the target's engine memory, then its
  // tensor → host memory here, then host here → the tensor.
  void* mine = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlAllocMemoryTyped(init_, n, HIXL_MEM_DEVICE, &mine));
  ASSERT_TRUE(DevFillPattern(reinterpret_cast<uintptr_t>(mine), n, 61));
  HixlMemHandle t_engine = Theirs(h_engine), t_tensor = Theirs(h_tensor);
  ASSERT_NE(t_engine, nullptr);
  ASSERT_NE(t_tensor, nullptr);
  HixlTransferDesc d = Desc(mine, t_engine, 0, n);
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatch(init_, HIXL_OP_WRITE, &d, 1, nullptr));
  EXPECT_EQ(DevHash(reinterpret_cast<uintptr_t>(engine_mem), n), PatternHash(n, 61));

  ASSERT_TRUE(DevFillPattern(reinterpret_cast<uintptr_t>(tensor), n, 62));
  ASSERT_ST(HIXL_SUCCESS, hixlReadRemote(init_, host.data(), n, t_tensor, 0, nullptr));
  EXPECT_EQ(Hash(host.data(), n), PatternHash(n, 62));

  hixl_test::FillPattern(host.data(), n, 63);
  // Two descriptors: the halves, into the tensor's region.
  HixlTransferDesc two[2] = {Desc(host.data(), t_tensor, 0, n / 2),
                             Desc(host.data() + n / 2, t_tensor, n / 2, n / 2)};
  ASSERT_ST(HIXL_SUCCESS, hixlTransferBatch(init_, HIXL_OP_WRITE, two, 2, nullptr));
  EXPECT_EQ(DevHash(reinterpret_cast<uintptr_t>(tensor), n), PatternHash(n, 63));
  // The bytes around the tensor were not touched.
  EXPECT_EQ(DevHash(app, 4096), Hash(around.data(), 4096));
  EXPECT_EQ(DevHash(app + 4096 + n, 4096), Hash(around.data() + 4096 + n, 4096));

  // Past the end of a device region: refused here, before anything moves.
  HixlTransferDesc past = Desc(mine, t_tensor, 4096, n);
  EXPECT_ST(HIXL_PARAM_INVALID, hixlTransferBatch(init_, HIXL_OP_WRITE, &past, 1, nullptr));
  EXPECT_EQ(DevHash(reinterpret_cast<uintptr_t>(tensor), n), PatternHash(n, 63));

  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(init_, t_engine));
  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(init_, t_tensor));
  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(target_, h_tensor));
  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(target_, h_engine));
  EXPECT_ST(HIXL_SUCCESS, hixlFreeMemory(target_, engine_mem));
  EXPECT_ST(HIXL_SUCCESS, hixlFreeMemory(init_, mine));
  EXPECT_TRUE(cuda.Free(app));
}

TEST_P(DeviceCApi, TransfersOnAStreamWaitForIt) {
  SKIP_ON_REAL_DRIVER();
  const size_t n = 1u << 20;
  auto& cuda = TestCuda::Get();
  void* theirs_mem = nullptr;
  void* mine = nullptr;
  ASSERT_ST(HIXL_SUCCESS, hixlAllocMemoryTyped(target_, n, HIXL_MEM_DEVICE, &theirs_mem));
  ASSERT_ST(HIXL_SUCCESS, hixlAllocMemoryTyped(init_, n, HIXL_MEM_DEVICE, &mine));
  HixlMemHandle h = nullptr;
  ASSERT_ST(HIXL_SUCCESS,
            hixlRegisterMemoryTyped(target_, theirs_mem, n, HIXL_MEM_DEVICE, kRW, 0, &h));
  HixlMemHandle theirs = Theirs(h);
  ASSERT_NE(theirs, nullptr);
  const uintptr_t dst = reinterpret_cast<uintptr_t>(theirs_mem);
  void* app = cuda.NewStream();
  ASSERT_NE(app, nullptr);
  struct DelayOff {
    ~DelayOff() { SetCopyDelayUs(0); }
  } delay_off;
  HixlTransferDesc d = Desc(mine, theirs, 0, n);

  // The application's stream writes `mine`, slowly: its copy sleeps 300 ms
  // before writing, and the copies started after it (hixl's) do not.
  std::vector<unsigned char> fresh(n);
  auto slow_app_write = [&](uint64_t seed) {
    hixl_test::FillPattern(fresh.data(), n, seed);
    SetCopyDelayUs(300000);
    const bool ok = cuda.CopyAsync(mine, fresh.data(), n, app);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // its copy has begun
    SetCopyDelayUs(0);
    return ok;
  };
  // A blocking WRITE on that stream, posted right after, sends the new bytes.
  ASSERT_TRUE(slow_app_write(71));
  ASSERT_ST(HIXL_SUCCESS,
            hixlTransferBatchOnStream(init_, HIXL_OP_WRITE, &d, 1, nullptr, app, 0, nullptr));
  EXPECT_EQ(DevHash(dst, n), PatternHash(n, 71));

  // Async, with a notification: it arrives after the bytes the stream wrote.
  ASSERT_TRUE(slow_app_write(72));
  HixlTransferOptions opt{};
  opt.notify_name = "kv/done";
  opt.timeout_ms = 20000;
  HixlRequest req = nullptr;
  ASSERT_ST(HIXL_SUCCESS,
            hixlTransferBatchOnStream(init_, HIXL_OP_WRITE, &d, 1, &opt, app, 1, &req));
  ASSERT_ST(HIXL_SUCCESS, hixlWaitRequest(init_, req, 20000));
  ASSERT_ST(HIXL_SUCCESS, hixlDestroyRequest(req));
  HixlNotify notes[4];
  size_t count = 0;
  ASSERT_TRUE(Eventually(
      [&] { return hixlGetNotifies(target_, notes, 4, &count) == HIXL_SUCCESS && count > 0; }));
  EXPECT_EQ(std::string(notes[0].name, notes[0].name_len), "kv/done");
  EXPECT_EQ(DevHash(dst, n), PatternHash(n, 72));

  // A stream the driver does not know: refused with the reason, nothing moves.
  ASSERT_TRUE(DevFillPattern(reinterpret_cast<uintptr_t>(mine), n, 73));
  void* bogus = reinterpret_cast<void*>(uintptr_t{0xdead0});
  EXPECT_ST(HIXL_PARAM_INVALID,
            hixlTransferBatchOnStream(init_, HIXL_OP_WRITE, &d, 1, nullptr, bogus, 0, nullptr));
  EXPECT_NE(std::string(hixlGetLastErrorMessage()).find("stream"), std::string::npos)
      << hixlGetLastErrorMessage();
  EXPECT_ST(HIXL_PARAM_INVALID,
            hixlTransferBatchOnStream(init_, HIXL_OP_WRITE, &d, 1, nullptr, bogus, 1, &req));
  EXPECT_EQ(DevHash(dst, n), PatternHash(n, 72));

  EXPECT_TRUE(cuda.DestroyStream(app));
  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(init_, theirs));
  EXPECT_ST(HIXL_SUCCESS, hixlUnregisterMemory(target_, h));
  EXPECT_ST(HIXL_SUCCESS, hixlFreeMemory(target_, theirs_mem));
  EXPECT_ST(HIXL_SUCCESS, hixlFreeMemory(init_, mine));
}

INSTANTIATE_TEST_SUITE_P(Links, DeviceCApi, HIXL_DEVICE_LINKS,
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

}  // namespace
