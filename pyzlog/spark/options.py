"""Options of the "zlog" Spark data source, parsed once on the driver into plain values.

Everything here is picklable: readers and writers carry a ZlogOptions to the
executors and open their own cluster connection there (see connection.py).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..cluster import DEFAULT_CONF

ON_DATA_LOSS = ("fail", "skip", "rows")
EARLIEST = "earliest"
LATEST = "latest"
Position = int | str  # a number, or EARLIEST / LATEST


@dataclass(frozen=True)
class ZlogOptions:
    conf: str
    pool: str
    log: str
    keyring: str | None = None
    client: str = "client.admin"
    sequencer: str | None = None
    starting: Position = EARLIEST
    ending: Position = LATEST
    min_partitions: int = 0
    hole_wait: float = 2.0
    on_data_loss: str = "fail"
    max_entries_per_trigger: int | None = None
    batch_size: int = 256
    create: bool = True
    width: int = 4


def _int(opts: Mapping[str, str], key: str, name: str, default: int | None, low: int) -> int | None:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"zlog option {name}: expected an integer, got {raw!r}") from None
    if value < low:
        raise ValueError(f"zlog option {name}: must be at least {low}, got {value}")
    return value


def parse_position(name: str, raw: str | None, default: str) -> Position:
    """'earliest', 'latest' or a non-negative integer."""
    if raw is None or str(raw).strip() == "":
        return default
    text = str(raw).strip().lower()
    if text in (EARLIEST, LATEST):
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"zlog option {name}: bad position {raw!r} "
                         "(expected 'earliest', 'latest' or a non-negative integer)")
    return value


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"zlog option {name}: expected true or false, got {raw!r}")


def parse_options(options: Mapping[str, str]) -> ZlogOptions:
    """Check every option; raise ValueError naming the option at fault."""
    opts = {str(k).lower(): v for k, v in options.items()}
    log = opts.get("log")
    if not log or not str(log).strip():
        raise ValueError("zlog option log is required: .option('log', '<log name>')")
    conf = opts.get("conf") or os.environ.get("CEPH_CONF") or DEFAULT_CONF
    conf = os.path.abspath(str(conf))
    if not os.path.isfile(conf):
        raise ValueError(f"zlog option conf: ceph.conf not found: {conf} "
                         "(set the conf option or $CEPH_CONF)")
    starting = parse_position("startingPosition", opts.get("startingposition"), EARLIEST)
    ending = parse_position("endingPosition", opts.get("endingposition"), LATEST)
    if ending == EARLIEST:
        raise ValueError("zlog option endingPosition: 'earliest' is not allowed (use 'latest' or a number)")
    if isinstance(starting, int) and isinstance(ending, int) and starting > ending:
        raise ValueError(f"zlog options startingPosition/endingPosition: start {starting} "
                         f"is after end {ending}")
    on_loss = str(opts.get("ondataloss") or "fail").strip().lower()
    if on_loss not in ON_DATA_LOSS:
        raise ValueError(f"zlog option onDataLoss: expected one of {', '.join(ON_DATA_LOSS)}, "
                         f"got {opts.get('ondataloss')!r}")
    hole_raw = opts.get("holewait")
    try:
        hole_wait = 2.0 if hole_raw in (None, "") else float(hole_raw)
    except ValueError:
        raise ValueError(f"zlog option holeWait: expected seconds, got {hole_raw!r}") from None
    if hole_wait < 0:
        raise ValueError(f"zlog option holeWait: must not be negative, got {hole_raw!r}")
    return ZlogOptions(
        conf=conf,
        pool=str(opts.get("pool") or "zlog"),
        log=str(log).strip(),
        keyring=opts.get("keyring") or None,
        client=str(opts.get("client") or "client.admin"),
        sequencer=opts.get("sequencer") or None,
        starting=starting,
        ending=ending,
        min_partitions=_int(opts, "minpartitions", "minPartitions", 0, 0) or 0,
        hole_wait=hole_wait,
        on_data_loss=on_loss,
        max_entries_per_trigger=_int(opts, "maxentriespertrigger", "maxEntriesPerTrigger", None, 1),
        batch_size=_int(opts, "batchsize", "batchSize", 256, 1) or 256,
        create=_bool(opts, "createifmissing", "createIfMissing", True),
        width=_int(opts, "width", "width", 4, 1) or 4,
    )
