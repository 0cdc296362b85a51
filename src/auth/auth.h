// Peer authentication: the shared secret, nonces, and the HMAC-SHA256 tags
// of the control handshake and of the links' data connections.
//
// The handshake (see control/protocol.h) is a mutual challenge-response over
// two fresh nonces, cn (the initiator's) and sn (the target's):
//   target proves:    HMAC(secret, "hixl-auth-v1 target"    | cn | sn)
//   initiator proves: HMAC(secret, "hixl-auth-v1 initiator" | cn | sn)
// Distinct labels keep one side's answer from being reflected as the other's.
// Both sides then derive the link key
//   HMAC(secret, "hixl-auth-v1 link" | cn | sn)
// which binds the link's data connections (tcp lanes, the shm socket request)
// to this handshake: a connection must present a tag keyed with it, so what an
// eavesdropper saw on the wire cannot open one.
// Thread safety: stateless functions; a Secret is immutable once made.
#ifndef HIXL_AUTH_AUTH_H_
#define HIXL_AUTH_AUTH_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "hixl/status.h"

namespace hixl::auth {

inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kTagSize = 32;  // SHA-256
inline constexpr size_t kMinSecret = 16;
inline constexpr size_t kMaxSecret = 4096;

using Nonce = std::array<uint8_t, kNonceSize>;
using Tag = std::array<uint8_t, kTagSize>;
using Key = std::array<uint8_t, kTagSize>;

// Checks a secret given inline (AuthSecret): kMinSecret..kMaxSecret bytes.
// Error messages never contain the secret.
Status CheckSecret(const std::string& secret, const char* what);

// Reads a secret from a file (AuthSecretFile): trailing newlines are
// dropped; the file must not be accessible to other users (like ssh keys).
Status ReadSecretFile(const std::string& path, std::string& secret);

// Fresh random bytes from the system's CSPRNG.
Status RandomNonce(Nonce& out);

// HMAC-SHA256 over label | a | b | c (each as given; lengths are fixed by
// the callers, so the concatenation is unambiguous).
Tag Hmac(std::string_view key, std::string_view label, std::string_view a,
         std::string_view b = {}, std::string_view c = {});

// The bytes of a nonce, key or tag (all three are 32-byte arrays).
inline std::string_view View(const Nonce& n) {
  return {reinterpret_cast<const char*>(n.data()), n.size()};
}

// Constant-time comparison of a tag with len bytes at p (false on any length
// mismatch).
bool TagEquals(const Tag& expected, const void* p, size_t len);

// The three handshake tags.
Tag TargetProof(std::string_view secret, const Nonce& cn, const Nonce& sn);
Tag InitiatorProof(std::string_view secret, const Nonce& cn, const Nonce& sn);
Key LinkKey(std::string_view secret, const Nonce& cn, const Nonce& sn);

// Lower-case hex, and its strict inverse (exactly 2*N hex digits).
std::string Hex(const uint8_t* p, size_t n);
bool FromHex(const std::string& s, uint8_t* out, size_t n);

}  // namespace hixl::auth

#endif  // HIXL_AUTH_AUTH_H_
