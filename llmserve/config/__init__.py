"""The application's config (the `args:` of serve_config.yaml): pydantic models and their
checks, no I/O.
"""
