# Set-up is two commands on a fresh machine: `make demo` and `make test`; each installs what it needs.
# TORCH picks the torch for the local venv: by default the version this project is tested with
# (torch==2.13.0; pip takes a local CPU wheel of it when one is on its find-links, otherwise your
# index's build of that version); `make TORCH=torch test` takes whatever the index resolves
# within pyproject's range (a CUDA build on GPU boxes).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
BIN := $(VENV)/bin
# No pip cache: a fresh CI machine has once had under 300 MB free, and the cache would hold a second copy of each download.
export PIP_NO_CACHE_DIR := 1

.PHONY: install demo test test-fast lint typecheck bench docs corpus clean bugs

$(BIN)/torchdiag: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $@

install: $(BIN)/torchdiag

demo: install
	$(BIN)/torchdiag summary sample_models/transformer_lm.py:build --depth 2
	$(BIN)/torchdiag flops sample_models/resnet.py:resnet50 -i 1x3x224x224 --device meta

# PYTEST_WORKERS: pytest-xdist workers (auto = one per core). --dist loadscope keeps a module's tests on one worker,
# so a module-scoped fixture (one torchrun launch shared by its assertions) runs once. --no-loadscope-reorder: modules
# go out in the workers' collection order, which tests/conftest.py sorts costliest first (tests/costs.json), instead of
# xdist's most-tests-first (that left a long module of few tests to start last, while the other worker idled).
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder
# pytest's exit code 5 means the selection collected no tests (e.g. `-m` with nothing marked): not a failure.
NO_TESTS_OK := rc=$$?; if [ $$rc -eq 5 ]; then echo "note: no tests selected (pytest exit 5)"; exit 0; fi; exit $$rc

lint: install
	$(BIN)/python -m ruff check .

# mypy's stated strictness is in pyproject.toml [tool.mypy] (defaults, untyped bodies not checked).
typecheck: install
	$(BIN)/python -m mypy

# Everything: lint, types, and the whole suite (slow, distributed and subprocess tests included). CI runs this.
test: lint typecheck
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_ARGS); $(NO_TESTS_OK)

# The fast set alone (no real launches, children or long runs): a few minutes while you work.
test-fast: install
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not slow" $(PYTEST_ARGS); $(NO_TESTS_OK)

# The documentation site (mkdocs-material + mkdocstrings, the `docs` extra) into site/, warnings as errors.
$(VENV)/.docs-installed: pyproject.toml $(BIN)/torchdiag
	$(BIN)/python -m pip install -q -e ".[dev,docs]"
	@touch $@

docs: $(VENV)/.docs-installed
	$(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python bench/run_all.py

# The whole zoo (bench/corpus_zoo.py lists it; bench/README.md "The whole zoo"): hours on a CPU, resumable
# (a second `make corpus` runs only the models without a result). Needs torchvision/timm/transformers,
# installed into their own venv, never into .venv.
CORPUS_VENV ?= .venv-corpus
CORPUS_TIMEOUT ?= 1200
# each worker's address space, in GiB: a model too large fails as its row, not the machine
CORPUS_MAX_GB ?= 16
$(CORPUS_VENV)/bin/python:
	$(PYTHON) -m venv $(CORPUS_VENV)
	$(CORPUS_VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(CORPUS_VENV)/bin/pip install -q timm transformers safetensors
	$(CORPUS_VENV)/bin/pip install -q -e .

bench/corpus-zoo.json: | $(CORPUS_VENV)/bin/python
	nice -n 19 $(CORPUS_VENV)/bin/python bench/corpus_zoo.py

build/corpus-hf: | $(CORPUS_VENV)/bin/python
	nice -n 19 $(CORPUS_VENV)/bin/python bench/corpus_zoo.py --hf   # the shrunk transformers configs (not in git)

corpus: bench/corpus-zoo.json build/corpus-hf
	CORPUS_MAX_GB=$(CORPUS_MAX_GB) nice -n 19 $(CORPUS_VENV)/bin/python bench/corpus.py --models 'zoo_*' --resume --timeout $(CORPUS_TIMEOUT) \
		--out bench/corpus-zoo-results.md --json-out bench/corpus-zoo-results.json

clean:
	rm -rf $(VENV) .pytest_cache build dist site *.egg-info

# The published training-bug benchmarks ported to PyTorch (bench/bugs/, issue 32): reproduction over 5 seeds,
# then torchdiag watch and the one-shot commands on each program. Hours on a CPU, resumable (a second
# `make bugs` runs only what has no result in bench/bugs/results.json); writes bench/README.md's table.
# bench/bugs/baselines.json: what a constant predictor scores on each program's data (seconds, no training).
bench/bugs/baselines.json: | install
	OMP_NUM_THREADS=1 $(BIN)/python bench/bugs/baseline.py

bugs: install bench/bugs/baselines.json
	OMP_NUM_THREADS=1 nice -n 19 $(BIN)/python bench/bugs/run.py
