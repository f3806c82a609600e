"""Benchmarks of this platform against its peers (Ray Serve LLM, bare vLLM) on one machine.

    .venv/bin/python -m bench.peers --full            # `make bench`; results in bench/results/
    .venv/bin/python -m bench.peers --smoke --out-dir /tmp/x

spec.py (model, engine args, workload presets), systems.py (start / ready / stop of each
system), serve_driver.py (the child process running a Ray Serve app), load.py (the client:
vllm.benchmarks.serve), scenarios.py (sweep, open loop, mixed), machine.py, report.py.
"""
