# The two commands: `make run` (the whole service on its embedded defaults) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml clients/python/pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install run test test-fast fuzz lint clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,bench]' -e ./clients/python
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP)

# `make run PORT=8001` serves on another port (the cli also reads PORT from the environment).
run: install
	$(VENV)/bin/selectivity serve $(if $(PORT),--port $(PORT))

test: install
	$(PY) -m pytest -q

# Everything but the tests marked slow (subprocesses, Chromium, end-to-end runs, brute-force and
# statistical sweeps), on every core (pytest-xdist), property tests at a fifth of their examples
# (tests/conftest.py): 41-46 s on 2 quiet cores. Bytecode is cached even where
# PYTHONDONTWRITEBYTECODE is set: each worker imports the service and collects every test
# module, twice as long without it.
test-fast: install
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -m "not slow" -n auto

# The schema fuzzer against a fresh server, longer than the suite's bounded run.
FUZZ_SECONDS ?= 600
fuzz: install
	SELECTIVITY_FUZZ_SECONDS=$(FUZZ_SECONDS) SELECTIVITY_FUZZ_EXAMPLES=100 \
		$(PY) -m pytest -q -s -m slow tests/api/test_openapi.py

lint: install
	$(VENV)/bin/ruff check service workers tests bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy service workers

clean:
	rm -rf $(VENV) .selectivity .pytest_cache
