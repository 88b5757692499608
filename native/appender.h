// The append pipeline of one data-plane connection, in C++ (Kafka's
// RecordAccumulator + Sender): append() queues an entry of some log; one
// sender thread takes positions for everything queued of a log with one
// sequencer request (requests to one sequencer are pipelined across logs),
// and sends one cls_zlog "write_many" per data object (or one "write" per
// entry with coalesce off) through the data plane (dp_submit_cb). Each
// entry's outcome is posted, as (ticket, code, position), into the
// connection's completion queue, which Python drains on one thread.
//
// The pipeline decides nothing: an entry it cannot append plainly (no view
// yet, the sequencer down or answering other than OK, a position below the
// view) is posted back with code HANDED_BACK, unsent, and a refused write with
// the class's code. Python refreshes, retries and falls back (pyzlog.client.
// pipeline, the one rule of appending.judge). A write_many refused because
// one of its positions was taken is split into single writes first, so no
// other position of the batch is left as a hole.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dataplane.h"

namespace seqr {
class Client;
struct Auth;
}

namespace zlog_native {

// The code of an entry handed back unsent; positive so it cannot be an errno.
constexpr int HANDED_BACK = 1;

struct Stats {
  uint64_t sequencer_requests = 0;
  uint64_t class_calls = 0;   // write and write_many calls sent
  uint64_t entries_sent = 0;  // entries in them (retries of a split batch included)
  uint64_t split_batches = 0; // write_many refused for a taken position, retried one by one
  uint64_t handed_back = 0;   // entries given back to Python unsent
};

// Where a log's new positions go: positions >= start, striped over `width`
// objects. In the omap format object i of the view is prefix + i; in the
// data format the view is a sequence of stripes of `slots` positions per
// object, dealt in runs of `unit`, and position p's object is prefix + "s" +
// stripe + "." + index (cls_zlog/ops.h, "layout"; pyzlog.core.layout). A data-format object not made yet answers ENOENT,
// which Python handles (it opens the stripe and writes there again).
struct View {
  uint64_t epoch = 0, start = 0;
  uint32_t width = 1;
  std::string prefix;
  uint8_t format = ZLOG_FORMAT_OMAP;
  uint32_t slots = 0;
  uint32_t unit = 1;

  // the view's object holding `position`: stripe * width + index (stripe 0 in the omap format)
  uint64_t object(uint64_t position) const;
  std::string oid_of(uint64_t object) const;
};

struct Options {
  size_t window_entries = 1 << 16;     // queued + in flight, the whole connection
  size_t window_bytes = 256u << 20;
  uint32_t max_batch = 4096;           // entries per sequencer request
  // per log; a batch beyond the first goes once no more entries can join it
  // (sendable), so the OSD has the next full batch while the client settles
  // the last (AppendBatching.max_batches_in_flight)
  uint32_t max_batches_in_flight = 2;
  uint32_t linger_us = 0;              // wait this long for more entries when some are in flight
};

class Pipeline {
 public:
  // Outcomes go to `results` (a queue of `cluster`; the pipeline does not own either).
  Pipeline(dp_cluster* cluster, dp_queue* results, Options options);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // A log to append to, on `pool` (named pool_name for the sequencer); returns its id.
  // `window`: the most entries of the log its caller keeps in flight (0: not
  // known), so a batch beyond the first goes once no more can join it.
  uint32_t add_log(dp_pool* pool, const std::string& pool_name, const std::string& name, bool coalesce,
                   size_t window = 0);
  // Entries of the log go to this sequencer (host "" = none: hand back),
  // over a connection authenticated with `auth` (its pool: the log's pool).
  void set_sequencer(uint32_t log, const std::string& host, uint16_t port, double timeout_s,
                     const seqr::Auth& auth);
  // The newest view, its requests tagged with its epoch. Until the first
  // call, entries are handed back.
  void set_view(uint32_t log, const View& view);
  // Forget a log once nothing of it is queued or in flight (later outcomes are
  // still posted).
  void remove_log(uint32_t log);

  // Queues one entry; its outcome is posted under `ticket`. False without
  // queueing if the window is full (the caller waits with wait_room()).
  bool try_append(uint32_t log, uint64_t ticket, const char* data, uint32_t len);
  // Waits up to timeout_s for room in the window for an entry of `len` bytes;
  // false on timeout or close.
  bool wait_room(double timeout_s, uint32_t len = 0);

  // Stops taking entries, waits up to timeout_s for what is queued and in
  // flight. False if some remained (their memory is kept for late callbacks).
  bool close(double timeout_s);

  uint64_t in_flight();
  Stats stats();

 private:
  struct Entry {
    uint64_t ticket;
    uint64_t position;  // set once the sequencer hands it out
    std::string data;
  };
  struct Log;
  struct Batch;
  struct Sequencer;
  struct WriteOp;
  void run();
  void send_round(std::vector<std::pair<Log*, std::vector<Entry>>>& round);
  void requeue_front(Log* log, std::vector<Entry>& batch, size_t keep);
  void write(Log* log, const View& view, uint64_t first, std::vector<Entry>& batch);
  void submit(const std::string& oid, dp_pool* pool, uint64_t epoch, uint8_t format, std::vector<Entry> entries,
              Batch* owner);
  static void on_written(void* arg, int code);
  void written(WriteOp* op, int code);
  void post(const std::vector<uint64_t>& tickets, const std::vector<int32_t>& codes,
            const std::vector<uint64_t>& positions);
  void hand_back(std::vector<Entry>& batch);
  void entries_done(size_t n, size_t bytes);
  // whether the window takes an entry of `len` bytes now (mu_ held)
  bool has_room(uint32_t len) const;
  // whether the log's queue goes out now as a batch (mu_ held)
  bool sendable(const Log& log) const;

  dp_cluster* const cluster_;
  dp_queue* const results_;
  const Options opt_;

  std::mutex mu_;
  std::condition_variable work_;  // entries queued, or closing
  std::condition_variable room_;  // the window has room, or closing
  std::condition_variable idle_;  // nothing queued or in flight
  std::map<uint32_t, std::unique_ptr<Log>> logs_;
  uint32_t next_log_ = 1;
  size_t queued_ = 0;            // entries queued, all logs
  size_t entries_ = 0, bytes_ = 0;  // queued + in flight (the window)
  Stats stats_;
  bool closing_ = false, closed_ = false;
  // sender thread only
  std::map<std::string, std::unique_ptr<Sequencer>> sequencers_;
  std::thread sender_;
};

}  // namespace zlog_native
