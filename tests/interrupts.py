"""A Ctrl-C at an exact moment: just after a call returned (CPython runs
signal handlers at the check after a C call), for tests of what an
interrupt between two steps leaves behind."""
from __future__ import annotations

from typing import Any


class InterruptAfter:
    """Calls `call` (then `before_raise`, if given), then raises KeyboardInterrupt."""

    def __init__(self, call: Any, before_raise: Any = None) -> None:
        self.call, self.before_raise = call, before_raise

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.call(*args, **kw)
        if self.before_raise is not None:
            self.before_raise()
        raise KeyboardInterrupt


class InterruptedWindow:
    """A log's window (pyzlog._appender.Window) whose take and take_over are
    each followed by an interrupt; everything else is the window's own."""

    def __init__(self, window: Any) -> None:
        self._window = window
        self.take = self.take_over = InterruptAfter(window.take)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._window, name)
