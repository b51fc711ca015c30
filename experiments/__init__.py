"""The lab: the paper's experiments, one file each, run on train.py, mixers.py and mqar.py
(cli.py: the command line; what the experiments share: presets.py, the presets and the
official grid; figures.py, the tables and figures; common.py, the sweeps and records)."""
