// LLM-DataDist caches in CUDA device memory (CachePlacement::kDevice) against
// the fake driver: two instances in this process, linked over shm or tcp,
// pull and push blocks and whole entries between device caches and between a
// device cache and a host cache. The fake driver's memory faults on any CPU
// access, so every byte of a device cache is proven to move through the
// driver; the tests read it back through their own driver client.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "datadist/dd_harness.h"  // LLM_ASSERT_OK, LLM_EXPECT_CODE
#include "device/device_common.h"
#include "llm_datadist/llm_datadist.h"

namespace hixl_device_test {
namespace {

namespace ld = llm_datadist;

constexpr uint32_t kTensors = 4;  // two layers of K and V
constexpr size_t kBlocks = 32;
constexpr size_t kBlockBytes = 4096 + 64;  // not a power of two
constexpr size_t kTensorBytes = kBlocks * kBlockBytes;

ld::CacheDesc Desc(ld::CachePlacement placement) {
  ld::CacheDesc d;
  d.placement = placement;
  d.num_tensors = kTensors;
  d.data_type = ld::DT_UINT8;
  d.shape = {static_cast<int64_t>(kBlocks), static_cast<int64_t>(kBlockBytes)};
  return d;
}

// kTensors tensors of kTensorBytes, on the device or on the host, each filled
// with its own pattern.
class Tensors {
 public:
  Tensors(bool device, uint64_t seed) : device_(device) {
    for (uint32_t t = 0; t < kTensors; ++t) {
      if (device_) {
        uintptr_t p = TestCuda::Get().Alloc(kTensorBytes);
        addrs_.push_back(p);
        ok_ = ok_ && p != 0 && DevFillPattern(p, kTensorBytes, seed * 100 + t);
      } else {
        host_.emplace_back(kTensorBytes);
        hixl_test::FillPattern(host_.back().data(), kTensorBytes, seed * 100 + t);
        addrs_.push_back(reinterpret_cast<uintptr_t>(host_.back().data()));
      }
    }
  }
  ~Tensors() {
    if (device_) {
      for (uintptr_t p : addrs_) {
        if (p != 0) TestCuda::Get().Free(p);
      }
    }
  }
  bool ok() const { return ok_; }
  std::vector<uint64_t> addrs() const { return {addrs_.begin(), addrs_.end()}; }
  // The bytes of one tensor, read through the driver for device memory.
  std::vector<unsigned char> Bytes(uint32_t t) const {
    std::vector<unsigned char> v(kTensorBytes);
    if (device_) {
      EXPECT_TRUE(TestCuda::Get().Copy(v.data(), reinterpret_cast<void*>(addrs_[t]), kTensorBytes));
    } else {
      std::memcpy(v.data(), host_[t].data(), kTensorBytes);
    }
    return v;
  }
  // Hash of the given blocks of the given tensors, in order.
  std::string HashBlocks(const std::vector<uint64_t>& blocks, uint32_t first_tensor = 0,
                         uint32_t end_tensor = kTensors) const {
    std::vector<unsigned char> all;
    for (uint32_t t = first_tensor; t < end_tensor; ++t) {
      const auto v = Bytes(t);
      for (uint64_t b : blocks) {
        all.insert(all.end(), v.begin() + b * kBlockBytes, v.begin() + (b + 1) * kBlockBytes);
      }
    }
    return Hash(all.data(), all.size());
  }

 private:
  bool device_;
  bool ok_ = true;
  std::vector<uintptr_t> addrs_;
  std::vector<std::vector<unsigned char>> host_;
};

std::map<std::string, std::string> Options(const std::string& link, const std::string& listen) {
  std::map<std::string, std::string> o;
  o[ld::options::kGlobalResourceConfig] = "{\"LinkType\":\"" + link + "\"}";
  if (!listen.empty()) o[ld::options::kListenIpInfo] = listen;
  o[ld::options::kSyncKvCacheWaitTime] = "10000";
  return o;
}

ld::ClusterInfo Info(const ld::LlmDataDist& to) {
  ld::ClusterInfo ci;
  ci.remote_cluster_id = to.ClusterId();
  const std::string a = to.LocalAddress();
  ci.remote_ip_infos.push_back(
      {a.substr(0, a.rfind(':')), static_cast<uint16_t>(hixl_test::PortOf(a))});
  return ci;
}

// Param: the engines' LinkType (SHM, TCP). Not UCX: both engines live in
// this process, and over UCX without RDMA hardware the owner's progress
// thread serves the other's reads of LLM-DataDist's metadata page by
// emulation, ordered by UCX messages ThreadSanitizer cannot see; UCX's
// device path is the engine's, tested across processes in DeviceStaged.
class DeviceDataDist : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(TestCuda::Get().ok()) << TestCuda::Get().error();
    prompt_ = std::make_unique<ld::LlmDataDist>(1, ld::LlmRole::kPrompt);
    decoder_ = std::make_unique<ld::LlmDataDist>(2, ld::LlmRole::kDecoder);
    LLM_ASSERT_OK(prompt_->Initialize(Options(GetParam(), "127.0.0.1:0")));
    LLM_ASSERT_OK(decoder_->Initialize(Options(GetParam(), "")));
  }
  void TearDown() override {
    // The instances go before the memory their caches name.
    decoder_.reset();
    prompt_.reset();
  }
  void Link() {
    std::vector<ld::Status> rets;
    LLM_ASSERT_OK(decoder_->LinkLlmClusters({Info(*prompt_)}, rets, 5000));
  }

  std::unique_ptr<ld::LlmDataDist> prompt_, decoder_;
};

// Blocks move device -> device, device -> host and host -> device, pulled and
// pushed, with every tensor or a layer range.
TEST_P(DeviceDataDist, BlocksMoveBetweenDeviceAndHostCachesEveryWay) {
  struct Mix {
    bool src_device, dst_device;
  };
  for (Mix m : {Mix{true, true}, Mix{true, false}, Mix{false, true}}) {
    SCOPED_TRACE(std::string(m.src_device ? "device" : "host") + " -> " +
                 (m.dst_device ? "device" : "host"));
    Tensors src(m.src_device, 7), dst(m.dst_device, 9);
    ASSERT_TRUE(src.ok() && dst.ok());
    auto place = [](bool d) { return d ? ld::CachePlacement::kDevice : ld::CachePlacement::kHost; };
    int64_t src_id = 0, dst_id = 0;
    LLM_ASSERT_OK(prompt_->RegisterKvCache(Desc(place(m.src_device)), src.addrs(), {}, src_id));
    LLM_ASSERT_OK(decoder_->RegisterKvCache(Desc(place(m.dst_device)), dst.addrs(), {}, dst_id));
    ASSERT_NO_FATAL_FAILURE(Link());

    // Pull: scattered blocks, every tensor.
    const std::vector<uint64_t> from = {3, 4, 5, 17, 0, 31}, to = {10, 11, 12, 2, 30, 1};
    ld::Cache local;
    local.cache_id = dst_id;
    LLM_ASSERT_OK(decoder_->PullKvBlocks(ld::CacheIndex{1, src_id, 0}, local, from, to));
    EXPECT_EQ(dst.HashBlocks(to), src.HashBlocks(from));

    // Push into the prompt's cache: the second layer only (tensors 2 and 3).
    const std::vector<uint64_t> back = {20, 21};
    ld::KvCacheExtParam layer1;
    layer1.src_layer_range = {1, 1};
    layer1.dst_layer_range = {1, 1};
    const std::string before_layer0 = src.HashBlocks(back, 0, 2);
    LLM_ASSERT_OK(
        decoder_->PushKvBlocks(local, ld::CacheIndex{1, src_id, 0}, {10, 11}, back, layer1));
    EXPECT_EQ(src.HashBlocks(back, 2, 4), dst.HashBlocks({10, 11}, 2, 4));
    EXPECT_EQ(src.HashBlocks(back, 0, 2), before_layer0) << "layer 0 was not to move";

    std::vector<ld::Status> rets;
    LLM_ASSERT_OK(decoder_->UnlinkLlmClusters({Info(*prompt_)}, rets, 5000));
    LLM_ASSERT_OK(decoder_->UnregisterKvCache(dst_id));
    LLM_ASSERT_OK(prompt_->UnregisterKvCache(src_id));
  }
}

// Whole batch entries (shape[0] is the batch) between device caches.
TEST_P(DeviceDataDist, WholeEntriesMoveBetweenDeviceCaches) {
  Tensors src(true, 3), dst(true, 4);
  ASSERT_TRUE(src.ok() && dst.ok());
  int64_t src_id = 0, dst_id = 0;
  LLM_ASSERT_OK(
      prompt_->RegisterKvCache(Desc(ld::CachePlacement::kDevice), src.addrs(), {}, src_id));
  LLM_ASSERT_OK(
      decoder_->RegisterKvCache(Desc(ld::CachePlacement::kDevice), dst.addrs(), {}, dst_id));
  ASSERT_NO_FATAL_FAILURE(Link());
  ld::Cache local;
  local.cache_id = dst_id;
  LLM_ASSERT_OK(decoder_->PullKvCache(ld::CacheIndex{1, src_id, 5}, local, 9));
  EXPECT_EQ(dst.HashBlocks({9}), src.HashBlocks({5}));
  LLM_ASSERT_OK(decoder_->PushKvCache(local, ld::CacheIndex{1, src_id, 30}, 9));
  EXPECT_EQ(src.HashBlocks({30}), src.HashBlocks({5}));
}

// The placement is checked against the memory: host memory is not a kDevice
// cache, device memory not a kHost one, and nothing stays registered.
TEST_P(DeviceDataDist, PlacementThatDoesNotMatchTheMemoryIsRefused) {
  Tensors host(false, 1), dev(true, 2);
  ASSERT_TRUE(host.ok() && dev.ok());
  int64_t id = 0;
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID, prompt_->RegisterKvCache(Desc(ld::CachePlacement::kDevice),
                                                                  host.addrs(), {}, id));
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID,
                  prompt_->RegisterKvCache(Desc(ld::CachePlacement::kHost), dev.addrs(), {}, id));
  // A mix: tensors 0-2 on the device, tensor 3 on the host. Tensors 0-2 were
  // registered before tensor 3 failed; the failure undoes them.
  std::vector<uint64_t> mixed = dev.addrs();
  mixed[3] = host.addrs()[3];
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID,
                  prompt_->RegisterKvCache(Desc(ld::CachePlacement::kDevice), mixed, {}, id));
  // AllocHostMemory memory is host memory.
  void* p = nullptr;
  LLM_ASSERT_OK(prompt_->AllocHostMemory(kTensorBytes * kTensors, &p));
  std::vector<uint64_t> alloc;
  for (uint32_t t = 0; t < kTensors; ++t)
    alloc.push_back(reinterpret_cast<uint64_t>(p) + t * kTensorBytes);
  LLM_EXPECT_CODE(ld::LLM_PARAM_INVALID,
                  prompt_->RegisterKvCache(Desc(ld::CachePlacement::kDevice), alloc, {}, id));
  // After all that, the same device memory registers as a kDevice cache, and
  // a second cache over the same tensors shares the registration.
  int64_t a = 0, b = 0;
  LLM_ASSERT_OK(prompt_->RegisterKvCache(Desc(ld::CachePlacement::kDevice), dev.addrs(), {}, a));
  LLM_ASSERT_OK(prompt_->RegisterKvCache(Desc(ld::CachePlacement::kDevice), dev.addrs(), {}, b));
  LLM_ASSERT_OK(prompt_->UnregisterKvCache(a));
  LLM_ASSERT_OK(prompt_->UnregisterKvCache(b));
  LLM_ASSERT_OK(prompt_->FreeHostMemory(p));
}

INSTANTIATE_TEST_SUITE_P(Links, DeviceDataDist, ::testing::Values("SHM", "TCP"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace hixl_device_test
