// seqr::Auth from the Python dict both extension modules take (pyzlog._seqr's
// Client and pyzlog._appender's Appender), so the append path authenticates
// exactly as the Python client does:
//   {"pool": str, "keys": [(generation, bytes), ...], "insecure": bool,
//    "tls": bool, "tls_ca": str, "tls_server_name": str, "probe": bool}
// Every key is optional; None or {} means no handshake.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "client.h"

namespace seqr {

inline Auth auth_from_py(const pybind11::object& o) {
  namespace py = pybind11;
  Auth a;
  if (o.is_none()) return a;
  const py::dict d = o.cast<py::dict>();
  for (const auto& item : d) {
    const std::string k = item.first.cast<std::string>();
    if (k != "pool" && k != "keys" && k != "insecure" && k != "tls" && k != "tls_ca" &&
        k != "tls_server_name" && k != "probe")
      throw std::invalid_argument("unknown sequencer auth setting '" + k + "'");
  }
  if (d.contains("pool")) a.pool = d["pool"].cast<std::string>();
  if (d.contains("keys"))
    for (const auto& item : d["keys"]) {
      const auto t = item.cast<py::tuple>();
      if (t.size() != 2) throw std::invalid_argument("keys are (generation, secret) pairs");
      a.keys.push_back(Key{t[0].cast<uint32_t>(), t[1].cast<std::string>()});
    }
  if (d.contains("insecure")) a.insecure = d["insecure"].cast<bool>();
  if (d.contains("probe")) a.probe = d["probe"].cast<bool>();
  if (d.contains("tls")) a.tls.enabled = d["tls"].cast<bool>();
  if (d.contains("tls_ca") && !d["tls_ca"].is_none()) a.tls.ca_file = d["tls_ca"].cast<std::string>();
  if (d.contains("tls_server_name") && !d["tls_server_name"].is_none())
    a.tls.server_name = d["tls_server_name"].cast<std::string>();
  return a;
}

}  // namespace seqr
