"""Before anything imports Ray: the platform's Ray environment for every cluster the tests start
(serve_app/ray_env.py: token auth, loopback only, Serve's throughput-optimized mode behind
HAProxy). Ray reads its token mode once, at import, so this cannot wait for a fixture."""

import os

from serve_app import ray_env

# HAProxy's and the fallback proxy's fixed ports next to the session's Serve port.
ray_env.apply(int(os.environ.get("LLMSERVE_TEST_PORT", "18000")) + 1)
