# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Where torch comes from: empty for pip's own index; https://download.pytorch.org/whl/cpu for the CPU-only build.
TORCH_INDEX ?=

.PHONY: setup demo test bench clean

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e '.[train,tui,tensorboard,dev]'
	touch $(STAMP)

setup: $(STAMP)

# A run that crashes (the learning rate jumps 3000x at step 25), the finding as it happens, the
# recommended change as a GRPOConfig diff, the restart from the checkpoint before the crash, the run
# going on. The healthy run: `grpo-monitor demo`; the others: `grpo-monitor demo --scenario NAME`.
demo: $(STAMP)
	$(VENV)/bin/grpo-monitor demo --scenario sudden_collapse --auto-restart --max-restarts 1

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) runs build *.egg-info
