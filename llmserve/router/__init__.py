"""The Router: the ingress deployment. Keys and tenants, admission (rate limits, the
per-model priority queue, deadlines), the relay of each reply, the shield's map for HAProxy.

Why the Router is many small modules: `@serve.ingress` pickles the Router's FastAPI app, and
with it the route methods and whatever they reach in router.py, by value while router.py is
still being imported. What the routes use lives in modules of its own (imported, so pickled by
reference): http_app, dispatch, reply_relay, request_path, request_log, tenancy.
"""
