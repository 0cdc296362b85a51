// Unit tests of the tcp lanes' buffered reader (Inbound): a receive that
// returned less than it asked for ends the pass without another system call;
// Rearm starts the next pass, which sees what arrived meanwhile.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "transport/tcp/tcp_internal.h"

namespace hixl::transport::tcp {
namespace {

class InboundTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  void Send(const std::vector<char>& bytes) {
    ASSERT_EQ(::send(fds_[1], bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }
  int fds_[2];
};

TEST_F(InboundTest, ShortReadEndsThePassUntilRearmed) {
  Inbound in;
  in.Rearm();
  Send(std::vector<char>(100, 'a'));
  EXPECT_EQ(in.Fill(fds_[0]), 100);
  EXPECT_EQ(in.avail(), 100u);
  // More arrives, but this pass already found the socket empty.
  Send(std::vector<char>(50, 'b'));
  EXPECT_EQ(in.Fill(fds_[0]), -1);
  EXPECT_EQ(in.avail(), 100u);
  in.Rearm();
  EXPECT_EQ(in.Fill(fds_[0]), 50);
  EXPECT_EQ(in.avail(), 150u);
  EXPECT_EQ(in.data()[100], 'b');
}

TEST_F(InboundTest, PayloadTakesBufferedBytesFirstThenTheSocket) {
  Inbound in;
  in.Rearm();
  Send(std::vector<char>(10, 'h'));
  ASSERT_EQ(in.Fill(fds_[0]), 10);
  in.Consume(4);  // a "header"
  std::vector<char> dst(20, 0);
  EXPECT_EQ(in.Payload(fds_[0], dst.data(), dst.size()), 6);  // from the buffer
  Send(std::vector<char>(14, 'p'));
  EXPECT_EQ(in.Payload(fds_[0], dst.data() + 6, 14), -1);  // dry since the short Fill
  in.Rearm();
  EXPECT_EQ(in.Payload(fds_[0], dst.data() + 6, 14), 14);  // exactly what it asked: not dry
  EXPECT_EQ(std::string(dst.begin(), dst.end()), std::string(6, 'h') + std::string(14, 'p'));
  // A full receive leaves the pass open: the next one asks the socket.
  Send(std::vector<char>(3, 'c'));
  char more[8];
  EXPECT_EQ(in.Payload(fds_[0], more, sizeof(more)), 3);
  EXPECT_EQ(in.Payload(fds_[0], more, sizeof(more)), -1);
}

TEST_F(InboundTest, PeerCloseAndEmptySocket) {
  Inbound in;
  in.Rearm();
  EXPECT_EQ(in.Fill(fds_[0]), -1);  // nothing there: would block
  ::shutdown(fds_[1], SHUT_WR);
  in.Rearm();
  EXPECT_EQ(in.Fill(fds_[0]), 0);  // closed
}

}  // namespace
}  // namespace hixl::transport::tcp
