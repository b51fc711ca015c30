"""The recall frontier: MQAR accuracy against recurrent state size, the picture of Figure 2's
right panel (Arora et al., 2023) and of the Based paper (Arora et al., 2024), with the
recall mixers since (GLA, Mamba-2, DeltaNet, Gated DeltaNet, RWKV-7), each after a short
BaseConv layer.

Rerun (python -m experiments ...):
  --sweep=frontier [--scale=paper] [--workers=K]   records in results/frontier/
  --table=frontier, --table=frontier:trend         its cells
  --plot=frontier                                  results/frontier_state.png (the frontier),
                                                   frontier.png, frontier_curves.png
  --sweep=frontier --mixer=path/to/file.py:Class   a mixer of your own on the same cells (its
                                                   records in results/runs/frontier/, ignored
                                                   by git); then --table=frontier and
                                                   --plot=frontier with the same --mixer: the
                                                   built-ins' committed records beside yours
                                                   (results/runs/frontier_state.png, ...)
experiments/README.md ("The recall mixers since Zoology") says what it shows.
"""
from experiments.common import load_records, sweep_runs
from experiments.figures import cells_table, plot_sweep, state_size
from experiments.presets import PAPER_GRID, make_config
from mixers import is_outside, load_outside, split_mixer
from train import Config

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


# ----------------------------------------------------------------------------------------
# a mixer of your own on the frontier: trained on the same cells and recipe, in the same
# stack (after a short BaseConv), drawn beside the built-ins' committed records, which do
# not train again

YOURS = "runs/frontier"        # results/runs/frontier/: git ignores results/runs/


def yours_label(mixer):
    """The label of a mixer of your own: its class name (with its options, if any), and
    "(yours)", so that it never reads as a built-in's."""
    name, options = split_mixer(mixer)
    return ":".join([name.rpartition(":")[2], *options]) + " (yours)"


def yours_sweep(mixer, name="frontier"):
    """The frontier sweep's grids (SWEEPS[name], every scale) with the one model
    `base_conv:kernel_size=3,<mixer>`, labelled yours_label; `mixer` must be a mixer of your
    own (path/to/file.py:Class or package.module:Class) that loads (a ValueError otherwise)."""
    source = split_mixer(mixer)[0]
    if not is_outside(source):
        raise ValueError(f"--mixer={mixer!r} is not allowed with --sweep=frontier: the "
                         "built-in mixers are on the frontier already ("
                         f"{', '.join(FRONTIER_MODELS)}); give a mixer of your own, "
                         "path/to/file.py:Class or package.module:Class")
    load_outside(source)
    model = {yours_label(mixer): f"base_conv:kernel_size=3,{mixer}"}
    return {scale: dict(grid, models=model) for scale, grid in SWEEPS[name].items()}


def both_sweep(mixer, name="frontier"):
    """The frontier sweep with your model after the built-ins (the tables' order, the
    figures' scale)."""
    return {scale: dict(grid, models={**grid["models"], **yours["models"]})
            for (scale, grid), yours in zip(SWEEPS[name].items(),
                                            yours_sweep(mixer, name).values())}


def yours_records(mixer, name="frontier"):
    """The built-ins' records (results/<name>/) and those of your mixer's runs of the sweep
    in results/runs/frontier/ (other files there, of another mixer or an older version of
    yours, are left out); a ValueError when yours has none yet."""
    sweep = yours_sweep(mixer, name)
    first = make_config(**sweep_runs(YOURS, sweep, next(iter(sweep)))[0][1])
    yours = [r for r in load_records(f"results/{YOURS}")
             if (r["config"]["mixer"], r["config"].get("mixer_source")) == (first.mixer,
                                                                       first.mixer_source)]
    if not yours:
        raise ValueError(f"--mixer={mixer!r} has no finished runs on the frontier in "
                         f"results/{YOURS}/ yet: python -m experiments --sweep={name} "
                         f"--mixer={mixer}")
    return load_records(f"results/{name}") + yours


def state_column(cell, runs):
    """The recurrent state of a cell's model (figures.state_size), or "unknown" where a
    layer has no state_size."""
    size = state_size(Config(**runs[0]["config"]))
    return ["unknown (no state_size)" if size is None else f"{size:,}"]


def yours_table(mixer, name="frontier"):
    """--table=frontier --mixer=...: the built-ins' cells and yours (cells_table), with
    each model's recurrent state."""
    return cells_table(name, both_sweep(mixer, name), (["recurrent state"], state_column),
                       yours_records(mixer, name))


def plot_yours(mixer, name="frontier"):
    """--plot=frontier --mixer=...: plot_sweep of the built-ins' records and yours, into
    results/runs/frontier.png, _state.png, _curves.png (the committed figures stay)."""
    return plot_sweep(name, both_sweep(mixer, name), (("seq_len", "num_kv_pairs"), "d_model"),
                      records=yours_records(mixer, name), out=f"results/{YOURS}")
