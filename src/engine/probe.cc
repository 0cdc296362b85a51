#include "engine/probe.h"

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <vector>

#include "common/net.h"
#include "common/wire.h"

namespace hixl::engine {
namespace {

// An ident is a few hundred bytes; anything larger is not one.
constexpr uint32_t kMaxIdentFrame = 4096;

ProbeResult Result(ProbeResult::Kind kind, std::string detail) {
  ProbeResult r;
  r.kind = kind;
  r.detail = std::move(detail);
  return r;
}

}  // namespace

ProbeResult ProbeEngine(const std::string& address, int timeout_ms) {
  using Kind = ProbeResult::Kind;
  if (timeout_ms < 1 || timeout_ms > 60000) {
    return Result(Kind::kNoAnswer, "probe timeout must be 1..60000 ms");
  }
  net::HostPort hp;
  if (Status s = net::ParseHostPort(address, hp); !s.ok() || hp.port <= 0) {
    return Result(Kind::kNoAnswer, "'" + address + "' is not an ip:port address");
  }
  const auto t0 = std::chrono::steady_clock::now();
  const net::Deadline deadline = net::DeadlineAfterMs(timeout_ms);
  net::Fd fd;
  int err = 0;
  if (Status s = net::TcpConnect(hp, deadline, fd, &err); !s.ok()) {
    if (err == ECONNREFUSED) return Result(Kind::kRefused, address + " refuses connections");
    return Result(Kind::kNoAnswer, s.message());
  }
  const std::vector<uint8_t> probe = wire::EncodeFrame(control::EncodeProbe());
  if (Status s = net::WriteFull(fd.get(), probe.data(), probe.size(), deadline); !s.ok()) {
    return Result(Kind::kNoAnswer, "sending the probe to " + address + ": " + s.message());
  }
  uint8_t hdr[wire::kFrameHeaderSize];
  if (Status s = net::ReadFull(fd.get(), hdr, sizeof(hdr), deadline); !s.ok()) {
    return Result(Kind::kNoAnswer, address + " gave no answer: " + s.message());
  }
  uint32_t len = 0;
  if (Status s = wire::DecodeFrameHeader(hdr, len); !s.ok() || len > kMaxIdentFrame) {
    return Result(Kind::kNotHixl,
                  address + " answered, but not as a hixl engine" +
                      (s.ok() ? std::string(" (oversized frame)") : ": " + s.message()));
  }
  std::vector<uint8_t> body(len);
  if (Status s = net::ReadFull(fd.get(), body.data(), body.size(), deadline); !s.ok()) {
    return Result(Kind::kNoAnswer, address + " did not finish its answer: " + s.message());
  }
  wire::Msg m;
  control::Ident ident;
  Status s = wire::DecodeBody(body.data(), body.size(), m);
  if (s.ok()) s = control::DecodeIdent(m, ident);
  if (s.code() == StatusCode::kUnsupported) {
    // An engine of another protocol version: alive, as far as anyone can tell.
    return Result(Kind::kNoAnswer,
                  address + " is an engine that speaks another protocol: " + s.message());
  }
  if (!s.ok()) {
    return Result(Kind::kNotHixl,
                  address + " answered, but not with an engine's ident: " + s.message());
  }
  ProbeResult r =
      Result(Kind::kIdent, address + " is engine generation " + std::to_string(ident.generation));
  r.ident = std::move(ident);
  r.rtt_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace hixl::engine
