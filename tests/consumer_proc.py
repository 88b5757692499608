"""A named consumer as a process of its own, for tests that kill it.

    python consumer_proc.py CONF POOL LOG CONSUMER BATCH HANG_AFTER_COMMITS

Streams the log (not following: it stops at the tail) and prints one line
per event, flushed: "start P" (where it resumes), "processed P" after a
record is processed, "committed P" after a commit. It commits after every
BATCH records; after HANG_AFTER_COMMITS commits (-1: never) it prints "hang"
before the next commit and waits on stdin, processed but not committed,
for the test to kill it there. "done P" at the tail.
"""
from __future__ import annotations

import sys

from pyzlog import Log, connect


def main() -> None:
    conf, pool, name, consumer, batch, hang_after = sys.argv[1:7]
    log = Log.open(connect(conf), pool, name)
    c = log.consumer(consumer)
    print("start", c.position, flush=True)
    commits, since = 0, 0
    for rec in c.stream(follow=False):
        print("processed", rec.position, flush=True)
        since += 1
        if since == int(batch):
            if commits == int(hang_after):
                print("hang", flush=True)
                sys.stdin.readline()  # killed here: processed, not committed
            c.commit()
            commits, since = commits + 1, 0
            print("committed", c.committed, flush=True)
    print("done", c.position, flush=True)


if __name__ == "__main__":
    main()
