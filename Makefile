# txnstream: `make demo` runs the main job, `make test` runs every check.
# Both set up everything first (virtualenv, dev tools, release build).

VENV    ?= .venv
PY      := $(VENV)/bin/python
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(VIRTUAL_ENV)/bin:$(PATH)
DEPS    := $(VENV)/.deps-stamp
PYSRC   := python tests benches scripts

.PHONY: setup build demo test rust-check py-check lint bench proto wheel clean

$(PY):
	python3 -m venv $(VENV)

$(DEPS): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "maturin>=1.9,<2" "numpy>=1.26" "protobuf>=7.35.1,<8" \
	  "prometheus-client>=0.20" "pytest>=8" "hypothesis>=6.100" "pytest-benchmark>=4" \
	  "ruff>=0.6" "mypy>=1.10" "grpcio-tools==1.85.1" types-protobuf
	touch $(DEPS)

setup: $(DEPS)

build: $(DEPS)
	maturin develop --release --quiet

demo: build
	$(PY) -m txnstream.demo

rust-check:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	cargo test --workspace --quiet

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
