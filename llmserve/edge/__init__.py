"""The edge of the platform on a node: the Ray environment it runs under, HAProxy in front of
the Routers (its wrapper script), the Ray token, the host's cores and CPU features.
"""
