"""Appendix F.2: RetNet and sparse attention (a sliding window, blocks) beside the gated
convolutions of Figure 2 on MQAR (Arora et al., 2023).

Rerun (python -m experiments ...):
  --sweep=f2 [--scale=paper] [--workers=K]   records in results/f2/
  --table=f2, --table=f2:trend               its cells
  --plot=f2                                  results/f2.png, f2_state.png, f2_curves.png
experiments/README.md ("Appendix F.2 at cpu scale") says what it shows.
"""
from experiments.figures import cells_table, plot_sweep
from experiments.presets import PAPER_GRID
from train import BASE_CONV

F2_MODELS = {"retnet": "retnet", "sliding window 32": "sliding_window:window=33",
             "blocked 32": "blocked_attention:block_size=32",
             "base_conv": BASE_CONV, "h3": "h3", "hyena": "hyena"}
SWEEPS = {
    # appendix F.2: RetNet and sparse attention next to the gated convolutions
    "f2": {
        "paper": dict(models=F2_MODELS, **PAPER_GRID),
        "cpu": dict(models=F2_MODELS, nd=[(64, 4)], d_model=[64], vocab_size=[512], lr=[3e-3],
                    seed=[0, 1, 2], num_train=[256_000], max_steps=[2000], num_valid=[1000]),
    },
}


def f2_table(name="f2"):
    """--table=f2: its cells (cells_table)."""
    return cells_table(name, SWEEPS[name])


def plot_f2(name="f2"):
    """--plot=f2: plot_sweep, a panel per (N, D), width along each."""
    return plot_sweep(name, SWEEPS[name], (("seq_len", "num_kv_pairs"), "d_model"))
