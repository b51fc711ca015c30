"""The lab: the paper's experiments, run on train.py, mixers.py and mqar.py (lab.py)."""
