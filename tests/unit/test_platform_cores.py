"""The platform's cores: which ones (a table), `llmserve confined` putting a command on them, and
a replica's thread widened for its engine's start and put back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llmserve.edge import platform_cores

# value, cores on the host, a GPU there -> the platform's cores (None: every core)
CHOICES = [
    (None, 2, False, frozenset({1})),  # unset means auto: the last core
    ("auto", 16, False, frozenset({15})),
    ("AUTO", 16, False, frozenset({15})),
    ("auto", 1, False, None),  # one core cannot be split
    ("auto", 16, True, None),  # a GPU computes the steps: every core is the platform's
    ("off", 2, False, None),
    ("2-3", 4, False, frozenset({2, 3})),
    ("0,2-3", 8, True, frozenset({0, 2, 3})),  # named cores apply on a GPU host too
    ("0-1", 2, False, None),  # every core named: nothing to confine
]


@pytest.mark.parametrize(("value", "num_cpus", "has_gpu", "expected"), CHOICES)
def test_choose(value, num_cpus, has_gpu, expected):
    assert platform_cores.choose(value, num_cpus, has_gpu) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [("4", "this host has cores 0-3"), ("1-x", "give core ids"), ("3-1", "give core ids")],
)
def test_choose_refuses(value, message):
    with pytest.raises(ValueError, match=message):
        platform_cores.choose(value, 4, False)


def _affinity_of_child(env_value: str) -> set[int]:
    env = {**os.environ, platform_cores.ENV: env_value}
    out = subprocess.run(
        [sys.executable, "-m", "llmserve.ops.cli", "confined", "--"]
        + [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(json.loads(out))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to confine to one")
def test_confined_runs_the_command_on_the_platform_cores():
    assert _affinity_of_child("0") == {0}
    assert _affinity_of_child("off") == set(os.sched_getaffinity(0))


def test_confined_refuses_a_bad_value():
    env = {**os.environ, platform_cores.ENV: "99"}
    done = subprocess.run(
        [sys.executable, "-m", "llmserve.ops.cli", "confined", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "this host has cores" in done.stderr


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to confine to one")
def test_all_cores_widens_the_thread_for_the_block_only():
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1})
    try:
        with platform_cores.all_cores():
            inside = os.sched_getaffinity(0)
        assert {0, 1} <= inside
        assert os.sched_getaffinity(0) == {1}
    finally:
        os.sched_setaffinity(0, saved)
