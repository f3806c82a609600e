"""The chaos suite: faults injected into a running app under steady load, and their figures.

`python -m chaos --scenario NAME [--short] --json OUT` runs one scenario on a Ray cluster of its
own (chaos/cluster.py); `python -m chaos --all` (`make chaos`) runs every one and writes
bench/results/chaos.json and chaos.md. The scenarios are in chaos/scenarios/; the load, the
replica watch and the figures they share are in load.py, watch.py, figures.py and fault.py.
"""
