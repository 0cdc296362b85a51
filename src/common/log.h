// Internal logging: HIXL_LOG(WARN) << "text"; one line per statement to stderr.
// The level comes from the environment variable HIXL_LOG_LEVEL
// (ERROR, WARN — the default —, INFO, DEBUG). Thread-safe: each line is
// written with a single write(2).
#ifndef HIXL_COMMON_LOG_H_
#define HIXL_COMMON_LOG_H_

#include <sstream>

namespace hixl::log {

enum Level { ERROR = 0, WARN = 1, INFO = 2, DEBUG = 3 };

bool Enabled(Level level);

class Line {
 public:
  Line(Level level, const char* file, int line);
  ~Line();
  template <typename T>
  Line& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

}  // namespace hixl::log

#define HIXL_LOG(level)                              \
  if (!::hixl::log::Enabled(::hixl::log::level)) {   \
  } else                                             \
    ::hixl::log::Line(::hixl::log::level, __FILE__, __LINE__)

#endif  // HIXL_COMMON_LOG_H_
