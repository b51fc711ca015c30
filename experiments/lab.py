"""The lab: the paper's experiments on the model and loop of train.py (Arora et al., 2023).

What train.py runs once, this runs as the paper does: the Figure 2 presets (HEAD's official
configuration, and the launches the figure plots), the sweeps as data (Figure 2, Figure 6
of appendix F.1, Section 5's hybrids, appendix F.2, the recall frontier, every mixer, the
paper-budget and learning-rate runs), worker processes and Slurm, the records' statistics,
tables and figures, the language-model experiment of Section 3.1 and appendix G, and the
training-step benchmark. It imports train.py, mixers.py and mqar.py; they never import it.

Usage (python -m experiments ...; experiments/README.md says what each experiment shows):
  --preset=figure2 --mixer=base_conv [--key=value ...]   one run with a preset's settings
                                      (figure2: HEAD's official Figure 2 run; figure2_plotted:
                                      the launch the figure plots), --seeds=COUNT as train.py
  --sweep=NAME [--scale=cpu|paper]    a sweep of SWEEPS (main, every_mixer, frontier, fig2,
                                      fig6, hybrids, fig2_lr, fig2_pilot, fig2_epochs,
                                      fig2_plotted, f2); records in results/<sweep>/, finished
                                      runs skipped, unfinished ones continued; --workers=K
                                      runs K at once; --launcher=slurm submits them through
                                      submitit (submit_sweep); --dry_run prints their command
                                      lines instead (xargs -P, ...)
  --plot=NAME                         the table of its cells and its figures (results/NAME.png)
  --table=NAME                        the Markdown table of results/NAME, as the READMEs show it
                                      (a sweep, a folder of runs or an LM experiment)
  --lm [--corpus=PATH]                Section 3.1 on real text: tiny language models, each at
                                      the rate of least validation loss, two seeds, their
                                      held-out perplexity sliced by AR hits (results/lm.json,
                                      lm.png, lm_curves.png, lm_appendix_g.png);
                                      --ar_threshold=COUNT; --out_dir=results/NAME
  --hf=NAME_OR_PATH                   appendix G on a Hugging Face causal LM (optional package
                                      transformers); --samples=COUNT sequences per P
  --bench [--key=value ...]           training-step time vs logits at every position
  (no arguments)                      train.py's main job
"""
import collections
import dataclasses
import inspect
import itertools
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from mixers import check_choice, check_positive, mixer_class
from mqar import (ar_gap_share, ar_hits, bigram_counts, bigram_recall_sequences, corpus_streams,
                  multiquery_ar, query_key_positions, scaled_threshold, sliced_perplexity)
from train import (ENDED, MAIN_MODELS, MAIN_STEPS, NOT_IDENTITY, PAPER_FIG2_SOURCE, Config,
                   LanguageModel, _parse_value, _positive_flag, acc_text, budget_text,
                   finished_record, full_logits_loss, identity, labelled_loss, lm_data,
                   main_job, make_optimizer, markdown, mixer_setting, model_color, mqar_split,
                   parse_arguments, plot_curves, pyplot, record_path, resolve_device,
                   run_command, run_name, runs_table, save_figure, seeds_text,
                   steps_per_epoch, train, wrapped)
from train import PRESETS as TRAIN_PRESETS, make_config as train_make_config

REPO = Path(__file__).resolve().parent.parent        # where `python -m experiments` runs from


# ----------------------------------------------------------------------------------------
# the benchmark: labelled-only projection vs logits at every position

def bench(config):
    c = config
    device = resolve_device(c.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(c.seed)
        model = LanguageModel(c).to(device)
    optimizer = make_optimizer(model, c)
    inputs, labels = (x.to(device) for x in multiquery_ar(
        c.batch_size, c.vocab_size, c.seq_len, c.num_kv_pairs, c.power_a, seed=c.seed))

    def step_seconds(loss_fn):
        if device.type != "cpu":
            getattr(torch, device.type).synchronize()          # torch.cuda or torch.mps
        t0 = time.perf_counter()
        loss = loss_fn(model, inputs, labels)
        loss = loss[0] if isinstance(loss, tuple) else loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type != "cpu":
            getattr(torch, device.type).synchronize()          # torch.cuda or torch.mps
        return time.perf_counter() - t0

    # alternate the two, so that a busy moment of the machine hits both alike
    times = {labelled_loss: [], full_logits_loss: []}
    for i in range(12):                                # the first two rounds warm up
        for fn in times:
            seconds = step_seconds(fn)
            if i >= 2:
                times[fn].append(seconds)
    ours, full = (sorted(t)[len(t) // 2] for t in times.values())
    print(f"training step, {c.mixer}, B={c.batch_size}, N={c.seq_len}, D={c.num_kv_pairs}, "
          f"d={c.d_model}, c={c.vocab_size}, {device} (median of 10 steps each, alternating)")
    print(f"  logits at the {c.num_kv_pairs} labelled positions per example: {ours * 1e3:8.1f} ms")
    print(f"  logits at all {c.seq_len} positions (official harness): {full * 1e3:8.1f} ms")
    print(f"  speedup {full / ours:.1f}x")


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
# the paper's sweeps: one run per grid point, one JSON file per run, resumable

# Each sweep as {scale: grid or list of grids}. A grid lists its models as label -> mixer
# setting, "nd" the (N, D) pairs, and the values of every other key it sets; its runs are
# the product of them all. "paper" is the paper's grid (on the official recipe,
# --preset=figure2, where the paper used it); "cpu" a reduced one for two CPU cores, every
# reduction said in experiments/README.md ("The paper's experiments").
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
WINDOW_MODELS = {"attention": "attention", "sliding window 8": "sliding_window:window=9",
                 "sliding window 32": "sliding_window:window=33",
                 "blocked 32": "blocked_attention:block_size=32"}


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


F2_MODELS = {"retnet": "retnet", "sliding window 32": "sliding_window:window=33",
             "blocked 32": "blocked_attention:block_size=32",
             "base_conv": BASE_CONV, "h3": "h3", "hyena": "hyena"}
# every mixer at the CPU defaults for 1,000 steps at most; a model is its mixer setting or a
# dict of the settings it changes
EVERY_MIXER_MODELS = {
    "attention": "attention", "sliding window (W = 32)": "sliding_window",
    "blocked attention (b = 32)": "blocked_attention", "short conv": "short_conv",
    "long conv": "long_conv", "BaseConv (paper form, long filter)": "base_conv",
    "BaseConv (paper form, short then long)": BASE_CONV,
    "BaseConv (official forms, Figure 2's stack)":
        "base_conv:kernel_size=3:form=official,base_conv:form=official",
    "Hyena": "hyena", "H3": "h3", "RWKV": "rwkv", "RetNet": "retnet", "Based": "based",
    "Mamba": "mamba", "selective attention (learned)": "selective_attention",
    "selective attention with learned positions": dict(mixer="selective_attention",
                                                       position_embedding="learned"),
    "the Based stack": "base_conv:kernel_size=3,based",
    "BaseConv + programmatic selective attention":
        "base_conv,selective_attention:selection=programmatic",
    # the recall mixers since the paper
    "GLA": "gla", "Mamba-2": "mamba2", "DeltaNet": "deltanet", "Gated DeltaNet": "gated_deltanet",
    "RWKV-7": "rwkv7"}
# the recall frontier: each mixer after a short BaseConv layer, as the official code trains
# attention, Based, GLA, DeltaNet, Gated DeltaNet and RWKV-7 (zoology/experiments/
# models_repo.py at d88d6f5: a per-layer hybrid of BaseConv with kernel 3 and the mixer; its
# Mamba and Mamba-2 run alone); here every mixer, Mamba's and BaseConv alike, so that only
# the second layer differs
FRONTIER_MODELS = {name: f"base_conv:kernel_size=3,{name}"
                   for name in ("attention", "base_conv", "based", "mamba", "gla", "mamba2",
                                "deltanet", "gated_deltanet", "rwkv7")}
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
# committed records). experiments/README.md, "As the figure was run".
PLOTTED_EPOCHS = 16
FIG2_PLOTTED_LR = 1e-2
PLOTTED_BASE_CONV = dict(block="pre_norm", n_layers=8, mixer=mixer_setting(
    [PLOTTED_MIXERS["base_conv"](i, 64) for i in range(8)]))
FIG2_PLOTTED = dict(nd=[(64, 4)], d_model=[64], seed=[0])
SWEEPS = {
    # the main job: at one small width attention solves MQAR, a gated convolution does not
    "main": {"cpu": dict(models=MAIN_MODELS, max_steps=[MAIN_STEPS])},
    "every_mixer": {"cpu": dict(models=EVERY_MIXER_MODELS, max_steps=[1000])},
    # accuracy against recurrent state size (results/frontier_state.png), the picture of
    # Figure 2's right panel and of the Based paper, with the mixers of 2024-25 on it
    "frontier": {
        "paper": dict(models=FRONTIER_MODELS, **PAPER_GRID),
        # D = 16 at N = 64 fills half the context with pairs: where a small state runs out
        "cpu": dict(models=FRONTIER_MODELS, nd=[(64, 4), (64, 16)], d_model=[32, 64],
                    lr=[3e-3], seed=[0], num_train=[256_000], max_steps=[2000], num_valid=[1000]),
    },
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
    # appendix F.1: windows 8 and 32 in the official counting (it attends to W + 1 tokens)
    "fig6": {
        "paper": dict(models=WINDOW_MODELS, preset=["figure2"], seq_len=[256], power_a=[0.1],
                      num_kv_pairs=[8, 16, 32, 64], d_model=[64, 128, 256], lr=PAPER_LRS,
                      seed=[0, 1, 2], num_valid=[3000]),
        # D <= 4: attention itself stays on its 1/D plateau at D = 8 on this budget
        # (experiments/README.md, "Figure 6 at cpu scale"). At N = 64 two layers of window 33
        # reach every key; at
        # N = 128 neither window does (reach_bound), so there the claim can fail
        "cpu": [dict(models=WINDOW_MODELS, seq_len=[N], power_a=[0.1], num_kv_pairs=[1, 2, 4],
                     d_model=[64], vocab_size=[512], lr=[3e-3], seed=[0, 1, 2],
                     num_train=[512_000], max_steps=[4000], num_valid=[1000])
                for N in (64, 128)],
    },
    # Section 5: a BaseConv model with one selective-attention layer, against both pure ones
    "hybrids": {
        "paper": [dict(models=hybrid_models(N, D), nd=[(N, D)], d_model=[64], lr=PAPER_LRS,
                       seed=[0, 1, 2], max_steps=[8000], num_valid=[1000])
                  for N, D in [(64, 4), (128, 8), (256, 16)]],
        "cpu": [dict(models=models, nd=[(64, 4)], d_model=[64], lr=[3e-3], seed=[0, 1, 2],
                     max_steps=[2000], num_valid=[1000])
                for models in (hybrid_models(64, 4), hybrid_middle_models(64, 4))],
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
             lr=[FIG2_PLOTTED_LR], **{**FIG2_PLOTTED, "d_model": [64, 128]})]},
    # appendix F.2: RetNet and sparse attention next to the gated convolutions
    "f2": {
        "paper": dict(models=F2_MODELS, **PAPER_GRID),
        "cpu": dict(models=F2_MODELS, nd=[(64, 4)], d_model=[64], vocab_size=[512], lr=[3e-3],
                    seed=[0, 1, 2], num_train=[256_000], max_steps=[2000], num_valid=[1000]),
    },
}


def sweep_runs(name, scale):
    """The runs of sweep `name` at `scale`, as (label, Config overrides) pairs."""
    check_choice("sweep", name, tuple(SWEEPS))
    check_choice("scale", scale, tuple(SWEEPS[name]))
    grids, runs = SWEEPS[name][scale], []
    for grid in grids if isinstance(grids, list) else [grids]:       # a list: grids in turn
        grid = dict(grid)
        models, nd = grid.pop("models"), grid.pop("nd", [(None, None)])
        for label, model in models.items():
            model = model if isinstance(model, dict) else dict(mixer=model)
            for (N, D), *values in itertools.product(nd, *grid.values()):
                overrides = dict(label=label, **model, out_dir=f"results/{name}",
                                 progress=False, **dict(zip(grid, values)))
                if N is not None:
                    overrides.update(seq_len=N, num_kv_pairs=D)
                runs.append((label, overrides))
    return runs


def run_sweep(name, scale, dry_run=False, resume=True, workers=1):
    """Run every run of the sweep that has no finished record yet (a killed sweep resumes
    where it stopped, each unfinished run from its checkpoint; resume=False trains the finished
    runs again too), with a bar over runs: in this process, or in `workers` processes at once
    (run_in_processes); with dry_run, print one command line per run instead."""
    runs = sweep_runs(name, scale)
    if dry_run:
        for _, overrides in runs:                  # the command line of each run
            print("python -m experiments " + " ".join(shlex.quote(f"--{k}={v}")
                                                for k, v in overrides.items()))
        return []

    def finished():
        """Finished runs by what they ran (a record from before a new Config key reads as
        having its default); read before every run, so that runs other workers finish
        (--dry_run lines) are skipped too. A foreign file stops the sweep before any run."""
        return {identity(Config(**r["config"])): r for r in load_records(f"results/{name}")
                if r["ended"] != "interrupted"} if resume else {}

    finished()
    if workers > 1:
        todo = [(label, o) for label, o in runs if identity(make_config(**o)) not in finished()]
        run_in_processes([o for _, o in todo], workers, f"{name} ({scale})", len(runs))
        done = finished()
        return [done[identity(make_config(**o))] for _, o in runs]
    records = []
    for label, overrides in tqdm(runs, desc=f"{name} ({scale})", unit="run"):
        config = make_config(**{**overrides, "progress": True})
        records.append(finished().get(identity(config)) or train(config))
    return records


# what a worker process runs: python ONE_RUN --key=value ... (one run, the lab's presets)
ONE_RUN = ["-m", "experiments"]


class SweepFailed(RuntimeError):
    """Runs of run_in_processes failed; their logs say why."""


def run_in_processes(runs, workers, desc, total=None):
    """Run `runs` (Config overrides) as `python -m experiments --key=value ...` processes (from
    this repository), `workers` at a time, each with an equal share of this process's
    threads (OMP_NUM_THREADS); the
    bar counts finished runs out of `total` (the whole sweep). A run's output goes to a .log
    beside its record, kept only if it fails. SIGINT (Ctrl-C) or SIGTERM to this process is
    passed on as SIGINT to every running run, which checkpoints and stops (train); no run
    starts after it, and once they have stopped KeyboardInterrupt is raised here. A run
    stopped by a SIGINT of its own stops the sweep alike. A run that fails is named with
    its log, the others go on, and SweepFailed is raised at the end."""
    total = total or len(runs)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, torch.get_num_threads() // workers)),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    pending, running, failed, asked = list(runs), {}, [], []
    bar = tqdm(total=total, initial=total - len(runs), desc=desc, unit="run")
    # the signals are noted here and handled in the loop (so that none falls between
    # starting a run and holding it), also where a shell started this in the background
    # (which ignores SIGINT); the runs have sessions of their own, so only this hears them
    main = threading.current_thread() is threading.main_thread()
    previous = ({s: signal.signal(s, lambda signum, frame: asked.append(signum))
                 for s in (signal.SIGINT, signal.SIGTERM)} if main else {})
    forwarded = 0
    try:
        while running or (pending and not asked):
            while pending and not asked and len(running) < workers:
                overrides = pending.pop(0)
                log = record_path(make_config(**overrides)).with_suffix(".log")
                log.parent.mkdir(parents=True, exist_ok=True)
                args = [f"--{k}={v}" for k, v in overrides.items()]
                with log.open("w") as out:
                    running[subprocess.Popen([sys.executable, *ONE_RUN, *args], stdout=out,
                                             stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True)] = log
            time.sleep(0.1)
            for _ in range(forwarded, len(asked)):     # each signal passed on once: the
                for proc in running:                   # second stops the runs at once
                    proc.send_signal(signal.SIGINT)
            forwarded = len(asked)
            for proc in [p for p in running if p.poll() is not None]:
                log = running.pop(proc)
                bar.update(proc.returncode != 130)    # a stopped run is not done
                if proc.returncode in (0, 130):   # done, or stopped as asked: no failure
                    log.unlink()
                else:
                    failed.append(log)
                    tqdm.write(f"a run failed (exit code {proc.returncode}); its output: {log}")
                if proc.returncode == 130 and not asked:    # stopped by a SIGINT of its own:
                    asked.append(signal.SIGINT)             # stop the others too
    finally:
        bar.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if asked:
        raise KeyboardInterrupt
    if failed:
        raise SweepFailed(f"{len(failed)} of {len(runs)} runs failed; their output: "
                          + ", ".join(map(str, failed)))


SUBMITIT = "submitit==1.5.4"                      # the optional package, the version tested


class SweepJob:
    """One run of a sweep as a submitit job (submit_sweep): trains it unless its record has
    finished, and returns the record's path. On a time-out or a preemption Slurm signals the
    job (USR2) and submitit calls `checkpoint`, which requeues the same run; it continues
    from its own last checkpoint (train)."""

    def __call__(self, overrides):
        config = make_config(**overrides)
        if finished_record(config):                  # a job run twice trains nothing
            print(f"already run: {record_path(config)}")
        else:
            train(config)
        return str(record_path(config))

    def checkpoint(self, overrides):
        import submitit
        return submitit.helpers.DelayedSubmission(self, overrides)


def submit_sweep(name, scale, cluster="slurm", partition="", time_min=60, gpus_per_run=0,
                 cpus_per_run=1, parallel=0):
    """Submit the unfinished runs of a sweep as one job array through submitit (optional:
    pip install submitit==1.5.4), one run per job; return the jobs.

    cluster="slurm": sbatch with `partition` ("" for the cluster's default), `time_min`
    minutes and `gpus_per_run`, `cpus_per_run` per job, at most `parallel` jobs at once (0:
    no cap). cluster="local": submitit's LocalExecutor, every job a local process at once
    (for tests). The jobs write the same records to results/NAME, from the directory this
    is called in, and import this lab; a job that times out is requeued (by submitit,
    up to 3 times) and continues from its checkpoint; submitting again submits only the
    runs that have not finished, and those continue from their checkpoints too. submitit's
    logs go to results/NAME/submitit/.
    """
    check_choice("cluster", cluster, ("slurm", "local"))
    for key, value, low in (("time_min", time_min, 1), ("cpus_per_run", cpus_per_run, 1),
                            ("gpus_per_run", gpus_per_run, 0), ("parallel", parallel, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"--{key}={value!r} is not allowed: it must be an integer >= {low}")
    try:
        import submitit
    except ImportError:
        raise ValueError(f"--launcher={cluster} needs the optional package submitit: "
                         f"pip install {SUBMITIT}") from None
    here = str(REPO)                # where the jobs import experiments.lab (SweepJob) from
    todo = [o for _, o in sweep_runs(name, scale) if not finished_record(make_config(**o))]
    if not todo:
        return []
    executor = submitit.AutoExecutor(folder=f"results/{name}/submitit/%j", cluster=cluster)
    executor.update_parameters(
        timeout_min=time_min, gpus_per_node=gpus_per_run or None, cpus_per_task=cpus_per_run,
        slurm_array_parallelism=parallel or len(todo),
        slurm_setup=[f"export PYTHONPATH={shlex.quote(here)}${{PYTHONPATH:+:$PYTHONPATH}}"],
        **({"slurm_partition": partition} if partition else {}))
    previous = os.environ.get("PYTHONPATH")           # the local jobs inherit it
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, previous]))
    # local jobs inherit SIGINT's disposition too, and submitit cancels one with SIGINT: from a
    # shell's background job (`nohup ... &`), which starts with SIGINT ignored, no job could
    # be cancelled, so the jobs start with Python's own handler
    interrupt = (signal.signal(signal.SIGINT, signal.default_int_handler)
                 if threading.current_thread() is threading.main_thread() else None)
    try:
        return executor.map_array(SweepJob(), todo)
    finally:
        if interrupt is not None:     # None: not the main thread, or a handler set outside Python
            signal.signal(signal.SIGINT, interrupt)
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous


# ----------------------------------------------------------------------------------------
# a sweep's records, and the statistics of its cells: means, intervals, width trends

def load_records(folder):
    """Every run record in `folder` (none if it does not exist), one per run. A file that is
    not a record of train.py, two files of one run, and a record whose config is not the run
    its file name says (edited by hand, or named by another version of train.py) each raise
    a ValueError naming the files."""
    records, paths, configs = {}, {}, {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            config = Config(**record["config"])
            float(record["test_acc"]), record["history"], record["ended"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a run record of train.py ({type(e).__name__}: "
                             f"{e}); move it out of {folder}") from None
        run = identity(config)
        if run in paths:
            raise ValueError(f"{paths[run]} and {path} are records of the same run; keep one "
                             f"of them in {folder}")
        paths[run], records[run], configs[run] = path, record, config
    for run, path in paths.items():
        name = run_name(configs[run])
        if path.name != f"{name}.json":
            raise ValueError(f"{path} holds the record of the run {name}, not of the run its "
                             "file name says: a record edited by hand or named by another "
                             f"version of train.py; move it out of {folder}")
    return list(records.values())


def t_quantile(p, dof):
    """The p-quantile (p > 0.5) of Student's t with `dof` degrees of freedom: the t where
    P(|T| < t) = 2p − 1, by bisection on that probability, the density's integral from 0 to t
    by Simpson's rule on 2,000 intervals (error far below the 4th decimal)."""
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    density = lambda x: math.exp(log_c - (dof + 1) / 2 * math.log1p(x * x / dof))
    def mass(t, n=2000):                               # P(|T| < t)
        h = t / n
        odd = sum(density((2 * i - 1) * h) for i in range(1, n // 2 + 1))
        even = sum(density(2 * i * h) for i in range(1, n // 2))
        return 2 * h / 3 * (density(0) + 4 * odd + 2 * even + density(t))
    low, high = 0.0, 1.0
    while mass(high) < 2 * p - 1:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if mass(mid) < 2 * p - 1 else (low, mid)
    return (low + high) / 2


def mean_interval(values):
    """(mean, half-width of its 95% t-interval); the half-width is nan for one value."""
    n, mean = len(values), sum(values) / len(values)
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile(0.975, n - 1) * sd / math.sqrt(n)


CELL_KEYS = ("mixer", "seq_len", "num_kv_pairs", "d_model")


def cells(records):
    """One row per cell (mixer, N, D, d), with its label: the learning rate with the best
    mean validation accuracy over its seeds, and over that lr's seeds the mean test accuracy
    and its 95% interval. A cell's runs at one lr must differ in their seed only (so seeds
    count runs, never files), and a cell of several lrs needs validation scores to choose."""
    by_cell = {}
    for r in records:
        cell = tuple(r["config"][k] for k in CELL_KEYS)
        by_cell.setdefault(cell, {}).setdefault(r["config"]["lr"], []).append(r)
    rows = []
    for cell, by_lr in sorted(by_cell.items(), key=lambda item: item[0]):
        for lr, runs in by_lr.items():
            configs = [dataclasses.asdict(Config(**r["config"])) for r in runs]
            differ = [k for k in configs[0] if k not in (*NOT_IDENTITY, "seed")
                      and len({json.dumps(c[k]) for c in configs}) > 1]
            if differ:
                raise ValueError(f"the runs of cell {dict(zip(CELL_KEYS, cell))} at lr {lr:g} "
                                 f"differ in {', '.join(differ)}, not only in their seed: "
                                 "keep one kind of run per folder")
        if len(by_lr) > 1 and any("valid_acc" not in r for runs in by_lr.values() for r in runs):
            raise ValueError(f"cell {dict(zip(CELL_KEYS, cell))} has runs at lrs "
                             f"{', '.join(f'{lr:g}' for lr in by_lr)} and a run without a "
                             "validation score: the lr is chosen on validation only")
        score = lambda lr: sum(r.get("valid_acc", math.nan) for r in by_lr[lr]) / len(by_lr[lr])
        lr = max(by_lr, key=score)
        mean, half = mean_interval([r["test_acc"] for r in by_lr[lr]])
        label = by_lr[lr][0]["config"].get("label") or cell[0]
        rows.append(dict(zip(CELL_KEYS, cell), label=label, lr=lr, seeds=len(by_lr[lr]),
                         test_acc=mean, interval=half, valid_acc=score(lr), runs=by_lr[lr]))
    return rows


def width_trend(points, permutations=20_000):
    """How strong "accuracy rises with width" is over runs `points` ((d, accuracy) pairs,
    every seed its own point): the correlation of log2 d with accuracy, and the one-sided
    p-value of a permutation test (the accuracies shuffled over the runs, numpy seed 0):
    the share of shuffles whose correlation is at least the observed one."""
    x, y = np.log2([d for d, _ in points]), np.array([a for _, a in points])
    corr = lambda acc: np.corrcoef(x, acc)[0, 1]
    observed = corr(y)
    rng = np.random.default_rng(0)
    shuffled = np.array([corr(rng.permutation(y)) for _ in range(permutations)])
    return observed, ((shuffled >= observed - 1e-12).sum() + 1) / (permutations + 1)


def trend_table(name):
    """`--table=NAME:trend`: for each model and N of sweep `name` with several widths at its
    lr, the width_trend over every run (each seed a point)."""
    rows = cells(load_records(f"results/{name}"))
    order = model_order(name)
    groups = {}
    for r in rows:
        groups.setdefault((r["label"], r["seq_len"], r["num_kv_pairs"]), []).append(r)
    table = []
    for (label, N, D), cell_rows in sorted(groups.items(),
                                           key=lambda g: (order.get(g[0][0], 0), g[0][1:])):
        if len(cell_rows) < 2:
            continue
        points = [(r["d_model"], run["test_acc"]) for r in cell_rows for run in r["runs"]]
        corr, p = width_trend(points)
        table.append([label, N, D, " ".join(str(r["d_model"]) for r in cell_rows),
                      len(points), f"{corr:.2f}", "< 0.0001" if p < 1e-4 else f"{p:.4f}"])
    return markdown(["model", "N", "D", "widths d", "runs", "correlation of log d and "
                     "accuracy", "one-sided p (permutation)"], table)


# ----------------------------------------------------------------------------------------
# figures: the paper's layout, drawn from the records in results/<sweep>/

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
SYMBOLS = {"seq_len": "N", "num_kv_pairs": "D", "d_model": "d", "vocab_size": "c"}
# per sweep: the keys that make a panel, and the x axis
PLOT_AXES = {"fig2": (("seq_len", "num_kv_pairs"), "d_model"),
             "fig6": (("seq_len", "d_model"), "num_kv_pairs"),
             "hybrids": (("d_model",), "seq_len"), "f2": (("seq_len", "num_kv_pairs"), "d_model"),
             "frontier": (("seq_len", "num_kv_pairs"), "d_model")}


def figure2_at_64(label, d_model):
    """Figure 2's read-off accuracy at N = 64 for a model label and width, or None: the
    tables' column, the same N = 64 value for a cpu run at N = 32 or 64 (the figures read
    figure2_points, by the run's model, task and (N, D))."""
    values = PAPER_FIG2.get(label, {}).get(64, ())
    return dict(zip(PAPER_GRID["d_model"], values)).get(d_model)


def figure2_model(config):
    """The key of PAPER_FIG2 for the model `config` trains, if it is a model of Figure 2 on
    Figure 2's task, else None: its label is that key, its mixer the stack the fig2 sweep
    trains under that label (cpu scale, or --preset=figure2's official forms), its (N, D)
    one of Figure 2's (PAPER_GRID) and its α Figure 2's 0.01. So the main job's, f2's,
    hybrids' and the frontier's BaseConv (the paper's short-then-long stack) have Figure 2's
    values; the frontier's "attention" (BaseConv, then attention) and Figure 6's runs
    (α = 0.1) have none."""
    label = config.label
    if (label not in PAPER_FIG2 or (config.seq_len, config.num_kv_pairs) not in PAPER_GRID["nd"]
            or config.power_a != figure2_values(config)["power_a"]):
        return None
    cpu = {name: mixer for grid in SWEEPS["fig2"]["cpu"] for name, mixer in grid["models"].items()}
    official = make_config(preset="figure2", mixer=label, seq_len=config.seq_len,
                           num_kv_pairs=config.num_kv_pairs, n_layers=config.n_layers).mixer
    return label if config.mixer in (cpu.get(label), official) else None


def figure2_points(config):
    """Figure 2's (d, accuracy) points (PAPER_FIG2, read off the plot) for the model and
    (N, D) of `config` (figure2_model); [] where Figure 2 has none."""
    label = figure2_model(config)
    return list(zip(PAPER_GRID["d_model"], PAPER_FIG2[label][config.seq_len])) if label else []


def figure2_value(config):
    """Figure 2's accuracy for the cell (model, N, D, d) of `config`, or None."""
    return dict(figure2_points(config)).get(config.d_model)


def curves_figure(records, path, name=None):
    """train.plot_curves of `records` (runs of sweep `name`, by default the folder their
    out_dir names), with its scale (sweep_scale) and Figure 2's values (figure2_value)."""
    name = name or ", ".join(sorted({Path(r["config"]["out_dir"]).name for r in records}))
    return plot_curves(records, path, scale_text(sweep_scale(name, records)), figure2_value,
                       name)


PAPER_NOTE = f"x: {PAPER_FIG2_SOURCE}"         # the crosses of the accuracy and state figures


def sweep_scale(name, records):
    """The scale of SWEEPS[name] ("cpu" or "paper") whose runs `records` are; "" when no
    scale of it lists them all (a record copied from another sweep's folder counts as the
    run it is: out_dir is not part of a run's identity)."""
    runs = {identity(Config(**r["config"])) for r in records}
    grids = [(scale, sweep_runs(name, scale)) for scale in SWEEPS.get(name, {})]
    # the smaller grid first: building the paper grid's configs (1,728 for fig2) takes seconds
    for scale, grid in sorted(grids, key=lambda pair: len(pair[1])):
        if runs <= {identity(make_config(**o)) for _, o in grid}:
            return scale
    return ""


def scale_text(scale):
    """"cpu scale" or "paper scale" for a scale from sweep_scale, or what else the runs are."""
    return f"{scale} scale" if scale else "runs of no scale of its sweep"


def reachable(config, q, k):
    """Whether the layers of `config` can bring the key at position k to the query at
    position q (tensors, as mqar.query_key_positions gives them): the queries a model can
    answer at all, so their fraction bounds its MQAR accuracy (Figure 6's windows).

    A row of sliding_window:window=w reads itself and the w - 1 rows before it, and a
    causal filter of kernel_size K (short_conv, a short base_conv) the K - 1 before it, so a
    stack of such layers reaches the sum of those back. Blocked attention never moves
    anything across a block, in any number of layers. Any other layer (attention, a long
    filter, a recurrence) reads the whole prefix, and so does a stack with one.
    """
    option = lambda name, kwargs, key: kwargs.get(
        key, inspect.signature(mixer_class(name, kwargs.get("form", "paper")))
        .parameters[key].default)
    reach, blocks = 0, set()
    for name, kwargs in config.layers:
        if name == "sliding_window":
            reach += option(name, kwargs, "window") - 1
        elif name == "short_conv" or (name == "base_conv" and kwargs.get("kernel_size")):
            reach += option(name, kwargs, "kernel_size") - 1
        elif name == "blocked_attention":
            blocks.add(option(name, kwargs, "block_size"))
        else:
            return torch.ones_like(q, dtype=torch.bool)
    if not blocks:
        return q - k <= reach
    if reach or len(blocks) > 1:
        raise ValueError(f"mixer={config.mixer!r} is not allowed: the reach of blocked "
                         "attention beside other windows or block sizes is not computed")
    b = blocks.pop()
    return q // b == k // b


def reach_bound(config):
    """The share of the test split's queries that a model of `config` can reach at all
    (reachable): the best test accuracy it can have, but for guesses."""
    q, k = query_key_positions(*mqar_split(config, "test"))
    return reachable(config, q, k).double().mean().item()


def cell_reach_bound(cell):
    """reach_bound of a cell (a row of cells), averaged over its runs' test splits."""
    bounds = [reach_bound(Config(**run["config"])) for run in cell["runs"]]
    return sum(bounds) / len(bounds)


def state_size(config):
    """Numbers of recurrent state per example after seq_len tokens, over every layer."""
    with torch.random.fork_rng(devices=[]):
        model = LanguageModel(config)
    return sum(b.mixer.state_size(config.seq_len) for b in model.blocks)


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


def plot_sweep(name):
    """results/<name>.png: test accuracy (mean and 95% interval over seeds, the lr chosen on
    validation) against the x key, one panel per panel key, the models of a panel dodged
    apart (dodge), or side by side as bars where the sweep has one cell per model, the
    paper's values (figure2_points) as crosses; results/<name>_state.png: accuracy against
    recurrent state size, the same panels, one line per model, dodged alike;
    results/<name>_curves.png: the first seed's learning curves (plot_curves). Every model
    in its colour (model_color) and marker (model_markers), the titles the scale and budget.
    Returns (the cells' rows, the paths written)."""
    plt = pyplot()
    import matplotlib.ticker
    check_choice("plot", name, tuple(PLOT_AXES))
    records = plotted_records(name)
    rows = cells(records)
    panel_keys, x_key = PLOT_AXES[name]
    panel_of = lambda r: tuple(r[k] for k in panel_keys)
    title = lambda panel: ", ".join(f"{SYMBOLS[k]} = {v}" for k, v in zip(panel_keys, panel))
    panels = sorted({panel_of(r) for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    colors = {label: model_color(label) for label in labels}
    markers = model_markers(labels)
    config_of = lambda row: Config(**row["runs"][0]["config"])
    in_panel = lambda panel: [label for label in labels if any(
        r["label"] == label and panel_of(r) == panel for r in rows)]
    heading, budget = f"{name} at {scale_text(sweep_scale(name, records))}", budget_text(records)
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
            if name == "fig6":                   # the best a model can do: its reach bound
                bound = [cell_reach_bound(r) for r in here]
                if min(bound) < 1:
                    ax.plot([dodge(v, i, len(here_labels)) for v in x], bound, ls="--", lw=1,
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
    notes = {"fig6": "\n(dashed: the share of test queries within the model's reach, its bound)"
             }.get(name, "") + (f"\n({PAPER_NOTE})" if drew_paper else "")
    width = fig.get_figwidth()
    fig.suptitle(wrapped(f"{heading}: {budget}\n{seeds}{notes}", width),
                 fontsize=9)
    axes[0][0].set(ylabel="test accuracy", ylim=(0, 1.02))
    if not single:                               # one legend for every panel's models
        handles = {lab: h for ax in axes[0] for h, lab in zip(*ax.get_legend_handles_labels())}
        axes[0][-1].legend([handles[label] for label in labels], labels, fontsize=7,
                           loc="upper left", bbox_to_anchor=(1.01, 1))
    save_figure(fig, f"results/{name}.png")
    # the same panels, against the state each model carries: one line per model through its
    # widths (Figure 2's right-hand picture), dodged as above: models of one state (the
    # selections of hybrids) would sit on one spot; the legend beside them widens the figure
    # by its labels' length beyond some 40 characters (7-point text, about 0.06 inch each)
    legend_extra = max(0.0, 0.06 * max(map(len, labels)) - 2.5)
    fig, axes = plt.subplots(1, len(panels), squeeze=False, sharey=True,
                             figsize=(max(5.5, 4 * len(panels)) + legend_extra, 3.8))
    for ax, panel in zip(axes[0], panels):
        here_labels = in_panel(panel)
        for i, label in enumerate(here_labels):
            here = [r for r in rows if r["label"] == label and panel_of(r) == panel]
            points = sorted(((state_size(config_of(r)), r["test_acc"],
                             figure2_value(config_of(r))) for r in here), key=lambda p: p[:2])
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
    axes[0][-1].legend([handles[label] for label in labels], labels, fontsize=7,
                       loc="upper left", bbox_to_anchor=(1.01, 1))   # one for every panel
    axes[0][0].set(ylabel="test accuracy", ylim=(0, 1.02))
    paper = f"\n({PAPER_NOTE})" if drew_paper else ""
    fig.suptitle(wrapped(f"{heading}: accuracy against recurrent state size ({SYMBOLS[x_key]} "
                         f"along each line)\n{budget}; {'mean over ' if several else ''}"
                         f"{seeds_text(records)}{paper}", fig.get_figwidth()),
                 fontsize=9)
    save_figure(fig, f"results/{name}_state.png")
    first_seed = min(r["seed"] for r in records)
    curves_figure([r for r in records if r["seed"] == first_seed], f"results/{name}_curves.png",
                  name)
    return rows, [f"results/{name}.png", f"results/{name}_state.png", f"results/{name}_curves.png"]


def steps_text(records):
    """The steps the runs took and why they ended, e.g. "650–800 (target)"."""
    steps = sorted(r["steps"] for r in records)
    span = f"{steps[0]:,}" if steps[0] == steps[-1] else f"{steps[0]:,}–{steps[-1]:,}"
    ends = [ENDED[r["ended"]] for r in records]
    counts = collections.Counter(ends)                       # in order of first appearance
    why = ends[0] if len(counts) == 1 else ", ".join(f"{n} {e}" for e, n in counts.items())
    return f"{span} ({why})"


def model_order(name):
    """The labels of sweep `name`'s models in the order SWEEPS lists them (tables follow it)."""
    order = {}
    for scale in SWEEPS.get(name, {}):
        for label, _ in sweep_runs(name, scale):
            order.setdefault(label, len(order))
    return order


def cells_table(name):
    """The cells of results/<name> (cells): model, N, D, d, mean test accuracy ± 95%, each
    seed's, the steps; for fig2 also Figure 2's value read off the plot at N = 64; for
    hybrids the rows the selection attends at (selected_rows, mean over the seeds)."""
    rows = cells(load_records(f"results/{name}"))
    order = model_order(name)
    rows.sort(key=lambda r: (order.get(r["label"], len(order)), r["label"], r["seq_len"],
                             r["num_kv_pairs"], r["d_model"]))
    header = ["model", "N", "D", "d", "test accuracy", "seeds", "steps", *{
        "fig2": ["the paper (N = 64)"], "fig6": ["reachable"],
        "hybrids": ["rows attended", "of them queries", "queries attended"]}.get(name, [])]
    table = []
    for r in rows:
        half = "" if math.isnan(r["interval"]) else f" ± {r['interval']:.3f}"
        runs = sorted(r["runs"], key=lambda run: run["seed"])
        row = [r["label"], r["seq_len"], r["num_kv_pairs"], r["d_model"],
               f"{r['test_acc']:.3f}{half}", " ".join(acc_text(x["test_acc"]) for x in runs),
               steps_text(runs)]
        if name == "fig2":
            paper = figure2_at_64(r["label"], r["d_model"])
            row.append("" if paper is None else f"{paper:.2f}")
        if name == "hybrids":
            stats = [run["selection"][0] for run in runs if "selection" in run]
            mean = lambda key: sum(s[key] for s in stats) / len(stats)
            row += ([f"{mean('rows'):.1f}", f"{mean('queries'):.2f}", f"{mean('coverage'):.2f}"]
                    if stats else ["–", "–", "–"])
        if name == "fig6":
            row.append(f"{cell_reach_bound(r):.3f}")
        table.append(row)
    return markdown(header, table)


def lm_tables(s):
    """The four tables of an LM experiment (run_lm_experiment's summary `s`): each (model,
    seed)'s sliced perplexities next to the paper's Table 1; the validation loss of each
    model at each rate (the first seed), and the rate chosen; the AR perplexity by the
    threshold of an AR hit; and appendix G's AR perplexity by P."""
    name = lambda label: LM_LABELS.get(label, label)
    number = lambda x, digits: "–" if x is None else f"{x:.{digits}f}"     # None: NaN in JSON
    reference = {r["seed"]: r["ppl"] for r in s["rows"] if r["label"] == "attention"}
    sliced = markdown(
        ["model", "seed", "lr", "params", "steps", "training s", "final training loss",
         "valid loss", "ppl", "AR ppl", "other ppl", "AR tokens", "gap due to AR",
         "the paper (Table 1: ppl / AR / other)"],
        [[name(r["label"]), str(r["seed"]), f"{r['lr']:g}", f"{r['n_params']:,}",
          f"{r['steps']:,}", f"{r['train_time_s']:.0f}", f"{r['final_loss']:.2f}",
          number(r["valid_loss"], 3), f"{r['ppl']:.2f}", f"{r['ppl_ar']:.2f}",
          f"{r['ppl_other']:.2f}", f"{r['ar_tokens']}/{r['tokens']}",
          gap_share_text(r["ar_share"], r["ppl"], reference.get(r["seed"], math.inf)),
          " / ".join(f"{v:.2f}" for v in PAPER_TABLE1.get(r["label"], ()))]
         for r in s["rows"]])
    chosen = {r["label"]: r["lr"] for r in s["rows"]}
    rates = markdown(["model", *(f"valid loss, lr {lr:g}" for lr in s["lrs"]), "chosen lr"],
                     [[name(label), *(number(v, 3) for v in losses), f"{chosen[label]:g}"]
                      for label, losses in s["lr_valid_loss"].items()])
    thresholds = markdown(
        ["model", "seed", *(f"{t['threshold']:,} ({t['ar_tokens']:,} tokens)"
                            for t in s["thresholds"])],
        [[name(r["label"]), str(r["seed"]), *(f"{v:.1f}" for v in r["ppl_ar_by_threshold"])]
         for r in s["rows"]])
    pairs = [g["num_pairs"] for g in s["rows"][0]["appendix_g"]]
    appendix = markdown(["AR perplexity", "seed", *(f"P = {p}" for p in pairs)],
                        [[name(r["label"]), str(r["seed"]),
                          *(f"{g['ppl_ar']:,.0f}" for g in r["appendix_g"])] for r in s["rows"]])
    return {"": sliced, "lr": rates, "thresholds": thresholds, "appendix_g": appendix}


# the folders whose runs make one table each (not sweeps), and whether it shows the curves
RUN_TABLES = {"main": False, "every_mixer": False, "seeds": False, "figure2_cpu": True,
              "fig2_budget": True, "fig6_budget": True}


def markdown_table(name):
    """`--table=NAME`: the README's table of results/NAME. A sweep's cells (fig2, fig6,
    hybrids, f2), a folder's runs (RUN_TABLES), or an LM experiment's part: lm, lm:lr,
    lm:thresholds, lm:appendix_g (and likewise for an LM experiment in another folder)."""
    folder, _, part = name.partition(":")
    if folder in PLOT_AXES:
        check_choice("table part", part, ("", "trend"))
        return trend_table(folder) if part == "trend" else cells_table(folder)
    if folder in FOLDER_TABLES:
        return FOLDER_TABLES[folder](folder)
    if folder in RUN_TABLES:
        return runs_table(load_records(f"results/{folder}"), model_order(folder),
                          RUN_TABLES[folder])
    if lm_outputs(f"results/{folder}")[0].exists():
        tables = lm_tables(json.loads(lm_outputs(f"results/{folder}")[0].read_text()))
        check_choice("table part", part, tuple(tables))
        return tables[part]
    raise ValueError(f"--table={name!r} is not allowed: choose a sweep ({', '.join(PLOT_AXES)}), "
                     f"a folder of runs ({', '.join([*RUN_TABLES, *FOLDER_TABLES])}) or an LM "
                     "experiment with "
                     "its summary in results/ (lm, lm:lr, lm:thresholds, lm:appendix_g)")


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
    key = lambda r: (model_order(name).get(r["config"]["label"], 0), r["config"]["d_model"],
                     r["config"]["lr"])
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
    key = lambda r: (model_order(name).get(r["config"]["label"], 0), r["config"]["d_model"])
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
    """One row per run (plotted_runs): its model and recipe, test accuracy after the epochs
    of EPOCHS_SHOWN, validation accuracy after epoch 16 (which picks the 64-epoch runs' lr:
    plotted_choice), and the repository figure's value for its width."""
    records, key = plotted_runs(name), lambda r: (r["config"]["d_model"],
                                                   r["config"]["label"] != "HEAD")
    chosen = plotted_choice(records)
    rows = []
    for r in sorted(records, key=key):
        c, test = Config(**r["config"]), epoch_scores(r, "test_acc")
        valid = epoch_scores(r, "valid_acc")
        picked = (c.preset == "figure2_plotted" and r["ended"] == "budget_steps"
                  and chosen.get(c.d_model) == c.lr)
        rows.append([c.label, c.d_model, f"{c.lr:g}", c.n_layers, f"{c.batch_size:,}",
                     f"{c.weight_decay:g}", "yes" if c.shuffle else "no",
                     f"{max(test)}" + (" (budget)" if r["ended"] == "budget_steps" else ""),
                     " ".join(acc_text(test[e]) if e in test else "–" for e in EPOCHS_SHOWN),
                     acc_text(valid[PLOTTED_EPOCHS]) + (" ✓" if picked else ""),
                     f"{REPO_FIG2_BASE_CONV.get(c.d_model, float('nan')):.2f}",
                     f"{r['train_time_s'] / 3600:.1f}"])
    return markdown(["run", "d", "lr", "sublayers", "batch", "weight decay", "reshuffled",
                     "epochs", "test accuracy after epoch " + ", ".join(map(str, EPOCHS_SHOWN)),
                     f"valid acc after epoch {PLOTTED_EPOCHS}", "Figure 2 (repository)",
                     "training h"], rows)


def plot_plotted(name="fig2_plotted"):
    """results/<name>.png: test accuracy after every epoch against training examples seen,
    one line per run (plotted_runs), a panel per width, the repository figure's value for
    BaseConv at that width dotted. Returns the path."""
    plt = pyplot()
    records = plotted_runs(name)
    widths = sorted({r["config"]["d_model"] for r in records})
    labels = sorted({r["config"]["label"] for r in records}, key=lambda l: (l != "HEAD", l))
    fig, axes = plt.subplots(1, len(widths), figsize=(5 * len(widths), 4), squeeze=False)
    for ax, d in zip(axes[0], widths):
        for r in sorted(records, key=lambda r: (labels.index(r["config"]["label"]),
                                                r["config"]["lr"])):
            c, test = Config(**r["config"]), epoch_scores(r, "test_acc")
            if c.d_model != d:
                continue
            i = labels.index(c.label)
            ax.plot([e * c.num_train / 1e6 for e in test], list(test.values()),
                    color=f"C{i}", ls=("-", "--")[c.lr < 1e-2], ms=2.5,
                    marker=MARKERS[i % len(MARKERS)], label=f"{c.label}, lr {c.lr:g}")
        paper = REPO_FIG2_BASE_CONV.get(d)
        if paper is not None:
            ax.axhline(paper, color="k", ls=":", lw=1.2)
            ax.annotate(f"Figure 2 (repository): {paper:.2f}", (0.1, paper), fontsize=7,
                        va="bottom")
        ax.set(xlabel="training examples seen (millions; 0.1M per epoch)",
               ylabel="test accuracy", ylim=(0, 1.02), xlim=(0, 6.4 * 1.01),
               title=f"BaseConv, N = 64, D = 4, d = {d}")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(wrapped("Figure 2's BaseConv as plotted (8486daf: 8 sublayers, batch 1024, "
                         "weight decay 0.01, reshuffled) and HEAD's recipe, one setting "
                         "swapped at a time; seed 0, c = 8192", 5 * len(widths)), fontsize=9)
    return save_figure(fig, f"results/{name}.png")


# ----------------------------------------------------------------------------------------
# learning-rate robustness: every (lr, seed) run of a model, not the best lr's mean

PASS = 0.9                                   # a run "solves" the cell above this test accuracy


def lr_table(name="fig2_lr"):
    """One row per model: the test accuracy of every seed at every lr, and the share of
    (lr, seed) runs above PASS."""
    records = load_records(f"results/{name}")
    order = model_order(name)
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
    order = model_order(name)
    labels = sorted({r["config"]["label"] for r in records}, key=lambda l: order.get(l, 0))
    seeds = sorted({r["seed"] for r in records})
    scale = sweep_scale(name, records)
    grid = [o for _, o in sweep_runs(name, scale)] if scale else [r["config"] for r in records]
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


# ----------------------------------------------------------------------------------------
# the recall gap on real text (Section 3.1): tiny language models, their loss sliced by AR hits

# Table 1 of the paper (the Pile, 10B tokens): perplexity overall, on AR hits, on the others
PAPER_TABLE1 = {"attention": (11.01, 2.16, 12.45), "hyena": (11.60, 5.00, 12.28),
                "rwkv": (11.64, 5.70, 12.29), "h3": (12.06, 6.75, 12.60),
                "long_conv": (16.98, 25.62, 16.46)}
LM_MODELS = {"attention": "attention:rotary=true",
             "attention_short_conv": "attention:rotary=true:short_conv=3",
             "base_conv": BASE_CONV, "hyena": "hyena", "h3": "h3", "rwkv": "rwkv"}
LM_LABELS = {"attention": "attention", "attention_short_conv": "attention + short conv",
             "base_conv": "BaseConv", "hyena": "Hyena", "h3": "H3", "rwkv": "RWKV"}
# one recipe for every model, so that only the mixer differs: the same width and depth and
# the Llama block around each mixer (RMSNorm, a SwiGLU MLP; the paper's attention baseline
# follows the Llama recipe, Section 3.1), no learned positions (attention turns q and k by
# rotary positions), a budget of minutes per model on two cores (experiments/README.md, "The
# recall gap on real text"). The learning rate is each model's own: LM_LRS, chosen on validation.
LM_RECIPE = dict(task="lm", vocab_size=4096, seq_len=128, d_model=64, n_layers=4, mlp=True,
                 block="rms_pre_norm", position_embedding="none", batch_size=32,
                 num_train=25_600, num_test=500, num_valid=500, max_steps=800, eval_every=200,
                 eval_probe=0, target_acc=1.0, save_model=True, out_dir="results/lm")
LM_LRS = (1e-3, 3e-3, 1e-2)        # each model's rate: the least validation loss of these
LM_SEEDS = (0, 1)                  # the first chooses the rate, every one trains at it
APPENDIX_G_PAIRS_OURS = (2, 4, 8, 16, 32)        # P for the LMs of --lm (4P <= seq_len)


@torch.no_grad()
def token_nll(model, inputs, labels, batch_size=None):
    """Per-token negative log-likelihood (natural log) of `labels`, (B, T) float64 numpy."""
    batch_size = batch_size or max(1, 2 ** 14 // inputs.shape[1])
    model.eval()
    out = []
    for i in range(0, len(inputs), batch_size):
        logits = model.logits(model(inputs[i:i + batch_size]))               # (b, T, c)
        out.append(F.cross_entropy(logits.transpose(1, 2), labels[i:i + batch_size],
                                   reduction="none").double())
    model.train()
    return torch.cat(out).cpu().numpy()


def trained_model(config):
    """The model of `config`, trained (train) unless its record and weights exist and the
    record says it finished, then loaded: a killed experiment resumes at the model it was
    training. Returns (model, record)."""
    path, record = record_path(config), finished_record(config)
    if record is None or not path.with_suffix(".pt").exists():
        record = train(config)
    with torch.random.fork_rng(devices=[]):
        model = LanguageModel(config)
    model.load_state_dict(torch.load(path.with_suffix(".pt"), map_location="cpu"))
    return model, record


def run_lm_experiment(overrides=None, threshold=None, g_samples=1000):
    """Section 3.1 on a corpus: LM_MODELS with LM_RECIPE (and `overrides`, Config keys).

    1. Every model trains at every rate of LM_LRS with the first seed of LM_SEEDS; its rate
       is the one of least validation loss (the validation split: held-out contexts after
       the test ones; the test split decides nothing).
    2. Every model trains with the other seeds at its rate.
    3. Each (model, seed) scores every token of the held-out test contexts, and its
       perplexity is sliced as Section 3.1 does: on AR hits (mqar.ar_hits; threshold None:
       the paper's 1,250 scaled to the training tokens) and on the other tokens, with the
       share of its gap to attention (of the same seed) due to the AR hits; then appendix G
       on it (g_samples sequences per P).
    An `lr` or `seed` among the overrides fixes it (no choice; one seed). Finished runs are
    loaded, not trained again: a killed experiment resumes at the run it was in. Writes
    lm_outputs(out_dir), by default results/lm.json (the summary this returns) and
    results/lm.png, lm_curves.png and lm_appendix_g.png.
    """
    settings = {**LM_RECIPE, **(overrides or {})}
    lrs = (settings.pop("lr"),) if "lr" in settings else LM_LRS
    seeds = (settings.pop("seed"),) if "seed" in settings else LM_SEEDS
    if len(lrs) > 1 and settings["num_valid"] == 0:
        raise ValueError(f"num_valid=0 is not allowed while the experiment chooses among "
                         f"{len(lrs)} learning rates: the choice reads the validation loss; "
                         "give num_valid > 0, or one --lr")

    def config(label, lr, seed):          # a stack of mixers repeats over the layers
        stack = itertools.islice(itertools.cycle(LM_MODELS[label].split(",")),
                                 settings["n_layers"])
        return make_config(**dict(settings, label=label, mixer=",".join(stack), lr=lr, seed=seed))

    valid_loss = {}
    for label, lr in tqdm([(label, lr) for label in LM_MODELS for lr in lrs],
                          desc="learning rates", unit="run", disable=len(lrs) == 1):
        record = finished_record(config(label, lr, seeds[0])) or train(config(label, lr, seeds[0]))
        valid_loss[label, lr] = record.get("valid_loss", math.nan)
    least = lambda label: lambda lr: (math.inf if math.isnan(valid_loss[label, lr])
                                      else valid_loss[label, lr])
    chosen = {label: min(lrs, key=least(label)) for label in LM_MODELS}

    any_run = config(next(iter(LM_MODELS)), lrs[0], seeds[0])     # the held-out data of all
    _, (x_test, y_test), _ = lm_data(any_run)
    train_ids, _, vocabulary = corpus_streams(any_run.corpus or None, any_run.vocab_size)
    threshold = scaled_threshold(len(train_ids)) if threshold is None else threshold
    contexts = torch.cat([x_test[:, :1], y_test], 1).numpy()                 # (B, T + 1)
    # the AR hits at the experiment's threshold and, to show how the slice depends on the
    # frequency cut, at looser ones and at none (no bigram occurs more often than that)
    bigrams = bigram_counts(train_ids, len(vocabulary))
    thresholds = sorted({threshold, 10, 100, len(train_ids)})
    hits = {t: ar_hits(contexts, bigrams, len(vocabulary), t)[:, 1:] for t in thresholds}
    # appendix G at the models' own length: P up to seq_len / 4, the vocabulary but <unk>
    # and <eof>, its most frequent character (id 2) as the filler
    pairs = [p for p in APPENDIX_G_PAIRS_OURS if 4 * p <= any_run.seq_len]
    rows, nll = [], {}
    for label, seed in tqdm([(label, seed) for label in LM_MODELS for seed in seeds],
                            desc="language models", unit="model"):
        model, record = trained_model(config(label, chosen[label], seed))
        nll[label, seed] = token_nll(model, x_test, y_test)
        model.eval()                      # for appendix_g below (token_nll ends in train mode)
        rows.append(dict(
            label=label, seed=seed, lr=chosen[label], mixer=record["config"]["mixer"],
            n_params=record["n_params"], steps=record["steps"],
            train_time_s=record["train_time_s"], final_loss=record["history"][-1]["loss"],
            valid_loss=record.get("valid_loss", math.nan),
            curve=[[e["step"], e["valid_loss"]] for e in record["history"] if "valid_loss" in e],
            **sliced_perplexity(nll[label, seed], hits[threshold]),
            ppl_ar_by_threshold=[sliced_perplexity(nll[label, seed], hits[t])["ppl_ar"]
                                 for t in thresholds],
            appendix_g=appendix_g(lambda ids: model.logits(model(ids)),
                                  torch.arange(2, len(vocabulary)), 2, pairs, g_samples,
                                  any_run.seq_len, batch_size=50)))
    for row in rows:
        reference = nll.get(("attention", row["seed"]))
        row["ar_share"] = (math.nan if reference is None or row["label"] == "attention" else
                           ar_gap_share(reference, nll[row["label"], row["seed"]],
                                        hits[threshold]))
    summary = dict(corpus=any_run.corpus or "the Python standard library",
                   train_tokens=len(train_ids), threshold=threshold, lrs=list(lrs),
                   seeds=list(seeds), tokens_per_step=any_run.batch_size * any_run.seq_len,
                   lr_valid_loss={label: [valid_loss[label, lr] for lr in lrs]
                                  for label in LM_MODELS},
                   thresholds=[dict(threshold=t, ar_tokens=int(hits[t].sum()))
                               for t in thresholds], rows=rows)
    summary_path, bars_path, curves_path, g_path = lm_outputs(any_run.out_dir)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(strict_json(summary))
    budget = (f"{any_run.max_steps:,} steps of {summary['tokens_per_step']:,} tokens, "
              f"seeds {', '.join(map(str, seeds))}")
    plot_lm(rows, bars_path, budget)
    plot_lm_curves(rows, summary["tokens_per_step"], curves_path, budget)
    plot_appendix_g({LM_LABELS.get(r["label"], r["label"]): r["appendix_g"]
                     for r in rows if r["seed"] == seeds[0]}, g_path,
                    f"appendix G on the LMs of --lm (N = {any_run.seq_len}, seed {seeds[0]})")
    return summary


def lm_outputs(out_dir):
    """What an LM experiment with records in `out_dir` writes beside that folder: its summary
    (JSON), the sliced perplexities, the validation curves and the appendix G curves (PNG)."""
    folder = Path(out_dir)
    return tuple(folder.with_name(folder.name + end)
                 for end in (".json", ".png", "_curves.png", "_appendix_g.png"))


def strict_json(summary):
    """`summary` as JSON that any parser reads: nan (an empty slice, no gap share) as null."""
    def clean(x):
        if isinstance(x, float) and math.isnan(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        return [clean(v) for v in x] if isinstance(x, (list, tuple)) else x
    return json.dumps(clean(summary), indent=1, allow_nan=False)


def gap_share_text(share, ppl, ppl_attention):
    """The AR share of a model's perplexity gap to attention, or why there is none: a model
    at or below attention's perplexity has no gap to attribute (Section 3.1)."""
    if share is None or math.isnan(share):             # None: read back from strict JSON
        return ""
    return f"{100 * share:.0f}%" if ppl > ppl_attention else "no gap"


LM_SLICES = [("ppl", "all tokens", ""), ("ppl_ar", "AR hits", "////"),    # key, name, hatch
             ("ppl_other", "other tokens", "....")]


def plot_lm(rows, path, budget):
    """Perplexity overall, on AR hits and on the other tokens, one group of bars per model in
    its colour (model_color), the slices told apart by hatching: each bar the geometric mean
    over the model's seeds (the perplexity of their tokens pooled), each seed a dot, the
    paper's Table 1 (PAPER_TABLE1: models of 125-169M parameters after 10B tokens of the
    Pile) a black cross on the bar of its model and slice."""
    plt = pyplot()
    from matplotlib.patches import Patch
    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for i, (key, name, hatch) in enumerate(LM_SLICES):
        x = [j + 0.27 * (i - 1) for j in range(len(labels))]
        seeds = [[r[key] for r in rows if r["label"] == label] for label in labels]
        ax.bar(x, [math.exp(np.mean(np.log(v))) for v in seeds], width=0.27, hatch=hatch,
               color=[model_color(LM_LABELS.get(label, label)) for label in labels],
               edgecolor="white", linewidth=0)
        for xi, v in zip(x, seeds):
            ax.plot([xi] * len(v), v, "k.", ms=3)
        paper = [(xi, PAPER_TABLE1[label][i]) for xi, label in zip(x, labels)
                 if label in PAPER_TABLE1]
        if paper:
            ax.scatter(*zip(*paper), marker="x", s=25, color="black", zorder=3)
    ax.set_xticks(range(len(labels)), [LM_LABELS.get(label, label) for label in labels],
                  fontsize=7, rotation=20, ha="right")
    ax.set(ylabel="perplexity (log scale)", yscale="log")
    ax.set_title(wrapped(f"held-out perplexity, sliced by AR hits (Section 3.1)\n{budget}",
                         7), fontsize=10)
    handles = [Patch(facecolor="0.6", edgecolor="white", hatch=hatch, label=name)
               for _, name, hatch in LM_SLICES]
    handles.append(ax.scatter([], [], marker="x", s=25, color="black",
                              label="the paper's Table 1 (125-169M\nparameters, 10B Pile tokens)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return save_figure(fig, path)


def plot_lm_curves(rows, tokens_per_step, path, budget):
    """Validation perplexity against training tokens, log-log (where a power law is a
    line, so that the reader sees where each curve is heading): one colour per model, one
    line style per seed, each model at its chosen rate. The paper's Table 1 (overall
    perplexity after 10B tokens) lies far right of this axis: its values are in the legend."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    seeds = sorted({r["seed"] for r in rows})
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for r in rows:
        if not r["curve"]:
            continue
        steps, loss = zip(*r["curve"])
        name = LM_LABELS.get(r["label"], r["label"])
        ax.plot([s * tokens_per_step for s in steps], np.exp(loss), marker="o", ms=3,
                color=model_color(name), ls=("-", "--", ":", "-.")[seeds.index(r["seed"]) % 4],
                label=f"{name} (lr {r['lr']:g}, seed {r['seed']})")
    curves = any(r["curve"] for r in rows)
    paper = [label for label in dict.fromkeys(r["label"] for r in rows)
             if label in PAPER_TABLE1 and curves]
    note = ("\nthe paper's Table 1 (10B Pile tokens, 125-169M parameters) is off this "
            "axis: its overall perplexity in the legend" if paper else "")
    ax.set(xscale="log", yscale="log", xlabel="training tokens",
           ylabel="validation perplexity (full split)")
    ax.set_title(wrapped(f"validation perplexity while training\n{budget}{note}", 5.5),
                 fontsize=9)
    if curves:                                   # Table 1 in the legend only: off the axis
        handles = ax.get_legend_handles_labels()[0] + [
            Line2D([], [], ls="", marker="x", color=model_color(LM_LABELS.get(label, label)),
                   label=f"{LM_LABELS.get(label, label)}: the paper's {PAPER_TABLE1[label][0]:.2f}")
            for label in paper]
        ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    else:
        ax.text(0.5, 0.5, "no validation split (num_valid = 0)", ha="center",
                transform=ax.transAxes)
    return save_figure(fig, path)


# ----------------------------------------------------------------------------------------
# appendix G: AR perplexity of a pretrained model on repeated key-value bigrams

APPENDIX_G_PAIRS = (16, 32, 64, 128, 256)        # P, at seq_len 1024 (appendix G)
TRANSFORMERS = "transformers==5.24.0"             # the optional package, the version tested


@torch.no_grad()
def appendix_g(logits_fn, token_ids, filler_id, num_pairs=APPENDIX_G_PAIRS, num_samples=1000,
               seq_len=1024, batch_size=8, seed=0):
    """Appendix G for any causal LM given as logits_fn(ids (B, N)) -> logits (B, N, V): for
    each P, perplexity on the AR tokens (the value after a key's second occurrence) and on
    the filler tokens of mqar.bigram_recall_sequences(token_ids, num_samples, P, filler_id,
    seq_len), token t predicted from the tokens before it. Returns one row per P."""
    check_positive("batch_size", batch_size)
    rows = []
    for P in tqdm(num_pairs, desc="appendix G", unit="P"):
        inputs, ar_mask, filler_mask = bigram_recall_sequences(token_ids, num_samples, P,
                                                               filler_id, seq_len, seed)
        nll = {"ar": [], "filler": []}
        for i in range(0, num_samples, batch_size):
            x = inputs[i:i + batch_size]
            logits = logits_fn(x)[:, :-1].float()                             # predicts 1..N-1
            loss = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
            nll["ar"].append(loss[ar_mask[i:i + batch_size, 1:]])
            nll["filler"].append(loss[filler_mask[i:i + batch_size, 1:]])
        ppl = {k: math.exp(torch.cat(v).double().mean().item()) for k, v in nll.items()}
        rows.append(dict(num_pairs=P, ppl_ar=ppl["ar"], ppl_filler=ppl["filler"],
                         ar_tokens=sum(len(v) for v in nll["ar"])))
    return rows


def hf_causal_lm(name_or_path):
    """A Hugging Face causal LM from a local folder or a hub name, as (logits_fn, token ids,
    filler id): the token ids are the vocabulary minus the special tokens the config names,
    the filler the smallest of them. Needs the optional package transformers."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ValueError(f"--hf needs the optional package {TRANSFORMERS.split('=')[0]}: pip "
                         f"install {TRANSFORMERS} (the version the tests ran with)") from None
    model = AutoModelForCausalLM.from_pretrained(name_or_path).eval()
    c = model.config
    special = {getattr(c, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    special = {i for s in special for i in (s if isinstance(s, list) else [s]) if i is not None}
    ids = torch.tensor([i for i in range(c.vocab_size) if i not in special])
    return (lambda x: model(input_ids=x).logits), ids, int(ids[0])


def plot_appendix_g(curves, path, title):
    """AR and filler perplexity against P, one pair of lines per model (appendix G's plot)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for label, rows in curves.items():
        P = [r["num_pairs"] for r in rows]
        ax.plot(P, [r["ppl_ar"] for r in rows], marker="o", color=model_color(label),
                label=f"{label}, AR")
        ax.plot(P, [r["ppl_filler"] for r in rows], marker="x", ls="--", color=model_color(label),
                label=f"{label}, filler")
    ax.set(xscale="log", yscale="log", xlabel="key-value pairs P", ylabel="perplexity", title=title)
    ax.set_xticks(P, [str(p) for p in P])
    ax.set_xticks([], minor=True)                      # no 3 x 10^0 between the P ticks
    ax.legend(fontsize=6)
    return save_figure(fig, path)


COMMANDS = ("--bench", "--seeds", "--sweep", "--scale", "--dry_run", "--workers", "--launcher",
            "--partition", "--time_min", "--gpus_per_run", "--cpus_per_run", "--parallel",
            "--plot", "--table", "--lm", "--ar_threshold", "--hf", "--samples")
LAUNCHER_OPTIONS = {"--partition": str, "--time_min": int, "--gpus_per_run": int,
                    "--cpus_per_run": int, "--parallel": int}      # submit_sweep's, by flag


def table_command(flags, rest):
    """--table=NAME: print the README's table of results/NAME (markdown_table)."""
    print(markdown_table(flags["--table"]))


def plot_command(flags, rest):
    """--plot=NAME: print a sweep's table and draw its figures (plot_sweep), or a folder's
    (fig2_epochs, fig2_lr)."""
    name, plots = flags["--plot"], {"fig2_epochs": plot_epochs, "fig2_lr": plot_lr,
                                    "fig2_plotted": plot_plotted}
    if name in plots:                                # its table is in FOLDER_TABLES
        print(f"{FOLDER_TABLES[name](name)}\nwrote {plots[name](name)}")
        return
    _, paths = plot_sweep(name)
    print(cells_table(name))
    print("wrote " + ", ".join(paths))


def submit_command(flags, rest):
    """--sweep=NAME --launcher=slurm [--partition=...]: submit the unfinished runs."""
    check_choice("launcher", flags["--launcher"], ("slurm",))
    options = {k[2:]: _parse_value(k[2:], v, LAUNCHER_OPTIONS[k])
               for k, v in flags.items() if k in LAUNCHER_OPTIONS}
    jobs = submit_sweep(flags["--sweep"], flags.get("--scale", "cpu"), **options)
    print(f"submitted {len(jobs)} runs" + (f" (jobs {jobs[0].job_id} ...)" if jobs else
          ": every run has finished") + f"; records in results/{flags['--sweep']}/")


def sweep_command(flags, rest):
    """--sweep=NAME [--scale=...] [--dry_run] [--workers=K]; --sweep=main draws
    results/main.png too (train.py's main job trains the same two runs afresh, into
    results/runs/main/)."""
    name, scale = flags["--sweep"], flags.get("--scale", "cpu")
    records = run_sweep(name, scale, dry_run="--dry_run" in flags,
                        workers=_positive_flag(flags, "workers", 1))
    if records:
        print(cells_table(name) if name in PLOT_AXES else
              runs_table(records, model_order(name)))
    if records and name == "main":
        print(f"wrote {curves_figure(records, 'results/main.png')}")


def bench_command(flags, rest):
    """--bench [--key=value ...]: the training-step benchmark of that run's model (bench)."""
    bench(make_config(**parse_arguments(rest)))


def hf_command(flags, rest):
    """--hf=NAME_OR_PATH [--samples=COUNT]: appendix G on a Hugging Face causal LM."""
    if rest:
        raise ValueError(f"{rest[0]!r} is not allowed with --hf: it runs appendix G "
                         "on a pretrained model (--samples=COUNT sets its size)")
    samples = _positive_flag(flags, "samples", 1000)
    rows = appendix_g(*hf_causal_lm(flags["--hf"]), num_samples=samples)
    name = "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in flags["--hf"])
    Path("results").mkdir(exist_ok=True)
    Path(f"results/appendix_g-{name}.json").write_text(strict_json(rows))
    plot_appendix_g({flags["--hf"]: rows}, f"results/appendix_g-{name}.png",
                    f"appendix G: {flags['--hf']}, N = 1024")
    for r in rows:
        print(f"P = {r['num_pairs']:>3}: AR ppl {r['ppl_ar']:.2f}, filler ppl "
              f"{r['ppl_filler']:.2f}")
    print(f"wrote results/appendix_g-{name}.json, results/appendix_g-{name}.png")


def lm_command(flags, rest):
    """--lm [--key=value ...] [--ar_threshold=COUNT] [--samples=COUNT]: the language-model
    experiment (run_lm_experiment), its tables printed. (One language model of a mixer of
    your choice is one run: --task=lm --mixer=NAME ...)"""
    overrides = parse_arguments(rest)
    for key, why in (("mixer", f"trains every model of LM_MODELS ({', '.join(LM_MODELS)})"),
                     ("task", "trains language models (task='lm')")):
        if key in overrides:
            raise ValueError(f"--{key} is not allowed with --lm: the experiment {why}")
    for flag in ("--seeds", "--bench"):
        if flag in flags:
            raise ValueError(f"{flag} is not allowed with --lm: the experiment "
                             "trains every model of LM_MODELS with LM_RECIPE at the "
                             "seeds of LM_SEEDS (--seed=SEED: one seed)")
    threshold = (_parse_value("ar_threshold", flags["--ar_threshold"], int)
                 if "--ar_threshold" in flags else None)
    if threshold is not None and threshold < 0:
        raise ValueError(f"--ar_threshold={threshold} is not allowed: it must be an "
                         "integer >= 0 (training occurrences of an AR hit's bigram)")
    summary = run_lm_experiment(overrides, threshold, _positive_flag(flags, "samples", 1000))
    titles = {"": f"held-out perplexity on {summary['corpus']}, AR hits at threshold "
                  f"{summary['threshold']:,} ({summary['train_tokens']:,} training tokens)",
              "thresholds": "AR perplexity by the threshold of an AR hit",
              "lr": "validation loss at each learning rate (seed "
                    f"{summary['seeds'][0]}), and the rate each model trains at",
              "appendix_g": "appendix G: AR perplexity by the number of pairs P"}
    for part, table in lm_tables(summary).items():
        print(f"{titles[part]}\n{table}\n")
    out_dir = overrides.get("out_dir", LM_RECIPE["out_dir"])
    print("wrote " + ", ".join(map(str, lm_outputs(out_dir))))


def check_flags(flags, rest):
    """Refuse the command-line flags that would do nothing with the others given."""
    if ("--sweep" in flags or "--plot" in flags or "--table" in flags) and rest:
        raise ValueError(f"{rest[0]!r} is not allowed with --sweep, --plot or --table: a "
                         "sweep's settings are its grid (SWEEPS in experiments/lab.py)")
    if "--sweep" not in flags and ("--launcher" in flags or "--workers" in flags):
        raise ValueError("--launcher and --workers are not allowed without --sweep: they "
                         "say where a sweep's runs run")
    wrong = ([f for f in ("--dry_run", "--workers") if f in flags] if "--launcher" in flags
             else [f for f in LAUNCHER_OPTIONS if f in flags])
    if wrong and "--launcher" in flags:
        raise ValueError(f"{wrong[0]} is not allowed with --launcher: the runs go to Slurm "
                         "(--dry_run alone prints them for any other scheduler)")
    if wrong:
        raise ValueError(f"{wrong[0]} is not allowed without --launcher=slurm: it is an "
                         "option of the Slurm jobs")
    if "--sweep" not in flags and ("--dry_run" in flags or "--scale" in flags):
        raise ValueError("--dry_run and --scale are not allowed without --sweep: they say "
                         "how a sweep runs")
    other = [f for f in ("--sweep", "--plot", "--table", "--hf") if f in flags]
    if "--lm" in flags and other:
        raise ValueError(f"--lm is not allowed with {other[0]}: each is a command of its own")
    if "--dry_run" in flags and "--workers" in flags:
        raise ValueError("--workers is not allowed with --dry_run: --dry_run runs nothing, "
                         "it prints the runs' command lines")


def command(flags, rest):
    """The function that runs what the command line asks for (the first that applies)."""
    if "--table" in flags:
        return table_command
    if "--plot" in flags:
        return plot_command
    if "--launcher" in flags:
        return submit_command
    if "--sweep" in flags:
        return sweep_command
    if not (flags or rest):
        return main_job_command
    if "--hf" in flags:
        return hf_command
    if "--lm" in flags:
        return lm_command
    if "--bench" in flags:
        return bench_command
    return one_run_command


def main_job_command(flags, rest):
    """No arguments: train.py's main job (its records in results/runs/main/)."""
    main_job()


def one_run_command(flags, rest):
    """--key=value ... [--seeds=COUNT]: train.py's run_command with the lab's presets."""
    if "--ar_threshold" in flags or "--samples" in flags:
        raise ValueError("--ar_threshold and --samples are not allowed without --lm (and "
                         "--samples without --hf): they set the language-model experiment's "
                         "AR hits and appendix G samples")
    return run_command(flags, rest, PRESETS)


def main(argv):
    """The command line: the main job (no arguments), one run (--key=value ...),
    --seeds=COUNT runs, --sweep=NAME [--scale=cpu|paper] [--dry_run], --plot=NAME,
    --table=NAME, --lm, --hf=NAME, --bench; each a function above. Returns the exit
    status: 2 for a bad argument, 1 for a failed run of a sweep, 130 for Ctrl-C."""
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        for f in dataclasses.fields(Config):
            print(f"  --{f.name}={getattr(Config(), f.name)}")
        return 0
    flags = {a.split("=", 1)[0]: a.partition("=")[2] for a in argv
             if a.split("=", 1)[0] in COMMANDS}
    rest = [a for a in argv if a.split("=", 1)[0] not in COMMANDS]
    try:
        check_flags(flags, rest)
        return command(flags, rest)(flags, rest) or 0
    except (ValueError, SweepFailed) as e:   # a bad argument or setting; a worker's run failed
        print(f"experiments: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    except KeyboardInterrupt:                    # Ctrl-C in a sweep
        print("interrupted: the finished runs' records are written, the unfinished runs "
              "checkpointed; the same command continues", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
