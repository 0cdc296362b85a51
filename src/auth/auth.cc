#include "auth/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hixl::auth {

Status CheckSecret(const std::string& secret, const char* what) {
  if (secret.size() < kMinSecret) {
    return Status::ParamInvalid(std::string(what) + ": the secret is too short (" +
                                std::to_string(secret.size()) + " bytes; at least " +
                                std::to_string(kMinSecret) + " needed)");
  }
  if (secret.size() > kMaxSecret) {
    return Status::ParamInvalid(std::string(what) + ": the secret is longer than " +
                                std::to_string(kMaxSecret) + " bytes");
  }
  return Status::Ok();
}

Status ReadSecretFile(const std::string& path, std::string& secret) {
  const std::string what = "AuthSecretFile '" + path + "'";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::ParamInvalid(what + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::ParamInvalid(what + ": not a regular file");
  }
  if ((st.st_mode & (S_IRWXO | S_IWGRP)) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::ParamInvalid(what + ": other users may read or change it (mode " + mode +
                                "); chmod 600 it");
  }
  if (st.st_size > static_cast<off_t>(kMaxSecret + 2)) {
    ::close(fd);
    return Status::ParamInvalid(what + ": larger than " + std::to_string(kMaxSecret) + " bytes");
  }
  std::string s(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < s.size()) {
    ssize_t r = ::read(fd, s.data() + got, s.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  s.resize(got);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (Status c = CheckSecret(s, what.c_str()); !c.ok()) {
    OPENSSL_cleanse(s.data(), s.size());
    return c;
  }
  secret = std::move(s);
  return Status::Ok();
}

Status RandomNonce(Nonce& out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    return Status::Failed("the system's random number generator failed");
  }
  return Status::Ok();
}

Tag Hmac(std::string_view key, std::string_view label, std::string_view a, std::string_view b,
         std::string_view c) {
  std::string msg;
  msg.reserve(label.size() + 1 + a.size() + b.size() + c.size());
  msg.append(label);
  msg.push_back('\0');
  msg.append(a);
  msg.append(b);
  msg.append(c);
  Tag t{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), t.data(), &len);
  OPENSSL_cleanse(msg.data(), msg.size());
  return t;
}

bool TagEquals(const Tag& expected, const void* p, size_t len) {
  if (p == nullptr || len != expected.size()) return false;
  return CRYPTO_memcmp(expected.data(), p, expected.size()) == 0;
}

Tag TargetProof(std::string_view secret, const Nonce& cn, const Nonce& sn) {
  return Hmac(secret, "hixl-auth-v1 target", View(cn), View(sn));
}

Tag InitiatorProof(std::string_view secret, const Nonce& cn, const Nonce& sn) {
  return Hmac(secret, "hixl-auth-v1 initiator", View(cn), View(sn));
}

Key LinkKey(std::string_view secret, const Nonce& cn, const Nonce& sn) {
  return Hmac(secret, "hixl-auth-v1 link", View(cn), View(sn));
}

std::string Hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = d[p[i] >> 4];
    s[2 * i + 1] = d[p[i] & 15];
  }
  return s;
}

bool FromHex(const std::string& s, uint8_t* out, size_t n) {
  if (s.size() != 2 * n) return false;
  auto v = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    int hi = v(s[2 * i]), lo = v(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

}  // namespace hixl::auth
