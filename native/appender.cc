#include "appender.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "client.h"
#include "protocol.h"

namespace zlog_native {

namespace {
// Per write_many call: the class's entry limit, and the client's byte budget.
constexpr size_t kMaxBytesPerCall = 8u << 20;

bool taken(int code) { return code == -EROFS || code == -ENOMSG || code == -EIDRM; }
}  // namespace

struct Pipeline::Log {
  uint32_t id;
  dp_pool* pool;
  std::string pool_name, name;
  bool coalesce;
  std::string seqr_host;  // "" = none
  uint16_t seqr_port = 0;
  double seqr_timeout = 2.0;
  seqr::Auth seqr_auth;
  bool have_view = false;
  View view;
  std::deque<Entry> queue;
  size_t window = 0;  // the caller's bound on its entries in flight (0: not known)
  size_t held = 0;    // entries queued or in batches not yet done
  uint32_t batches_in_flight = 0;  // sequencer batches whose writes are not all done
  bool removed = false;
};

// One sequencer batch of one log: its writes, counted down as they finish.
struct Pipeline::Batch {
  Log* log;
  uint32_t ops_left;
};

// One authenticated connection to a sequencer, for one pool.
struct Pipeline::Sequencer {
  std::unique_ptr<seqr::Client> client;
};

// One class call in flight: a "write" of one entry, or a "write_many" of
// several entries of one object.
struct Pipeline::WriteOp {
  Pipeline* owner;
  Batch* batch;
  dp_pool* pool;
  std::string oid;
  uint64_t epoch;
  uint8_t format;
  std::vector<Entry> entries;
};

uint64_t View::object(uint64_t position) const {
  if (format != ZLOG_FORMAT_DATA) return position % width;
  const uint64_t span = uint64_t(width) * slots;
  const uint64_t stripe = (position - start) / span;
  return stripe * width + zlog_index_of(position, start + stripe * span, width, unit);
}

std::string View::oid_of(uint64_t object) const {
  const std::string index = std::to_string(object % width);
  if (format != ZLOG_FORMAT_DATA) return prefix + index;
  return prefix + "s" + std::to_string(object / width) + "." + index;
}

Pipeline::Pipeline(dp_cluster* cluster, dp_queue* results, Options options)
    : cluster_(cluster), results_(results), opt_(options) {
  sender_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "zlog-append");
    run();
  });
}

Pipeline::~Pipeline() {
  if (!close(60.0)) {
    // librados may still call back into this object: wait for it
    std::unique_lock<std::mutex> l(mu_);
    idle_.wait(l, [this] { return entries_ == 0; });
  }
  if (sender_.joinable()) sender_.join();
}

uint32_t Pipeline::add_log(dp_pool* pool, const std::string& pool_name, const std::string& name, bool coalesce,
                           size_t window) {
  auto log = std::make_unique<Log>();
  log->window = window;
  log->pool = pool;
  log->pool_name = pool_name;
  log->name = name;
  log->coalesce = coalesce;
  std::lock_guard<std::mutex> l(mu_);
  if (closing_) throw std::runtime_error("the append pipeline is closed");
  const uint32_t id = next_log_++;
  log->id = id;
  logs_.emplace(id, std::move(log));
  return id;
}

void Pipeline::set_sequencer(uint32_t id, const std::string& host, uint16_t port, double timeout_s,
                             const seqr::Auth& auth) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = logs_.find(id);
  if (it == logs_.end()) throw std::invalid_argument("no such log in the pipeline");
  it->second->seqr_host = host;
  it->second->seqr_port = port;
  it->second->seqr_timeout = timeout_s;
  it->second->seqr_auth = auth;
}

void Pipeline::set_view(uint32_t id, const View& view) {
  if (view.width == 0) throw std::invalid_argument("width must be at least 1");
  if (view.format == ZLOG_FORMAT_DATA && !zlog_geometry_ok(view.width, view.slots, view.unit))
    throw std::invalid_argument("a data-format view's geometry is out of range");
  std::lock_guard<std::mutex> l(mu_);
  auto it = logs_.find(id);
  if (it == logs_.end()) throw std::invalid_argument("no such log in the pipeline");
  it->second->view = view;
  it->second->have_view = true;
}

void Pipeline::remove_log(uint32_t id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = logs_.find(id);
  if (it == logs_.end()) return;
  it->second->removed = true;
  if (it->second->queue.empty() && it->second->batches_in_flight == 0) logs_.erase(it);
}

bool Pipeline::try_append(uint32_t id, uint64_t ticket, const char* data, uint32_t len) {
  Entry e{ticket, 0, std::string(data, len)};
  std::lock_guard<std::mutex> l(mu_);
  if (closing_) throw std::runtime_error("the append pipeline is closed");
  auto it = logs_.find(id);
  if (it == logs_.end() || it->second->removed) throw std::invalid_argument("no such log in the pipeline");
  if (!has_room(len)) return false;
  Log& log = *it->second;
  log.queue.push_back(std::move(e));
  ++log.held;
  ++entries_;
  bytes_ += len;
  ++queued_;
  // wake the sender when the log becomes ready to send; later entries ride along
  if ((log.queue.size() == 1 || log.batches_in_flight) && sendable(log)) work_.notify_one();
  return true;
}

bool Pipeline::sendable(const Log& log) const {
  if (log.queue.empty() || log.batches_in_flight >= opt_.max_batches_in_flight) return false;
  if (!log.batches_in_flight) return true;
  // a further batch goes once no more entries can join it: a whole batch, or
  // the caller's window full (it waits for room). Until then it fills, and
  // the OSD gets the next batch whole while it works on this one.
  return log.queue.size() >= opt_.max_batch || (log.window && log.held >= log.window);
}

bool Pipeline::has_room(uint32_t len) const {
  // an entry larger than the byte window still goes, alone
  return entries_ == 0 || (entries_ + 1 <= opt_.window_entries && bytes_ + len <= opt_.window_bytes);
}

bool Pipeline::wait_room(double timeout_s, uint32_t len) {
  std::unique_lock<std::mutex> l(mu_);
  // try_append's own test: waking on room for entries alone spun while the bytes were full
  return room_.wait_for(l, std::chrono::duration<double>(timeout_s),
                        [this, len] { return closing_ || has_room(len); }) &&
         !closing_;
}

void Pipeline::run() {
  std::vector<std::pair<Log*, std::vector<Entry>>> round;
  for (;;) {
    round.clear();
    {
      std::unique_lock<std::mutex> l(mu_);
      auto ready = [this] {
        for (auto& kv : logs_)
          if (sendable(*kv.second)) return true;
        return false;
      };
      work_.wait(l, [&] { return ready() || (closing_ && queued_ == 0); });
      if (!ready()) return;  // closing, and everything is sent
      if (opt_.linger_us && entries_ > queued_ && !closing_)
        work_.wait_for(l, std::chrono::microseconds(opt_.linger_us), [this] { return closing_; });
      for (auto& kv : logs_) {
        Log* log = kv.second.get();
        if (!sendable(*log)) continue;
        const size_t n = std::min<size_t>(log->queue.size(), opt_.max_batch);
        std::vector<Entry> batch;
        batch.reserve(n);
        for (size_t i = 0; i < n; ++i) {
          batch.push_back(std::move(log->queue.front()));
          log->queue.pop_front();
        }
        queued_ -= n;
        ++log->batches_in_flight;
        round.emplace_back(log, std::move(batch));
      }
    }
    send_round(round);
  }
}

// Positions for every batch of the round: one request per log, pipelined per
// sequencer; then the writes. A batch gets all its positions or none (then
// Python takes it over: it logs a sequencer that is down and refreshes a
// stale view).
void Pipeline::send_round(std::vector<std::pair<Log*, std::vector<Entry>>>& round) {
  struct Asked {
    Log* log;
    std::vector<Entry>* batch;
    View view;
    Sequencer* seqr;
  };
  std::vector<Asked> asked;
  std::vector<std::vector<Entry>*> back;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [log, batch] : round) {
      if (!log->have_view || log->seqr_host.empty()) {
        back.push_back(&batch);
        continue;
      }
      asked.push_back(Asked{log, &batch, log->view, nullptr});
    }
  }
  // the requests, one per log, all sent before any answer is read; a
  // connection is authenticated for one pool, so there is one per pool
  std::vector<std::pair<Sequencer*, Asked*>> sent;
  for (Asked& a : asked) {
    const std::string key =
        a.log->seqr_host + ":" + std::to_string(a.log->seqr_port) + "/" + a.log->seqr_auth.pool;
    auto& s = sequencers_[key];
    if (!s) s = std::make_unique<Sequencer>();
    try {
      if (!s->client)
        s->client = std::make_unique<seqr::Client>(a.log->seqr_host, a.log->seqr_port, a.log->seqr_timeout,
                                                   a.log->seqr_auth);
      // never more positions in one request than the sequencer allows: the
      // rest goes back to the front of the log's queue for the next round
      const uint32_t most = s->client->limits().max_count;
      if (most && a.batch->size() > most) requeue_front(a.log, *a.batch, most);
      s->client->send_request(seqr::OP_NEXT, a.log->pool_name, a.log->name, a.view.epoch,
                              static_cast<uint32_t>(a.batch->size()));
      a.seqr = s.get();
      sent.emplace_back(s.get(), &a);
    } catch (const std::exception&) {
      // down, timed out, or refused (seqr::AuthError): Python takes the batch
      // over and reports why through its own client
      s->client.reset();
      back.push_back(a.batch);
    }
  }
  for (auto& [s, a] : sent) {
    bool ok = false;
    uint64_t first = 0;
    if (s->client) {
      try {
        seqr::Response r = s->client->recv();
        {
          std::lock_guard<std::mutex> l(mu_);
          ++stats_.sequencer_requests;
        }
        ok = r.status == seqr::ST_OK && r.count == a->batch->size() && r.position >= a->view.start;
        first = r.position;
      } catch (const std::exception&) {
        s->client.reset();  // its other answers are lost with it: those batches go back too
      }
    }
    if (ok)
      write(a->log, a->view, first, *a->batch);
    else
      back.push_back(a->batch);
  }
  for (auto* batch : back) {
    Log* log = nullptr;
    for (auto& item : round)
      if (&item.second == batch) log = item.first;
    const size_t n = batch->size();
    hand_back(*batch);
    std::lock_guard<std::mutex> l(mu_);
    if (log) log->held -= n;
    if (log && --log->batches_in_flight < opt_.max_batches_in_flight) work_.notify_one();
  }
}

// Puts batch[keep:] back at the front of the log's queue, in order.
void Pipeline::requeue_front(Log* log, std::vector<Entry>& batch, size_t keep) {
  std::lock_guard<std::mutex> l(mu_);
  log->queue.insert(log->queue.begin(), std::make_move_iterator(batch.begin() + keep),
                    std::make_move_iterator(batch.end()));
  queued_ += batch.size() - keep;
  batch.resize(keep);
}

// Entries for one object go in one write_many (all or nothing; one call costs
// the OSD one header read and write for the lot).
void Pipeline::write(Log* log, const View& view, uint64_t first, std::vector<Entry>& batch) {
  // grouped by object number, each object's name made once (not once per entry)
  std::vector<std::pair<std::string, std::vector<Entry>>> by_object;
  std::unordered_map<uint64_t, size_t> index;
  for (size_t k = 0; k < batch.size(); ++k) {
    batch[k].position = first + k;
    const uint64_t object = view.object(batch[k].position);
    auto it = index.find(object);
    if (it == index.end()) {
      it = index.emplace(object, by_object.size()).first;
      by_object.emplace_back(view.oid_of(object), std::vector<Entry>());
    }
    by_object[it->second].second.push_back(std::move(batch[k]));
  }
  std::vector<std::pair<std::string, std::vector<Entry>>> calls;
  for (auto& [oid, entries] : by_object) {
    size_t i = 0;
    while (i < entries.size()) {
      std::vector<Entry> call;
      size_t bytes = 0;
      while (i < entries.size() &&
             (call.empty() || (log->coalesce && call.size() < ZLOG_MAX_BATCH_ENTRIES &&
                               bytes + entries[i].data.size() <= kMaxBytesPerCall))) {
        bytes += entries[i].data.size();
        call.push_back(std::move(entries[i++]));
      }
      calls.emplace_back(oid, std::move(call));
    }
  }
  auto* owner = new Batch{log, static_cast<uint32_t>(calls.size())};
  for (auto& [oid, call] : calls) submit(oid, log->pool, view.epoch, view.format, std::move(call), owner);
}

void Pipeline::submit(const std::string& oid, dp_pool* pool, uint64_t epoch, uint8_t format,
                      std::vector<Entry> entries, Batch* owner) {
  auto* op = new WriteOp{this, owner, pool, oid, epoch, format, std::move(entries)};
  const size_t n = op->entries.size();
  zlog_req req;
  std::memset(&req, 0, sizeof req);
  req.epoch = epoch;
  req.format = format;
  std::vector<uint64_t> positions;
  std::vector<const char*> datas;
  std::vector<uint32_t> lens;
  int zop = ZLOG_OP_WRITE;
  if (n == 1) {
    req.position = op->entries[0].position;
    req.data = op->entries[0].data.data();
    req.len = static_cast<uint32_t>(op->entries[0].data.size());
  } else {
    zop = ZLOG_OP_WRITE_MANY;
    for (auto& e : op->entries) {
      positions.push_back(e.position);
      datas.push_back(e.data.data());
      lens.push_back(static_cast<uint32_t>(e.data.size()));
    }
    req.count = static_cast<uint32_t>(n);
    req.positions = positions.data();
    req.datas = datas.data();
    req.lens = lens.data();
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.class_calls;
    stats_.entries_sent += n;
  }
  const int r = dp_submit_cb(cluster_, pool, op->oid.c_str(), zop, &req, &Pipeline::on_written, op);
  if (r < 0) written(op, r);  // not sent: report it like a completion
}

void Pipeline::on_written(void* arg, int code) {
  auto* op = static_cast<WriteOp*>(arg);
  op->owner->written(op, code);
}

void Pipeline::written(WriteOp* op, int code) {
  Batch* batch = op->batch;
  if (op->entries.size() > 1 && taken(code)) {
    // Some position of the batch was taken (a reader filled it, say). Store
    // the others where they are, one by one, rather than leave them as holes.
    {
      std::lock_guard<std::mutex> l(mu_);
      ++stats_.split_batches;
      batch->ops_left += static_cast<uint32_t>(op->entries.size()) - 1;
    }
    for (auto& e : op->entries) {
      std::vector<Entry> one;
      one.push_back(std::move(e));
      submit(op->oid, op->pool, op->epoch, op->format, std::move(one), batch);
    }
    delete op;
    return;
  }
  std::vector<uint64_t> tickets, positions;
  std::vector<int32_t> codes;
  size_t bytes = 0;
  for (const auto& e : op->entries) {
    tickets.push_back(e.ticket);
    positions.push_back(e.position);
    codes.push_back(code);
    bytes += e.data.size();
  }
  const size_t n = op->entries.size();
  delete op;
  post(tickets, codes, positions);
  bool batch_done;
  {
    std::lock_guard<std::mutex> l(mu_);
    batch->log->held -= n;
    batch_done = --batch->ops_left == 0;
    if (batch_done) {
      Log* log = batch->log;
      --log->batches_in_flight;
      if (!log->queue.empty()) work_.notify_one();
      if (log->removed && log->queue.empty() && log->batches_in_flight == 0) logs_.erase(log->id);
    }
  }
  if (batch_done) delete batch;
  entries_done(n, bytes);
}

void Pipeline::post(const std::vector<uint64_t>& tickets, const std::vector<int32_t>& codes,
                    const std::vector<uint64_t>& positions) {
  dp_post_many(results_, tickets.data(), codes.data(), positions.data(), tickets.size());
}

void Pipeline::hand_back(std::vector<Entry>& batch) {
  std::vector<uint64_t> tickets, positions(batch.size(), 0);
  std::vector<int32_t> codes(batch.size(), HANDED_BACK);
  size_t bytes = 0;
  for (const auto& e : batch) {
    tickets.push_back(e.ticket);
    bytes += e.data.size();
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    stats_.handed_back += batch.size();
  }
  post(tickets, codes, positions);
  entries_done(batch.size(), bytes);
}

void Pipeline::entries_done(size_t n, size_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  entries_ -= n;
  bytes_ -= bytes;
  room_.notify_all();
  if (entries_ == 0) idle_.notify_all();
}

bool Pipeline::close(double timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  if (closed_) return true;
  closing_ = true;  // no more appends; the sender sends what is queued, then ends
  work_.notify_all();
  room_.notify_all();
  if (!idle_.wait_for(l, std::chrono::duration<double>(timeout_s), [this] { return entries_ == 0; }))
    return false;
  closed_ = true;
  l.unlock();
  if (sender_.joinable()) sender_.join();
  sequencers_.clear();
  return true;
}

uint64_t Pipeline::in_flight() {
  std::lock_guard<std::mutex> l(mu_);
  return entries_;
}

Stats Pipeline::stats() {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace zlog_native
