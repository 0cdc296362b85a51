// Device memory made with cuMemCreate and mapped (VMM, as PyTorch's
// expandable segments and the memory savers of vLLM and SGLang make it), on
// either side of a link: over shm the initiator maps the peer's physical
// memory from a file descriptor the peer passes over the link's Unix socket
// (once per allocation, unmapped when the peer lets go); memory created
// without a descriptor handle type is refused over shm with the reason and
// moves over tcp (the target copies it itself); two engines of one process
// use it in place.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device/device_common.h"

namespace {

using namespace hixl_device_test;  // NOLINT: the shared helpers

int LiveVmmMappings() { return Control<int (*)()>("hixl_fake_cuda_live_vmm_mappings")(); }

class DeviceVmm : public DeviceShm, public ::testing::WithParamInterface<const char*> {};

TEST_P(DeviceVmm, PeerVmmMemoryBothWaysAndFromLocalVmmMemory) {
  const bool shm = std::string(GetParam()) == "SHM";
  const int before = RealDriver() ? 0 : LiveVmmMappings();
  // The peer's region: 1 MiB + 3 at 4 KiB into 3 MiB of VMM memory.
  const size_t n = (1u << 20) + 3;
  const uintptr_t d =
      Num(peer_.Send("devvmm d " + std::to_string(3u << 20) + " 4096 " + std::to_string(n)));
  ASSERT_NE(d, 0u);
  Link(GetParam());
  // This side: VMM memory of its own, registered as device memory.
  auto& cuda = TestCuda::Get();
  size_t mine_size = 0;
  const uintptr_t mine = cuda.AllocVmm(n, true, &mine_size);
  ASSERT_NE(mine, 0u);
  hixl::MemHandle mh = 0;
  HIXL_ASSERT_OK(e_.RegisterMem({mine, n}, MemType::MEM_DEVICE, mh));
  ASSERT_TRUE(DevFillPattern(mine, n, 81));

  HIXL_ASSERT_OK(Move(TransferOp::WRITE, {{mine, d, n}}));
  EXPECT_EQ(peer_.Hash("d", 0, n), PatternHash(n, 81));
  ASSERT_TRUE(peer_.Ok("fillpat d 82"));
  std::vector<unsigned char> host(n, 0);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{h, d, n}}));
  EXPECT_EQ(Hash(host.data(), n), PatternHash(n, 82));
  HIXL_ASSERT_OK(Move(TransferOp::READ, {{mine + 1, d + 7, n - 7}}));
  EXPECT_EQ(DevHash(mine + 1, n - 7), Hash(host.data() + 7, n - 7));
  // Bounds hold as for any region.
  hixl::Status s = Move(TransferOp::WRITE, {{h, d + 8, n}});
  EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
  EXPECT_EQ(peer_.Hash("d", 0, n), PatternHash(n, 82));

  if (!RealDriver()) {
    // shm mapped the peer's memory here once (its own stays one mapping);
    // when the peer lets go, the mapping goes.
    EXPECT_EQ(LiveVmmMappings(), before + 1 + (shm ? 1 : 0));
    ASSERT_TRUE(peer_.Ok("free d"));
    EXPECT_TRUE(Eventually([&] { return LiveVmmMappings() == before + 1; })) << LiveVmmMappings();
  }
  HIXL_ASSERT_OK(e_.DeregisterMem(mh));
  EXPECT_TRUE(cuda.FreeVmm(mine, mine_size));
}

TEST_P(DeviceVmm, MemoryWithoutADescriptorTypeMovesOnlyOverTcp) {
  const size_t n = 1u << 16;
  const uintptr_t d = Num(
      peer_.Send("devvmm d " + std::to_string(2u << 20) + " 0 " + std::to_string(n) + " rw nofd"));
  ASSERT_NE(d, 0u);
  Link(GetParam());
  std::vector<unsigned char> host(n);
  hixl_test::FillPattern(host.data(), n, 83);
  const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
  hixl::Status s = Move(TransferOp::WRITE, {{h, d, n}});
  if (std::string(GetParam()) == "SHM") {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"), std::string::npos)
        << s.ToString();
    EXPECT_NE(peer_.Hash("d", 0, n), PatternHash(n, 83));
  } else {
    HIXL_ASSERT_OK(s);
    EXPECT_EQ(peer_.Hash("d", 0, n), PatternHash(n, 83));
  }
}

INSTANTIATE_TEST_SUITE_P(Links, DeviceVmm, ::testing::Values("SHM", "TCP"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

// Two engines of this process: the target's VMM memory is used in place.
TEST(DeviceVmmOneProcess, EnginesOfOneProcessUseItInPlace) {
  ASSERT_TRUE(TestCuda::Get().ok()) << TestCuda::Get().error();
  const int before = RealDriver() ? 0 : LiveVmmMappings();
  auto& cuda = TestCuda::Get();
  const size_t n = 1u << 20;
  size_t size = 0;
  const uintptr_t theirs = cuda.AllocVmm(n, true, &size);
  ASSERT_NE(theirs, 0u);
  hixl::Hixl target, init;
  const std::map<std::string, std::string> opts{{hixl::options::kLinkType, "SHM"}};
  HIXL_ASSERT_OK(target.Initialize("127.0.0.1:0", opts));
  HIXL_ASSERT_OK(init.Initialize("127.0.0.1:0", opts));
  hixl::MemHandle th = 0;
  HIXL_ASSERT_OK(target.RegisterMem({theirs, n}, MemType::MEM_DEVICE, th));
  HIXL_ASSERT_OK(init.Connect(target.LocalEngine(), 5000));
  std::vector<unsigned char> host(n);
  hixl_test::FillPattern(host.data(), n, 84);
  HIXL_ASSERT_OK(init.TransferSync(target.LocalEngine(), TransferOp::WRITE,
                                   {{reinterpret_cast<uintptr_t>(host.data()), theirs, n}}, 10000));
  EXPECT_EQ(DevHash(theirs, n), PatternHash(n, 84));
  if (!RealDriver()) {
    EXPECT_EQ(LiveVmmMappings(), before + 1);  // nothing imported
  }
  init.Finalize();
  target.Finalize();
  EXPECT_TRUE(cuda.FreeVmm(theirs, size));
}

}  // namespace
