"""Errors of the replicated-object layer. All are pyzlog.ZlogError, so a
caller that catches the log's errors catches these too."""
from __future__ import annotations

from pyzlog import InvalidRequest, ZlogError


class ObjectsError(ZlogError):
    """Base of every error the object layer raises itself."""


class BadEntry(ObjectsError):
    """An entry (or a checkpoint) of this layer does not parse: damaged, or
    written by something that only looks like this layer."""


class UnsupportedEntry(ObjectsError):
    """An entry written by a newer version of this layer. A replica cannot
    skip it (others would apply it and the states would differ), so it stops."""


class NotHosted(ObjectsError):
    """An operation on an object this runtime does not host, or a transaction
    this runtime cannot decide because it reads an object hosted elsewhere."""


class RuntimeFailed(ObjectsError):
    """The runtime stopped playing the log after an error it cannot get past
    (the cause is chained); every later call raises this."""


class RuntimeClosed(ObjectsError):
    """The runtime was closed."""


class OutcomeUnknown(ObjectsError):
    """A proposal's append kept failing until its deadline and retiring it
    failed too: it may still be applied later (exactly once at most)."""


class NotApplied(ObjectsError):
    """A proposal was retired after its appends failed: it was never applied
    and never will be."""


class ResultUnavailable(ObjectsError):
    """The command was applied (exactly once), but this runtime started from a
    checkpoint taken after it, so its result is not known here."""


class TransactionAborted(ObjectsError):
    """A transaction kept aborting (its reads were overwritten before its
    commit record) until its retries ran out."""


class CheckpointError(ObjectsError):
    """No usable checkpoint where one is needed (the log is trimmed below
    where this runtime must start), or a checkpoint that fails its checksum."""


class WrongType(ObjectsError, InvalidRequest):
    """A command meant for another kind of object (two processes host the
    same name as different types), or a checkpoint of another type."""


__all__ = ["ObjectsError", "BadEntry", "UnsupportedEntry", "NotHosted", "RuntimeFailed", "RuntimeClosed",
           "OutcomeUnknown", "NotApplied", "ResultUnavailable", "TransactionAborted", "CheckpointError",
           "WrongType"]
