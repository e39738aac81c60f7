# txnstream: `make demo` runs the main job, `make test` runs every check.
# Both set up everything first (virtualenv, dev tools, release build).

VENV    ?= .venv
PY      := $(VENV)/bin/python
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(VIRTUAL_ENV)/bin:$(PATH)
# maturin develop installs runtime deps through pip; keep its output short.
export PIP_QUIET := 1
DEPS    := $(VENV)/.deps-stamp
PYSRC   := python tests benches scripts

.PHONY: setup build demo test rust-check py-check lint bench proto wheel clean

$(PY):
	python3 -m venv $(VENV)

# Dependencies come from pyproject.toml (runtime + dev and spark extras: PySpark is large,
# ~450 MB), installed once per change.
$(DEPS): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
	  print('\n'.join(p['build-system']['requires'] + p['project']['dependencies'] \
	  + p['project']['optional-dependencies']['dev'] \
	  + p['project']['optional-dependencies']['spark']))" > $(VENV)/requirements.txt
	$(PY) -m pip install -q -r $(VENV)/requirements.txt
	touch $(DEPS)

setup: $(DEPS)

build: $(DEPS)
	maturin develop --release --quiet --features testing

demo: build
	txnstream demo --data demo-data

rust-check:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
	cargo test --workspace --all-features --quiet

py-check: build
	ruff check $(PYSRC)
	ruff format --check $(PYSRC)
	mypy
	pytest -q
	pytest -q benches --benchmark-disable

test: rust-check py-check

lint: $(DEPS)
	cargo fmt --all
	ruff format $(PYSRC)
	ruff check --fix $(PYSRC)

bench: build
	pytest benches --benchmark-only --benchmark-columns=median,ops,rounds

proto: $(DEPS)
	$(PY) scripts/gen_proto.py

wheel: $(DEPS)
	maturin build --release

clean:
	rm -rf $(VENV) target
