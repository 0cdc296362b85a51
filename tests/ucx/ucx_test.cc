// tests/ucx/ucx_test.cc — what is particular to the UCX transport (the shared
// conformance suites cover the rest, over UCX as well): selection under
// AUTO, and clear errors where UCX cannot carry a link — the peer has no UCX
// endpoint, this engine's UCX failed to start, or the two sides' UCX_TLS
// have no layer in common; and where AllocMem's memory comes from
// (UcxAllocMem). Real peer processes (hixl_test_peer), one host.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hixl/hixl.h"
#include "peer_process.h"

namespace {

using hixl::LinkType;
using hixl::StatusCode;
using hixl_test::PeerLaunch;
using hixl_test::PeerProcess;

// Sets an environment variable for the life of the object (before any engine
// of this process reads it: UCX reads its configuration in Initialize).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

PeerLaunch WithEnv(const std::string& assignment) {
  PeerLaunch l;
  l.exec_prefix = {"/usr/bin/env", assignment};
  return l;
}

hixl::Status Link(hixl::Hixl& e, const std::string& link, const PeerProcess& peer) {
  std::map<std::string, std::string> opts;
  if (!link.empty()) opts[hixl::options::kLinkType] = link;
  if (hixl::Status s = e.Initialize("127.0.0.1", opts); !s.ok()) return s;
  return e.Connect(peer.engine(), 5000);
}

TEST(UcxTransport, LinkTypeUcxAndRdmaPickUcx) {
  PeerProcess peer;
  ASSERT_TRUE(peer.Start());
  for (const char* link : {"UCX", "RDMA"}) {
    hixl::Hixl e;
    HIXL_ASSERT_OK(Link(e, link, peer));
    LinkType t = LinkType::AUTO;
    HIXL_ASSERT_OK(e.GetLinkType(peer.engine(), t));
    EXPECT_EQ(t, LinkType::UCX) << link;
  }
}

TEST(UcxTransport, AutoPicksUcxOnlyWithAnRdmaDevice) {
  std::error_code ec;
  if (std::filesystem::directory_iterator("/sys/class/infiniband", ec) !=
          std::filesystem::directory_iterator() && !ec) {
    GTEST_SKIP() << "this host has an RDMA device";
  }
  PeerProcess peer;
  ASSERT_TRUE(peer.Start());
  hixl::Hixl e;
  HIXL_ASSERT_OK(Link(e, "", peer));
  LinkType t = LinkType::AUTO;
  HIXL_ASSERT_OK(e.GetLinkType(peer.engine(), t));
  EXPECT_EQ(t, LinkType::SHM) << "one host, no RDMA device: AUTO keeps shm";
}

TEST(UcxTransport, PeerWithoutUcxIsAClearErrorAndAutoStillLinks) {
  PeerProcess peer(WithEnv("UCX_TLS=no_such_layer"));
  ASSERT_TRUE(peer.Start());
  {
    hixl::Hixl e;
    hixl::Status s = Link(e, "UCX", peer);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
    EXPECT_NE(s.message().find("offers no UCX endpoint"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(peer.engine()), std::string::npos) << s.ToString();
  }
  hixl::Hixl e;
  HIXL_ASSERT_OK(Link(e, "", peer));
  LinkType t = LinkType::AUTO;
  HIXL_ASSERT_OK(e.GetLinkType(peer.engine(), t));
  EXPECT_EQ(t, LinkType::SHM);
}

TEST(UcxTransport, LocalUcxThatFailedToStartSaysWhy) {
  PeerProcess peer;
  ASSERT_TRUE(peer.Start());
  ScopedEnv env("UCX_TLS", "no_such_layer");
  hixl::Hixl e;
  hixl::Status s = Link(e, "UCX", peer);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("transport ucx"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("failed to start"), std::string::npos) << s.ToString();
}

TEST(UcxTransport, NoCommonLayerIsUnreachableNamingTheLink) {
  // The peer reaches the world only by tcp; this engine only by shared memory.
  PeerProcess peer(WithEnv("UCX_TLS=tcp,self"));
  ASSERT_TRUE(peer.Start());
  ScopedEnv env("UCX_TLS", "posix,cma,self");
  hixl::Hixl e;
  hixl::Status s = Link(e, "UCX", peer);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(peer.engine()), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("UCX_TLS"), std::string::npos) << s.ToString();
}

TEST(UcxTransport, ErrorHandlingModesBothCarryALink) {
  PeerProcess peer;
  ASSERT_TRUE(peer.Start());
  const uintptr_t remote = peer.Reg("m", 1 << 20);
  ASSERT_NE(remote, 0u);
  for (const char* mode : {"AUTO", "PEER", "NONE"}) {
    SCOPED_TRACE(mode);
    hixl::Hixl e;
    HIXL_ASSERT_OK(e.Initialize("127.0.0.1", {{hixl::options::kLinkType, "UCX"},
                                              {hixl::options::kUcxErrorHandling, mode}}));
    HIXL_ASSERT_OK(e.Connect(peer.engine(), 5000));
    hixl_test::Buffer src(1 << 20);
    hixl_test::FillPattern(src.data(), src.size(), 7);
    HIXL_ASSERT_OK(e.TransferSync(peer.engine(), hixl::TransferOp::WRITE,
                                  {{src.addr(), remote, src.size()}}, 5000));
    EXPECT_EQ(peer.Hash("m", 0, src.size()), src.HashHex());
  }
  hixl::Hixl e;
  EXPECT_EQ(e.Initialize("127.0.0.1", {{hixl::options::kUcxErrorHandling, "SOMETIMES"}}).code(),
            StatusCode::kParamInvalid);
}

// The line of /proc/PID/maps (pid 0: this process) holding addr, or "".
std::string MappingOf(pid_t pid, uintptr_t addr) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/maps")
                            : "/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && addr >= lo && addr < hi) return line;
  }
  return "";
}

size_t MappingCount() {
  std::ifstream in("/proc/self/maps");
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

// The engine's own AllocMem memory is its memfd "hixl-mem"; UCX's is not.
bool IsEngineMemory(const std::string& mapping) {
  return mapping.find("hixl-mem") != std::string::npos;
}

TEST(UcxAllocMem, TakesUcxMemoryUnderLinkTypeUcxAndMovesBytesBothWays) {
  struct Case {
    const char* link;   // both engines' LinkType ("" = AUTO)
    const char* alloc;  // UcxAllocMem ("" = default AUTO)
    bool ucx_memory;
  };
  const Case cases[] = {{"UCX", "", true},
                        {"UCX", "UCX", true},
                        {"UCX", "ENGINE", false},
                        {"", "", false},
                        {"TCP", "UCX", true}};
  constexpr size_t kLen = (1 << 20) + 4096 + 17;  // not a whole number of pages
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string("LinkType=") + c.link + " UcxAllocMem=" + c.alloc);
    std::vector<std::string> opts;
    std::map<std::string, std::string> mine;
    if (*c.link != '\0') {
      opts.push_back(std::string("LinkType=") + c.link);
      mine[hixl::options::kLinkType] = c.link;
    }
    if (*c.alloc != '\0') {
      opts.push_back(std::string("UcxAllocMem=") + c.alloc);
      mine[hixl::options::kUcxAllocMem] = c.alloc;
    }
    PeerProcess peer(opts);
    ASSERT_TRUE(peer.Start());
    const uintptr_t remote = peer.Alloc("m", kLen);
    ASSERT_NE(remote, 0u);
    const std::string theirs = MappingOf(peer.pid(), remote);
    ASSERT_FALSE(theirs.empty());
    EXPECT_EQ(!IsEngineMemory(theirs), c.ucx_memory) << theirs;

    hixl::Hixl e;
    HIXL_ASSERT_OK(e.Initialize("127.0.0.1", mine));
    HIXL_ASSERT_OK(e.Connect(peer.engine(), 5000));
    void* src = nullptr;
    void* dst = nullptr;
    HIXL_ASSERT_OK(e.AllocMem(kLen, hixl::MemType::MEM_HOST, &src));
    HIXL_ASSERT_OK(e.AllocMem(kLen, hixl::MemType::MEM_HOST, &dst));
    const std::string ours = MappingOf(0, reinterpret_cast<uintptr_t>(src));
    EXPECT_EQ(!IsEngineMemory(ours), c.ucx_memory) << ours;
    // AllocMem's memory is registered: the handle is there, and it cannot be
    // deregistered apart from FreeMem.
    hixl::MemHandle h = 0;
    HIXL_ASSERT_OK(e.GetMemHandle(src, h));
    EXPECT_EQ(e.DeregisterMem(h).code(), StatusCode::kParamInvalid);

    hixl_test::FillPattern(src, kLen, 11);
    const auto s = reinterpret_cast<uintptr_t>(src);
    const auto d = reinterpret_cast<uintptr_t>(dst);
    // One whole-region write, then pieces at odd offsets read back.
    HIXL_ASSERT_OK(
        e.TransferSync(peer.engine(), hixl::TransferOp::WRITE, {{s, remote, kLen}}, 5000));
    std::vector<uint8_t> expect(static_cast<uint8_t*>(src), static_cast<uint8_t*>(src) + kLen);
    EXPECT_EQ(peer.Hash("m", 0, kLen), hixl_test::HashHex(hixl_test::Fnv1a64(expect.data(), kLen)));
    std::memset(dst, 0, kLen);
    HIXL_ASSERT_OK(e.TransferSync(
        peer.engine(), hixl::TransferOp::READ,
        {{d, remote, 4096}, {d + 4096, remote + 4096, 1}, {d + 4097, remote + 4097, kLen - 4097}},
        5000));
    EXPECT_EQ(std::memcmp(dst, src, kLen), 0);
    // Past the end of the peer's region: refused, nothing touched.
    EXPECT_FALSE(
        e.TransferSync(peer.engine(), hixl::TransferOp::WRITE, {{s, remote + kLen - 8, 16}}, 5000)
            .ok());
    EXPECT_EQ(peer.Hash("m", 0, kLen), hixl_test::HashHex(hixl_test::Fnv1a64(expect.data(), kLen)));

    // The peer frees its memory: a later transfer to it is refused, and the
    // peer is still well.
    ASSERT_TRUE(peer.Ok("free m"));
    EXPECT_FALSE(
        e.TransferSync(peer.engine(), hixl::TransferOp::WRITE, {{s, remote, 64}}, 5000).ok());
    EXPECT_EQ(MappingOf(peer.pid(), remote).find("hixl-mem"), std::string::npos);
    ASSERT_TRUE(peer.Ok("ping"));
    HIXL_ASSERT_OK(e.FreeMem(src));
    EXPECT_EQ(e.FreeMem(src).code(), StatusCode::kParamInvalid);
    // dst is left to Finalize.
  }
}

TEST(UcxAllocMem, AllocAndFreeCyclesLeaveNoMappingsBehind) {
  PeerProcess peer({"LinkType=UCX"});
  ASSERT_TRUE(peer.Start());
  hixl::Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1", {{hixl::options::kLinkType, "UCX"}}));
  HIXL_ASSERT_OK(e.Connect(peer.engine(), 5000));
  auto cycle = [&](int n) {
    for (int i = 0; i < n; ++i) {
      void* p = nullptr;
      HIXL_ASSERT_OK(e.AllocMem(size_t{256} << 10, hixl::MemType::MEM_HOST, &p));
      ASSERT_FALSE(IsEngineMemory(MappingOf(0, reinterpret_cast<uintptr_t>(p))));
      static_cast<char*>(p)[0] = 1;
      HIXL_ASSERT_OK(e.FreeMem(p));
    }
  };
  cycle(20);  // UCX's own caches warm up
  const size_t before = MappingCount();
  cycle(200);
  EXPECT_LE(MappingCount(), before + 8) << "FreeMem must give UCX's memory back";
}

TEST(UcxAllocMem, BadValueIsRefused) {
  hixl::Hixl bad;
  EXPECT_EQ(bad.Initialize("127.0.0.1", {{hixl::options::kUcxAllocMem, "SOMETIMES"}}).code(),
            StatusCode::kParamInvalid);
  hixl::Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1", {{hixl::options::kUcxAllocMem, "UCX"}}));
  void* q = nullptr;
  HIXL_ASSERT_OK(e.AllocMem(4096, hixl::MemType::MEM_HOST, &q));
  EXPECT_FALSE(IsEngineMemory(MappingOf(0, reinterpret_cast<uintptr_t>(q))));
  HIXL_EXPECT_OK(e.FreeMem(q));
}

// Over shared memory without cma, UCX emulates puts and gets into memory it
// did not allocate with messages the target serves: small transfers, which
// run inline on a shared-memory link, then still have bytes on their way
// after posting and finish as tracked transfers. Data lands whole, both ways,
// sync and async.
TEST(UcxInline, EmulatedSmallTransfersOverSharedMemoryLandWhole) {
  ScopedEnv env("UCX_TLS", "posix,self");
  PeerProcess peer(WithEnv("UCX_TLS=posix,self"));
  ASSERT_TRUE(peer.Start());
  const uintptr_t remote = peer.Reg("m", 256 << 10);  // the peer's own memory, not UCX's
  ASSERT_NE(remote, 0u);
  hixl::Hixl e;
  HIXL_ASSERT_OK(e.Initialize("127.0.0.1", {{hixl::options::kLinkType, "UCX"}}));
  HIXL_ASSERT_OK(e.Connect(peer.engine(), 5000));
  hixl_test::Buffer src(256 << 10), dst(256 << 10);
  hixl_test::FillPattern(src.data(), src.size(), 3);
  // 4 KiB, then 64 one-KiB pieces in one transfer (64 KiB: still inline).
  HIXL_ASSERT_OK(
      e.TransferSync(peer.engine(), hixl::TransferOp::WRITE, {{src.addr(), remote, 4096}}, 5000));
  std::vector<hixl::TransferOpDesc> pieces;
  for (size_t k = 0; k < 64; ++k)
    pieces.push_back({src.addr() + 4096 + k * 1024, remote + 4096 + k * 1024, 1024});
  HIXL_ASSERT_OK(e.TransferSync(peer.engine(), hixl::TransferOp::WRITE, pieces, 5000));
  EXPECT_EQ(peer.Hash("m", 0, 4096 + 65536), src.HashHex(0, 4096 + 65536));
  // Async, then read everything back.
  hixl::TransferReq req = 0;
  HIXL_ASSERT_OK(e.TransferAsync(peer.engine(), hixl::TransferOp::WRITE,
                                 {{src.addr() + 69632, remote + 69632, 8192}}, {}, req));
  hixl::TransferStatus st = hixl::TransferStatus::WAITING;
  for (int i = 0; i < 5000 && st == hixl::TransferStatus::WAITING; ++i) {
    HIXL_ASSERT_OK(e.GetTransferStatus(req, st));
    if (st == hixl::TransferStatus::WAITING) usleep(1000);
  }
  EXPECT_EQ(st, hixl::TransferStatus::COMPLETED);
  for (size_t off = 0; off < 77824; off += 16384) {
    const size_t len = std::min<size_t>(16384, 77824 - off);
    HIXL_ASSERT_OK(e.TransferSync(peer.engine(), hixl::TransferOp::READ,
                                  {{dst.addr() + off, remote + off, len}}, 5000));
  }
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 77824), 0);
  ASSERT_TRUE(peer.Ok("ping"));
}

}  // namespace
