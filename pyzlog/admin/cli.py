"""`zlog`: the command line of pyzlog.

    zlog [--conf F] [--pool P] [--seqr HOST:PORT] COMMAND ...

Every failure prints one line ``zlog: error: ...`` on stderr and exits non-zero:
1 for runtime errors (missing log, cluster down, ...), 2 for usage errors.
"""
from __future__ import annotations

import base64
import collections
import json
import os
import sys
import time
from concurrent.futures import Future
from typing import IO, Any, Iterator, NoReturn

import click

from ..core.errors import ZlogError
from ..core.metadata import DEFAULT_BYTE_BOUND, DEFAULT_SLOTS

CONTEXT = {"help_option_names": ["-h", "--help"]}
#: lets "-1" reach a POS argument (and be refused as a position) instead of
#: being taken for an unknown option
POS_CONTEXT = {**CONTEXT, "ignore_unknown_options": True}
#: positions read from stdin that may be in flight at once (`zlog append`)
APPEND_WINDOW = 64


# --------------------------------------------------------------------- types
class PositionType(click.ParamType):  # type: ignore[type-arg]
    """A log position: an integer in [0, MAX_POSITION]."""

    name = "POS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from ..core.wire import MAX_POSITION

        if isinstance(value, int) and not isinstance(value, bool):
            pos = value
        else:
            try:
                pos = int(str(value).strip(), 10)
            except ValueError:
                self.fail(f"bad position {value!r}: not an integer", param, ctx)
        if not 0 <= pos <= MAX_POSITION:
            self.fail(f"bad position {pos}: must be in [0, {MAX_POSITION}]", param, ctx)
        return pos


POSITION = PositionType()


def _depths(value: str) -> list[int]:
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers like 1,16,128") from None
    if not out or any(d < 1 for d in out):
        raise click.BadParameter(f"{value!r}: depths must be integers >= 1")
    return out


# ------------------------------------------------------------------- context
class Env:
    """Global options; connects to the cluster on first use, once."""

    def __init__(self, conf: str | None, pool: str, seqr: str | None, keyring: str | None,
                 client: str, timeout: float | None) -> None:
        self.conf = conf
        self.pool = pool
        self.seqr = seqr or None
        self.keyring = keyring
        self.client = client
        self.timeout = timeout
        self._cluster: Any = None
        self._logs: list[Any] = []

    @property
    def cluster(self) -> Any:
        if self._cluster is None:
            from ..core.cluster import connect

            kw: dict[str, Any] = {"keyring": self.keyring, "client": self.client}
            if self.timeout is not None:
                # the library rounds timeouts down to whole seconds; 0 would mean "none"
                t = max(1.0, self.timeout)
                kw.update(connect_timeout=t, op_timeout=t)
            self._cluster = connect(self.conf, **kw)
        return self._cluster

    def open(self, name: str, **kw: Any) -> Any:
        from ..client.log import Log

        log = Log.open(self.cluster, self.pool, name, sequencer=self.seqr, **kw)
        self._logs.append(log)
        return log

    def close(self) -> None:
        for log in self._logs:
            try:
                log.close()
            except Exception:  # noqa: BLE001 - closing must not turn success into failure
                pass
        self._logs.clear()
        if self._cluster is not None:
            try:
                self._cluster.shutdown()
            except Exception:  # noqa: BLE001
                pass
            self._cluster = None


pass_env = click.make_pass_decorator(Env)


def kind_name(kind: Any) -> str:
    """'data', 'filled', 'trimmed' or 'lost' for a RecordKind."""
    return str(getattr(kind, "value", kind)).lower()


def _size(n: int | None) -> str:
    """Bytes for people: 1.5 MiB."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


# ---------------------------------------------------------------------- cli
@click.group(context_settings=CONTEXT)
@click.option("--conf", envvar="CEPH_CONF", default=None, metavar="FILE",
              help="ceph.conf [env: CEPH_CONF; default /etc/ceph/ceph.conf]")
@click.option("--pool", envvar="ZLOG_POOL", default="zlog", show_default=True,
              help="RADOS pool of the logs [env: ZLOG_POOL]")
@click.option("--seqr", envvar="ZLOG_SEQR", default=None, metavar="HOST:PORT",
              help="sequencer address for logs whose metadata names none [env: ZLOG_SEQR]; "
                   "without one, such logs get a daemon from the pool's registry, or appends "
                   "find the tail the slow way (seal + max position)")
@click.option("--keyring", default=None, metavar="FILE", help="cephx keyring")
@click.option("--client", default="client.admin", show_default=True, help="cephx client name")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="give up on the cluster after this long (connect and each operation)")
@click.version_option(package_name="pyzlog", prog_name="zlog")
@click.pass_context
def cli(ctx: click.Context, conf: str | None, pool: str, seqr: str | None, keyring: str | None,
        client: str, timeout: float | None) -> None:
    """A globally ordered, shared, append-only log on Ceph RADOS."""
    if seqr:
        from ..core.sequencer import parse_address

        try:
            parse_address(seqr)
        except ZlogError as e:
            raise click.BadParameter(str(e), param_hint="--seqr") from None
    env = Env(conf, pool, seqr, keyring, client, timeout)
    ctx.obj = env
    ctx.call_on_close(env.close)


@cli.command(context_settings=CONTEXT)
@click.argument("name")
@click.option("--width", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="number of objects positions are striped over")
@click.option("--compression", type=click.Choice(["zstd", "none"]), default=None,
              help="stored in the log's config")
@click.option("--format", "fmt", type=click.Choice(["data", "omap"]), default="data", show_default=True,
              help="data: bounded objects, counted by Ceph (docs/storage.md); omap: round 2's format")
@click.option("--slots", type=click.IntRange(1, 1 << 22), default=DEFAULT_SLOTS, show_default=True,
              help="positions per object (data format)")
@click.option("--byte-bound", type=click.IntRange(1, 1 << 31), default=DEFAULT_BYTE_BOUND, show_default=True,
              help="bytes of entries per object (data format)")
@click.option("--unit", type=click.IntRange(1, 65536), default=None,
              help="consecutive positions per run of an object (data format; a divisor of --slots) "
                   "[default: the largest divisor of --slots up to 128]")
@pass_env
def create(env: Env, name: str, width: int, compression: str | None, fmt: str, slots: int,
           byte_bound: int, unit: int | None) -> None:
    """Create log NAME."""
    from ..client.log import Log

    config = {"compression": compression} if compression else None
    log = Log.create(env.cluster, env.pool, name, width=width, config=config, format=fmt, slots=slots,
                     byte_bound=byte_bound, unit=unit)
    view = log.views[-1]
    shape = (f"{view.slots} positions and {_size(view.byte_bound)} per object in runs of {view.unit}"
             if view.bounded else "omap format")
    click.echo(f"created log {name!r} in pool {env.pool!r}: width {width}, {shape}, epoch {log.epoch}")


@cli.command(context_settings=CONTEXT)
@click.argument("name")
@click.argument("data", nargs=-1)
@click.option("--whole", is_flag=True,
              help="without DATA: all of stdin is ONE entry (binary safe) instead of one per line")
@pass_env
def append(env: Env, name: str, data: tuple[str, ...], whole: bool) -> None:
    """Append entries to NAME and print their positions.

    Each DATA argument is one entry; without DATA, each line of stdin is one
    (the newline is not stored)."""
    log = env.open(name, max_in_flight=APPEND_WINDOW)
    if data:
        entries: Iterator[bytes] = (os.fsencode(d) for d in data)
    elif whole:
        entries = iter([sys.stdin.buffer.read()])
    else:
        entries = _stdin_lines(sys.stdin.buffer)
    # pipelined, positions printed in input order as soon as they are known
    window: collections.deque[Future[int]] = collections.deque()
    for entry in entries:
        window.append(log.append_async(entry))
        while window and (window[0].done() or len(window) >= APPEND_WINDOW):
            click.echo(window.popleft().result())
    while window:
        click.echo(window.popleft().result())


def _stdin_lines(f: IO[bytes]) -> Iterator[bytes]:
    for line in f:
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        yield line


@cli.command(context_settings=POS_CONTEXT)
@click.argument("name")
@click.argument("pos", type=POSITION)
@pass_env
def read(env: Env, name: str, pos: int) -> None:
    """Write the entry at POS to stdout (raw bytes, no newline added)."""
    data = env.open(name).read(pos)
    out = sys.stdout.buffer
    out.write(data)
    out.flush()


@cli.command(context_settings=CONTEXT)
@click.argument("name")
@click.option("--from", "start", type=POSITION, default=0, show_default=True, help="first position")
@click.option("--to", "last", type=POSITION, default=None,
              help="last position, inclusive [default: the tail when cat starts]")
@click.option("--format", "fmt", type=click.Choice(["raw", "json"]), default="raw", show_default=True,
              help="raw: each entry and a newline, gaps as '# POS KIND' on stderr; "
                   "json: one JSON object per position (gaps included) on stdout")
@click.option("--hole-wait", type=click.FloatRange(min=0), default=2.0, show_default=True,
              metavar="SECONDS", help="wait this long for the writer of an unwritten position "
                                      "below the tail, then fill it (reported as lost)")
@click.option("--on-corrupt", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="at a position damaged at rest: fail (exit 1 naming it and its object), or skip it "
                   "(reported as '# POS corrupt' on stderr, or kind corrupt in json)")
@pass_env
def cat(env: Env, name: str, start: int, last: int | None, fmt: str, hole_wait: float, on_corrupt: str) -> None:
    """Print the entries of NAME in log order."""
    log = env.open(name)
    end = None if last is None else last + 1
    if end is not None and end <= start:
        return
    _print_records(log.stream(start, end, hole_wait=hole_wait, on_corrupt=on_corrupt), fmt)


def _print_records(records: Iterator[Any], fmt: str) -> None:
    out = sys.stdout.buffer
    for rec in records:
        kind = kind_name(rec.kind)
        if fmt == "json":
            obj: dict[str, Any] = {"position": rec.position, "kind": kind, "epoch": rec.epoch}
            if kind == "data":
                try:
                    obj["data"] = rec.data.decode("utf-8")
                except UnicodeDecodeError:
                    obj["data_base64"] = base64.b64encode(rec.data).decode()
            out.write(json.dumps(obj).encode() + b"\n")
        elif kind == "data":
            out.write(rec.data + b"\n")
        else:
            out.flush()
            click.echo(f"# {rec.position} {kind}", err=True)
        out.flush()


@cli.command(context_settings=CONTEXT)
@click.argument("name")
@click.option("-f", "--follow", is_flag=True,
              help="then print entries as they are appended, until Ctrl-C")
@click.option("--format", "fmt", type=click.Choice(["raw", "json"]), default="raw", show_default=True)
@click.option("--hole-wait", type=click.FloatRange(min=0), default=2.0, show_default=True,
              metavar="SECONDS", help="wait this long for the writer of an unwritten position "
                                      "below the tail, then fill it (reported as lost)")
@pass_env
def tail(env: Env, name: str, follow: bool, fmt: str, hole_wait: float) -> None:
    """Print the tail of NAME: the next position to be handed out.

    With -f, print the tail on stderr, then each new entry from it on."""
    log = env.open(name)
    pos = log.tail()
    if not follow:
        click.echo(pos)
        return
    click.echo(f"# following {name!r} from position {pos} (Ctrl-C to stop)", err=True)
    _print_records(log.stream(pos, None, follow=True, hole_wait=hole_wait), fmt)


@cli.command(context_settings=POS_CONTEXT)
@click.argument("name")
@click.argument("pos", type=POSITION)
@pass_env
def fill(env: Env, name: str, pos: int) -> None:
    """Mark the unwritten position POS as junk."""
    env.open(name).fill(pos)
    click.echo(f"filled {pos}")


@cli.command(context_settings=POS_CONTEXT)
@click.argument("name")
@click.argument("pos", type=POSITION)
@click.option("--to", "to", is_flag=True, help="trim every position <= POS")
@pass_env
def trim(env: Env, name: str, pos: int, to: bool) -> None:
    """Trim position POS (or, with --to, everything up to and including it)."""
    log = env.open(name)
    if to:
        log.trim_to(pos)
        click.echo(f"trimmed 0..{pos}")
    else:
        log.trim(pos)
        click.echo(f"trimmed {pos}")


@cli.command(context_settings=CONTEXT)
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@pass_env
def info(env: Env, name: str, as_json: bool) -> None:
    """Show the views, epoch, width, tail, config and sequencer of NAME."""
    from .status import Probes, consumer_status, registry_daemons, sequencer_of, stored, view_dict

    log = env.open(name)
    tail_pos = log.tail()
    meta = log.refresh()
    views = [view_dict(v) for v in meta.views]
    probes = Probes()
    seqr = sequencer_of(env.pool, name, meta.sequencer, meta.sequencer_epoch, env.seqr, probes,
                        registry_daemons(env.cluster, env.pool, probes))
    doc = {"name": name, "pool": env.pool, "epoch": meta.epoch, "width": views[-1]["width"],
           "tail": tail_pos, "views": views, "config": log.config, "stored": stored(log.state, meta),
           "sequencer": seqr, "consumers": consumer_status(log.consumers(), tail_pos)}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"log:    {name} (pool {env.pool})")
    click.echo(f"epoch:  {doc['epoch']}")
    click.echo(f"width:  {doc['width']}")
    click.echo(f"tail:   {tail_pos}")
    click.echo(f"config: {json.dumps(doc['config'])}")
    click.echo(f"seqr:   {_seqr_line(seqr)}")
    click.echo(f"stored: {_stored_line(doc['stored'])}")
    click.echo("views:")
    for v in views:
        shape = (f"data format, {v['slots']} positions and {_size(v['byte_bound'])} per object in runs of "
                 f"{v['unit']}, {v['stripes']} stripe(s) open" if v["format"] == "data" else "omap format")
        click.echo(f"  epoch {v['epoch']:>4}  from position {v['start']:>10}  width {v['width']}  ({shape})")
    if doc["consumers"]:
        click.echo("consumers:")
    for c in doc["consumers"]:
        click.echo(f"  {c['name']:<15} position {c['position']:>12}  lag {c['lag']:>10}  "
                   f"committed {c['committed_age_s']}s ago by {c['committed_by']}")


@cli.command(context_settings=CONTEXT)
@click.argument("name")
@click.argument("consumer", required=False)
@click.option("--reset", "reset_to", type=POSITION, default=None, metavar="POS",
              help="set CONSUMER's committed position to POS, even backwards (a rewind or a skip)")
@click.option("--remove", is_flag=True, help="forget CONSUMER's position (it starts afresh next time)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@pass_env
def consumer(env: Env, name: str, consumer: str | None, reset_to: int | None, remove: bool, as_json: bool) -> None:
    """Named consumers of log NAME: committed position, lag, last commit.

    With CONSUMER: that one only; --reset POS or --remove change it (stop
    its instances first: one still running may commit over a reset)."""
    from ..core import offsets
    from .status import consumer_status

    if (reset_to is not None or remove) and consumer is None:
        raise click.UsageError("--reset and --remove need a CONSUMER")
    if reset_to is not None and remove:
        raise click.UsageError("--reset and --remove do not go together")
    log = env.open(name)  # LogNotFound if missing
    if consumer is not None:
        offsets.check_consumer_name(consumer)
    io = log.consumer_ioctx()
    if reset_to is not None:
        offsets.reset(io, name, consumer, reset_to)  # type: ignore[arg-type]
    elif remove:
        if not offsets.remove(io, name, consumer):  # type: ignore[arg-type]
            raise ZlogError(f"consumer {consumer!r} of log {name!r} has no committed position")
    found = log.consumers()
    if consumer is not None:
        if remove:
            click.echo(f"removed consumer {consumer} of {name}")
            return
        if consumer not in found:
            raise ZlogError(f"consumer {consumer!r} of log {name!r} has no committed position")
        found = {consumer: found[consumer]}
    rows = consumer_status(found, log.next_position_hint())
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"log {name} has no named consumers")
    for c in rows:
        click.echo(f"{c['name']:<24} position {c['position']:>12}  lag {c['lag']:>10}  "
                   f"committed {c['committed_age_s']}s ago by {c['committed_by']}")


def _stored_line(st: dict[str, Any]) -> str:
    line = (f"{st['entries']} entries, {_size(st['bytes'])} in {st['objects']} object(s); "
            f"first position {st['first_position']}")
    return line if st["counted"] else line + " (omap-format views not counted)"


def _answers(flag: bool | None) -> str:
    return "answers" if flag else "does not answer"


def _seqr_line(s: dict[str, Any]) -> str:
    if not s["asked"]:
        line = "none: appends find the tail the slow way (seal + max position)"
    else:
        line = f"{s['asked']} ({s['source']}, {_answers(s['asked_answers'])})"
    if s["recorded"] and s["given"] and s["given"] != s["recorded"]:
        line += f"; given {s['given']} ({_answers(s['given_answers'])}) is not asked"
    return line


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@pass_env
def status(env: Env, as_json: bool) -> None:
    """Every log of the pool (epoch, views, tail, sequencer) and the sequencers seen.

    Read-only: the tail is the one in storage (no seal, no sequencer asked)."""
    from .status import pool_status

    doc = pool_status(env.cluster, env.pool, env.seqr)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"pool {env.pool}: {doc['log_count']} log(s), {len(doc['sequencers'])} sequencer(s) seen")
    use = doc["usage"]
    quota = (f"quota {_size(use['quota_max_bytes'])}" if use["quota_max_bytes"] else "no byte quota") + \
        (f", {use['quota_max_objects']} objects" if use["quota_max_objects"] else "")
    click.echo(f"  ceph counts {_size(use['stored_bytes'])} stored in {use['objects'] if use['objects'] is not None else '?'}"
               f" object(s); {quota}")
    if doc["logs"]:
        click.echo(f"  {'LOG':<24} {'EPOCH':>6} {'VIEWS':>5} {'WIDTH':>5} {'TAIL':>12} {'ENTRIES':>10} "
                   f"{'STORED':>10}  SEQUENCER")
    for entry in doc["logs"]:
        if "error" in entry:
            click.echo(f"  {entry['name']:<24} error: {entry['error']}")
            continue
        st = entry["stored"]
        entries = f"{st['entries']}" + ("" if st["counted"] else "+")
        click.echo(f"  {entry['name']:<24} {entry['epoch']:>6} {len(entry['views']):>5} {entry['width']:>5} "
                   f"{entry['tail']:>12} {entries:>10} {_size(st['bytes']):>10}  {_seqr_line(entry['sequencer'])}")
        for c in entry.get("consumers", []):
            click.echo(f"    consumer {c['name']:<15} position {c['position']:>12}  lag {c['lag']:>10}  "
                       f"committed {c['committed_age_s']}s ago by {c['committed_by']}")
    click.echo("sequencers:")
    for s in doc["sequencers"]:
        how = "registered" if s["registered"] else "not registered"
        click.echo(f"  {s['address']:<24} {_answers(s['answers'])}, {how}, recorded by {s['logs']} log(s)")
    if not doc["sequencers"]:
        click.echo("  none (no daemon registered, none recorded, no --seqr)")


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--log", "log_name", default=None, metavar="NAME", help="with --deep: the log to scan")
@click.option("--deep", is_flag=True, help="scan every object of --log for damage at rest: objects whose "
                                           "header is lost, entries that do not parse (reads every entry)")
@pass_env
def check(env: Env, as_json: bool, log_name: str | None, deep: bool) -> None:
    """Is this cluster ready for pyzlog? Run it first: cluster reachable, pool,
    cls_zlog loaded on every OSD, this client's caps, sequencer. One line per
    check; exits 1 if any fails.

    With --log NAME --deep: list every damaged object and position of the
    log instead (progress on stderr); exits 1 if any is found. A lost
    header is rebuilt by `zlog repair` (docs/faults.md)."""
    if deep or log_name:
        if not (deep and log_name):
            raise click.UsageError("--deep and --log NAME go together")
        _check_deep(env, log_name, as_json)
        return
    from .doctor import run_checks

    results = run_checks(env)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        for r in results:
            click.echo(f"{r.status.upper():<5} {r.name}: {r.detail}")
    if any(r.status == "fail" for r in results):
        raise click.exceptions.Exit(1)


def _check_deep(env: Env, name: str, as_json: bool) -> None:
    from ..core.state import LogState
    from .damage import deep_scan

    shown = [0.0]

    def progress(done: int, total: int, damaged: int) -> None:
        now = time.monotonic()
        if done == total or now - shown[0] >= 1.0:
            shown[0] = now
            click.echo(f"# scanned {done}/{total} objects of {name!r}, {damaged} damaged", err=True)

    found, objects = deep_scan(LogState(env.cluster, env.pool, name), progress)
    if as_json:
        click.echo(json.dumps({"log": name, "objects": objects, "damaged": [d.as_dict() for d in found]}, indent=2))
    else:
        for d in found:
            where = d.oid if d.position is None else f"{d.oid} position {d.position}"
            click.echo(f"DAMAGED {d.kind}: {where}: {d.detail}")
        click.echo(f"{len(found)} damaged in {objects} object(s) of log {name!r}")
    if found:
        raise click.exceptions.Exit(1)


@cli.command(context_settings=CONTEXT)
@click.argument("name")
@click.option("--object", "oid", required=True, metavar="OID",
              help="the data object whose header is lost (as zlog check --log NAME --deep names it)")
@pass_env
def repair(env: Env, name: str, oid: str) -> None:
    """Rebuild the lost header of one data object of NAME from its entries
    (highest position, counts) and the log's metadata (sealed epoch, trim
    point, view end). Only acts on an object whose header is missing, empty
    or unparsable and whose entries are all sound; never run automatically.
    See docs/faults.md."""
    from ..core.state import LogState
    from .damage import repair as rebuild

    st = rebuild(LogState(env.cluster, env.pool, name), oid)
    top = "none" if st.max_position is None else st.max_position
    end = "" if st.view_end is None else f", view end {st.view_end}"
    click.echo(f"repaired {oid}: sealed epoch {st.sealed_epoch}, max position {top}, trim below {st.trim_below}{end}")


@cli.command(name="ls", context_settings=CONTEXT)
@pass_env
def ls_(env: Env) -> None:
    """List the logs of the pool."""
    from ..client.log import Log

    for name in sorted(Log.list(env.cluster, env.pool)):
        click.echo(name)


@cli.command(context_settings=CONTEXT)
@click.argument("name")
@click.option("--width", type=click.IntRange(1, 1024), required=True,
              help="stripe width of the new view")
@pass_env
def reconfigure(env: Env, name: str, width: int) -> None:
    """Stripe NAME's new positions over WIDTH objects (a new view)."""
    log = env.open(name)
    v = log.reconfigure(width)
    click.echo(f"new view: epoch {v.epoch}, from position {v.start}, width {v.width}")


@cli.command(context_settings=CONTEXT)
@click.argument("entity")
@click.option("--expire", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="how long the blocklist entries last [default: one week, longer than any ticket "
                   "the revoked instances hold]")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@pass_env
def revoke(env: Env, entity: str, expire: float | None, as_json: bool) -> None:
    """Cut ENTITY (client.NAME) off the cluster: delete its cephx key and
    blocklist every connection it has open, so clients already connected
    fail too (pyzlog raises Blocklisted) instead of going on with the
    tickets they hold. Needs an admin client. See docs/deploy.md."""
    from .revoke import DEFAULT_EXPIRE_SECONDS, revoke as cut_off

    r = cut_off(env.cluster, entity, DEFAULT_EXPIRE_SECONDS if expire is None else expire, me=env.client)
    if as_json:
        click.echo(json.dumps(r.as_dict(), indent=2))
        return
    key = "key deleted" if r.key_removed else "had no key"
    click.echo(f"{entity}: {key}; {len(r.addresses)} open connection(s) blocklisted for {r.expire_seconds:g}s"
               + (f" (osdmap epoch {r.osdmap_epoch})" if r.addresses else ""))
    for addr in r.addresses:
        click.echo(f"  {addr}")
    if r.lagging_osds:
        click.echo(f"warning: OSDs {', '.join(map(str, r.lagging_osds))} had not got osdmap epoch "
                   f"{r.osdmap_epoch} yet; they refuse the instances once they do", err=True)


@cli.group(name="seqr-secret", context_settings=CONTEXT)
def seqr_secret() -> None:
    """The pool's sequencer secret: clients prove with it that they may take
    positions (docs/deploy.md, "Rotating the sequencer secret")."""


def _secret_lines(pool: str, secret: Any) -> list[str]:
    lines = [f"pool {pool}: sequencer secret generation {secret.current.generation}"]
    for k in secret.keys:
        role = "current" if k is secret.current else "previous (still accepted)"
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(k.created))
        lines.append(f"  generation {k.generation}: {role}, made {when}")
    return lines


@seqr_secret.command(name="show", context_settings=CONTEXT)
@pass_env
def seqr_secret_show(env: Env) -> None:
    """The generations held and when they were made (never the key)."""
    from ..core.seqr_auth import read_secret

    for line in _secret_lines(env.pool, read_secret(env.cluster, env.pool, create=False)):
        click.echo(line)


@seqr_secret.command(name="rotate", context_settings=CONTEXT)
@click.option("--drop-previous", is_flag=True,
              help="revoke the current key at once (a leaked key): daemons close the connections that proved "
                   "it, and clients still holding only it are refused until they read the new one")
@pass_env
def seqr_secret_rotate(env: Env, drop_previous: bool) -> None:
    """Make a new current key. The current one stays accepted as the previous
    until the next rotation, so no client fails; daemons take the new one
    within --secret-refresh seconds (or at once on SIGHUP)."""
    from ..core.seqr_auth import rotate_secret

    for line in _secret_lines(env.pool, rotate_secret(env.cluster, env.pool, drop_previous=drop_previous)):
        click.echo(line)


# -------------------------------------------------------------------- bench
@cli.group(context_settings=CONTEXT)
def bench() -> None:
    """Benchmarks; each writes a JSON results file and prints a Markdown table."""


def _bench_out(kind: str, out: str | None) -> str:
    return out or os.path.join("results", f"bench-{kind}.json")


@bench.command(name="seqr", context_settings=CONTEXT)
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True,
              help="seconds per case (11 cases)")
@click.option("--processes", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--depth", type=click.IntRange(1, 65536), default=128, show_default=True)
@click.option("--out", default=None, metavar="FILE", help="[default: results/bench-seqr.json]")
def bench_seqr(duration: float, processes: int, depth: int, out: str | None) -> None:
    """The sequencer against the echo floor (no Ceph needed)."""
    from ..bench import bench as b

    b.bench_seqr(duration, processes, depth, _bench_out("seqr", out))


@bench.command(name="append", context_settings=CONTEXT)
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="seconds per case, split over the rounds")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True,
              help="zlog and raw alternate this many times per depth")
@click.option("--size", type=click.IntRange(0, 1 << 20), default=1024, show_default=True,
              help="entry size in bytes")
@click.option("--depths", default="1,16,128", show_default=True, callback=lambda c, p, v: _depths(v),
              help="operations in flight, comma separated")
@click.option("--batch", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="entries per append_many call")
@click.option("--width", type=click.IntRange(1, 1024), default=4, show_default=True)
@click.option("--aio-tasks", type=click.IntRange(0, 1_000_000), default=1000, show_default=True,
              help="asyncio tasks awaiting pyzlog.aio append at the deepest depth (0: no such case)")
@click.option("--out", default=None, metavar="FILE",
              help="[default: results/bench-append.json; the plot goes beside it as .png]")
@pass_env
def bench_append(env: Env, duration: float, rounds: int, size: int, depths: list[int], batch: int,
                 width: int, aio_tasks: int, out: str | None) -> None:
    """Append throughput and latency of zlog against raw librados writes."""
    from ..bench import bench as b

    b.bench_append(env, duration=duration, rounds=rounds, size=size, depths=depths, batch=batch,
                   width=width, aio_tasks=aio_tasks, out=_bench_out("append", out))


@bench.command(name="read", context_settings=CONTEXT)
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=6.0, show_default=True,
              help="seconds per case, split over the rounds")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True,
              help="every case runs once per round")
@click.option("--entries", type=click.IntRange(1, 10_000_000), default=20000, show_default=True)
@click.option("--size", type=click.IntRange(0, 1 << 20), default=1024, show_default=True)
@click.option("--depth", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="reads in flight for read_async and raw aio_read")
@click.option("--width", type=click.IntRange(1, 1024), default=4, show_default=True)
@click.option("--out", default=None, metavar="FILE", help="[default: results/bench-read.json]")
@pass_env
def bench_read(env: Env, duration: float, rounds: int, entries: int, size: int, depth: int, width: int,
               out: str | None) -> None:
    """Streaming and random reads against raw librados reads."""
    from ..bench import bench as b

    b.bench_read(env, duration=duration, rounds=rounds, entries=entries, size=size, depth=depth, width=width,
                 out=_bench_out("read", out))


@bench.command(name="compare", context_settings=CONTEXT)
@click.option("--baseline", required=True, metavar="DIR",
              help="a directory holding another build's pyzlog package (pip install --no-deps --target DIR ...)")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="seconds per case and round")
@click.option("--rounds", type=click.IntRange(1, 100), default=6, show_default=True,
              help="each case runs once per round and build, alternately; from 6 rounds on a case gets a "
                   "verdict (slower, faster, no difference shown)")
@click.option("--size", type=click.IntRange(0, 1 << 20), default=1024, show_default=True)
@click.option("--entries", type=click.IntRange(1, 10_000_000), default=20000, show_default=True,
              help="entries of the log the read cases read")
@click.option("--cases", default=None, metavar="A,B,...",
              help="the cases to run, comma-separated [default: all: append_async, append_many, append, stream, "
                   "stream_batches, read, read_async]")
@click.option("--out", default=None, metavar="FILE", help="[default: results/bench-before-after.json]")
@click.option("--baseline-reads", type=click.Choice(["data", "omap"]), default="data", show_default=True,
              help="the format of the log the baseline reads: data (unit 1; builds since the data format "
                   "became the default) or omap (round 2's builds)")
@pass_env
def bench_compare(env: Env, baseline: str, duration: float, rounds: int, size: int, entries: int,
                  cases: str | None, out: str | None, baseline_reads: str) -> None:
    """This build of the client against another one, same cluster, one sitting."""
    from ..bench.compare import CASES
    from ..bench.compare import bench_compare as run
    from ..core.cluster import resolve_conf

    chosen = CASES if cases is None else tuple(c.strip() for c in cases.split(",") if c.strip())
    unknown = [c for c in chosen if c not in CASES]
    if unknown or not chosen:
        raise click.BadParameter(f"{', '.join(unknown) or 'none given'}: the cases are {', '.join(CASES)}",
                                 param_hint="--cases")
    run(resolve_conf(env.conf), env.pool, baseline, seqr=env.seqr or "", duration=duration, rounds=rounds,
        size=size, entries=entries, out=out or "results/bench-before-after.json", cases=chosen,
        baseline_reads=baseline_reads)


def _batching_settings(_ctx: Any, _param: Any, values: tuple[str, ...]) -> list[Any]:
    """--setting NAME=N,... -> AppendBatching, each parsed once, here."""
    from ..bench.batching_bench import DEFAULT_SETTINGS, parse_setting
    from ..core.errors import InvalidRequest

    try:
        return [parse_setting(v) for v in values or DEFAULT_SETTINGS]
    except InvalidRequest as e:
        raise click.BadParameter(str(e), param_hint="--setting") from None


@bench.command(name="batching", context_settings=CONTEXT)
@click.option("--setting", "settings", multiple=True, callback=_batching_settings, metavar="NAME=N[,NAME=N]",
              help="an AppendBatching to set against the defaults (repeatable) [default: linger_us=200, "
                   "max_batches_in_flight=1, max_batches_in_flight=4, max_batch=64]")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=4.0, show_default=True,
              help="seconds per setting, split over the rounds")
@click.option("--rounds", type=click.IntRange(1, 100), default=6, show_default=True,
              help="every setting runs once per round; from 6 rounds on a setting gets a verdict")
@click.option("--size", type=click.IntRange(0, 1 << 20), default=1024, show_default=True)
@click.option("--depth", type=click.IntRange(1, 65536), default=128, show_default=True,
              help="append_async in flight (the log's max_in_flight)")
@click.option("--width", type=click.IntRange(1, 1024), default=4, show_default=True)
@click.option("--out", default=None, metavar="FILE", help="[default: results/bench-batching.json]")
@pass_env
def bench_batching(env: Env, settings: list[Any], duration: float, rounds: int, size: int, depth: int,
                   width: int, out: str | None) -> None:
    """append_async under append batching settings against the defaults."""
    from ..bench.batching_bench import bench_batching as run

    run(env, settings=settings, duration=duration, rounds=rounds, size=size, depth=depth, width=width,
        out=_bench_out("batching", out))


@bench.command(name="peer", context_settings=CONTEXT)
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="seconds per case (10 or 11 cases), split over the rounds")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True,
              help="every case runs once per round, zlog and Redis alternately")
@click.option("--size", type=click.IntRange(1, 1 << 20), default=1024, show_default=True,
              help="entry size in bytes")
@click.option("--depth", type=click.IntRange(1, 65536), default=128, show_default=True,
              help="append_async in flight, and XADDs per Redis pipeline")
@click.option("--batch", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="entries per append_many call and per raw batch write")
@click.option("--width", type=click.IntRange(1, 1024), default=4, show_default=True)
@click.option("--entries", type=click.IntRange(1, 10_000_000), default=20000, show_default=True,
              help="entries in the log and the Redis stream that the read cases scan")
@click.option("--out", default=None, metavar="FILE", help="[default: results/bench-peer.json]")
@pass_env
def bench_peer(env: Env, duration: float, rounds: int, size: int, depth: int, batch: int, width: int,
               entries: int, out: str | None) -> None:
    """pyzlog against Redis Streams (a redis-server of its own) and raw librados batch writes."""
    from ..bench.peer import bench_peer as run

    run(env, duration=duration, rounds=rounds, size=size, depth=depth, batch=batch, width=width,
        entries=entries, out=_bench_out("peer", out))


@bench.command(name="storage", context_settings=CONTEXT)
@click.option("--entries", type=click.IntRange(2, 100_000_000), default=2_000_000, show_default=True)
@click.option("--size", type=click.IntRange(1, 1 << 20), default=128, show_default=True,
              help="entry size in bytes")
@click.option("--batch", type=click.IntRange(1, 4096), default=256, show_default=True,
              help="entries per append_many call")
@click.option("--slots", type=click.IntRange(1), default=None, help="positions per object [default: the log default]")
@click.option("--out", default=None, metavar="FILE", help="[default: results/bench-storage.json]")
@pass_env
def bench_storage(env: Env, entries: int, size: int, batch: int, slots: int | None, out: str | None) -> None:
    """A big width-1 log: its objects' bounds, and the space trim_to gives back."""
    from ..bench.storage_bench import bench_storage as run

    run(env, entries=entries, size=size, batch=batch, slots=slots, out=_bench_out("storage", out))


@bench.command(name="objects", context_settings=CONTEXT)
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=12.0, show_default=True,
              help="seconds per write case, split over the rounds")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True,
              help="every case runs once per round, alternately")
@click.option("--size", type=click.IntRange(0, 1 << 19), default=100, show_default=True,
              help="bytes of each map value")
@click.option("--depth", type=click.IntRange(1, 65536), default=128, show_default=True,
              help="puts and appends in flight in the async cases")
@click.option("--entries", type=click.IntRange(20, 10_000_000), default=40000, show_default=True,
              help="puts in the log the replay cases play (a checkpoint half way)")
@click.option("--width", type=click.IntRange(1, 1024), default=4, show_default=True)
@click.option("--replay-passes", type=click.IntRange(1, 100), default=5, show_default=True,
              help="passes of each replay case per round (one takes tens of ms: one alone is noise)")
@click.option("--out", default=None, metavar="FILE", help="[default: results/bench-objects.json]")
@pass_env
def bench_objects(env: Env, duration: float, rounds: int, size: int, depth: int, entries: int, width: int,
                  replay_passes: int, out: str | None) -> None:
    """Replicated objects (pyzlog.objects): puts and transactions against raw appends, replay speed."""
    from ..bench.objects_bench import bench_objects as run

    run(env, duration=duration, rounds=rounds, size=size, depth=depth, entries=entries, width=width,
        replay_passes=replay_passes, out=_bench_out("objects", out))


@bench.command(name="failover", context_settings=CONTEXT)
@click.option("--kills", type=click.IntRange(0, 1000), default=20, show_default=True,
              help="rounds that kill -9 the active sequencer")
@click.option("--pauses", type=click.IntRange(0, 1000), default=10, show_default=True,
              help="rounds that SIGSTOP it past its lease")
@click.option("--lease", type=click.FloatRange(0.2, 60), default=2.0, show_default=True,
              help="the standby daemons' lease, seconds")
@click.option("--many-logs", type=click.IntRange(0, 100000), default=300, show_default=True,
              help="then: this many logs over three daemons, one killed: time until its logs moved")
@click.option("--out", default=None, metavar="FILE", help="[default: results/bench-failover.json]")
@pass_env
def bench_failover(env: Env, kills: int, pauses: int, lease: float, many_logs: int, out: str | None) -> None:
    """Sequencer failover: appends' gap after the active sequencer dies or stalls."""
    from ..core.cluster import resolve_conf
    from ..bench.failover_bench import bench_failover as run

    run(env.cluster, resolve_conf(env.conf), env.pool, kills, pauses, lease, _bench_out("failover", out),
        many_logs)


@bench.command(name="soak", context_settings=CONTEXT)
@click.option("--minutes", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="how long to run")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="how long to run, in seconds (instead of --minutes; for short runs)")
@click.option("--sample-interval", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="seconds between samples of RSS, fds and threads")
@click.option("--failover-every", type=click.FloatRange(min=0), default=180.0, show_default=True,
              help="seconds between sequencer failovers (SIGSTOP past the lease; every third kill -9); 0: none")
@click.option("--warmup", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="seconds of a process's life not judged for growth")
@click.option("--rate", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="appends a second, over the sync, async and batch appenders")
@click.option("--size", type=click.IntRange(1, 1 << 20), default=256, show_default=True, help="entry size in bytes")
@click.option("--keep", type=click.IntRange(1, 10_000_000), default=20000, show_default=True,
              help="entries kept below the tail; older ones are trimmed")
@click.option("--out", default=None, metavar="FILE", help="[default: results/soak.json]")
@pass_env
def bench_soak(env: Env, minutes: float, seconds: float | None, sample_interval: float, failover_every: float,
               warmup: float, rate: float, size: int, keep: int, out: str | None) -> None:
    """Hours of appends, streams and reads with sequencer failovers; RSS, fds and threads sampled for growth."""
    from ..bench.soak import bench_soak as run
    from ..core.cluster import resolve_conf

    run(env.cluster, resolve_conf(env.conf), env.pool, seconds if seconds is not None else minutes * 60,
        out or os.path.join("results", "soak.json"), sample_interval=sample_interval,
        failover_every=failover_every, warmup=warmup, rate=rate, size=size, keep=keep)


# --------------------------------------------------------------------- main
def _error(message: str, code: int) -> NoReturn:
    lines = [ln.strip() for ln in str(message).strip().splitlines() if ln.strip()]
    text = " ".join(lines) or "unknown error"
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass
    print(f"zlog: error: {text}", file=sys.stderr, flush=True)
    sys.exit(code)


_NoArgsIsHelp: type[click.UsageError] = getattr(click.exceptions, "NoArgsIsHelpError", type("_Never", (click.UsageError,), {}))


def main(argv: list[str] | None = None) -> None:
    """Entry point: every failure becomes one `zlog: error:` line."""
    import rados

    try:
        rv = cli.main(args=argv, prog_name="zlog", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except _NoArgsIsHelp as e:  # bare `zlog` or `zlog bench`: the help, not an error
        click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message())
        sys.exit(0)
    except click.UsageError as e:
        hint = f" (try '{e.ctx.command_path} -h')" if e.ctx is not None else ""
        _error(e.format_message() + hint, e.exit_code)
    except click.ClickException as e:
        _error(e.format_message(), e.exit_code)
    except ZlogError as e:
        _error(str(e) or type(e).__name__, 1)
    except rados.Error as e:
        _error(f"ceph: {e}", 1)
    except (click.Abort, KeyboardInterrupt):
        print(file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # the reader went away (zlog cat | head): not an error
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        sys.exit(0)
    except OSError as e:
        _error(str(e), 1)
    except Exception as e:  # noqa: BLE001 - a bug: one line, traceback on request
        if os.environ.get("ZLOG_DEBUG"):
            raise
        _error(f"internal error: {type(e).__name__}: {e} (set ZLOG_DEBUG=1 for the traceback)", 1)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
