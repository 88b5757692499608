"""What an operation does when the storage refuses its epoch (ESTALE).

Usually the log moved on (a reconfiguration, a sequencer's recovery): refresh
the metadata and retry at once. If the metadata shows no newer epoch, objects
are sealed above it: an epoch change is under way, or its proposer died
between sealing and installing. Wait with back-off; after
REPAIR_AFTER_SECONDS finish the epoch change ourselves (seal a newer epoch and
install it, completing a half-done reconfiguration at the end it recorded);
after STALE_RETRY_SECONDS give up with StaleEpoch. No caller loops on ESTALE
without this, so no refused epoch can make an operation spin or hang.
"""
from __future__ import annotations

import random
import time

from ..core.errors import StaleEpoch
from ..core.state import LogState
from ..core.tailfind import repair

#: an operation refused for this long, the log's epoch never moving, raises StaleEpoch
STALE_RETRY_SECONDS = 30.0
#: the log's epoch unchanged this long while its objects refuse it: finish the
#: epoch change someone else started (they may have died half way)
REPAIR_AFTER_SECONDS = 2.0


class StaleWait:
    """One operation's handling of refused epochs; call it with the epoch that
    was refused, then retry. Raises StaleEpoch once the operation has been
    refused for STALE_RETRY_SECONDS."""

    def __init__(self, log: LogState, what: str, limit: float = STALE_RETRY_SECONDS) -> None:
        self.log = log
        self.what = what
        self.limit = limit
        self._first: float | None = None
        self._stuck_since: float | None = None
        self._delay = 0.002

    def __call__(self, refused_epoch: int) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        elif now - self._first > self.limit:
            self.reset()  # a long-lived waiter (async appends) starts afresh after giving up
            raise StaleEpoch(f"{self.what} on log {self.log.name!r}: epoch {refused_epoch} refused "
                             f"for {self.limit:.0f}s and no newer epoch was installed")
        if self.log.refresh_epoch() > refused_epoch:
            self._stuck_since = None
            return  # the log moved on: retry at the new epoch now
        if self._stuck_since is None:
            self._stuck_since = now
        if now - self._stuck_since >= REPAIR_AFTER_SECONDS:
            self._stuck_since = None
            repair(self.log, refused_epoch)
            return
        time.sleep(self._delay * random.uniform(0.5, 1.5))
        self._delay = min(self._delay * 2, 0.2)

    def reset(self) -> None:
        """The operation made progress: a later refusal starts a new wait."""
        self._first = self._stuck_since = None
        self._delay = 0.002
