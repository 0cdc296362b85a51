// The engine's diagnostics: the probe (who listens at an address) against a
// live engine, a closed port, something that is not hixl and a listener that
// never answers; GetTransports; GetPeerStats with and without an
// authenticated link; Version and BuildInfo.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "engine/probe.h"
#include "hixl/hixl.h"

namespace hixl {
namespace {

using engine::ProbeEngine;
using Kind = engine::ProbeResult::Kind;

// A loopback listener; its port.
int Listener(int& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(fd, 4) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    return -1;
  }
  port = ntohs(sa.sin_port);
  return fd;
}

TEST(Probe, NamesTheEngineThatListens) {
  Hixl e;
  ASSERT_TRUE(e.Initialize("127.0.0.1:0").ok());
  const auto r = ProbeEngine(e.LocalEngine(), 2000);
  ASSERT_EQ(r.kind, Kind::kIdent) << r.detail;
  EXPECT_EQ(r.ident.generation, e.Generation());
  EXPECT_EQ(r.ident.engine, e.LocalEngine());
  EXPECT_GT(r.rtt_us, 0);
  // A probe links nothing: the engine still accepts real links afterwards.
  Hixl client;
  ASSERT_TRUE(client.Initialize("127.0.0.1").ok());
  EXPECT_TRUE(client.Connect(e.LocalEngine(), 2000).ok());
  EXPECT_EQ(ProbeEngine(e.LocalEngine(), 2000).kind, Kind::kIdent);
}

TEST(Probe, ClosedPortForeignServerAndSilence) {
  int port = 0;
  int fd = Listener(port);
  ASSERT_GE(fd, 0);
  ::close(fd);  // nothing listens there now
  auto r = ProbeEngine("127.0.0.1:" + std::to_string(port), 2000);
  EXPECT_EQ(r.kind, Kind::kRefused) << r.detail;

  // Something that is not a hixl engine.
  fd = Listener(port);
  ASSERT_GE(fd, 0);
  std::thread srv([fd] {
    int c = ::accept(fd, nullptr, nullptr);
    if (c < 0) return;
    char got[64];
    (void)!::read(c, got, sizeof(got));
    const char reply[] = "SSH-2.0-OpenSSH_9.2\r\n";
    (void)!::write(c, reply, sizeof(reply) - 1);
    ::close(c);
  });
  r = ProbeEngine("127.0.0.1:" + std::to_string(port), 2000);
  srv.join();
  ::close(fd);
  EXPECT_EQ(r.kind, Kind::kNotHixl) << r.detail;

  // A listener that never answers: no answer, within the timeout.
  fd = Listener(port);
  ASSERT_GE(fd, 0);
  const auto t0 = std::chrono::steady_clock::now();
  r = ProbeEngine("127.0.0.1:" + std::to_string(port), 300);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  ::close(fd);
  EXPECT_EQ(r.kind, Kind::kNoAnswer) << r.detail;
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 5000);

  EXPECT_EQ(ProbeEngine("not an address", 100).kind, Kind::kNoAnswer);
  EXPECT_EQ(ProbeEngine("127.0.0.1:1", 0).kind, Kind::kNoAnswer);
}

TEST(Diagnostics, TransportsVersionAndBuild) {
  Hixl e;
  std::vector<TransportInfo> ts;
  EXPECT_FALSE(e.GetTransports(ts).ok());  // not initialized
  ASSERT_TRUE(e.Initialize("127.0.0.1:0").ok());
  ASSERT_TRUE(e.GetTransports(ts).ok());
  bool shm = false, tcp = false;
  for (const auto& t : ts) {
    if (t.name == "shm") shm = t.usable && t.type == LinkType::SHM && !t.detail.empty();
    if (t.name == "tcp") tcp = t.usable && t.type == LinkType::TCP;
    EXPECT_TRUE(t.usable || !t.detail.empty()) << t.name << " is not usable and says not why";
  }
  EXPECT_TRUE(shm);
  EXPECT_TRUE(tcp);
  EXPECT_NE(std::string(Version()), "");
  EXPECT_NE(std::string(BuildInfo()).find("ucx="), std::string::npos) << BuildInfo();
}

TEST(Diagnostics, PeerStatsShowRegionsAndTheLink) {
  for (bool auth : {false, true}) {
    std::map<std::string, std::string> o;
    if (auth) o[options::kAuthSecret] = "0123456789abcdef0123456789abcdef";
    Hixl target, initiator;
    ASSERT_TRUE(target.Initialize("127.0.0.1:0", o).ok());
    ASSERT_TRUE(initiator.Initialize("127.0.0.1", o).ok());
    std::vector<char> a(8192), b(4096);
    MemHandle ha = 0, hb = 0;
    ASSERT_TRUE(
        target.RegisterMem({reinterpret_cast<uintptr_t>(a.data()), a.size()}, MemType::MEM_HOST, ha)
            .ok());
    ASSERT_TRUE(target
                    .RegisterMem({reinterpret_cast<uintptr_t>(b.data()), b.size()},
                                 MemType::MEM_HOST, hb, MEM_PERM_READ)
                    .ok());
    PeerStats st;
    EXPECT_EQ(initiator.GetPeerStats(target.LocalEngine(), st).code(), StatusCode::kNotConnected);
    ASSERT_TRUE(initiator.Connect(target.LocalEngine(), 2000).ok());
    ASSERT_TRUE(initiator.GetPeerStats(target.LocalEngine(), st).ok());
    EXPECT_EQ(st.generation, target.Generation());
    EXPECT_EQ(st.pid, getpid());
    EXPECT_EQ(st.link, LinkType::SHM);
    EXPECT_EQ(st.authenticated, auth);
    EXPECT_EQ(st.region_count, 2u);
    EXPECT_EQ(st.region_bytes, 8192u + 4096u);
    EXPECT_GT(st.heartbeat_ms, 0);
    EXPECT_GE(st.last_heard_ms, 0);
    EXPECT_EQ(st.in_flight, 0);
    if (auth) {
      ASSERT_EQ(st.regions.size(), 2u);
      for (const auto& r : st.regions) {
        if (r.addr == reinterpret_cast<uintptr_t>(b.data())) {
          EXPECT_EQ(r.len, 4096u);
          EXPECT_EQ(r.perms, static_cast<uint32_t>(MEM_PERM_READ));
        } else {
          EXPECT_EQ(r.addr, reinterpret_cast<uintptr_t>(a.data()));
          EXPECT_EQ(r.perms, static_cast<uint32_t>(MEM_PERM_READ_WRITE));
        }
      }
    } else {
      EXPECT_TRUE(st.regions.empty()) << "addresses shown on an unauthenticated link";
    }
    initiator.Finalize();
    target.Finalize();
  }
}

}  // namespace
}  // namespace hixl
