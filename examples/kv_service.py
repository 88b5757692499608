#!/usr/bin/env python3
"""A replicated key-value store with a small HTTP API, on pyzlog.objects.

Run several of these (on one machine or many) on the same log; each holds
the whole store in memory, every one serves reads and writes, and they all
agree because their only source of truth is the shared log. There is no
leader and nothing to elect: kill any of them, start it again, and it
catches up from the newest checkpoint and the log.

    export CEPH_CONF=$PWD/run/cluster/ceph.conf
    python examples/kv_service.py --log kv --port 8001 --create &
    python examples/kv_service.py --log kv --port 8002 &
    python examples/kv_service.py --log kv --port 8003 &

    curl -X PUT localhost:8001/kv/greeting -d '"hello"'           # any JSON value
    curl localhost:8002/kv/greeting                                # {"key": ..., "value": "hello", "version": N}
    curl localhost:8003/kv/greeting?stale=1                        # local read, no sync
    curl -X POST localhost:8003/kv/greeting/cas -d '{"expected": "hello", "new": "hi"}'   # {"ok": true}
    curl -X DELETE localhost:8001/kv/greeting                      # {"deleted": true}
    curl localhost:8002/kv                                         # every key
    curl -X POST localhost:8001/admin/checkpoint                   # checkpoint, trim the log below it
    curl localhost:8001/admin/health                               # position played, counters

Reads sync first (linearizable) unless `?stale=1`. A CAS with "expected":
null means "absent" unless "expected_null": true says the value null.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pyzlog
from pyzlog.objects import MISSING, RadosCheckpoints, ReplicatedMap, Runtime

MAX_BODY = 512 * 1024


class Store:
    def __init__(self, conf: str | None, pool: str, name: str, create: bool, seqr: str | None) -> None:
        self.cluster = pyzlog.connect(conf)
        try:
            self.log = (pyzlog.Log.create if create else pyzlog.Log.open)(self.cluster, pool, name, sequencer=seqr)
        except pyzlog.LogExists:
            self.log = pyzlog.Log.open(self.cluster, pool, name, sequencer=seqr)
        self.rt = Runtime(self.log, checkpoints=RadosCheckpoints.for_log(self.log), hole_wait=1.0)
        self.kv: ReplicatedMap = self.rt.map("kv")
        self.rt.start()

    def close(self) -> None:
        self.rt.close()
        self.log.close()
        self.cluster.shutdown()


def make_handler(store: Store) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one line per error only
            pass

        def _send(self, status: int, body: Any = None) -> None:
            data = b"" if body is None else json.dumps(body).encode() + b"\n"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                raise ValueError(f"a body of at most {MAX_BODY} bytes")
            raw = self.rfile.read(n)
            return json.loads(raw) if raw else None

        def _route(self) -> tuple[list[str], dict[str, list[str]]]:
            url = urlsplit(self.path)
            return [unquote(p) for p in url.path.strip("/").split("/") if p], parse_qs(url.query)

        def _handle(self, method: str) -> None:
            try:
                parts, query = self._route()
                self._dispatch(method, parts, query)
            except (ValueError, pyzlog.InvalidRequest) as e:
                self._send(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            except pyzlog.ZlogError as e:
                logging.warning("%s %s: %s", method, self.path, e)
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"{type(e).__name__}: {e}"})

        def _dispatch(self, method: str, parts: list[str], query: dict[str, list[str]]) -> None:
            kv, rt = store.kv, store.rt
            if parts == ["admin", "health"] and method == "GET":
                return self._send(HTTPStatus.OK, {"applied": rt.applied, "stats": rt.stats.__dict__,
                                                  "keys": len(kv), "client": f"{rt.client_id:016x}"})
            if parts == ["admin", "checkpoint"] and method == "POST":
                info = rt.checkpoint()
                return self._send(HTTPStatus.OK, {"position": info.position, "bytes": info.size,
                                                  "trimmed_to": rt.trim()})
            if parts == ["kv"] and method == "GET":
                if "stale" not in query:
                    rt.sync()
                return self._send(HTTPStatus.OK, kv.to_dict())
            if len(parts) == 2 and parts[0] == "kv":
                key = parts[1]
                if method == "GET":
                    if "stale" not in query:
                        rt.sync()
                    value = kv.get(key, MISSING)
                    if value is MISSING:
                        return self._send(HTTPStatus.NOT_FOUND, {"key": key})
                    return self._send(HTTPStatus.OK, {"key": key, "value": value, "version": kv.version_of(key)})
                if method == "PUT":
                    kv.put(key, self._body())
                    return self._send(HTTPStatus.OK, {"key": key, "version": kv.version_of(key)})
                if method == "DELETE":
                    return self._send(HTTPStatus.OK, {"deleted": kv.delete(key)})
            if len(parts) == 3 and parts[0] == "kv" and parts[2] == "cas" and method == "POST":
                body = self._body()
                if not isinstance(body, dict) or "new" not in body:
                    raise ValueError('a CAS body is {"expected": ..., "new": ...}')
                expected = body.get("expected")
                if expected is None and not body.get("expected_null"):
                    expected = MISSING
                return self._send(HTTPStatus.OK, {"ok": kv.cas(parts[1], expected, body["new"])})
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {method} /{'/'.join(parts)}"})

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._handle("GET")

        def do_PUT(self) -> None:  # noqa: N802
            self._handle("PUT")

        def do_POST(self) -> None:  # noqa: N802
            self._handle("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self._handle("DELETE")

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conf", default=None, help="ceph.conf (default: $CEPH_CONF)")
    ap.add_argument("--pool", default="zlog")
    ap.add_argument("--log", required=True, help="the log the store lives on")
    ap.add_argument("--seqr", default=None, metavar="HOST:PORT", help="the sequencer (default: found)")
    ap.add_argument("--create", action="store_true", help="create the log if it does not exist")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    store = Store(args.conf, args.pool, args.log, args.create, args.seqr)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(store))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"kv on {args.log!r}: serving http://{args.host}:{server.server_address[1]} "
          f"(played to {store.rt.applied})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
