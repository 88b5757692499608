"""Options of the "zlog" Spark data source, parsed once on the driver into plain values.

Everything here is picklable: readers and writers carry a ZlogOptions to the
executors and open their own cluster connection there (see connection.py).

Like Kafka's source, an option the connector does not know is refused (with
the near miss for a typo), and the Kafka names users type by habit either work
as aliases (startingOffsets, endingOffsets, failOnDataLoss,
maxOffsetsPerTrigger; minPartitions is the same name) or are refused with a
pointer to the zlog option.
"""
from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..core.cluster import DEFAULT_CONF

ON_DATA_LOSS = ("fail", "skip", "rows")
#: a position damaged at rest: fail the read (CorruptEntry), drop it, or return it as a row of kind corrupt
ON_CORRUPT = ("fail", "skip", "rows")
EARLIEST = "earliest"
LATEST = "latest"
Position = int | str  # a number, or EARLIEST / LATEST

#: every option the source and sink read, as documented (matched case-insensitively)
OPTIONS = ("log", "pool", "conf", "keyring", "client", "sequencer", "startingPosition",
           "endingPosition", "minPartitions", "holeWait", "onDataLoss", "onCorrupt", "maxEntriesPerTrigger",
           "batchSize", "createIfMissing", "width")
#: aliases -> zlog option: Kafka source names, and `path` (.load(name) / .save(name))
ALIASES = {"startingOffsets": "startingPosition", "endingOffsets": "endingPosition",
           "failOnDataLoss": "onDataLoss", "maxOffsetsPerTrigger": "maxEntriesPerTrigger",
           "path": "log"}
#: Kafka names with no zlog equivalent: refused with what to use instead
KAFKA_POINTERS = {
    "subscribe": "a zlog source reads one log: use option log",
    "subscribepattern": "a zlog source reads one log: use option log",
    "assign": "a zlog source reads one log: use option log",
    "topic": "use option log",
    "kafka.bootstrap.servers": "the cluster comes from a ceph.conf: use option conf",
    "startingtimestamp": "zlog entries have positions, not timestamps: use startingPosition",
    "startingoffsetsbytimestamp": "zlog entries have positions, not timestamps: use startingPosition",
    "endingtimestamp": "zlog entries have positions, not timestamps: use endingPosition",
    "endingoffsetsbytimestamp": "zlog entries have positions, not timestamps: use endingPosition",
    "minoffsetspertrigger": "not supported: each trigger reads what is there, "
                            "capped by maxEntriesPerTrigger",
    "maxtriggerdelay": "not supported: each trigger reads what is there, "
                       "capped by maxEntriesPerTrigger",
}
#: options Spark itself may hand to a streaming sink alongside the user's
SPARK_OWN = ("checkpointLocation",)

_CANONICAL = {name.lower(): name for name in OPTIONS + tuple(ALIASES) + SPARK_OWN}


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
    on_corrupt: str = "fail"
    max_entries_per_trigger: int | None = None
    batch_size: int = 256
    create: bool = True
    width: int = 4


def check_names(options: Mapping[str, str]) -> None:
    """Refuse options the connector does not know, naming the valid ones."""
    for key in options:
        low = str(key).lower()
        if low in _CANONICAL:
            continue
        if low in KAFKA_POINTERS:
            raise ValueError(f"zlog option {key!r} is a Kafka source option: {KAFKA_POINTERS[low]}")
        near = difflib.get_close_matches(low, list(_CANONICAL), n=1, cutoff=0.75)
        hint = f" Did you mean {_CANONICAL[near[0]]!r}?" if near else ""
        raise ValueError(f"zlog: unknown option {key!r}.{hint} Valid options: {', '.join(OPTIONS)} "
                         f"(aliases: {', '.join(ALIASES)})")


def _resolve_aliases(opts: dict[str, str]) -> dict[str, str]:
    """Fold each alias into its zlog option; the same option twice is refused."""
    out = dict(opts)
    for alias, name in ALIASES.items():
        raw = out.pop(alias.lower(), None)
        if raw is None:
            continue
        if name.lower() in out:
            raise ValueError(f"zlog options {name} and {alias} (an alias of {name}) were both given: "
                             "give one")
        if alias == "failOnDataLoss":
            text = str(raw).strip().lower()
            if text not in ("true", "false"):
                raise ValueError(f"zlog option failOnDataLoss: expected true or false, got {raw!r} "
                                 "(or use onDataLoss: fail, skip or rows)")
            raw = "fail" if text == "true" else "skip"
        elif alias in ("startingOffsets", "endingOffsets") and str(raw).strip().startswith("{"):
            raise ValueError(f"zlog option {alias}: per-partition JSON offsets are Kafka's; a log has "
                             f"one position: use {name} = 'earliest', 'latest' or a number, got {raw!r}")
        out[name.lower()] = raw
    return out


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


def _seconds(opts: Mapping[str, str], key: str, name: str, default: float) -> float:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ValueError(f"zlog option {name}: expected seconds, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"zlog option {name}: expected a finite number of seconds >= 0, got {raw!r}")
    return value


def parse_options(options: Mapping[str, str]) -> ZlogOptions:
    """Check every option; raise ValueError naming the option at fault."""
    check_names(options)
    opts = _resolve_aliases({str(k).lower(): v for k, v in options.items()})
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
    on_corrupt = str(opts.get("oncorrupt") or "fail").strip().lower()
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"zlog option onCorrupt: expected one of {', '.join(ON_CORRUPT)}, "
                         f"got {opts.get('oncorrupt')!r}")
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
        hole_wait=_seconds(opts, "holewait", "holeWait", 2.0),
        on_data_loss=on_loss,
        on_corrupt=on_corrupt,
        max_entries_per_trigger=_int(opts, "maxentriespertrigger", "maxEntriesPerTrigger", None, 1),
        batch_size=_int(opts, "batchsize", "batchSize", 256, 1) or 256,
        create=_bool(opts, "createifmissing", "createIfMissing", True),
        width=_int(opts, "width", "width", 4, 1) or 4,
    )
