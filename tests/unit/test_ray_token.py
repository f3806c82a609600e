"""llmserve/edge/ray_token.py: the cluster's Ray token where Ray reads it, this user's alone."""

from __future__ import annotations

import re
import stat

from llmserve.edge import ray_token


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_machine_without_a_token_gets_one_for_this_user_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path, made = ray_token.ensure({})
    assert (path, made) == (tmp_path / ".ray" / "auth_token", True)
    assert re.fullmatch(r"[0-9a-f]{64}", path.read_text())
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    token = path.read_text()
    assert ray_token.ensure({}) == (path, False) and path.read_text() == token  # kept


def test_a_world_readable_token_is_narrowed_not_replaced(tmp_path):
    path = tmp_path / "token"
    path.write_text("abc")
    path.chmod(0o644)  # as Ray's own ray.init() leaves it
    assert ray_token.ensure({"RAY_AUTH_TOKEN_PATH": str(path)}) == (path, False)
    assert _mode(path) == 0o600 and path.read_text() == "abc"


def test_ray_s_own_order_where_it_reads_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    # The value in the environment: nothing to write.
    assert ray_token.ensure({"RAY_AUTH_TOKEN": "t", "RAY_AUTH_TOKEN_PATH": "/x"}) == (None, False)
    assert not (tmp_path / ".ray").exists()
    named = tmp_path / "elsewhere" / "tok"
    assert ray_token.token_path({"RAY_AUTH_TOKEN_PATH": str(named)}) == named
    assert ray_token.token_path({}) == tmp_path / ".ray" / "auth_token"
