// Tests of hixl_fake_cuda, the stand-in for the CUDA driver. The library is
// loaded with dlopen() and every entry point is resolved through
// cuGetProcAddress_v2, as a client of the real driver does.
//
// Some tests need a process of their own: one that has not called cuInit, one
// with other HIXL_FAKE_CUDA_* settings, or the peer of an IPC handle. They run
// this binary again with HIXL_FAKE_CUDA_TEST_ROLE set, which makes it play
// that role before main() and exit with 0 when all its checks pass (see
// RunChildRole), so no placeholder test shows up in the suite.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "fake_cuda_control.h"

extern char** environ;

// Prints CUresult values by name in failure messages; at global scope, where
// argument-dependent lookup finds it for CUDA's global enum.
void PrintTo(CUresult r, std::ostream* os);

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// hixl asks for the CUDA 12.0 ABI of every entry point.
constexpr int kAskVersion = 12000;
// No wait in these tests should come near this; it turns a hang into a failure.
constexpr auto kWaitLimit = std::chrono::seconds(20);
constexpr char kRoleEnv[] = "HIXL_FAKE_CUDA_TEST_ROLE";

// The driver as a client sees it.
struct Driver {
  std::string error;  // why loading failed; empty when it worked
  void* lib = nullptr;
  PFN_cuGetProcAddress_v12000 get_proc_address = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuInit_v2000 init = nullptr;
  PFN_cuDriverGetVersion_v2020 driver_get_version = nullptr;
  PFN_cuDeviceGetCount_v2000 device_get_count = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetUuid_v11040 device_get_uuid = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuPointerGetAttributes_v7000 pointer_get_attributes = nullptr;
  PFN_cuMemGetAddressRange_v3020 mem_get_address_range = nullptr;
  PFN_cuMemAlloc_v3020 mem_alloc = nullptr;
  PFN_cuMemFree_v3020 mem_free = nullptr;
  PFN_cuMemHostAlloc_v2020 mem_host_alloc = nullptr;
  PFN_cuMemFreeHost_v2000 mem_free_host = nullptr;
  PFN_cuMemHostRegister_v6050 mem_host_register = nullptr;
  PFN_cuMemHostUnregister_v4000 mem_host_unregister = nullptr;
  PFN_cuMemcpy_v4000 copy = nullptr;
  PFN_cuMemcpyAsync_v4000 copy_async = nullptr;
  PFN_cuStreamCreate_v2000 stream_create = nullptr;
  PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
  PFN_cuStreamSynchronize_v2000 stream_synchronize = nullptr;
  PFN_cuStreamWaitEvent_v3020 stream_wait_event = nullptr;
  PFN_cuEventCreate_v2000 event_create = nullptr;
  PFN_cuEventRecord_v2000 event_record = nullptr;
  PFN_cuEventQuery_v2000 event_query = nullptr;
  PFN_cuEventSynchronize_v2000 event_synchronize = nullptr;
  PFN_cuEventDestroy_v4000 event_destroy = nullptr;
  PFN_cuIpcGetMemHandle_v4010 ipc_get_mem_handle = nullptr;
  PFN_cuIpcOpenMemHandle_v11000 ipc_open_mem_handle = nullptr;
  PFN_cuIpcCloseMemHandle_v4010 ipc_close_mem_handle = nullptr;
  decltype(&hixl_fake_cuda_set_copy_delay_us) set_copy_delay_us = nullptr;
  decltype(&hixl_fake_cuda_fail_copies_after) fail_copies_after = nullptr;
  decltype(&hixl_fake_cuda_live_allocs) live_allocs = nullptr;
  decltype(&hixl_fake_cuda_live_ipc_mappings) live_ipc_mappings = nullptr;
  decltype(&hixl_fake_cuda_copies) copies = nullptr;
  decltype(&hixl_fake_cuda_bytes_copied) bytes_copied = nullptr;
};

template <typename Fn>
void Resolve(Driver& d, const char* name, Fn* out) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (d.get_proc_address(name, &fn, kAskVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) !=
          CUDA_SUCCESS ||
      status != CU_GET_PROC_ADDRESS_SUCCESS || fn == nullptr) {
    d.error += std::string("cuGetProcAddress_v2 does not resolve ") + name + "\n";
  }
  *out = reinterpret_cast<Fn>(fn);
}

template <typename Fn>
void ResolveControl(Driver& d, const char* name, Fn* out) {
  void* fn = dlsym(d.lib, name);
  if (fn == nullptr) d.error += std::string("no control function ") + name + "\n";
  *out = reinterpret_cast<Fn>(fn);
}

// Loaded once per process and never unloaded, as hixl keeps the driver.
const Driver& LoadDriver() {
  static const Driver driver = [] {
    Driver d;
    d.lib = dlopen(HIXL_FAKE_CUDA_PATH, RTLD_NOW | RTLD_LOCAL);
    if (d.lib == nullptr) {
      d.error = dlerror();
      return d;
    }
    d.get_proc_address =
        reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(d.lib, "cuGetProcAddress_v2"));
    if (d.get_proc_address == nullptr) {
      d.error = "no cuGetProcAddress_v2";
      return d;
    }
    Resolve(d, "cuGetErrorString", &d.get_error_string);
    Resolve(d, "cuGetErrorName", &d.get_error_name);
    Resolve(d, "cuInit", &d.init);
    Resolve(d, "cuDriverGetVersion", &d.driver_get_version);
    Resolve(d, "cuDeviceGetCount", &d.device_get_count);
    Resolve(d, "cuDeviceGet", &d.device_get);
    Resolve(d, "cuDeviceGetUuid", &d.device_get_uuid);
    Resolve(d, "cuDevicePrimaryCtxRetain", &d.primary_ctx_retain);
    Resolve(d, "cuDevicePrimaryCtxRelease", &d.primary_ctx_release);
    Resolve(d, "cuCtxSetCurrent", &d.ctx_set_current);
    Resolve(d, "cuCtxGetCurrent", &d.ctx_get_current);
    Resolve(d, "cuPointerGetAttributes", &d.pointer_get_attributes);
    Resolve(d, "cuMemGetAddressRange", &d.mem_get_address_range);
    Resolve(d, "cuMemAlloc", &d.mem_alloc);
    Resolve(d, "cuMemFree", &d.mem_free);
    Resolve(d, "cuMemHostAlloc", &d.mem_host_alloc);
    Resolve(d, "cuMemFreeHost", &d.mem_free_host);
    Resolve(d, "cuMemHostRegister", &d.mem_host_register);
    Resolve(d, "cuMemHostUnregister", &d.mem_host_unregister);
    Resolve(d, "cuMemcpy", &d.copy);
    Resolve(d, "cuMemcpyAsync", &d.copy_async);
    Resolve(d, "cuStreamCreate", &d.stream_create);
    Resolve(d, "cuStreamDestroy", &d.stream_destroy);
    Resolve(d, "cuStreamSynchronize", &d.stream_synchronize);
    Resolve(d, "cuStreamWaitEvent", &d.stream_wait_event);
    Resolve(d, "cuEventCreate", &d.event_create);
    Resolve(d, "cuEventRecord", &d.event_record);
    Resolve(d, "cuEventQuery", &d.event_query);
    Resolve(d, "cuEventSynchronize", &d.event_synchronize);
    Resolve(d, "cuEventDestroy", &d.event_destroy);
    Resolve(d, "cuIpcGetMemHandle", &d.ipc_get_mem_handle);
    Resolve(d, "cuIpcOpenMemHandle", &d.ipc_open_mem_handle);
    Resolve(d, "cuIpcCloseMemHandle", &d.ipc_close_mem_handle);
    ResolveControl(d, "hixl_fake_cuda_set_copy_delay_us", &d.set_copy_delay_us);
    ResolveControl(d, "hixl_fake_cuda_fail_copies_after", &d.fail_copies_after);
    ResolveControl(d, "hixl_fake_cuda_live_allocs", &d.live_allocs);
    ResolveControl(d, "hixl_fake_cuda_live_ipc_mappings", &d.live_ipc_mappings);
    ResolveControl(d, "hixl_fake_cuda_copies", &d.copies);
    ResolveControl(d, "hixl_fake_cuda_bytes_copied", &d.bytes_copied);
    return d;
  }();
  return driver;
}

template <typename T>
CUdeviceptr Addr(T* p) {
  return reinterpret_cast<CUdeviceptr>(p);
}

unsigned char Pattern(size_t i) { return static_cast<unsigned char>(i * 7 + 3); }

std::vector<unsigned char> PatternBytes(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Pattern(i);
  return v;
}

// Polls instead of calling cuEventSynchronize so a hang fails the test.
CUresult WaitEvent(const Driver& d, CUevent event) {
  const auto deadline = Clock::now() + kWaitLimit;
  for (;;) {
    const CUresult r = d.event_query(event);
    if (r != CUDA_ERROR_NOT_READY || Clock::now() > deadline) return r;
    std::this_thread::sleep_for(milliseconds(1));
  }
}

// cuStreamSynchronize, once an event shows (within kWaitLimit) that the work
// queued so far is done.
CUresult SyncStream(const Driver& d, CUstream stream) {
  CUevent marker = nullptr;
  if (d.event_create(&marker, 0) != CUDA_SUCCESS) return CUDA_ERROR_UNKNOWN;
  CUresult r = d.event_record(marker, stream);
  if (r == CUDA_SUCCESS && WaitEvent(d, marker) == CUDA_ERROR_NOT_READY) r = CUDA_ERROR_NOT_READY;
  d.event_destroy(marker);
  return r == CUDA_ERROR_NOT_READY ? r : d.stream_synchronize(stream);
}

// Exit status of a child (128 + signal if killed); kills and reaps it when it
// has not exited within kWaitLimit (-1).
int WaitForExit(pid_t pid) {
  const auto deadline = Clock::now() + kWaitLimit;
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return -2;
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs this binary again in `role` (see RunChildRole), with the given
// variables added to an environment stripped of HIXL_FAKE_CUDA_* settings.
pid_t SpawnRole(const std::string& role, const std::vector<std::string>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "HIXL_FAKE_CUDA_", 15) != 0) env.emplace_back(*e);
  }
  env.push_back(std::string(kRoleEnv) + "=" + role);
  env.insert(env.end(), vars.begin(), vars.end());
  std::vector<char*> envp;
  for (std::string& v : env) envp.push_back(v.data());
  envp.push_back(nullptr);
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return -1;
  self[n] = '\0';
  char* argv[] = {self, nullptr};
  pid_t pid = -1;
  return posix_spawn(&pid, self, nullptr, nullptr, argv, envp.data()) == 0 ? pid : -1;
}

std::string ToHex(const CUipcMemHandle& h) {
  std::string out;
  char byte[3];
  for (char c : h.reserved) {
    std::snprintf(byte, sizeof(byte), "%02x", static_cast<unsigned char>(c));
    out += byte;
  }
  return out;
}

bool FromHex(const char* hex, CUipcMemHandle* h) {
  if (hex == nullptr || std::strlen(hex) != 2 * sizeof(h->reserved)) return false;
  for (size_t i = 0; i < sizeof(h->reserved); ++i) {
    unsigned v = 0;
    if (std::sscanf(hex + 2 * i, "%2x", &v) != 1) return false;
    h->reserved[i] = static_cast<char>(v);
  }
  return true;
}

// The attributes hixl reads, in one cuPointerGetAttributes call.
struct PointerInfo {
  CUcontext ctx = nullptr;
  unsigned int type = 99;
  CUdeviceptr device_pointer = 1;
  void* host_pointer = &type;
  int ordinal = 99;
  unsigned long long buffer_id = 99;
  CUdeviceptr start = 1;
  size_t size = 1;
  unsigned int managed = 99;
};

CUresult Describe(const Driver& d, CUdeviceptr p, PointerInfo* info) {
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_CONTEXT,          CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
      CU_POINTER_ATTRIBUTE_DEVICE_POINTER,   CU_POINTER_ATTRIBUTE_HOST_POINTER,
      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,   CU_POINTER_ATTRIBUTE_BUFFER_ID,
      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
      CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* data[] = {&info->ctx,          &info->type,    &info->device_pointer,
                  &info->host_pointer, &info->ordinal, &info->buffer_id,
                  &info->start,        &info->size,    &info->managed};
  static_assert(std::size(attrs) == std::size(data));
  return d.pointer_get_attributes(std::size(attrs), attrs, data, p);
}

// ----------------------------------------------------------------------------
// Child roles. Each returns the child's exit status: 0 when every check held.

#define ROLE_CHECK(cond)                                                                         \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "%s:%d: check failed in the child: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

// cuInit and a round trip through device memory.
int UseFreshDriver(const Driver& d) {
  ROLE_CHECK(d.init(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  ROLE_CHECK(d.primary_ctx_retain(&ctx, 0) == CUDA_SUCCESS);
  ROLE_CHECK(d.ctx_set_current(ctx) == CUDA_SUCCESS);
  const std::vector<unsigned char> in = PatternBytes(100);
  std::vector<unsigned char> out(in.size());
  CUdeviceptr p = 0;
  ROLE_CHECK(d.mem_alloc(&p, in.size()) == CUDA_SUCCESS);
  ROLE_CHECK(d.copy(p, Addr(in.data()), in.size()) == CUDA_SUCCESS);
  ROLE_CHECK(d.copy(Addr(out.data()), p, out.size()) == CUDA_SUCCESS);
  ROLE_CHECK(out == in);
  ROLE_CHECK(d.mem_free(p) == CUDA_SUCCESS);
  ROLE_CHECK(d.primary_ctx_release(0) == CUDA_SUCCESS);
  return 0;
}

int RoleUninitialised(const Driver& d) {
  int count = -1;
  CUdeviceptr p = 0;
  CUcontext ctx = nullptr;
  CUuuid uuid;
  ROLE_CHECK(d.device_get_count(&count) == CUDA_ERROR_NOT_INITIALIZED);
  ROLE_CHECK(d.device_get_uuid(&uuid, 0) == CUDA_ERROR_NOT_INITIALIZED);
  ROLE_CHECK(d.primary_ctx_retain(&ctx, 0) == CUDA_ERROR_NOT_INITIALIZED);
  ROLE_CHECK(d.ctx_get_current(&ctx) == CUDA_ERROR_NOT_INITIALIZED);
  ROLE_CHECK(d.mem_alloc(&p, 64) == CUDA_ERROR_NOT_INITIALIZED);
  ROLE_CHECK(d.init(1) == CUDA_ERROR_INVALID_VALUE);
  // These work before cuInit, as in the real driver.
  int version = 0;
  ROLE_CHECK(d.driver_get_version(&version) == CUDA_SUCCESS && version == 13000);
  const char* name = nullptr;
  ROLE_CHECK(d.get_error_name(CUDA_ERROR_NOT_INITIALIZED, &name) == CUDA_SUCCESS);
  ROLE_CHECK(std::strcmp(name, "CUDA_ERROR_NOT_INITIALIZED") == 0);
  // A child forked before any cuInit may use the driver on its own, and so
  // may this process afterwards.
  const pid_t pid = fork();
  if (pid == 0) _exit(UseFreshDriver(d));
  ROLE_CHECK(pid > 0);
  ROLE_CHECK(WaitForExit(pid) == 0);
  return UseFreshDriver(d);
}

int RoleNoDevice(const Driver& d) {
  ROLE_CHECK(d.init(0) == CUDA_ERROR_NO_DEVICE);
  int count = -1;
  ROLE_CHECK(d.device_get_count(&count) == CUDA_ERROR_NOT_INITIALIZED);
  ROLE_CHECK(d.init(0) == CUDA_ERROR_NO_DEVICE);
  return 0;
}

// HIXL_FAKE_CUDA_DEVICES=3, HIXL_FAKE_CUDA_VISIBLE=2,0
int RoleVisible(const Driver& d) {
  ROLE_CHECK(d.init(0) == CUDA_SUCCESS);
  int count = 0;
  ROLE_CHECK(d.device_get_count(&count) == CUDA_SUCCESS && count == 2);
  CUuuid uuid;
  ROLE_CHECK(d.device_get_uuid(&uuid, 0) == CUDA_SUCCESS);
  ROLE_CHECK(std::memcmp(uuid.bytes, "hixlfakegpu00002", 16) == 0);
  ROLE_CHECK(d.device_get_uuid(&uuid, 1) == CUDA_SUCCESS);
  ROLE_CHECK(std::memcmp(uuid.bytes, "hixlfakegpu00000", 16) == 0);
  CUdevice dev = -1;
  ROLE_CHECK(d.device_get(&dev, 1) == CUDA_SUCCESS && dev == 1);
  ROLE_CHECK(d.device_get(&dev, 2) == CUDA_ERROR_INVALID_DEVICE);
  ROLE_CHECK(d.device_get_uuid(&uuid, 2) == CUDA_ERROR_INVALID_DEVICE);
  // Each device has its own primary context.
  CUcontext c0 = nullptr, c1 = nullptr;
  ROLE_CHECK(d.primary_ctx_retain(&c0, 0) == CUDA_SUCCESS);
  ROLE_CHECK(d.primary_ctx_retain(&c1, 1) == CUDA_SUCCESS);
  ROLE_CHECK(c0 != nullptr && c1 != nullptr && c0 != c1);
  ROLE_CHECK(d.ctx_set_current(c1) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ROLE_CHECK(d.mem_alloc(&p, 10) == CUDA_SUCCESS);
  PointerInfo info;
  ROLE_CHECK(Describe(d, p, &info) == CUDA_SUCCESS);
  ROLE_CHECK(info.ordinal == 1 && info.ctx == c1);
  ROLE_CHECK(d.mem_free(p) == CUDA_SUCCESS);
  return 0;
}

// The peer of SharesMemoryWithAnotherProcessThroughIpc: opens the parent's
// buffer, checks and rewrites it, and tries the handle of a freed buffer.
int RoleIpcPeer(const Driver& d) {
  CUipcMemHandle handle, freed;
  ROLE_CHECK(FromHex(std::getenv("HIXL_FAKE_CUDA_TEST_HANDLE"), &handle));
  ROLE_CHECK(FromHex(std::getenv("HIXL_FAKE_CUDA_TEST_FREED"), &freed));
  const char* size_text = std::getenv("HIXL_FAKE_CUDA_TEST_SIZE");
  ROLE_CHECK(size_text != nullptr);
  const size_t n = std::strtoull(size_text, nullptr, 10);
  ROLE_CHECK(n > 0);
  ROLE_CHECK(d.init(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  ROLE_CHECK(d.primary_ctx_retain(&ctx, 0) == CUDA_SUCCESS);
  ROLE_CHECK(d.ctx_set_current(ctx) == CUDA_SUCCESS);

  CUdeviceptr p = 0;
  ROLE_CHECK(d.ipc_open_mem_handle(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  ROLE_CHECK(d.live_ipc_mappings() == 1);
  PointerInfo info;
  ROLE_CHECK(Describe(d, p + 10, &info) == CUDA_SUCCESS);
  ROLE_CHECK(info.type == CU_MEMORYTYPE_DEVICE && info.start == p && info.size == n);
  ROLE_CHECK(info.ordinal == 0 && info.buffer_id != 0);
  CUdeviceptr base = 0;
  size_t size = 0;
  ROLE_CHECK(d.mem_get_address_range(&base, &size, p + n - 1) == CUDA_SUCCESS);
  ROLE_CHECK(base == p && size == n);
  // An IPC mapping is not an allocation of this process.
  ROLE_CHECK(d.mem_free(p) == CUDA_ERROR_INVALID_VALUE);
  CUipcMemHandle again;
  ROLE_CHECK(d.ipc_get_mem_handle(&again, p) == CUDA_ERROR_INVALID_VALUE);

  std::vector<unsigned char> bytes(n);
  ROLE_CHECK(d.copy(Addr(bytes.data()), p, n) == CUDA_SUCCESS);
  ROLE_CHECK(bytes == PatternBytes(n));
  ROLE_CHECK(d.copy(p + n - 1, Addr(bytes.data()), 2) == CUDA_ERROR_INVALID_VALUE);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(~b);
  ROLE_CHECK(d.copy(p, Addr(bytes.data()), n) == CUDA_SUCCESS);

  // A second open shares the mapping; it goes at the last close.
  CUdeviceptr p2 = 0;
  ROLE_CHECK(d.ipc_open_mem_handle(&p2, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
             CUDA_SUCCESS);
  ROLE_CHECK(p2 == p && d.live_ipc_mappings() == 1);
  ROLE_CHECK(d.ipc_close_mem_handle(p) == CUDA_SUCCESS);
  ROLE_CHECK(d.live_ipc_mappings() == 1);
  ROLE_CHECK(d.ipc_close_mem_handle(p) == CUDA_SUCCESS);
  ROLE_CHECK(d.live_ipc_mappings() == 0);
  ROLE_CHECK(d.ipc_close_mem_handle(p) == CUDA_ERROR_INVALID_VALUE);

  ROLE_CHECK(d.ipc_open_mem_handle(&p, freed, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
             CUDA_ERROR_INVALID_HANDLE);
  CUipcMemHandle garbage{};
  ROLE_CHECK(d.ipc_open_mem_handle(&p, garbage, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
             CUDA_ERROR_INVALID_VALUE);
  ROLE_CHECK(d.live_ipc_mappings() == 0 && d.live_allocs() == 0);
  return 0;
}

int RunChildRole(const std::string& role) {
  const Driver& d = LoadDriver();
  if (!d.error.empty()) {
    std::fprintf(stderr, "cannot load the fake driver: %s\n", d.error.c_str());
    return 2;
  }
  if (role == "uninitialised") return RoleUninitialised(d);
  if (role == "no_device") return RoleNoDevice(d);
  if (role == "visible") return RoleVisible(d);
  if (role == "ipc_peer") return RoleIpcPeer(d);
  std::fprintf(stderr, "unknown role %s\n", role.c_str());
  return 2;
}

// Plays the role, if this process was started for one, before gtest runs.
[[maybe_unused]] const int kChildRole = [] {
  const char* role = std::getenv(kRoleEnv);
  if (role == nullptr) return 0;
  const int status = RunChildRole(role);
  std::fflush(stderr);
  std::exit(status);
}();

// ----------------------------------------------------------------------------
// Tests

class FakeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(d_.error.empty()) << d_.error;
    // This process's own configuration: one device, no delay, no failures.
    [[maybe_unused]] static const bool cleared = [] {
      for (const char* var : {"HIXL_FAKE_CUDA_DEVICES", "HIXL_FAKE_CUDA_VISIBLE",
                              "HIXL_FAKE_CUDA_COPY_DELAY_US", "HIXL_FAKE_CUDA_FAIL_COPY_AFTER"}) {
        unsetenv(var);
      }
      return true;
    }();
    ASSERT_EQ(d_.init(0), CUDA_SUCCESS);
    if (ctx_ == nullptr) {
      ASSERT_EQ(d_.primary_ctx_retain(&ctx_, 0), CUDA_SUCCESS);
    }
    ASSERT_EQ(d_.ctx_set_current(ctx_), CUDA_SUCCESS);
    d_.set_copy_delay_us(0);
    d_.fail_copies_after(-1);
  }

  void TearDown() override {
    d_.set_copy_delay_us(0);
    d_.fail_copies_after(-1);
    EXPECT_EQ(d_.live_allocs(), 0) << "device memory left allocated";
    EXPECT_EQ(d_.live_ipc_mappings(), 0) << "IPC mappings left open";
  }

  const Driver& d_ = LoadDriver();
  static CUcontext ctx_;  // device 0's primary context, retained once
};

CUcontext FakeCudaTest::ctx_ = nullptr;

TEST_F(FakeCudaTest, ResolvesOnlyKnownNamesAndVersions) {
  void* fn = &fn;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(d_.get_proc_address("cuNoSuchCall", &fn, kAskVersion, 0, &status),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  // Base names only: the version picks the ABI.
  EXPECT_EQ(d_.get_proc_address("cuMemAlloc_v2", &fn, kAskVersion, 0, &status),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(d_.get_proc_address("cuMemAlloc", &fn, 3010, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(d_.get_proc_address("cuIpcOpenMemHandle", &fn, 10020, 0, &status),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(d_.get_proc_address("cuMemAlloc", &fn, 3020, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(d_.mem_alloc));
  EXPECT_EQ(d_.get_proc_address("cuMemcpyAsync", &fn, 13000,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(d_.copy_async));
  EXPECT_EQ(d_.get_proc_address(nullptr, &fn, kAskVersion, 0, &status), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.get_proc_address("cuInit", nullptr, kAskVersion, 0, &status),
            CUDA_ERROR_INVALID_VALUE);

  // The entry points themselves are not exported.
  EXPECT_EQ(dlsym(d_.lib, "cuInit"), nullptr);
  EXPECT_EQ(dlsym(d_.lib, "cuMemAlloc_v2"), nullptr);
  EXPECT_EQ(dlsym(d_.lib, "cuGetProcAddress"), nullptr);
}

TEST_F(FakeCudaTest, NamesEveryErrorItReturns) {
  for (CUresult code :
       {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_NO_DEVICE,
        CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE,
        CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY, CUDA_ERROR_LAUNCH_FAILED,
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED}) {
    const char* name = nullptr;
    const char* text = nullptr;
    EXPECT_EQ(d_.get_error_name(code, &name), CUDA_SUCCESS) << code;
    EXPECT_EQ(d_.get_error_string(code, &text), CUDA_SUCCESS) << code;
    EXPECT_NE(name, nullptr);
    EXPECT_NE(text, nullptr);
  }
  const char* s = nullptr;
  ASSERT_EQ(d_.get_error_name(CUDA_ERROR_INVALID_CONTEXT, &s), CUDA_SUCCESS);
  EXPECT_STREQ(s, "CUDA_ERROR_INVALID_CONTEXT");
  ASSERT_EQ(d_.get_error_string(CUDA_ERROR_LAUNCH_FAILED, &s), CUDA_SUCCESS);
  EXPECT_STREQ(s, "unspecified launch failure");
  s = "unchanged";
  EXPECT_EQ(d_.get_error_name(static_cast<CUresult>(123456), &s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s, nullptr);
  int version = 0;
  EXPECT_EQ(d_.driver_get_version(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, 13000);
}

TEST_F(FakeCudaTest, CallsBeforeCuInitFail) {
  const pid_t pid = SpawnRole("uninitialised", {});
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitForExit(pid), 0);
}

TEST_F(FakeCudaTest, NoDevicesMakesCuInitFail) {
  const pid_t pid = SpawnRole("no_device", {"HIXL_FAKE_CUDA_DEVICES=0"});
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitForExit(pid), 0);
}

TEST_F(FakeCudaTest, VisibleDevicesMapOrdinalsToPhysicalDevices) {
  int count = 0;
  ASSERT_EQ(d_.device_get_count(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 1);
  CUuuid uuid;
  ASSERT_EQ(d_.device_get_uuid(&uuid, 0), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(uuid.bytes, "hixlfakegpu00000", 16), 0);
  const pid_t pid =
      SpawnRole("visible", {"HIXL_FAKE_CUDA_DEVICES=3", "HIXL_FAKE_CUDA_VISIBLE=2,0"});
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitForExit(pid), 0);
}

TEST_F(FakeCudaTest, CallsWithoutACurrentContextFail) {
  // A thread that never made the context current, as a hixl thread that
  // forgot to would.
  std::vector<CUresult> results;
  CUcontext seen = ctx_;
  std::thread([&] {
    CUdeviceptr p = 0;
    void* host = nullptr;
    CUstream stream = nullptr;
    CUevent event = nullptr;
    char buf[16] = {};
    PointerInfo info;
    CUipcMemHandle handle;
    results = {d_.mem_alloc(&p, 16),
               d_.mem_host_alloc(&host, 16, 0),
               d_.mem_host_register(buf, sizeof(buf), 0),
               d_.stream_create(&stream, 0),
               d_.event_create(&event, 0),
               d_.copy(Addr(buf), Addr(buf + 8), 8),
               d_.copy_async(Addr(buf), Addr(buf + 8), 8, nullptr),
               d_.stream_synchronize(nullptr),
               Describe(d_, Addr(buf), &info),
               d_.mem_get_address_range(&p, nullptr, Addr(buf)),
               d_.ipc_get_mem_handle(&handle, Addr(buf))};
    d_.ctx_get_current(&seen);
  }).join();
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i], CUDA_ERROR_INVALID_CONTEXT) << "call " << i;
  }
  EXPECT_EQ(seen, nullptr);

  // No context on this thread either, after setting none.
  CUdeviceptr p = 0;
  ASSERT_EQ(d_.ctx_set_current(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_alloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(d_.ctx_set_current(reinterpret_cast<CUcontext>(&p)), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(d_.ctx_set_current(ctx_), CUDA_SUCCESS);
  ASSERT_EQ(d_.ctx_get_current(&seen), CUDA_SUCCESS);
  EXPECT_EQ(seen, ctx_);

  // The primary context is one per device and refcounted; released to zero,
  // it no longer counts as current.
  CUcontext again = nullptr;
  ASSERT_EQ(d_.primary_ctx_retain(&again, 0), CUDA_SUCCESS);
  EXPECT_EQ(again, ctx_);
  ASSERT_EQ(d_.primary_ctx_release(0), CUDA_SUCCESS);
  ASSERT_EQ(d_.primary_ctx_release(0), CUDA_SUCCESS);
  EXPECT_EQ(d_.primary_ctx_release(0), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(d_.mem_alloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(d_.primary_ctx_retain(&again, 0), CUDA_SUCCESS);
  EXPECT_EQ(again, ctx_);
  ASSERT_EQ(d_.mem_alloc(&p, 16), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, CopiesRoundTripOddSizes) {
  CUstream stream = nullptr;
  ASSERT_EQ(d_.stream_create(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  for (size_t n : {size_t{1}, size_t{3}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{65537},
                   (size_t{1} << 20) + 13}) {
    SCOPED_TRACE(n);
    const std::vector<unsigned char> in = PatternBytes(n);
    std::vector<unsigned char> out(n, 0);
    CUdeviceptr p = 0;
    ASSERT_EQ(d_.mem_alloc(&p, n), CUDA_SUCCESS);
    ASSERT_EQ(d_.copy(p, Addr(in.data()), n), CUDA_SUCCESS);
    ASSERT_EQ(d_.copy(Addr(out.data()), p, n), CUDA_SUCCESS);
    EXPECT_EQ(out, in);
    // The same through a stream, the halves in two copies.
    std::vector<unsigned char> out2(n, 0);
    const size_t half = n / 2;
    ASSERT_EQ(d_.copy_async(Addr(out2.data()), p, half, stream), CUDA_SUCCESS);
    ASSERT_EQ(d_.copy_async(Addr(out2.data() + half), p + half, n - half, stream), CUDA_SUCCESS);
    ASSERT_EQ(SyncStream(d_, stream), CUDA_SUCCESS);
    EXPECT_EQ(out2, in);
    EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
  }
  // Zero bytes is a no-op, whatever the addresses.
  EXPECT_EQ(d_.copy(0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(d_.copy_async(0, 0, 0, stream), CUDA_SUCCESS);
  EXPECT_EQ(d_.stream_destroy(stream), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, CopiesDeviceToDevice) {
  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(d_.mem_alloc(&a, 1000), CUDA_SUCCESS);
  ASSERT_EQ(d_.mem_alloc(&b, 3000), CUDA_SUCCESS);
  const std::vector<unsigned char> in = PatternBytes(1000);
  ASSERT_EQ(d_.copy(a, Addr(in.data()), in.size()), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy(b + 1000, a + 10, 500), CUDA_SUCCESS);
  std::vector<unsigned char> out(3000, 0xFF);
  ASSERT_EQ(d_.copy(Addr(out.data()), b, out.size()), CUDA_SUCCESS);
  for (size_t i = 0; i < out.size(); ++i) {
    const unsigned char want = i >= 1000 && i < 1500 ? in[i - 1000 + 10] : 0;
    ASSERT_EQ(out[i], want) << "byte " << i;  // new memory reads as zeros
  }
  EXPECT_EQ(d_.mem_free(a), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_free(b), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, RefusesCopiesCrossingAnAllocationsEnd) {
  CUdeviceptr p = 0;
  ASSERT_EQ(d_.mem_alloc(&p, 100), CUDA_SUCCESS);
  std::vector<unsigned char> fill(100, 0xAB), src(200, 0xCD), dst(200, 0x11);
  ASSERT_EQ(d_.copy(p, Addr(fill.data()), fill.size()), CUDA_SUCCESS);
  const long long copies = d_.copies();
  EXPECT_EQ(d_.copy(p + 60, Addr(src.data()), 50), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.copy_async(p + 60, Addr(src.data()), 50, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.copy(Addr(dst.data()), p + 90, 20), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.copy(p + 100, Addr(src.data()), 1), CUDA_ERROR_INVALID_VALUE);  // page slack
  EXPECT_EQ(d_.copy(Addr(dst.data()), 0, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.copies(), copies);
  EXPECT_EQ(dst, std::vector<unsigned char>(200, 0x11));
  std::vector<unsigned char> back(100);
  ASSERT_EQ(d_.copy(Addr(back.data()), p, back.size()), CUDA_SUCCESS);
  EXPECT_EQ(back, fill);
  EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, DescribesDeviceHostAndUnknownPointers) {
  constexpr size_t kSize = 10000;
  CUdeviceptr p = 0;
  ASSERT_EQ(d_.mem_alloc(&p, kSize), CUDA_SUCCESS);
  PointerInfo dev;
  ASSERT_EQ(Describe(d_, p, &dev), CUDA_SUCCESS);
  EXPECT_EQ(dev.type, unsigned{CU_MEMORYTYPE_DEVICE});
  EXPECT_EQ(dev.ctx, ctx_);
  EXPECT_EQ(dev.device_pointer, p);
  EXPECT_EQ(dev.host_pointer, nullptr);
  EXPECT_EQ(dev.ordinal, 0);
  EXPECT_NE(dev.buffer_id, 0u);
  EXPECT_EQ(dev.start, p);
  EXPECT_EQ(dev.size, kSize);
  EXPECT_EQ(dev.managed, 0u);
  // Inside the allocation: the range is still the whole allocation.
  PointerInfo inner;
  ASSERT_EQ(Describe(d_, p + 4321, &inner), CUDA_SUCCESS);
  EXPECT_EQ(inner.type, unsigned{CU_MEMORYTYPE_DEVICE});
  EXPECT_EQ(inner.device_pointer, p + 4321);
  EXPECT_EQ(inner.buffer_id, dev.buffer_id);
  EXPECT_EQ(inner.start, p);
  EXPECT_EQ(inner.size, kSize);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(d_.mem_get_address_range(&base, &size, p + kSize - 1), CUDA_SUCCESS);
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, kSize);
  EXPECT_EQ(d_.mem_get_address_range(&base, &size, p + kSize), CUDA_ERROR_NOT_FOUND);

  // Buffer ids are never reused.
  CUdeviceptr q = 0;
  ASSERT_EQ(d_.mem_free(p), CUDA_SUCCESS);
  ASSERT_EQ(d_.mem_alloc(&q, kSize), CUDA_SUCCESS);
  PointerInfo next;
  ASSERT_EQ(Describe(d_, q, &next), CUDA_SUCCESS);
  EXPECT_GT(next.buffer_id, dev.buffer_id);
  EXPECT_EQ(d_.mem_free(q), CUDA_SUCCESS);

  // Pinned host memory.
  void* pinned = nullptr;
  ASSERT_EQ(d_.mem_host_alloc(&pinned, 5000, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  PointerInfo host;
  ASSERT_EQ(Describe(d_, Addr(pinned) + 4999, &host), CUDA_SUCCESS);
  EXPECT_EQ(host.type, unsigned{CU_MEMORYTYPE_HOST});
  EXPECT_EQ(host.host_pointer, static_cast<char*>(pinned) + 4999);
  EXPECT_EQ(host.device_pointer, Addr(pinned) + 4999);
  EXPECT_EQ(host.start, Addr(pinned));
  EXPECT_EQ(host.size, 5000u);
  EXPECT_EQ(host.ordinal, 0);
  EXPECT_NE(host.buffer_id, 0u);
  EXPECT_EQ(d_.mem_get_address_range(&base, &size, Addr(pinned)), CUDA_ERROR_NOT_FOUND);
  ASSERT_EQ(Describe(d_, Addr(pinned) + 5000, &host), CUDA_SUCCESS);
  EXPECT_EQ(host.type, 0u);
  EXPECT_EQ(d_.mem_free_host(pinned), CUDA_SUCCESS);

  // Registered host memory.
  std::vector<char> buffer(10000);
  ASSERT_EQ(d_.mem_host_register(buffer.data() + 100, 3000, 0), CUDA_SUCCESS);
  PointerInfo reg;
  ASSERT_EQ(Describe(d_, Addr(buffer.data() + 3099), &reg), CUDA_SUCCESS);
  EXPECT_EQ(reg.type, unsigned{CU_MEMORYTYPE_HOST});
  EXPECT_EQ(reg.start, Addr(buffer.data() + 100));
  EXPECT_EQ(reg.size, 3000u);
  ASSERT_EQ(Describe(d_, Addr(buffer.data() + 3100), &reg), CUDA_SUCCESS);
  EXPECT_EQ(reg.type, 0u);
  EXPECT_EQ(d_.mem_host_unregister(buffer.data() + 100), CUDA_SUCCESS);

  // Plain host memory is not an error, only unknown.
  int local = 0;
  PointerInfo plain;
  ASSERT_EQ(Describe(d_, Addr(&local), &plain), CUDA_SUCCESS);
  EXPECT_EQ(plain.type, 0u);
  EXPECT_EQ(plain.ctx, nullptr);
  EXPECT_EQ(plain.device_pointer, 0u);
  EXPECT_EQ(plain.host_pointer, nullptr);
  EXPECT_EQ(plain.ordinal, -2);
  EXPECT_EQ(plain.buffer_id, 0u);
  EXPECT_EQ(plain.start, 0u);
  EXPECT_EQ(plain.size, 0u);
  EXPECT_EQ(d_.mem_get_address_range(&base, &size, Addr(&local)), CUDA_ERROR_NOT_FOUND);

  CUpointer_attribute unsupported = CU_POINTER_ATTRIBUTE_P2P_TOKENS;
  CUDA_POINTER_ATTRIBUTE_P2P_TOKENS tokens;
  void* data = &tokens;
  EXPECT_EQ(d_.pointer_get_attributes(1, &unsupported, &data, Addr(&local)),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCudaTest, TracksPinnedAndRegisteredHostMemory) {
  void* pinned = nullptr;
  ASSERT_EQ(d_.mem_host_alloc(&pinned, 100, 0), CUDA_SUCCESS);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pinned) % 4096, 0u);
  static_cast<char*>(pinned)[99] = 1;  // plain host memory to the CPU
  EXPECT_EQ(d_.mem_host_register(pinned, 10, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(d_.mem_host_unregister(pinned), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(d_.mem_free_host(pinned), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_free_host(pinned), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.mem_host_alloc(&pinned, 0, 0), CUDA_ERROR_INVALID_VALUE);

  std::vector<char> buffer(3 * 4096);
  char* page0 = buffer.data();
  char* page1 = page0 + 4096;
  char* page2 = page1 + 4096;
  ASSERT_EQ(d_.mem_host_register(page1, 4096, CU_MEMHOSTREGISTER_PORTABLE), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_host_register(page0, 4097, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(d_.mem_host_register(page1 + 4095, 2, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  ASSERT_EQ(d_.mem_host_register(page0, 4096, 0), CUDA_SUCCESS);  // adjacent is fine
  ASSERT_EQ(d_.mem_host_register(page2, 4096, 0), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_host_unregister(page1 + 1), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(d_.mem_free_host(page1), CUDA_ERROR_INVALID_VALUE);
  for (char* page : {page0, page1, page2}) EXPECT_EQ(d_.mem_host_unregister(page), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_host_unregister(page1), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(d_.mem_host_register(nullptr, 10, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.mem_host_register(page0, 0, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCudaTest, RefusesBadAllocationsAndFrees) {
  CUdeviceptr p = 0;
  EXPECT_EQ(d_.mem_alloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d_.mem_alloc(&p, 64), CUDA_SUCCESS);
  EXPECT_EQ(d_.live_allocs(), 1);
  EXPECT_EQ(d_.mem_free(p + 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.mem_free(0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_free(p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.live_allocs(), 0);
}

TEST_F(FakeCudaTest, CpuAccessToDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CUdeviceptr p = 0;
  ASSERT_EQ(d_.mem_alloc(&p, 64), CUDA_SUCCESS);
  EXPECT_DEATH(*reinterpret_cast<volatile char*>(p) = 1, "");
  EXPECT_DEATH(static_cast<void>(*reinterpret_cast<volatile char*>(p + 63)), "");
  EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, StreamRunsWorkInOrderAndEventsReportProgress) {
  constexpr size_t kSize = 4096;
  CUstream stream = nullptr;
  CUevent event = nullptr;
  ASSERT_EQ(d_.stream_create(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_create(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  // Never recorded: complete, as in CUDA.
  EXPECT_EQ(d_.event_query(event), CUDA_SUCCESS);
  EXPECT_EQ(d_.event_synchronize(event), CUDA_SUCCESS);

  CUdeviceptr p = 0;
  ASSERT_EQ(d_.mem_alloc(&p, kSize), CUDA_SUCCESS);
  const std::vector<unsigned char> first(kSize, 1), second(kSize, 2);
  std::vector<unsigned char> out(kSize, 0);
  d_.set_copy_delay_us(300'000);
  ASSERT_EQ(d_.copy_async(p, Addr(first.data()), kSize, stream), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy_async(p, Addr(second.data()), kSize, stream), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy_async(Addr(out.data()), p, kSize, stream), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_record(event, stream), CUDA_SUCCESS);
  EXPECT_EQ(d_.event_query(event), CUDA_ERROR_NOT_READY);
  d_.set_copy_delay_us(0);  // copies not started yet run at once
  EXPECT_EQ(WaitEvent(d_, event), CUDA_SUCCESS);
  EXPECT_EQ(d_.event_query(event), CUDA_SUCCESS);
  EXPECT_EQ(out, second);  // the copies ran in the order queued

  // cuEventSynchronize blocks until the worker reaches the record.
  d_.set_copy_delay_us(100'000);
  ASSERT_EQ(d_.copy_async(Addr(out.data()), p, kSize, stream), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_record(event, stream), CUDA_SUCCESS);
  const auto start = Clock::now();
  EXPECT_EQ(d_.event_synchronize(event), CUDA_SUCCESS);
  EXPECT_GE(Clock::now() - start, milliseconds(90));
  d_.set_copy_delay_us(0);

  // An event destroyed while pending, and a stream destroyed with work
  // queued: the work still runs before cuStreamDestroy returns.
  std::fill(out.begin(), out.end(), 0);
  d_.set_copy_delay_us(50'000);
  ASSERT_EQ(d_.copy_async(p, Addr(first.data()), kSize, stream), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_record(event, stream), CUDA_SUCCESS);
  EXPECT_EQ(d_.event_destroy(event), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy_async(Addr(out.data()), p, kSize, stream), CUDA_SUCCESS);
  EXPECT_EQ(d_.stream_destroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(out, first);
  EXPECT_EQ(d_.stream_destroy(stream), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(d_.event_query(event), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, InjectedFailuresWriteNothingAndAreReported) {
  constexpr size_t kSize = 1000;
  CUdeviceptr p = 0;
  ASSERT_EQ(d_.mem_alloc(&p, kSize), CUDA_SUCCESS);
  const std::vector<unsigned char> old_bytes(kSize, 0x5A), new_bytes(kSize, 0xEE);
  ASSERT_EQ(d_.copy(p, Addr(old_bytes.data()), kSize), CUDA_SUCCESS);
  CUstream stream = nullptr;
  CUevent event = nullptr;
  ASSERT_EQ(d_.stream_create(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_create(&event, 0), CUDA_SUCCESS);

  std::vector<unsigned char> host(kSize, 0x11);
  d_.fail_copies_after(0);
  ASSERT_EQ(d_.copy_async(p, Addr(new_bytes.data()), kSize, stream), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy_async(Addr(host.data()), p, kSize, stream), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_record(event, stream), CUDA_SUCCESS);
  EXPECT_EQ(WaitEvent(d_, event), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(d_.event_synchronize(event), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(d_.stream_synchronize(stream), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(d_.stream_synchronize(stream), CUDA_SUCCESS);  // reported once
  EXPECT_EQ(host, std::vector<unsigned char>(kSize, 0x11));
  // cuMemcpy reports its own failure, and leaves no error on the stream.
  EXPECT_EQ(d_.copy(p, Addr(new_bytes.data()), kSize), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(d_.stream_synchronize(nullptr), CUDA_SUCCESS);

  d_.fail_copies_after(-1);
  std::vector<unsigned char> back(kSize);
  ASSERT_EQ(d_.copy(Addr(back.data()), p, kSize), CUDA_SUCCESS);
  EXPECT_EQ(back, old_bytes);
  // After the synchronize, a new record carries no old error.
  ASSERT_EQ(d_.copy_async(Addr(host.data()), p, kSize, stream), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_record(event, stream), CUDA_SUCCESS);
  EXPECT_EQ(WaitEvent(d_, event), CUDA_SUCCESS);
  EXPECT_EQ(host, old_bytes);

  // The first two copies after the call succeed, every later one fails.
  const long long copies = d_.copies();
  d_.fail_copies_after(2);
  EXPECT_EQ(d_.copy(p, Addr(new_bytes.data()), 10), CUDA_SUCCESS);
  EXPECT_EQ(d_.copy(p, Addr(new_bytes.data()), 10), CUDA_SUCCESS);
  EXPECT_EQ(d_.copy(p, Addr(new_bytes.data()), 10), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(d_.copy(p, Addr(new_bytes.data()), 10), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(d_.copies(), copies + 2);

  EXPECT_EQ(d_.event_destroy(event), CUDA_SUCCESS);
  EXPECT_EQ(d_.stream_destroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, StreamWaitEventOrdersTwoStreams) {
  constexpr size_t kSize = 4096;
  CUstream a = nullptr, b = nullptr;
  CUevent a_done = nullptr, b_done = nullptr, never = nullptr;
  ASSERT_EQ(d_.stream_create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(d_.stream_create(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_create(&a_done, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_create(&b_done, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_create(&never, 0), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(d_.mem_alloc(&p, kSize), CUDA_SUCCESS);
  const std::vector<unsigned char> x(kSize, 1), y(kSize, 2);
  std::vector<unsigned char> out(kSize, 0);

  d_.set_copy_delay_us(150'000);
  ASSERT_EQ(d_.copy_async(p, Addr(x.data()), kSize, a), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy_async(p, Addr(y.data()), kSize, a), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_record(a_done, a), CUDA_SUCCESS);
  ASSERT_EQ(d_.stream_wait_event(b, never, 0), CUDA_SUCCESS);  // never recorded: no wait
  ASSERT_EQ(d_.stream_wait_event(b, a_done, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy_async(Addr(out.data()), p, kSize, b), CUDA_SUCCESS);
  ASSERT_EQ(d_.event_record(b_done, b), CUDA_SUCCESS);
  EXPECT_EQ(d_.event_query(b_done), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(d_.stream_wait_event(b, a_done, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(WaitEvent(d_, b_done), CUDA_SUCCESS);
  EXPECT_EQ(d_.event_query(a_done), CUDA_SUCCESS);
  EXPECT_EQ(out, y);  // b read only after both of a's writes

  for (CUevent e : {a_done, b_done, never}) EXPECT_EQ(d_.event_destroy(e), CUDA_SUCCESS);
  for (CUstream s : {a, b}) EXPECT_EQ(d_.stream_destroy(s), CUDA_SUCCESS);
  EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, StreamsWorkFromManyThreads) {
  // Threads with their own streams copy through one device buffer each, and
  // all of them through the default stream; sanitizer builds watch the locks.
  constexpr int kThreads = 4;
  constexpr size_t kSize = 8192;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      int& bad = failures[t];
      bad += d_.ctx_set_current(ctx_) != CUDA_SUCCESS;
      CUstream stream = nullptr;
      CUevent event = nullptr;
      CUdeviceptr p = 0;
      bad += d_.stream_create(&stream, 0) != CUDA_SUCCESS;
      bad += d_.event_create(&event, 0) != CUDA_SUCCESS;
      bad += d_.mem_alloc(&p, kSize) != CUDA_SUCCESS;
      std::vector<unsigned char> in(kSize), out(kSize);
      for (int round = 0; round < 20; ++round) {
        std::fill(in.begin(), in.end(), static_cast<unsigned char>(t * 31 + round));
        bad += d_.copy_async(p, Addr(in.data()), kSize, stream) != CUDA_SUCCESS;
        bad += d_.copy_async(Addr(out.data()), p, kSize, stream) != CUDA_SUCCESS;
        bad += d_.event_record(event, stream) != CUDA_SUCCESS;
        bad += WaitEvent(d_, event) != CUDA_SUCCESS;
        bad += out != in;
        bad += d_.copy(Addr(out.data()), p, kSize) != CUDA_SUCCESS;
        bad += out != in;
      }
      bad += d_.stream_synchronize(stream) != CUDA_SUCCESS;
      bad += d_.event_destroy(event) != CUDA_SUCCESS;
      bad += d_.stream_destroy(stream) != CUDA_SUCCESS;
      bad += d_.mem_free(p) != CUDA_SUCCESS;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST_F(FakeCudaTest, SharesMemoryWithAnotherProcessThroughIpc) {
  constexpr size_t kSize = 3 * 4096 + 123;
  CUdeviceptr p = 0;
  ASSERT_EQ(d_.mem_alloc(&p, kSize), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy(p, Addr(PatternBytes(kSize).data()), kSize), CUDA_SUCCESS);
  CUipcMemHandle handle;
  ASSERT_EQ(d_.ipc_get_mem_handle(&handle, p), CUDA_SUCCESS);
  EXPECT_EQ(d_.ipc_get_mem_handle(&handle, p + 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d_.ipc_get_mem_handle(&handle, p), CUDA_SUCCESS);
  // Like the real driver, a process cannot open its own handle.
  CUdeviceptr own = 0;
  EXPECT_EQ(d_.ipc_open_mem_handle(&own, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
            CUDA_ERROR_INVALID_CONTEXT);

  // The handle of a buffer freed before the peer opens it.
  CUdeviceptr gone = 0;
  CUipcMemHandle freed;
  ASSERT_EQ(d_.mem_alloc(&gone, 64), CUDA_SUCCESS);
  ASSERT_EQ(d_.ipc_get_mem_handle(&freed, gone), CUDA_SUCCESS);
  ASSERT_EQ(d_.mem_free(gone), CUDA_SUCCESS);

  const pid_t pid = SpawnRole("ipc_peer", {"HIXL_FAKE_CUDA_TEST_HANDLE=" + ToHex(handle),
                                           "HIXL_FAKE_CUDA_TEST_FREED=" + ToHex(freed),
                                           "HIXL_FAKE_CUDA_TEST_SIZE=" + std::to_string(kSize)});
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitForExit(pid), 0);

  // The peer's writes are visible here.
  std::vector<unsigned char> back(kSize);
  ASSERT_EQ(d_.copy(Addr(back.data()), p, kSize), CUDA_SUCCESS);
  for (size_t i = 0; i < kSize; ++i) {
    ASSERT_EQ(back[i], static_cast<unsigned char>(~Pattern(i))) << "byte " << i;
  }
  EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, ForkedChildOfAnInitialisedProcessCannotUseTheDriver) {
  // With the default stream's thread running, as in a busy hixl process.
  CUdeviceptr p = 0;
  ASSERT_EQ(d_.mem_alloc(&p, 16), CUDA_SUCCESS);
  char byte = 7;
  ASSERT_EQ(d_.copy(p, Addr(&byte), 1), CUDA_SUCCESS);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe work here: the parent has other threads.
    int bad = 0;
    CUdeviceptr q = 0;
    int count = 0;
    int version = 0;
    const char* text = nullptr;
    if (d_.init(0) != CUDA_ERROR_NOT_INITIALIZED) bad |= 1;
    if (d_.mem_alloc(&q, 16) != CUDA_ERROR_NOT_INITIALIZED) bad |= 2;
    if (d_.copy(Addr(&byte), p, 1) != CUDA_ERROR_NOT_INITIALIZED) bad |= 4;
    if (d_.device_get_count(&count) != CUDA_ERROR_NOT_INITIALIZED) bad |= 8;
    if (d_.driver_get_version(&version) != CUDA_SUCCESS || version != 13000) bad |= 16;
    if (d_.get_error_string(CUDA_ERROR_NOT_INITIALIZED, &text) != CUDA_SUCCESS) bad |= 32;
    _exit(bad);
  }
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitForExit(pid), 0);
  // The parent carries on.
  ASSERT_EQ(d_.copy(Addr(&byte), p, 1), CUDA_SUCCESS);
  EXPECT_EQ(byte, 7);
  EXPECT_EQ(d_.mem_free(p), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, CountsAllocationsAndCopies) {
  const long long copies = d_.copies();
  const long long bytes = d_.bytes_copied();
  CUdeviceptr p[3] = {};
  for (CUdeviceptr& q : p) ASSERT_EQ(d_.mem_alloc(&q, 300), CUDA_SUCCESS);
  EXPECT_EQ(d_.live_allocs(), 3);
  std::vector<unsigned char> buf(300, 9);
  ASSERT_EQ(d_.copy(p[0], Addr(buf.data()), 100), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy(p[1], p[0], 250), CUDA_SUCCESS);
  ASSERT_EQ(d_.copy(p[2], p[0], 0), CUDA_SUCCESS);  // no copy at all
  EXPECT_EQ(d_.copies(), copies + 2);
  EXPECT_EQ(d_.bytes_copied(), bytes + 350);
  for (CUdeviceptr q : p) EXPECT_EQ(d_.mem_free(q), CUDA_SUCCESS);
  EXPECT_EQ(d_.live_allocs(), 0);
}

}  // namespace

void PrintTo(CUresult r, std::ostream* os) {
  const char* name = nullptr;
  const Driver& d = LoadDriver();
  if (d.get_error_name != nullptr && d.get_error_name(r, &name) == CUDA_SUCCESS) {
    *os << name;
  } else {
    *os << "CUresult " << static_cast<int>(r);
  }
}
