"""The Zoology model and a plain training loop for MQAR and real text (Arora et al., 2023).

The model of Figure 2: token embedding tied with the output head, learned positions
(attention only, by default), L blocks around the sequence mixers of mixers.py, a final
LayerNorm; loss and accuracy at the labelled (query) positions only. The defaults are the CPU
recipe, chosen by measurement (experiments/README.md, "The main job's recipe"): pre-norm
blocks x = x + mixer(LN(x)), each mixer in its paper form, AdamW with weight decay 0.1 on
matrices, cosine decay to 0, early stop once validation accuracy exceeds 0.99 (every
decision reads the validation split, never the test split: see evaluation). The official
Figure 2 configurations, sweeps and the rest of the paper's experiments are the lab's
(experiments/), which runs them on this file.

Usage:
  python train.py                     the main job: attention and BaseConv on MQAR (N=64,
                                      D=4, d=64), a table and results/runs/main.png
  python train.py --mixer=h3 --lr=1e-3  one run, any default overridden by --key=value
  python train.py --mixer=my/gla.py:GLA  a mixer of your own (parse_layers)
  python train.py --seeds=5           seeds seed .. seed+4, then median and range
  python -m experiments --help        the lab's commands

Every run writes one JSON record (config, history, scores, steps, times, how it ended and
what produced it) to `out_dir` when it ends, named by the settings that differ from the
defaults (identity). Run again, a finished run is not retrained (the main job always
trains) and an unfinished one continues from its last checkpoint: exactly on the CPU, and on
CUDA with --deterministic=true (Checkpoints).

Glossary (code name -> paper symbol): B batch, T = seq_len (N), d_model (d),
num_kv_pairs (D, Procedure 1), vocab_size (c), n_layers (L), M labelled positions.
"""
import contextlib
import dataclasses
import difflib
import functools
import hashlib
import itertools
import json
import math
import os
import re
import subprocess
import sys
import signal
import tempfile
import threading
import time
import zlib
from pathlib import Path

# on an Apple GPU, an op that mps lacks runs on the CPU (with a warning) instead of failing;
# read once, when torch is imported (resolve_device)
os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")
import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from mixers import (build_mixer, check_choice, check_mixer, is_outside, load_outside, mixer_class,
                    mixer_fact, mixer_setting, parse_mixer, split_mixer)
from mqar import FILLERS, IGNORE, multiquery_ar


# ----------------------------------------------------------------------------------------
# defaults: the one block a user edits or overrides with --key=value, and their checks

@dataclasses.dataclass
class Config:
    # model (Figure 2; the lab's `python -m experiments --preset=figure2` sets the official
    # configuration)
    mixer: str = "attention"          # a key of mixers.MIXERS, a mixer of your own
                                      # (path/to/file.py:Class), or one per layer: parse_layers
    mixer_source: str = ""            # filled in for a mixer of your own (check_outside_mixers)
    d_model: int = 64
    n_layers: int = 2
    block: str = "pre_norm"           # one of BLOCKS: "pre_norm", "identity_mlp", "rms_pre_norm"
    mlp: bool = False                 # the Figure 2 configs have no MLP
    mlp_activation: str = "gelu"      # of the MLP d -> 4d -> d: one of ACTIVATIONS ("tanh":
                                      # the MLP of Figure 2's attention, Hyena, RWKV launches)
    position_embedding: str = "auto"  # "auto" (learned iff every mixer `uses_positions`),
                                      # "learned" or "none"
    dropout: float = 0.0              # on the embeddings (the official configs: 0.1)
    init: str = "normal"              # "normal" or "gpt2" (the official scheme): see init_weights
    # data (Procedure 1)
    task: str = "mqar"                # "mqar", or "lm": next-token prediction on real text
                                      # (Section 3.1; experiments/lm.py)
    corpus: str = ""                  # task "lm": text files ("": Python's; experiments/lm.py)
    vocab_size: int = 8192
    seq_len: int = 64
    num_kv_pairs: int = 4
    power_a: float = 0.01
    fillers: str = "zeros"            # the tokens between queries (mqar.FILLERS): "zeros"
                                      # (Figure 2), "random" (never a key of the example) or
                                      # "uniform" (the official random_non_queries, keys included)
    num_train: int = 100_000
    num_test: int = 3_000
    num_valid: int = 1000             # the validation split: every decision reads it (early
                                      # stopping, a learning rate); 0: none, so no early stop
    # a mixture of lengths, as the official harness trains (segments): "N:D:examples,...";
    # "" is the one segment (seq_len, num_kv_pairs, num_train / num_test). Every N is at most
    # seq_len, the longest sequence the model takes
    train_segments: str = ""          # each batch from one segment (BatchOrder)
    segment_passes: int = 1           # passes over each segment before the next: > 1 is a
                                      # curriculum (the Mamba-2 paper's appendix D.1)
    test_slices: str = ""             # each slice scored apart, and the validation split the
                                      # same (N, D) with num_valid examples each (evaluation)
    # optimisation: the CPU recipe, chosen by measurement (experiments/README.md, "The main
    # job's recipe")
    batch_size: int = 128
    lr: float = 3e-3
    beta2: float = 0.999              # AdamW's betas are (0.9, beta2)
    weight_decay: float = 0.1
    decay_all: bool = False           # weight decay on biases, norms and other 1-d parameters too
    grad_clip: float = 0.0            # max gradient norm; 0 turns clipping off
    warmup_steps: int = 0             # linear warmup (schedules "cosine" and "linear")
    max_steps: int = 8000             # the schedule decays to 0 here
    schedule: str = "cosine"          # "cosine" stepped every step, "cosine_epochs" every
                                      # epoch, or "linear" decay to 0, every step (lr_at)
    budget_steps: int = 0             # stop here even mid-schedule (a CPU budget); 0: max_steps
    shuffle: bool = True              # a new order of the training set every epoch
    eval_every: int = 50              # steps between evaluations: see evaluation
    eval_probe: int = 500             # an evaluation first scores this many validation examples
                                      # and the whole split only if they pass target_acc (0: all)
    target_acc: float = 0.99          # stop once validation accuracy exceeds this
    # bookkeeping
    preset: str = "cpu"               # "cpu" (these defaults), or the lab's whose values
                                      # these are ("figure2", ...): make_config
    seed: int = 0
    device: str = "auto"              # "auto" (cuda, else mps, else cpu: resolve_device), "cpu",
                                      # "cuda", "cuda:INDEX" or "mps"
    amp: bool = False                 # bfloat16 autocast in training (for a GPU): see train
    tf32: bool = False                # float32 matrix products on CUDA's tensor cores in TF32
                                      # (Ampere and later): faster, but products of 10-bit
                                      # mantissas change a run's numbers, so off keeps every run
                                      # and its float32 agreement with the CPU; amp is faster
                                      # still. Nothing on a CPU or mps (torch_settings)
    deterministic: bool = False       # torch's deterministic algorithms for the run: on CUDA,
                                      # what makes a continued run exact (Checkpoints); slower
    compile: str = ""                 # a torch.compile backend for the training forward
                                      # ("inductor" on a GPU); "" does not compile
    out_dir: str = "results/runs"
    save_model: bool = False          # also write the trained weights beside the record (.pt)
    checkpoint_every: float = 300.0   # seconds between checkpoints (train), besides the one at
                                      # the end of every epoch; 0: at epoch ends only
    progress: bool = True
    label: str = ""                   # a name for tables and figures (a sweep's model name)

    @property
    def layers(self):
        """`mixer` parsed, one (name, options) per layer (parse_layers): parsed once, again
        only if mixer or n_layers has changed since. Not a setting (no field of a record)."""
        key = (self.mixer, self.n_layers)
        if getattr(self, "_parsed", (None,))[0] != key:
            self._parsed = (key, parse_layers(self.mixer, self.n_layers))
        return self._parsed[1]

    def replace(self, **changes):
        """dataclasses.replace(self, **changes), keeping the parsed layers (`layers` parses
        again only if the changes touch mixer or n_layers)."""
        new = dataclasses.replace(self, **changes)
        if hasattr(self, "_parsed"):
            new._parsed = self._parsed
        if "mixer" in changes and "mixer_source" not in changes:
            new.mixer_source = ""                        # check_config fills in the new one's
        return new


# name -> (its values for a config, the per-layer forms of the mixers it names): "cpu" is
# the Config defaults; the Figure 2 presets are the lab's (experiments/presets.py)
PRESETS = {"cpu": (lambda config: {}, {})}


def make_config(preset="cpu", presets=None, **overrides):
    """A checked Config: the preset's values (`presets`, by default PRESETS), then
    `overrides` (Config keys) on top; a `mixer` the preset names takes its per-layer forms."""
    presets = presets or PRESETS
    fields = [f.name for f in dataclasses.fields(Config)]
    for key in overrides:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise ValueError(f"unknown key --{key}{hint} (keys: {', '.join(fields)})")
    if preset not in presets:
        raise ValueError(f"preset={preset!r} is not allowed here: choose one of "
                         f"{', '.join(presets)}")
    config = Config(preset=preset, **overrides)
    values, layer_forms = presets[preset]
    for key, value in values(config).items():
        if key not in overrides:
            setattr(config, key, value)
    if config.mixer in layer_forms:                          # e.g. "h3" -> "h3:form=..."
        config.mixer = mixer_setting([layer_forms[config.mixer](i, config.seq_len)
                                      for i in range(config.n_layers)])
    return check_config(config)


def parse_arguments(args):
    """`--key=value` strings -> {key: value of the Config field's type}."""
    fields = [f.name for f in dataclasses.fields(Config)]
    overrides = {}
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise ValueError(f"argument {arg!r} is not allowed: write --key=value "
                             f"(keys: {', '.join(fields)})")
        key, text = arg[2:].split("=", 1)
        kind = type(getattr(Config(), key)) if key in fields else str
        overrides[key] = _parse_value(key, text, kind)
    return overrides


def _parse_value(key, text, kind):
    if kind is bool:
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"--{key}={text!r} is not allowed: {key} must be true or false")
    try:
        return kind(text) if kind is not int else int(text.replace("_", ""))
    except ValueError:
        what = "an integer" if kind is int else "a number" if kind is float else "text"
        raise ValueError(f"--{key}={text!r} is not allowed: {key} must be {what}") from None


def parse_layers(mixer, n_layers):
    """The `mixer` setting as one (name, options) pair per layer: one mixer for every layer
    ("attention"), or n_layers entries separated by commas, each with options after colons
    ("base_conv:kernel_size=3,base_conv": a short and a long filter alternating). An entry
    may be a mixer of your own, a class by its path or module ("my/gla.py:GLA:num_heads=2",
    "mypackage.gla:GLA": mixers.split_mixer). Option values are read as int, float,
    true/false or text, keyword arguments of the mixer's class (mixers.parse_mixer)."""
    entries = mixer.split(",")
    if len(entries) not in (1, n_layers):
        raise ValueError(f"mixer={mixer!r} lists {len(entries)} layers but n_layers={n_layers}: "
                         "give one mixer for every layer, or exactly n_layers of them")
    layers = [parse_mixer(entry) for entry in entries]
    return layers * n_layers if len(layers) == 1 else layers


# a mixer of your own passes every check of the mixer contract (mixers.check_mixer) before
# it trains, the meta-device check included: a layer that makes a tensor on the CPU inside
# forward would train here and fail on a GPU. It takes 1.4-2 s on the README's GLA and on
# Mamba at d, T <= 64, nearly all of it torch's one-off start of autograd or the meta device
# in a new process (0.1-0.3 s when checked again); every built-in passes it in the tests
_FAILED = {}        # (name, options, digest, d_model, seq_len) -> its first failed check or None


# the longest sequence the contract is run at before training: its causal check edits every
# position, 2T + 2 forwards, which for a layer that loops over positions costs T² steps
CONTRACT_LENGTH = 64


def check_outside_mixers(config):
    """Fill in `mixer_source` from the mixers of your own in `mixer` ("" if none): each
    source, file or module, with the digest of its text (mixers.source_digest), so that a
    changed file is another run. Raise a ValueError for one that fails a check of the mixer
    contract at the config's d_model and seq_len, at most CONTRACT_LENGTH (run once per file
    version and size)."""
    outside = [(name, options) for name, options in config.layers if is_outside(name)]
    digests = {name: load_outside(name)[1] for name, _ in outside}
    sources = ",".join(dict.fromkeys(f"{name.rpartition(':')[0]}={digests[name]}"
                                     for name, _ in outside))
    if config.mixer_source not in ("", sources):
        raise ValueError(f"mixer_source={config.mixer_source!r} is not allowed: it is filled "
                         f"in from the files of mixer={config.mixer!r}, now {sources!r} (changed "
                         "since, or given: leave it out)")
    config.mixer_source = sources
    T = min(config.seq_len, CONTRACT_LENGTH)
    for name, options in outside:
        key = (name, repr(options), digests[name], config.d_model, T)
        if key not in _FAILED:
            _FAILED[key] = next((r for r in check_mixer(name, options, config.d_model, T)
                                 if r.status == "fail"), None)
        if _FAILED[key]:
            check, _, measured = _FAILED[key]
            raise ValueError(f"mixer={config.mixer!r} is not allowed: {name} fails the mixer "
                             f"contract's {check} check at d_model={config.d_model}, seq_len="
                             f"{T}: {measured} (python mixers.py --check "
                             f"{mixer_setting([(name, options)])} --d_model={config.d_model} "
                             f"--seq_len={T} shows every check)")


BLOCKS = ("pre_norm", "identity_mlp", "rms_pre_norm")
INITS = ("normal", "gpt2")
SCHEDULES = ("cosine", "cosine_epochs", "linear")
TASKS = ("mqar", "lm")


def check_config(config):
    """Raise a ValueError naming the first setting that cannot work."""
    check_choice("block", config.block, BLOCKS)
    check_choice("init", config.init, INITS)
    check_choice("schedule", config.schedule, SCHEDULES)
    check_choice("position_embedding", config.position_embedding, ("auto", "learned", "none"))
    if config.schedule == "cosine_epochs" and config.warmup_steps:
        raise ValueError(f"warmup_steps={config.warmup_steps} is not allowed with "
                         "schedule='cosine_epochs': warm up with schedule='cosine'")
    if config.mlp and config.block == "identity_mlp":
        raise ValueError(f"mlp=True is not allowed with block={config.block!r}: that block has no "
                         "MLP sublayer; use block='pre_norm' or 'rms_pre_norm'")
    check_choice("mlp_activation", config.mlp_activation, tuple(ACTIVATIONS))
    if config.mlp_activation != "gelu" and not (config.mlp and config.block == "pre_norm"):
        raise ValueError(f"mlp_activation={config.mlp_activation!r} is not allowed with "
                         f"mlp={config.mlp}, block={config.block!r}: it is the activation of the "
                         "pre-norm block's MLP "
                         "(mlp=True, block='pre_norm'; rms_pre_norm's MLP is SwiGLU)")
    for key in ("d_model", "n_layers", "num_train", "num_test", "batch_size", "max_steps",
                "eval_every", "segment_passes"):
        if getattr(config, key) < 1:
            raise ValueError(f"{key}={getattr(config, key)} is not allowed: it must be >= 1")
    config.layers                # the mixer names and option keys (their values: when built)
    check_outside_mixers(config)
    if not config.lr > 0:
        raise ValueError(f"lr={config.lr} is not allowed: it must be > 0 (at 0 nothing trains)")
    for key in ("weight_decay", "grad_clip", "warmup_steps", "budget_steps", "eval_probe",
                "num_valid", "checkpoint_every"):
        if not getattr(config, key) >= 0:
            raise ValueError(f"{key}={getattr(config, key)} is not allowed: it must be >= 0")
    for key in ("beta2", "dropout"):
        if not 0 <= getattr(config, key) < 1:
            raise ValueError(f"{key}={getattr(config, key)} is not allowed: it must be in [0, 1)")
    if not 0 < config.target_acc <= 1:
        raise ValueError(f"target_acc={config.target_acc} is not allowed: it must be in (0, 1]")
    backends = torch.compiler.list_backends(exclude_tags=())
    if config.compile and config.compile not in backends:
        raise ValueError(f"compile={config.compile!r} is not allowed: choose '' (off) or a "
                         f"torch.compile backend, one of {', '.join(backends)}")
    if not (config.device in ("auto", "cpu", "cuda", "mps") or config.device.startswith("cuda:")):
        raise ValueError(f"device={config.device!r} is not allowed: choose 'auto', 'cpu', "
                         "'cuda', 'cuda:INDEX' or 'mps'")
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={config.device!r} is not allowed: this torch build sees no CUDA "
                         "device; use --device=cpu or --device=auto")
    if config.device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' is not allowed: this machine or torch build has no "
                         "Apple GPU (MPS); use --device=cpu or --device=auto")
    device = resolve_device(config.device)
    if device.type == "mps" and (config.amp or config.compile):
        raise ValueError(f"amp={config.amp} with compile={config.compile!r} is not allowed on "
                         f"'mps' (device={config.device!r}): bfloat16 autocast and torch.compile "
                         "are checked on CUDA only; run without them there (--amp=false "
                         "--compile=)")
    if config.amp and device.type == "cuda":
        # is_bf16_supported() counts emulation too; emulated (below compute capability 8.0:
        # Turing, Pascal) it runs, slower than float32. It asks the current device: the run's.
        with torch.cuda.device(device):
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        if not native:
            major, minor = torch.cuda.get_device_capability(device)
            raise ValueError(f"amp=True is not allowed on {torch.cuda.get_device_name(device)} "
                             f"(device={config.device!r}, compute capability {major}.{minor}): it "
                             "has no native bfloat16 (compute capability 8.0 and later do), and "
                             "emulated bfloat16 runs slower than float32; train in float32 with "
                             "--amp=false")
    check_writable(config.out_dir)
    check_choice("task", config.task, TASKS)
    if config.task == "mqar":
        check_choice("fillers", config.fillers, FILLERS)
        multiquery_ar(0, config.vocab_size, config.seq_len, config.num_kv_pairs, config.power_a,
                      seed=config.seed)
        for split in ("train", "test"):
            segments(config, split)
    elif config.train_segments or config.test_slices:
        raise ValueError(f"train_segments={config.train_segments!r}, test_slices="
                         f"{config.test_slices!r} are not allowed with task={config.task!r}: "
                         "segments and slices are MQAR's (task='mqar')")
    elif config.vocab_size < 3:
        raise ValueError(f"vocab_size={config.vocab_size} is not allowed with task='lm': it must "
                         "be >= 3 (<unk>, <eof> and a token)")
    return config


def check_writable(out_dir):
    """Raise a ValueError unless a run can write into `out_dir`: the folder, or the nearest of
    its parents that exists (the run makes the rest), is a folder this user can write a file
    in. Checked before training, so that the first checkpoint cannot fail after minutes of it
    (a temporary file, gone at once: permissions alone do not say, e.g. for root)."""
    existing = Path(out_dir).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"out_dir={out_dir!r} is not allowed: {existing} is a file, not a "
                         "folder; give a folder (made if missing)")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        raise ValueError(f"out_dir={out_dir!r} is not allowed: no file can be written in "
                         f"{existing} ({type(e).__name__}: {e.strerror}); give a folder you "
                         "can write in") from None


def resolve_device(name):
    """The device of a `device` setting; "auto" is the first of cuda (an NVIDIA GPU), mps
    (an Apple GPU, float32 as everywhere; an op it lacks runs on the CPU) and cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else
                            "mps" if torch.backends.mps.is_available() else "cpu")
    return torch.device(name)


# ----------------------------------------------------------------------------------------
# the model of Figure 2: token embedding tied with the head, L blocks, final LayerNorm;
# learned positions for attention only

ACTIVATIONS = {"gelu": F.gelu, "tanh": torch.tanh}


class MLP(nn.Module):
    def __init__(self, d_model, activation="gelu"):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out_proj = nn.Linear(4 * d_model, d_model)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x):
        return self.out_proj(self.activation(self.fc(x)))


class SwiGLU(nn.Module):
    """The Llama MLP: out_proj(silu(gate(x)) ⊙ up(x)), no biases, hidden 8d/3 rounded up to a
    multiple of 8: about the parameters of the 4d GELU MLP."""

    def __init__(self, d_model):
        super().__init__()
        hidden = 8 * math.ceil(d_model / 3)
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.out_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.out_proj(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """One residual block around a mixer; `kind` is one of BLOCKS.

    pre_norm      x = x + mixer(LN₁(x)), then x = x + MLP(LN₂(x)) if mlp: the pre-norm block
                  the paper's text describes. Without an MLP it has one sublayer.
    identity_mlp  x = x + mixer(LN₁(x)), then x = x + LN₂(x): what the official
                  TransformerBlock (zoology/model.py) computes with state_mixer=Identity, as
                  every Figure 2 model but Mamba ran. It returns (norm2(residual), residual)
                  and the next block, or the final norm, adds the two: "no MLP" there is the
                  identity in the MLP's place, not a missing second sublayer.
    rms_pre_norm  x = x + mixer(RMSNorm(x)): the official MambaBlock (Figure 2's Mamba);
                  with mlp, then x = x + SwiGLU(RMSNorm(x)): the Llama block.
    """

    def __init__(self, mixer, d_model, kind="pre_norm", mlp=False, activation="gelu"):
        super().__init__()
        self.kind, self.mixer = kind, mixer
        rms = kind == "rms_pre_norm"
        norm = lambda: nn.RMSNorm(d_model, eps=1e-5) if rms else nn.LayerNorm(d_model)
        self.norm1 = norm()
        self.norm2 = norm() if mlp or kind == "identity_mlp" else None
        self.mlp = (SwiGLU(d_model) if rms else MLP(d_model, activation)) if mlp else None

    def _second_sublayer(self, x):
        if self.mlp is not None:
            return x + self.mlp(self.norm2(x))
        return x + self.norm2(x) if self.kind == "identity_mlp" else x

    def forward(self, x, tokens):
        # selective attention's programmatic rule reads token ids; no other mixer sees them
        extra = {"tokens": tokens} if mixer_fact(self.mixer, "takes_tokens") else {}
        return self._second_sublayer(x + self.mixer(self.norm1(x), **extra))

    def step(self, x_t, state, token):
        extra = {"token": token} if mixer_fact(self.mixer, "takes_tokens") else {}
        y_t, state = self.mixer.step(self.norm1(x_t), state, **extra)
        return self._second_sublayer(x_t + y_t), state


class LanguageModel(nn.Module):
    """Embedding (tied with the head), optional learned positions, L blocks, final norm."""

    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        # "auto": learned positions when every mixer asks for them (`uses_positions`), as
        # attention has them in the official configs (max_position_embeddings = N)
        use_pos = (config.position_embedding == "learned" or
                   (config.position_embedding == "auto" and
                    all(mixer_fact(mixer_class(name, kw.get("form", "paper")), "uses_positions")
                        for name, kw in config.layers)))
        self.pos = nn.Embedding(config.seq_len, config.d_model) if use_pos else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            Block(build_mixer(name, config.d_model, config.seq_len, **kwargs), config.d_model,
                  config.block, config.mlp, config.mlp_activation)
            for name, kwargs in config.layers)
        self.norm = nn.LayerNorm(config.d_model)
        init_weights(self, config.init, config.n_layers, config.block)

    def forward(self, tokens):
        """tokens (B, T) -> final hidden states (B, T, d); `logits` turns rows into scores."""
        B, T = tokens.shape
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(T, device=tokens.device))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, tokens)
        return self.norm(x)

    def aux_loss(self):
        """Sum of the mixers' `aux_loss` from the last forward, each already weighted by its
        mixer (Section 5's learned selection); 0 when no mixer has one."""
        losses = (mixer_fact(b.mixer, "aux_loss") for b in self.blocks)
        return sum(loss for loss in losses if loss is not None)

    def step(self, token, position, states=None):
        """One token (B,) at `position` -> (final hidden state (B, d), new per-layer states):
        the recurrent view of `forward`, every mixer running its own `step`."""
        x = self.embed(token)
        if self.pos is not None:
            x = x + self.pos.weight[position]
        x = self.drop(x)
        states = states or [None] * len(self.blocks)
        new_states = []
        for block, state in zip(self.blocks, states):
            x, state = block.step(x, state, token)
            new_states.append(state)
        return self.norm(x), new_states

    def logits(self, hidden):
        """(..., d) -> (..., c): the head is the token embedding, transposed."""
        return hidden @ self.embed.weight.T


def init_weights(model, scheme, n_layers, block="pre_norm"):
    """Initialise the Linear and Embedding layers of `model` by one of INITS.

    normal  every Linear and Embedding weight N(0, 0.02), biases 0, except in modules that
            keep their own (class attribute `keeps_own_init`: Mamba's Δ and projections as
            Gu & Dao's; implicit filters' MLPs, which must start as non-trivial filters).
    gpt2    the official `_init_weights` (zoology/model.py) of the Figure 2 runs: the same
            draw, implicit filters included, then N(0, 0.02/√(2L)) for the output
            projections it rescales (named "out_proj.weight" or "fc2.weight": attention's,
            Hyena's, selective attention's, the MLP's; not H3's output_linear, RWKV's
            output or Based's proj_o, whose classes say `rescale_out_proj = False`). With
            the Mamba block (rms_pre_norm) its Mamba branch: Embedding N(0, 0.02), Linear
            biases 0, each mixer's out_proj PyTorch's default divided by √L, the rest the
            mixer's own.
    """
    if scheme == "gpt2" and block == "rms_pre_norm":
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, 0.02)
            elif isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for b in model.blocks:
            if hasattr(b.mixer, "out_proj"):
                b.mixer.out_proj.reset_parameters()
                with torch.no_grad():
                    b.mixer.out_proj.weight /= math.sqrt(n_layers)
        return
    skip = ({id(sub) for m in model.modules() if getattr(m, "keeps_own_init", False)
             for sub in m.modules()} if scheme == "normal" else set())
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)) and id(module) not in skip:
            nn.init.normal_(module.weight, 0.0, 0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
    if scheme == "gpt2":
        for b in model.blocks:
            parts = [b.mlp] if b.mlp is not None else []
            if mixer_fact(b.mixer, "rescale_out_proj"):
                parts.append(b.mixer)
            for part in parts:
                for name, module in part.named_modules():
                    if name.split(".")[-1] == "out_proj":
                        nn.init.normal_(module.weight, 0.0, 0.02 / math.sqrt(2 * n_layers))


# ----------------------------------------------------------------------------------------
# the loss and the metrics: labelled positions only; a split's accuracy in eval mode

def labelled_positions(labels):
    """Where each row of `labels` (B, T) is labelled: (B, K) positions, K the most labels a
    row has (D for MQAR, T for text); a row's labelled positions in order, then, in a row
    with fewer than K, some of its unlabelled ones, whose label IGNORE keeps them out of the
    loss. K is read back from the device (a host sync)."""
    labelled = (labels != IGNORE).int()
    K = int(labelled.sum(dim=1).max())
    # a stable sort puts each row's labelled positions first, in order; contiguous: a copy of
    # the first K columns, so that the whole (B, T) sort is not kept alive behind them
    return labelled.argsort(dim=1, descending=True, stable=True)[:, :K].contiguous()


def labelled_loss(model, inputs, labels, positions=None):
    """Cross-entropy and accuracy at the labelled positions only.

    Projecting just the M labelled rows onto the vocabulary gives the same loss as full
    (B, T, c) logits with ignore_index, at a fraction of the cost: the official harness
    computes them at every position. `positions`: labelled_positions(labels), found here if
    not given; train gives the training split's, found once, so that no step waits for the
    device (rows picked by a boolean mask would: their number is known only once the device
    has computed the mask). Returns (mean loss, right, labelled): right (B,) counts each
    row's correct argmax predictions, labelled (B,) its labelled positions (M in all).
    """
    positions = labelled_positions(labels) if positions is None else positions
    B, T = inputs.shape
    hidden = model(inputs)                                                   # (B, T, d)
    rows = torch.arange(B, device=inputs.device)[:, None]
    logits = model.logits(hidden[rows, positions].flatten(0, 1))             # (B·K, c)
    target = labels[rows, positions].flatten()                               # (B·K,)
    loss = F.cross_entropy(logits, target, ignore_index=IGNORE)
    right = (logits.argmax(dim=-1) == target).view(B, -1).sum(dim=1)
    return loss, right, (target != IGNORE).view(B, -1).sum(dim=1)


@torch.no_grad()
def evaluate(model, inputs, labels, batch_size=None):
    """The scores of (inputs, labels) in eval mode, a dict: "acc", the share of labelled
    positions whose argmax over the whole vocabulary is the label (per-query accuracy);
    "seq_acc", the share of examples with every labelled position right (per-sequence
    accuracy, as RWKV-7's MQAR table counts); "loss", the mean cross-entropy over the
    labelled positions; "examples".
    batch_size: rows per forward, by default 2^14 positions' worth (256 rows at T = 64)."""
    batch_size = batch_size or max(1, 2 ** 14 // inputs.shape[1])
    model.eval()
    correct = total = whole = loss_sum = 0
    for i in range(0, len(inputs), batch_size):
        loss, right, labelled = labelled_loss(model, inputs[i:i + batch_size],
                                              labels[i:i + batch_size])
        correct, total = correct + int(right.sum()), total + int(labelled.sum())
        whole += int((right == labelled).sum())
        loss_sum = loss_sum + loss.item() * int(labelled.sum())
    model.train()
    return dict(acc=correct / total, seq_acc=whole / len(inputs), loss=loss_sum / total,
                examples=len(inputs))


def score_split(model, split, names, limit=0):
    """evaluate over each slice of `split` (a list of (inputs, labels); the first `limit`
    examples of each, if > 0) and over them all: "acc" and "seq_acc" the mean over every
    example (each slice weighed by its examples: with one slice, its scores), "loss" the
    slices' losses weighed alike (with one slice, over its every labelled position); with
    several slices, "slices": each one's "acc" and "seq_acc"
    by its name (`names`). The official harness's `valid/accuracy` is this "acc": the mean
    over every test example of its per-query accuracy, which within an MQAR slice (D queries
    each) is the slice's per-query accuracy (zoology/train.py, `compute_metrics`)."""
    parts = [evaluate(model, *(x[:limit] if limit else x for x in part)) for part in split]
    examples = sum(p["examples"] for p in parts)
    mean = lambda key: sum(p[key] * p["examples"] for p in parts) / examples
    scores = dict(acc=mean("acc"), seq_acc=mean("seq_acc"), loss=mean("loss"))
    if len(split) > 1:
        scores["slices"] = {name: dict(acc=p["acc"], seq_acc=p["seq_acc"])
                            for name, p in zip(names, parts)}
    return scores


def evaluation(model, valid, test, config, final=False):
    """The scores of one evaluation of `model` on the validation and test splits, each a
    list of (inputs, labels), one per slice (segments; one without test_slices).

    The validation split decides: its first eval_probe examples (of each slice) are scored
    ("valid_probe"), and only if they pass target_acc the whole split ("valid_acc",
    "valid_seq_acc", "valid_loss" and, with slices, "valid_slices": score_split), which the
    stopping rule reads; the probe saves most evaluations most of their cost. The test split
    is scored alike ("test_probe" beside a validation probe, "test_acc", "test_seq_acc",
    "test_slices" beside a whole validation score and on the final step), for the record and
    the curves only. (The official harness stops on the test accuracy: experiments/README.md,
    "Which split decides".) Without a validation split (num_valid = 0) a run trains to the
    end.
    """
    names = [slice_name(N, D) for N, D, _ in segments(config, "test")]
    scores = {}
    probe = (lambda split: 0 < config.eval_probe < max(len(x) for x, _ in split)
             and not final)
    scored = lambda split, limit=0: score_split(model, split, names, limit)

    def add(prefix, got, keys):
        scores.update({f"{prefix}_{k}": got[k] for k in keys if k in got})

    whole = False                   # the whole validation split scored at this evaluation
    if len(valid[0][0]):
        whole = not probe(valid)
        if not whole:
            scores["valid_probe"] = scored(valid, config.eval_probe)["acc"]
            whole = scores["valid_probe"] > config.target_acc
        if whole:
            add("valid", scored(valid), ("acc", "seq_acc", "loss", "slices"))
    if whole or not probe(test):
        add("test", scored(test), ("acc", "seq_acc", "slices"))
    else:
        scores["test_probe"] = scored(test, config.eval_probe)["acc"]
    return scores


# ----------------------------------------------------------------------------------------
# the training loop

def make_optimizer(model, config):
    """AdamW with betas (0.9, beta2). Weight decay on every parameter if decay_all (as the
    official trainer), else on matrices only (not biases, norms or other 1-d parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if config.decay_all:
        groups = [{"params": params, "weight_decay": config.weight_decay}]
    else:
        groups = [{"params": [p for p in params if p.dim() >= 2],
                   "weight_decay": config.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, config.beta2))


def batch_sizes(config):
    """The size of each batch of one epoch, segment after segment in order, segment_passes
    times each (each pass's last batch may be partial)."""
    return [min(config.batch_size, examples - start)
            for _, _, examples in segments(config, "train")
            for _ in range(config.segment_passes)
            for start in range(0, examples, config.batch_size)]


def steps_per_epoch(config):
    """Batches in one epoch: len(batch_sizes(config))."""
    return config.segment_passes * sum(math.ceil(examples / config.batch_size)
                                       for _, _, examples in segments(config, "train"))


def lr_at(step, config):
    """The learning rate of (0-based) step `step`.

    "cosine": linear warmup to lr over warmup_steps, then cosine decay to 0 at max_steps;
    "linear" the same warmup, then linear decay to 0 at max_steps.
    "cosine_epochs": constant within an epoch, lr·(1 + cos(π e/E))/2 in epoch e of the
    E = ⌈max_steps / steps_per_epoch⌉ epochs: PyTorch's CosineAnnealingLR(T_max=E) stepped
    after every epoch, as the official trainer does (zoology/train.py).
    """
    if config.schedule == "cosine_epochs":
        epoch = step // steps_per_epoch(config)
        epochs = math.ceil(config.max_steps / steps_per_epoch(config))
        return config.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, epoch / epochs)))
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) /
                   max(1, config.max_steps - config.warmup_steps))
    if config.schedule == "linear":
        return config.lr * (1 - progress)
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress))


def segments(config, split):
    """The (N, D, examples) of each segment of `split` ("train", "test" or "valid"), in
    order: train_segments for "train", test_slices for "test" and, with num_valid examples
    each, "valid"; either one unset is the one segment of seq_len and num_kv_pairs (num_train,
    num_test or num_valid examples). A ValueError names a setting that cannot be read, a
    segment that does not fit the model's seq_len, a D that does not fit its N, or num_train
    (num_test) set beside the segments that give the examples."""
    key, count = {"train": ("train_segments", "num_train"), "test": ("test_slices", "num_test"),
                  "valid": ("test_slices", "num_valid")}[split]
    text = getattr(config, key)
    if not text:
        return [(config.seq_len, config.num_kv_pairs, getattr(config, count))]
    if split != "valid" and getattr(config, count) != getattr(Config, count):
        raise ValueError(f"{count}={getattr(config, count)} is not allowed with {key}={text!r}: "
                         f"each segment gives its own examples (N:D:examples)")
    parsed = parse_segments(key, text, config.seq_len, config.vocab_size, config.power_a)
    return [(N, D, config.num_valid if split == "valid" else examples)
            for N, D, examples in parsed]


@functools.lru_cache(maxsize=64)
def parse_segments(key, text, seq_len, vocab_size, power_a):
    """The (N, D, examples) of a train_segments or test_slices setting `text` (named `key`),
    each checked as segments says; parsed once per setting (steps_per_epoch asks every step)."""
    parsed = []
    for entry in text.split(","):
        try:
            N, D, examples = (int(part.replace("_", "")) for part in entry.split(":"))
        except ValueError:
            raise ValueError(f"{key}={text!r} is not allowed: {entry!r} is not N:D:examples, "
                             "three integers (e.g. 64:4:100000); separate segments by commas "
                             "and give at least one") from None
        if N > seq_len:
            raise ValueError(f"{key}={text!r} is not allowed with seq_len={seq_len}: its "
                             f"segment {entry} is longer than the longest sequence the model "
                             f"takes (give seq_len >= {N})")
        try:
            multiquery_ar(0, vocab_size, N, D, power_a, seed=0)
        except ValueError as e:
            raise ValueError(f"{key}={text!r} is not allowed: its segment {entry}: {e}") from None
        parsed.append((N, D, examples))
    if len({(N, D) for N, D, _ in parsed}) < len(parsed):
        raise ValueError(f"{key}={text!r} is not allowed: an (N, D) appears twice; give each "
                         "once with all its examples")
    return tuple(parsed)


def slice_name(N, D):
    """How the history and the record name a slice: "N:D"."""
    return f"{N}:{D}"


def make_data(config):
    """Train, test and validation sets of MQAR, each a list of (inputs, labels), one per
    segment (segments), from disjoint seeds: segment i of the three from 2·seed, 2·seed + 1
    and 2^32 + seed, each plus i·2^34 (apart from one another for every seed below 2^31). A
    language model's data (task "lm") are the lab's, which passes them to train."""
    if config.task == "lm":
        raise ValueError("task='lm' is not allowed without its data: the LM experiment "
                         "(python -m experiments --lm, or one model: python -m experiments "
                         "--task=lm ...) reads the corpus and passes it to train")
    return tuple(mqar_split(config, split) for split in ("train", "test", "valid"))


def mqar_split(config, split):
    """One MQAR split of `config` ("train", "test" or "valid"), a list of (inputs, labels),
    one per segment: make_data says the seeds."""
    seed = {"train": 2 * config.seed, "test": 2 * config.seed + 1,
            "valid": 2**32 + config.seed}[split]
    return [multiquery_ar(examples, config.vocab_size, N, D, config.power_a, config.fillers,
                          seed=seed + i * 2**34)
            for i, (N, D, examples) in enumerate(segments(config, split))]


def train(config, data=None):
    """Train one model; return its record (also written to out_dir as JSON). `data`: its
    (train, test, valid) sets as (inputs, labels) pairs, by default make_data(config).

    Every random draw (the init, dropout, the batch order) comes from generators seeded by
    `seed` (seeded_rng, BatchOrder): a run is the same run alone, in a sweep, or resumed.
    Killed or stopped with Ctrl-C, it continues where it stopped when started again
    (Checkpoints): exactly on the CPU, and on CUDA with `deterministic`, without which some
    CUDA kernels add in an order that changes from run to run. A Ctrl-C during the last step
    finishes the run, then raises KeyboardInterrupt so that the caller stops. On a GPU the
    data sits on the device; `amp` runs the training forward and loss under bfloat16
    autocast (no loss scaling needed) and `compile` through torch.compile; evaluation stays
    float32 and eager. `tf32` and `deterministic` set torch's flags for the run only
    (torch_settings).

    A training loss that is not finite ends the run "diverged", noticed at the next
    evaluation or checkpoint, where the host reads the device anyway (a read every step would
    make it wait for every step): its record's steps are those before that loss, its weights
    and final scores those of the step where it was noticed.
    """
    check_config(config)
    device = resolve_device(config.device)
    start = time.perf_counter()
    # every split, a list of (inputs, labels) per segment (an (inputs, labels) pair alone is
    # one), moves to the device once, so that batches are cut there (on a GPU, no
    # host-to-device copy per step)
    train_set, test, valid = ([(x.to(device), y.to(device)) for x, y in
                               (split if isinstance(split, list) else [split])]
                              for split in (make_data(config) if data is None else data))
    # once, so that no step waits for the device
    positions = [labelled_positions(y) for _, y in train_set]
    with seeded_rng(config.seed, device), torch_settings(config), stop_requests() as stop_requested:
        model = LanguageModel(config).to(device)
        optimizer = make_optimizer(model, config)
        order = BatchOrder(config, device)
        checkpoints = Checkpoints(config, model, optimizer, order, device)
        run = checkpoints.resume()      # step, history, seconds and resumes so far (0 if new)
        forward = torch.compile(model, backend=config.compile) if config.compile else model
        stop = (min(config.max_steps, config.budget_steps) if config.budget_steps
                else config.max_steps)
        bar = tqdm(total=stop, initial=run["step"], desc=run_name(config),
                   disable=not config.progress, leave=False)
        ended = None                                                   # why the run stopped
        # the first step whose loss was not finite (-1: none yet), kept on the device: read
        # every step, it would make the host wait for each step to finish
        nonfinite_at = torch.full((), -1, device=device)
        try:
            for step, segment, rows in order.batches(run["step"]):
                lr = lr_at(step, config)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                (x, y), where = train_set[segment], positions[segment]
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.amp):
                    loss, _, _ = labelled_loss(forward, x[rows], y[rows], where[rows])
                    loss = loss + model.aux_loss()
                nonfinite_at = torch.where((nonfinite_at < 0) & ~torch.isfinite(loss), step,
                                           nonfinite_at)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.grad_clip > 0:
                    nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                # the step is taken: evaluate now and then, decide whether to stop, checkpoint;
                # a loss that was not finite is read before an evaluation or a checkpoint (the
                # host waits for the device there anyway), so that no checkpoint holds a
                # diverged model
                run["step"] = step + 1
                bar.update(1)
                evaluating = run["step"] % config.eval_every == 0 or run["step"] == stop
                asked = stop_requested()
                saving = checkpoints.due(run, asked)
                if (evaluating or saving) and int(nonfinite_at) >= 0:
                    ended, run["step"] = "diverged", int(nonfinite_at)
                    print(f"the loss was not finite at step {run['step']} (lr "
                          f"{lr_at(run['step'], config):.3g}); stopping: try a lower --lr",
                          file=sys.stderr)
                    break
                if evaluating:
                    scores = evaluation(model, valid, test, config, final=run["step"] == stop)
                    run["history"].append({"step": run["step"], "loss": loss.item(), **scores,
                                           "seconds": round(checkpoints.seconds(run), 2)})
                    shown = scores.get("valid_acc", scores.get("valid_probe"))
                    bar.set_postfix(loss=f"{loss.item():.3f}",
                                    valid="-" if shown is None else f"{shown:.3f}")
                ended = stopping_reason(run, config, stop, asked)
                if saving and ended in (None, "interrupted"):   # any other end: a record follows
                    checkpoints.save(run)
                if ended:
                    break
        except KeyboardInterrupt:                  # a second Ctrl-C: the last checkpoint stands
            ended = "interrupted"
        finally:
            bar.close()
        run["train_time"] = checkpoints.seconds(run)
        # the final model's scores on the whole splits: those of the last evaluation if it
        # scored them after the last step (a run that stopped on the target or at the end)
        last = run["history"][-1] if run["history"] else {}
        whole = {"test_acc", "valid_acc"} if config.num_valid else {"test_acc"}
        final = (last if last.get("step") == run["step"] and whole <= last.keys()
                 else evaluation(model, valid, test, config, final=True))
        selection = selected_rows(model, *test[0])       # (random rows: the run's generator)
        asked = stop_requested()       # also a Ctrl-C during the last step or evaluation
    record = make_record(config, model, run, ended, final, selection, device,
                         wall_time=time.perf_counter() - start)
    save_run(record, model, config)
    if ended == "interrupted" or asked:    # asked: finished all the same, but stop the caller
        raise KeyboardInterrupt
    return record


def stopping_reason(run, config, stop, asked):
    """Why a run stops after its latest step, or None: its evaluation there put validation
    accuracy above target_acc ("target_reached"; never the test split), it was the last
    step ("max_steps", or "budget_steps" when budget_steps cut the schedule), or a Ctrl-C
    was `asked` ("interrupted")."""
    last = run["history"][-1] if run["history"] else {}
    if last.get("step") == run["step"] and last.get("valid_acc", 0.0) > config.target_acc:
        return "target_reached"
    if run["step"] >= stop:
        return "max_steps" if stop == config.max_steps else "budget_steps"
    return "interrupted" if asked else None


class BatchOrder:
    """Which training rows each step takes, each batch from one segment (segments): epoch
    after epoch, each segment's rows in a permutation from a generator seeded by the run's
    seed (shuffle) or in order, cut into batches (a segment's last one may be partial); the
    batches segment after segment, the same order every epoch (the official order:
    zoology/data/utils.py, `_SyntheticDataset` under a DataLoader that does not shuffle),
    or, shuffled with several segments, in a new order of all of them every epoch. With
    segment_passes = k > 1, a curriculum: each segment k passes (a new permutation each, if
    shuffle) before the next, in order. A run continued from state(step) draws the same
    batches."""

    def __init__(self, config, device):
        self.config, self.device = config, device
        self.sizes = [examples for _, _, examples in segments(config, "train")]
        self.generator = torch.Generator().manual_seed(config.seed)

    def batches(self, step):
        """(step, segment, the rows of its batch in that segment, on the device) from `step`
        on, without end."""
        config, B = self.config, self.config.batch_size
        while True:
            self.drawn_from = self.generator.get_state()   # this epoch's permutations' origin
            passes = [s for s in range(len(self.sizes)) for _ in range(config.segment_passes)]
            perms = [torch.randperm(self.sizes[s], generator=self.generator) if config.shuffle
                     else torch.arange(self.sizes[s]) for s in passes]
            cuts = [(p, start) for p, s in enumerate(passes)
                    for start in range(0, self.sizes[s], B)]
            if config.shuffle and len(self.sizes) > 1 and config.segment_passes == 1:
                cuts = [cuts[i] for i in torch.randperm(len(cuts), generator=self.generator)]
            # to the device once an epoch, each batch a slice there: a copy from pageable
            # host memory waits for the device to finish its queued work (CUDA Runtime API,
            # "API synchronization behavior"), a non_blocking one from pinned memory does not
            # (PyTorch, "A guide on good usage of non_blocking and pin_memory()")
            pinned = self.device.type == "cuda"
            perms = [(p.pin_memory() if pinned else p).to(self.device, non_blocking=pinned)
                     for p in perms]
            for p, start in cuts[step % len(cuts):]:                  # resumed: mid-epoch
                yield step, passes[p], perms[p][start:start + B]
                step += 1

    def state(self, step):
        """The generator's state from where the permutation of the epoch that continues
        after `step` steps is drawn: at an epoch's end the generator as it is now (the next
        permutation is drawn from there), within an epoch where this epoch's was drawn."""
        return (self.generator.get_state() if step % steps_per_epoch(self.config) == 0
                else self.drawn_from)


class Checkpoints:
    """The checkpoint of a run beside its record (suffix .ckpt): identity, weights,
    optimizer, RNG states, batch order, step, history, seconds; written atomically at every
    epoch's end and every `checkpoint_every` seconds, and deleted once the record is written.

    Ctrl-C ends the step in flight, then writes a checkpoint and a record that says
    "interrupted"; a second Ctrl-C abandons the step (the last checkpoint stands). Started
    again with the same settings, a run continues exactly: the same batches, dropout masks
    and weights as a run never stopped, on the same device type and thread count (a
    checkpoint of another device type is refused: its random streams are not this one's).
    That holds on the CPU always, and on CUDA only with deterministic=True (on the same GPU
    model): without it some CUDA kernels add with atomics in an order that changes from run
    to run (attention's memory-efficient and flash backward, scatter_add_ and so gather's
    backward: torch.use_deterministic_algorithms's docs), so a continued run matches one
    never stopped only to rounding, and drifts from it as it trains. On mps it is not
    checked."""

    def __init__(self, config, model, optimizer, order, device):
        self.config, self.model, self.optimizer, self.order, self.device = (
            config, model, optimizer, order, device)
        self.path = record_path(config).with_suffix(".ckpt")

    def resume(self):
        """The run so far: new (step 0), or its checkpoint's run, with the model, optimizer
        and generators loaded from it and this resume noted."""
        run = dict(step=0, history=[], train_time=0.0, resumed=[])
        if self.path.exists():
            run = self.load()
            run["resumed"].append({"step": run["step"], **provenance(self.device)})
        self.segment_start = self.last_save = time.perf_counter()
        return run

    def seconds(self, run):
        """The run's training seconds over every segment: the earlier ones and this one."""
        return run["train_time"] + time.perf_counter() - self.segment_start

    def due(self, run, asked):
        """Whether a checkpoint is due after the run's latest step: at an epoch's end, every
        checkpoint_every seconds, or when a Ctrl-C was `asked` (train writes none when the
        run has ended otherwise: its record follows)."""
        config = self.config
        return (run["step"] % steps_per_epoch(config) == 0 or asked or
                0 < config.checkpoint_every < time.perf_counter() - self.last_save)

    def save(self, run):
        """Write the checkpoint of `run`, its training seconds counted up to now."""
        run = {**run, "train_time": self.seconds(run)}
        rng = {"cpu": torch.get_rng_state()}           # the generators a run draws from
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        elif self.device.type == "mps":
            rng["mps"] = torch.mps.get_rng_state()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"identity": identity(self.config), "device": self.device.type,
                    "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "rng": rng, "order": self.order.state(run["step"]), "run": run},
                   self.path.with_suffix(".ckpt.tmp"))
        self.path.with_suffix(".ckpt.tmp").replace(self.path)
        self.last_save = time.perf_counter()

    def load(self):
        path, device = self.path, self.device
        state = torch.load(path, map_location=device, weights_only=True)
        if state["identity"] != identity(self.config):
            raise ValueError(f"{path} is the checkpoint of another run ({state['identity']}); "
                             "move it away to start this run afresh")
        if state["device"] != device.type:
            raise ValueError(f"{path} was written on {state['device']} and this run is on "
                             f"{device.type}: continue it with --device={state['device']}, or "
                             "move the checkpoint away to start the run afresh")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["cpu"].cpu())
        if "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"].cpu(), device)
        if "mps" in state["rng"]:
            torch.mps.set_rng_state(state["rng"]["mps"].cpu())
        self.order.generator.set_state(state["order"].cpu())
        return state["run"]


@contextlib.contextmanager
def seeded_rng(seed, device):
    """Seed torch's CPU generator and `device`'s (cuda or mps) with `seed` for the block, and
    give the caller's states of both back after it; no other generator is touched."""
    kind = device.type if device.type in ("cuda", "mps") else None
    with torch.random.fork_rng(devices=[device.index or 0] if kind else [],
                               device_type=kind or "cuda"):
        torch.default_generator.manual_seed(seed)
        if kind == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        elif kind == "mps":
            torch.mps.manual_seed(seed)
        yield


@contextlib.contextmanager
def torch_settings(config):
    """torch's process-wide flags as the run's settings say, for the block; the caller's
    back after it.

    tf32: torch.backends.cuda.matmul.allow_tf32, float32 matrix products by cuBLAS in TF32
    (nothing on a CPU or mps; cuDNN's convolutions, which no mixer here uses, default to
    TF32 already). This flag, not the newer torch.backends.cuda.matmul.fp32_precision: once
    that one is set, torch.get_float32_matmul_precision(), which torch.compile's inductor
    reads, raises (the two APIs mixed).
    deterministic: torch.use_deterministic_algorithms, a deterministic kernel for every op
    that has one and an error for one that has none (its docs list both). On CUDA it makes
    attention's backward deterministic: scaled_dot_product_attention's flash and
    memory-efficient backwards run their deterministic forms and cuDNN's, which has none, is
    not chosen (aten/src/ATen/native/transformers/cuda/attention_backward.cu, sdp_utils.cpp),
    so no backend needs forcing; and scatter_add_, gather's backward, index_add and
    index_select's backward take deterministic kernels. cuBLAS needs nothing more: torch
    gives each handle and stream a workspace of its own, which is what cuBLAS's "Results
    reproducibility" asks (pytorch/pytorch#161749 dropped torch's CUBLAS_WORKSPACE_CONFIG
    requirement).
    """
    tf32 = torch.backends.cuda.matmul.allow_tf32
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    torch.backends.cuda.matmul.allow_tf32 = config.tf32
    torch.use_deterministic_algorithms(config.deterministic)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])


@contextlib.contextmanager
def stop_requests():
    """Ctrl-C (SIGINT) as a request: the block polls the function it gets to see whether a
    stop was asked for; a second Ctrl-C raises KeyboardInterrupt at once. Outside the main
    thread (where Python delivers no signal) nothing is asked."""
    asked = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def handler(signum, frame):
        if asked:
            raise KeyboardInterrupt
        asked.append(signum)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(asked)
    finally:
        signal.signal(signal.SIGINT, previous)


# ----------------------------------------------------------------------------------------
# the record: what names a run (identity), what its record holds, where and how it is written

# A new setting whose default keeps the old behaviour changes no identity; changing what a
# default means must bump the schema, which renames every run. Schema 2: early stopping
# reads the validation split (num_valid 1000 by default).
RECORD_SCHEMA = 2
NOT_IDENTITY = ("out_dir", "progress", "label", "save_model", "checkpoint_every")


def identity(config):
    """What makes two runs the same run: the schema and every setting that differs from its
    default, but those of NOT_IDENTITY (where and how a run goes, not what it is)."""
    default = Config()
    return json.dumps({"schema": RECORD_SCHEMA, **{
        k: v for k, v in dataclasses.asdict(config).items()
        if k not in NOT_IDENTITY and v != getattr(default, k)}}, sort_keys=True)


def run_name(config):
    """A readable, unique file name: the key settings and a hash of `identity`."""
    digest = hashlib.sha1(identity(config).encode()).hexdigest()
    mixer = ",".join(_readable(entry) for entry in config.mixer.split(","))
    mixer = mixer.replace(",", "+").replace(":", "-").replace("=", "")
    if len(mixer) > 140:   # a long stack (a file name has at most 255 bytes): a repeated
        runs = itertools.groupby(mixer.split("+"))      # layer once with its count, and cut
        mixer = "+".join(f"{n}x{k}" if n > 1 else k
                         for k, n in ((k, len(list(g))) for k, g in runs))[:120]
    task = f"D{config.num_kv_pairs}" if config.task == "mqar" else config.task
    return (f"{mixer}-N{config.seq_len}-{task}-d{config.d_model}-lr{config.lr:g}-"
            f"s{config.seed}-{digest[:8]}")


def _readable(entry):
    """A mixer entry as a run's name shows it: a mixer of your own by its file's (or
    module's) name and class, no folder and no character a file name cannot hold."""
    name, texts = split_mixer(entry)
    if not is_outside(name):
        return entry
    source, _, cls = name.rpartition(":")
    return ":".join([re.sub(r"[^\w.-]", "_", Path(source).name), cls, *texts])


def record_path(config):
    """Where the record of `config`'s run goes: out_dir/run_name.json."""
    return Path(config.out_dir) / f"{run_name(config)}.json"


@torch.no_grad()
def selected_rows(model, inputs, labels, batch_size=256):
    """For each layer that selects rows (its attribute `selected`: Section 5's selective
    attention), over (inputs, labels) in eval mode: the mean rows kept per example ("rows"),
    the share of queries among them ("queries") and of queries kept ("coverage")."""
    layers = [b.mixer for b in model.blocks if hasattr(b.mixer, "selected")]
    if not layers:
        return []
    model.eval()
    kept = [[] for _ in layers]
    for i in range(0, len(inputs), batch_size):
        model(inputs[i:i + batch_size])
        for k, layer in zip(kept, layers):
            k.append(layer.selected != 0)
    model.train()
    queries = labels != IGNORE
    stats = []
    for k in kept:
        k = torch.cat(k)
        hits = int((k & queries).sum())
        stats.append({"rows": int(k.sum()) / len(k), "queries": hits / int(k.sum()),
                      "coverage": hits / int(queries.sum())})
    return stats


def make_record(config, model, run, ended, final, selection, device, wall_time):
    """A run's record: settings, final scores, steps, how it ended, times, parameters,
    provenance, history; Section 5's selection statistics and its resumes, if any."""
    record = {
        "schema": RECORD_SCHEMA, "config": dataclasses.asdict(config),
        "test_acc": final["test_acc"], "steps": run["step"], "ended": ended,
        "train_time_s": round(run["train_time"], 2), "wall_time_s": round(wall_time, 2),
        "seed": config.seed, "n_params": sum(p.numel() for p in model.parameters()),
        **provenance(device), "history": run["history"],
    }
    record.update({k: final[k] for k in ("test_seq_acc", "test_slices", "valid_acc",
                                         "valid_seq_acc", "valid_loss", "valid_slices")
                   if k in final})
    if selection:
        record["selection"] = selection        # one entry per selective-attention layer
    if run["resumed"]:
        record["resumed"] = run["resumed"]     # where it continued, and what ran it there
    return record


def save_run(record, model, config):
    """Write the weights (if save_model), then the record, then delete the checkpoint unless
    the run was interrupted (the same command continues it)."""
    path = record_path(config)
    if config.save_model:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path.with_suffix(".pt.tmp"))
        path.with_suffix(".pt.tmp").replace(path.with_suffix(".pt"))
    save_record(record, path)
    if record["ended"] != "interrupted":
        path.with_suffix(".ckpt").unlink(missing_ok=True)


def finished_record(config):
    """The record of `config`'s run if it has finished (ended any way but "interrupted"),
    else None: a finished run is never run again."""
    path = record_path(config)
    record = json.loads(path.read_text()) if path.exists() else None
    return record if record and record["ended"] != "interrupted" else None


def provenance(device):
    """What produced a record: git commit, whether mixers.py, mqar.py or train.py differed
    from it (None outside a git checkout), torch, device and threads."""
    here = Path(__file__).resolve().parent
    git = lambda *args: subprocess.run(["git", *args], cwd=here, capture_output=True,
                                       text=True, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--", "mixers.py", "mqar.py", "train.py"))
    except (OSError, subprocess.CalledProcessError):
        commit = dirty = None
    return {"git_commit": commit, "git_dirty": dirty, "torch": str(torch.__version__),
            "device": str(device), "threads": torch.get_num_threads()}


def save_record(record, path):
    """Write atomically (temporary file, then rename): a killed run leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)


# ----------------------------------------------------------------------------------------
# one run from the command line, or COUNT seeds of it and the line that summarizes them

def run_command(flags, rest, presets=None, data=None):
    """--key=value ... [--seeds=COUNT]: one run (or COUNT seeds, then a summary line), its
    settings make_config(presets, rest), its data data(config) (None: make_data's). Returns
    the exit status."""
    n_seeds = _positive_flag(flags, "seeds", 1)
    config = make_config(presets=presets, **parse_arguments(rest))
    records = []
    for seed in range(config.seed, config.seed + n_seeds):
        run = config.replace(seed=seed)
        path, done = record_path(run), finished_record(run)
        if done:                                     # a run's record is written once
            print(f"already run: {path} (ended {done['ended']}); delete it to run again")
            records.append(done)
            continue
        try:
            records.append(train(run, data(run) if data else None))
        except KeyboardInterrupt:
            print(f"interrupted; record written to {path}", file=sys.stderr)
            return 130
        print(f"record: {path}")
    print(runs_table(records))
    if n_seeds > 1:
        print(summarize(records))
    return 0


def _positive_flag(flags, key, default):
    """The integer >= 1 of flag --key (default when absent), or a ValueError naming it."""
    value = _parse_value(key, flags.get(f"--{key}", str(default)), int)
    if value < 1:
        raise ValueError(f"--{key}={value} is not allowed: {key} must be an integer >= 1")
    return value


def summarize(records):
    """One line over runs that differ only in seed: how many passed the target, the median
    and range of their steps and seconds (a run that never passed counts as longer than any
    that did, printed "> n", n its last step)."""
    def spread(values, finished):
        ranked = sorted(zip([not f for f in finished], values))   # unfinished runs last
        n = len(ranked)
        show = lambda i: ("> " if ranked[i][0] else "") + f"{ranked[i][1]:g}"
        median = (show(n // 2) if n % 2 or ranked[n // 2][0]     # odd n, or a middle one unfinished
                  else f"{(ranked[n // 2 - 1][1] + ranked[n // 2][1]) / 2:g}")
        return f"median {median} (min {show(0)}, max {show(n - 1)})"
    finished = [r["ended"] == "target_reached" for r in records]
    return (f"{sum(finished)}/{len(records)} runs passed validation accuracy "
            f"{records[0]['config']['target_acc']}; steps "
            f"{spread([r['steps'] for r in records], finished)}; training seconds "
            f"{spread([r['train_time_s'] for r in records], finished)}")


def budget_text(records):
    """The task and training budget of `records`, each distinct value listed: "c = 512, at
    most 8,000 steps of 128 examples" (at most: a run stops early at its target_acc)."""
    steps = lambda config: (config["budget_steps"]
                            if 0 < config["budget_steps"] < config["max_steps"]
                            else config["max_steps"])
    vocab = ", ".join(map(str, sorted({r["config"]["vocab_size"] for r in records})))
    budgets = sorted({(steps(r["config"]), r["config"]["batch_size"]) for r in records})
    return f"c = {vocab}, at most " + ", ".join(f"{s:,} steps of {b:,}"
                                                  for s, b in budgets) + " examples"


def seeds_text(records):
    """"seed 0" or "seeds 0, 1, 2": the seeds of `records`."""
    seeds = sorted({r["seed"] for r in records})
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


# ----------------------------------------------------------------------------------------
# tables and figures of records: Markdown as the README shows it (a test compares), one
# colour per model; the lab draws its own with these (experiments/figures.py)

def model_color(label, colors):
    """The colour of a model, the same in every figure: colors[label] (0-19 tab20, 20-39
    tab20b); a label not in `colors` takes one of the colours none of them has, by its name."""
    import matplotlib
    spare = sorted(set(range(40)) - set(colors.values()))
    index = colors.get(label, spare[zlib.crc32(label.encode()) % len(spare)])
    return matplotlib.colormaps["tab20" if index < 20 else "tab20b"](index % 20)


def wrapped(text, width_in, fontsize=9):
    """`text` with each line broken between words to fit `width_in` inches at `fontsize`
    points in matplotlib's default font, so that no title is clipped."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath
    width = lambda s: TextPath((0, 0), s, size=fontsize, prop=FontProperties()).get_extents().width
    lines = []
    for line in text.split("\n"):
        words = line.split(" ")
        lines.append(words[0])
        for word in words[1:]:
            if width(f"{lines[-1]} {word}") > 0.92 * 72 * width_in:
                lines.append(word)
            else:
                lines[-1] += f" {word}"
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot, drawing to files only (the Agg backend: no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path):
    """Lay out, write and close `fig`; returns `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


ENDED = {"target_reached": "target", "max_steps": "max_steps", "budget_steps": "budget",
         "diverged": "diverged", "interrupted": "interrupted"}


def markdown(header, rows):
    """A Markdown table: the header, its rule, one line per row."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(map(str, row)) + " |" for row in lines)


def acc_text(value):
    """An accuracy as the tables print it: three decimals, no leading zero (.993, 1.000)."""
    return f"{value:.3f}".removeprefix("0")


def examples_seen(config, steps):
    """Training examples the first `steps` steps drew: each whole epoch all of them, and
    within the last one the batches of the official order (batch_sizes; a shuffled mixture's
    differs from it by its partial batches only)."""
    sizes = batch_sizes(config)
    epochs, rest = divmod(steps, len(sizes))
    return epochs * sum(sizes) + sum(sizes[:rest])


def runs_table(records, order=None, curves=False):
    """One row per run: model (label, else mixer), N, D, d, steps (examples), how it ended,
    test and validation accuracy, training seconds; with `curves` the test accuracy at each
    evaluation (a probe's starred). Rows by `order` ({label: rank}), label, mixer, N, d, seed."""
    order = order or {}
    key = lambda r: (order.get(r["config"]["label"], len(order)), r["config"]["label"],
                     r["config"]["mixer"], r["config"]["seq_len"], r["config"]["d_model"],
                     r["seed"])
    header = ["model", "N", "D", "d", "seed", "steps (examples)", "ended", "test acc",
              "valid acc", "training s"]
    if curves:
        header.insert(7, "test accuracy at each evaluation")
    table = []
    for r in sorted(records, key=key):
        config = Config(**r["config"])
        row = [config.label or config.mixer, config.seq_len, config.num_kv_pairs,
               config.d_model, config.seed,
               f"{r['steps']:,} ({examples_seen(config, r['steps']):,})", ENDED[r["ended"]],
               acc_text(r["test_acc"]), acc_text(r["valid_acc"]) if "valid_acc" in r else "–",
               f"{r['train_time_s']:.0f}"]
        if curves:
            row.insert(7, " ".join(acc_text(e["test_acc"]) if "test_acc" in e
                                   else acc_text(e["test_probe"]) + "*" for e in r["history"]))
        table.append(row)
    return markdown(header, table)


CURVE_STYLES = ("-", "--", "-.", (0, (5, 1, 1, 1, 1, 1)))   # dotted (":") is the paper's


def plot_curves(records, path, scale, reference, name, colors):
    """Test accuracy against examples seen, one line per run (a probe's score hollow), one
    colour per model (model_color of `colors`), one line style and marker per cell (N, D,
    d); the paper's value of a run's cell, reference(config) (None: none), dotted in its
    colour. The title names the runs (`name`), their `scale`, budget and seeds."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    shape = lambda config: (config["seq_len"], config["num_kv_pairs"], config["d_model"])
    model = lambda config: config["label"] or config["mixer"]
    labels = sorted({model(r["config"]) for r in records})
    shapes = sorted({shape(r["config"]) for r in records})
    style = lambda s: dict(ls=CURVE_STYLES[shapes.index(s) % len(CURVE_STYLES)],
                           marker="os^vDx"[shapes.index(s) % 6])
    fig, ax = plt.subplots(figsize=(8, 4))
    papers = {}
    for r in sorted(records, key=lambda r: (model(r["config"]), shape(r["config"]))):
        config, h = r["config"], r["history"]
        label, color = model(config), model_color(model(config), colors)
        x = [e["step"] * config["batch_size"] for e in h]
        stopped = r["ended"] == "interrupted"            # unfinished: faint, and said so
        ax.plot(x, [e.get("test_acc", e.get("test_probe")) for e in h], color=color, ms=3,
                alpha=0.4 if stopped else 1.0, **style(shape(config)),
                label="{} N={} D={} d={}".format(label, *shape(config))
                      + (" (interrupted)" if stopped else ""))
        probes = [(xe, e["test_probe"]) for xe, e in zip(x, h) if "test_acc" not in e]
        if probes:                               # a probe's score: hollow
            ax.plot(*zip(*probes), ls="", marker=style(shape(config))["marker"], ms=3,
                    color="white", markeredgecolor=color)
        paper = reference(Config(**config))
        if paper is not None:
            papers[label, shape(config)] = paper, color
    handles = [Line2D([], [], color=model_color(label, colors), lw=2, label=label)
               for label in labels]
    handles += [Line2D([], [], color="0.3", ms=3, label="N={} D={} d={}".format(*s), **style(s))
                for s in shapes]
    for (label, (N, D, d)), (paper, color) in papers.items():
        handles.append(ax.axhline(paper, color=color, ls=":", lw=1.2,
                                  label=f"the paper: {label} N={N} D={D} d={d}, {paper:.2f}"))
    ax.set(xlabel="training examples seen", ylabel="test accuracy", ylim=(0, 1.02))
    ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1),
              ncol=1 if len(handles) <= 24 else 2)
    counts = lambda key, runs: ", ".join(f"{n:,}" for n in sorted({r["config"][key]
                                                                     for r in runs}))
    probed = [r for r in records if any("test_acc" not in e for e in r["history"])]
    full = f"all {counts('num_test', records)} test examples"
    notes = [f"hollow: the first {counts('eval_probe', probed)} test examples (a probe); "
             f"filled: {full}" if probed else f"every point: {full}"]
    if papers:
        notes.append(f"dotted: {PAPER_FIG2_SOURCE}")
    if any(r["ended"] == "interrupted" for r in records):
        notes.append("faint: an interrupted run, unfinished (the same command continues it)")
    fig.suptitle(wrapped(f"{name} at {scale}, MQAR: "
                         f"{budget_text(records)}, {seeds_text(records)}\n" + "; ".join(notes),
                         fig.get_figwidth()), fontsize=9)
    return save_figure(fig, path)


# ----------------------------------------------------------------------------------------
# the main job: the paper's point in miniature (python train.py)

# At one small width, d = 64, attention solves MQAR (N = 64, D = 4) and BaseConv, the paper
# form of Figure 2's stack (a short then a long convolution), does not, each for at most
# 1,000 steps of 128: the lab's sweep "main" (experiments/) is these two runs.
BASE_CONV = "base_conv:kernel_size=3,base_conv"
MAIN_MODELS = {"attention": "attention", "base_conv": BASE_CONV}
MAIN_STEPS = 1000
MAIN_COLORS = {"attention": 0, "base_conv": 2}      # model_color's; the lab's figures extend it
# Figure 2's accuracy at N = 64, d = 64 for the two, read off the plot (± 0.03), dotted
MAIN_FIGURE2 = {"attention": 0.99, "base_conv": 0.69}
PAPER_FIG2_SOURCE = "the paper's Figure 2 (c = 8192, its own budget; read off the plot, ± 0.03)"


def main_job(folder="results/runs/main"):
    """Train the two runs of MAIN_MODELS (afresh, or from a checkpoint of its own), print
    their table and draw their curves to <folder>.png; returns the records. The default
    folder is one git ignores: the committed results/main/ stays the README's (python -m
    experiments --sweep=main)."""
    records = []
    Path(folder).mkdir(parents=True, exist_ok=True)
    for label, mixer in tqdm(MAIN_MODELS.items(), desc="main (cpu)", unit="run"):
        records.append(train(make_config(label=label, mixer=mixer, out_dir=folder,
                                         max_steps=MAIN_STEPS)))
    print(runs_table(records, {label: i for i, label in enumerate(MAIN_MODELS)}))
    reference = lambda config: (MAIN_FIGURE2.get(config.label)
                                if (config.seq_len, config.d_model) == (64, 64) else None)
    path = plot_curves(records, folder + ".png", "cpu scale", reference, Path(folder).name,
                       MAIN_COLORS)
    print(f"wrote {path}")
    return records


# ----------------------------------------------------------------------------------------
# the command line: the main job, one run, or COUNT seeds of it

def main(argv):
    """The command line: the main job (no arguments), one run (--key=value ...), or
    --seeds=COUNT runs. Returns the exit status: 2 for a bad argument, 130 for Ctrl-C."""
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        for f in dataclasses.fields(Config):
            print(f"  --{f.name}={getattr(Config(), f.name)}")
        return 0
    try:
        if not argv:
            main_job()
            return 0
        flags = {a.split("=", 1)[0]: a.partition("=")[2] for a in argv if a.startswith("--seeds=")}
        return run_command(flags, [a for a in argv if not a.startswith("--seeds=")])
    except ValueError as e:                  # a bad argument or setting
        print(f"train.py: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the finished runs' records are written, the unfinished runs "
              "checkpointed; the same command continues", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
