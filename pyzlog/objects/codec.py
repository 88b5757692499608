"""The value codec of commands and checkpoints: None, bool, int, float, str,
bytes, list, tuple, dict and MISSING, in a small tagged binary form.

Why not pickle or marshal: an entry is read by every replica, and decoding
must neither run code nor crash on damaged bytes (pickle can do the first,
marshal the second), and the form must not change with the Python version.
Decoding checks every length and raises BadEntry; it never trusts a count.
Round trips are exact for these types (a tuple stays a tuple), which is what
keeps replicas equal: the proposer applies the decoded bytes, like everyone.
"""
from __future__ import annotations

import struct
from typing import Any, Final

from pyzlog import InvalidRequest

from ._codec import configure as _configure, load_from as _load_from
from .errors import BadEntry


class _Missing:
    """The absence of a value (a map key that is not there): distinct from None."""

    _it: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._it is None:
            cls._it = super().__new__(cls)
        return cls._it

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()

#: nesting deeper than this is refused both ways (a bound on recursion)
MAX_DEPTH = 64
#: how deep a command's own keys and values may nest (dumps' default): what holds them (a
#: checkpoint's state, a transaction's commit record) adds up to 6 levels and must still encode
#: and decode within MAX_DEPTH (a value 63 deep was taken, and then no checkpoint could be written)
ARG_DEPTH = MAX_DEPTH - 8

_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _BYTES, _LIST, _TUPLE, _DICT, _MISSING, _BIGINT, \
    _SSTR, _SBYTES, _SINT = range(15)
#: the tags of a str and of a bytes of fewer than 256 bytes (a length byte follows each):
#: the runtime's replay loop reads a map put of both inline
SSTR: Final = _SSTR
SBYTES: Final = _SBYTES
#: the tags of a longer str and bytes (a u32 length follows)
STR: Final = _STR
BYTES: Final = _BYTES

_TI = struct.Struct("<BI")
_TQ = struct.Struct("<Bq")
_TD = struct.Struct("<Bd")
_SMALL = {i: bytes((_SINT, i & 0xFF)) for i in range(-128, 128)}
_CONST = {None: bytes((_NONE,)), False: bytes((_FALSE,)), True: bytes((_TRUE,))}
_MISSING_B = bytes((_MISSING,))


class _TooDeep(Exception):
    """_enc's: nested deeper than the caller allows (dumps says how deep)."""


def dumps(value: Any, limit: int = ARG_DEPTH) -> bytes:
    """`value` as bytes, nested at most `limit` deep (a command's key or
    value: ARG_DEPTH; what holds such values, a checkpoint's state or a
    commit record: MAX_DEPTH); InvalidRequest for a type the codec does not
    carry, or a str that is not valid Unicode."""
    try:
        t = type(value)
        if t is bytes:  # the common keys and values, without the general walk
            raw: bytes = value
            n = len(raw)
            return (bytes((_SBYTES, n)) if n < 256 else _TI.pack(_BYTES, n)) + raw
        if t is str:
            b: bytes = value.encode()
            n = len(b)
            return (bytes((_SSTR, n)) if n < 256 else _TI.pack(_STR, n)) + b
        out: list[bytes] = []
        _enc(value, out, MAX_DEPTH - min(limit, MAX_DEPTH))
        return b"".join(out)
    except _TooDeep:
        raise InvalidRequest(f"a value nested deeper than {min(limit, MAX_DEPTH)}") from None
    except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 for it
        raise InvalidRequest(f"a str that is not valid Unicode cannot be stored ({e.reason}: "
                             f"{e.object[e.start:e.end]!r})") from None


def _enc(v: Any, out: list[bytes], depth: int) -> None:
    t = type(v)
    if t is str:
        b = v.encode()
        n = len(b)
        out.append(bytes((_SSTR, n)) if n < 256 else _TI.pack(_STR, n))
        out.append(b)
    elif t is bytes or t is bytearray or t is memoryview:
        b = bytes(v)
        n = len(b)
        out.append(bytes((_SBYTES, n)) if n < 256 else _TI.pack(_BYTES, n))
        out.append(b)
    elif v is None or t is bool:
        out.append(_CONST[v])
    elif isinstance(v, int):
        small = _SMALL.get(v)
        if small is not None:
            out.append(small)
        elif -(1 << 63) <= v < (1 << 63):
            out.append(_TQ.pack(_INT, v))
        else:
            n = (v.bit_length() + 8) // 8
            if n > 0xFFFF:
                raise InvalidRequest("an integer too large for the codec")
            out.append(bytes((_BIGINT,)) + n.to_bytes(2, "little") + int(v).to_bytes(n, "little", signed=True))
    elif t is float:
        out.append(_TD.pack(_FLOAT, v))
    elif t is list or t is tuple:
        if depth >= MAX_DEPTH:
            raise _TooDeep
        out.append(_TI.pack(_LIST if t is list else _TUPLE, len(v)))
        for x in v:
            _enc(x, out, depth + 1)
    elif t is dict:
        if depth >= MAX_DEPTH:
            raise _TooDeep
        out.append(_TI.pack(_DICT, len(v)))
        for k, x in v.items():
            _enc(k, out, depth + 1)
            _enc(x, out, depth + 1)
    elif v is MISSING:
        out.append(_MISSING_B)
    elif isinstance(v, float):
        out.append(_TD.pack(_FLOAT, float(v)))
    else:
        raise InvalidRequest(f"cannot encode a {t.__name__}: the object layer carries None, bool, int, float, "
                             "str, bytes, list, tuple and dict")


def loads(data: bytes) -> Any:
    """The value `data` holds; BadEntry if it does not parse or has bytes left over."""
    v, off = load_from(data, 0)
    if off != len(data):
        raise BadEntry(f"{len(data) - off} bytes after the value")
    return v


def load_from(data: bytes, off: int) -> tuple[Any, int]:
    """The value at `off` and the offset after it; BadEntry if it does not
    parse. Decoded in C (native/codec.c): every command applied and every
    checkpoint loaded comes this way."""
    try:
        return _load_from(data if type(data) is bytes else bytes(data), off)
    except (ValueError, TypeError, OverflowError) as e:  # damaged bytes or offset; TypeError: an unhashable key
        raise BadEntry(f"undecodable value: {e}") from None


def load_key_value(data: bytes, off: int) -> tuple[Any, Any]:
    """The two values from `off` to the end of `data` (a map put's key and
    value); BadEntry if they do not parse or bytes are left over."""
    key, o = load_from(data, off)
    value, o = load_from(data, o)
    if o != len(data):
        raise BadEntry(f"{len(data) - o} bytes after the value")
    return key, value


_configure(MISSING, MAX_DEPTH, (_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _BYTES, _LIST, _TUPLE, _DICT, _MISSING,
                                _BIGINT, _SSTR, _SBYTES, _SINT))


__all__ = ["MISSING", "dumps", "loads", "load_from", "load_key_value"]
