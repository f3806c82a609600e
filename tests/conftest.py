"""Before anything imports Ray: the platform's Ray environment for every cluster the tests start
(llmserve/edge/ray_env.py: token auth, loopback only, Serve's throughput-optimized mode behind
HAProxy). Ray reads its token mode once, at import, so this cannot wait for a fixture."""

import os

from llmserve.edge import ray_env, ray_token

# The token Ray would otherwise make itself, world-readable, at the first ray.init() of a
# machine where Ray never ran (llmserve/edge/ray_token.py).
ray_token.ensure()
# HAProxy's and the fallback proxy's fixed ports next to the session's Serve port.
ray_env.apply(int(os.environ.get("LLMSERVE_TEST_PORT", "18000")) + 1)
# Serve holds a Router (a direct-ingress replica) open at least 30 s when it stops, for load
# balancers to deregister it; the tests stop apps and clusters some twenty times, and the only
# balancer here is Serve's own HAProxy, which moves a refused connection to another Router
# (`option redispatch`). 5 s in the tests; `make serve` keeps Ray's 30 s.
os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "5")
