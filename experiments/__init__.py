"""The lab: the paper's experiments, one file each, run on train.py, mixers.py and mqar.py
(cli.py: the command line; what the experiments share: presets.py, the presets and the
official grid; figures.py, the tables and figures; common.py, the sweeps and records)."""
import os

# on an Apple GPU, an op that mps lacks runs on the CPU (with a warning) instead of failing,
# as in train.py. Torch reads the variable once, as its library loads
# (aten/src/ATen/mps/MPSFallback.mm), and every lab module's import runs this file first,
# before any of them imports torch; a value the user set stays.
os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")
