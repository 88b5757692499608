#include "appender.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "client.h"
#include "protocol.h"
#include "wire.h"

namespace zlog_appender {

namespace {
// One sequencer request covers at most this many entries (the server's
// limit is 65536).
constexpr size_t kMaxBatch = 4096;
// Per write_many call: the class's entry limit, and the client's byte budget.
constexpr size_t kMaxEntriesPerCall = 1024;
constexpr size_t kMaxBytesPerCall = 8u << 20;
// Batch up (wait up to kLinger for kLingerBatch entries) only while at least
// kLingerAbove writes are in flight: then nobody waits on this entry alone.
constexpr uint64_t kLingerAbove = 16;
constexpr size_t kLingerBatch = 16;
constexpr auto kLinger = std::chrono::microseconds(500);

std::runtime_error rados_error(const std::string& what, int r) {
  return std::runtime_error(what + ": " + std::strerror(-r));
}
}  // namespace

// One class call in flight: a "write" of one entry, or a "write_many" of
// several entries of one object.
struct Appender::Op {
  Appender* owner;
  std::string oid;
  uint64_t epoch;
  std::vector<Entry> entries;
  ceph::bufferlist in, out;
};

Appender::Appender(const std::string& client, const std::string& conf_file,
                   const std::vector<std::pair<std::string, std::string>>& options, Target target,
                   bool coalesce)
    : target_(std::move(target)), coalesce_(coalesce) {
  int r = rados_.init2(client.c_str(), "ceph", 0);
  if (r < 0) throw rados_error("rados init as " + client, r);
  auto fail = [this](const std::string& what, int r) {
    rados_.shutdown();
    return rados_error(what, r);
  };
  if (!conf_file.empty() && (r = rados_.conf_read_file(conf_file.c_str())) < 0)
    throw fail("reading " + conf_file, r);
  for (const auto& [key, value] : options)
    if ((r = rados_.conf_set(key.c_str(), value.c_str())) < 0) throw fail("setting " + key, r);
  if ((r = rados_.connect()) < 0) throw fail("connecting to the cluster", r);
  if ((r = rados_.ioctx_create(target_.pool.c_str(), ioctx_)) < 0)
    throw fail("opening pool " + target_.pool, r);
  dispatcher_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "zlog-appender");
    dispatch();
  });
}

Appender::~Appender() {
  if (!close(60.0)) {
    // librados may still call back into this object: wait for it
    std::unique_lock<std::mutex> l(mu_);
    idle_.wait(l, [this] { return in_flight_ == 0; });
    l.unlock();
    close(0);
  }
}

void Appender::set_view(uint64_t epoch, const std::string& oid_prefix, uint32_t width,
                        uint64_t start) {
  if (width == 0) throw std::invalid_argument("width must be at least 1");
  std::lock_guard<std::mutex> l(mu_);
  epoch_ = epoch;
  oid_prefix_ = oid_prefix;
  width_ = width;
  start_ = start;
  have_view_ = true;
}

void Appender::append(uint64_t ticket, const char* data, uint32_t len) {
  Entry q{ticket, 0, {}};
  q.data.append(data, len);
  std::lock_guard<std::mutex> l(mu_);
  if (closing_) throw std::runtime_error("appender is closed");
  queue_.push_back(std::move(q));
  ++in_flight_;
  if (queue_.size() == 1 || queue_.size() == kLingerBatch) work_.notify_one();
}

void Appender::dispatch() {
  std::vector<Entry> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      work_.wait(l, [this] { return !queue_.empty() || closing_; });
      if (queue_.empty()) return;  // closing, and everything is sent
      // With many writes already out, sending this entry a moment later costs
      // no throughput; waiting for company costs one sequencer request and
      // one wakeup per batch instead of per entry.
      if (in_flight_ - queue_.size() >= kLingerAbove && !closing_)
        work_.wait_for(l, kLinger, [this] { return queue_.size() >= kLingerBatch || closing_; });
      const size_t n = std::min(queue_.size(), max_batch_);
      batch.clear();
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    send(batch);
  }
}

void Appender::send(std::vector<Entry>& batch) {
  std::unique_lock<std::mutex> l(mu_);
  const bool have_view = have_view_;
  const uint64_t epoch = epoch_, start = start_;
  const uint32_t width = width_;
  const std::string prefix = oid_prefix_;
  l.unlock();

  // Positions for the whole batch, or none: then Python takes it over (it
  // logs a sequencer that is down, and refreshes a stale view).
  bool have_positions = false;
  uint64_t first = 0;
  if (have_view) {
    try {
      if (!seqr_) {
        seqr_ = std::make_unique<seqr::Client>(target_.seqr_host, target_.seqr_port,
                                               target_.seqr_timeout_s, target_.seqr_auth);
        // never ask for more positions at once than the sequencer allows this connection
        const uint32_t most = seqr_->limits().max_count;
        max_batch_ = most ? std::min<size_t>(kMaxBatch, most) : kMaxBatch;
      }
      seqr::Response r = seqr_->next(target_.pool, target_.log, epoch,
                                     static_cast<uint32_t>(batch.size()));
      l.lock();
      ++stats_.sequencer_requests;
      l.unlock();
      have_positions = r.status == seqr::ST_OK && r.count == batch.size() && r.position >= start;
      first = r.position;
    } catch (const std::exception&) {
      seqr_.reset();
    }
  }
  if (!have_positions) {
    std::vector<Completed> back;
    back.reserve(batch.size());
    for (auto& q : batch) back.push_back({q.ticket, 0, HANDED_BACK});
    l.lock();
    stats_.handed_back += back.size();
    l.unlock();
    finish(back);
    return;
  }
  // Entries for one object go in one write_many (all or nothing; one call
  // costs the OSD one header read and write for the lot).
  std::vector<std::vector<Entry>> by_object(std::min<size_t>(width, batch.size()));
  for (size_t k = 0; k < batch.size(); ++k) {
    batch[k].position = first + k;
    by_object[k % by_object.size()].push_back(std::move(batch[k]));
  }
  for (auto& entries : by_object) {
    const std::string oid = prefix + std::to_string(entries.front().position % width);
    size_t i = 0;
    while (i < entries.size()) {
      std::vector<Entry> call;
      size_t bytes = 0;
      while (i < entries.size() && (call.empty() || (coalesce_ && call.size() < kMaxEntriesPerCall &&
                                                     bytes + entries[i].data.length() <= kMaxBytesPerCall))) {
        bytes += entries[i].data.length();
        call.push_back(std::move(entries[i++]));
      }
      submit(oid, epoch, std::move(call));
    }
  }
}

void Appender::submit(const std::string& oid, uint64_t epoch, std::vector<Entry> entries) {
  auto* op = new Op{this, oid, epoch, std::move(entries), {}, {}};
  const bool many = op->entries.size() > 1;
  zlog_wire::put_u64(op->in, epoch);
  if (many) zlog_wire::put_u32(op->in, op->entries.size());
  for (auto& e : op->entries) {
    zlog_wire::put_u64(op->in, e.position);
    zlog_wire::put_u32(op->in, e.data.length());
    op->in.append(e.data);  // shares the buffer, no copy
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.class_calls;
    stats_.entries_sent += op->entries.size();
  }
  librados::AioCompletion* c = librados::Rados::aio_create_completion(op, &Appender::on_complete);
  const int r = ioctx_.aio_exec(oid, c, "zlog", many ? "write_many" : "write", op->in, &op->out);
  if (r < 0) {  // not sent: report it like a completion
    c->release();
    complete(op, r);
  }
}

void Appender::on_complete(librados::completion_t c, void* arg) {
  const int r = rados_aio_get_return_value(static_cast<rados_completion_t>(c));
  // librados keeps its own reference while this callback runs
  rados_aio_release(static_cast<rados_completion_t>(c));
  auto* op = static_cast<Op*>(arg);
  op->owner->complete(op, r < 0 ? r : 0);
}

void Appender::complete(Op* op, int r) {
  if (op->entries.size() > 1 && (r == -EROFS || r == -ENOMSG || r == -EIDRM)) {
    // Some position of the batch was taken (a reader filled it, say). Store
    // the others where they are, one by one, rather than leave them as holes.
    {
      std::lock_guard<std::mutex> l(mu_);
      ++stats_.split_batches;
    }
    for (auto& e : op->entries) {
      std::vector<Entry> one;
      one.push_back(std::move(e));
      submit(op->oid, op->epoch, std::move(one));
    }
    delete op;
    return;
  }
  std::vector<Completed> out;
  out.reserve(op->entries.size());
  for (const auto& e : op->entries) out.push_back({e.ticket, e.position, r});
  delete op;
  finish(out);
}

void Appender::finish(std::vector<Completed>& out) {
  std::lock_guard<std::mutex> l(mu_);
  done_.insert(done_.end(), out.begin(), out.end());
  in_flight_ -= out.size();
  if (in_flight_ == 0) idle_.notify_all();
  ready_.notify_one();
}

std::vector<Completed> Appender::wait(size_t max_items, double timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  ready_.wait_for(l, std::chrono::duration<double>(timeout_s),
                  [this] { return !done_.empty() || closed_; });
  const size_t n = std::min(max_items, done_.size());
  std::vector<Completed> out(done_.begin(), done_.begin() + n);
  done_.erase(done_.begin(), done_.begin() + n);
  return out;
}

bool Appender::close(double timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  if (closed_) return true;
  closing_ = true;  // no more appends; the dispatcher sends what is queued, then ends
  work_.notify_all();
  if (!idle_.wait_for(l, std::chrono::duration<double>(timeout_s),
                      [this] { return in_flight_ == 0; }))
    return false;
  closed_ = true;
  ready_.notify_all();
  l.unlock();
  if (dispatcher_.joinable()) dispatcher_.join();
  seqr_.reset();
  ioctx_.close();
  rados_.shutdown();
  return true;
}

uint64_t Appender::in_flight() {
  std::lock_guard<std::mutex> l(mu_);
  return in_flight_;
}

Stats Appender::stats() {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace zlog_appender
