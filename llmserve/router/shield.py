"""The shield: HAProxy refuses a tenant's flood before it reaches a Router.

Why: a 429 from the Router costs the CPU of Ray Serve's ingress, which even with nothing in it
is about a millisecond a request (bench/results/relay_floor.md): a flood of refusals takes the
Router's core, whatever the Router does. HAProxy, which runs in front of the Routers
(llmserve/edge/ray_env.py), refuses in C for a small fraction of that.

How: each Router replica writes, as it starts, its app's map of sha256(API key) -> the key's
limit, and the HAProxy rules (`publish`); llmserve/edge/haproxy_loopback.sh merges the maps of the
apps the config has a backend for and splices the rules into the config Ray writes, each time
HAProxy (re)starts, which Ray does once the Router's replica is up. HAProxy counts, per key,
the POSTs it lets through over a sliding second (a stick-table's `gpc0_rate`) and answers an
OpenAI-shaped 429 once a key has reached its limit.

Where: beside the HAProxy files of the Router's own node, `<run dir>/<node id>/shield/` (`folder`;
the run dir is the folder of RAY_SERVE_HAPROXY_CONFIG_FILE_LOC, `llmserve.edge.ray_env.run_dir`),
which is where the wrapper looks: beside the config it is given, `<run dir>/<node id>/`. Node
ids are new with every cluster, so a cluster never merges the maps of another one on the same
machine, running beside it or gone (an app of the same name included); `make stop` removes the
run dir. Every folder on the way must be this user's, the maps 0600: HAProxy runs the rules.

Coarse by design, never stricter than the tenant's bucket: a key's limit is `shield_factor`
times the most its requests bucket can admit in a second (burst + rate x 1 s), and each HAProxy
(one per node) counts alone; the Router's exact bucket still refuses whatever of a flood gets
through. Keys with no request rate are not tracked; a wrong key passes, for the Router's 401.
Refusals here are HAProxy's: Serve's own HTTP metrics (made from HAProxy's log) count them as
the app's 429s, but there is no trace, no Router metric and no access-log line.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ray.serve._private.haproxy import HAProxyManager

from llmserve.config.app_config import TenantConfig
from llmserve.edge.ray_env import HAPROXY_CONFIG_ENV, RAY_HAPROXY_CONFIG_DEFAULT
from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.router.tenancy import TenantDirectory

ANONYMOUS = "anonymous"  # what HAProxy tracks a request without an Authorization header as
WINDOW_S = 1.0  # HAProxy's rate period

REFUSAL = OpenAIError(
    429,
    "Rate limit reached for requests of this API key: too many at once. Retry after 1 s.",
    code="rate_limit_exceeded",
)


@dataclass(frozen=True)
class KeyLimit:
    """What HAProxy knows of a key: its limit, and for the 429's headers its tenant's name and
    configured burst (the Router's `x-ratelimit-limit-requests`)."""

    limit: int  # POSTs a second HAProxy lets through
    burst: int
    tenant: str


def key_limits(directory: TenantDirectory, factor: float) -> dict[str, KeyLimit]:
    """sha256 hex of each key (or ANONYMOUS) -> its KeyLimit; keys without a request rate are
    left out.

    `factor` >= 2 keeps the shield from refusing what the bucket admits: the bucket admits at
    most burst + rate x T in any T seconds, and HAProxy's rate over a second can count up to
    two seconds' worth (the last period whole at the start of the next)."""

    def limit(t: TenantConfig) -> KeyLimit | None:
        r = t.rate_limits
        if r.requests_per_s is None:
            return None
        burst = r.max_burst_requests or max(1.0, r.requests_per_s)
        n = math.ceil(factor * (burst + r.requests_per_s * WINDOW_S))
        return KeyLimit(n, round(burst), t.name)

    limits = {d: k for d, t in directory.key_digests() if (k := limit(t)) is not None}
    if directory.anonymous is not None and (k := limit(directory.anonymous)) is not None:
        limits[ANONYMOUS] = k
    return limits


def map_text(limits: dict[str, KeyLimit]) -> str:
    return "".join(f"{d} {k.limit} {k.burst} {k.tenant}\n" for d, k in sorted(limits.items()))


# Microseconds since the epoch at which HAProxy passed a request on, on the host's clock.
EDGE_HEADER = "x-llmserve-edge-us"


def rules(map_path: str) -> str:
    """Lines for HAProxy's API frontend, before it picks a backend (the wrapper puts them)."""
    refusal = json.dumps(REFUSAL.body(), separators=(",", ":"))  # single-quoted below
    k, entry, lim, over = (
        "txn.llmserve_key",
        "txn.llmserve_entry",
        "txn.llmserve_limit",
        "txn.llmserve_over",
    )
    has_auth = "{ req.hdr(authorization) -m found }"
    has_key, known = f"{{ var({k}) -m found }}", f"{{ var({entry}) -m found }}"
    return "\n".join(
        [
            "    # llmserve-shield (llmserve/router/shield.py): a key's requests over its limit",
            "    stick-table type string len 64 size 10k expire 30s store gpc0,gpc0_rate(1s)",
            f"    http-request set-var({k}) req.hdr(authorization),word(2,' '),sha2(256),hex,"
            f"lower if METH_POST {has_auth}",
            f"    http-request set-var({k}) str({ANONYMOUS}) if METH_POST !{has_auth}",
            f"    http-request set-var({entry}) var({k}),map({map_path}) if {has_key}",
            f"    http-request set-var({lim}) var({entry}),word(1,' '),add(0) if {known}",
            f"    http-request track-sc0 var({k}) if {known}",
            f"    http-request set-var({over}) sc_gpc0_rate(0),sub({lim}) if {known}",
            "    http-request return status 429 content-type application/json hdr retry-after 1 "
            f"hdr x-ratelimit-limit-requests %[var({entry}),word(2,' ')] "
            "hdr x-ratelimit-remaining-requests 0 hdr x-ratelimit-reset-requests 1s "
            f"hdr x-llmserve-tenant %[var({entry}),word(3,' ')] "
            f"hdr x-llmserve-refused-by shield string '{refusal}' "
            f"if {{ var({over}) -m int ge 0 }}",
            f"    http-request sc-inc-gpc0(0) if {known}",
            # When HAProxy took it: the Router counts what it waited before it against its
            # class's first-token promise (request_path.edge_wait_s). Set, never passed on.
            f"    http-request set-header {EDGE_HEADER} %[date(0,us)]",
            "",
        ]
    )


def folder(environ: Mapping[str, str], node_id: str) -> Path | None:
    """Where the Routers of node `node_id` leave the shield for its HAProxy: `shield/` beside
    the config Ray writes for that HAProxy (`<folder of RAY_SERVE_HAPROXY_CONFIG_FILE_LOC>/
    <node id>/`, where haproxy_loopback.sh looks). None where Serve runs no HAProxy."""
    if environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        return None
    config = environ.get(HAPROXY_CONFIG_ENV) or RAY_HAPROXY_CONFIG_DEFAULT
    return Path(config).parent / node_id / "shield"


def publish(
    directory: TenantDirectory,
    factor: float,
    app: str,
    environ: Mapping[str, str],
    node_id: str,
) -> Path | None:
    """What a Router does as it starts: leave this app's map, and the rules, where the HAProxy
    of its node looks (`folder`; the map removed when there is nothing to shield). The wrapper
    merges the apps' maps, adding up the limits of a key that several apps know. Returns the
    map's path, None where Serve runs no HAProxy."""
    shield = folder(environ, node_id)
    if shield is None:
        return None
    _own_folder(shield)
    limits = key_limits(directory, factor) if factor else {}
    app_map = shield / "apps" / f"{backend_safe_name(app)}.map"
    if limits:
        _replace(app_map, map_text(limits))
    else:
        app_map.unlink(missing_ok=True)
    _replace(shield / "rules.cfg", rules(str(shield / "shield.map")))
    return app_map


def backend_safe_name(app: str) -> str:
    """The app's name as Ray names its HAProxy backend `http-<name>`: the wrapper merges the
    map of an app only while the config has its backend, so an app deleted from a running
    cluster (`serve.delete`) stops setting limits at the next reload. Ray's own rule, not a
    copy of it: the two must never drift apart."""
    return HAProxyManager.get_safe_name(app)


def _own_folder(shield: Path) -> None:
    """The shield's folder, made ours alone: HAProxy runs what the rules say, so nothing is
    written where another user could put or swap a file. The run dir and the node's folder
    must be this user's and writable by no other user, and the node's folder (Ray makes it
    under the user's umask) is narrowed to 0700, which also keeps other users from HAProxy's
    admin socket (mode 666 in Ray's template); `shield/` and `shield/apps/` must be this
    user's, writable by no one else. The wrapper checks the same before it splices."""
    node, run = shield.parent, shield.parent.parent
    (shield / "apps").mkdir(mode=0o700, parents=True, exist_ok=True)
    for f, others in ((run, 0o002), (node, 0o002), (shield, 0o022), (shield / "apps", 0o022)):
        st = f.lstat()
        if st.st_uid != os.getuid() or not stat.S_ISDIR(st.st_mode) or st.st_mode & others:
            raise PermissionError(f"{f} is not a folder of this user's alone: not writing there")
    if node.stat().st_mode & 0o077:
        node.chmod(0o700)


def _replace(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:  # mkstemp's 0600: the map is digests of keys
        f.write(text)
    os.replace(tmp, path)
