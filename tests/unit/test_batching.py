"""AppendBatching: the append pipeline's knobs, checked before anything connects."""
from __future__ import annotations

import pytest

from pyzlog.bench.batching_bench import DEFAULT_SETTINGS, label, parse_setting
from pyzlog.core.batching import MAX_LINGER_US, AppendBatching
from pyzlog.core.cluster import connect
from pyzlog.core.errors import InvalidRequest


def test_defaults_are_the_pipelines() -> None:
    assert AppendBatching().pipeline_options() == {
        "linger_us": 0, "max_batch": 4096, "max_batches_in_flight": 2,
        "window_entries": 65536, "window_bytes": 256 << 20}


@pytest.mark.parametrize("field, value", [
    ("linger_us", -1), ("linger_us", MAX_LINGER_US + 1), ("max_batch", 0), ("max_batch", 2**32),
    ("max_batches_in_flight", 0), ("window_entries", 0), ("window_bytes", 0),
    ("max_batch", 1.5), ("linger_us", "5"), ("window_entries", True), ("max_batch", None)])
def test_bad_values_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(InvalidRequest, match=field):
        AppendBatching(**{field: value})  # type: ignore[arg-type]


def test_connect_refuses_what_is_not_append_batching() -> None:
    # refused before any ceph.conf is looked for or rados imported
    with pytest.raises(InvalidRequest, match="AppendBatching"):
        connect("/nonexistent/ceph.conf", append_batching={"max_batch": 8})  # type: ignore[arg-type]


def test_settings_are_kept() -> None:
    b = AppendBatching(linger_us=500, max_batch=64, max_batches_in_flight=2, window_entries=1000, window_bytes=1 << 20)
    assert b.pipeline_options()["max_batch"] == 64 and b.linger_us == 500
    with pytest.raises(AttributeError):
        b.max_batch = 1  # type: ignore[misc]  # frozen: a connection's pipeline is made once


def test_bench_settings_parse_and_name_what_differs() -> None:
    b = parse_setting("linger_us=200, max_batch=64")
    assert (b.linger_us, b.max_batch, b.max_batches_in_flight) == (200, 64, 2)
    assert label(b) == "linger_us=200,max_batch=64" and label(AppendBatching()) == "defaults"
    assert all(label(parse_setting(s)) == s for s in DEFAULT_SETTINGS)


@pytest.mark.parametrize("text, says", [("max_batch", "name=value"), ("max_batch=x", "not an integer"),
                                        ("nosuch=1", "the settings are"), ("max_batch=0", "between")])
def test_bad_bench_settings_say_why(text: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        parse_setting(text)
