#include "log.h"

#include <cctype>
#include <cstdarg>
#include <stdexcept>

namespace seqr {

std::atomic<int> g_log_level{LL_WARNING};

static const char* kNames[] = {"debug", "info", "warning", "error", "off"};

void set_log_level(const std::string& level) {
  std::string l;
  for (char c : level) l.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (l == "warn") l = "warning";
  if (l == "critical") l = "error";
  for (int i = 0; i < 5; ++i) {
    if (l == kNames[i]) {
      g_log_level.store(i);
      return;
    }
  }
  throw std::invalid_argument("unknown log level '" + level +
                              "' (expected debug, info, warning, error or off)");
}

std::string get_log_level() { return kNames[g_log_level.load()]; }

void log_write(int lvl, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "seqr %s: %s\n", kNames[lvl < 0 ? 0 : (lvl > 3 ? 3 : lvl)], buf);
}

}  // namespace seqr
