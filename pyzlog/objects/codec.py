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

_Q = struct.Struct("<q")
_D = struct.Struct("<d")
_I = struct.Struct("<I")
_TI = struct.Struct("<BI")
_TQ = struct.Struct("<Bq")
_TD = struct.Struct("<Bd")
_SMALL = {i: bytes((_SINT, i & 0xFF)) for i in range(-128, 128)}
#: an int item of a list (_dec's fast path for a session's seqs)
_INT_ITEM = _INT
#: a list of three items, the first a short str (_dec's fast path for a map snapshot's items)
_TRIPLE = bytes((_LIST,)) + _I.pack(3) + bytes((_SSTR,))
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
    try:
        v, off = _dec(data, 0, 0)
    except (IndexError, struct.error, UnicodeDecodeError, TypeError, RecursionError) as e:
        raise BadEntry(f"undecodable value: {e}") from None
    if off != len(data):
        raise BadEntry(f"{len(data) - off} bytes after the value")
    return v


def load_from(data: bytes, off: int) -> tuple[Any, int]:
    """The value at `off` and the offset after it; BadEntry if it does not parse."""
    try:
        return _dec(data, off, 0)
    except (IndexError, struct.error, UnicodeDecodeError, TypeError, RecursionError) as e:
        raise BadEntry(f"undecodable value: {e}") from None


def load_key_value(data: bytes, off: int) -> tuple[Any, Any]:
    """The two values from `off` to the end of `data` (a map put's key and
    value); BadEntry if they do not parse or bytes are left over. A short
    str key and a short bytes value (what puts mostly carry) are read here
    without the general walk: the replay loop's hot path."""
    end = len(data)
    if end > off + 1 and data[off] == _SSTR:
        o = off + 2 + data[off + 1]
        if end > o + 1 and data[o] == _SBYTES and o + 2 + data[o + 1] == end:
            try:
                return data[off + 2:o].decode(), data[o + 2:end]
            except UnicodeDecodeError as e:
                raise BadEntry(f"undecodable value: {e}") from None
    key, o = load_from(data, off)
    value, o = load_from(data, o)
    if o != end:
        raise BadEntry(f"{end - o} bytes after the value")
    return key, value


def _take(data: bytes, off: int, n: int) -> bytes:
    end = off + n
    if end > len(data):
        raise IndexError(f"a length of {n} runs past the end")
    return data[off:end]


def _dec(data: bytes, off: int, depth: int) -> tuple[Any, int]:
    tag = data[off]
    off += 1
    if tag == _SSTR:
        n = data[off]
        return _take(data, off + 1, n).decode(), off + 1 + n
    if tag == _SBYTES:
        n = data[off]
        return _take(data, off + 1, n), off + 1 + n
    if tag == _SINT:
        v = data[off]
        return (v - 256 if v > 127 else v), off + 1
    if tag == _INT:
        return _Q.unpack_from(data, off)[0], off + 8
    if tag == _STR or tag == _BYTES:
        n = _I.unpack_from(data, off)[0]
        b = _take(data, off + 4, n)
        return (b.decode() if tag == _STR else b), off + 4 + n
    if tag == _NONE:
        return None, off
    if tag == _TRUE:
        return True, off
    if tag == _FALSE:
        return False, off
    if tag == _FLOAT:
        return _D.unpack_from(data, off)[0], off + 8
    if tag == _LIST or tag == _TUPLE or tag == _DICT:
        if depth >= MAX_DEPTH:
            raise IndexError(f"nested deeper than {MAX_DEPTH}")
        n = _I.unpack_from(data, off)[0]
        off += 4
        if n > len(data) - off:  # every item takes a byte at least: a count cannot exceed what is left
            raise IndexError(f"a count of {n} runs past the end")
        if tag == _DICT:
            d = {}
            end = len(data)
            for _ in range(n):
                # a short str key and a short bytes value (a map's usual item), read
                # here without two calls of the general walk: a checkpoint's bulk
                if data[off] == _SSTR:
                    o = off + 2 + data[off + 1]
                    if o + 1 < end and data[o] == _SBYTES:
                        v_end = o + 2 + data[o + 1]
                        if v_end > end:
                            raise IndexError("a length runs past the end")
                        d[data[off + 2:o].decode()] = data[o + 2:v_end]
                        off = v_end
                        continue
                k, off = _dec(data, off, depth + 1)
                d[k], off = _dec(data, off, depth + 1)  # an unhashable key: TypeError, caught above
            return d, off
        items = []
        end = len(data)
        triples = depth + 1 < MAX_DEPTH
        for _ in range(n):
            if data[off] == _INT_ITEM and off + 9 <= end:  # a checkpoint's session seqs: no call each
                items.append(_Q.unpack_from(data, off + 1)[0])
                off += 9
                continue
            # [short str, short bytes, int]: a map snapshot's item (a checkpoint's
            # bulk), read here without four calls of the general walk
            if triples and data.startswith(_TRIPLE, off):
                o = off + 7 + data[off + 6]
                if o + 1 < end and data[o] == _SBYTES:
                    v = o + 2 + data[o + 1]
                    if v + 9 <= end and data[v] == _INT:
                        items.append([data[off + 7:o].decode(), data[o + 2:v], _Q.unpack_from(data, v + 1)[0]])
                        off = v + 9
                        continue
            x, off = _dec(data, off, depth + 1)
            items.append(x)
        return (items if tag == _LIST else tuple(items)), off
    if tag == _MISSING:
        return MISSING, off
    if tag == _BIGINT:
        n = int.from_bytes(_take(data, off, 2), "little")
        return int.from_bytes(_take(data, off + 2, n), "little", signed=True), off + 2 + n
    raise IndexError(f"unknown tag {tag}")


__all__ = ["MISSING", "dumps", "loads", "load_from", "load_key_value"]
