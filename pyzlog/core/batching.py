"""How a connection's append pipeline shapes batches: the knobs of the C++
pipeline (native/appender.h), named after Kafka's producer settings they
mirror. Pure values: no rados, no native code."""
from __future__ import annotations

from dataclasses import dataclass, fields

from .errors import InvalidRequest

#: a linger longer than this is a mistake, not a tuning (Kafka's default is 5 ms)
MAX_LINGER_US = 1_000_000
_U32 = 2**32 - 1


@dataclass(frozen=True)
class AppendBatching:
    """Batching of asynchronous appends (append_async, append_many's
    coalesced writes) on one cluster connection, shared by all its logs.

    An acknowledgement still means stored, whatever the settings: these only
    decide how many entries ride one sequencer request and one OSD op."""

    #: wait this long, when entries of the connection are in flight, before
    #: taking the next batch, so that more entries ride it (Kafka linger.ms).
    #: 0: take what is queued at once.
    linger_us: int = 0
    #: entries per sequencer request, the most one batch carries (Kafka
    #: batch.size, in entries)
    max_batch: int = 4096
    #: batches of one log in flight at once (Kafka
    #: max.in.flight.requests.per.connection). A batch beyond the first goes
    #: only once no more entries can join it (the log's max_in_flight is
    #: reached, or it holds max_batch), so batches stay full: two keep the
    #: OSD busy with the next batch while the client settles the last one.
    max_batches_in_flight: int = 2
    #: entries queued or in flight on the connection before append_async
    #: waits for room (Kafka buffer.memory, in entries)
    window_entries: int = 1 << 16
    #: bytes queued or in flight before append_async waits (Kafka
    #: buffer.memory). One entry larger than this is still taken, alone.
    window_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        least = {"linger_us": 0, "max_batch": 1, "max_batches_in_flight": 1, "window_entries": 1, "window_bytes": 1}
        most = {"linger_us": MAX_LINGER_US, "max_batch": _U32, "max_batches_in_flight": _U32,
                "window_entries": 2**63 - 1, "window_bytes": 2**63 - 1}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidRequest(f"append batching: {f.name} must be an integer, not {value!r}")
            if not least[f.name] <= value <= most[f.name]:
                raise InvalidRequest(
                    f"append batching: {f.name} must be between {least[f.name]} and {most[f.name]}, not {value}")

    def pipeline_options(self) -> dict[str, int]:
        """The keywords of pyzlog._appender.Pipeline."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
