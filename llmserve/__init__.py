"""llmserve: an LLM serving platform on Ray Serve and vLLM, one folder per runtime role.

From the bottom up (a package imports only those below it; tests/unit/test_layers.py checks):
protocol, policies, config, edge and observability, planning; then the roles: router, replica,
request_router, responses, autoscaling; on top `app.py` (the wiring) and ops (the CLI).
docs/design.md draws it.
"""
