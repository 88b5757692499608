// pybind11 bindings: the pyzlog._appender extension module.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "appender.h"
#include "auth_py.h"

namespace py = pybind11;
using zlog_appender::Appender;
using zlog_appender::Target;

PYBIND11_MODULE(_appender, m) {
  m.doc() = "pyzlog's C++ hot path for async appends (sequencer + librados aio)";
  m.attr("HANDED_BACK") = zlog_appender::HANDED_BACK;

  py::class_<Appender>(m, "Appender")
      .def(py::init([](const std::string& client, const std::string& conf_file,
                       const std::vector<std::pair<std::string, std::string>>& options,
                       const std::string& pool, const std::string& log, const std::string& seqr_host,
                       uint16_t seqr_port, double seqr_timeout_s, bool coalesce, const py::object& seqr_auth) {
             Target t{seqr_host, seqr_port, seqr_timeout_s, pool, log, seqr::auth_from_py(seqr_auth)};
             py::gil_scoped_release nogil;
             return new Appender(client, conf_file, options, std::move(t), coalesce);
           }),
           py::arg("client"), py::arg("conf_file"), py::arg("options"), py::arg("pool"), py::arg("log"),
           py::arg("seqr_host"), py::arg("seqr_port"), py::arg("seqr_timeout_s"), py::arg("coalesce") = true,
           py::arg("seqr_auth") = py::none())
      .def("set_view", &Appender::set_view, py::arg("epoch"), py::arg("oid_prefix"), py::arg("width"),
           py::arg("start"))
      .def(
          "append",
          [](Appender& self, uint64_t ticket, const py::bytes& data) {
            char* p;
            Py_ssize_t n;
            if (PyBytes_AsStringAndSize(data.ptr(), &p, &n) < 0) throw py::error_already_set();
            self.append(ticket, p, static_cast<uint32_t>(n));
          },
          py::arg("ticket"), py::arg("data"), "Queue one stored entry; its outcome comes from wait().")
      .def(
          "wait",
          [](Appender& self, size_t max_items, double timeout_s) {
            std::vector<zlog_appender::Completed> done;
            {
              py::gil_scoped_release nogil;
              done = self.wait(max_items, timeout_s);
            }
            py::list out(done.size());
            for (size_t i = 0; i < done.size(); ++i)
              out[i] = py::make_tuple(done[i].ticket, done[i].position, done[i].code);
            return out;
          },
          py::arg("max_items"), py::arg("timeout_s"),
          "Up to max_items (ticket, position, code): code 0 stored, -errno refused, or "
          "HANDED_BACK (not sent); [] after timeout_s or once closed.")
      .def("close", &Appender::close, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
           "Send what is queued, wait up to timeout_s, disconnect; False if writes remained.")
      .def(
          "stats",
          [](Appender& self) {
            const zlog_appender::Stats st = self.stats();
            py::dict d;
            d["sequencer_requests"] = st.sequencer_requests;
            d["class_calls"] = st.class_calls;
            d["entries_sent"] = st.entries_sent;
            d["split_batches"] = st.split_batches;
            d["handed_back"] = st.handed_back;
            return d;
          },
          "Counters since the Appender was made.")
      .def_property_readonly("in_flight", &Appender::in_flight);
}
