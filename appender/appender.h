// Appender: the hot path of async appends, in C++, so that an append costs the
// client a few microseconds rather than a Python sequencer round trip and a
// Python completion callback per entry.
//
// append() queues an entry; a dispatcher thread takes positions for
// everything queued with one sequencer request and sends, with librados aio
// on the Appender's own RADOS connection, one cls_zlog "write_many" per data
// object (or one "write" per entry, with coalesce off).
// Outcomes come back from wait() as (ticket, position, code). Anything that is
// not plainly OK (no view yet, the sequencer down or answering other than OK,
// a position in an older view) is handed back with code HANDED_BACK, unsent:
// the Python client, which knows how to refresh, retry and fall back, takes
// over from there.
#pragma once

#include <rados/librados.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client.h"  // seqr::Client, seqr::Auth

namespace zlog_appender {

constexpr int HANDED_BACK = 1;

struct Completed {
  uint64_t ticket;
  uint64_t position;
  int code;  // 0 stored, -errno from the OSD, or HANDED_BACK
};

struct Stats {
  uint64_t sequencer_requests = 0;
  uint64_t class_calls = 0;   // write and write_many calls sent
  uint64_t entries_sent = 0;  // entries in them (retries of a split batch included)
  uint64_t split_batches = 0; // write_many refused for a taken position, retried one by one
  uint64_t handed_back = 0;   // entries given back to Python unsent
};

struct Target {  // where the sequencer is, and which log to append to
  std::string seqr_host;
  uint16_t seqr_port;
  double seqr_timeout_s;
  std::string pool;
  std::string log;
  seqr::Auth seqr_auth;  // how the sequencer connection authenticates (its pool is `pool`)
};

class Appender {
 public:
  // Connects to RADOS as `client` with `conf_file` (may be empty) and
  // `options` applied on top; throws std::runtime_error on failure.
  Appender(const std::string& client, const std::string& conf_file,
           const std::vector<std::pair<std::string, std::string>>& options, Target target,
           bool coalesce);
  ~Appender();
  Appender(const Appender&) = delete;
  Appender& operator=(const Appender&) = delete;

  // The newest view: positions >= start go to oid_prefix + (position % width),
  // tagged with epoch. Until the first call, every entry is handed back.
  void set_view(uint64_t epoch, const std::string& oid_prefix, uint32_t width, uint64_t start);

  // Queues one entry (copied) for writing under `ticket`.
  void append(uint64_t ticket, const char* data, uint32_t len);

  // Up to max_items outcomes, waiting up to timeout_s for the first one.
  std::vector<Completed> wait(size_t max_items, double timeout_s);

  // Sends what is queued, waits up to timeout_s for writes in flight, then
  // disconnects. False if some were still in flight (the connection is then
  // left open, as late completions still need it).
  bool close(double timeout_s);

  uint64_t in_flight();
  Stats stats();

 private:
  struct Entry {
    uint64_t ticket;
    uint64_t position;  // set once the sequencer hands it out
    ceph::bufferlist data;
  };
  struct Op;
  void dispatch();
  void send(std::vector<Entry>& batch);
  void submit(const std::string& oid, uint64_t epoch, std::vector<Entry> entries);
  void complete(Op* op, int r);
  void finish(std::vector<Completed>& out);
  static void on_complete(librados::completion_t c, void* arg);

  const Target target_;
  const bool coalesce_;
  librados::Rados rados_;
  librados::IoCtx ioctx_;
  std::unique_ptr<seqr::Client> seqr_;  // dispatcher thread only
  size_t max_batch_ = 4096;              // dispatcher thread only: entries per sequencer request

  std::mutex mu_;
  std::condition_variable work_;   // entries queued, or closing
  std::condition_variable ready_;  // outcomes queued, or closed
  std::condition_variable idle_;   // nothing queued or in flight
  std::deque<Entry> queue_;
  std::deque<Completed> done_;
  uint64_t in_flight_ = 0;  // queued + sent, not yet reported
  bool have_view_ = false;
  uint64_t epoch_ = 0, start_ = 0;
  uint32_t width_ = 1;
  std::string oid_prefix_;
  Stats stats_;
  bool closing_ = false, closed_ = false;
  std::thread dispatcher_;
};

}  // namespace zlog_appender
