# The two commands a new user needs (see README.md):
#   make main   set up, then run the main job end to end
#   make test   set up, then run the test suite (what CI runs)
# and, after `make main`, every speed target in one JSON and one table:
#   make speed  python -m benchmarks.speed_targets (its duration: README.md)
PYTHON ?= python3.11
VENV ?= .venv
MAIN_FLAGS ?=
PYTEST_FLAGS ?=
# The suite's worker processes (pytest-xdist), a test file to each at a time:
# its fixtures are built once a file, and while one worker traces Python the
# other computes. 0 runs it in this process.
TEST_WORKERS ?= 2

BIN := $(VENV)/bin
STAMP := $(VENV)/.lealla_tf-installed

# Quiet TensorFlow, never probe CUDA on a CPU box, keep Keras' config in the workspace.
export TF_CPP_MIN_LOG_LEVEL ?= 3
export KERAS_HOME ?= $(CURDIR)/.keras
export HF_HUB_OFFLINE := 1
export PYTHONUNBUFFERED := 1
# oneDNN kernels (off by default on AMD CPUs): faster training steps here
# (docs/benchmarks.md, "oneDNN and the input pipeline").
export TF_ENABLE_ONEDNN_OPTS ?= 1

.PHONY: setup main test speed clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev,teacher]"
	$(BIN)/python -m pip check
	# The fused training kernels, compiled for this machine (see lealla_tf/models/kernels).
	$(BIN)/python -m lealla_tf.models.kernels
	touch $(STAMP)

setup: $(STAMP)

main: $(STAMP)
	$(BIN)/python -m lealla_tf.recipe $(MAIN_FLAGS)

# The linter first (ruff.toml), then the suite.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_FLAGS)

speed: $(STAMP)
	$(BIN)/python -m benchmarks.speed_targets --output_json=benchmarks/results/speed_targets.json

clean:
	rm -rf $(VENV) .keras .pytest_cache runs
