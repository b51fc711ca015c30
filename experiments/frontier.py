"""The recall frontier: MQAR accuracy against recurrent state size, the picture of Figure 2's
right panel (Arora et al., 2023) and of the Based paper (Arora et al., 2024), with the
recall mixers since (GLA, Mamba-2, DeltaNet, Gated DeltaNet, RWKV-7), each after a short
BaseConv layer.

Rerun (python -m experiments ...):
  --sweep=frontier [--scale=paper] [--workers=K]   records in results/frontier/
  --table=frontier, --table=frontier:trend         its cells
  --plot=frontier                                  results/frontier_state.png (the frontier),
                                                   frontier.png, frontier_curves.png
experiments/README.md ("The recall mixers since Zoology") says what it shows.
"""
from experiments.figure2 import PAPER_GRID, cells_table, plot_sweep

# the recall frontier: each mixer after a short BaseConv layer, as the official code trains
# attention, Based, GLA, DeltaNet, Gated DeltaNet and RWKV-7 (zoology/experiments/
# models_repo.py at d88d6f5: a per-layer hybrid of BaseConv with kernel 3 and the mixer; its
# Mamba and Mamba-2 run alone); here every mixer, Mamba's and BaseConv alike, so that only
# the second layer differs
FRONTIER_MODELS = {name: f"base_conv:kernel_size=3,{name}"
                   for name in ("attention", "base_conv", "based", "mamba", "gla", "mamba2",
                                "deltanet", "gated_deltanet", "rwkv7")}
SWEEPS = {
    # accuracy against recurrent state size (results/frontier_state.png), the picture of
    # Figure 2's right panel and of the Based paper, with the mixers of 2024-25 on it
    "frontier": {
        "paper": dict(models=FRONTIER_MODELS, **PAPER_GRID),
        # D = 16 at N = 64 fills half the context with pairs: where a small state runs out
        "cpu": dict(models=FRONTIER_MODELS, nd=[(64, 4), (64, 16)], d_model=[32, 64],
                    lr=[3e-3], seed=[0], num_train=[256_000], max_steps=[2000], num_valid=[1000]),
    },
}


def frontier_table(name="frontier"):
    """--table=frontier: its cells (cells_table)."""
    return cells_table(name, SWEEPS[name])


def plot_frontier(name="frontier"):
    """--plot=frontier: plot_sweep, a panel per (N, D), width along each."""
    return plot_sweep(name, SWEEPS[name], (("seq_len", "num_kv_pairs"), "d_model"))
