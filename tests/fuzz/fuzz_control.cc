// Fuzz target: the control protocol as a peer's bytes reach an engine —
// frames through FrameReader, every decoded message through every decoder
// (hello, challenge, auth, welcome, reject, radd, rdel, rdel_ack, notify,
// nack), and the handshake's proof checks on whatever nonces and proofs
// decode, in both directions. Nothing may crash, leak or read out of bounds,
// whatever the bytes.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/wire.h"
#include "control/protocol.h"

namespace {

void DecodeAll(const hixl::wire::Msg& m) {
  using namespace hixl::control;
  (void)TypeOf(m);
  Hello h;
  const std::string secret = "fuzzing secret, 16+ bytes";
  if (DecodeHello(m, h).ok() && h.has_auth) {
    // The target's side: a challenge for this nonce.
    hixl::auth::Nonce sn{};
    (void)hixl::auth::TargetProof(secret, h.cn, sn);
  }
  Challenge ch;
  if (DecodeChallenge(m, ch).ok()) {
    // The initiator's side: the target's proof checked, its own computed.
    const hixl::auth::Nonce cn{};
    (void)hixl::auth::TagEquals(hixl::auth::TargetProof(secret, cn, ch.sn), ch.proof.data(),
                                ch.proof.size());
    (void)hixl::auth::LinkKey(secret, cn, ch.sn);
  }
  hixl::auth::Tag proof{};
  if (DecodeAuth(m, proof).ok()) {
    const hixl::auth::Nonce cn{}, sn{};
    (void)hixl::auth::TagEquals(hixl::auth::InitiatorProof(secret, cn, sn), proof.data(),
                                proof.size());
  }
  Welcome w;
  (void)DecodeWelcome(m, w);
  (void)DecodeRejectReason(m);
  std::vector<RegionDesc> regions;
  (void)DecodeRegionAdd(m, regions);
  uint64_t seq = 0;
  std::vector<uint64_t> ids;
  (void)DecodeRegionDel(m, seq, ids);
  (void)DecodeRegionDelAck(m, seq);
  std::string name, msg, why;
  (void)DecodeNotify(m, seq, name, msg);
  uint32_t code = 0;
  (void)DecodeNotifyAck(m, seq, code, why);
  Ident id;
  (void)DecodeIdent(m, id);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // As a stream: frames split at arbitrary points (the first byte picks the chunk size).
  hixl::wire::FrameReader reader;
  const size_t chunk = size == 0 ? 1 : 1 + data[0] % 61;
  for (size_t off = 0; off < size; off += chunk) {
    reader.Append(data + off, std::min(chunk, size - off));
    for (int i = 0; i < 64; ++i) {
      hixl::wire::Msg m;
      bool has = false;
      if (!reader.Next(m, has).ok() || !has) break;
      DecodeAll(m);
    }
  }
  // As one frame body.
  hixl::wire::Msg m;
  if (hixl::wire::DecodeBody(data, size, m).ok()) DecodeAll(m);
  return 0;
}
