"""The lab: the paper's experiments, one file each, run on train.py, mixers.py and mqar.py
(cli.py: the command line; common.py: what the experiments share)."""
