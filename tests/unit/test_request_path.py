"""llmserve/router/request_path.py: what HAProxy's stamp says a request waited before the
Router (shield.EDGE_HEADER; the real HAProxy sets it in test_shield_haproxy.py)."""

from __future__ import annotations

import pytest

from llmserve.router.request_path import edge_wait_s


@pytest.mark.parametrize(
    "stamp, now_s, waited_s",
    [
        ("1796676147500000", 1796676147.75, 0.25),  # HAProxy's microseconds, a quarter second
        (None, 1796676147.75, 0.0),  # no HAProxy in front: nothing known, nothing counted
        ("garbage", 1796676147.75, 0.0),
        ("1796676148000000", 1796676147.75, 0.0),  # from the future: a clock step, no wait
        ("1796676000000000", 1796676147.75, 0.0),  # minutes old: a clock step, not a wait
    ],
)
def test_the_edge_stamp_reads_as_what_the_request_waited(stamp, now_s, waited_s):
    assert edge_wait_s(stamp, now_s) == pytest.approx(waited_s)
