// pybind11 bindings: the pyzlog._seqr extension module.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <boost/system/system_error.hpp>

#include "auth_py.h"
#include "client.h"
#include "frame_server.h"
#include "log.h"
#include "seqr_server.h"

namespace py = pybind11;
using namespace seqr;

namespace {

py::tuple resp4(const Response& r) {
  return py::make_tuple(int(r.status), r.epoch, r.position, r.count);
}

py::dict pipeline_dict(const PipelineResult& r, bool with_statuses) {
  py::dict d;
  d["requests"] = r.requests;
  if (with_statuses) {
    d["ok"] = r.ok;
    d["stale"] = r.stale;
    d["retry"] = r.retry;
    d["bad_request"] = r.bad_request;
    d["recovery_failed"] = r.recovery_failed;
    d["other"] = r.other;
    d["not_authorised"] = r.not_authorised;
    d["rate_limited"] = r.rate_limited;
    d["positions"] = r.positions;
    d["first_position"] = r.have_positions ? py::object(py::int_(r.first_position)) : py::none();
    d["last_position"] = r.have_positions ? py::object(py::int_(r.last_position)) : py::none();
    d["ascending"] = r.ascending;
  }
  d["bytes_sent"] = r.bytes_sent;
  d["bytes_received"] = r.bytes_received;
  d["elapsed_s"] = r.elapsed_s;
  const double el = r.elapsed_s > 0 ? r.elapsed_s : 1e-9;
  d["requests_per_s"] = double(r.requests) / el;
  if (with_statuses) d["positions_per_s"] = double(r.positions) / el;
  if (with_statuses && !r.ranges.empty()) {
    py::list l(r.ranges.size());
    for (size_t i = 0; i < r.ranges.size(); ++i)
      l[i] = py::make_tuple(r.ranges[i].first, r.ranges[i].second);
    d["ranges"] = l;
  } else if (with_statuses) {
    d["ranges"] = py::list();
  }
  return d;
}

PyObject* g_auth_error = nullptr;  // pyzlog._seqr.AuthError

}  // namespace

PYBIND11_MODULE(_seqr, m) {
  m.doc() = "pyzlog sequencer: C++/Asio server, blocking client and echo baseline";

  m.attr("OK") = int(ST_OK);
  m.attr("OP_STREAM_NEXT") = int(OP_STREAM_NEXT);
  m.attr("OP_STREAM_TAIL") = int(OP_STREAM_TAIL);
  m.attr("OP_STREAM_HISTORY") = int(OP_STREAM_HISTORY);
  m.attr("MAX_STREAM_HISTORY") = kMaxStreamHistory;
  m.attr("MAX_HISTORY_PER_REQUEST") = kMaxHistoryPerRequest;
  m.attr("STREAM_HISTORY_BUDGET") = kStreamHistoryBudget;
  m.attr("STREAM_BACKPOINTERS") = int(kStreamBackpointers);
  m.attr("STREAM_FIRST_LEVEL") = int(kStreamFirstLevel);
  m.attr("MAX_STREAMS_PER_REQUEST") = int(kMaxStreamsPerRequest);
  m.attr("STALE_EPOCH") = int(ST_STALE_EPOCH);
  m.attr("RETRY") = int(ST_RETRY);
  m.attr("BAD_REQUEST") = int(ST_BAD_REQUEST);
  m.attr("RECOVERY_FAILED") = int(ST_RECOVERY_FAILED);
  m.attr("NOT_AUTHORISED") = int(ST_NOT_AUTHORISED);
  m.attr("RATE_LIMITED") = int(ST_RATE_LIMITED);
  m.attr("AUTH_REQUIRED") = int(ST_AUTH_REQUIRED);
  m.attr("AUTH_FAILED") = int(ST_AUTH_FAILED);
  m.attr("NOT_SERVED") = int(ST_NOT_SERVED);
  m.attr("BAD_VERSION") = int(ST_BAD_VERSION);
  m.attr("TLS_REQUIRED") = int(ST_TLS_REQUIRED);
  m.attr("BAD_HANDSHAKE") = int(ST_BAD_HANDSHAKE);
  m.attr("OP_NEXT") = int(OP_NEXT);
  m.attr("OP_TAIL") = int(OP_TAIL);
  m.attr("OP_HELLO") = int(OP_HELLO);
  m.attr("OP_CHALLENGE") = int(OP_CHALLENGE);
  m.attr("OP_PROOF") = int(OP_PROOF);
  m.attr("OP_WELCOME") = int(OP_WELCOME);
  m.attr("PROTOCOL_VERSION") = int(kProtocolVersion);
  m.attr("REASON_UNKNOWN_GENERATION") = int(REASON_UNKNOWN_GENERATION);
  m.attr("REASON_WRONG_PROOF") = int(REASON_WRONG_PROOF);
  {
    py::dict names;
    names[py::int_(int(ST_OK))] = "OK";
    names[py::int_(int(ST_STALE_EPOCH))] = "STALE_EPOCH";
    names[py::int_(int(ST_RETRY))] = "RETRY";
    names[py::int_(int(ST_BAD_REQUEST))] = "BAD_REQUEST";
    names[py::int_(int(ST_RECOVERY_FAILED))] = "RECOVERY_FAILED";
    names[py::int_(int(ST_NOT_AUTHORISED))] = "NOT_AUTHORISED";
    names[py::int_(int(ST_RATE_LIMITED))] = "RATE_LIMITED";
    names[py::int_(int(ST_AUTH_REQUIRED))] = "AUTH_REQUIRED";
    names[py::int_(int(ST_AUTH_FAILED))] = "AUTH_FAILED";
    names[py::int_(int(ST_NOT_SERVED))] = "NOT_SERVED";
    names[py::int_(int(ST_BAD_VERSION))] = "BAD_VERSION";
    names[py::int_(int(ST_TLS_REQUIRED))] = "TLS_REQUIRED";
    names[py::int_(int(ST_BAD_HANDSHAKE))] = "BAD_HANDSHAKE";
    m.attr("STATUS_NAMES") = names;
  }
  {
    py::list kinds;
    for (const char* k : kRefusalNames) kinds.append(k);
    m.attr("REFUSAL_KINDS") = kinds;
  }
  // The handshake failed; .status, .reason, .server_generation say how.
  g_auth_error = PyErr_NewExceptionWithDoc(
      "pyzlog._seqr.AuthError",
      "The sequencer handshake failed: the server refused this client, or the client the server.",
      PyExc_Exception, nullptr);
  m.attr("AuthError") = py::handle(g_auth_error);
  m.attr("DEFAULT_MAX_FRAME") = kDefaultMaxFrame;
  m.attr("DEFAULT_MAX_NAME") = kDefaultMaxName;
  m.attr("DEFAULT_MAX_CONNECTIONS") = kDefaultMaxConnections;
  m.attr("DEFAULT_MAX_COUNT") = kDefaultMaxCount;
  m.attr("REQUEST_MIN_PAYLOAD") = kReqMinPayload;
  m.attr("RESPONSE_PAYLOAD") = kRespPayload;

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const seqr::AuthError& e) {
      py::object exc = py::reinterpret_borrow<py::object>(g_auth_error)(e.what());
      exc.attr("status") = int(e.status);
      exc.attr("reason") = int(e.reason);
      exc.attr("server_generation") = e.server_generation;
      PyErr_SetObject(g_auth_error, exc.ptr());
    } catch (const seqr::TimeoutError& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    } catch (const seqr::ConnectionError& e) {
      PyObject* t = PyExc_ConnectionError;
      switch (e.kind) {
        case ConnectionError::REFUSED: t = PyExc_ConnectionRefusedError; break;
        case ConnectionError::RESET: t = PyExc_ConnectionResetError; break;
        case ConnectionError::ABORTED: t = PyExc_ConnectionAbortedError; break;
        case ConnectionError::BROKEN_PIPE: t = PyExc_BrokenPipeError; break;
        default: break;
      }
      PyErr_SetString(t, e.what());
    } catch (const boost::system::system_error& e) {
      PyErr_SetObject(PyExc_OSError,
                      py::make_tuple(e.code().value(), std::string(e.what())).ptr());
    } catch (const std::system_error& e) {
      PyErr_SetObject(PyExc_OSError,
                      py::make_tuple(e.code().value(), std::string(e.what())).ptr());
    }
  });

  m.def("set_log_level", &seqr::set_log_level, py::arg("level"),
        "Set the C++ log level: debug, info, warning (default), error or off.");
  m.def("get_log_level", &seqr::get_log_level);

  py::class_<Server>(m, "Server")
      .def(py::init([](std::string host, uint16_t port, uint32_t max_connections, uint32_t max_frame,
                       uint32_t max_name, uint32_t max_count, bool require_auth, std::string tls_cert,
                       std::string tls_key, double handshake_timeout_s, uint32_t max_rate,
                       uint32_t max_outstanding) {
             auto s = std::make_unique<Server>(std::move(host), port, max_connections, max_frame,
                                               max_name, max_count, require_auth,
                                               TlsFiles{std::move(tls_cert), std::move(tls_key)},
                                               handshake_timeout_s);
             s->set_limits(max_rate, max_outstanding);
             return s;
           }),
           py::arg("host") = "127.0.0.1", py::arg("port") = 0,
           py::arg("max_connections") = kDefaultMaxConnections,
           py::arg("max_frame") = kDefaultMaxFrame, py::arg("max_name") = kDefaultMaxName,
           py::arg("max_count") = kDefaultMaxCount, py::kw_only(), py::arg("require_auth") = true,
           py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("handshake_timeout_s") = 5.0,
           py::arg("max_rate") = 0, py::arg("max_outstanding") = 0,
           "A sequencer server. require_auth: connections prove they hold a served pool's key "
           "(set_pool); tls_cert/tls_key: TLS, and plaintext connections refused; max_rate, "
           "max_outstanding: the per-connection position budget (0: none).")
      .def("start", &Server::start, py::call_guard<py::gil_scoped_release>())
      .def("stop", &Server::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &Server::port)
      .def_property_readonly("host", &Server::host)
      .def_property_readonly("running", &Server::running)
      .def_property_readonly("max_connections", &Server::max_connections)
      .def_property_readonly("max_frame", &Server::max_frame)
      .def_property_readonly("max_name", &Server::max_name)
      .def_property_readonly("max_count", &Server::max_count)
      .def_property_readonly("require_auth", &Server::require_auth)
      .def_property_readonly("tls", &Server::tls_enabled)
      .def_property_readonly("max_rate", &Server::max_rate)
      .def_property_readonly("max_outstanding", &Server::max_outstanding)
      .def(
          "set_pool",
          [](Server& s, const std::string& pool, const std::vector<std::pair<uint32_t, py::bytes>>& keys) {
            std::vector<std::pair<uint32_t, std::string>> v;
            for (const auto& k : keys) v.emplace_back(k.first, std::string(k.second));
            py::gil_scoped_release rel;
            return s.set_pool(pool, v);
          },
          py::arg("pool"), py::arg("keys"),
          "Serve `pool` with these (generation, secret) keys (the highest generation is the "
          "current one); returns how many connections of a dropped generation were closed.")
      .def("remove_pool", &Server::remove_pool, py::arg("pool"), py::call_guard<py::gil_scoped_release>())
      .def("pools",
           [](Server& s) {
             std::vector<std::pair<std::string, std::vector<uint32_t>>> v;
             {
               py::gil_scoped_release rel;
               v = s.pools();
             }
             py::dict d;
             for (auto& [name, gens] : v) d[py::str(name)] = gens;
             return d;
           },
           "{pool: [key generations accepted, newest first]}")
      .def("set_limits", &Server::set_limits, py::arg("max_rate"), py::arg("max_outstanding"),
           py::call_guard<py::gil_scoped_release>())
      .def("install", &Server::install, py::arg("pool"), py::arg("log"), py::arg("epoch"),
           py::arg("next_position"), py::call_guard<py::gil_scoped_release>())
      .def("fail", &Server::fail, py::arg("pool"), py::arg("log"), py::arg("message") = "",
           py::call_guard<py::gil_scoped_release>())
      .def("forget", &Server::forget, py::arg("pool"), py::arg("log"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "wait_recovery",
          [](Server& s, double timeout_s) {
            std::vector<RecoveryRequest> v;
            {
              py::gil_scoped_release rel;
              v = s.wait_recovery(timeout_s);
            }
            py::list l;
            for (auto& r : v) l.append(py::make_tuple(r.pool, r.log, r.epoch));
            return l;
          },
          py::arg("timeout_s") = 1.0)
      .def("stats",
           [](const Server& s) {
             ServerStats st = s.stats();
             py::dict d;
             d["requests"] = st.requests;
             d["positions"] = st.positions;
             d["connections_open"] = st.connections_open;
             d["connections_total"] = st.connections_total;
             d["connections_rejected"] = st.connections_rejected;
             d["bad_frames"] = st.bad_frames;
             d["bad_requests"] = st.bad_requests;
             d["stale"] = st.stale;
             d["retries"] = st.retries;
             d["recovery_failed"] = st.recovery_failed;
             d["recoveries_queued"] = st.recoveries_queued;
             d["logs"] = st.logs;
             d["auth_ok"] = st.auth_ok;
             d["not_authorised"] = st.not_authorised;
             d["rate_limited"] = st.rate_limited;
             d["handshake_timeouts"] = st.handshake_timeouts;
             d["revoked"] = st.revoked;
             d["connections_tls"] = st.connections_tls;
             d["tls_failures"] = st.tls_failures;
             d["probes"] = st.probes;
             d["stream_history_positions"] = st.stream_history_positions;
             py::dict refused;
             for (int i = 0; i < REFUSAL_KINDS; ++i) refused[kRefusalNames[i]] = st.refused[i];
             d["refused"] = refused;
             return d;
           })
      .def("latency",
           [](const Server& s) {
             const LatencyStats l = s.latency();
             py::list bounds, buckets;
             for (uint64_t b : kLatencyBoundsUs) bounds.append(double(b) / 1e6);
             for (size_t i = 0; i < kLatencyBuckets; ++i) buckets.append(l.buckets[i]);
             py::dict d;
             d["bounds_s"] = bounds;  // upper bounds; the last bucket is above them all
             d["buckets"] = buckets;  // requests per bucket, not cumulative
             d["sum_s"] = double(l.sum_ns) / 1e9;
             d["count"] = l.count;
             return d;
           },
           "Request latency in the server: from a batch's bytes arriving to its answers queued.")
      .def("logs",
           [](Server& s) {
             std::vector<LogInfo> v;
             {
               py::gil_scoped_release rel;
               v = s.logs();
             }
             py::list l;
             for (auto& i : v) {
               py::dict d;
               d["pool"] = i.pool;
               d["log"] = i.log;
               d["state"] = i.state;
               d["epoch"] = i.epoch;
               d["next"] = i.next;
               d["streams"] = i.streams;
               d["streams_from"] = i.streams_from;
               d["message"] = i.message;
               d["requests"] = i.requests;
               d["positions"] = i.positions;
               d["stale"] = i.stale;
               d["retries"] = i.retries;
               d["recovery_failed"] = i.recovery_failed;
               l.append(d);
             }
             return l;
           })
      .def("set_log_level", [](Server&, const std::string& lvl) { seqr::set_log_level(lvl); })
      .def("__enter__", [](Server& s) -> Server& {
             if (!s.running()) {
               py::gil_scoped_release rel;
               s.start();
             }
             return s;
           }, py::return_value_policy::reference)
      .def("__exit__", [](Server& s, py::args) {
             py::gil_scoped_release rel;
             s.stop();
           })
      .def("__repr__", [](const Server& s) {
        return "<pyzlog._seqr.Server " + s.host() + ":" + std::to_string(s.port()) +
               (s.running() ? " running>" : " stopped>");
      });

  py::class_<EchoServer>(m, "EchoServer")
      .def(py::init<std::string, uint16_t>(), py::arg("host") = "127.0.0.1",
           py::arg("port") = 0)
      .def("start", &EchoServer::start, py::call_guard<py::gil_scoped_release>())
      .def("stop", &EchoServer::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &EchoServer::port)
      .def_property_readonly("running", &EchoServer::running)
      .def_property_readonly("frames", &EchoServer::frames)
      .def("__enter__", [](EchoServer& s) -> EchoServer& {
             if (!s.running()) {
               py::gil_scoped_release rel;
               s.start();
             }
             return s;
           }, py::return_value_policy::reference)
      .def("__exit__", [](EchoServer& s, py::args) {
        py::gil_scoped_release rel;
        s.stop();
      });

  py::class_<Client>(m, "Client")
      .def(py::init([](const std::string& host, uint16_t port, double timeout_s, const py::object& auth) {
             const Auth a = auth_from_py(auth);
             py::gil_scoped_release rel;
             return new Client(host, port, timeout_s, a);
           }),
           py::arg("host"), py::arg("port"), py::arg("timeout_s") = 5.0, py::arg("auth") = py::none(),
           "Connect, and with auth (a dict: pool, keys [(generation, secret)], insecure, tls, "
           "tls_ca, tls_server_name) run the handshake; AuthError if either side refuses.")
      .def_property_readonly("pool", &Client::pool)
      .def_property_readonly("generation", &Client::generation)
      .def_property_readonly("authenticated", &Client::authenticated)
      .def_property_readonly("tls", &Client::tls)
      .def_property_readonly("limits",
                             [](const Client& c) {
                               py::dict d;
                               d["max_count"] = c.limits().max_count;
                               d["max_outstanding"] = c.limits().max_outstanding;
                               d["max_rate"] = c.limits().max_rate;
                               return d;
                             })
      .def(
          "next",
          [](Client& c, const std::string& pool, const std::string& log, uint64_t epoch,
             uint32_t count) {
            Response r;
            {
              py::gil_scoped_release rel;
              r = c.next(pool, log, epoch, count);
            }
            return resp4(r);
          },
          py::arg("pool"), py::arg("log"), py::arg("epoch"), py::arg("count") = 1)
      .def(
          "tail",
          [](Client& c, const std::string& pool, const std::string& log, uint64_t epoch) {
            Response r;
            {
              py::gil_scoped_release rel;
              r = c.tail(pool, log, epoch);
            }
            return resp4(r);
          },
          py::arg("pool"), py::arg("log"), py::arg("epoch"))
      .def(
          "streams",
          [](Client& c, const std::string& pool, const std::string& log, uint64_t epoch,
             uint32_t count, const std::vector<uint64_t>& ids, uint32_t history) {
            StreamResponse r;
            {
              py::gil_scoped_release rel;
              r = c.streams(pool, log, epoch, count, ids, history);
            }
            py::list streams;
            for (const auto& b : r.streams) {
              if (history)
                streams.append(py::make_tuple(b.stream, b.horizon, py::cast(b.positions), b.ordinal,
                                              py::cast(b.levels), py::cast(b.history)));
              else
                streams.append(py::make_tuple(b.stream, b.horizon, py::cast(b.positions), b.ordinal,
                                              py::cast(b.levels)));
            }
            return py::make_tuple(int(r.response.status), r.response.epoch, r.response.position,
                                  r.response.count, int(r.max_backpointers), streams);
          },
          py::arg("pool"), py::arg("log"), py::arg("epoch"), py::arg("count"), py::arg("streams"),
          py::arg("history") = 0,
          "STREAM_NEXT (count >= 1) or STREAM_TAIL (count 0): (status, epoch, position, count, K, "
          "[(stream, horizon, [positions, newest first], ordinal, [(level, position)])]) "
          "(docs/seqr-protocol.md, \"Streams\"); with history >= 1 (count 0), STREAM_HISTORY: each "
          "stream's tuple ends with [its last positions, newest first].")
      .def(
          "send_next",
          [](Client& c, const std::string& pool, const std::string& log, uint64_t epoch,
             uint32_t count) {
            py::gil_scoped_release rel;
            return c.send_request(OP_NEXT, pool, log, epoch, count);
          },
          py::arg("pool"), py::arg("log"), py::arg("epoch"), py::arg("count") = 1)
      .def(
          "send_tail",
          [](Client& c, const std::string& pool, const std::string& log, uint64_t epoch) {
            py::gil_scoped_release rel;
            return c.send_request(OP_TAIL, pool, log, epoch, 0);
          },
          py::arg("pool"), py::arg("log"), py::arg("epoch"))
      .def(
          "send_request",
          [](Client& c, int op, const std::string& pool, const std::string& log,
             uint64_t epoch, uint32_t count) {
            if (op < 0 || op > 255) throw std::invalid_argument("op must be 0..255");
            py::gil_scoped_release rel;
            return c.send_request(static_cast<uint8_t>(op), pool, log, epoch, count);
          },
          py::arg("op"), py::arg("pool"), py::arg("log"), py::arg("epoch"),
          py::arg("count"),
          "Send any request (also invalid ones, for tests); returns its request id.")
      .def("recv",
           [](Client& c) {
             Response r;
             {
               py::gil_scoped_release rel;
               r = c.recv();
             }
             return py::make_tuple(r.request_id, int(r.status), r.epoch, r.position, r.count);
           })
      .def(
          "pipeline_next",
          [](Client& c, const std::string& pool, const std::string& log, uint64_t epoch,
             uint32_t count_per_request, uint64_t total_requests, uint32_t depth,
             bool collect) {
            PipelineResult r;
            {
              py::gil_scoped_release rel;
              r = c.pipeline_next(pool, log, epoch, count_per_request, total_requests, depth,
                                  collect);
            }
            return pipeline_dict(r, true);
          },
          py::arg("pool"), py::arg("log"), py::arg("epoch"), py::arg("count_per_request") = 1,
          py::arg("total_requests") = 100000, py::arg("depth") = 64,
          py::arg("collect") = false)
      .def(
          "pipeline_echo",
          [](Client& c, uint32_t frame_size, uint64_t total_requests, uint32_t depth) {
            PipelineResult r;
            {
              py::gil_scoped_release rel;
              r = c.pipeline_echo(frame_size, total_requests, depth);
            }
            return pipeline_dict(r, false);
          },
          py::arg("frame_size"), py::arg("total_requests") = 100000, py::arg("depth") = 64)
      .def(
          "send_raw",
          [](Client& c, py::bytes data) {
            std::string s = data;
            py::gil_scoped_release rel;
            c.send_raw(s);
          },
          py::arg("data"))
      .def(
          "recv_raw",
          [](Client& c, size_t max_bytes, double timeout_s) {
            std::string s;
            {
              py::gil_scoped_release rel;
              s = c.recv_raw(max_bytes, timeout_s);
            }
            return py::bytes(s);
          },
          py::arg("max_bytes") = 65536, py::arg("timeout_s") = 1.0)
      .def("close", &Client::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("closed", &Client::closed)
      .def_property("timeout_s", &Client::timeout, &Client::set_timeout)
      .def("__enter__", [](Client& c) -> Client& { return c; },
           py::return_value_policy::reference)
      .def("__exit__", [](Client& c, py::args) { c.close(); });
}
