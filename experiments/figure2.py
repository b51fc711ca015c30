"""Figure 2 (Section 4): MQAR accuracy against model width d, attention against the gated
convolutions, by sequence length N and key-value pairs D (Arora et al., 2023).

Here: the official Figure 2 configuration and the launches the figure plots, as presets
(--preset=figure2, figure2_plotted); Figure 2's grid and its sweeps; its accuracies read off
the plot; a sweep's table and figure in Figure 2's layout, which Figure 6, the hybrids,
F.2 and the frontier are drawn in too (figure6.py, hybrids.py, f2.py, frontier.py); and
Figure 2 on the paper's budget: the pilot of its learning rates (fig2_pilot), 64 epochs
(fig2_epochs), BaseConv as the figure ran it (fig2_plotted) and its whole N = 64 column so
on a GPU (fig2_plotted_grid), and every learning rate and seed at cpu scale (fig2_lr).
experiments/README.md says what each shows.

Rerun (python -m experiments ...):
  --sweep=fig2 [--scale=paper] [--workers=K]   the figure's grid (records in results/fig2/),
                                               then --table=fig2, --table=fig2:trend and
                                               --plot=fig2 (results/fig2.png, _state, _curves)
  --sweep=NAME, then --table=NAME and --plot=NAME, for fig2_pilot (its table only),
                                               fig2_epochs, fig2_plotted, fig2_lr and
                                               fig2_plotted_grid (--scale=paper)
  --preset=figure2 --mixer=base_conv [--key=value ...]   one official run
                                               (--preset=figure2_plotted: as plotted)
"""
import collections
import math
from pathlib import Path

import torch

from experiments.common import cells, load_records, model_order, sweep_runs
from mixers import mixer_setting
from train import (ENDED, PAPER_FIG2_SOURCE, Config, LanguageModel, acc_text, budget_text,
                   identity, markdown, model_color, plot_curves, pyplot,
                   save_figure, seeds_text, steps_per_epoch, wrapped)
from train import PRESETS as TRAIN_PRESETS, make_config as train_make_config


# ----------------------------------------------------------------------------------------
# the official Figure 2 configuration, one preset away

# Each Figure 2 model of the official sweep (zoology/experiments/paper_configs/
# iclr24_zoology_figure2/configs.py at commit d88d6f5): its layer i at sequence length N,
# as (mixer, options), as the official code picks them by layer index. BaseConv's
# kernel_size list [3, -1, 3, -1] alternates a short and a long filter; the "based" Hybrid
# alternates a short BaseConv and Based.
SHORT_OFFICIAL_BASE_CONV = ("base_conv", dict(kernel_size=3, form="official"))
FIGURE2_MIXERS = {
    "attention": lambda i, N: ("attention", dict(dropout=0.1)),
    "base_conv": lambda i, N: (SHORT_OFFICIAL_BASE_CONV if i % 2 == 0
                               else ("base_conv", dict(form="official"))),
    "hyena": lambda i, N: ("hyena", dict(form="official")),
    "h3": lambda i, N: ("h3", dict(form="official", d_state=N, head_dim=2)),
    "rwkv": lambda i, N: ("rwkv", dict(form="official", layer_idx=i)),
    "based": lambda i, N: (SHORT_OFFICIAL_BASE_CONV if i % 2 == 0
                           else ("based", dict(feature_dim=8))),
    "mamba": lambda i, N: ("mamba", {}),
}


def figure2_batch_size(seq_len):
    """The official sweep's batch size by sequence length: 512 up to N = 128, then halved."""
    return 512 if seq_len <= 128 else 256 if seq_len <= 256 else 128 if seq_len <= 512 else 64


def figure2_values(config):
    """The settings of the official Figure 2 runs (configs.py, zoology/config.py defaults,
    zoology/model.py, zoology/train.py) for config's mixer, seq_len and n_layers.

    Recipe: AdamW with PyTorch's default betas and weight decay 0.1 on every parameter, no
    clipping, no warmup, CosineAnnealingLR(T_max=64) stepped after each of 64 epochs of
    100,000 examples in a fixed order (the official DataLoader does not shuffle; its last
    batch of an epoch is partial), evaluation on 3,000 test examples after every epoch, early
    stop above 0.99. One deviation: the official trainer stops on the test accuracy; here a
    validation split of 3,000 more examples decides (evaluation), and the test split is only
    reported. Model: the official block and init (init="gpt2"), embedding dropout 0.1;
    Mamba runs in the official MambaBlock (RMSNorm pre-norm, no dropout). The sweep's lr is
    one of logspace(-4, -2, 4) (the caller's `lr`), and Figure 2 reports the best of the four.
    """
    batch = figure2_batch_size(config.seq_len)
    epoch = math.ceil(100_000 / batch)                       # steps in one epoch
    values = dict(block="identity_mlp", mlp=False, dropout=0.1, init="gpt2",
                  position_embedding="auto", vocab_size=8192, power_a=0.01, num_train=100_000,
                  num_test=3_000, num_valid=3_000, batch_size=batch, beta2=0.999, weight_decay=0.1,
                  decay_all=True, grad_clip=0.0, warmup_steps=0,
                  max_steps=64 * epoch, schedule="cosine_epochs", shuffle=False,
                  eval_every=epoch, eval_probe=0, target_acc=0.99)
    if config.mixer == "mamba":
        values.update(block="rms_pre_norm", dropout=0.0)
    return values


# Figure 2 as its plotted launches ran it. The runs in the figure are not HEAD's configs
# above: the plotting script (zoology/analysis/d_model.py at fcb7c75, 2023-11-13) takes the
# last test accuracy of each run and the max over the lrs, over seven W&B launches whose ids
# are their start times, each just before or beside the commit whose experiments/d_model.py
# leaves that mixer alone active:
#   attention 2023-10-25-22-20-38, da3ff38 (890786b + launch ids); Hyena 2023-10-26-19-09-31,
#   0a76ef2; RWKV 2023-10-27-04-13-56, d9429b3; BaseConv 2023-10-29-17-31-26, 8486daf;
#   H3 2023-11-12-00-31-44 (N = 128 to 512), 174d6cc, and 2023-11-13-00-31-15 / -00-42-27
#   (N = 64), between 49b1384 and fcb7c75 (uncommitted; the least certain launch).
# What they share where HEAD differs (zoology/train.py, zoology/data/utils.py, model.py):
#   AdamW(model.parameters(), lr): weight decay 0.01, PyTorch's default (written out from
#   15428b3 on), on every parameter; the train DataLoader reshuffles every epoch; `Trainer`
#   is built without early_stopping_metric, so no run stops early; 64 epochs,
#   CosineAnnealingLR(T_max=64) stepped per epoch, as HEAD.
# The block: model.py's TransformerBlock is r + mixer(LN1(r)) then r + state_mixer(LN2(r)).
#   Attention, Hyena, RWKV (before 0f98dfe): the state mixer is model.py's MLP, fc1 d -> 4d,
#   tanh, fc2 4d -> d, with biases, and _init_weights rescales fc2 (as out_proj) to
#   0.02/sqrt(2 n_layers). BaseConv and H3 (0f98dfe until 2f5b63c): TransformerBlock builds
#   the sequence mixer again as the state mixer, with the same layer_idx, so each of the
#   n_layers blocks is two mixer sublayers: BaseConv's n_layers=4 gives 8, kernels
#   [3, 3, L, L, 3, 3, L, L]; H3's n_layers=2 gives 4. Here those are n_layers pre-norm blocks.
# Batch size (d_model.py): 1024 for N <= 256 and 128 at N = 512 (Hyena, RWKV, BaseConv);
#   attention 256 and 128; H3 1024 up to N = 128, 256 at 256, 128 at 512.
# Ours differs where it cannot matter to the number or is said: the init and the order are
# seeded here (attention's to BaseConv's launches seeded neither); the validation split
# (3,000 examples) is scored and decides nothing, as nothing stopped these runs
# (target_acc=1.0: no accuracy exceeds it); RWKV's wkv is computed in float32 (the launch's
# CUDA kernel ran in bfloat16); H3's N = 64 launch may have had weight decay 0.1 (fcb7c75's
# config.py) where 0.01 is taken here, and lrs logspace(-3.3, -2, 4) at N >= 128.
PLOTTED_BATCH = {"attention": (256, 256, 256, 128), "h3": (1024, 1024, 256, 128)}


def plotted_batch_size(mixer, seq_len):
    """The batch size of mixer's launch up to N = 64, 128, 256, and beyond (see above)."""
    sizes = PLOTTED_BATCH.get(mixer, (1024, 1024, 1024, 128))
    return sizes[sum(seq_len > N for N in (64, 128, 256))]


def plotted_recipe(mixer, seq_len):
    """The launches' recipe where it differs from HEAD's (figure2_values): batch, weight
    decay, a new order every epoch, no early stop; 64 epochs of 100,000 examples, evaluated
    after each."""
    batch = plotted_batch_size(mixer, seq_len)
    epoch = math.ceil(100_000 / batch)
    return dict(batch_size=batch, weight_decay=0.01, shuffle=True, target_acc=1.0,
                max_steps=64 * epoch, eval_every=epoch)


# each launch's model where it differs from HEAD's: the block, its depth, the state mixer
PLOTTED_MODELS = {"attention": dict(n_layers=2, mlp=True, mlp_activation="tanh"),
                  "hyena": dict(n_layers=2, mlp=True, mlp_activation="tanh"),
                  "rwkv": dict(n_layers=2, mlp=True, mlp_activation="tanh"),
                  "base_conv": dict(n_layers=8), "h3": dict(n_layers=4)}


def plotted_values(config):
    """The settings of Figure 2's plotted launch of config's mixer (the comment above names
    each commit and file): HEAD's (figure2_values) with that launch's model and recipe."""
    if config.mixer not in PLOTTED_MODELS:
        raise ValueError(f"mixer={config.mixer!r} is not allowed with preset='figure2_plotted':"
                         f" Figure 2 plots launches of {', '.join(PLOTTED_MODELS)}")
    return {**figure2_values(config), "block": "pre_norm", **PLOTTED_MODELS[config.mixer],
            **plotted_recipe(config.mixer, config.seq_len)}


# each sublayer's mixer: the doubled BaseConv's sublayer i is official block i // 2's mixer
# (H3's doubled layers are all alike)
PLOTTED_MIXERS = {**FIGURE2_MIXERS,
                  "base_conv": lambda i, N: FIGURE2_MIXERS["base_conv"](i // 2, N)}

# name -> (the preset's values for a config, the per-layer forms of the mixers it names)
PRESETS = {**TRAIN_PRESETS, "figure2": (figure2_values, FIGURE2_MIXERS),
           "figure2_plotted": (plotted_values, PLOTTED_MIXERS)}


def make_config(preset="cpu", **overrides):
    """A checked Config with the lab's presets: train.make_config given PRESETS. preset=
    "figure2" is the official Figure 2 run of `mixer` (figure2_values; a mixer named in
    FIGURE2_MIXERS becomes its official per-layer form); "figure2_plotted" the run of the
    launch that Figure 2 plots for `mixer` (plotted_values, PLOTTED_MIXERS)."""
    return train_make_config(preset, PRESETS, **overrides)


# ----------------------------------------------------------------------------------------
# Figure 2's grid and its sweeps (common.sweep_runs reads them)

PAPER_LRS = (1e-4, 4.64e-4, 2.15e-3, 1e-2)          # logspace(-4, -2, 4), 3 digits
# Figure 2's grid and its four learning rates, for --scale=paper (on the official recipe)
PAPER_GRID = dict(preset=["figure2"], lr=PAPER_LRS, seed=[0, 1, 2],
                  nd=[(64, 4), (128, 8), (256, 16), (512, 64)], d_model=[64, 128, 256, 512],
                  num_valid=[3000])
FIG2_MODELS = {name: name for name in FIGURE2_MIXERS}
BASE_CONV = "base_conv:kernel_size=3,base_conv"          # the paper form of Figure 2's stack
# c = 512 and 1M fresh examples (8000 steps of 128, none seen twice): experiments/README.md,
# "The paper's experiments", says why
LR_GRID = [3e-4, 1e-3, 3e-3, 1e-2]                  # fig2_lr: the cpu fig2 lr and 3x around it
CPU_FIG2 = dict(vocab_size=[512], lr=[3e-3], seed=[0, 1, 2], num_train=[1_024_000],
                max_steps=[8000], eval_every=[500], num_valid=[1000])
# Figure 2's lower rows: BaseConv with input-dependent filters (Thm 4.5), after a short
# BaseConv as the upper rows' stack has one; mixers.InputDependentConv says what is ours.
# The short BaseConv is the paper's form at both scales, also under --preset=figure2: the
# official code has no input-dependent layer, so there is no official stack to follow.
INPUT_DEPENDENT_MODELS = {
    "programmatic filters": "base_conv:kernel_size=3,input_dependent_conv",
    "autocorrelation filters":
        "base_conv:kernel_size=3,input_dependent_conv:filters=autocorrelation:num_lags=8"}
# Figure 2 at N = 64 on the paper's own budget, on two CPU cores: --preset=figure2 (the
# official forms and recipe, c = 8192, 64 epochs of 100,000 examples, batch 512), BaseConv's
# official short-then-long stack at d = 64 and 128 and attention at d = 64 as the anchor.
# "fig2_pilot" runs the first PILOT_EPOCHS epochs of each at every lr of Figure 2's four
# (the same schedule, cut short by budget_steps); "fig2_epochs" runs each to the end at the
# lr whose pilot scored best on the validation split (FIG2_EPOCHS_LRS, pinned to the
# pilot's records by a test). experiments/README.md, "At the paper's budget".
PILOT_EPOCHS = 3
FIG2_EPOCHS_GRIDS = [dict(models={"base_conv": "base_conv"}, d_model=[64, 128]),
                     dict(models={"attention": "attention"}, d_model=[64])]
FIG2_EPOCHS = dict(preset=["figure2"], nd=[(64, 4)], seed=[0])
# (model, d) -> the lr the pilot chose (pilot_choice of results/fig2_pilot)
FIG2_EPOCHS_LRS = {("base_conv", 64): 1e-2, ("base_conv", 128): 2.15e-3, ("attention", 64): 2.15e-3}
# Figure 2's BaseConv at N = 64 as plotted (--preset=figure2_plotted: 8486daf's model and
# recipe), and which of its settings matter: 16 of the 64 epochs at d = 64 and lr 1e-2 (the
# pilot's choice for HEAD's BaseConv), HEAD's model and recipe swapped one at a time for
# 8486daf's, and the plotted run at 2.15e-3 too. HEAD itself is fig2_epochs' d = 64 run (its
# first 16 epochs). Then the plotted run for all 64 epochs at d = 64 and 128, at the rate the
# 16-epoch runs pick on validation (plotted_choice at d = 64, pinned by a test to the
# committed records), and at d = 64 with a second seed: the launches seeded neither init nor
# data order, so a seed is one of the differences left. experiments/README.md, "As the
# figure was run".
PLOTTED_EPOCHS = 16
FIG2_PLOTTED_LR = 1e-2
PLOTTED_BASE_CONV = dict(block="pre_norm", n_layers=8, mixer=mixer_setting(
    [PLOTTED_MIXERS["base_conv"](i, 64) for i in range(8)]))
FIG2_PLOTTED = dict(nd=[(64, 4)], d_model=[64], seed=[0])
# Figure 2's N = 64 column as its launches ran it, for a GPU (fig2_plotted_grid): BaseConv,
# H3, RWKV, Hyena and attention at the figure's four widths, each at the four rates of
# logspace(-4, -2, 4), seed 0. The launches before H3's seeded nothing; H3's seeded 123
# (set_determinism, from d98f824), which no generator here reproduces. The widths and rates
# are the launches', but for H3's at N = 64: two launches of uncommitted code between
# 49b1384 (logspace(-3.3, -2, 4), N >= 128) and fcb7c75 (logspace(-4, -2, 4) at N = 64,
# d = 64 commented out), so the rates of H3's d = 64 cell are a guess (fcb7c75's). Figure
# 2's own rule takes the best test accuracy of the four rates (plotted_grid_table shows it
# beside the rate chosen on validation).
PLOTTED_GRID = dict(preset=["figure2_plotted"], nd=[(64, 4)], lr=PAPER_LRS, seed=[0])
SWEEPS = {
    "fig2": {
        "paper": dict(models={**FIG2_MODELS, **INPUT_DEPENDENT_MODELS}, **PAPER_GRID),
        # Claim 1 in three parts: the gated convolutions rise with d at N = 32 (d >= N), every
        # gated convolution at d = 32 < N = 64, attention at d = 64 for both N; the lower rows,
        # input-dependent filters, at d = 32 < N = 64
        "cpu": [dict(models={"attention": "attention"}, nd=[(32, 4)], d_model=[32, 64, 128],
                     **CPU_FIG2),
                dict(models={"base_conv": BASE_CONV}, nd=[(32, 4)], d_model=[32, 64, 128, 256],
                     **CPU_FIG2),
                dict(models={"h3": "h3", "hyena": "hyena", "rwkv": "rwkv"}, nd=[(32, 4)],
                     d_model=[32, 128], **CPU_FIG2),
                dict(models={"base_conv": BASE_CONV, "h3": "h3", "hyena": "hyena",
                             "rwkv": "rwkv"}, nd=[(64, 4)], d_model=[32], **CPU_FIG2),
                dict(models={"attention": "attention"}, nd=[(64, 4)], d_model=[64], **CPU_FIG2),
                dict(models=INPUT_DEPENDENT_MODELS, nd=[(64, 4)], d_model=[32], **CPU_FIG2)],
    },
    # learning-rate robustness (Okpekpe and Orvieto, 2025, arXiv 2508.19029): the cpu fig2
    # models at N = 32, d = 128, at four lrs and three seeds; lr 3e-3 is fig2's own grid
    "fig2_lr": {"cpu": dict(models={"attention": "attention", "base_conv": BASE_CONV,
                                    "h3": "h3", "hyena": "hyena", "rwkv": "rwkv"},
                            nd=[(32, 4)], d_model=[128], **{**CPU_FIG2, "lr": LR_GRID})},
    "fig2_pilot": {"cpu": [dict(**grid, **FIG2_EPOCHS, lr=PAPER_LRS,
                                budget_steps=[PILOT_EPOCHS * math.ceil(100_000 / 512)])
                           for grid in FIG2_EPOCHS_GRIDS]},
    "fig2_epochs": {"cpu": [dict(models=grid["models"], **FIG2_EPOCHS, d_model=[d],
                                 lr=[FIG2_EPOCHS_LRS[label, d]])
                            for grid in FIG2_EPOCHS_GRIDS for label in grid["models"]
                            for d in grid["d_model"] if (label, d) in FIG2_EPOCHS_LRS]},
    "fig2_plotted": {"cpu": [
        dict(models={"as plotted (8486daf)": "base_conv"}, preset=["figure2_plotted"],
             lr=[1e-2, 2.15e-3], budget_steps=[PLOTTED_EPOCHS * 98], **FIG2_PLOTTED),
        dict(models={"HEAD, 4 layers": dict(mixer="base_conv", n_layers=4),
                     "8486daf model, HEAD recipe": PLOTTED_BASE_CONV},
             preset=["figure2"], lr=[1e-2], budget_steps=[PLOTTED_EPOCHS * 196], **FIG2_PLOTTED),
        dict(models={"HEAD model, 8486daf recipe": dict(mixer="base_conv",
                                                            **plotted_recipe("base_conv", 64))},
             preset=["figure2"], lr=[1e-2], budget_steps=[PLOTTED_EPOCHS * 98], **FIG2_PLOTTED),
        dict(models={"as plotted (8486daf)": "base_conv"}, preset=["figure2_plotted"],
             lr=[FIG2_PLOTTED_LR], **{**FIG2_PLOTTED, "d_model": [64, 128]}),
        dict(models={"as plotted (8486daf)": "base_conv"}, preset=["figure2_plotted"],
             lr=[FIG2_PLOTTED_LR], **{**FIG2_PLOTTED, "seed": [1]})]},
    "fig2_plotted_grid": {"paper": dict(
        models={m: m for m in ("base_conv", "h3", "rwkv", "hyena", "attention")},
        d_model=PAPER_GRID["d_model"], **PLOTTED_GRID)},
}


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


def figure2_at_64(label, d_model):
    """Figure 2's read-off accuracy at N = 64 for a model label and width, or None: the
    tables' column, the same N = 64 value for a cpu run at N = 32 or 64 (the figures read
    figure2_points, by the run's model, task and (N, D))."""
    values = PAPER_FIG2.get(label, {}).get(64, ())
    return dict(zip(PAPER_GRID["d_model"], values)).get(d_model)


def figure2_model(config):
    """The key of PAPER_FIG2 for the model `config` trains, if it is a model of Figure 2 on
    Figure 2's task, else None: its label is that key, its mixer the stack the fig2 sweep
    trains under that label (cpu scale, or the official forms of --preset=figure2 or
    figure2_plotted), its (N, D) one of Figure 2's (PAPER_GRID) and its α Figure 2's 0.01.
    So the main job's, f2's, hybrids' and the frontier's BaseConv (the paper's
    short-then-long stack) have Figure 2's values; the frontier's "attention" (BaseConv,
    then attention) and Figure 6's runs (α = 0.1) have none."""
    label = config.label
    if (label not in PAPER_FIG2 or (config.seq_len, config.num_kv_pairs) not in PAPER_GRID["nd"]
            or config.power_a != figure2_values(config)["power_a"]):
        return None
    cpu = {name: mixer for grid in SWEEPS["fig2"]["cpu"] for name, mixer in grid["models"].items()}
    official = [make_config(preset=preset, mixer=label, seq_len=config.seq_len,
                            num_kv_pairs=config.num_kv_pairs, n_layers=config.n_layers).mixer
                for preset in ("figure2", "figure2_plotted")]
    return label if config.mixer in (cpu.get(label), *official) else None


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
                       figure2_value, name)


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


def state_size(config):
    """Numbers of recurrent state per example after seq_len tokens, over every layer; None
    where a layer does not say (a mixer of your own need not define state_size)."""
    with torch.random.fork_rng(devices=[]):
        model = LanguageModel(config)
    sizes = [getattr(b.mixer, "state_size", None) for b in model.blocks]
    return None if None in sizes else sum(size(config.seq_len) for size in sizes)


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
    is unknown (state_size: None) is left out of the state figure, its title says so.
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
                       label=label)
                if paper:                            # black: a cross on its own colour hides
                    ax.scatter([i], [paper[0][1]], marker="x", s=30, color="black", zorder=3)
                continue
            ax.errorbar([dodge(v, i, len(here_labels)) for v in x], y, yerr=err,
                        marker=markers[label], ms=3.5, capsize=2, color=colors[label],
                        label=label)
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
    notes = ("\n(dashed: the share of test queries within the model's reach, its bound)"
             if bound else "") + (f"\n({PAPER_NOTE})" if drew_paper else "")
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
            points = sorted(((s, r["test_acc"], figure2_value(config_of(r))) for r, s in here),
                            key=lambda p: p[:2])
            ax.plot([dodge(s, i, len(here_labels)) for s, _, _ in points],
                    [a for _, a, _ in points], marker=markers[label], ms=3.5,
                    color=colors[label], label=label)
            paper = [(s, p) for s, _, p in points if p is not None]
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
                         f"{seeds_text(records)}{paper}{missing}", fig.get_figwidth()),
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
    why = ends[0] if len(counts) == 1 else ", ".join(f"{n} {e}" for e, n in counts.items())
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


def fig2_table(name="fig2"):
    """--table=fig2: its cells (cells_table), each beside Figure 2's value at N = 64."""
    return cells_table(name, SWEEPS[name], (["the paper (N = 64)"], paper_column))


def plot_fig2(name="fig2"):
    """--plot=fig2: plot_sweep, a panel per (N, D), width along each."""
    return plot_sweep(name, SWEEPS[name], (("seq_len", "num_kv_pairs"), "d_model"))


# ----------------------------------------------------------------------------------------
# Figure 2 at the paper's budget: the pilot's choice and the 64-epoch runs, epoch by epoch

PILOT_TIE = 0.01                               # validation accuracies this close tie (pilot_choice)
EPOCHS_SHOWN = (1, 2, 4, 8, 16, 32, 48, 64)    # the epochs epochs_table shows


def epoch_scores(record, key):
    """{epoch: score} of a run that evaluates after every epoch (--preset=figure2)."""
    c = Config(**record["config"])
    return {e["step"] // steps_per_epoch(c): e[key] for e in record["history"] if key in e}


def pilot_choice(records):
    """{(label, d): lr}: the pilot's learning rate for each model and width, read off the
    validation split only. The best validation accuracy at the pilot's end; where other
    rates come within PILOT_TIE of it (a plateau, such as BaseConv's 0.25 of one value in D
    = 4, where accuracy cannot tell rates apart), the lowest validation loss among them."""
    by_cell = {}
    for r in records:
        by_cell.setdefault((r["config"]["label"], r["config"]["d_model"]), []).append(r)
    choice = {}
    for cell, runs in by_cell.items():
        best = max(r["valid_acc"] for r in runs)
        tied = [r for r in runs if r["valid_acc"] >= best - PILOT_TIE]
        choice[cell] = min(tied, key=lambda r: r["valid_loss"])["config"]["lr"]
    return choice


def pilot_table(name="fig2_pilot"):
    """The pilot (fig2_pilot): one row per run, its validation accuracy after each epoch and
    its final validation loss, and which lr each (model, d) chose (pilot_choice)."""
    records = load_records(f"results/{name}")
    chosen = pilot_choice(records)
    key = lambda r: (model_order(name, SWEEPS.get(name, {})).get(r["config"]["label"], 0),
                     r["config"]["d_model"], r["config"]["lr"])
    rows = [[r["config"]["label"], r["config"]["d_model"], f"{r['config']['lr']:g}",
             " ".join(acc_text(v) for v in epoch_scores(r, "valid_acc").values()),
             acc_text(r["valid_acc"]), f"{r['valid_loss']:.3f}", acc_text(r["test_acc"]),
             ENDED[r["ended"]],
             "✓" if chosen[r["config"]["label"], r["config"]["d_model"]] == r["config"]["lr"]
             else "", f"{r['train_time_s']:.0f}"] for r in sorted(records, key=key)]
    return markdown(["model", "d", "lr", "valid accuracy after each epoch", "valid acc",
                     "valid loss", "test acc", "ended", "chosen", "training s"], rows)


def epochs_table(name="fig2_epochs"):
    """The 64-epoch runs (fig2_epochs): test accuracy after some epochs (EPOCHS_SHOWN), at the
    end, Figure 2's value (N = 64), and the time."""
    records = load_records(f"results/{name}")
    key = lambda r: (model_order(name, SWEEPS.get(name, {})).get(r["config"]["label"], 0),
                     r["config"]["d_model"])
    rows = []
    for r in sorted(records, key=key):
        c, test = r["config"], epoch_scores(r, "test_acc")
        paper = figure2_at_64(c["label"], c["d_model"])
        rows.append([c["label"], c["d_model"], f"{c['lr']:g}", f"{max(test):g}", ENDED[r["ended"]],
                     " ".join(acc_text(test[e]) if e in test else "–" for e in EPOCHS_SHOWN),
                     acc_text(r["test_acc"]), acc_text(r["valid_acc"]),
                     "–" if paper is None else f"{paper:.2f}",
                     f"{r['train_time_s'] / 3600:.1f}"])
    return markdown(["model", "d", "lr", "epochs", "ended", "test accuracy after epoch "
                     + ", ".join(map(str, EPOCHS_SHOWN)), "test acc", "valid acc",
                     "Figure 2", "training h"], rows)


def plot_epochs(name="fig2_epochs"):
    """results/<name>.png: test accuracy after every epoch against training examples seen, one
    line per run in its model's colour (model_color), one line style and marker per width,
    Figure 2's value for the run's cell (figure2_value: N = 64, after its 64 epochs) dotted
    in the run's colour and named with its width. Returns the path."""
    plt = pyplot()
    records = plotted_records(name)
    fig, ax = plt.subplots(figsize=(7, 4))
    widths = sorted({r["config"]["d_model"] for r in records})
    for r in sorted(records, key=lambda r: (r["config"]["label"], r["config"]["d_model"])):
        c, test = Config(**r["config"]), epoch_scores(r, "test_acc")
        i, color = widths.index(c.d_model), model_color(c.label)
        ax.plot([e * c.num_train / 1e6 for e in test], list(test.values()), color=color,
                ls=("-", "--", "-.")[i % 3], marker=MARKERS[i % len(MARKERS)], ms=2.5,
                label=f"{c.label}, d = {c.d_model}, lr {c.lr:g}")
        paper = figure2_value(c)
        if paper is not None:
            ax.axhline(paper, color=color, ls=":", lw=1.2)     # named on the left: the
            ax.annotate(f"Figure 2, {c.label} d = {c.d_model}: {paper:.2f}",   # curves end
                        (1.2, paper), fontsize=7, color=color, va="bottom")   # on the right
    epochs = sorted({r["config"]["max_steps"] // steps_per_epoch(Config(**r["config"]))
                     for r in records})
    c = records[0]["config"]
    ax.set(xlabel=f"training examples seen (millions; {c['num_train'] / 1e6:g}M per epoch)",
           ylabel="test accuracy", ylim=(0, 1.02), xlim=(0, 64 * 0.1 * 1.01))
    ax.set_title(wrapped(f"Figure 2 at N = {c['seq_len']}, D = {c['num_kv_pairs']} on the "
                         f"paper's budget (--preset=figure2): {budget_text(records)} "
                         f"({', '.join(map(str, epochs))} epochs of {c['num_train']:,}), "
                         f"{seeds_text(records)}\ndotted: the paper's Figure 2 (read off the "
                         "plot, ± 0.03)", 6.5), fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, f"results/{name}.png")


# Figure 2's BaseConv as plotted (fig2_plotted): 16 epochs of each swap, then the 64 epochs

# BaseConv at N = 64 in the official repository's Figure 2 (assets/figure2.png, added in
# 66f4918), read off its pixels (±0.01) at d = 64 and 128
REPO_FIG2_BASE_CONV = {64: 0.70, 128: 0.94}
HEAD_RUNS = "fig2_epochs"                    # HEAD's recipe (--preset=figure2), 64 epochs


def plotted_runs(name="fig2_plotted"):
    """The records of the fig2_plotted table: its own, then HEAD's BaseConv runs of
    fig2_epochs (labelled "HEAD"), whose first 16 epochs are the swaps' reference."""
    head = [{**r, "config": {**r["config"], "label": "HEAD"}}
            for r in load_records(f"results/{HEAD_RUNS}") if r["config"]["label"] == "base_conv"]
    return load_records(f"results/{name}") + head


def plotted_choice(records):
    """{d: lr}: for the 64-epoch runs as plotted, the lr of the 16-epoch runs ("as plotted",
    stopped by budget_steps) that the pilot's rule picks on validation (pilot_choice: the
    best accuracy, and within PILOT_TIE of it the least loss)."""
    runs = [r for r in records if r["config"]["preset"] == "figure2_plotted"
            and r["ended"] == "budget_steps"]
    return {d: lr for (_, d), lr in pilot_choice(runs).items()}


def plotted_table(name="fig2_plotted"):
    """One row per run (plotted_runs): its model, seed and recipe, test accuracy after the epochs
    of EPOCHS_SHOWN, validation accuracy after epoch 16 (which picks the 64-epoch runs' lr:
    plotted_choice), and the repository figure's value for its width."""
    records, key = plotted_runs(name), lambda r: (r["config"]["d_model"],
                                                   r["config"]["label"] != "HEAD", r["seed"])
    chosen = plotted_choice(records)
    rows = []
    for r in sorted(records, key=key):
        c, test = Config(**r["config"]), epoch_scores(r, "test_acc")
        valid = epoch_scores(r, "valid_acc")
        picked = (c.preset == "figure2_plotted" and r["ended"] == "budget_steps"
                  and chosen.get(c.d_model) == c.lr)
        rows.append([c.label, c.d_model, f"{c.lr:g}", c.seed, c.n_layers, f"{c.batch_size:,}",
                     f"{c.weight_decay:g}", "yes" if c.shuffle else "no",
                     f"{max(test)}" + (" (budget)" if r["ended"] == "budget_steps" else ""),
                     " ".join(acc_text(test[e]) if e in test else "–" for e in EPOCHS_SHOWN),
                     acc_text(valid[PLOTTED_EPOCHS]) + (" ✓" if picked else ""),
                     f"{REPO_FIG2_BASE_CONV.get(c.d_model, float('nan')):.2f}",
                     f"{r['train_time_s'] / 3600:.1f}"])
    return markdown(["run", "d", "lr", "seed", "sublayers", "batch", "weight decay", "reshuffled",
                     "epochs", "test accuracy after epoch " + ", ".join(map(str, EPOCHS_SHOWN)),
                     f"valid acc after epoch {PLOTTED_EPOCHS}", "Figure 2 (repository)",
                     "training h"], rows)


def plot_plotted(name="fig2_plotted"):
    """results/<name>.png: test accuracy after every epoch against training examples seen,
    one line per run (plotted_runs), a panel per width with its legend below it, the
    repository figure's value for BaseConv at that width dotted. Returns the path."""
    plt = pyplot()
    records = plotted_runs(name)
    widths = sorted({r["config"]["d_model"] for r in records})
    labels = sorted({r["config"]["label"] for r in records}, key=lambda l: (l != "HEAD", l))
    others = [r for r in records if r["seed"]]                  # drawn dotted
    fig, axes = plt.subplots(1, len(widths), figsize=(5 * len(widths), 5.5), squeeze=False)
    for ax, d in zip(axes[0], widths):
        for r in sorted(records, key=lambda r: (labels.index(r["config"]["label"]),
                                                r["config"]["lr"])):
            c, test = Config(**r["config"]), epoch_scores(r, "test_acc")
            if c.d_model != d:
                continue
            i = labels.index(c.label)
            cut = r["ended"] == "budget_steps"        # the first epochs of a 64-epoch run
            ax.plot([e * c.num_train / 1e6 for e in test], list(test.values()),
                    color=f"C{i}", ls=":" if c.seed else ("-", "--")[c.lr < 1e-2], ms=2.5,
                    lw=(1.5, 3)[cut], alpha=(1, 0.5)[cut], marker=MARKERS[i % len(MARKERS)],
                    label=f"{c.label}, lr {c.lr:g}" + (f", seed {c.seed}" if c.seed else "")
                    + (f", {len(test)} epochs" if cut else ""))
        paper = REPO_FIG2_BASE_CONV.get(d)
        if paper is not None:
            ax.axhline(paper, color="k", ls=":", lw=1.2)
            ax.annotate(f"Figure 2 (repository): {paper:.2f}", (0.1, paper), fontsize=7,
                        va="bottom")
        ax.set(xlabel="training examples seen (millions; 0.1M per epoch)",
               ylabel="test accuracy", ylim=(0, 1.02), xlim=(0, 6.4 * 1.01),
               title=f"BaseConv, N = 64, D = 4, d = {d}")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.suptitle(wrapped("Figure 2's BaseConv as plotted (8486daf: 8 sublayers, batch 1024, "
                         "weight decay 0.01, reshuffled) and HEAD's recipe, one setting "
                         "swapped at a time; seed 0" + (f", dotted: {seeds_text(others)}"
                                                        if others else "") + ", c = 8192",
                         5 * len(widths)), fontsize=9)
    return save_figure(fig, f"results/{name}.png")


def plotted_grid_table(name="fig2_plotted_grid"):
    """--table=fig2_plotted_grid: its cells (cells_table, the rate chosen on validation), the
    best test accuracy of the cell's rates (Figure 2's rule: the plotting script takes the
    max over the lrs) and Figure 2's value at N = 64."""
    best = lambda row: max(r["test_acc"] for runs in row["by_lr"].values() for r in runs)
    columns = lambda row, runs: [acc_text(best(row)), *paper_column(row, runs)]
    return cells_table(name, SWEEPS[name], (["best test acc of the rates", "the paper (N = 64)"],
                                            columns))


# ----------------------------------------------------------------------------------------
# learning-rate robustness: every (lr, seed) run of a model, not the best lr's mean

PASS = 0.9                                   # a run "solves" the cell above this test accuracy


def lr_table(name="fig2_lr"):
    """One row per model: the test accuracy of every seed at every lr, and the share of
    (lr, seed) runs above PASS."""
    records = load_records(f"results/{name}")
    order = model_order(name, SWEEPS.get(name, {}))
    by_model = {}
    for r in records:
        by_model.setdefault(r["config"]["label"], []).append(r)
    lrs = sorted({r["config"]["lr"] for r in records})
    rows = []
    for label in sorted(by_model, key=lambda l: order.get(l, len(order))):
        runs = by_model[label]
        at = lambda lr: sorted((r for r in runs if r["config"]["lr"] == lr),
                               key=lambda r: r["seed"])
        passed = sum(r["test_acc"] > PASS for r in runs)
        rows.append([label, *(" ".join(acc_text(r["test_acc"]) for r in at(lr)) for lr in lrs),
                     f"{passed}/{len(runs)}"])
    return markdown(["model", *(f"lr {lr:g}" for lr in lrs), f"runs above {PASS}"], rows)


def plot_lr(name="fig2_lr"):
    """results/<name>.png: test accuracy against the learning rate, one panel per model in
    its colour, one line style and marker per seed, the seeds dodged apart along the lr
    axis (dodge) so that equal accuracies do not sit on one spot, PASS dotted. The title
    says the scale, the budget (at most: a run stops at its target) and how many of the
    sweep's runs have finished. Returns the path."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    records = plotted_records(name)
    order = model_order(name, SWEEPS.get(name, {}))
    labels = sorted({r["config"]["label"] for r in records}, key=lambda l: order.get(l, 0))
    seeds = sorted({r["seed"] for r in records})
    scale = sweep_scale(name, SWEEPS.get(name, {}), records)
    grid = ([o for _, o in sweep_runs(name, SWEEPS[name], scale)] if scale
            else [r["config"] for r in records])
    lrs = sorted({o["lr"] for o in grid})                 # the sweep's, also those unfinished
    done = f"; {len(records)} of its {len(grid)} runs" if len(records) < len(grid) else ""
    styles = {seed: (("-", "--", ":", "-.")[i % 4], MARKERS[i % len(MARKERS)])
              for i, seed in enumerate(seeds)}
    fig, axes = plt.subplots(1, len(labels), figsize=(max(5, 2.6 * len(labels)), 3.2),
                             sharey=True, squeeze=False)
    for ax, label in zip(axes[0], labels):
        runs = [r for r in records if r["config"]["label"] == label]
        for seed in seeds:
            points = sorted((r["config"]["lr"], r["test_acc"]) for r in runs if r["seed"] == seed)
            if points:
                ls, marker = styles[seed]
                ax.plot([dodge(lr, seeds.index(seed), len(seeds), 0.15) for lr, _ in points],
                        [a for _, a in points], ls=ls, marker=marker, ms=3.5,
                        color=model_color(label), label=f"seed {seed}")
        ax.axhline(PASS, color="grey", ls=":", lw=1)
        ax.set(xscale="log", title=label, xlabel="learning rate", ylim=(0, 1.02),
               xlim=(lrs[0] / 1.6, lrs[-1] * 1.6))
        ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs], fontsize=7)
        ax.set_xticks([], minor=True)
    c = records[0]["config"]
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend([Line2D([], [], color="0.3", ls=ls, marker=marker, ms=3.5)
                        for ls, marker in styles.values()], [f"seed {s}" for s in seeds],
                       fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(wrapped(f"{name} at {scale_text(scale)}: MQAR N = {c['seq_len']}, "
                         f"D = {c['num_kv_pairs']}, d = {c['d_model']}, {budget_text(records)} "
                         f"(a run stops at validation accuracy {c['target_acc']}){done}\n"
                         f"each seed's test accuracy, the seeds moved apart along the lr "
                         f"axis; dotted: {PASS}", fig.get_figwidth()), fontsize=9)
    return save_figure(fig, f"results/{name}.png")


FOLDER_TABLES = {"fig2_pilot": pilot_table, "fig2_epochs": epochs_table,    # --table=NAME
                "fig2_lr": lr_table, "fig2_plotted": plotted_table}
