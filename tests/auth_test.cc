// tests/auth_test.cc — authenticated links (AuthSecret, AuthSecretFile,
// AuthRequired; docs/SECURITY.md) between real processes.
//
// Engines with the same secret link and move bytes over shm and tcp; every
// mismatch (different secrets, a secret on one side only) fails the link on
// the side that requires authentication with an error that says so; the
// option checks never echo the secret. A raw client (raw_client.h, tags
// computed from the documented construction with OpenSSL) shows that before
// the initiator's proof nothing that gives access leaves the target: no
// welcome, no regions, no transport tokens, no notification accepted; that a
// proof recorded on one connection is worthless on the next (fresh target
// nonce); and that an authenticated link's tcp data lanes and shm memfd
// requests need the link key, so replaying what crossed the wire opens
// nothing.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hixl/hixl.h"
#include "peer_process.h"
#include "raw_client.h"

namespace {

using hixl::Hixl;
using hixl::Status;
using hixl::StatusCode;
using hixl::TransferOp;
using hixl_test::Buffer;
using hixl_test::PeerProcess;
using namespace hixl_test::raw;  // NOLINT: the raw client's vocabulary

const std::string kSecret = "correct horse battery staple";
const std::string kOtherSecret = "incorrect donkey battery staple";
constexpr size_t kSize = 1 << 20;

std::map<std::string, std::string> Opts(std::vector<std::pair<std::string, std::string>> kv) {
  return {kv.begin(), kv.end()};
}

// A temporary file holding text, removed on scope exit.
class TempFile {
 public:
  TempFile(const std::string& text, mode_t mode) {
    char tmpl[] = "/tmp/hixl-auth-XXXXXX";
    int fd = mkstemp(tmpl);
    path_ = tmpl;
    if (fd >= 0) {
      (void)!write(fd, text.data(), text.size());
      fchmod(fd, mode);
      close(fd);
    }
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------
// Option checks (no peer needed).

TEST(AuthOptions, BadSecretsAreRefusedWithoutEchoingThem) {
  struct Case {
    std::map<std::string, std::string> opts;
    std::string says;
  };
  const std::string short_secret = "tooshort-x9";
  TempFile world_readable(kSecret + "\n", 0644);
  TempFile short_file(short_secret + "\n", 0600);
  TempFile empty_file("", 0600);
  std::vector<Case> cases = {
      {Opts({{"AuthSecret", short_secret}}), "too short"},
      {Opts({{"AuthSecret", std::string(5000, 'k')}}), "longer than"},
      {Opts({{"AuthSecretFile", world_readable.path()}}), "chmod 600"},
      {Opts({{"AuthSecretFile", short_file.path()}}), "too short"},
      {Opts({{"AuthSecretFile", empty_file.path()}}), "too short"},
      {Opts({{"AuthSecretFile", "/nonexistent/hixl-secret"}}), "cannot open"},
      {Opts({{"AuthSecretFile", "/tmp"}}), "not a regular file"},
      {Opts({{"AuthSecret", kSecret}, {"AuthSecretFile", short_file.path()}}), "exclude each other"},
      {Opts({{"AuthRequired", "1"}}), "needs AuthSecret"},
      {Opts({{"AuthRequired", "2"}, {"AuthSecret", kSecret}}), "0 or 1"},
  };
  for (const auto& c : cases) {
    Hixl e;
    Status s = e.Initialize("127.0.0.1:0", c.opts);
    SCOPED_TRACE(c.says);
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.ToString();
    EXPECT_EQ(s.message().find(short_secret), std::string::npos) << s.ToString();
    EXPECT_EQ(s.message().find(kSecret), std::string::npos) << s.ToString();
  }
}

// ---------------------------------------------------------------------------
// Engines against a peer process.

class AuthLinkTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Starts the target peer with opts and a registered region `dst`.
  void StartTarget(std::vector<std::string> opts) {
    target_ = std::make_unique<PeerProcess>(std::move(opts));
    ASSERT_TRUE(target_->Start());
    dst_ = target_->Reg("dst", kSize, "rw");
    ASSERT_NE(dst_, 0u);
  }

  // Links a local engine with opts (plus this test's LinkType) to the target.
  Status Link(Hixl& e, std::map<std::string, std::string> opts) {
    opts["LinkType"] = GetParam();
    if (Status s = e.Initialize("127.0.0.1:0", opts); !s.ok()) return s;
    return e.Connect(target_->engine(), 3000);
  }

  // Writes a pattern into the target and checks it arrived intact.
  void ExpectWriteWorks(Hixl& e, uint64_t seed) {
    Buffer src(kSize);
    hixl_test::FillPattern(src.data(), kSize, seed);
    hixl::MemHandle h = 0;
    HIXL_ASSERT_OK(e.RegisterMem({src.addr(), kSize}, hixl::MemType::MEM_HOST, h));
    HIXL_EXPECT_OK(e.TransferSync(target_->engine(), TransferOp::WRITE,
                                  {{src.addr(), dst_, kSize}}, 5000));
    EXPECT_EQ(target_->Hash("dst", 0, kSize), src.HashHex());
    EXPECT_EQ(target_->Send("canary dst"), "OK intact");
    HIXL_EXPECT_OK(e.DeregisterMem(h));
  }

  std::unique_ptr<PeerProcess> target_;
  uintptr_t dst_ = 0;
};

TEST_P(AuthLinkTest, SameSecretLinksAndMovesBytes) {
  ASSERT_NO_FATAL_FAILURE(StartTarget({"AuthSecret=" + kSecret}));
  // Memory the target allocated is shareable: over shm the initiator maps it,
  // after a memfd request tagged with the link key.
  const uintptr_t shared = target_->Alloc("shared", kSize);
  ASSERT_NE(shared, 0u);
  Hixl e;
  HIXL_ASSERT_OK(Link(e, {{"AuthSecret", kSecret}}));
  hixl::LinkType t{};
  HIXL_ASSERT_OK(e.GetLinkType(target_->engine(), t));
  EXPECT_EQ(t, hixl_test::LinkTypeOf(GetParam()));
  ExpectWriteWorks(e, 11);
  Buffer src(kSize);
  hixl_test::FillPattern(src.data(), kSize, 21);
  hixl::MemHandle h = 0;
  HIXL_ASSERT_OK(e.RegisterMem({src.addr(), kSize}, hixl::MemType::MEM_HOST, h));
  HIXL_EXPECT_OK(
      e.TransferSync(target_->engine(), TransferOp::WRITE, {{src.addr(), shared, kSize}}, 5000));
  EXPECT_EQ(target_->Hash("shared", 0, kSize), src.HashHex());
  // Notifications cross an authenticated link too.
  HIXL_EXPECT_OK(e.SendNotify(target_->engine(), {"n", "hello", ""}, 2000));
  EXPECT_EQ(target_->Send("getnotifies"), "OK 1 n=hello");
}

TEST_P(AuthLinkTest, SecretFromAFileOnBothSides) {
  TempFile f(kSecret + "\n", 0600);
  ASSERT_NO_FATAL_FAILURE(StartTarget({"AuthSecretFile=" + f.path()}));
  Hixl e;
  HIXL_ASSERT_OK(Link(e, {{"AuthSecret", kSecret}}));  // the newline is not part of it
  ExpectWriteWorks(e, 12);
}

TEST_P(AuthLinkTest, DifferentSecretsAreRefusedAndTheTargetServesOthers) {
  ASSERT_NO_FATAL_FAILURE(StartTarget({"AuthSecret=" + kSecret}));
  {
    Hixl bad;
    Status s = Link(bad, {{"AuthSecret", kOtherSecret}});
    EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
    EXPECT_NE(s.message().find("authentication failed"), std::string::npos) << s.ToString();
    EXPECT_EQ(bad.TransferSync(target_->engine(), TransferOp::READ, {{1, dst_, 8}}, 500).code(),
              StatusCode::kNotConnected);
  }
  Hixl good;
  HIXL_ASSERT_OK(Link(good, {{"AuthSecret", kSecret}}));
  ExpectWriteWorks(good, 13);
}

TEST_P(AuthLinkTest, TargetRequiringAuthenticationRefusesAnInitiatorWithout) {
  ASSERT_NO_FATAL_FAILURE(StartTarget({"AuthSecret=" + kSecret}));
  Hixl e;
  Status s = Link(e, {});
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  EXPECT_NE(s.message().find("requires authentication"), std::string::npos) << s.ToString();
}

TEST_P(AuthLinkTest, InitiatorRequiringAuthenticationRefusesATargetWithout) {
  ASSERT_NO_FATAL_FAILURE(StartTarget({}));
  Hixl e;
  Status s = Link(e, {{"AuthSecret", kSecret}});
  EXPECT_EQ(s.code(), StatusCode::kFailed) << s.ToString();
  EXPECT_NE(s.message().find("does not authenticate"), std::string::npos) << s.ToString();
  // With AuthRequired=0 the same initiator links (unauthenticated).
  Hixl lax;
  HIXL_ASSERT_OK(Link(lax, {{"AuthSecret", kSecret}, {"AuthRequired", "0"}}));
  ExpectWriteWorks(lax, 14);
}

TEST_P(AuthLinkTest, AuthRequiredZeroAcceptsPeersWithoutASecretButNeverAWrongOne) {
  ASSERT_NO_FATAL_FAILURE(StartTarget({"AuthSecret=" + kSecret, "AuthRequired=0"}));
  Hixl none;
  HIXL_ASSERT_OK(Link(none, {}));
  ExpectWriteWorks(none, 15);
  Hixl same;
  HIXL_ASSERT_OK(Link(same, {{"AuthSecret", kSecret}}));
  ExpectWriteWorks(same, 16);
  Hixl wrong;
  Status s = Link(wrong, {{"AuthSecret", kOtherSecret}, {"AuthRequired", "0"}});
  EXPECT_NE(s.message().find("authentication failed"), std::string::npos) << s.ToString();
}

TEST_P(AuthLinkTest, ThePeerProcessAsInitiatorIsRefusedByAWrongSecret) {
  // The other direction: the peer process connects to this process's engine.
  ASSERT_NO_FATAL_FAILURE(StartTarget({"AuthSecret=" + kOtherSecret, "LinkType=" + GetParam()}));
  Hixl local;
  HIXL_ASSERT_OK(local.Initialize("127.0.0.1:0", {{"AuthSecret", kSecret}}));
  const std::string reply = target_->Send("connect " + local.LocalEngine());
  EXPECT_NE(reply.find("authentication failed"), std::string::npos) << reply;
}

INSTANTIATE_TEST_SUITE_P(Transports, AuthLinkTest, ::testing::ValuesIn(hixl_test::AllLinkTypes()),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------------------
// A raw client against an authenticating target.

class AuthRawTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = std::make_unique<PeerProcess>(std::vector<std::string>{
        "AuthSecret=" + kSecret, "HeartbeatIntervalMs=600000", "HandshakeTimeoutMs=3000"});
    ASSERT_TRUE(target_->Start());
    dst_ = target_->Reg("dst", kSize, "rw");
    ASSERT_NE(target_->Send("fill dst 0x5A"), "");
    shared_ = target_->Alloc("shared", kSize);
    ASSERT_NE(dst_, 0u);
  }

  // Expects the target to answer with a reject only (no welcome, nothing
  // naming regions or tokens) and then to close the connection.
  void ExpectRejectedAndClosed(RawControl& c, const std::string& why) {
    nlohmann::json m;
    ASSERT_TRUE(c.ReadFrame(m, 3000)) << why << ": no answer";
    EXPECT_EQ(m.value("t", ""), "reject") << why << ": " << m.dump();
    EXPECT_FALSE(m.contains("regions") || m.contains("tp")) << m.dump();
    EXPECT_FALSE(c.ReadFrame(m, 3000)) << why << ": more after the reject: " << m.dump();
  }

  std::unique_ptr<PeerProcess> target_;
  uintptr_t dst_ = 0, shared_ = 0;
};

TEST_F(AuthRawTest, HelloWithoutAuthenticationGetsOnlyAReject) {
  RawControl c;
  ASSERT_TRUE(c.ConnectOnly(target_->engine()));
  ASSERT_TRUE(c.SendFrame(RawControl::Hello()));
  ExpectRejectedAndClosed(c, "hello without auth");
}

TEST_F(AuthRawTest, WrongProofGetsOnlyAReject) {
  RawControl c;
  ASSERT_TRUE(c.ConnectOnly(target_->engine()));
  ASSERT_TRUE(c.SendFrame(RawControl::Hello(ToHex(RandomBytes(32)))));
  nlohmann::json ch;
  ASSERT_TRUE(c.ReadFrame(ch, 3000));
  ASSERT_EQ(ch.value("t", ""), "challenge") << ch.dump();
  EXPECT_EQ(ch.size(), 3u) << "a challenge carries sn and proof only: " << ch.dump();
  ASSERT_TRUE(c.SendFrame({{"t", "auth"}, {"proof", ToHex(RandomBytes(32))}}));
  ExpectRejectedAndClosed(c, "random proof");
}

TEST_F(AuthRawTest, NothingButTheProofIsAcceptedAfterTheChallenge) {
  for (const char* type : {"notify", "rdel_ack", "hb", "hello"}) {
    RawControl c;
    ASSERT_TRUE(c.ConnectOnly(target_->engine()));
    ASSERT_TRUE(c.SendFrame(RawControl::Hello(ToHex(RandomBytes(32)))));
    nlohmann::json m;
    ASSERT_TRUE(c.ReadFrame(m, 3000));
    ASSERT_EQ(m.value("t", ""), "challenge");
    nlohmann::json msg = {{"t", type}, {"seq", 1u}, {"n", "x"}, {"m", "y"}};
    if (std::string(type) == "hello") msg = RawControl::Hello(ToHex(RandomBytes(32)));
    ASSERT_TRUE(c.SendFrame(msg));
    EXPECT_FALSE(c.ReadFrame(m, 3000)) << type << " was answered: " << m.dump();
  }
  EXPECT_EQ(target_->Send("getnotifies"), "OK 0");
}

TEST_F(AuthRawTest, AProofRecordedOnOneConnectionIsWorthlessOnTheNext) {
  // An honest exchange, recorded.
  const Bytes cn = RandomBytes(32);
  std::string recorded;
  {
    RawControl c;
    ASSERT_TRUE(c.ConnectOnly(target_->engine()));
    ASSERT_TRUE(c.SendFrame(RawControl::Hello(ToHex(cn))));
    nlohmann::json ch;
    ASSERT_TRUE(c.ReadFrame(ch, 3000));
    Bytes sn;
    ASSERT_TRUE(FromHexBytes(ch.value("sn", ""), sn));
    recorded = ToHex(InitiatorProof(kSecret, cn, sn));
    ASSERT_TRUE(c.SendFrame({{"t", "auth"}, {"proof", recorded}}));
    nlohmann::json w;
    ASSERT_TRUE(c.ReadFrame(w, 3000));
    ASSERT_EQ(w.value("t", ""), "welcome") << "the honest exchange must succeed";
  }
  // The same hello and the recorded answer on a new connection.
  RawControl replay;
  ASSERT_TRUE(replay.ConnectOnly(target_->engine()));
  ASSERT_TRUE(replay.SendFrame(RawControl::Hello(ToHex(cn))));
  nlohmann::json ch;
  ASSERT_TRUE(replay.ReadFrame(ch, 3000));
  ASSERT_EQ(ch.value("t", ""), "challenge");
  ASSERT_TRUE(replay.SendFrame({{"t", "auth"}, {"proof", recorded}}));
  ExpectRejectedAndClosed(replay, "replayed proof");
}

// The lane hello of hixl's tcp transport (tcp_wire.h) with a tag.
Bytes LaneHelloV2(uint64_t token, uint64_t gen, uint32_t lane, const Tag& tag) {
  return LaneHello(token, gen, kLaneMagic, kLaneVersion, lane, tag.data());
}

Tag LaneTag(const Tag& link_key, uint64_t token, uint64_t gen, uint32_t lane) {
  Bytes parts;
  PutU64(parts, token);
  PutU64(parts, gen);
  PutU32(parts, lane);
  return HmacTag(std::string(link_key.begin(), link_key.end()), "hixl-auth-v1 lane", parts);
}

// True when the lane hello is accepted (reply status 0).
bool LaneAccepted(const RawControl& c, const Bytes& hello) {
  Sock s(ConnectTcp(c.ip(), c.data_port));
  if (s.get() < 0 || !SendAll(s.get(), hello)) return false;
  uint8_t rep[kLaneReplySize];
  if (!RecvExact(s.get(), rep, sizeof(rep), 3000)) return false;
  return GetU32(rep) == kLaneMagic && GetU32(rep + 4) == 0;
}

TEST_F(AuthRawTest, TcpLanesOfAnAuthenticatedLinkNeedTheLinkKeyAndOpenOnce) {
  RawControl c;
  std::string err;
  ASSERT_TRUE(c.Open(target_->engine(), false, &err, kSecret)) << err;
  ASSERT_TRUE(c.keyed);
  // The token alone, as an eavesdropper saw it in the welcome: refused.
  EXPECT_FALSE(LaneAccepted(c, LaneHelloV2(c.token, c.generation, 0, Tag{})));
  // A tag keyed with anything but the link key: refused.
  Tag wrong = LaneTag(Tag{}, c.token, c.generation, 0);
  EXPECT_FALSE(LaneAccepted(c, LaneHelloV2(c.token, c.generation, 0, wrong)));
  // The right tag opens lane 0, and the lane serves requests.
  const Bytes good = LaneHelloV2(c.token, c.generation, 0, LaneTag(c.link_key, c.token, c.generation, 0));
  Sock lane(ConnectTcp(c.ip(), c.data_port));
  ASSERT_TRUE(SendAll(lane.get(), good));
  uint8_t rep[kLaneReplySize];
  ASSERT_TRUE(RecvExact(lane.get(), rep, sizeof(rep), 3000));
  ASSERT_EQ(GetU32(rep + 4), 0u) << "the tagged lane hello was refused";
  ASSERT_TRUE(SendAll(lane.get(), Request(kOpRead, 1, dst_, 64)));
  uint8_t resp[kRespSize + 64];
  ASSERT_TRUE(RecvExact(lane.get(), resp, sizeof(resp), 3000));
  EXPECT_EQ(resp[5], 0) << "read status";
  EXPECT_EQ(resp[kRespSize], 0x5A);
  // The same hello bytes replayed on a new connection: refused (lane 0 is
  // taken for good), while another lane index with its own tag opens.
  EXPECT_FALSE(LaneAccepted(c, good));
  EXPECT_TRUE(LaneAccepted(
      c, LaneHelloV2(c.token, c.generation, 1, LaneTag(c.link_key, c.token, c.generation, 1))));
  EXPECT_EQ(target_->Send("canary dst"), "OK intact");
}

// Sends a getfd request over the shm transport's unix socket (the abstract
// name from the welcome): "answered" when the target replied with a frame,
// "closed" when it closed the connection instead, "unreachable" when the
// socket could not be reached at all (a test failure, not a refusal).
std::string ShmRequest(const std::string& uds, const nlohmann::json& req) {
  Sock s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (uds.empty() || uds.size() + 1 > sizeof(a.sun_path)) return "unreachable";
  std::memcpy(a.sun_path + 1, uds.data(), uds.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + uds.size());
  if (connect(s.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) return "unreachable";
  Bytes body = nlohmann::json::to_msgpack(req);
  Bytes f;
  PutU32(f, kFrameMagic);
  PutU32(f, static_cast<uint32_t>(body.size()));
  f.insert(f.end(), body.begin(), body.end());
  if (!SendAll(s.get(), f)) return "closed";
  uint8_t hdr[8];
  return RecvExact(s.get(), hdr, sizeof(hdr), 3000) ? "answered" : "closed";
}

TEST_F(AuthRawTest, ShmMemfdRequestsOfAnAuthenticatedLinkNeedTheLinkKey) {
  // A raw authenticated link learns the shm socket, its token and the
  // region ids; a request with the token but without the link key's tag
  // gets no memory.
  RawControl c;
  std::string err;
  ASSERT_TRUE(c.Open(target_->engine(), false, &err, kSecret)) << err;
  ASSERT_FALSE(c.welcome.is_null());
  const auto& shm = c.welcome["tp"]["shm"];
  ASSERT_TRUE(shm.is_object()) << c.welcome.dump();
  uint64_t shared_id = 0;
  for (const auto& r : c.welcome["regions"]) {
    if (r["addr"].get<uint64_t>() == shared_) shared_id = r["id"].get<uint64_t>();
  }
  ASSERT_NE(shared_id, 0u);
  const std::string uds = shm["uds"].get<std::string>();
  const uint64_t token = shm["token"].get<uint64_t>();
  EXPECT_EQ(ShmRequest(uds, {{"t", "getfd"}, {"token", token}, {"id", shared_id}}), "closed");
  EXPECT_EQ(ShmRequest(uds, {{"t", "getfd"},
                             {"token", token},
                             {"id", shared_id},
                             {"tag", ToHex(RandomBytes(32))}}),
            "closed");
  // With the tag the request is answered (the honest engine's path).
  Bytes parts;
  PutU64(parts, token);
  PutU64(parts, shared_id);
  const Tag tag =
      HmacTag(std::string(c.link_key.begin(), c.link_key.end()), "hixl-auth-v1 shm", parts);
  EXPECT_EQ(
      ShmRequest(uds, {{"t", "getfd"}, {"token", token}, {"id", shared_id}, {"tag", ToHex(tag)}}),
      "answered");
}

TEST_F(AuthRawTest, ShmNotificationRingRequestsOfAnAuthenticatedLinkNeedTheLinkKey) {
  // A notification ring (and its doorbell) is handed out under the same
  // rule as memory: the token alone, or a tag over another id, gets nothing.
  RawControl c;
  std::string err;
  ASSERT_TRUE(c.Open(target_->engine(), false, &err, kSecret)) << err;
  const auto& shm = c.welcome["tp"]["shm"];
  ASSERT_TRUE(shm.is_object()) << c.welcome.dump();
  const std::string uds = shm["uds"].get<std::string>();
  const uint64_t token = shm["token"].get<uint64_t>();
  const uint64_t ring_id = UINT64_MAX;  // the id a ring request's tag covers
  auto tag_over = [&](uint64_t id) {
    Bytes parts;
    PutU64(parts, token);
    PutU64(parts, id);
    return ToHex(
        HmacTag(std::string(c.link_key.begin(), c.link_key.end()), "hixl-auth-v1 shm", parts));
  };
  const char* t = "getring";
  EXPECT_EQ(ShmRequest(uds, {{"t", t}, {"token", token}, {"id", ring_id}}), "closed") << t;
  EXPECT_EQ(ShmRequest(uds, {{"t", t}, {"token", token}, {"id", 7}, {"tag", tag_over(7)}}),
            "closed")
      << t;
  EXPECT_EQ(ShmRequest(
                uds, {{"t", t}, {"token", token + 1}, {"id", ring_id}, {"tag", tag_over(ring_id)}}),
            "closed")
      << t;
  EXPECT_EQ(
      ShmRequest(uds, {{"t", t}, {"token", token}, {"id", ring_id}, {"tag", tag_over(ring_id)}}),
      "answered")
      << t;
}

}  // namespace
