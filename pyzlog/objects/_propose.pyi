# native/propose.c (pyzlog.objects._propose): an async proposal's way into the log, in C
from concurrent.futures import Future
from typing import Any

class Proposal:
    seq: int
    data: bytes
    future: Future[Any]
    deadline: float
    maybe_stored: bool
    attempts: int
    retire: list[int] | tuple[()]
    streams: tuple[int, ...]
    result: Any
    ok: bool
    flying: bool
    runtime: Any
    def __init__(self, seq: int, data: bytes, future: Any, deadline: float, retire: list[int] | None = None,
                 streams: tuple[int, ...] = (), runtime: Any = None) -> None: ...
    def set_result(self, position: int) -> None: ...

def configure(magic: bytes, version: int, pending_type: type[Proposal], fresh_future: Any) -> None: ...
def new_pending(rt: Any, core: tuple[Any, ...], kind: int, stream: int, body: bytes, retire: list[int] | None,
                streams: tuple[int, ...]) -> Any: ...
def propose(rt: Any, core: tuple[Any, ...], kind: int, stream: int, body: bytes,
            streams: tuple[int, ...]) -> Future[Any]: ...
def landed(rt: Any, core: tuple[Any, ...], pos: int | None, data: bytes | None, wake: bool, p: Any) -> None: ...
