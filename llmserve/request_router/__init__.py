"""The request router: Ray Serve's per-deployment replica chooser (load, cached prefix,
health), and the notes and counts it hands to the Router.
"""
