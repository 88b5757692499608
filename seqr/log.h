#pragma once

#include <atomic>
#include <cstdio>
#include <string>

namespace seqr {

enum LogLevel : int { LL_DEBUG = 0, LL_INFO = 1, LL_WARNING = 2, LL_ERROR = 3, LL_OFF = 4 };

extern std::atomic<int> g_log_level;

// Accepts debug/info/warning/error/off (case-insensitive); throws
// std::invalid_argument otherwise.
void set_log_level(const std::string& level);
std::string get_log_level();

inline bool log_enabled(int lvl) {
  return lvl >= g_log_level.load(std::memory_order_relaxed);
}

void log_write(int lvl, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace seqr

#define SEQR_LOG(lvl, ...)                                  \
  do {                                                      \
    if (::seqr::log_enabled(lvl)) ::seqr::log_write(lvl, __VA_ARGS__); \
  } while (0)
