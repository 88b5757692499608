"""Per-log payload encoding, recorded in the log's metadata at create time so
every reader decodes without being told."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zstandard

from .errors import InvalidRequest

CODECS = ("none", "zstd")
ZSTD_LEVEL = 3

#: bytes -> bytes: one direction of a codec
Codec = Callable[[bytes], bytes]


def codec_for(config: dict[str, Any]) -> tuple[Codec, Codec]:
    """(encode, decode) for a log's config."""
    name = config.get("compression", "none")
    if name == "none":
        return (lambda b: b), (lambda b: b)
    if name == "zstd":
        return (lambda b: zstandard.compress(b, ZSTD_LEVEL)), zstandard.decompress
    raise InvalidRequest(f"log uses unknown compression {name!r} (this client knows {', '.join(CODECS)})")


def check_codec(name: str) -> str:
    if name not in CODECS:
        raise InvalidRequest(f"unknown compression {name!r}: choose one of {', '.join(CODECS)}")
    return name
