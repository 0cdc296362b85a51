#include "common/host.h"

#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>

namespace hixl::host {
namespace {

std::string NsInode(const char* path) {
  struct stat st;
  if (::stat(path, &st) != 0) return "?";
  return std::to_string(st.st_dev) + "." + std::to_string(st.st_ino);
}

std::string Compute() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  if (!(f >> boot)) {
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    boot = name;
  }
  return boot + "/net:" + NsInode("/proc/self/ns/net") + "/pid:" + NsInode("/proc/self/ns/pid");
}

}  // namespace

const std::string& HostIdentity() {
  static const std::string id = Compute();
  return id;
}

uint64_t RandomU64() {
  uint64_t v = 0;
  while (v == 0) {
    if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
      static thread_local std::mt19937_64 rng{std::random_device{}()};
      v = rng();
    }
  }
  return v;
}

}  // namespace hixl::host
