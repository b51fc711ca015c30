"""MQAR as the field runs it: one model trained on a mixture of lengths and scored per slice,
slices longer than any training sequence included, by the protocols papers report since
Zoology (Arora et al., 2023): the official harness's "MQAR (Standard)" and the Mamba-2
paper's harder MQAR (Dao and Gu, 2024).

Rerun (python -m experiments ...):
  --sweep=mqar_standard [--scale=paper] [--workers=K] [--dry_run]   records in
                                           results/mqar_standard/ (--dry_run at paper scale
                                           prints each setting beside its source line on stderr)
  --sweep=mamba2_harder [--scale=paper] ...                        results/mamba2_harder/
  --table=mqar_standard, --plot=mqar_standard (results/mqar_standard_slices.png,
      _state.png), and the same for mamba2_harder (results/mamba2_harder.png: accuracy
      against d, a panel per N, the Mamba-2 paper's Figure 8 dotted)
  --sweep=mqar_standard --mixer=path/to/file.py:Class   a mixer of your own on the protocol
      (records in results/runs/mqar_standard/), then --table and --plot with the same --mixer

How the protocols differ from each other and from Figure 2's runs: experiments/README.md,
"MQAR as the field runs it".
"""
import math
import sys

import numpy as np

from experiments.common import cells, load_records, model_order, run_sweep, sweep_runs
from experiments.figures import (model_color, model_markers, scale_text, state_size,
                                 sweep_scale)
from experiments.frontier import yours_estimate, yours_label
from experiments.presets import make_config
from mixers import is_outside, load_outside, split_mixer
from train import (Config, acc_text, markdown, pyplot, save_figure, segments, slice_name,
                   wrapped)

# ----------------------------------------------------------------------------------------
# "MQAR (Standard)": the official harness's reference recipe

# HazyResearch/zoology at d88d6f5; each value's line (the file, then the line number)
STANDARD_SOURCE = "zoology/experiments/mqar_example_configs/original_mqar_configs.py"
STANDARD_TRAIN = ((64, 4, 100_000), (128, 8, 20_000), (256, 16, 20_000), (256, 32, 20_000),
                  (256, 64, 20_000))                                           # lines 15-19
STANDARD_TEST = ((64, 4, 1000), (64, 8, 1000), (64, 16, 1000), (128, 32, 1000),
                 (256, 64, 1000), (512, 128, 1000), (1024, 256, 1000))         # lines 22-28
STANDARD_LRS = tuple(float(f"{lr:.3g}") for lr in np.logspace(-3, -1.5, 4))   # line 94
STANDARD_EPOCHS, STANDARD_BATCH = 32, 256                                     # lines 100, 32
STANDARD_SOURCES = [       # (what, value, where), printed by --dry_run at paper scale
    ("vocabulary c", "8192", f"{STANDARD_SOURCE}:10 (VOCAB_SIZE = 8_192)"),
    ("train segments (N, D, examples)", ", ".join(map(str, STANDARD_TRAIN)),
     f"{STANDARD_SOURCE}:15-19 (train_configs)"),
    ("test slices (N, D, examples)", ", ".join(map(str, STANDARD_TEST)),
     f"{STANDARD_SOURCE}:22-28 (test_configs)"),
    ("the model's longest sequence", "1024", f"{STANDARD_SOURCE}:31 (input_seq_len = max(...))"),
    ("batch (train)", "256", f"{STANDARD_SOURCE}:32 (batch_size = 256)"),
    ("fillers", "uniform (keys included)",
     "zoology/data/multiquery_ar.py:12 (random_non_queries: bool=True), left as is"),
    ("power_a", "0.01", "zoology/data/multiquery_ar.py:10 (power_a: float=0.01)"),
    ("layers", "2: BaseConv (kernel 3) then the mixer; no MLP; no position embeddings",
     f"{STANDARD_SOURCE}:45-56 (state_mixer Identity, conv_mixer kernel_size 3) and "
     "zoology/experiments/models_repo.py (n_layers=2, max_position_embeddings=0)"),
    ("learning rates", ", ".join(f"{lr:g}" for lr in STANDARD_LRS),
     f"{STANDARD_SOURCE}:94 (np.logspace(-3, -1.5, 4))"),
    ("epochs", "32, cosine to 0 stepped per epoch", f"{STANDARD_SOURCE}:100 (max_epochs=32) "
     "and zoology/train.py:190 (CosineAnnealingLR(T_max=max_epochs))"),
    ("weight decay", "0.1, on every parameter", "zoology/config.py:137 (weight_decay: float = "
     "0.1) and zoology/train.py:185 (AdamW(self.model.parameters(), ...))"),
    ("early stop", "valid accuracy > 0.99", "zoology/config.py:132-133 (early_stopping_metric "
     "'valid/accuracy', threshold 0.99): the official 'valid' is its test slices; here a "
     "validation split of the same slices decides"),
    ("embedding dropout", "0.1", "zoology/config.py:107 (embed_dropout: float = 0.1)"),
    ("batch order", "segment after segment, the same every epoch",
     "zoology/data/utils.py:117, 153-165 (_SyntheticDataset, DataLoader shuffle=False)"),
    ("state size", "bytes at N = 1024: 4 per number", "zoology/logger.py:39-43 "
     "(state_size(sequence_length=max test length)), zoology/model.py:291 (state_size * 4)"),
]


def segments_text(parts):
    """A train_segments / test_slices setting: "N:D:examples,..."."""
    return ",".join(f"{N}:{D}:{n}" for N, D, n in parts)


def scaled(parts, share):
    """Each segment's examples times `share`, rounded."""
    return tuple((N, D, round(n * share)) for N, D, n in parts)


def standard_recipe(batch, epochs, test=STANDARD_TEST, train=STANDARD_TRAIN):
    """The official recipe (STANDARD_SOURCES) on the official block and init (the figure2
    preset's: figure2_values), at `batch` and `epochs` over these segments; every epoch
    evaluated, the early stop on validation."""
    steps = sum(math.ceil(n / batch) for _, _, n in train)
    return dict(preset=["figure2"], vocab_size=[8192], power_a=[0.01], fillers=["uniform"],
                seq_len=[max(N for N, _, _ in train + test)], position_embedding=["none"],
                train_segments=[segments_text(train)], test_slices=[segments_text(test)],
                num_valid=[test[0][2]], batch_size=[batch], max_steps=[epochs * steps],
                eval_every=[steps])


# every built-in mixer of the frontier after a BaseConv of kernel 3, the official stack
STACK = "base_conv:kernel_size=3,{}"
PROTOCOL_MIXERS = ("attention", "sliding_window", "based", "mamba", "gla", "mamba2",
                   "deltanet", "gated_deltanet", "rwkv7", "base_conv")
# the widths and options models_repo.py (d88d6f5) sweeps for each; ours takes the rest at
# its defaults (base_conv, not in models_repo.py, at the widths of the recurrent ones)
PAPER_WIDTHS = {"attention": ([32, 64, 128], [":num_heads=2:dropout=0.1"]),
                "sliding_window": ([128], [f":window={w}" for w in (8, 16, 32, 64, 128, 256,
                                                                    512, 1024)]),
                "based": ([48, 64, 128], [f":feature_dim={f}" for f in (8, 16, 24)]),
                "mamba": ([64, 128, 256], [f":d_state={s}" for s in (8, 16, 24)]),
                "mamba2": ([64, 128, 256], [f":d_state={s}" for s in (8, 16, 24)])}


def paper_standard():
    """mqar_standard at paper scale: the official recipe at every lr, one grid per mixer
    and option (PAPER_WIDTHS; one seed, as the official sweep)."""
    grids = []
    for name in PROTOCOL_MIXERS:
        widths, options = PAPER_WIDTHS.get(name, ([64, 128, 256], [""]))
        for option in options:
            grids.append(dict(models={name + option.replace(":", " "): STACK.format(name + option)},
                              d_model=widths, lr=list(STANDARD_LRS), seed=[0],
                              **standard_recipe(STANDARD_BATCH, STANDARD_EPOCHS)))
    return grids


# cpu scale, sized by measurement (experiments/README.md, "MQAR as the field runs it"): the
# same segments and slices at a fifth of the training examples and a fifth of the test
# examples, d = 64, batches of 64, 6 epochs, one lr (the CPU recipe's)
CPU_STANDARD = dict(models={name: STACK.format(name) for name in PROTOCOL_MIXERS},
                    d_model=[64], lr=[3e-3], seed=[0],
                    **standard_recipe(64, 6, scaled(STANDARD_TEST, 0.2),
                                      scaled(STANDARD_TRAIN, 0.2)))

# ----------------------------------------------------------------------------------------
# the Mamba-2 paper's harder MQAR (Dao and Gu, 2024, arXiv 2405.21060: section 9.1,
# appendix D.1)

# a curriculum over D = N/32, N/16, N/8, N/4, 2^18 examples each, 8 epochs each; batches of
# 2^18 tokens; 2 layers, otherwise "default settings"; attention with position embeddings;
# d in {32, 64, 128, 256}; lr in {10^-3.5, 10^-2.5, 10^-2}, decayed linearly. Ours: the
# default block and recipe where the paper says nothing, fillers uniform (the official
# generator's random non-queries, on which its experiments ran: our reading), the decay
# per step, test and validation 1,000 examples at D = N/4 (the paper gives no count). At
# N = 1024 the training split is 2^20 sequences, 17 GB of int64 tokens and labels: a GPU
# machine's memory, not a laptop's
HARDER_LRS = (3.16e-4, 3.16e-3, 1e-2)


def harder_grid(N, examples, passes, batch, widths, lrs, models, test):
    """One N of the harder MQAR: the curriculum over D (segment_passes passes each)."""
    curriculum = [(N, N // k, examples) for k in (32, 16, 8, 4)]
    steps = passes * sum(math.ceil(n / batch) for _, _, n in curriculum)
    return dict(models=models, d_model=widths, lr=list(lrs), seed=[0], seq_len=[N],
                vocab_size=[8192], fillers=["uniform"], train_segments=[segments_text(curriculum)],
                segment_passes=[passes], test_slices=[f"{N}:{N // 4}:{test}"], num_valid=[test],
                batch_size=[batch], max_steps=[steps], eval_every=[steps // 8],
                schedule=["linear"], shuffle=[True], eval_probe=[0])


HARDER_MODELS = {name: name for name in PROTOCOL_MIXERS}        # 2 layers of the mixer
SWEEPS = {
    "mqar_standard": {"paper": paper_standard(), "cpu": CPU_STANDARD},
    "mamba2_harder": {
        "paper": [harder_grid(N, 2**18, 8, 2**18 // N, [32, 64, 128, 256], HARDER_LRS,
                              HARDER_MODELS, 1000) for N in (256, 512, 1024)],
        # cpu: N = 256 only, 8,192 examples per D, 2 passes each, d = 32 and 64, one lr
        "cpu": harder_grid(256, 8192, 2, 64, [32, 64], [3e-3], HARDER_MODELS, 250)},
}

# The Mamba-2 paper's Figure 8, read off the figure (≈, ± 0.03): accuracy at d = 32, 64,
# 128, 256 by N (the paper's models; Mamba at d_state 16, Mamba-2 at d_state 64, ours'
# default; the figure's d_state 16 and 256 lines are not drawn here)
FIGURE8_SOURCE = ("the Mamba-2 paper's Figure 8 (Dao and Gu, 2024; read off the figure, "
                  "± 0.03; its scale)")
FIGURE8 = {"attention": {256: (.50, .80, 1.0, 1.0), 512: (.05, .94, .98, 1.0),
                         1024: (.01, .27, .52, .91)},
           "based": {256: (.20, .55, .89, .96), 512: (.05, .25, .65, .87),
                     1024: (.01, .06, .27, .63)},
           "mamba": {256: (.00, .00, .01, .48), 512: (0, 0, 0, 0), 1024: (0, 0, 0, 0)},
           "mamba2": {256: (.00, .93, .99, 1.0), 512: (.45, .95, .97, .99),
                      1024: (.18, .88, .97, .99)}}
FIGURE8_WIDTHS = (32, 64, 128, 256)


# ----------------------------------------------------------------------------------------
# tables and figures: accuracy per slice, the mean against state size

def slices_of(record):
    """A record's test slices, in order, as (name, N, D); its one (N, D) without slices."""
    config = Config(**record["config"])
    return [(slice_name(N, D), N, D) for N, D, _ in segments(config, "test")]


def trained_length(config):
    """The longest training sequence of a run."""
    return max(N for N, _, _ in segments(config, "train"))


def state_columns(config):
    """(numbers per sequence at the longest training length, the official bytes: 4 per
    number at the longest test length), None where a layer has no state_size."""
    numbers = state_size(config, trained_length(config))
    official = state_size(config, max(N for N, _, _ in segments(config, "test")))
    return numbers, None if official is None else 4 * official


def slice_accuracy(record, name):
    """A record's test accuracy on slice `name` (its only one without slices)."""
    return record["test_slices"][name]["acc"] if "test_slices" in record else record["test_acc"]


def slice_mean(cell, name):
    """A cell's test accuracy on slice `name`, the mean over its runs (seeds)."""
    return sum(slice_accuracy(run, name) for run in cell["runs"]) / len(cell["runs"])


def protocol_records(name, sweep, records=None):
    """(the records of protocol `name`, results/<name>/ unless given, and their scale:
    sweep_scale); a ValueError when there are none yet."""
    records = load_records(f"results/{name}") if records is None else records
    if not records:
        raise ValueError(f"results/{name}/ has no records yet: python -m experiments "
                         f"--sweep={name}")
    return records, sweep_scale(name, sweep, records)


def model_rank(name, sweep, scale):
    """The order of a protocol's rows (cells): its models as the grids of the records'
    `scale` list them, a mixer of your own last, then N and d."""
    order = model_order(name, {scale: sweep[scale]} if scale else sweep)
    return lambda r: (r["label"].endswith(" (yours)"), order.get(r["label"], len(order)),
                      r["seq_len"], r["d_model"])


def protocol_table(name, sweep, records=None):
    """--table=NAME of a protocol: a row per cell (model, d; the lr that validation chose),
    the state in both conventions, the mean over slices (validation, test, per-sequence
    test), then each slice's test accuracy; the slices longer than any training sequence
    marked "past training"."""
    records, scale = protocol_records(name, sweep, records)
    rows = sorted(cells(records), key=model_rank(name, sweep, scale))
    slices = slices_of(rows[0]["runs"][0])
    longest = trained_length(Config(**rows[0]["runs"][0]["config"]))
    header = ["model", "N", "d", "lr", "state (numbers, trained N)", "state (official bytes)",
              "valid mean", "test mean", "test per-sequence", "ended",
              *(f"{s} past training" if N > longest else s for s, N, _ in slices)]
    table = []
    for r in rows:
        config = Config(**r["runs"][0]["config"])
        numbers, official = state_columns(config)
        mean = lambda key: sum(run.get(key, math.nan) for run in r["runs"]) / len(r["runs"])
        table.append([r["label"], config.seq_len, r["d_model"], f"{r['lr']:g}",
                      "unknown" if numbers is None else f"{numbers:,}",
                      "unknown" if official is None else f"{official:,}",
                      acc_text(r["valid_acc"]), acc_text(r["test_acc"]),
                      acc_text(mean("test_seq_acc")),
                      ", ".join(sorted({run["ended"] for run in r["runs"]})),
                      *(acc_text(slice_mean(r, s)) for s, _, _ in slices)])
    return markdown(header, table)


def plot_protocol(name, sweep, records=None, out=None):
    """--plot=NAME of a protocol: test accuracy per slice (a line per model and width; the
    slices past the longest training sequence shaded) to <out>_slices.png, and the mean over
    slices against the official state bytes (a line per model over its widths, best lr on
    validation) to <out>_state.png; mamba2_harder's accuracy against d, a panel per N, with
    the Mamba-2 paper's Figure 8 dotted, to <out>.png. Returns (records, paths)."""
    records, scale = protocol_records(name, sweep, records)
    out = out or f"results/{name}"
    rows, plt = cells(records), pyplot()
    labels = list(dict.fromkeys(r["label"] for r in sorted(rows, key=model_rank(name, sweep,
                                                                                  scale))))
    markers = model_markers(labels)
    unfinished = any(run["ended"] == "interrupted" for r in rows for run in r["runs"])
    note = ("; hollow: an interrupted run (not finished)" if unfinished else "")
    scale = scale_text(scale)
    paths = []

    def style(r):
        done = all(run["ended"] != "interrupted" for run in r["runs"])
        color = model_color(r["label"])
        return dict(color=color, marker=markers[r["label"]],
                    markerfacecolor=color if done else "white")

    by_n = sorted({r["seq_len"] for r in rows})
    fig, axes = plt.subplots(1, len(by_n), figsize=(4.5 * len(by_n) + 3, 3.6), squeeze=False)
    for ax, N in zip(axes[0], by_n):
        at = [r for r in rows if r["seq_len"] == N]
        slices = slices_of(at[0]["runs"][0])
        longest = trained_length(Config(**at[0]["runs"][0]["config"]))
        x = range(len(slices))
        past = [i for i, (_, n, _) in enumerate(slices) if n > longest]
        if past:
            ax.axvspan(past[0] - 0.5, past[-1] + 0.5, color="0.92", zorder=0,
                       label=f"past the longest training N = {longest}")
        for r in sorted(at, key=lambda r: (labels.index(r["label"]), r["d_model"])):
            acc = [slice_mean(r, s) for s, _, _ in slices]
            ax.plot(x, acc, lw=1.2, ms=4, label=f"{r['label']} d={r['d_model']}", **style(r))
        ax.set_xticks(list(x), [s for s, _, _ in slices], rotation=45, fontsize=7)
        ax.set(xlabel="test slice N:D", ylabel="test accuracy (per query)", ylim=(-0.02, 1.02))
    axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(wrapped(f"{name} at {scale}: test accuracy per slice (the lr that validation "
                         f"chose){note}", fig.get_figwidth()), fontsize=9)
    paths.append(save_figure(fig, f"{out}_slices.png"))

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for label in labels:
        for N in by_n:
            at = sorted((r for r in rows if r["label"] == label and r["seq_len"] == N),
                        key=lambda r: r["d_model"])
            points = [(state_columns(Config(**r["runs"][0]["config"]))[1], r) for r in at]
            points = [(s, r) for s, r in points if s is not None]
            if not points:
                continue
            ax.plot([s for s, _ in points], [r["test_acc"] for _, r in points], lw=1, ms=5,
                    label=label + (f" N={N}" if len(by_n) > 1 else ""), **style(points[0][1]))
    ax.set(xscale="log", xlabel="state size (official: bytes at the longest test length)",
           ylabel="test accuracy, mean over slices", ylim=(-0.02, 1.02))
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(wrapped(f"{name} at {scale}: the mean over test slices against state "
                         f"size{note}", fig.get_figwidth()), fontsize=9)
    paths.append(save_figure(fig, f"{out}_state.png"))

    if name.startswith("mamba2_harder"):
        fig, axes = plt.subplots(1, len(by_n), figsize=(3.6 * len(by_n) + 2.5, 3.4),
                                 squeeze=False)
        for ax, N in zip(axes[0], by_n):
            for label in labels:
                at = sorted((r for r in rows if r["label"] == label and r["seq_len"] == N),
                            key=lambda r: r["d_model"])
                if at:
                    ax.plot([r["d_model"] for r in at], [r["test_acc"] for r in at], lw=1.2,
                            ms=4, label=label, **style(at[0]))
                if label in FIGURE8 and N in FIGURE8[label]:
                    ax.plot(FIGURE8_WIDTHS, FIGURE8[label][N], ls=":", lw=1.2,
                            color=model_color(label), label=f"{label}, the paper")
            ax.set(xscale="log", xlabel="d", ylabel=f"test accuracy, N = {N}, D = {N // 4}",
                   ylim=(-0.02, 1.02), title=f"N = {N}")
            ax.set_xticks(FIGURE8_WIDTHS, [str(d) for d in FIGURE8_WIDTHS])
        axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
        fig.suptitle(wrapped(f"{name} at {scale}: accuracy against d; dotted: "
                             f"{FIGURE8_SOURCE}{note}", fig.get_figwidth()), fontsize=9)
        paths.append(save_figure(fig, f"{out}.png"))
    return records, paths


def sources_text():
    """--sweep=mqar_standard --scale=paper --dry_run's preamble: each setting of the
    official recipe beside its source line (STANDARD_SOURCES)."""
    return markdown(["setting", "value", "source (HazyResearch/zoology at d88d6f5)"],
                    STANDARD_SOURCES)


# ----------------------------------------------------------------------------------------
# a mixer of your own on a protocol: the same grids, your model alone, beside the
# built-ins' committed records

def yours_protocol(mixer, name):
    """The protocol `name`'s grids (every scale) with the one model of your mixer in the
    protocol's place (after the BaseConv for mqar_standard, alone for mamba2_harder),
    labelled yours_label; a ValueError for a built-in mixer, which runs already."""
    source = split_mixer(mixer)[0]
    if not is_outside(source):
        raise ValueError(f"--mixer={mixer!r} is not allowed with --sweep={name}: the built-in "
                         f"mixers are in the protocol already ({', '.join(PROTOCOL_MIXERS)}); "
                         "give a mixer of your own, path/to/file.py:Class or "
                         "package.module:Class")
    load_outside(source)
    model = {yours_label(mixer): STACK.format(mixer) if name == "mqar_standard" else mixer}
    one = lambda grid: dict(grid, models=model)
    return {scale: [one(g) for g in grids] if isinstance(grids, list) else one(grids)
            for scale, grids in SWEEPS[name].items()}


def run_protocol_sweep(name, scale, dry_run=False, **workers):
    """--sweep=NAME of a protocol: run_sweep; at paper scale with dry_run, the official
    recipe's sources first, on stderr (mqar_standard), so that stdout stays one command line
    per run (for xargs)."""
    if dry_run and name == "mqar_standard" and scale == "paper":     # stdout: the runs alone
        print(sources_text() + "\n", file=sys.stderr)
    return run_sweep(name, SWEEPS[name], scale, make_config, dry_run=dry_run, **workers)


def yours_folder(name):
    """Where your mixer's runs of protocol `name` go: results/runs/<name>/ (git ignores
    results/runs/)."""
    return f"runs/{name}"


def run_yours(mixer, name, scale, dry_run=False, **workers):
    """--sweep=NAME --mixer=...: your mixer's runs of the protocol (yours_protocol), after
    the time they will take at most (frontier.yours_estimate) unless dry_run."""
    sweep = yours_protocol(mixer, name)
    estimate = None if dry_run else yours_estimate(mixer, scale, name, sweep=sweep,
                                                   folder=yours_folder(name))
    if estimate:
        print(estimate, flush=True)
    return run_sweep(yours_folder(name), sweep, scale, make_config, dry_run=dry_run, **workers)


def yours_records(mixer, name):
    """The built-ins' records of protocol `name` (results/<name>/) and your mixer's
    (results/runs/<name>/, those of this version of its file); a ValueError when yours has
    none yet."""
    sweep = yours_protocol(mixer, name)
    first = make_config(**sweep_runs(yours_folder(name), sweep, next(iter(sweep)))[0][1])
    yours = [r for r in load_records(f"results/{yours_folder(name)}")
             if (r["config"]["mixer"], r["config"].get("mixer_source")) == (first.mixer,
                                                                       first.mixer_source)]
    if not yours:
        raise ValueError(f"--mixer={mixer!r} has no finished runs of {name} in "
                         f"results/{yours_folder(name)}/ yet: python -m experiments "
                         f"--sweep={name} --mixer={mixer}")
    return load_records(f"results/{name}") + yours


def both(mixer, name):
    """The protocol's sweep with your model after the built-ins (the tables' order)."""
    yours = yours_protocol(mixer, name)
    merge = lambda grid, mine: dict(grid, models={**grid["models"], **mine["models"]})
    return {scale: ([merge(g, m) for g, m in zip(grids, yours[scale])]
                    if isinstance(grids, list) else merge(grids, yours[scale]))
            for scale, grids in SWEEPS[name].items()}


def yours_table(mixer, name):
    """--table=NAME --mixer=...: protocol_table of the built-ins' records and yours."""
    return protocol_table(name, both(mixer, name), yours_records(mixer, name))


def plot_yours(mixer, name):
    """--plot=NAME --mixer=...: plot_protocol of the built-ins' records and yours, into
    results/runs/<name>_*.png (the committed figures stay)."""
    return plot_protocol(name, both(mixer, name), yours_records(mixer, name),
                         out=f"results/{yours_folder(name)}")
