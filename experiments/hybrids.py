"""Section 5: BaseConv with one layer of selective attention, input-dependent sparse
attention on the rows a selection keeps, against pure BaseConv and pure attention on MQAR
(Arora et al., 2023), with random selections of the same budgets as controls.

Rerun (python -m experiments ...):
  --sweep=hybrids [--scale=paper] [--workers=K]   records in results/hybrids/
  --table=hybrids, --table=hybrids:trend          its cells, with the rows each selection
                                                  attends at
  --plot=hybrids                                  results/hybrids.png, _state.png, _curves.png
experiments/README.md ("Section 5 at cpu scale") says what it shows.
"""
import math

from experiments.figures import cells_table, plot_sweep
from experiments.presets import PAPER_LRS
from train import BASE_CONV


def hybrid_models(N, D):
    """Section 5's models at (N, D): both pure ones, and a short BaseConv then selective
    attention with each selection: programmatic, learned (its budget k = N/4), programmatic
    on a budget of ⌈√N⌉ rows (the official code's inference k), and two random controls,
    one with as many rows as programmatic selection keeps on every MQAR example
    (N - 2D - 1: mixers.SelectiveAttention) and one with learned selection's budget."""
    hybrid = "base_conv:kernel_size=3,selective_attention:"
    return {"base_conv": BASE_CONV, "attention": "attention",
            "+ programmatic selection": hybrid + "selection=programmatic",
            "+ learned selection": hybrid + "selection=learned",
            f"+ programmatic, first {math.ceil(math.sqrt(N))} repeats":
                hybrid + f"selection=programmatic:top_k={math.ceil(math.sqrt(N))}",
            "+ random, as many rows as programmatic":
                hybrid + f"selection=random:top_k={N - 2 * D - 1}",
            "+ random, learned budget": hybrid + f"selection=random:top_k={N // 4}"}


def hybrid_middle_models(N, D):
    """The selections again with the selective layer in the middle of three, a short
    BaseConv on each side: the last layer's short filter reads the selective layer's output
    at the rows before each query, so what a selection does off the queries reaches the
    loss. (With the selective layer last, as in hybrid_models, the loss reads its query
    rows only, and every selection that keeps the queries trains exactly alike.)"""
    middle = lambda selection: dict(n_layers=3, mixer="base_conv:kernel_size=3,selective_"
                                    f"attention:{selection},base_conv:kernel_size=3")
    k = math.ceil(math.sqrt(N))
    return {"3 layers, programmatic in the middle": middle("selection=programmatic"),
            f"3 layers, programmatic, first {k} repeats, in the middle":
                middle(f"selection=programmatic:top_k={k}"),
            "3 layers, random as many rows as programmatic, in the middle":
                middle(f"selection=random:top_k={N - 2 * D - 1}")}


SWEEPS = {
    # Section 5: a BaseConv model with one selective-attention layer, against both pure ones
    "hybrids": {
        "paper": [dict(models=hybrid_models(N, D), nd=[(N, D)], d_model=[64], lr=PAPER_LRS,
                       seed=[0, 1, 2], max_steps=[8000], num_valid=[1000])
                  for N, D in [(64, 4), (128, 8), (256, 16)]],
        "cpu": [dict(models=models, nd=[(64, 4)], d_model=[64], lr=[3e-3], seed=[0, 1, 2],
                     max_steps=[2000], num_valid=[1000])
                for models in (hybrid_models(64, 4), hybrid_middle_models(64, 4))],
    },
}


def selection_columns(cell, runs):
    """The rows a cell's selection attends at, the share of queries among them and the
    share of the queries it attends at (train.selected_rows on each seed's test split, mean
    over the seeds); – for a model without selection."""
    stats = [run["selection"][0] for run in runs if "selection" in run]
    mean = lambda key: sum(s[key] for s in stats) / len(stats)
    return ([f"{mean('rows'):.1f}", f"{mean('queries'):.2f}", f"{mean('coverage'):.2f}"]
            if stats else ["–", "–", "–"])


def hybrids_table(name="hybrids"):
    """--table=hybrids: its cells (cells_table), each with its selection (selection_columns)."""
    return cells_table(name, SWEEPS[name], (["rows attended", "of them queries",
                                             "queries attended"], selection_columns))


def plot_hybrids(name="hybrids"):
    """--plot=hybrids: plot_sweep, a panel per width, N along each."""
    return plot_sweep(name, SWEEPS[name], (("d_model",), "seq_len"))
