"""The sequencer's wire format spoken from Python, for tests: requests, and
the handshake exactly as docs/seqr-protocol.md specifies it (a second
implementation, which must agree with the C++ client and server), and a
self-signed TLS certificate made with the openssl command."""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import subprocess
from pathlib import Path

from pyzlog import _seqr  # type: ignore[attr-defined]

REQ_FIXED = struct.Struct("<BQQIH")  # op, request_id, epoch, count, pool_len
RESP = struct.Struct("<IBQQQI")  # length, status, request_id, epoch, position, count


def encode_request(op: int, rid: int, epoch: int, count: int, pool: bytes, log: bytes) -> bytes:
    payload = (
        REQ_FIXED.pack(op, rid, epoch, count, len(pool)) + pool + struct.pack("<H", len(log)) + log
    )
    return struct.pack("<I", len(payload)) + payload


def hello_frame(pool: bytes, nonce: bytes | None = None, version: int = 2) -> bytes:
    hello = struct.pack("<BBH", _seqr.OP_HELLO, version, 0) + (nonce or os.urandom(16)) \
        + struct.pack("<H", len(pool)) + pool
    return struct.pack("<I", len(hello)) + hello


def _hmac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf
    (length,) = struct.unpack("<I", exactly(4))
    return exactly(length)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes."""
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def python_handshake(host: str, port: int, pool: bytes, key: bytes, generation: int | None = None
                     ) -> tuple[socket.socket, dict[str, int | bool], bytes]:
    """Returns the socket, the WELCOME's fields and the bytes the client sent
    (HELLO and PROOF frames, for replaying)."""
    sock = socket.create_connection((host, port), timeout=5)
    nonce_c = os.urandom(16)
    hello = hello_frame(pool, nonce_c)
    sock.sendall(hello)
    challenge = read_frame(sock)
    op, version, status, mode, server_gen = struct.unpack_from("<BBBBI", challenge)
    assert (op, version, status, mode) == (_seqr.OP_CHALLENGE, 2, _seqr.OK, 1), challenge
    nonce_s = challenge[8:24]
    gen = server_gen if generation is None else generation
    pool_key = _hmac(key, b"zlog-seqr/2 pool\0", struct.pack("<H", len(pool)), pool)
    session = _hmac(pool_key, b"zlog-seqr/2 session\0", nonce_c, nonce_s)
    transcript = hello[4:] + challenge + b"\0" + struct.pack("<I", gen)  # no TLS: an empty channel binding
    mine = _hmac(session, b"zlog-seqr/2 client\0", transcript)
    proof = struct.pack("<B3xI", _seqr.OP_PROOF, gen) + mine
    sock.sendall(struct.pack("<I", len(proof)) + proof)
    welcome = read_frame(sock)
    op, status, reason, _, max_count, max_outstanding, max_rate = struct.unpack_from("<BBBBIII", welcome)
    fields: dict[str, int | bool] = {
        "op": op, "status": status, "reason": reason, "max_count": max_count,
        "max_outstanding": max_outstanding, "max_rate": max_rate,
        "server_proved": welcome[16:] == _hmac(session, b"zlog-seqr/2 server\0", transcript, mine)}
    return sock, fields, hello + struct.pack("<I", len(proof)) + proof


def check_no_entry(got: bytes) -> None:
    """What a connection that never completed a handshake may get back:
    refusals and at most a CHALLENGE, never a position, an epoch or a WELCOME."""
    pos = 0
    while pos < len(got):
        (length,) = struct.unpack_from("<I", got, pos)
        payload = got[pos + 4:pos + 4 + length]
        assert len(payload) == length
        if length == 29:  # a request's answer: only the refusal
            status, _rid, epoch, position, count = struct.unpack("<BQQQI", payload)
            assert (status, epoch, position, count) == (_seqr.AUTH_REQUIRED, 0, 0, 0)
        elif length == 28:
            assert payload[0] == _seqr.OP_CHALLENGE
        else:
            assert length == 48 and payload[0] == _seqr.OP_WELCOME and payload[1] != _seqr.OK
        pos += 4 + length


def make_cert(directory: Path, name: str = "seqr", ips: tuple[str, ...] = ("127.0.0.1",)) -> tuple[str, str]:
    """A self-signed certificate for `ips` and localhost: (cert file, key file)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    san = ",".join([f"IP:{ip}" for ip in ips] + ["DNS:localhost"])
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return str(cert), str(key)
