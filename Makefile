# Two commands on a fresh machine: `make run` (the main job) and `make test` (the tests:
# test_all.py, the six files', and experiments/test_lab.py, the lab's).
# Each first sets up what is missing, once: a virtual environment in .venv with torch
# installed first (torch==2.13.0: where its CPU build is on disk, pip takes that instead of
# a multi-GB CUDA build) and then requirements.txt. Your own environment instead:
#   pip install torch==2.13.0 && pip install -r requirements.txt
#   python train.py && python -m pytest -q test_all.py experiments/test_lab.py
# Options: make run ARGS="--seed=1 --lr=1e-3"; make test VENV=/path/to/venv.

VENV ?= .venv
PYTHON := $(VENV)/bin/python
TORCH ?= torch==2.13.0

.PHONY: run test

run: $(VENV)/.installed
	$(PYTHON) train.py $(ARGS)

test: $(VENV)/.installed
	$(PYTHON) -m pytest -q test_all.py experiments/test_lab.py

# redone when requirements.txt changes
$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet $(TORCH)
	$(PYTHON) -m pip install --quiet -r requirements.txt
	touch $@
