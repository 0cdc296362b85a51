// tests/ucx/ucx_test.cc — what is particular to the UCX transport (the shared
// conformance suites cover the rest, over UCX as well): selection under
// AUTO, and clear errors where UCX cannot carry a link — the peer has no UCX
// endpoint, this engine's UCX failed to start, or the two sides' UCX_TLS
// have no layer in common. Real peer processes (hixl_test_peer), one host.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

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

}  // namespace
