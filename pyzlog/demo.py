"""`python -m pyzlog.demo`: show a log working on a running cluster."""
from __future__ import annotations

import argparse
import sys
import time
import uuid

from . import Log, ZlogError, connect


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--conf", default=None, help="ceph.conf (default: $CEPH_CONF)")
    ap.add_argument("--pool", default="zlog")
    ap.add_argument("--entries", type=int, default=1000)
    args = ap.parse_args(argv)
    try:
        cluster = connect(args.conf)
        name = f"demo-{uuid.uuid4().hex[:8]}"
        log = Log.create(cluster, args.pool, name, width=4)
        print(f"created log {name!r} in pool {args.pool!r}: width 4, epoch {log.epoch}")
        pos = log.append_slow(b"hello, shared log")
        print(f"appended an entry at position {pos}; read back: {log.read(pos)!r}")
        t0 = time.perf_counter()
        positions = [log.append_slow(b"entry %d" % i) for i in range(args.entries)]
        dt = time.perf_counter() - t0
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        bad = [p for i, p in enumerate(positions) if log.read(p) != b"entry %d" % i]
        print(f"appended {args.entries} entries in {dt:.2f}s ({args.entries / dt:,.0f}/s, "
              f"positions {positions[0]}..{positions[-1]}), all read back intact: {not bad}")
        log.fill(positions[-1] + 5)
        epoch, nxt = log.seal_and_find_tail()
        print(f"slow tail finding sealed epoch {epoch}: next position is {nxt}")
        cluster.shutdown()
        return 0 if not bad else 1
    except ZlogError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
