// The application string an engine hands its peers in the handshake
// (Hixl::SetLocalInfo / GetPeerInfo), and the welcome decoder's checks of it.
#include <gtest/gtest.h>

#include "control/protocol.h"
#include "hixl/hixl.h"

namespace {

TEST(PeerInfo, HandedToPeersThatConnectAfterItIsSet) {
  hixl::Hixl target, initiator;
  ASSERT_TRUE(target.SetLocalInfo("{\"layer\":\"above\"}").ok());
  ASSERT_TRUE(target.Initialize("127.0.0.1:0").ok());
  ASSERT_TRUE(initiator.Initialize("127.0.0.1").ok());
  std::string info;
  EXPECT_EQ(initiator.GetPeerInfo(target.LocalEngine(), info).code(),
            hixl::StatusCode::kNotConnected);
  ASSERT_TRUE(initiator.Connect(target.LocalEngine(), 2000).ok());
  ASSERT_TRUE(initiator.GetPeerInfo(target.LocalEngine(), info).ok());
  EXPECT_EQ(info, "{\"layer\":\"above\"}");
  // An engine that set nothing hands an empty string.
  hixl::Hixl plain;
  ASSERT_TRUE(plain.Initialize("127.0.0.1:0").ok());
  ASSERT_TRUE(initiator.Connect(plain.LocalEngine(), 2000).ok());
  ASSERT_TRUE(initiator.GetPeerInfo(plain.LocalEngine(), info).ok());
  EXPECT_EQ(info, "");
}

TEST(PeerInfo, TooLongIsRefused) {
  hixl::Hixl e;
  EXPECT_EQ(e.SetLocalInfo(std::string(hixl::kMaxLocalInfoLen + 1, 'x')).code(),
            hixl::StatusCode::kParamInvalid);
  EXPECT_TRUE(e.SetLocalInfo(std::string(hixl::kMaxLocalInfoLen, 'x')).ok());
}

TEST(PeerInfo, WelcomeDecoderChecksIt) {
  hixl::control::Welcome w;
  w.engine = "127.0.0.1:1";
  w.host = "host-1";
  w.pid = 1;
  w.generation = 5;
  w.info = "hello";
  hixl::control::Welcome out;
  auto m = hixl::control::EncodeWelcome(w);
  ASSERT_TRUE(hixl::control::DecodeWelcome(m, out).ok());
  EXPECT_EQ(out.info, "hello");
  m["info"] = 17;
  EXPECT_FALSE(hixl::control::DecodeWelcome(m, out).ok());
  m["info"] = std::string(hixl::control::kMaxLocalInfo + 1, 'x');
  EXPECT_FALSE(hixl::control::DecodeWelcome(m, out).ok());
  m.erase("info");  // engines that set none send none
  ASSERT_TRUE(hixl::control::DecodeWelcome(m, out).ok());
  EXPECT_EQ(out.info, "");
}

}  // namespace
