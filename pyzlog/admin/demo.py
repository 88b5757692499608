"""`python -m pyzlog.demo`: show a log working on a running cluster."""
from __future__ import annotations

import argparse
import sys
import time
import uuid

from .. import Log, ZlogError, connect
from ..core.sequencer import authenticate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--conf", default=None, help="ceph.conf (default: $CEPH_CONF)")
    ap.add_argument("--pool", default="zlog")
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--seqr", default=None,
                    help="sequencer HOST:PORT (default: the one the pool's daemons choose for the log)")
    args = ap.parse_args(argv)
    try:
        cluster = connect(args.conf)
        name = f"demo-{uuid.uuid4().hex[:8]}"
        log = Log.create(cluster, args.pool, name, width=4, sequencer=args.seqr)
        print(f"created log {name!r} in pool {args.pool!r}: width 4, epoch {log.epoch}")
        first_epoch = log.epoch
        pos = log.append(b"hello, shared log")
        print(f"appended an entry at position {pos}; read back: {log.read(pos)!r}")
        seqr = log.refresh().sequencer
        if seqr:
            print(f"  (epoch {first_epoch} -> {log.epoch}: sequencer {seqr} sealed a new epoch when it took "
                  "the log, and recorded itself in the log's metadata, where every client finds it)")
            print(f"  (the connection proved it holds the secret of pool {args.pool!r}, read with this client's cephx "
                  f"caps, and the sequencer proved it too: {authenticate(seqr, args.pool, log.positions.credentials)})")
        else:
            print("  (no sequencer serves the pool: positions come from slow tail finding)")
        t0 = time.perf_counter()
        futures = [log.append_async(b"entry %d" % i) for i in range(args.entries)]
        positions = [f.result() for f in futures]
        dt = time.perf_counter() - t0
        assert len(set(positions)) == len(positions)
        print(f"appended {args.entries} entries asynchronously in {dt:.2f}s "
              f"({args.entries / dt:,.0f}/s, positions {min(positions)}..{max(positions)})")
        log.fill(max(positions) + 1)
        log.trim(pos)
        t0 = time.perf_counter()
        records = list(log.stream(0))
        dt = time.perf_counter() - t0
        by_pos = {r.position: r for r in records}
        intact = all(by_pos[p].data == b"entry %d" % i for i, p in enumerate(positions))
        kinds = {k: sum(1 for r in records if r.kind == k) for k in {r.kind for r in records}}
        print(f"streamed positions 0..{records[-1].position} in {dt:.2f}s: "
              + ", ".join(f"{n} {k.value}" for k, n in sorted(kinds.items())) + f"; all data intact: {intact}")
        epoch, nxt = log.seal_and_find_tail()
        print(f"slow tail finding sealed epoch {epoch}: the next position is {nxt}")
        log.close()
        cluster.shutdown()
        return 0 if intact else 1
    except ZlogError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
