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
                                                   by git), after a line that says how long
                                                   it takes at most (yours_estimate); then
                                                   --table=frontier and --plot=frontier with
                                                   the same --mixer: the built-ins' committed
                                                   records beside yours, those of the file as
                                                   it is now, the runs of its other versions
                                                   named (results/runs/frontier_state.png, ...)
experiments/README.md ("The recall mixers since Zoology") says what it shows.
"""
import dataclasses
from collections import Counter

import torch

from experiments.bench import run_seconds
from experiments.common import load_records, sweep_runs
from experiments.figures import cells_table, plot_sweep, state_size
from experiments.presets import PAPER_GRID, make_config
from mixers import is_outside, load_outside, split_mixer
from train import Config, finished_record, identity, resolve_device

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


def yours_by_version(mixer, name="frontier"):
    """(the records in results/runs/frontier/ of your mixer's runs of sweep `name` with its
    file as it is now, {another version's mixer_source: how many records it has there}): an
    edited file is another run (its digest is in mixer_source), so the runs of the file as it
    was are not this version's, but are named (other_versions)."""
    sweep = yours_sweep(mixer, name)
    first = make_config(**sweep_runs(YOURS, sweep, next(iter(sweep)))[0][1])
    mine = [r for r in load_records(f"results/{YOURS}") if r["config"]["mixer"] == first.mixer]
    current = [r for r in mine if r["config"].get("mixer_source") == first.mixer_source]
    others = Counter(r["config"].get("mixer_source") for r in mine
                     if r["config"].get("mixer_source") != first.mixer_source)
    return current, dict(others)


def other_versions(mixer, name="frontier"):
    """A sentence naming the records of your mixer's runs with other versions of its file
    (yours_by_version): how many, each version's digest, how to list them and how to see
    them again; "" where there are none."""
    others = yours_by_version(mixer, name)[1]
    if not others:
        return ""
    count = sum(others.values())
    versions = "; ".join(f"mixer_source {source}: {n} run{'s' * (n > 1)}"
                         for source, n in others.items())
    return (f"results/{YOURS}/ also holds {count} run{'s' * (count > 1)} of --mixer={mixer} "
            f"with other versions of its file, left out ({versions}): grep -l "
            f"{next(iter(others))} results/{YOURS}/*.json lists them, and the file as it was "
            "brings them back")


def yours_records(mixer, name="frontier"):
    """The built-ins' records (results/<name>/) and those of your mixer's runs of the sweep
    with its file as it is now (yours_by_version; other files there, of another mixer or
    another version of yours, are left out); a ValueError when yours has none yet, naming
    the runs of other versions of the file."""
    yours, others = yours_by_version(mixer, name)
    if not yours:
        raise ValueError(f"--mixer={mixer!r} has no finished runs on the frontier in "
                         f"results/{YOURS}/ yet: python -m experiments --sweep={name} "
                         f"--mixer={mixer}" + (f"; {other_versions(mixer, name)}" if others
                                               else ""))
    return load_records(f"results/{name}") + yours


def yours_estimate(mixer, scale="cpu", name="frontier", steps=3, sweep=None, folder=YOURS):
    """The line a sweep of your mixer (yours_sweep) prints before it trains: how long its
    unfinished runs take at most, one after another here: bench.run_seconds at each cell's
    size (`steps` training steps timed, times the steps of the schedule, with its
    evaluations), runs that differ in lr or seed only timed once. A run that passes its
    target stops early: an upper bound (on a machine as busy as while timing). None when
    every run has finished. `sweep` and `folder`: another sweep's grids of your mixer and
    its folder (a protocol's: protocols.run_yours)."""
    sweep = sweep or yours_sweep(mixer, name)
    runs = [make_config(**o) for _, o in sweep_runs(folder, sweep, scale)]
    todo = [config for config in runs if not finished_record(config)]
    if not todo:
        return None
    size = lambda config: identity(dataclasses.replace(config, lr=Config.lr, seed=Config.seed))
    timed = {}                                   # size -> (a run of it, step s, run s)
    for config in todo:
        if size(config) not in timed:
            timed[size(config)] = (config, *run_seconds(config, steps))
    total = sum(timed[size(config)][2] for config in todo)
    where = lambda c: (f"N = {c.seq_len}, D = {c.num_kv_pairs}" if not c.train_segments
                       else "the mean over its segments")
    steps_text = "; ".join(f"{step:.2g} s at {where(c)}, d = {c.d_model}"
                           for c, step, _ in timed.values())
    most = max(min(c.max_steps, c.budget_steps or c.max_steps) for c in todo)
    threads = torch.get_num_threads()
    return (f"estimate: {len(todo)} run{'s' * (len(todo) > 1)} of --mixer={mixer} to train "
            f"({scale} scale), one after another on {resolve_device(todo[0].device)}, "
            f"{threads} thread{'s' * (threads > 1)}: at most about {duration(total)}. A training "
            f"step takes {steps_text} (the median of {steps} timed steps), for at most "
            f"{most:,} steps a run, with its evaluations; an upper bound, as a run stops early "
            f"once its validation accuracy passes {todo[0].target_acc}. --workers=K runs K at "
            "once on the same cores.")


def duration(seconds):
    """"40 s", "31 min", "2 h 5 min": a time estimate as the estimate prints it."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def state_column(cell, runs):
    """The recurrent state of a cell's model (figures.state_size), or "unknown" where a
    layer has no state_size."""
    size = state_size(Config(**runs[0]["config"]))
    return ["unknown (no state_size)" if size is None else f"{size:,}"]


def yours_table(mixer, name="frontier"):
    """--table=frontier --mixer=...: the built-ins' cells and yours (cells_table), with
    each model's recurrent state, then the runs of other versions of your file, if any
    (other_versions)."""
    table = cells_table(name, both_sweep(mixer, name), (["recurrent state"], state_column),
                        yours_records(mixer, name))
    note = other_versions(mixer, name)
    return f"{table}\n\n{note}" if note else table


def plot_yours(mixer, name="frontier"):
    """--plot=frontier --mixer=...: plot_sweep of the built-ins' records and yours, into
    results/runs/frontier.png, _state.png, _curves.png (the committed figures stay)."""
    return plot_sweep(name, both_sweep(mixer, name), (("seq_len", "num_kv_pairs"), "d_model"),
                      records=yours_records(mixer, name), out=f"results/{YOURS}")
