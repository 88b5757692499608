// pybind11 bindings: pyzlog._appender, the append pipeline of a data-plane
// connection. The connection and its completion queue come from the cffi
// module pyzlog._dataplane as addresses (both modules link the one
// libzlog_dataplane, so they are the same objects).
#include <pybind11/pybind11.h>

#include <cstdint>

#include "appender.h"
#include "appender_hot.h"
#include "auth_py.h"

namespace py = pybind11;
using zlog_native::Options;
using zlog_native::Pipeline;

namespace {
template <typename T>
T* from_address(uintptr_t address) {
  if (!address) throw std::invalid_argument("null data-plane handle");
  return reinterpret_cast<T*>(address);
}
}  // namespace

PYBIND11_MODULE(_appender, m) {
  m.doc() = "pyzlog's C++ append pipeline (sequencer + cls_zlog writes on the native data plane)";
  m.attr("HANDED_BACK") = zlog_native::HANDED_BACK;

  py::class_<Pipeline>(m, "Pipeline")
      .def(py::init([](uintptr_t cluster, uintptr_t results, size_t window_entries, size_t window_bytes,
                       uint32_t max_batch, uint32_t max_batches_in_flight, uint32_t linger_us) {
             Options o;
             o.window_entries = window_entries;
             o.window_bytes = window_bytes;
             o.max_batch = max_batch;
             o.max_batches_in_flight = max_batches_in_flight;
             o.linger_us = linger_us;
             return new Pipeline(from_address<dp_cluster>(cluster), from_address<dp_queue>(results), o);
           }),
           py::arg("cluster"), py::arg("results"), py::arg("window_entries") = 1 << 16,
           py::arg("window_bytes") = 256u << 20, py::arg("max_batch") = 4096, py::arg("max_batches_in_flight") = 2,
           py::arg("linger_us") = 0)
      .def(
          "add_log",
          [](Pipeline& self, uintptr_t pool, const std::string& pool_name, const std::string& name, bool coalesce,
             size_t window) {
            return self.add_log(from_address<dp_pool>(pool), pool_name, name, coalesce, window);
          },
          py::arg("pool"), py::arg("pool_name"), py::arg("name"), py::arg("coalesce") = true,
          py::arg("window") = 0)
      .def(
          "set_sequencer",
          [](Pipeline& self, uint32_t log, const std::string& host, uint16_t port, double timeout_s,
             const py::object& auth) { self.set_sequencer(log, host, port, timeout_s, seqr::auth_from_py(auth)); },
          py::arg("log"), py::arg("host"), py::arg("port"), py::arg("timeout_s"), py::arg("auth") = py::none())
      .def(
          "set_view",
          [](Pipeline& self, uint32_t log, uint64_t epoch, const std::string& oid_prefix, uint32_t width,
             uint64_t start, uint8_t format, uint32_t slots, uint32_t unit) {
            zlog_native::View v;
            v.epoch = epoch;
            v.prefix = oid_prefix;
            v.width = width;
            v.start = start;
            v.format = format;
            v.slots = slots;
            v.unit = unit;
            self.set_view(log, v);
          },
          py::arg("log"), py::arg("epoch"), py::arg("oid_prefix"), py::arg("width"), py::arg("start"),
          py::arg("format") = static_cast<uint8_t>(ZLOG_FORMAT_OMAP), py::arg("slots") = 0u,
          py::arg("unit") = 1u)
      .def("remove_log", &Pipeline::remove_log, py::arg("log"))
      .def(
          "append",
          [](Pipeline& self, uint32_t log, uint64_t ticket, const py::bytes& data) {
            char* p;
            Py_ssize_t n;
            if (PyBytes_AsStringAndSize(data.ptr(), &p, &n) < 0) throw py::error_already_set();
            while (!self.try_append(log, ticket, p, static_cast<uint32_t>(n))) {
              // the connection's window is full: wait for room without the GIL
              py::gil_scoped_release nogil;
              self.wait_room(0.2, static_cast<uint32_t>(n));
            }
          },
          py::arg("log"), py::arg("ticket"), py::arg("data"),
          "Queue one stored entry; its outcome is posted to the results queue under `ticket`.")
      .def("close", &Pipeline::close, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
           "Stop taking entries and wait up to timeout_s for those queued and in flight; False if some remain.")
      .def(
          "stats",
          [](Pipeline& self) {
            const zlog_native::Stats st = self.stats();
            py::dict d;
            d["sequencer_requests"] = st.sequencer_requests;
            d["class_calls"] = st.class_calls;
            d["entries_sent"] = st.entries_sent;
            d["split_batches"] = st.split_batches;
            d["handed_back"] = st.handed_back;
            return d;
          },
          "Counters since the pipeline was made.")
      .def_property_readonly("in_flight", &Pipeline::in_flight);
  zlog_native::add_hot_path(m.ptr());
}
