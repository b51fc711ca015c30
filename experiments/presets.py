"""The lab's presets (Arora et al., 2023): Figure 2's official configuration
(--preset=figure2) and the launches that Figure 2 plots (--preset=figure2_plotted), each
written out from the official code (HazyResearch/zoology) at the commits its comments name;
make_config, train.make_config that knows them; and the official sweep's grid and learning
rates (PAPER_GRID, PAPER_LRS), which the sweeps at paper scale run on.

A preset's layers name the official forms of experiments/official.py by an option
(form="official"), so this file imports neither it nor any experiment: every experiment
(figure2.py, figure6.py, hybrids.py, f2.py, frontier.py, lm.py), the figures (figures.py)
and the command line (cli.py) build their configs here.
"""
import math

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
#   [3, 3, long, long, 3, 3, long, long]; H3's n_layers=2 gives 4. Here those are n_layers
#   pre-norm blocks.
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
# the official sweep's grid: Figure 2's cells and its four learning rates

PAPER_LRS = (1e-4, 4.64e-4, 2.15e-3, 1e-2)          # logspace(-4, -2, 4), 3 digits
# Figure 2's grid and its four learning rates, for --scale=paper (on the official recipe)
PAPER_GRID = dict(preset=["figure2"], lr=PAPER_LRS, seed=[0, 1, 2],
                  nd=[(64, 4), (128, 8), (256, 16), (512, 64)], d_model=[64, 128, 256, 512],
                  num_valid=[3000])
