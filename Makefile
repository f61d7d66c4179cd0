# Two commands from a fresh clone: `make demo` (the quickstart pipeline) and `make test`.
# Every target bootstraps .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is installed first and pinned, so that the project's own install sees it satisfied. On
# Linux, PyPI's torch is the CUDA build (several GB): TORCH_INDEX=https://download.pytorch.org/whl/cpu
# takes the CPU wheel from PyTorch's own index for this one step.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: venv demo test test-all test-slow test-gpu bench bench-store bench-serve bench-peers bench-gpu gpu-recipe gpu-bundle peers-wheels lint clean clean-all

# The installs go through uv (.ci/uv_pip.py, with pip's configured sources): seconds where pip
# took minutes; where uv cannot be installed, pip does them.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	if $(PY) -m pip install -q uv; then install="$(PY) .ci/uv_pip.py install -q"; \
	else install="$(PY) -m pip install -q"; fi; \
	$$install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)" && \
	$$install -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tfm run configs/quickstart.yaml

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow --durations=40

test-all: $(STAMP)
	$(PY) -m pytest -q -m "not gpu"

# Quick settings by default; `make bench BENCH_FULL=1` runs the full-size measurements. A run that
# is a row's own measurement (as BENCH_FULL=1's data and memory runs are) records its figure in
# benchmarks/figures/ and the tables of docs/benchmarks.md and README.md; so do the targets below.
# Without ../shared/data/wmt14_ende_sample beside the clone, data.py and train_memory.py run on
# the synthetic corpus instead (and record nothing).
RESULTS := benchmarks/results
bench: $(STAMP)
	mkdir -p $(RESULTS)
	$(PY) benchmarks/model_throughput.py $(if $(BENCH_FULL),,--quick) --json $(RESULTS)/model_throughput.json
	$(PY) benchmarks/decode.py $(if $(BENCH_FULL),,--quick) --bf16 --json $(RESULTS)/decode.json
	$(PY) benchmarks/train.py --json $(RESULTS)/train.json
	$(PY) benchmarks/data.py $(if $(BENCH_FULL),,--pairs 100000) --json $(RESULTS)/data.json
	$(PY) benchmarks/train_memory.py $(if $(BENCH_FULL),,--pairs 100000 --steps 12 --repeats 1) --json $(RESULTS)/train_memory.json

# The work dir on a local S3 server (SeaweedFS, started by the script) against a local disk,
# stage by stage on the Multi30k mirror (../shared/data/multi30k): ~5 minutes on 2 cores. Without
# the mirror, or without SeaweedFS's weed binary, it stops with one line that says what it needs.
bench-store: $(STAMP)
	mkdir -p $(RESULTS)
	$(PY) benchmarks/store.py --json $(RESULTS)/store.json

# `tfm serve` under closed-loop clients (1, 8, 32, 128) beside `mlflow models serve` of the same
# version and the engine's offline batched rate: the Multi30k laptop model once its run has
# registered it, else the quickstart's (~6 minutes). SERVE_FLAGS: e.g. --clients 32 --no-mlflow,
# --set serve.replicas=2. Writes $(RESULTS)/serve.json.
bench-serve: $(STAMP)
	mkdir -p $(RESULTS)
	$(PY) benchmarks/serve_load.py --json $(RESULTS)/serve.json $(SERVE_FLAGS)

# Side by side with fairseq and eole on the published Multi30k recipe, on this CPU: each peer in
# its own environment under .peers/ (over the same CPU torch), the same data, model, tokens per
# update and threads; training target tokens/s and decoding sentences/s (benchmarks/peers/).
# Writes $(RESULTS)/peers.{json,md}. PEERS_FLAGS: e.g. --updates 120, --peers fairseq, --no-install.
bench-peers: $(STAMP)
	mkdir -p $(RESULTS)
	$(PY) benchmarks/peers --out $(RESULTS) $(PEERS_FLAGS)

# The GPU suite runs in a Python whose torch is a CUDA build (ours in .venv is the CPU wheel):
# the machine's own by default. It fails fast without CUDA, installs Ray Train if missing, and
# writes $(RESULTS)/gpu/gpu.{json,md} in a few minutes (benchmarks/gpu.py says what it measures).
# After `make gpu-recipe` it uses that run's .venv-gpu, which has Ray Train on a machine with no
# package index.
GPU_PYTHON ?= python3
BENCH_GPU_PYTHON ?= $(if $(wildcard .venv-gpu/bin/python),.venv-gpu/bin/python,$(GPU_PYTHON))
bench-gpu:
	$(BENCH_GPU_PYTHON) benchmarks/gpu.py --preflight
	$(BENCH_GPU_PYTHON) -c "import ray.train.torch, sentencepiece, sacrebleu, yaml" 2>/dev/null || \
		$(BENCH_GPU_PYTHON) -m pip install -q "ray[train]==2.60.*" "sentencepiece>=0.2" "sacrebleu>=2.4" "pyyaml>=6"
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(BENCH_GPU_PYTHON) benchmarks/gpu.py --out $(RESULTS)/gpu $(BENCH_FLAGS)

# The published Multi30k recipe (configs/multi30k_en_de_tiny.yaml) end to end on one GPU: it
# installs the project into .venv-gpu over GPU_PYTHON's CUDA torch, runs `tfm run` with
# train.use_gpu=true and prints test2016 bleu_tok_lc beside the published 41.02 with the wall
# time. RECIPE_FLAGS: --seed N, --mirror file://..., --wheels DIR or --site FILE (offline
# install; `make gpu-bundle` writes FILE), --keep (continue a run cut by a time limit).
gpu-recipe:
	$(GPU_PYTHON) benchmarks/gpu_recipe.py --preflight
	$(GPU_PYTHON) benchmarks/gpu_recipe.py $(RECIPE_FLAGS)

# The offline install for a GPU machine with no package index: the dependencies it lacks
# (HAVE: its `pip list --format=freeze`) as one site-packages archive (benchmarks/gpu_bundle.py).
HAVE ?= .whl/have.txt
gpu-bundle: $(STAMP)
	$(PY) benchmarks/gpu_bundle.py --have $(HAVE) --out .whl/site-py312.tar.xz

# Files for `make bench-gpu BENCH_FLAGS="--peers-wheels .whl/peers"` on a GPU machine with no
# package index: the packages of the peers' environments here (.peers/, made by bench-peers) for
# its Python, less torch and what HAVE says it holds (benchmarks/gpu_peers.py).
peers-wheels: $(STAMP)
	$(PY) benchmarks/gpu_peers.py wheels --out .whl/peers $(if $(wildcard $(HAVE)),--have $(HAVE))

test-gpu:
	$(GPU_PYTHON) benchmarks/gpu.py --preflight
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m pytest -q -m gpu -p no:cacheprovider tests/gpu

# pyrefly: the type checker over the production packages ([tool.pyrefly] in pyproject.toml).
# .ci/check_docs.py: the guides' links, sections, images, make targets and scripts exist, their
# tfm commands parse and load their configs, and no path of one machine is in docs/, README.md
# or configs/. .ci/config_reference.py: docs/config.md is what the config classes and their field
# docstrings say now. benchmarks/figures.py: docs/benchmarks.md's results table and README.md's
# recipe table are what benchmarks/figures/*.json say.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/pyrefly check --python-interpreter-path $(PY) --summary=none
	$(PY) .ci/check_docs.py
	$(PY) .ci/config_reference.py
	$(PY) benchmarks/figures.py

# clean: the tools' caches and each work dir's stage outputs (a rerun recomputes them), keeping
# its MLflow store (mlflow.db, mlartifacts, mlruns) and tracking journals: the registered models
# the distill configs and tfm serve read outlive it. clean-all: every work dir, registries too.
KEEP_IN_RUNS := mlflow.db mlartifacts mlruns tracking
clean:
	rm -rf .pytest_cache .ruff_cache
	if [ -d runs ]; then \
	  find runs -mindepth 2 -maxdepth 2 $(foreach k,$(KEEP_IN_RUNS),! -name $(k)) -exec rm -rf {} +; \
	fi

clean-all: clean
	rm -rf runs
