"""The lab's tables and figures (Arora et al., 2023): one colour per model in every figure;
Figure 2's accuracies, read off the plot, which every figure marks where Figure 2 has the
cell; and a sweep's table and figures in Figure 2's layout, which Figure 2, Figure 6, the
hybrids (Section 5), F.2 and the frontier are drawn in (figure2.py, figure6.py, hybrids.py,
f2.py, frontier.py): its cells (cells_table), accuracy by width or by D, accuracy against
recurrent state, and the learning curves (plot_sweep). Each experiment's own tables and
figures stay in its file, drawn with these.

The figures draw with train.py's helpers (plot_curves, wrapped, save_figure); the main job's
figure (python train.py) colours its two models as MODEL_COLORS does, so results/main.png
is the lab's figure of the same records.
"""
import collections
import math
from pathlib import Path

import torch

from experiments.common import cells, load_records, model_order, sweep_runs
from experiments.presets import PAPER_GRID, figure2_values, make_config
from train import (BASE_CONV, ENDED, MAIN_COLORS, PAPER_FIG2_SOURCE, Config, LanguageModel,
                   acc_text, budget_text, identity, markdown, plot_curves, pyplot, save_figure,
                   seeds_text, wrapped)
from train import model_color as train_model_color


# ----------------------------------------------------------------------------------------
# one colour per model across every figure

# each model's colour, an index into matplotlib's tab20 (0-19), then tab20b (20-39): the main
# job's two models as train.py colours them (MAIN_COLORS), then the lab's
MODEL_COLORS = {**MAIN_COLORS, "BaseConv": 2, "h3": 4, "H3": 4, "hyena": 6, "Hyena": 6,
                "rwkv": 8, "RWKV": 8, "retnet": 10, "based": 12, "mamba": 14,
                "sliding window 8": 16, "sliding window 32": 18, "blocked 32": 1,
                "programmatic filters": 3, "autocorrelation filters": 5,
                "+ programmatic selection": 7, "+ learned selection": 9,
                "+ random, as many rows as programmatic": 11, "+ random, learned budget": 13,
                "attention + short conv": 15,
                # tab20b after tab20: one hue each for the mixers since the paper
                "gla": 20, "mamba2": 24, "deltanet": 28, "gated_deltanet": 32, "rwkv7": 36}


def model_color(label):
    """The colour of a model in every figure (train.model_color of MODEL_COLORS); a label not
    listed takes one of the colours no listed model has, by its name."""
    return train_model_color(label, MODEL_COLORS)


# ----------------------------------------------------------------------------------------
# Figure 2's values, read off the plot: the crosses of every sweep's figure

# Figure 2's accuracies read off the plot (±0.03) at d = 64, 128, 256, 512, by N; attention
# is ≈ 0.99 everywhere (paper Section 4, Figure 2).
PAPER_FIG2 = {
    "attention": {N: (0.99, 0.99, 0.99, 0.99) for N in (64, 128, 256, 512)},
    "hyena": {64: (.51, .74, .83, .85), 128: (.20, .63, .73, .83), 256: (.05, .14, .53, .68),
              512: (.02, .04, .11, .18)},
    "rwkv": {64: (.74, .93, .95, .97), 128: (.18, .50, .74, .91), 256: (.06, .07, .66, .78),
             512: (.02, .03, .16, .37)},
    "h3": {64: (.91, .97, .97, .96), 128: (.25, .72, .89, .75), 256: (.06, .63, .61, .66),
           512: (.02, .03, .03, .10)},
    "base_conv": {64: (.69, .92, .94, .97), 128: (.37, .61, .83, .94),
                  256: (.15, .34, .80, .92), 512: (.02, .03, .04, .70)},
}

# each model of Figure 2 in its paper form, as the cpu sweeps train it under its name: its
# own mixer, and BaseConv Figure 2's stack (a short then a long convolution)
PAPER_FORMS = {label: BASE_CONV if label == "base_conv" else label for label in PAPER_FIG2}


def figure2_at_64(label, d_model):
    """Figure 2's read-off accuracy at N = 64 for a model label and width, or None: the
    tables' column, the same N = 64 value for a cpu run at N = 32 or 64 (the figures read
    figure2_points, by the run's model, task and (N, D))."""
    values = PAPER_FIG2.get(label, {}).get(64, ())
    return dict(zip(PAPER_GRID["d_model"], values)).get(d_model)


def figure2_model(config):
    """The key of PAPER_FIG2 for the model `config` trains, if it is a model of Figure 2 on
    Figure 2's task, else None: its label is that key, its mixer that model's paper form
    (PAPER_FORMS, as the fig2 sweep trains it at cpu scale) or its official forms (of
    --preset=figure2 or figure2_plotted), its (N, D) one of Figure 2's (PAPER_GRID) and its
    α Figure 2's 0.01. So the main job's, f2's, hybrids' and the frontier's BaseConv (the
    paper's short-then-long stack) have Figure 2's values; the frontier's "attention"
    (BaseConv, then attention) and Figure 6's runs (α = 0.1) have none."""
    label = config.label
    if (label not in PAPER_FIG2 or (config.seq_len, config.num_kv_pairs) not in PAPER_GRID["nd"]
            or config.power_a != figure2_values(config)["power_a"]):
        return None
    official = [make_config(preset=preset, mixer=label, seq_len=config.seq_len,
                            num_kv_pairs=config.num_kv_pairs, n_layers=config.n_layers).mixer
                for preset in ("figure2", "figure2_plotted")]
    return label if config.mixer in (PAPER_FORMS[label], *official) else None


def figure2_points(config):
    """Figure 2's (d, accuracy) points (PAPER_FIG2, read off the plot) for the model and
    (N, D) of `config` (figure2_model); [] where Figure 2 has none."""
    label = figure2_model(config)
    return list(zip(PAPER_GRID["d_model"], PAPER_FIG2[label][config.seq_len])) if label else []


def figure2_value(config):
    """Figure 2's accuracy for the cell (model, N, D, d) of `config`, or None."""
    return dict(figure2_points(config)).get(config.d_model)


# ----------------------------------------------------------------------------------------
# a sweep's table and figure in Figure 2's layout, drawn from the records in results/<sweep>/

SYMBOLS = {"seq_len": "N", "num_kv_pairs": "D", "d_model": "d", "vocab_size": "c"}


def curves_figure(records, path, sweep, name=None):
    """train.plot_curves of `records` (runs of sweep `name`, by default the folder their
    out_dir names; its grids by scale: `sweep`), with its scale (sweep_scale) and Figure 2's
    values (figure2_value)."""
    name = name or ", ".join(sorted({Path(r["config"]["out_dir"]).name for r in records}))
    return plot_curves(records, path, scale_text(sweep_scale(name, sweep, records)),
                       figure2_value, name, MODEL_COLORS)


PAPER_NOTE = f"x: {PAPER_FIG2_SOURCE}"         # the crosses of the accuracy and state figures


def sweep_scale(name, sweep, records):
    """The scale of sweep `name` (its grids by scale: `sweep`; "cpu" or "paper") whose runs
    `records` are; "" when no scale of it lists them all (a record copied from another
    sweep's folder counts as the run it is: out_dir is not part of a run's identity)."""
    runs = {identity(Config(**r["config"])) for r in records}
    grids = [(scale, sweep_runs(name, sweep, scale)) for scale in sweep]
    # the smaller grid first: building the paper grid's configs (1,728 for fig2) takes seconds
    for scale, grid in sorted(grids, key=lambda pair: len(pair[1])):
        if runs <= {identity(make_config(**o)) for _, o in grid}:
            return scale
    return ""


def scale_text(scale):
    """"cpu scale" or "paper scale" for a scale from sweep_scale, or what else the runs are."""
    return f"{scale} scale" if scale else "runs of no scale of its sweep"


def state_size(config, length=None):
    """Numbers of recurrent state per example after `length` tokens (by default seq_len),
    over every layer; None where a layer does not say (a mixer of your own need not define
    state_size)."""
    with torch.random.fork_rng(devices=[]):
        model = LanguageModel(config)
    sizes = [getattr(b.mixer, "state_size", None) for b in model.blocks]
    return None if None in sizes else sum(size(length or config.seq_len) for size in sizes)


def dodge(x, i, n, spread=0.1):
    """x moved right or left, on a log axis, for the i-th of n series that share it: by
    `spread` octaves between neighbours (0.1: some 7 pixels where a panel spans 4 octaves
    in 2.4 inches at 120 dpi, more than a marker's width), so that no two series sit on one
    spot."""
    return x * 2 ** (spread * (i - (n - 1) / 2))


MARKERS = "os^vDP*Xph<>"        # one marker per model within a figure, beside its colour


def model_markers(labels):
    """{label: marker} for the models of one figure, in their order (MARKERS, cycled)."""
    return {label: MARKERS[i % len(MARKERS)] for i, label in enumerate(labels)}


def plotted_records(name):
    """The records of results/<name>, or a ValueError when there are none to plot."""
    records = load_records(f"results/{name}")
    if not records:
        raise ValueError(f"--plot={name} is not allowed yet: results/{name}/ holds no records "
                         f"(python -m experiments --sweep={name})")
    return records


def unfinished(row):
    """Whether a cell (a row of cells) has a run that was interrupted: its accuracy is the one
    so far, and the same --sweep continues it. The table says so (steps_text); the figures
    draw it hollow (a point) or hatched (a bar)."""
    return any(run["ended"] == "interrupted" for run in row["runs"])


UNFINISHED_NOTE = "hollow or hatched: a cell with an interrupted run, at its accuracy so far"


def hollow(ax, x, y, marker, color):
    """The points (x, y) of a model's series drawn hollow, on top of its line (unfinished)."""
    if x:
        ax.scatter(x, y, marker=marker, s=3.5 ** 2, facecolors="white", edgecolors=color,
                   zorder=3)


def plot_sweep(name, sweep, axes, bound=None, records=None, out=None):
    """results/<name>.png: test accuracy (mean and 95% interval over seeds, the lr chosen on
    validation) against the x key, one panel per panel key (axes: (the keys that make a
    panel, the x key)), the models of a panel dodged apart (dodge), or side by side as bars
    where the sweep has one cell per model, the paper's values (figure2_points) as crosses,
    and where `bound` is given (a function of a cell: the best accuracy its model can reach,
    Figure 6's cell_reach_bound) that bound dashed below 1; results/<name>_state.png:
    accuracy against recurrent state size, the same panels, one line per model, dodged
    alike; results/<name>_curves.png: the first seed's learning curves (plot_curves). Every
    model in its colour (model_color) and marker (model_markers), the titles the scale (of
    `sweep`, its grids by scale) and budget. `records` (the frontier with a mixer of yours:
    frontier.yours_records) are drawn instead of results/<name>'s, and the figures go to
    `out`.png, _state.png, _curves.png instead of results/<name>'s; a model whose state size
    is unknown (state_size: None) is left out of the state figure, its title says so. A cell
    with an interrupted run (unfinished) is drawn hollow or hatched, the titles say so.
    Returns (the cells' rows, the paths written)."""
    plt = pyplot()
    import matplotlib.ticker
    records = records or plotted_records(name)
    out = out or f"results/{name}"
    rows = cells(records)
    panel_keys, x_key = axes
    panel_of = lambda r: tuple(r[k] for k in panel_keys)
    title = lambda panel: ", ".join(f"{SYMBOLS[k]} = {v}" for k, v in zip(panel_keys, panel))
    panels = sorted({panel_of(r) for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    colors = {label: model_color(label) for label in labels}
    markers = model_markers(labels)
    config_of = lambda row: Config(**row["runs"][0]["config"])
    in_panel = lambda panel: [label for label in labels if any(
        r["label"] == label and panel_of(r) == panel for r in rows)]
    heading = f"{name} at {scale_text(sweep_scale(name, sweep, records))}"
    budget = budget_text(records)
    several = max(r["seeds"] for r in rows) > 1                 # seeds to take a mean over
    seeds = (f"mean and 95% interval over {seeds_text(records)}" if several
             else f"{seeds_text(records)}, no interval")
    drew_paper = False
    bars = any(len({r[x_key] for r in rows if panel_of(r) == panel}) == 1 for panel in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(4.5, 3.2 * len(panels)),
                                                      4.4 if bars else 3.4),   # bars: names
                             squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels):
        here_labels = in_panel(panel)
        single = len({r[x_key] for r in rows if panel_of(r) == panel}) == 1   # bars, below
        for i, label in enumerate(here_labels):
            here = sorted((r for r in rows if r["label"] == label and panel_of(r) == panel),
                          key=lambda r: r[x_key])
            x, y = [r[x_key] for r in here], [r["test_acc"] for r in here]
            half = [0 if math.isnan(r["interval"]) else r["interval"] for r in here]
            err = [[min(h, v) for h, v in zip(half, y)],                     # within [0, 1]
                   [min(h, 1 - v) for h, v in zip(half, y)]]
            paper = {(r[x_key], figure2_value(config_of(r))) for r in here}  # the cells'
            if x_key == "d_model":                   # and Figure 2's other widths at (N, D)
                paper |= set(figure2_points(config_of(here[0])))
            paper = sorted((px, py) for px, py in paper if py is not None)
            drew_paper |= bool(paper)
            if single:                           # one x for every model: bars side by side
                ax.bar(i, y[0], yerr=[[e[0]] for e in err], capsize=2, color=colors[label],
                       label=label, **(dict(hatch="////", edgecolor="white")
                                       if unfinished(here[0]) else {}))
                if paper:                            # black: a cross on its own colour hides
                    ax.scatter([i], [paper[0][1]], marker="x", s=30, color="black", zorder=3)
                continue
            dodged = [dodge(v, i, len(here_labels)) for v in x]
            done = [k for k, r in enumerate(here) if not unfinished(r)]
            ax.errorbar(dodged, y, yerr=err, marker=markers[label], ms=3.5, capsize=2,
                        color=colors[label], label=label, markevery=done)
            hollow(ax, [dodged[k] for k in range(len(here)) if k not in done],
                   [y[k] for k in range(len(here)) if k not in done], markers[label],
                   colors[label])
            if paper:
                ax.scatter(*zip(*paper), marker="x", alpha=0.6, color=colors[label])
            if bound:                            # the best a model can do: its bound
                best = [bound(r) for r in here]
                if min(best) < 1:
                    ax.plot([dodge(v, i, len(here_labels)) for v in x], best, ls="--", lw=1,
                            color=colors[label])
        if single:                               # the bars named below them
            ax.set_xticks(range(len(here_labels)), here_labels, rotation=30, ha="right",
                          fontsize=7)
            ax.set_xlabel(f"{SYMBOLS[x_key]} = {rows[0][x_key]}")
        else:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))  # 4, not 4.0
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel(SYMBOLS[x_key])
        ax.set_title(title(panel), fontsize=9)
    partial = f"\n({UNFINISHED_NOTE})" if any(map(unfinished, rows)) else ""
    notes = ("\n(dashed: the share of test queries within the model's reach, its bound)"
             if bound else "") + (f"\n({PAPER_NOTE})" if drew_paper else "") + partial
    width = fig.get_figwidth()
    fig.suptitle(wrapped(f"{heading}: {budget}\n{seeds}{notes}", width),
                 fontsize=9)
    axes[0][0].set(ylabel="test accuracy", ylim=(0, 1.02))
    if not single:                               # one legend for every panel's models
        handles = {lab: h for ax in axes[0] for h, lab in zip(*ax.get_legend_handles_labels())}
        axes[0][-1].legend([handles[label] for label in labels], labels, fontsize=7,
                           loc="upper left", bbox_to_anchor=(1.01, 1))
    save_figure(fig, f"{out}.png")
    # the same panels, against the state each model carries: one line per model through its
    # widths (Figure 2's right-hand picture), dodged as above: models of one state (the
    # selections of hybrids) would sit on one spot; the legend beside them widens the figure
    # by its labels' length beyond some 40 characters (7-point text, about 0.06 inch each)
    legend_extra = max(0.0, 0.06 * max(map(len, labels)) - 2.5)
    fig, axes = plt.subplots(1, len(panels), squeeze=False, sharey=True,
                             figsize=(max(5.5, 4 * len(panels)) + legend_extra, 3.8))
    sizes = [state_size(config_of(r)) for r in rows]
    unknown = list(dict.fromkeys(r["label"] for r, s in zip(rows, sizes) if s is None))
    known = [(r, s) for r, s in zip(rows, sizes) if r["label"] not in unknown]
    for ax, panel in zip(axes[0], panels):
        here_labels = [label for label in in_panel(panel) if label not in unknown]
        for i, label in enumerate(here_labels):
            here = [(r, s) for r, s in known if r["label"] == label and panel_of(r) == panel]
            points = sorted(((s, r["test_acc"], figure2_value(config_of(r)), unfinished(r))
                             for r, s in here), key=lambda p: p[:2])
            dodged = [dodge(s, i, len(here_labels)) for s, *_ in points]
            ax.plot(dodged, [a for _, a, *_ in points], marker=markers[label], ms=3.5,
                    color=colors[label], label=label,
                    markevery=[k for k, p in enumerate(points) if not p[3]])
            hollow(ax, [x for x, p in zip(dodged, points) if p[3]],
                   [p[1] for p in points if p[3]], markers[label], colors[label])
            paper = [(s, p) for s, _, p, _ in points if p is not None]
            if paper:
                ax.scatter(*zip(*paper), marker="x", alpha=0.6, color=colors[label])
        ax.set_xscale("symlog", linthresh=1)        # a state of 0 (blocked attention at t = N)
        ax.set_xlabel("recurrent state, numbers per example (all layers)", fontsize=8)
        ax.set_title(title(panel), fontsize=9)
    handles = {lab: h for ax in axes[0] for h, lab in zip(*ax.get_legend_handles_labels())}
    drawn = [label for label in labels if label not in unknown]
    axes[0][-1].legend([handles[label] for label in drawn], drawn, fontsize=7,
                       loc="upper left", bbox_to_anchor=(1.01, 1))   # one for every panel
    axes[0][0].set(ylabel="test accuracy", ylim=(0, 1.02))
    paper = f"\n({PAPER_NOTE})" if drew_paper else ""
    missing = (f"\nnot drawn, state size unknown (no state_size): {', '.join(unknown)}"
               if unknown else "")
    fig.suptitle(wrapped(f"{heading}: accuracy against recurrent state size ({SYMBOLS[x_key]} "
                         f"along each line)\n{budget}; {'mean over ' if several else ''}"
                         f"{seeds_text(records)}{paper}{missing}{partial}", fig.get_figwidth()),
                 fontsize=9)
    save_figure(fig, f"{out}_state.png")
    first_seed = min(r["seed"] for r in records)
    curves_figure([r for r in records if r["seed"] == first_seed], f"{out}_curves.png",
                  sweep, name)
    return rows, [f"{out}.png", f"{out}_state.png", f"{out}_curves.png"]


def steps_text(records):
    """The steps the runs took and why they ended, e.g. "650–800 (target)"."""
    steps = sorted(r["steps"] for r in records)
    span = f"{steps[0]:,}" if steps[0] == steps[-1] else f"{steps[0]:,}–{steps[-1]:,}"
    ends = [ENDED[r["ended"]] for r in records]
    counts = collections.Counter(ends)                       # in order of first appearance
    why = (ends[0] if len(counts) == 1
           else ", ".join(f"{count} {e}" for e, count in counts.items()))
    return f"{span} ({why})"


def cells_table(name, sweep, columns=((), None), records=None):
    """The cells of results/<name> (cells; in the order of `sweep`'s models): model, N, D,
    d, mean test accuracy ± 95%, each seed's, the steps, and the experiment's own `columns`:
    (their headers, a function of a cell and its runs by seed that gives their texts).
    `records`, where given, instead of results/<name>'s (frontier.yours_records)."""
    rows = cells(load_records(f"results/{name}") if records is None else records)
    order = model_order(name, sweep)
    rows.sort(key=lambda r: (order.get(r["label"], len(order)), r["label"], r["seq_len"],
                             r["num_kv_pairs"], r["d_model"]))
    headers, texts = columns
    header = ["model", "N", "D", "d", "test accuracy", "seeds", "steps", *headers]
    table = []
    for r in rows:
        half = "" if math.isnan(r["interval"]) else f" ± {r['interval']:.3f}"
        runs = sorted(r["runs"], key=lambda run: run["seed"])
        row = [r["label"], r["seq_len"], r["num_kv_pairs"], r["d_model"],
               f"{r['test_acc']:.3f}{half}", " ".join(acc_text(x["test_acc"]) for x in runs),
               steps_text(runs)]
        table.append(row + (texts(r, runs) if texts else []))
    return markdown(header, table)


def paper_column(cell, runs):
    """Figure 2's value read off the plot at N = 64 for a cell's model and width, if any."""
    paper = figure2_at_64(cell["label"], cell["d_model"])
    return ["" if paper is None else f"{paper:.2f}"]
