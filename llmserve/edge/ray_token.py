"""The cluster's Ray token, made where Ray reads it, readable by this user alone.

Why here and not Ray: with `RAY_AUTH_MODE=token`, `ray start` and `ray.init(address=...)` only
look for a token; only a `ray.init()` that starts its own cluster makes one, and then
world-readable (0644). So on a machine where Ray never ran, `ray start` fails, and a token Ray
made is readable by every local user. `llmserve ray-token` (the Makefile runs it before
`ray start`; tests/conftest.py before any `ray.init`) makes it first, 0600 in a 0700 folder, and
narrows one that is wider.

Where Ray reads it, in its own order: `RAY_AUTH_TOKEN` (the value itself: nothing to write),
the file `RAY_AUTH_TOKEN_PATH` names, else `~/.ray/auth_token`. Every process that talks to the
cluster (`serve run`, `serve status`, `llmserve status`, a driver with a DeploymentHandle) finds
it there; other nodes get the same file (cluster.yaml) or the variable from a Secret (KubeRay).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def token_path(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The file Ray reads its token from, or None where the environment holds the token."""
    if environ.get(TOKEN_ENV):
        return None
    if environ.get(TOKEN_PATH_ENV):
        return Path(environ[TOKEN_PATH_ENV]).expanduser()
    return Path.home() / ".ray" / "auth_token"


def ensure(environ: Mapping[str, str] = os.environ) -> tuple[Path | None, bool]:
    """Makes the token file if there is none (256 random bits, as `ray get-auth-token
    --generate` makes them), and narrows an existing one of this user's to 0600. Returns the
    path (None: the token is in the environment) and whether it was made now."""
    path = token_path(environ)
    if path is None:
        return None, False
    if path.exists():
        st = path.stat()
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
            path.chmod(0o600)
        return path, False
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another start made it meanwhile: that one is the token
        return path, False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path, True
