// Tests of the fake CUDA driver's virtual memory management
// (fake_cuda_vmm.cc), loaded with dlopen() and reached through
// cuGetProcAddress_v2 as hixl reaches a real driver: memory is usable only
// once mapped and made accessible, legacy IPC and cuMemFree refuse it, it is
// shared as a file descriptor only when created for that, and an imported
// descriptor is the same bytes. Across processes: tests/device (hixl's shm
// link imports a peer's memory this way).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device/driver_client.h"  // its declared layouts are checked against cuda.h here
#include "fake_cuda_control.h"

namespace {

struct Vmm {
  std::string error;
  void* lib = nullptr;
  PFN_cuInit_v2000 init = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain_ctx = nullptr;
  PFN_cuCtxSetCurrent_v4000 set_current = nullptr;
  PFN_cuMemcpy_v4000 copy = nullptr;
  PFN_cuMemFree_v3020 mem_free = nullptr;
  PFN_cuPointerGetAttributes_v7000 attributes = nullptr;
  PFN_cuIpcGetMemHandle_v4010 ipc_get = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 retain_handle = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 properties = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  int (*live_maps)() = nullptr;
  int (*live_handles)() = nullptr;
};

const Vmm& Load() {
  static const Vmm v = [] {
    Vmm d;
    d.lib = dlopen(HIXL_FAKE_CUDA_PATH, RTLD_NOW | RTLD_LOCAL);
    if (d.lib == nullptr) {
      d.error = dlerror();
      return d;
    }
    auto gpa = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(d.lib, "cuGetProcAddress_v2"));
    auto get = [&](const char* name, auto& fn) {
      void* p = nullptr;
      CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      if (gpa == nullptr || gpa(name, &p, 12000, 0, &found) != CUDA_SUCCESS || p == nullptr) {
        d.error += std::string("no ") + name + "\n";
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get("cuInit", d.init);
    get("cuDeviceGet", d.device_get);
    get("cuDevicePrimaryCtxRetain", d.retain_ctx);
    get("cuCtxSetCurrent", d.set_current);
    get("cuMemcpy", d.copy);
    get("cuMemFree", d.mem_free);
    get("cuPointerGetAttributes", d.attributes);
    get("cuIpcGetMemHandle", d.ipc_get);
    get("cuMemCreate", d.create);
    get("cuMemRelease", d.release);
    get("cuMemAddressReserve", d.reserve);
    get("cuMemAddressFree", d.address_free);
    get("cuMemMap", d.map);
    get("cuMemUnmap", d.unmap);
    get("cuMemSetAccess", d.set_access);
    get("cuMemRetainAllocationHandle", d.retain_handle);
    get("cuMemExportToShareableHandle", d.export_handle);
    get("cuMemImportFromShareableHandle", d.import_handle);
    get("cuMemGetAllocationPropertiesFromHandle", d.properties);
    get("cuMemGetAllocationGranularity", d.granularity);
    d.live_maps = reinterpret_cast<int (*)()>(dlsym(d.lib, "hixl_fake_cuda_live_vmm_mappings"));
    d.live_handles = reinterpret_cast<int (*)()>(dlsym(d.lib, "hixl_fake_cuda_live_vmm_handles"));
    if (d.live_maps == nullptr || d.live_handles == nullptr) d.error += "no VMM controls\n";
    if (!d.error.empty()) return d;
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    if (d.init(0) != CUDA_SUCCESS || d.device_get(&dev, 0) != CUDA_SUCCESS ||
        d.retain_ctx(&ctx, dev) != CUDA_SUCCESS || d.set_current(ctx) != CUDA_SUCCESS) {
      d.error = "cannot initialize the fake driver";
    }
    return d;
  }();
  return v;
}

class FakeVmm : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(v_.error.empty()) << v_.error;
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    ASSERT_EQ(v_.device_get(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(v_.retain_ctx(&ctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(v_.set_current(ctx), CUDA_SUCCESS);
    maps_ = v_.live_maps();
    handles_ = v_.live_handles();
  }
  void TearDown() override {
    EXPECT_EQ(v_.live_maps(), maps_);
    EXPECT_EQ(v_.live_handles(), handles_);
  }
  static CUmemAllocationProp Prop(bool fd) {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    p.requestedHandleTypes =
        fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    return p;
  }
  // Reserves size bytes and maps handle there; access not yet given.
  CUdeviceptr MapAt(CUmemGenericAllocationHandle h, size_t size) {
    CUdeviceptr p = 0;
    EXPECT_EQ(v_.reserve(&p, size, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(v_.map(p, size, 0, h, 0), CUDA_SUCCESS);
    return p;
  }
  CUresult Access(CUdeviceptr p, size_t size) {
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = 0;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return v_.set_access(p, size, &a, 1);
  }
  void Unmap(CUdeviceptr p, size_t size) {
    EXPECT_EQ(v_.unmap(p, size), CUDA_SUCCESS);
    EXPECT_EQ(v_.address_free(p, size), CUDA_SUCCESS);
  }
  const Vmm& v_ = Load();
  int maps_ = 0, handles_ = 0;
};

TEST_F(FakeVmm, MappedMemoryIsDeviceMemoryOnlyOnceAccessible) {
  size_t g = 0;
  const CUmemAllocationProp prop = Prop(false);
  ASSERT_EQ(v_.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  ASSERT_EQ(g, size_t{2} << 20);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(v_.create(&h, g + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);  // not whole granules
  ASSERT_EQ(v_.create(&h, 2 * g, &prop, 0), CUDA_SUCCESS);
  const CUdeviceptr p = MapAt(h, 2 * g);
  std::vector<unsigned char> buf(4096, 0x5a), back(4096, 0);
  EXPECT_EQ(v_.copy(p, reinterpret_cast<CUdeviceptr>(buf.data()), buf.size()),
            CUDA_ERROR_ILLEGAL_ADDRESS);
  ASSERT_EQ(Access(p, 2 * g), CUDA_SUCCESS);
  ASSERT_EQ(v_.copy(p + g, reinterpret_cast<CUdeviceptr>(buf.data()), buf.size()), CUDA_SUCCESS);
  ASSERT_EQ(v_.copy(reinterpret_cast<CUdeviceptr>(back.data()), p + g, back.size()), CUDA_SUCCESS);
  EXPECT_EQ(back, buf);
  // The driver calls it device memory, one range; not for IPC or cuMemFree.
  unsigned int type = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* data[] = {&type, &start, &size};
  ASSERT_EQ(v_.attributes(3, attrs, data, p + 100), CUDA_SUCCESS);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(start, p);
  EXPECT_EQ(size, 2 * g);
  CUipcMemHandle ipc;
  EXPECT_EQ(v_.ipc_get(&ipc, p), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(v_.mem_free(p), CUDA_ERROR_INVALID_VALUE);
  // Mapped memory keeps its reservation; made without a descriptor type, it
  // cannot be exported.
  EXPECT_EQ(v_.address_free(p, 2 * g), CUDA_ERROR_INVALID_VALUE);
  CUmemGenericAllocationHandle again = 0;
  ASSERT_EQ(v_.retain_handle(&again, reinterpret_cast<void*>(p + 5)), CUDA_SUCCESS);
  EXPECT_EQ(again, h);
  int fd = -1;
  EXPECT_EQ(v_.export_handle(&fd, again, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_NOT_PERMITTED);
  CUmemAllocationProp got{};
  ASSERT_EQ(v_.properties(&got, again), CUDA_SUCCESS);
  EXPECT_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);
  EXPECT_EQ(v_.release(again), CUDA_SUCCESS);
  EXPECT_EQ(v_.release(h), CUDA_SUCCESS);  // the mapping keeps the memory
  ASSERT_EQ(v_.copy(reinterpret_cast<CUdeviceptr>(back.data()), p + g, back.size()), CUDA_SUCCESS);
  EXPECT_EQ(back, buf);
  Unmap(p, 2 * g);
  ASSERT_EQ(v_.attributes(3, attrs, data, p + 100), CUDA_SUCCESS);
  EXPECT_EQ(type, 0u);  // no longer device memory
}

TEST_F(FakeVmm, ExportedDescriptorImportsTheSameBytes) {
  const size_t g = size_t{2} << 20;
  const CUmemAllocationProp prop = Prop(true);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(v_.create(&h, g, &prop, 0), CUDA_SUCCESS);
  const CUdeviceptr p = MapAt(h, g);
  ASSERT_EQ(Access(p, g), CUDA_SUCCESS);
  int fd = -1;
  ASSERT_EQ(v_.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
  ASSERT_GE(fd, 0);
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_EQ(v_.import_handle(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_SUCCESS);
  close(fd);  // the driver keeps its own
  const CUdeviceptr q = MapAt(imported, g);
  ASSERT_EQ(Access(q, g), CUDA_SUCCESS);
  std::vector<unsigned char> buf(8192), back(8192, 0);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 7);
  ASSERT_EQ(v_.copy(p + 4096, reinterpret_cast<CUdeviceptr>(buf.data()), buf.size()), CUDA_SUCCESS);
  ASSERT_EQ(v_.copy(reinterpret_cast<CUdeviceptr>(back.data()), q + 4096, back.size()),
            CUDA_SUCCESS);
  EXPECT_EQ(back, buf);
  // A mapping larger than the memory, and a descriptor of another file.
  CUdeviceptr r = 0;
  ASSERT_EQ(v_.reserve(&r, 2 * g, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(v_.map(r, 2 * g, 0, imported, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(v_.address_free(r, 2 * g), CUDA_SUCCESS);
  CUmemGenericAllocationHandle bad = 0;
  EXPECT_EQ(v_.import_handle(&bad, reinterpret_cast<void*>(intptr_t{0}),
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(v_.release(imported), CUDA_SUCCESS);
  EXPECT_EQ(v_.release(h), CUDA_SUCCESS);
  Unmap(q, g);
  Unmap(p, g);
}

// The tests' and tools' own driver client makes the same kind of memory.
TEST_F(FakeVmm, DriverClientMakesSharableVmmMemory) {
  setenv("HIXL_CUDA_DRIVER", HIXL_FAKE_CUDA_PATH, 1);
  auto& c = hixl::device::DriverClient::Get();
  ASSERT_TRUE(c.ok()) << c.error();
  size_t size = 0;
  const uintptr_t p = c.AllocVmm(3u << 20, true, &size);
  ASSERT_NE(p, 0u);
  EXPECT_EQ(size, size_t{4} << 20);
  std::vector<unsigned char> buf(4096, 0x11), back(4096, 0);
  ASSERT_TRUE(c.Copy(reinterpret_cast<void*>(p + size - 4096), buf.data(), buf.size()));
  ASSERT_TRUE(c.Copy(back.data(), reinterpret_cast<void*>(p + size - 4096), back.size()));
  EXPECT_EQ(back, buf);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(v_.retain_handle(&h, reinterpret_cast<void*>(p)), CUDA_SUCCESS);
  int fd = -1;
  EXPECT_EQ(v_.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
  if (fd >= 0) close(fd);
  EXPECT_EQ(v_.release(h), CUDA_SUCCESS);
  EXPECT_TRUE(c.FreeVmm(p, size));
}

}  // namespace
