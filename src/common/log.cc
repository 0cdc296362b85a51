#include "common/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

namespace hixl::log {
namespace {

Level ReadLevel() {
  const char* env = std::getenv("HIXL_LOG_LEVEL");
  if (env == nullptr) return WARN;
  std::string v(env);
  if (v == "ERROR" || v == "error") return ERROR;
  if (v == "INFO" || v == "info") return INFO;
  if (v == "DEBUG" || v == "debug") return DEBUG;
  return WARN;
}

const char* kNames[] = {"E", "W", "I", "D"};

}  // namespace

bool Enabled(Level level) {
  static const Level current = ReadLevel();
  return level <= current;
}

Line::Line(Level level, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  os_ << "[hixl " << kNames[level] << " " << now / 1000000 << "." << now % 1000000 << " "
      << getpid() << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

Line::~Line() {
  os_ << '\n';
  std::string s = os_.str();
  ssize_t r = ::write(STDERR_FILENO, s.data(), s.size());
  (void)r;
}

}  // namespace hixl::log
