"""The lab's tests: test_all.py's properties on the official forms, the committed records and
the READMEs' results tables, then each module of experiments/ in sections: official, common,
figure2, figure6, frontier, lm, bench, cli. The helpers, cases and settings they share with the
six files' tests are test_all.py's, imported from it (pytest puts the repository's root on the
path, as the rootdir of this package).

Run with `python -m pytest -q test_all.py experiments/test_lab.py` (`make test`). Symbols,
seeds and tolerances as in test_all.py.
"""
import contextlib
import dataclasses
import functools
import itertools
import json
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import matplotlib
import matplotlib.colors
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import mixers
import mqar
import test_all
import train
from experiments import (bench, cli, common, figure2, figure6, figures, frontier, gpu_check, lm,
                         official, presets, protocols)
from mqar import multiquery_ar
from test_all import (F64, GLA_SOURCE, REPO, assert_the_copy_runs_as_the_module, case_ids,
                      make_mixer, model_steps, perturb_, readme_section, small_config, small_model)

# the lab's command line, from any folder: python -m experiments with this repository on the path
LAB = [sys.executable, "-m", "experiments"]
LAB_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


# ----------------------------------------------------------------------------------------
# experiments/official.py: test_all.py's mixer properties on the official forms, over
# OFFICIAL_CASES

# the official forms (form=official: experiments/official.py), each with the options that
# change the code path it takes, for the properties test_all.py checks over CASES
OFFICIAL_CASES = [
    ("base_conv", dict(form="official")), ("base_conv", dict(form="official", kernel_size=3)),
    ("base_conv", dict(form="official", filter="explicit")),
    ("hyena", dict(form="official")),
    ("h3", dict(form="official", head_dim=2, d_state=24)),
    ("rwkv", dict(form="official", layer_idx=1)),
    ("selective_attention", dict(form="official", inference="threshold")),
]


@pytest.mark.parametrize("name,kw", OFFICIAL_CASES, ids=case_ids(OFFICIAL_CASES))
def test_every_official_form_keeps_the_mixer_contract(name, kw):
    """test_every_mixer_keeps_the_mixer_contract over OFFICIAL_CASES: every part of
    check_mixer passes on each official form."""
    test_all.test_every_mixer_keeps_the_mixer_contract(name, kw)


@pytest.mark.parametrize("name,kw", OFFICIAL_CASES, ids=case_ids(OFFICIAL_CASES))
def test_official_form_fast_equals_reference(name, kw, monkeypatch):
    """test_mixer_fast_equals_reference over OFFICIAL_CASES: outputs and gradients, with
    even short filters through the FFT."""
    test_all.test_mixer_fast_equals_reference(name, kw, monkeypatch)


@pytest.mark.parametrize("name,kw", OFFICIAL_CASES, ids=case_ids(OFFICIAL_CASES))
def test_no_fft_of_an_official_form_receives_half_precision_under_autocast(name, kw):
    """test_no_fft_receives_half_precision_under_autocast over OFFICIAL_CASES: under bfloat16
    autocast, every torch.fft call of an official form gets float32 or wider (cuFFT has no
    bfloat16 transform, and CUDA autocast casts nothing for torch.fft)."""
    test_all.test_no_fft_receives_half_precision_under_autocast(name, kw)


@pytest.mark.parametrize("name,kw", OFFICIAL_CASES, ids=case_ids(OFFICIAL_CASES))
def test_float32_forward_and_backward_of_an_official_form_make_no_float64(name, kw):
    """test_float32_forward_and_backward_make_no_float64 over OFFICIAL_CASES: no float64 or
    complex128 tensor (an Apple GPU has neither) in an official form's float32 forward and
    backward."""
    test_all.test_float32_forward_and_backward_make_no_float64(name, kw)


def test_an_official_form_loads_the_lab_only_when_a_run_asks_for_it():
    """A mixer's official form (form=official) loads experiments/official.py by its name, as
    a mixer of your own loads, only when a run asks for it (importing mixers.py, mqar.py,
    train.py and theory.py loads nothing of the lab), and builds the same class the lab
    imports."""
    code = ("import sys, mixers, mqar, train, theory\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'experiments'))\n"
            "m = mixers.build_mixer('base_conv', 8, 8, form='official')\n"
            "from experiments import official\n"
            "print(type(m) is official.OfficialBaseConv)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stderr


@pytest.mark.parametrize("name", mixers.OFFICIAL_FORMS)
def test_an_official_form_provides_the_interface(name, monkeypatch):
    """test_a_registered_mixer_provides_the_interface on each official form: a class of its
    own, not the paper's, with its case in OFFICIAL_CASES (in place of CASES)."""
    monkeypatch.setattr(test_all, "CASES", OFFICIAL_CASES)
    test_all.test_a_registered_mixer_provides_the_interface(name, "official")


@pytest.mark.parametrize("cls", [mixers.mixer_class(name, "official")
                                 for name in mixers.OFFICIAL_FORMS],
                         ids=lambda cls: cls.__name__)
def test_an_official_form_copied_as_its_docstring_says_runs_as_the_module_does(cls):
    """test_a_mixer_copied_as_its_docstring_says_runs_as_the_module_does on the official
    forms, which copy from mixers.py and experiments/official.py (in that order)."""
    # the official selection's default rule (top-k of the whole sequence) has no step
    options = {"inference": "threshold"} if cls is official.OfficialSelectiveAttention else {}
    assert_the_copy_runs_as_the_module(cls, (mixers, official), **options)


def test_an_official_form_s_bad_argument_is_named():
    """test_bad_arguments_name_the_argument on an option an official form refuses."""
    test_all.test_bad_arguments_name_the_argument(
        "base_conv", dict(form="official", filter="learned"), "filter='learned'")


def test_gpt2_init_of_the_official_hyena_is_the_official_init_weights():
    """The official Hyena (form=official) under init="gpt2": every Linear N(0, 0.02), biases 0,
    its implicit filter's included; its out_proj N(0, 0.02/√(2L)), not H3's; its bias, not a
    Linear, keeps its N(0, 1) (test_gpt2_init_is_the_official_init_weights: the MLP's)."""
    L = 2
    std = lambda tensor: tensor.std().item()
    m = small_model(1, mixer="hyena:form=official,h3", init="gpt2", d_model=64)[1]
    hyena, h3 = m.blocks[0].mixer, m.blocks[1].mixer
    assert std(hyena.out_proj.weight) == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.1)
    assert std(h3.out_proj.weight) == pytest.approx(0.02, rel=0.1)
    for layer in hyena.long_filter.layers:
        assert std(layer.weight) == pytest.approx(0.02, rel=0.2) and layer.bias.abs().max() == 0
    assert std(hyena.bias) > 0.5, "not a Linear: keeps its N(0, 1)"


# ----------------------------------------------------------------------------------------
# the committed records (results/, the lab's sweeps): what train.py writes today

# two records of f2 (schema 1), one of hybrids and one of fig6, each with its first
# evaluation at step 50. Not RetNet's f2 record: its step-50 loss moves 0.009 with the thread
# count and 0.005 on another x86 CPU (an AVX-512 FP16 Xeon against the one that wrote it),
# the kernels' rounding grown over 50 Adam steps; f2's Hyena moves 2.5e-5 there. These four
# agree to 2e-6 on both CPUs.
REPLAYED_RECORDS = [
    "results/f2/h3-N64-D4-d64-lr0.003-s0-c5e6bb3e.json",
    "results/f2/base_conv-kernel_size3+base_conv-N64-D4-d64-lr0.003-s0-dbc3a661.json",
    "results/hybrids/base_conv-kernel_size3+selective_attention-selectionprogrammatic-N64-D4-"
    "d64-lr0.003-s0-38f1599b.json",
    "results/fig6/sliding_window-window33-N64-D4-d64-lr0.003-s0-aca2af5d.json"]


@pytest.mark.parametrize("name", REPLAYED_RECORDS)
def test_committed_records_are_what_the_code_writes_today(name, tmp_path):
    """Rerun a committed record's config to its first evaluation (50 steps) and compare the
    logged training loss, on the record's number of threads: a change to the data, the init
    or the step since the record was written shows in the fourth decimal or sooner
    (bit-identical on the CPU that wrote them; 2e-5 allows for another CPU's kernels)."""
    record = json.loads((REPO / name).read_text())
    config = train.Config(**record["config"])
    assert Path(name).name == f"{train.run_name(config)}.json"
    first = record["history"][0]
    run = dataclasses.replace(config, budget_steps=first["step"], out_dir=str(tmp_path),
                              progress=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(record.get("threads", 1))  # schema 1 ran on one-thread workers
    try:
        again = train.train(run)["history"][-1]
    finally:
        torch.set_num_threads(threads)
    assert again["step"] == first["step"] == 50
    assert math.isclose(again["loss"], first["loss"], rel_tol=0, abs_tol=2e-5), (
        again["loss"], first["loss"])


def test_every_committed_record_is_named_by_its_run_today():
    """Every folder of records under results/ loads (load_records checks each file name
    against run_name of its config): a change of run_name that renames a committed record,
    as a cut of long stacks' names at 120 characters did to the LM experiment's 4-layer
    records, fails here."""
    folders = {p.parent for p in (REPO / "results").glob("*/*.json")} - {REPO / "results/runs"}
    assert len(folders) >= 15
    for folder in sorted(folders):
        assert common.load_records(folder), folder


def test_a_model_has_one_colour_in_every_figure():
    """model_color: the same for a label every time (also one not listed), the same for the
    two names of one model, different for different listed models, and an unlisted label
    never takes a listed model's colour."""
    listed = {label: figures.model_color(label) for label in figures.MODEL_COLORS}
    key = lambda label: label.lower().replace("_", "")         # BaseConv and base_conv: one
    colours = {key(label): set() for label in listed}
    for label, colour in listed.items():
        colours[key(label)].add(colour)
    assert listed["BaseConv"] == listed["base_conv"]
    assert all(len(shades) == 1 for shades in colours.values()), "one colour for a model's names"
    assert len({colour for shades in colours.values() for colour in shades}) == len(colours), (
        "one per model")
    assert figures.model_color("a new mixer") == figures.model_color("a new mixer")
    assert figures.model_color("a new mixer") not in listed.values()


# ----------------------------------------------------------------------------------------
# the READMEs' results tables: what the lab's commands print from the committed records

# the product's README, then the lab's: every results table of either is a command's output
READMES = ("README.md", "experiments/README.md")


def readmes_text():
    return "\n".join((REPO / name).read_text() for name in READMES)


README_TABLE = re.compile(r"^<!-- python -m experiments --table=(\S+) -->\n((?:\|.*\n?)+)", re.M)


@functools.cache
def printed_table(name):
    """What `python -m experiments --table=NAME` prints from the committed records (once a run)."""
    with contextlib.chdir(REPO):
        return cli.markdown_table(name)


# the README's tables that are not a command's output, by their first column: what files
# hold, what the official code does, the mixers, the sweeps, the bench, the claims (the
# claims' numbers are checked against their sweeps' tables below)
README_TEXT_TABLES = ("file", "what", "`--mixer`", "`--sweep`", "mixer", "claim", "paper claim",
                      "paper claim (Section 4, Claim 1)", "paper claim (appendix F.1, Figure 6)")


def test_readme_results_tables_are_what_the_records_print():
    """Every results table of the READMEs follows `<!-- python -m experiments --table=NAME -->`
    (any other table is one of README_TEXT_TABLES) and is, character for character, what that
    command prints from the committed records: a number changed by hand, or a record that no
    longer gives it, fails here."""
    text = readmes_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and not lines[i - 1].startswith("|"):
            marked = lines[i - 1].startswith("<!-- python -m experiments --table=")
            assert marked or line.split("|")[1].strip() in README_TEXT_TABLES, (i + 1, line)
    tables = README_TABLE.findall(text)
    names = [name for name, _ in tables]
    assert {"main", "every_mixer", "fig2", "fig2_lr", "fig6", "hybrids", "f2", "lm",
            "lm:lr"} <= set(names)
    for name, table in tables:
        assert table.rstrip("\n") == printed_table(name), f"--table={name}"


def test_readme_claim_tables_quote_their_sweeps_tables():
    """Every accuracy a claim table quotes (a number with 3 or 4 decimals in its "here"
    column) is one the README tables of the sweep its row names print (the row's command,
    else the row above's; the mixers' claim table, which has no command column, quotes the
    frontier sweep it follows): a quote left stale by new records, or mistyped, fails here.
    The README quotes no derived number (a difference of two means gives the two means)."""
    text = readmes_text()
    fraction = re.compile(r"(?<![\d.])\d?\.\d{3,4}(?!\d)")
    printed = {}
    for name, _ in README_TABLE.findall(text):
        numbers = {round(float(x), 3) for x in fraction.findall(printed_table(name))}
        printed.setdefault(name.split(":")[0], set()).update(numbers)
    claims = re.findall(r"^(\| (?:paper )?claim .*)\n\|[-|]+\|\n((?:\|.*\n)+)", text, re.M)
    assert len(claims) == 4                  # the README's, and three of the lab's
    quoted = 0
    for header, rows in claims:
        sweep = None if "command" in header else "frontier"
        for row in rows.splitlines():
            cells = row.split("|")
            sweep = re.search(r"--sweep=(\w+)", cells[2]).group(1) if "--sweep=" in cells[2] \
                else sweep
            for number in fraction.findall(cells[3]):
                assert round(float(number), 3) in printed[sweep], (sweep, number, row[:60])
                quoted += 1
    assert quoted > 80


def test_lab_readme_frontier_commands_train_your_mixer_alone(tmp_path):
    """The lab README's "A mixer of your own" puts the README's my_gla.py on the recall
    frontier with two commands (a shell block: the sweep takes too long to run here): the
    plot command names the frontier and the mixer, and the sweep's runs, listed by --dry_run
    in place of --workers, are yours alone, one per cell of the frontier sweep, in the
    frontier's stack and folder."""
    (tmp_path / "my_gla.py").write_text(GLA_SOURCE)
    section = readme_section("experiments/README.md", "A mixer of your own")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    sweep, plot = [line for block in re.findall(r"```shell\n(.*?)```", section, re.S)
                   for line in block.splitlines()]
    assert shlex.split(plot)[3:] == ["--plot=frontier", "--mixer=my_gla.py:GLA"]
    args = [a for a in shlex.split(sweep)[3:] if not a.startswith("--workers")]
    out = subprocess.run([sys.executable, "-m", "experiments", *args, "--dry_run"],
                         capture_output=True, text=True, cwd=tmp_path,
                         env={**env, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    runs = [shlex.split(line) for line in out.stdout.splitlines()]
    cells = common.sweep_runs("frontier", cli.SWEEPS["frontier"], "cpu")
    assert len(runs) == len({(o["seq_len"], o["num_kv_pairs"], o["d_model"]) for _, o in cells})
    assert all("--mixer=base_conv:kernel_size=3,my_gla.py:GLA" in run
               and "--out_dir=results/runs/frontier" in run for run in runs)


# ----------------------------------------------------------------------------------------
# experiments/official.py: the official code's forms, against its forward written out

def conv1d_as_official(m, u, h, bias):
    """What an official nn.Conv1d(d, d, K, groups=d, padding=K-1) returns on u (B, T, d),
    its weight set from our filter h (d, K): PyTorch's conv1d is a cross-correlation, so
    its kernel is h reversed in time (h[:, s] weighs lag s)."""
    d, K = h.shape
    conv = torch.nn.Conv1d(d, d, K, groups=d, padding=K - 1).to(u.dtype)
    with torch.no_grad():
        conv.weight.copy_(h.flip(-1)[:, None, :])
        conv.bias.copy_(bias)
    return conv(u.transpose(1, 2))[..., :u.shape[1]].transpose(1, 2)


def fft_conv_as_official(u, k, skip=1):
    """zoology/mixers/convolution.py's fft_conv on u (B, T, d), k (d, T), transcribed:
    rfft of k over 2T divided by 2T, irfft with norm="forward", then + skip·u (skip = 1:
    fft_conv's + u; skip = its bias (d, 1): Hyena's fftconv_ref)."""
    T = u.shape[1]
    x = u.transpose(1, 2)
    k_f = torch.fft.rfft(k, n=2 * T) / (2 * T)
    y = torch.fft.irfft(torch.fft.rfft(x, n=2 * T) * k_f, n=2 * T, norm="forward")[..., :T]
    return (y + skip * x).transpose(1, 2)


def test_base_conv_official_short_form_is_the_official_layer():
    """zoology/mixers/base_conv.py with kernel_size 3: y = Conv1d(u) ⊙ projection(u) + u."""
    m = make_mixer("base_conv", kernel_size=3, form="official")
    assert isinstance(m.filter, mixers.ExplicitFilter)
    bound = 1 / math.sqrt(3)                 # PyTorch's Conv1d draw: U(±1/√fan_in), fan_in = K
    assert m.filter.h.abs().max() <= bound and m.conv_bias.abs().max() <= bound
    assert m.filter.h.std() > bound / 3, "drawn, not left at zero"
    other = make_mixer("base_conv", kernel_size=3, form="official", filter="implicit")
    assert 0 < other.conv_bias.abs().max() <= bound, "the bias is drawn whatever the filter"
    u = torch.randn(2, 24, 16, dtype=F64)
    y = conv1d_as_official(m, u, m.filter.h, m.conv_bias) * m.proj(u) + u
    assert torch.allclose(m(u), y, atol=1e-12)


def test_base_conv_official_long_form_is_the_official_layer():
    """The long layer: ImplicitLongConvolution (a ReLU MLP over the positional features,
    no decay) through fft_conv, which adds u, gated by the projection, plus u."""
    m = make_mixer("base_conv", form="official")
    assert isinstance(m.filter, mixers.MLPFilter) and not hasattr(m, "conv_bias")
    f = m.filter
    k = (torch.relu(f.z @ f.fc1.weight.T + f.fc1.bias) @ f.fc2.weight.T + f.fc2.bias).T
    assert torch.allclose(f(), k, atol=1e-12)
    u = torch.randn(2, 24, 16, dtype=F64)
    y = fft_conv_as_official(u, k) * m.proj(u) + u
    assert torch.allclose(m(u), y, atol=1e-12)


def test_official_implicit_filter_is_hyenas_filter():
    """zoology/mixers/hyena.py's Filter at Figure 2's settings, transcribed: Linear, Sin,
    Linear, Sin, Linear, Sin (one learned frequency, shared), Linear without bias, times
    exp(-t·|δ|) with δ = linspace(ln(1e-2)/1.5, ln(1e-2)/0.3, d)."""
    d, T = 6, 30
    torch.manual_seed(0)
    f = official.OfficialImplicitFilter(d, T).double()
    with torch.no_grad():
        f.frequency.uniform_(0.5, 2.0)
    assert f.z.requires_grad and len(f.layers) == 3 and f.layers[0].out_features == 64
    a = f.z
    for layer in f.layers:
        a = torch.sin(f.frequency * (a @ layer.weight.T + layer.bias))
    delta = torch.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, d, dtype=F64)
    t = torch.linspace(0, 1, T, dtype=F64)[:, None]
    h = (a @ f.out.weight.T) * torch.exp(-t * delta.abs())
    assert torch.allclose(f(), h.T, atol=1e-12)


def test_hyena_official_form_is_the_official_operator():
    """zoology/mixers/hyena.py's forward, transcribed: in_proj, Conv1d(3·d) with bias,
    x1, x2, v = split; v = v·x1; fftconv_ref: h ∗ v + bias·v; v·x2; out_proj."""
    T, d = 24, 16
    m = make_mixer("hyena", d=d, T=T, form="official")
    u = torch.randn(2, T, d, dtype=F64)
    uc = conv1d_as_official(m, m.in_proj(u), m.short_filter.h, m.short_bias)
    x1, x2, v = uc.split(d, dim=-1)
    v = v * x1
    y = fft_conv_as_official(v, m.long_filter(), m.bias[:, None]) * x2
    assert torch.allclose(m(u), m.out_proj(y), atol=1e-12)
    with pytest.raises(ValueError, match="order=3 is not allowed with form='official'"):
        mixers.build_mixer("hyena", d, T, form="official", order=3)


def test_h3_official_form_is_the_official_layer():
    """zoology/mixers/h3/h3.py's forward (its non-fused path), transcribed at head_dim 2:
    k through the shift kernel plus ssm_k_D·k; kv = k ⊗ v per head as "b d1 d2 h l"; the
    bilinear S4D kernel by FFT plus skip·kv; mul_sum with q; channels in (d2, head) order;
    output_linear. Our shift filter holds the official C with ssm_k_D added to tap 0."""
    T, d, hd = 24, 8, 2
    H = d // hd
    m = make_mixer("h3", d=d, T=T, form="official", head_dim=hd, d_state=24)
    u = torch.randn(2, T, d, dtype=F64)
    q, k, v = (part.transpose(1, 2) for part in m.qkv(u).split(d, dim=-1))   # (B, d, T)
    ssm_k_D = torch.randn(d, dtype=F64)
    shift_C = m.shift_filter.h.clone()
    shift_C[:, 0] -= ssm_k_D
    k_f = torch.fft.rfft(shift_C, n=2 * T) * torch.fft.rfft(k, n=2 * T)
    k = torch.fft.irfft(k_f, n=2 * T)[..., :T] + ssm_k_D[:, None] * k
    dt = m.log_dt.exp()[:, None]
    dtA = dt * torch.complex(-m.log_neg_A_re.exp(), m.A_im)                 # (H, modes)
    Cb = torch.complex(m.C_re, m.C_im) * dt / (1 - dtA / 2)
    dA = (1 + dtA / 2) / (1 - dtA / 2)
    ell = torch.arange(T, dtype=F64)
    K = 2 * torch.einsum("hr,hrl->hl", Cb, torch.exp(dA.log()[..., None] * ell)).real
    kv = k.view(2, H, hd, 1, T).permute(0, 2, 3, 1, 4) * v.view(2, H, 1, hd, T).permute(
        0, 2, 3, 1, 4)                                                       # b d1 d2 h l
    kv_f = torch.fft.rfft(kv, n=2 * T) / (2 * T)
    y = torch.fft.irfft(kv_f * torch.fft.rfft(K, n=2 * T), n=2 * T, norm="forward")[..., :T]
    y = y + kv * m.skip[:, None]
    y = (q.view(2, H, hd, 1, T).permute(0, 2, 3, 1, 4) * y).sum(1)           # b d2 h l
    y = y.reshape(2, hd * H, T).transpose(1, 2)                              # (d2, h) order
    W_o = m.out_proj.weight.view(d, H, hd).transpose(1, 2).reshape(d, d)     # same order
    assert torch.allclose(m(u), y @ W_o.T + m.out_proj.bias, atol=1e-12)
    bound = 1 / math.sqrt(24)
    assert m.shift_filter.h[:, 1:].abs().max() <= bound, "taps drawn as SSKernelShift's C"


def test_rwkv_official_form_is_rwkv_time_mixers_initialisation():
    """zoology/mixers/rwkv.py's RWKVTimeMixer.__init__ with n_layer=12, its loops transcribed."""
    d = 16
    for layer_id in (0, 1):
        m = official.OfficialRWKV(d, 24, layer_idx=layer_id)
        r01, r10 = layer_id / (12 - 1), 1.0 - layer_id / 12
        decay = [-5 + 8 * (h / (d - 1)) ** (0.7 + 1.3 * r01) for h in range(d)]
        zigzag = [((i + 1) % 3 - 1) * 0.5 for i in range(d)]
        x = [i / d for i in range(d)]
        for got, want in ((m.w_log, decay), (m.u, [math.log(0.3) + z for z in zigzag]),
                          (m.mix_k, [v ** r10 for v in x]),
                          (m.mix_v, [v ** r10 + 0.3 * r01 for v in x]),
                          (m.mix_r, [v ** (0.5 * r10) for v in x])):
            assert torch.allclose(got, torch.tensor(want), atol=1e-6)
    with pytest.raises(ValueError, match="layer_idx=-1"):
        official.OfficialRWKV(d, 24, layer_idx=-1)


def test_selective_attention_official_form_is_sigmoid_lookups():
    """zoology/mixers/selective.py's SigmoidLookups, transcribed: σ(x w) without bias;
    training y = attn·σ + x, aux 0.001·relu(mean σ - √l/l); eval: the ⌈√l⌉ rows of largest
    σ get x + attn·σ (scatter_add), the others x."""
    T = 24
    m = make_mixer("selective_attention", T=T, form="official")
    assert not hasattr(m, "gate_bias") and m.aux_weight == 0.001 and m.inference == "topk"
    with torch.no_grad():
        m.gate.normal_()
    x = torch.randn(2, T, 16, dtype=F64)
    attn = m.attention(x)
    sel = torch.sigmoid(x @ m.gate)[..., None]                               # (B, T, 1)
    y = m.train()(x)
    assert torch.allclose(y, attn * sel + x, atol=1e-12)
    want = torch.relu(sel.mean() - math.sqrt(T) / T) * 0.001
    assert torch.allclose(m.aux_loss, want, atol=1e-15)
    k = math.ceil(math.sqrt(T))
    idx = torch.topk(sel, k=k, dim=1, sorted=False).indices.repeat(1, 1, 16)
    src = torch.gather(attn * sel, dim=1, index=idx)
    assert torch.allclose(m.eval()(x), x.clone().scatter_add_(1, idx, src), atol=1e-12)
    # the official layer is the learned selection: it has no other
    with pytest.raises(ValueError, match="'selection=programmatic' of selective_attention is "
                                         "not allowed"):
        train.parse_layers("selective_attention:form=official:selection=programmatic", 1)


def plotted_launch_backbone(model, tokens, doubled):
    """zoology/model.py's LMBackbone.forward at the plotted launches' commits, transcribed
    over our model's modules (eval mode): each TransformerBlock is r + mixer(LN1(r)), then
    its state mixer on LN2(r), added at the next block or the final norm. The state mixer is
    model.py's MLP, fc2(tanh(fc1(x))), or with `doubled` (the bug of 0f98dfe) the block's
    mixer built again: our blocks 2j and 2j + 1 are official block j's two mixers."""
    hidden = model.embed(tokens)
    if model.pos is not None:
        hidden = hidden + model.pos(torch.arange(tokens.shape[1]))
    residual = None
    blocks = list(model.blocks)
    pairs = zip(blocks[0::2], blocks[1::2]) if doubled else ((b, b) for b in blocks)
    for first, second in pairs:
        residual = hidden + residual if residual is not None else hidden
        hidden = first.mixer(first.norm1(residual))
        residual = hidden + residual
        if doubled:
            hidden = second.mixer(second.norm1(residual))
        else:
            a = first.norm2(residual) @ first.mlp.fc.weight.T + first.mlp.fc.bias
            hidden = torch.tanh(a) @ first.mlp.out_proj.weight.T + first.mlp.out_proj.bias
    return model.norm(hidden + residual)


# ----------------------------------------------------------------------------------------
# experiments/common.py: sweeps, workers and Slurm, records, statistics, tables and figures

def test_dry_run_prints_one_line_per_run_that_reproduces_it(capsys):
    """Each line of --dry_run, parsed as the command line would, is its run's config (and so
    writes the file the sweep looks for)."""
    for name, scale in [(name, scale) for name in cli.SWEEPS for scale in cli.SWEEPS[name]]:
        assert cli.main([f"--sweep={name}", f"--scale={scale}", "--dry_run"]) == 0
        lines = capsys.readouterr().out.splitlines()
        runs = common.sweep_runs(name, cli.SWEEPS[name], scale)
        assert len(lines) == len(runs) == len(set(lines))
        for line, (label, overrides) in list(zip(lines, runs))[::max(1, len(runs) // 7)]:
            args = shlex.split(line)
            assert args[:3] == ["python", "-m", "experiments"] and f"--label={label}" in args
            config = presets.make_config(**train.parse_arguments(args[3:]))
            assert config == presets.make_config(**overrides)
            assert config.out_dir == f"results/{name}"


SWEEP_SCRIPT = """import sys
from experiments import cli
cli.SWEEPS["tiny"] = {"cpu": dict(models={"attention": "attention"}, seed=[0, 1, 2],
    seq_len=[16], num_kv_pairs=[2], vocab_size=[64], d_model=[16], num_train=[256],
    num_test=[64], batch_size=[16], max_steps=[int(sys.argv[1])], eval_every=[50])}
cli.main(["--sweep=tiny"])
"""


def test_killed_sweep_resumes_and_loses_no_finished_run(tmp_path):
    """Kill a sweep (SIGKILL) while its second run trains: the first run's record is
    whole, no partial file is left, and the rerun trains only the runs that had no record."""
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), "300"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / "results" / "tiny"
    deadline = time.time() + 120
    while not list(folder.glob("*.json")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    first = list(folder.glob("*.json"))
    assert len(first) == 1 and not list(folder.glob("*.tmp")), "killed during the second run"
    before = first[0].read_text()
    assert json.loads(before)["ended"] in ("target_reached", "max_steps")
    out = subprocess.run([sys.executable, str(script), "300"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert first[0].read_text() == before, "the finished run was not run again"
    assert sorted(r["seed"] for r in common.load_records(folder)) == [0, 1, 2]


def test_foreign_or_corrupt_files_in_a_results_folder_are_named(tmp_path):
    folder = tmp_path / "results" / "fig2"
    folder.mkdir(parents=True)
    (folder / "a.json").write_text('{"config": {"mixer": "attention"')        # cut short
    with pytest.raises(ValueError, match=r"a\.json is not a run record"):
        common.load_records(folder)
    (folder / "a.json").write_text(json.dumps({"config": {"not_a_key": 1}, "test_acc": 1}))
    with pytest.raises(ValueError, match=r"a\.json is not a run record.*not_a_key"):
        common.load_records(folder)
    for command in ("--plot=fig2", "--sweep=fig2"):      # before any run or drawing
        out = subprocess.run([*LAB, command], capture_output=True, text=True, cwd=tmp_path,
                             env=LAB_ENV)
        assert out.returncode == 2 and "a.json is not a run record" in out.stderr
        assert "Traceback" not in out.stderr


def test_a_results_folder_holds_one_record_per_run(tmp_path):
    """load_records names both files of a run held twice, and the file of a record whose
    config is not the run its name says (here: its lr edited by hand)."""
    config = small_config(out_dir=str(tmp_path))
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("lr", "seed")}
    record = fake_record(config.lr, config.seed, 0.5, 0.5, **fields)
    path = train.record_path(config)
    train.save_record(record, path)
    assert len(common.load_records(tmp_path)) == 1
    (tmp_path / "copy.json").write_text(path.read_text())
    with pytest.raises(ValueError, match=rf"{re.escape(path.name)} and .*copy\.json are records "
                                         "of the same run"):
        common.load_records(tmp_path)
    (tmp_path / "copy.json").unlink()
    record["config"]["lr"] = 1e-3
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=rf"{re.escape(path.name)} holds the record of the run "
                                         r".*lr0\.001.*not of the run its file name says"):
        common.load_records(tmp_path)


WORKERS_SCRIPT = """import sys
from experiments import cli
cli.SWEEPS["tiny"] = {"cpu": dict(models={"attention": "attention"}, seed=[0, 1, 2],
    seq_len=[16], num_kv_pairs=[2], vocab_size=[64], d_model=[16], num_train=[256],
    num_test=[64], num_valid=[64], batch_size=[16], max_steps=[1000], eval_every=[100],
    target_acc=[1.0], checkpoint_every=[0.05])}
sys.exit(cli.main(["--sweep=tiny", "--workers=2"]))
"""


def test_workers_split_the_threads_and_ctrl_c_stops_them_all_losing_nothing(tmp_path):
    """--workers=2: each run in a process of its own with half the threads. SIGINT to the
    sweep reaches both running runs, which checkpoint and stop (exit 130, no finished
    record, no run started after it); the same command then finishes every run, the two
    stopped ones from their checkpoints."""
    script = tmp_path / "sweep.py"
    script.write_text(WORKERS_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}
    # started as a shell starts a job in the background: ignoring SIGINT
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    folder = tmp_path / "results" / "tiny"
    deadline = time.time() + 120
    while len(list(folder.glob("*.ckpt"))) < 2 and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130, proc.stderr.read()[-2000:]
    stopped = {json.loads(p.read_text())["seed"]: json.loads(p.read_text())
               for p in folder.glob("*.json")}
    assert sorted(stopped) == [0, 1] and {r["ended"] for r in stopped.values()} == {"interrupted"}
    assert len(list(folder.glob("*.ckpt"))) == 2 and not list(folder.glob("*.log"))
    assert all(r["threads"] == 1 for r in stopped.values())          # 2 threads, 2 workers
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    records = {r["seed"]: r for r in common.load_records(folder)}
    assert sorted(records) == [0, 1, 2] and {r["steps"] for r in records.values()} == {1000}
    for seed in (0, 1):                  # continued where Ctrl-C stopped them
        assert [r["step"] for r in records[seed]["resumed"]] == [stopped[seed]["steps"]]
    assert "resumed" not in records[2] and not list(folder.glob("*.ckpt"))


def test_workers_name_a_failed_run_and_finish_the_others(tmp_path, monkeypatch):
    """A run that fails keeps its log and is named in SweepFailed; the others run to the
    end and leave no log. (The lab's one run replaced by a script that fails for seed 1.)"""
    script = tmp_path / "fake_train.py"
    script.write_text("import sys\nprint('ran', sys.argv[1:])\n"
                      "sys.exit(3 if '--seed=1' in sys.argv else 0)\n")
    monkeypatch.setattr(common, "ONE_RUN", [str(script)])
    runs = [dict(seed=s, out_dir=str(tmp_path), progress=False) for s in range(3)]
    with pytest.raises(common.SweepFailed, match=r"1 of 3 runs failed; .*-s1-.*\.log"):
        common.run_in_processes(runs, presets.make_config, 2, "test")
    [log] = tmp_path.glob("*.log")
    assert "-s1-" in log.name and "ran" in log.read_text()


class FakeWorker:
    """subprocess.Popen for run_in_processes: a run that lasts 3 polls of its loop for seed 0
    and 1 poll for any other; it notes in `started` its CUDA_VISIBLE_DEVICES (None: unset),
    the GPUs of the workers still running when it starts, and its whole environment."""
    started, running = [], []

    def __init__(self, args, env, **kwargs):
        self.gpu, self.returncode = env.get("CUDA_VISIBLE_DEVICES"), None
        self.polls = 3 if "--seed=0" in args else 1
        self.started.append((self.gpu, [w.gpu for w in self.running], env))
        self.running.append(self)

    def poll(self):
        self.polls -= 1
        if self.polls == 0:
            self.running.remove(self)
            self.returncode = 0
        return self.returncode


def workers_started(tmp_path, monkeypatch, gpus, workers, **kwargs):
    """(CUDA_VISIBLE_DEVICES, the running workers' GPUs, environment) of each worker that
    run_in_processes starts for 5 runs (seeds 0-4) on `workers` workers, with `gpus` CUDA
    GPUs visible (torch.cuda monkeypatched)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(subprocess, "Popen", FakeWorker)
    monkeypatch.setattr(FakeWorker, "started", [])
    monkeypatch.setattr(FakeWorker, "running", [])
    runs = [dict(seed=s, out_dir=str(tmp_path), progress=False) for s in range(5)]
    common.run_in_processes(runs, presets.make_config, workers, "test", **kwargs)
    assert not FakeWorker.running and not list(tmp_path.glob("*.log"))
    return FakeWorker.started


def test_workers_each_take_a_gpu_of_their_own_and_more_workers_than_gpus_are_asked_for(
        tmp_path, monkeypatch, capsys):
    """Two workers on two GPUs: each run gets the GPU of the worker slot it takes
    (CUDA_VISIBLE_DEVICES), so no two running runs share one; seed 0 outlasts seeds 1-3,
    which take the second GPU in turn (a round-robin over runs would put seed 2 beside seed
    0). A CUDA_VISIBLE_DEVICES the user set names the GPUs. A third worker on two GPUs is
    refused, from the command line too, unless --workers_per_gpu allows two per GPU."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    started = workers_started(tmp_path, monkeypatch, 2, 2)
    assert [(gpu, beside) for gpu, beside, _ in started] == [
        ("0", []), ("1", ["0"]), ("1", ["0"]), ("1", ["0"]), ("0", [])]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,3")
    assert [gpu for gpu, _, _ in workers_started(tmp_path, monkeypatch, 2, 2)] == [
        "5", "3", "3", "3", "5"]
    with pytest.raises(ValueError, match=r"--workers=3 is not allowed with 2 GPUs and "
                                         r"--workers_per_gpu=1: .*--workers_per_gpu=2"):
        workers_started(tmp_path, monkeypatch, 2, 3)
    assert FakeWorker.started == []
    shared = workers_started(tmp_path, monkeypatch, 2, 3, workers_per_gpu=2)
    assert [gpu for gpu, _, _ in shared[:3]] == ["5", "3", "5"]
    assert all([*beside, gpu].count(gpu) <= 2 for gpu, beside, _ in shared)
    asked = []
    monkeypatch.setattr(cli, "run_sweep", lambda *a, **kw: asked.append(kw) or [])
    assert cli.main(["--sweep=main", "--workers=3", "--workers_per_gpu=2"]) == 0
    assert asked[0]["workers"] == 3 and asked[0]["workers_per_gpu"] == 2
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: pytest.fail("started a run"))
    assert cli.main(["--sweep=main", "--workers=3"]) == 2
    assert "--workers=3 is not allowed with 2 GPUs" in capsys.readouterr().err


def test_workers_without_a_gpu_keep_the_environment_they_had(tmp_path, monkeypatch):
    """No CUDA GPU (none, or the user's CUDA_VISIBLE_DEVICES hides them): every worker's
    environment is this process's with its share of the threads and the lab on its path,
    nothing else, and any number of workers runs."""
    for hidden in (None, ""):
        if hidden is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        started = workers_started(tmp_path, monkeypatch, 0, 3)
        assert len(started) == 5 and all(gpu == hidden for gpu, _, _ in started)
        for _, _, env in started:
            assert {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "PYTHONPATH")
                    } == {k: v for k, v in os.environ.items()
                          if k not in ("OMP_NUM_THREADS", "PYTHONPATH")}


def test_a_run_stopped_by_its_own_ctrl_c_stops_the_sweep_in_workers_and_in_one_process(
        tmp_path, monkeypatch):
    """A run that stops on a SIGINT of its own exits as train.py does then: status 130 (a
    Python exit code, not the -2 of a process killed by the signal). With two workers the
    sweep passes SIGINT on to the other running run, starts none of the three left and
    raises KeyboardInterrupt; in one process (run_sweep, workers=1) train's
    KeyboardInterrupt stops the sweep before the next run, and so does python train.py
    --seeds=3 (exit status 130). The lab's one run is a script here: seed 0 exits 130 after
    seed 1 has started, seed 1 exits 130 on the SIGINT passed on, any other seed exits 0;
    each leaves a file that says it started."""
    script = tmp_path / "fake_train.py"
    script.write_text(
        "import signal, sys, time\nfrom pathlib import Path\n"
        "seed = int(next(a for a in sys.argv if a.startswith('--seed=')).split('=')[1])\n"
        f"Path({str(tmp_path)!r}, f'started{{seed}}').touch()\n"
        "signal.signal(signal.SIGINT, lambda *_: sys.exit(130))\n"
        "if seed == 0:\n"
        f"    while not Path({str(tmp_path)!r}, 'started1').exists(): time.sleep(0.01)\n"
        "    time.sleep(0.5)\n    sys.exit(130)\n"
        "time.sleep(30 if seed == 1 else 0)\n")
    monkeypatch.setattr(common, "ONE_RUN", [str(script)])
    runs = [dict(seed=s, out_dir=str(tmp_path), progress=False) for s in range(5)]
    start = time.time()
    with pytest.raises(KeyboardInterrupt):
        common.run_in_processes(runs, presets.make_config, 2, "test")
    assert sorted(p.name for p in tmp_path.glob("started*")) == ["started0", "started1"]
    assert time.time() - start < 25, "seed 1 was not passed the SIGINT"
    assert not list(tmp_path.glob("*.log"))               # stopped as asked: no failure
    # one process: train raises KeyboardInterrupt for seed 1 (its own Ctrl-C)
    trained = []
    def fake_train(config, data=None):
        trained.append(config.seed)
        if config.seed == 1:
            raise KeyboardInterrupt
        return {"seed": config.seed}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "train", fake_train)
    sweep = {"cpu": dict(models={"attention": "attention"}, seed=[0, 1, 2, 3], seq_len=[16],
                         num_kv_pairs=[2], vocab_size=[64], d_model=[16])}
    with pytest.raises(KeyboardInterrupt):
        common.run_sweep("own_ctrl_c", sweep, "cpu", presets.make_config)
    assert trained == [0, 1]
    trained.clear()
    monkeypatch.setattr(train, "train", fake_train)
    monkeypatch.setattr(train, "runs_table", lambda records: "")
    monkeypatch.setattr(train, "summarize", lambda records: "")
    status = train.main(["--seeds=3", f"--out_dir={tmp_path / 'seeds'}", "--max_steps=1"])
    assert (status, trained) == (130, [0, 1])


def test_a_sweep_runs_as_a_submitit_job_array_and_a_killed_job_resumes(tmp_path, monkeypatch):
    """submit_sweep with submitit's LocalExecutor (real processes, no Slurm): a job array of
    the sweep's runs; one job is cancelled mid-run (submitit sends SIGINT, then SIGKILL);
    submitting again submits only that run, which continues from its checkpoint, and
    leaves the finished run's record as it was."""
    pytest.importorskip("submitit")
    monkeypatch.chdir(tmp_path)
    tiny = dict(models={"attention": "attention"}, seq_len=[16], num_kv_pairs=[2],
                vocab_size=[64], d_model=[16], num_train=[256], num_test=[64], num_valid=[64],
                batch_size=[16], eval_every=[100], target_acc=[1.0], checkpoint_every=[0.05])
    monkeypatch.setitem(cli.SWEEPS, "tiny", {"cpu": [dict(tiny, seed=[0], max_steps=[20]),
                                                       dict(tiny, seed=[1], max_steps=[3000])]})
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    submit = lambda: common.submit_sweep("tiny", cli.SWEEPS["tiny"], "cpu", presets.make_config,
                                         cluster="local", time_min=10)
    short, long = submit()
    assert os.environ["PYTHONPATH"] == "elsewhere"           # given back after submitting
    folder = tmp_path / "results" / "tiny"
    deadline = time.time() + 120
    while not list(folder.glob("*s1-*.ckpt")) and time.time() < deadline:
        time.sleep(0.02)
    long.cancel()
    first = Path(short.result())
    before = first.read_text()
    while not long.done() and time.time() < deadline:
        time.sleep(0.05)
    assert not any(r["seed"] == 1 and r["ended"] != "interrupted"
                   for r in common.load_records(folder)), "the job was cancelled too late"
    [checkpoint] = folder.glob("*s1-*.ckpt")
    stopped_at = torch.load(checkpoint, weights_only=True)["run"]["step"]
    [again] = submit()
    second = Path(again.result())
    records = {r["seed"]: r for r in common.load_records(folder)}
    assert first.read_text() == before and records[1]["steps"] == 3000
    assert [r["step"] for r in records[1]["resumed"]] == [stopped_at] and stopped_at > 0
    assert second == train.record_path(presets.make_config(**dict(
        common.sweep_runs("tiny", cli.SWEEPS["tiny"], "cpu")[1][1])))
    assert not list(folder.glob("*.ckpt"))
    assert submit() == []                                              # nothing left
    delayed = common.SweepJob(presets.make_config).checkpoint({"seed": 1})   # Slurm's requeue
    assert isinstance(delayed.function, common.SweepJob) and delayed.args == ({"seed": 1},)


def fake_record(lr, seed, test_acc, valid_acc, **config):
    fields = dataclasses.asdict(train.Config(lr=lr, seed=seed, **config))
    return {"config": fields, "test_acc": test_acc, "valid_acc": valid_acc, "seed": seed,
            "history": [], "ended": "max_steps"}


def test_cells_count_seeds_by_run_choose_the_lr_on_validation_only_and_give_a_t_interval():
    """lr 1e-3 has the better test accuracy but the worse validation accuracy: the cell takes
    lr 3e-3; its mean over 3 seeds with half-width t(0.975, 2) s / √3 = 4.3027 s / √3. Two
    runs of one cell and lr that differ in more than their seed are refused, naming the
    setting; so is a choice between lrs where a run has no validation score."""
    records = ([fake_record(1e-3, s, 0.9, 0.5) for s in range(3)]
               + [fake_record(3e-3, s, a, 0.6) for s, a in enumerate((0.4, 0.5, 0.6))]
               + [fake_record(3e-3, 0, 0.2, 0.1, d_model=128)])
    rows = common.cells(records)
    assert [(r["d_model"], r["lr"], r["seeds"]) for r in rows] == [(64, 3e-3, 3), (128, 3e-3, 1)]
    assert math.isclose(rows[0]["test_acc"], 0.5)
    assert math.isclose(rows[0]["interval"], 4.30265273 * 0.1 / math.sqrt(3), rel_tol=1e-8)
    assert math.isnan(rows[1]["interval"])
    records = [fake_record(3e-3, 0, 0.5, 0.5), fake_record(3e-3, 1, 0.5, 0.5, max_steps=100)]
    with pytest.raises(ValueError, match="differ in max_steps, not only in their seed"):
        common.cells(records)
    records = [fake_record(3e-3, 0, 0.5, 0.5), fake_record(1e-3, 0, 0.9, 0.4)]
    del records[1]["valid_acc"]
    with pytest.raises(ValueError, match="the lr is chosen on validation only"):
        common.cells(records)


def test_a_cell_takes_the_lr_whose_mean_validation_accuracy_over_seeds_is_best():
    """Three lrs of one cell, built so that each rule picks a different one: 1e-3 has the
    best single seed (validation 0.9) and the best test accuracy, 1e-2 the best worst seed
    (0.52), 3e-3 the best mean over its seeds ((0.6 + 0.6 + 0.5) / 3 = 0.5667 against
    (0.9 + 0.1 + 0.1) / 3 = 0.3667 and 0.52). The cell takes 3e-3 and reports its mean test
    accuracy (0.4 + 0.5 + 0.6) / 3 = 0.5, not a best seed's."""
    valid = {1e-3: (0.9, 0.1, 0.1), 3e-3: (0.6, 0.6, 0.5), 1e-2: (0.52, 0.52, 0.52)}
    test = {1e-3: (0.95, 0.9, 0.85), 3e-3: (0.4, 0.5, 0.6), 1e-2: (0.7, 0.7, 0.7)}
    records = [fake_record(lr, s, test[lr][s], valid[lr][s]) for lr in valid for s in range(3)]
    [row] = common.cells(records)
    assert (row["lr"], row["seeds"]) == (3e-3, 3), row["lr"]
    assert math.isclose(row["valid_acc"], 1.7 / 3, rel_tol=1e-12), row["valid_acc"]
    assert math.isclose(row["test_acc"], 0.5, rel_tol=1e-12), row["test_acc"]
    assert sorted(r["test_acc"] for r in row["runs"]) == [0.4, 0.5, 0.6]
    assert {lr: tuple(r["test_acc"] for r in runs) for lr, runs in row["by_lr"].items()} == test


@pytest.mark.parametrize("dof, quantile", [(1, 12.70620474), (2, 4.30265273), (5, 2.57058184),
                                           (30, 2.04227246), (120, 1.97993040)])
def test_t_quantile_is_students(dof, quantile):
    """The 97.5% quantile of Student's t against published values (to 8 decimals), and its
    defining property P(|X| < x) = 0.95 by a Monte Carlo check at dof = 5."""
    assert math.isclose(common.t_quantile(0.975, dof), quantile, rel_tol=1e-8)
    if dof == 5:
        torch.manual_seed(0)
        samples = torch.distributions.StudentT(5.0).sample((400_000,))
        assert abs((samples.abs() < quantile).double().mean().item() - 0.95) < 0.002


def test_help_names_every_sweep(capsys):
    """`python -m experiments --help` (the lab's docstring) lists every sweep of SWEEPS by
    name; `python train.py --help` names the lab's command."""
    assert cli.main(["--help"]) == 0
    usage = capsys.readouterr().out.split("--sweep=NAME", 1)[1].split("--plot", 1)[0]
    named = set(re.findall(r"\w+", usage))
    assert set(cli.SWEEPS) <= named, sorted(set(cli.SWEEPS) - named)
    assert train.main(["--help"]) == 0 and "python -m experiments --help" in capsys.readouterr().out


# sweeps not finished: their records so far (fig2_plotted_grid waits for a GPU)
PENDING_SWEEPS = {"fig2_plotted_grid", "mqar_standard", "mamba2_harder"}   # still training


def test_every_committed_sweep_record_is_a_run_its_sweep_lists_today():
    """The records in results/<sweep>/ are exactly the records that the sweep's --dry_run
    lines write today: no file under an old name, no run missing, none extra; a sweep
    still training (PENDING_SWEEPS) has some of them, not all."""
    for name, sweep in cli.SWEEPS.items():
        scale = "cpu" if "cpu" in sweep else "paper"               # a GPU's sweep: its own
        want = {REPO / train.record_path(presets.make_config(**overrides))
                for _, overrides in common.sweep_runs(name, sweep, scale)}
        have = set((REPO / "results" / name).glob("*.json"))
        if name in PENDING_SWEEPS:
            assert have < want, (name, "finished: take it out of PENDING_SWEEPS"
                                 if have == want else sorted(p.name for p in have - want))
        else:
            assert have == want, (name, sorted(p.name for p in have ^ want))


def test_plot_draws_the_sweep_and_its_state_sizes(tmp_path, monkeypatch):
    """Each figure's legend names every model, also one missing from the last panel (h3
    here has no run at N = 64)."""
    monkeypatch.chdir(tmp_path)
    base = dict(num_kv_pairs=2, vocab_size=256, out_dir="results/fig2")
    for i, (mixer, d, N) in enumerate([("attention", 32, 32), ("attention", 64, 32),
                                       ("h3", 32, 32), ("attention", 32, 64),
                                       ("attention", 64, 64)]):
        r = fake_record(3e-3, 0, 0.3 + 0.1 * i, 0.3, mixer=mixer, d_model=d, label=mixer,
                        seq_len=N, **base)
        train.save_record(r, train.record_path(train.Config(**r["config"])))
    drawn, save = [], train.save_figure
    for module in (train, figures):
        monkeypatch.setattr(module, "save_figure", lambda fig, path: drawn.append(fig) or
                            save(fig, path))
    _, paths = figure2.plot_fig2()
    assert [Path(p).stat().st_size > 10_000 for p in paths] == [True, True, True]
    for fig in drawn[:2]:                                  # accuracy, and against state
        legend = fig.axes[-1].get_legend()                   # the last panel's
        assert [text.get_text() for text in legend.get_texts()] == ["attention", "h3"]


def white_points(ax):
    """The points of `ax` drawn hollow: its scatter collections filled white, in data units."""
    return [tuple(p) for c in ax.collections if type(c).__name__ == "PathCollection"
            and len(c.get_offsets()) and matplotlib.colors.same_color(c.get_facecolors(), "white")
            for p in c.get_offsets()]


def test_an_interrupted_run_is_drawn_unfinished(tmp_path, monkeypatch):
    """A cell whose run was interrupted is drawn at its accuracy so far, but hollow (a point
    of the accuracy and the state figure: that model's line leaves its marker out) or hatched
    (a bar), and each title says what hollow and hatched mean; finished cells stay filled. In
    the curves its line is faint and labelled interrupted."""
    monkeypatch.chdir(tmp_path)
    base = dict(num_kv_pairs=2, vocab_size=256, out_dir="results/fig2")
    cells = [("attention", 32, 32, 0.3), ("attention", 64, 32, 0.4), ("h3", 32, 32, 0.5),
             ("h3", 64, 32, 0.6), ("attention", 64, 64, 0.7), ("h3", 64, 64, 0.8)]
    for mixer, d, N, acc in cells:
        r = fake_record(3e-3, 0, acc, 0.3, mixer=mixer, d_model=d, label=mixer, seq_len=N, **base)
        r["ended"] = "interrupted" if (mixer, d) == ("attention", 64) else "max_steps"
        train.save_record(r, train.record_path(train.Config(**r["config"])))
    drawn = drawn_figures(monkeypatch)
    figure2.plot_fig2()
    accuracy, state, curves = drawn
    faint = {line.get_label() for line in curves.axes[0].lines if line.get_alpha() == 0.4}
    assert faint == {"attention N=32 D=2 d=64 (interrupted)",
                     "attention N=64 D=2 d=64 (interrupted)"}, faint
    assert "faint: an interrupted run, unfinished" in title_of(curves).replace("\n", " ")
    lines, bars = accuracy.axes                             # N = 32: by width; N = 64: bars
    assert [y for _, y in white_points(lines)] == [0.4]
    [(x, _)] = white_points(lines)
    assert 64 * 0.9 < x < 64 * 1.1                                      # dodged about d = 64
    marked = {c.get_label(): list(c.lines[0].get_markevery()) for c in lines.containers}
    assert marked == {"attention": [0], "h3": [0, 1]}, marked
    hatches = {c.get_label(): c.patches[0].get_hatch() for c in bars.containers
               if type(c).__name__ == "BarContainer"}
    assert hatches == {"attention": "////", "h3": None}, hatches
    lines = state.axes[0]
    assert [p[1] for p in white_points(lines)] == [0.4]
    assert {line.get_label(): list(line.get_markevery()) for line in lines.lines} == {
        "attention": [0], "h3": [0, 1]}
    for fig in (accuracy, state):
        assert figures.UNFINISHED_NOTE in title_of(fig).replace("\n", " "), title_of(fig)


def test_a_mixer_of_yours_on_another_sweep_or_unloadable_is_refused(tmp_path, monkeypatch,
                                                                    capsys):
    """--mixer with a sweep other than frontier, a built-in's name, a file that is not there:
    each a one-line ValueError naming it, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_gla.py").write_text(GLA_SOURCE)
    for argv, says in ((["--sweep=fig2", "--mixer=my_gla.py:GLA"], "with 'fig2'"),
                       (["--plot=hybrids", "--mixer=my_gla.py:GLA"], "with 'hybrids'"),
                       (["--sweep=frontier", "--mixer=gla"], "on the frontier already"),
                       (["--sweep=frontier", "--mixer=nothere.py:GLA"], "no file 'nothere.py'"),
                       (["--sweep=frontier", "--mixer=my_gla.py:Nope"], "has no 'Nope'"),
                       (["--table=frontier", "--mixer=my_gla.py:GLA"], "no finished runs")):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and says in err, (argv, err)
    assert not (tmp_path / "results").exists()


# figures a reader can read: the checks below draw the committed figures' records again
# (save_figure kept from writing) and read what the figures hold

def drawn_figures(monkeypatch):
    """The figures the plotting functions draw, laid out as save_figure lays them out, kept
    instead of written (the list fills as they draw); those kept by an earlier test closed."""
    train.pyplot().close("all")
    drawn = []

    def keep(fig, path):
        fig.tight_layout()
        fig.canvas.draw()
        drawn.append(fig)
        return path
    for module in (train, figure2, figures, lm):       # train.py's plot_curves, the lab's figures
        monkeypatch.setattr(module, "save_figure", keep)
    return drawn


def model_series(ax):
    """(label, colour, points in pixels) of every marked series of `ax`: an errorbar's data
    line, a plotted line with markers."""
    series, in_errorbars = [], set()
    for container in ax.containers:
        if type(container).__name__ == "ErrorbarContainer":
            line, caps, _ = container.lines
            in_errorbars |= set(map(id, caps))
            if line is not None:                 # None: a bar's error bar
                in_errorbars.add(id(line))
                series.append((container.get_label(), line.get_color(), line))
    series += [(line.get_label(), line.get_color(), line) for line in ax.lines
               if id(line) not in in_errorbars and line.get_marker() not in (None, "None", "")
               and len(line.get_xdata())]
    return [(label, color, ax.transData.transform(line.get_xydata()))
            for label, color, line in series]


def spots_shared(fig, pixels=1.5):
    """Pairs of series of one axes with a point each within `pixels` of each other in both
    directions: two series on one spot."""
    shared = []
    for ax in fig.axes:
        series = model_series(ax)
        for i, (a, _, pa) in enumerate(series):
            for b, _, pb in series[i + 1:]:
                near = (np.abs(pa[:, None, :] - pb[None, :, :]) < pixels).all(-1)
                if near.any():
                    shared.append((ax.get_title(), a, b))
    return shared


def clipped_texts(fig):
    """The titles, axis labels and legend texts of `fig` that reach past its edges."""
    renderer = fig.canvas.get_renderer()
    texts = list(fig.texts)
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
        if ax.get_legend():
            texts += ax.get_legend().get_texts()
    width, height = fig.bbox.width, fig.bbox.height
    return [text.get_text() for text in texts if text.get_visible() and text.get_text().strip()
            for box in [text.get_window_extent(renderer)]
            if box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1]


def title_of(fig):
    """The figure's suptitle, else its first axes' title."""
    return fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()


def crosses(ax):
    """The points of the scatter collections of `ax` (the paper's values), in data units."""
    return [tuple(p) for collection in ax.collections
            if type(collection).__name__ == "PathCollection" for p in collection.get_offsets()]


def has_point(points, x, y):
    return any(math.isclose(px, x, rel_tol=1e-9) and abs(py - y) < 1e-9 for px, py in points)


# each sweep figure: where the paper's Figure 2 has the (model, N, D, d) cell, (panel title,
# model, x) of the cross; a bar's x is the model's place among the bars
PAPER_CELLS = {
    "fig2": [("N = 64, D = 4", "attention", d) for d in (64, 128, 256, 512)]
    + [("N = 64, D = 4", m, d) for m in ("base_conv", "h3", "hyena", "rwkv")
       for d in (64, 128, 256, 512)],
    "f2": [("N = 64, D = 4", m, 64) for m in ("base_conv", "h3", "hyena")],
    "hybrids": [("d = 64", m, 64) for m in ("attention", "base_conv")],
    "frontier": [("N = 64, D = 4", "base_conv", d) for d in (64, 128, 256, 512)],
    "fig6": []}                      # α = 0.1: not Figure 2's task, and no Figure 6 values


@pytest.mark.parametrize("name", list(PAPER_CELLS))
def test_sweep_figures_can_be_read(name, monkeypatch):
    """The committed records of each sweep drawn again (results/<name>.png, _state.png,
    _curves.png): every model in its colour (model_color) in every figure; no two models
    on one spot (within 1.5 pixels) in the accuracy and state figures; the paper's Figure 2
    value a cross wherever Figure 2 has the cell; every title says the scale and the budget
    (the curves also the seed) and fits in its figure."""
    monkeypatch.chdir(REPO)
    drawn = drawn_figures(monkeypatch)
    cli.CELL_SWEEPS[name][1](name)
    accuracy, state, curves = drawn
    for fig in (accuracy, state):
        assert not spots_shared(fig), spots_shared(fig)
        for ax in fig.axes:
            for label, color, _ in model_series(ax):
                assert matplotlib.colors.same_color(color, figures.model_color(label)), label
            for bars in ax.containers:
                if type(bars).__name__ == "BarContainer":
                    assert matplotlib.colors.same_color(bars.patches[0].get_facecolor(),
                                                        figures.model_color(bars.get_label()))
    for ax in curves.axes:                   # a run's line, and its model in the legend
        legend = ax.get_legend()
        named = {text.get_text(): handle
                 for text, handle in zip(legend.get_texts(), legend.legend_handles)}
        for line in ax.lines:
            if not line.get_label().startswith("_") and "paper" not in line.get_label():
                label = line.get_label().split(" N=")[0]
                assert matplotlib.colors.same_color(line.get_color(), figures.model_color(label))
                assert label in named, label
                assert matplotlib.colors.same_color(named[label].get_color(),
                                                    figures.model_color(label)), label
    panels = {ax.get_title(): ax for ax in accuracy.axes if ax.get_title()}
    for panel, model, d in PAPER_CELLS[name]:
        ax = panels[panel]
        N = int(re.search(r"N = (\d+)", panel).group(1)) if "N = " in panel else 64
        value = figures.PAPER_FIG2[model][N][(64, 128, 256, 512).index(d)]
        names = [text.get_text() for text in ax.get_xticklabels()]
        bars = any(type(container).__name__ == "BarContainer" for container in ax.containers)
        x = names.index(model) if bars else d
        assert has_point(crosses(ax), x, value), (panel, model, d, value)
    if not PAPER_CELLS[name]:
        assert not any(crosses(ax) for ax in accuracy.axes)
    for fig in drawn:
        title = title_of(fig)
        assert "cpu scale" in title and "at most" in title and "steps of 128" in title, title
        assert not clipped_texts(fig), clipped_texts(fig)
    assert "seed 0" in title_of(curves)


def test_sweep_scale_names_the_grid_that_lists_every_record():
    """A figure's title names the scale whose grid lists the records: runs of the fig2 paper
    grid are "paper" (checked after the smaller cpu grid), of its cpu grid "cpu", a mix of
    the two or a run of neither ""."""
    record = lambda scale, i: {"config": dataclasses.asdict(presets.make_config(
        **common.sweep_runs("fig2", figure2.SWEEPS["fig2"], scale)[i][1]))}
    paper, cpu = [record("paper", i) for i in (0, -1)], [record("cpu", i) for i in (0, -1)]
    other = {"config": dataclasses.asdict(train.make_config(seq_len=48))}
    assert figures.sweep_scale("fig2", figure2.SWEEPS["fig2"], paper) == "paper"
    assert figures.sweep_scale("fig2", figure2.SWEEPS["fig2"], cpu) == "cpu"
    assert figures.sweep_scale("fig2", figure2.SWEEPS["fig2"], paper[:1] + cpu[:1]) == ""
    assert figures.sweep_scale("fig2", figure2.SWEEPS["fig2"], cpu + [other]) == ""


def test_width_trend_is_a_permutation_test_of_the_correlation():
    """Two widths, three seeds, every run at the larger width above every run at the
    smaller: 1 of the 20 ways to split six accuracies into two threes is as extreme, so
    p ≈ 1/20; a trend the other way has p near 1; twelve runs rising with width have a
    p below 0.001."""
    low, high = (.2, .3, .25), (.9, .8, .7)
    corr, p = common.width_trend([(32, a) for a in low] + [(128, a) for a in high])
    assert corr > 0.9 and abs(p - 1 / 20) < 0.01
    assert common.width_trend([(32, a) for a in high] + [(128, a) for a in low])[1] > 0.9
    rising = [(d, i / 4 + s / 100) for i, d in enumerate((32, 64, 128, 256)) for s in range(3)]
    assert common.width_trend(rising)[1] < 0.001


def test_width_trend_correlates_accuracy_with_log2_of_the_width():
    """Widths 32, 64, 128 (log2 d = 5, 6, 7), two seeds each, accuracies 0 .1, .5 .6, 1 1.1:
    by hand, deviations of log2 d -1 -1 0 0 1 1 and of accuracy (mean .55) -.55 -.45 -.05
    .05 .45 .55, so Sxy = 2, Sxx = 4, Syy = 1.015 and the correlation is 2 / √(4 · 1.015)
    = 1 / √1.015 (against d itself it would be 0.9747). Only the 2!·2!·2! = 8 of the 720
    orders that keep each width's pair of accuracies reach it: p ≈ 8 / 720 = 1 / 90."""
    points = [(32, 0), (32, .1), (64, .5), (64, .6), (128, 1), (128, 1.1)]
    corr, p = common.width_trend(points)
    assert math.isclose(corr, 1 / math.sqrt(1.015), rel_tol=1e-9), corr
    assert abs(p - 1 / 90) < 0.004, p


def test_figure2_preset_is_the_official_sweep():
    config = presets.make_config(preset="figure2", mixer="h3", seq_len=256, num_kv_pairs=16,
                                 lr=1e-3)
    assert config.mixer == ",".join(["h3:form=official:d_state=256:head_dim=2"] * 2)
    assert (config.batch_size, config.num_train, config.num_test, config.vocab_size) == (
        256, 100_000, 3_000, 8192)
    assert config.max_steps == 64 * 391 and config.eval_every == 391 and config.eval_probe == 0
    assert (config.beta2, config.weight_decay, config.decay_all, config.grad_clip,
            config.warmup_steps) == (0.999, 0.1, True, 0.0, 0)
    assert (config.schedule, config.shuffle, config.block, config.init, config.dropout,
            config.lr) == ("cosine_epochs", False, "identity_mlp", "gpt2", 0.1, 1e-3)
    assert [presets.figure2_batch_size(N) for N in (64, 128, 256, 512)] == [512, 512, 256, 128]
    config = presets.make_config(preset="figure2", mixer="base_conv", n_layers=4, batch_size=64)
    assert config.mixer == ("base_conv:kernel_size=3:form=official,base_conv:form=official,"
                            "base_conv:kernel_size=3:form=official,base_conv:form=official")
    assert config.batch_size == 64 and config.max_steps == 64 * 196, (
        "given keys win over the preset")
    config = presets.make_config(preset="figure2", mixer="rwkv")
    assert config.mixer == "rwkv:form=official:layer_idx=0,rwkv:form=official:layer_idx=1"
    config = presets.make_config(preset="figure2", mixer="mamba")
    assert (config.block, config.dropout, config.mixer) == ("rms_pre_norm", 0.0, "mamba,mamba")
    # configs.py: MHA with dropout 0.1 and 1 head; Based after a short BaseConv, feature_dim
    # 8 and 1 head
    attention = train.LanguageModel(presets.make_config(preset="figure2", mixer="attention"))
    assert [(type(b.mixer).__name__, b.mixer.num_heads, b.mixer.dropout)
            for b in attention.blocks] == [("Attention", 1, 0.1)] * 2
    config = presets.make_config(preset="figure2", mixer="based")
    assert config.mixer == "base_conv:kernel_size=3:form=official,based:feature_dim=8"
    based = train.LanguageModel(config).blocks[1].mixer
    assert (type(based).__name__, based.feature_dim, based.num_heads) == ("Based", 8, 1)
    assert presets.make_config(preset="figure2", mixer="short_conv").mixer == "short_conv"
    for name in presets.FIGURE2_MIXERS:                  # every official model builds
        config = presets.make_config(preset="figure2", mixer=name, d_model=16, n_layers=4)
        train.LanguageModel(config)
        assert mixers.mixer_setting(config.layers) == config.mixer   # parse_layers's inverse
    with pytest.raises(ValueError, match="preset='fig2'"):
        presets.make_config(preset="fig2")
    with pytest.raises(ValueError, match="preset='figure2' is not allowed here: choose one of "
                       "cpu$"):
        train.make_config(preset="figure2")             # train.py knows only its own
    hyena = presets.make_config(**train.parse_arguments(["--preset=figure2", "--mixer=hyena"]))
    assert hyena.mixer.startswith("hyena:form=official")


# ----------------------------------------------------------------------------------------
# experiments/figure2.py: Figure 2's grid, paper-budget and learning-rate runs

def test_pilot_marks_the_lr_chosen_on_validation_and_epochs_table_follows_each_epoch(
        tmp_path, monkeypatch):
    """fig2_pilot: of two lrs the one with the better validation accuracy is marked chosen,
    though its test accuracy is worse; of two within PILOT_TIE of each other, the one with
    the lower validation loss. fig2_epochs: the test accuracy after the epochs of
    EPOCHS_SHOWN that ran, Figure 2's value beside it, and the figure is drawn."""
    monkeypatch.chdir(tmp_path)
    epoch = math.ceil(100_000 / 512)
    def record(folder, lr, valid, test, epochs, d=64, loss=1.0):
        config = presets.make_config(preset="figure2", mixer="base_conv", label="base_conv",
                                     lr=lr, d_model=d, out_dir=f"results/{folder}",
                                     progress=False)
        history = [{"step": e * epoch, "loss": 1.0, "valid_acc": valid * e / epochs,
                    "test_acc": test * e / epochs} for e in range(1, epochs + 1)]
        train.save_record({**fake_record(lr, 0, test, valid),
                           "config": dataclasses.asdict(config), "history": history,
                           "steps": epochs * epoch, "valid_loss": loss, "train_time_s": 7200.0},
                          train.record_path(config))
    record("fig2_pilot", 1e-2, valid=0.4, test=0.9, epochs=3)
    record("fig2_pilot", 2.15e-3, valid=0.5, test=0.3, epochs=3)
    chosen = lambda: [(row.split(" | ")[2], row.split(" | ")[8])
                      for row in cli.markdown_table("fig2_pilot").splitlines()[2:]]
    assert chosen() == [("0.00215", "✓"), ("0.01", "")]
    assert cli.markdown_table("fig2_pilot").splitlines()[2].split(" | ")[3] == ".167 .333 .500"
    record("fig2_pilot", 4.64e-4, valid=0.495, test=0.1, epochs=3, loss=0.9)    # a tie
    assert chosen() == [("0.000464", "✓"), ("0.00215", ""), ("0.01", "")]
    record("fig2_epochs", 2.15e-3, valid=0.8, test=0.6, epochs=10, d=128)
    [row] = cli.markdown_table("fig2_epochs").splitlines()[2:]
    cells = row.strip("| ").split(" | ")
    assert cells[3:] == ["10", "max_steps", ".060 .120 .240 .480 – – – –", ".600", ".800",
                         "0.92", "2.0"]
    assert cli.main(["--plot=fig2_epochs"]) == 0
    assert (tmp_path / "results/fig2_epochs.png").exists()


def test_fig2_plotted_table_picks_the_64_epoch_rate_on_validation(tmp_path, monkeypatch):
    """fig2_plotted: the plotted run with the better validation accuracy after 16 epochs is
    marked, though its test accuracy is worse (of two within PILOT_TIE, the lesser loss);
    HEAD's BaseConv rows come from fig2_epochs (not its attention run); the repository
    figure's value stands beside each width; the figure is drawn."""
    monkeypatch.chdir(tmp_path)
    def record(folder, preset, lr, valid, test, epochs, ended="budget_steps", mixer="base_conv",
               label="as plotted (8486daf)", loss=1.0):
        config = presets.make_config(preset=preset, mixer=mixer, label=label, lr=lr,
                                     out_dir=f"results/{folder}", progress=False)
        epoch = train.steps_per_epoch(config)
        history = [{"step": e * epoch, "loss": 1.0, "valid_acc": valid * e / epochs,
                    "test_acc": test * e / epochs} for e in range(1, epochs + 1)]
        train.save_record({**fake_record(lr, 0, test, valid),
                           "config": dataclasses.asdict(config), "history": history,
                           "steps": epochs * epoch, "ended": ended, "train_time_s": 3600.0,
                           "valid_loss": loss}, train.record_path(config))
    record("fig2_plotted", "figure2_plotted", 1e-2, valid=0.4, test=0.9, epochs=16)
    record("fig2_plotted", "figure2_plotted", 2.15e-3, valid=0.5, test=0.3, epochs=16)
    record("fig2_epochs", "figure2", 1e-2, valid=0.32, test=0.56, epochs=64, ended="max_steps",
           label="base_conv")
    record("fig2_epochs", "figure2", 1e-2, valid=0.99, test=0.99, epochs=2, mixer="attention",
           label="attention", ended="target_reached")
    rows = [r.strip("| ").split(" | ") for r in cli.markdown_table("fig2_plotted").splitlines()[2:]]
    assert [r[:9] for r in rows] == [
        ["HEAD", "64", "0.01", "0", "2", "512", "0.1", "no", "64"],
        ["as plotted (8486daf)", "64", "0.00215", "0", "8", "1,024", "0.01", "yes", "16 (budget)"],
        ["as plotted (8486daf)", "64", "0.01", "0", "8", "1,024", "0.01", "yes", "16 (budget)"]]
    assert [r[9:] for r in rows] == [
        [".009 .018 .035 .070 .140 .280 .420 .560", ".080", "0.70", "1.0"],
        [".019 .037 .075 .150 .300 – – –", ".500 ✓", "0.70", "1.0"],
        [".056 .113 .225 .450 .900 – – –", ".400", "0.70", "1.0"]]
    assert figure2.plotted_choice(figure2.plotted_runs()) == {64: 2.15e-3}
    record("fig2_plotted", "figure2_plotted", 4.64e-4, valid=0.495, test=0.1, epochs=16,
           loss=0.9)                                           # a tie: the lesser loss
    assert figure2.plotted_choice(figure2.plotted_runs()) == {64: 4.64e-4}
    assert cli.main(["--plot=fig2_plotted"]) == 0
    assert (tmp_path / "results/fig2_plotted.png").stat().st_size > 10_000


def test_fig2_epochs_runs_the_rates_the_pilot_chose_on_validation():
    """FIG2_EPOCHS_LRS is pilot_choice of the committed pilot: every rate of Figure 2's four
    for every model and width, read off the validation split."""
    records = common.load_records(REPO / "results" / "fig2_pilot")
    assert sorted({r["config"]["lr"] for r in records}) == list(presets.PAPER_LRS)
    assert len(records) == 12 and figure2.FIG2_EPOCHS_LRS == figure2.pilot_choice(records)


def test_fig2_plotted_runs_64_epochs_at_the_rate_its_16_epoch_runs_chose_on_validation():
    """FIG2_PLOTTED_LR is plotted_choice of the committed 16-epoch runs as plotted (both of
    their rates there), and the sweep's 64-epoch runs take it at d = 64 and 128 (at d = 64
    also with a second seed)."""
    records = common.load_records(REPO / "results" / "fig2_plotted")
    short = [r for r in records if r["config"]["preset"] == "figure2_plotted"
             and r["ended"] == "budget_steps"]
    assert sorted(r["config"]["lr"] for r in short) == [2.15e-3, 1e-2]
    assert figure2.plotted_choice(records) == {64: figure2.FIG2_PLOTTED_LR}
    full = [o for _, o in common.sweep_runs("fig2_plotted", figure2.SWEEPS["fig2_plotted"], "cpu")
            if "budget_steps" not in o]
    lr = figure2.FIG2_PLOTTED_LR
    assert [(o["d_model"], o["lr"], o["seed"]) for o in full] == [(64, lr, 0), (128, lr, 0),
                                                                  (64, lr, 1)]


def test_fig2_plotted_grid_is_figure2s_n64_column_as_its_launches_ran_it():
    """fig2_plotted_grid (a GPU's, paper scale only): BaseConv, H3, RWKV, Hyena and
    attention at the four widths, each at the four rates of logspace(-4, -2, 4) with seed
    0, all --preset=figure2_plotted at N = 64, D = 4: 64 epochs of their launch's batch
    (attention's 256, the others' 1,024), and Figure 2's value for every cell, so every
    figure draws its cross."""
    sweep = figure2.SWEEPS["fig2_plotted_grid"]
    with pytest.raises(ValueError, match="scale='cpu' is not allowed"):
        common.sweep_runs("fig2_plotted_grid", sweep, "cpu")
    configs = [presets.make_config(**o)
               for _, o in common.sweep_runs("fig2_plotted_grid", sweep, "paper")]
    lrs, widths = (1e-4, 4.64e-4, 2.15e-3, 1e-2), (64, 128, 256, 512)
    assert [(config.label, config.d_model, config.lr) for config in configs] == [
        (m, d, lr) for m in ("base_conv", "h3", "rwkv", "hyena", "attention") for d in widths
        for lr in lrs]
    for config in configs:
        assert (config.preset, config.seq_len, config.num_kv_pairs, config.seed) == (
            "figure2_plotted", 64, 4, 0)
        assert (config.batch_size, config.max_steps) == (
            (256, 25_024) if config.label == "attention" else (1_024, 6_272))
        assert figures.figure2_value(config) == (
            figures.PAPER_FIG2[config.label][64][widths.index(config.d_model)])
    assert configs[0].mixer == figure2.PLOTTED_BASE_CONV["mixer"]


def test_fig2_plotted_grid_table_gives_the_validation_choice_and_the_figures_rule(tmp_path,
                                                                                 monkeypatch):
    """--table=fig2_plotted_grid: a cell's test accuracy at the rate validation chose, and
    beside it the best test accuracy of its rates (the plotting script's max over the lrs)
    and Figure 2's value; --plot draws its figures."""
    monkeypatch.chdir(tmp_path)
    for mixer, lr, valid, test in (("base_conv", 1e-2, 0.5, 0.6), ("base_conv", 2.15e-3, 0.4, 0.7),
                                   ("hyena", 1e-2, 0.3, 0.3)):
        config = presets.make_config(preset="figure2_plotted", mixer=mixer, label=mixer, lr=lr,
                                     out_dir="results/fig2_plotted_grid", progress=False)
        train.save_record({**fake_record(lr, 0, test, valid),
                           "config": dataclasses.asdict(config),
                           "history": [{"step": config.max_steps, "loss": 1.0,
                                        "valid_acc": valid, "test_acc": test}],
                           "steps": config.max_steps, "train_time_s": 60.0},
                          train.record_path(config))
    rows = [r.strip("| ").split(" | ")
            for r in cli.markdown_table("fig2_plotted_grid").splitlines()[2:]]
    assert [[r[0], r[3], r[4], r[-2], r[-1]] for r in rows] == [
        ["base_conv", "64", "0.600", ".700", "0.69"], ["hyena", "64", "0.300", ".300", "0.51"]]
    assert cli.main(["--plot=fig2_plotted_grid"]) == 0
    assert (tmp_path / "results/fig2_plotted_grid.png").stat().st_size > 10_000


def test_lr_table_counts_every_lr_and_seed_that_passes(tmp_path, monkeypatch):
    """fig2_lr: every (lr, seed) run is shown and counted, none chosen: 2 of 4 pass 0.9."""
    monkeypatch.chdir(tmp_path)
    for lr, seed, acc in ((1e-3, 0, 0.95), (1e-3, 1, 0.25), (3e-3, 0, 0.91), (3e-3, 1, 0.9)):
        config = train.make_config(mixer="h3", label="h3", lr=lr, seed=seed, progress=False,
                                   out_dir="results/fig2_lr")
        train.save_record({**fake_record(lr, seed, acc, acc),
                           "config": dataclasses.asdict(config)}, train.record_path(config))
    [row] = cli.markdown_table("fig2_lr").splitlines()[2:]
    assert row == "| h3 | .950 .250 | .910 .900 | 2/4 |"
    assert cli.main(["--plot=fig2_lr"]) == 0 and (tmp_path / "results/fig2_lr.png").exists()


def test_lr_figure_colours_a_panel_by_its_model_and_dodges_its_seeds(monkeypatch):
    """fig2_lr (drawn from its committed records, every run of the sweep): every seed of a
    panel in the panel's model colour, no two seeds on one spot, the title says the scale
    and that the steps are at most, and counts no missing run."""
    monkeypatch.chdir(REPO)
    drawn = drawn_figures(monkeypatch)
    figure2.plot_lr("fig2_lr")
    fig, = drawn
    for ax in fig.axes:
        if ax.get_title():
            lines = model_series(ax)
            assert lines and all(matplotlib.colors.same_color(color, figures.model_color(
                ax.get_title())) for _, color, _ in lines), ax.get_title()
    assert not spots_shared(fig), spots_shared(fig)
    title = title_of(fig)
    assert "cpu scale" in title and "at most 8,000 steps of 128" in title, title
    assert " runs" not in title, title                       # "; 58 of its 60 runs" while partial
    assert not clipped_texts(fig), clipped_texts(fig)


def test_epochs_figure_colours_each_run_by_its_model(monkeypatch):
    """fig2_epochs: each run in its model's colour (BaseConv at both widths BaseConv's, not
    another model's), Figure 2's value of each run's cell a dotted line in that colour."""
    monkeypatch.chdir(REPO)
    drawn = drawn_figures(monkeypatch)
    figure2.plot_epochs("fig2_epochs")
    ax, = drawn[0].axes
    runs = [line for line in ax.lines if line.get_marker() not in (None, "None", "")]
    assert len(runs) == 3
    for line in runs:
        label = line.get_label().split(",")[0]
        assert matplotlib.colors.same_color(line.get_color(), figures.model_color(label)), label
    dotted = {(round(line.get_ydata()[0], 2), matplotlib.colors.to_hex(line.get_color()))
              for line in ax.lines if line.get_linestyle() == ":"}
    color = lambda m: matplotlib.colors.to_hex(figures.model_color(m))
    assert dotted == {(0.99, color("attention")), (0.69, color("base_conv")),
                      (0.92, color("base_conv"))}
    assert not clipped_texts(drawn[0]), clipped_texts(drawn[0])


def test_main_figure_is_what_the_main_job_draws_from_its_records(tmp_path, monkeypatch):
    """results/main.png is current: the main job (python train.py), its training replaced by
    the committed records of results/main, draws the figure that the lab draws from them
    (python -m experiments --sweep=main: curves_figure), and the committed PNG is that
    figure; its title says the scale, budget and seed, and it marks the paper's Figure 2
    values of its two cells (train.MAIN_FIGURE2, the lab's PAPER_FIG2 at N = d = 64)."""
    committed = {train.identity(train.Config(**r["config"])): r
                 for r in common.load_records(REPO / "results" / "main")}
    assert train.MAIN_FIGURE2 == {label: figures.PAPER_FIG2[label][64][0] for label in
                                  train.MAIN_MODELS}
    monkeypatch.setattr(train, "train", lambda config: committed[train.identity(config)])
    monkeypatch.chdir(tmp_path)
    assert train.main([]) == 0
    job = tmp_path / "results" / "runs" / "main.png"
    direct = figures.curves_figure(list(committed.values()), str(tmp_path / "direct.png"),
                                   cli.SWEEPS["main"])
    assert job.read_bytes() == Path(direct).read_bytes()
    from matplotlib.testing.compare import compare_images
    assert compare_images(str(REPO / "results" / "main.png"), str(job), tol=2) is None
    drawn = drawn_figures(monkeypatch)
    figures.curves_figure(list(committed.values()), "main.png", cli.SWEEPS["main"])
    title = title_of(drawn[0])
    assert "main at cpu scale" in title and "at most 1,000 steps of 128" in title, title
    assert "seed 0" in title and "hollow" in title
    paper = {round(line.get_ydata()[0], 2) for line in drawn[0].axes[0].lines
             if line.get_linestyle() == ":"}
    assert paper == {figures.PAPER_FIG2["attention"][64][0], figures.PAPER_FIG2["base_conv"][64][0]}


def test_figure2_plotted_preset_is_each_plotted_launch():
    """--preset=figure2_plotted, every setting written out from the launch's commit (train.py
    names each): AdamW's default weight decay 0.01 on every parameter, reshuffled, 64 epochs
    of 100,000, evaluated each epoch, no early stop; the batch of d_model.py by N; the
    attention, Hyena and RWKV blocks with model.py's tanh MLP; BaseConv's and H3's doubled."""
    shared = dict(block="pre_norm", weight_decay=0.01, decay_all=True, shuffle=True,
                  target_acc=1.0, schedule="cosine_epochs", init="gpt2", dropout=0.1,
                  beta2=0.999, grad_clip=0.0, warmup_steps=0, num_train=100_000, num_test=3000,
                  num_valid=3000, vocab_size=8192, eval_probe=0, power_a=0.01)
    short, long = "base_conv:kernel_size=3:form=official", "base_conv:form=official"
    launches = {   # mixer: (n_layers, mlp, activation, batch at N = 64, 128, 256, 512, mixer)
        "attention": (2, True, "tanh", (256, 256, 256, 128), "attention:dropout=0.1,"
                      "attention:dropout=0.1"),
        "hyena": (2, True, "tanh", (1024, 1024, 1024, 128), "hyena:form=official,"
                  "hyena:form=official"),
        "rwkv": (2, True, "tanh", (1024, 1024, 1024, 128), "rwkv:form=official:layer_idx=0,"
                 "rwkv:form=official:layer_idx=1"),
        "base_conv": (8, False, "gelu", (1024, 1024, 1024, 128),
                      ",".join([short, short, long, long] * 2)),
        "h3": (4, False, "gelu", (1024, 1024, 256, 128), ",".join(
            ["h3:form=official:d_state=N:head_dim=2"] * 4))}
    for mixer, (n_layers, mlp, activation, batches, layers) in launches.items():
        for N, D, batch in zip((64, 128, 256, 512), (4, 8, 16, 64), batches):
            config = presets.make_config(preset="figure2_plotted", mixer=mixer, seq_len=N,
                                         num_kv_pairs=D, lr=1e-2)
            assert {k: getattr(config, k) for k in shared} == shared, mixer
            epoch = -(-100_000 // batch)
            assert (config.n_layers, config.mlp, config.mlp_activation, config.batch_size) == (
                n_layers, mlp, activation, batch), (mixer, N)
            assert (config.max_steps, config.eval_every, config.lr) == (64 * epoch, epoch, 1e-2)
            assert config.mixer == layers.replace("d_state=N", f"d_state={N}")
    assert presets.make_config(preset="figure2_plotted", mixer="base_conv").max_steps == 6272
    config = presets.make_config(preset="figure2_plotted", mixer="attention", batch_size=64)
    assert config.batch_size == 64 and config.max_steps == 64 * 391, (
        "given keys win over the preset")
    with pytest.raises(ValueError, match="mixer='mamba' is not allowed with preset='figure2_pl"):
        presets.make_config(preset="figure2_plotted", mixer="mamba")
    with pytest.raises(ValueError, match="mlp_activation='tanh' is not allowed with mlp=False"):
        train.make_config(mlp_activation="tanh")
    with pytest.raises(ValueError, match="mlp_activation='relu' is not allowed"):
        train.make_config(mlp=True, mlp_activation="relu")


@pytest.mark.parametrize("mixer", ["attention", "hyena", "rwkv", "base_conv", "h3"])
def test_figure2_plotted_models_are_the_launches_transcription(mixer):
    """One forward of each plotted model in float64 against the launch's backbone written
    out (plotted_launch_backbone), norms perturbed; the model's own step agrees. Against
    HEAD's identity_mlp block the same weights give another output."""
    config = presets.make_config(preset="figure2_plotted", mixer=mixer, seq_len=32,
                                 num_kv_pairs=2, vocab_size=256, d_model=16)
    torch.manual_seed(0)
    model = train.LanguageModel(config).double().eval()
    perturb_(model, 0.5, only="norm")
    x, _ = multiquery_ar(3, config.vocab_size, config.seq_len, config.num_kv_pairs, seed=2)
    with torch.no_grad():
        want = plotted_launch_backbone(model, x, doubled=mixer in ("base_conv", "h3"))
        assert torch.allclose(model(x), want, atol=1e-10)
        if mixer == "attention":
            a = model.blocks[0].mlp.fc(torch.ones(16, dtype=torch.float64))
            assert torch.allclose(model.blocks[0].mlp.activation(a), torch.tanh(a))
    assert torch.allclose(model_steps(model, x), want, atol=1e-8)


# ----------------------------------------------------------------------------------------
# experiments/figure6.py: appendix F.1

@pytest.mark.parametrize("mixer", ["sliding_window:window=3", "blocked_attention:block_size=4",
                                   "short_conv:kernel_size=2,sliding_window:window=4",
                                   "attention", "sliding_window:window=3,attention"])
def test_reachable_is_where_a_models_output_depends_on_the_key(mixer):
    """The bound of `reachable` is exact for the model: the final hidden state at q has a
    nonzero gradient with respect to the embedding at k < q iff reachable(q, k)."""
    config, model, _, _ = small_model(1, double=True, mixer=mixer, seq_len=16, d_model=16,
                                      n_layers=2)
    embedded = []
    model.embed.register_forward_hook(
        lambda m, i, out: embedded.append(out.detach().requires_grad_()) or embedded[-1])
    hidden = model(torch.randint(1, config.vocab_size, (1, 16)))
    w = torch.randn(16, dtype=torch.float64)       # a LayerNorm's output sums to a constant
    q, k = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    lower = k < q
    depends = torch.stack([torch.autograd.grad(hidden[0, i] @ w, embedded[0],
                                               retain_graph=True)[0][0].abs().sum(-1) > 0
                           for i in range(16)])
    assert torch.equal(depends[lower], figure6.reachable(config, q, k)[lower])
    assert 0 < depends[lower].sum() <= lower.sum()


# ----------------------------------------------------------------------------------------
# experiments/frontier.py: the recall frontier, and a mixer of your own on it

# the frontier sweep shrunk to one cell and two built-ins (a few steps each), for the tests
# of a mixer of your own on it
TINY_FRONTIER = dict(models={k: frontier.FRONTIER_MODELS[k] for k in ("attention", "gla")},
                     nd=[(16, 2)], vocab_size=[64], d_model=[16], num_train=[256],
                     num_test=[64], num_valid=[32], batch_size=[16], max_steps=[4],
                     eval_every=[2], lr=[3e-3], seed=[0])


def test_a_mixer_of_yours_joins_the_frontier_beside_the_built_ins(tmp_path, monkeypatch, capsys):
    """--sweep=frontier --mixer=my_gla.py:GLA on a tiny frontier grid whose built-ins have
    records already: --dry_run lists only your run; the sweep trains only yours (train
    refuses any other), into results/runs/frontier/; --table and --plot with the same
    --mixer show the built-ins' rows and yours, with the recurrent state (your GLA's
    d² + the short BaseConv's 2d + 1; "unknown" for a layer without state_size, which the
    state figure leaves out and names), the figures in results/runs/, the committed ones
    untouched."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(frontier.SWEEPS["frontier"], "cpu", TINY_FRONTIER)
    (tmp_path / "my_gla.py").write_text(GLA_SOURCE + "\n\nclass NoState(GLA):\n"
                                        "    state_size = None   # as if it had none\n")
    assert cli.main(["--sweep=frontier"]) == 0                 # the built-ins' records
    builtins = sorted(p.name for p in (tmp_path / "results/frontier").glob("*.json"))
    assert len(builtins) == 2
    capsys.readouterr()
    mine, none = "--mixer=my_gla.py:GLA", "--mixer=my_gla.py:NoState"
    assert cli.main(["--sweep=frontier", mine, "--dry_run"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert "my_gla.py:GLA" in line and "--label=GLA (yours)" in shlex.split(line)
    trained, real = [], common.train
    def train_yours_only(config):
        assert "my_gla.py" in config.mixer, f"a built-in trained again: {config.mixer}"
        trained.append(config)
        return real(config)
    monkeypatch.setattr(common, "train", train_yours_only)
    assert cli.main(["--sweep=frontier", mine]) == 0
    assert cli.main(["--sweep=frontier", none]) == 0
    assert [run.label for run in trained] == ["GLA (yours)", "NoState (yours)"]
    assert [run.mixer for run in trained] == ["base_conv:kernel_size=3,my_gla.py:GLA",
                                              "base_conv:kernel_size=3,my_gla.py:NoState"]
    assert sorted(p.name for p in (tmp_path / "results/frontier").glob("*.json")) == builtins
    assert len(list((tmp_path / "results/runs/frontier").glob("*.json"))) == 2
    capsys.readouterr()
    table = lambda mixer: (cli.main(["--table=frontier", mixer]), {
        row[0]: row[-1] for line in capsys.readouterr().out.splitlines()[2:]
        for row in [[cell.strip() for cell in line.split("|")[1:-1]]]})
    code, states = table(mine)
    assert code == 0 and list(states) == ["attention", "gla", "GLA (yours)"]
    assert states["GLA (yours)"] == "289"            # d² = 256, and 2d + 1 = 33 of BaseConv's
    assert all(s.replace(",", "").isdigit() for s in states.values())
    assert table(none) == (0, {"attention": states["attention"], "gla": states["gla"],
                               "NoState (yours)": "unknown (no state_size)"})
    drawn, save = [], train.save_figure
    for module in (train, figures):
        monkeypatch.setattr(module, "save_figure", lambda fig, path: drawn.append(fig) or
                            save(fig, path))
    for mixer, state_labels in ((mine, ["attention", "gla", "GLA (yours)"]),
                                (none, ["attention", "gla"])):
        drawn.clear()
        assert cli.main(["--plot=frontier", mixer]) == 0
        accuracy, state = drawn[:2]
        bars = [text.get_text() for text in accuracy.axes[0].get_xticklabels()]  # one cell: bars
        assert bars == ["attention", "gla", mixer.rpartition(":")[2] + " (yours)"]
        assert [text.get_text()
                for text in state.axes[-1].get_legend().get_texts()] == state_labels
        assert ("NoState (yours)" in state._suptitle.get_text()) == (mixer == none)
    for suffix in ("", "_state", "_curves"):
        assert (tmp_path / f"results/runs/frontier{suffix}.png").stat().st_size > 10_000
        assert not (tmp_path / f"results/frontier{suffix}.png").exists()


def test_the_frontier_shows_your_files_current_version_and_names_the_runs_of_others(
        tmp_path, monkeypatch, capsys):
    """Your mixer's runs are those of its file as it is now (its digest, mixer_source): once
    the file is edited (a comment is enough), --table and --plot name the earlier version's
    runs (how many, their digest, how to list them) where they said only "no finished runs";
    after the new version has run too, the table holds its run alone (both in one cell would
    be refused as runs that differ in more than their seed), and names the other."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(frontier.SWEEPS["frontier"], "cpu", TINY_FRONTIER)
    Path("my_gla.py").write_text(GLA_SOURCE)
    mine = "--mixer=my_gla.py:GLA"
    assert cli.main(["--sweep=frontier", mine]) == 0
    old = f"my_gla.py={mixers.source_digest(GLA_SOURCE)}"
    Path("my_gla.py").write_text(GLA_SOURCE + "# a comment\n")
    capsys.readouterr()
    for command in ("--table=frontier", "--plot=frontier"):
        assert cli.main([command, mine]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "has no finished runs" in err, err
        assert (f"results/runs/frontier/ also holds 1 run of --mixer=my_gla.py:GLA with other "
                f"versions of its file, left out (mixer_source {old}: 1 run): grep -l {old} "
                "results/runs/frontier/*.json lists them") in err, err
    assert cli.main(["--sweep=frontier", mine]) == 0
    [new] = [r for r in common.load_records("results/runs/frontier")
             if r["config"]["mixer_source"] != old]
    capsys.readouterr()
    assert cli.main(["--table=frontier", mine]) == 0
    table, note = capsys.readouterr().out.strip().split("\n\n")
    [row] = [line.split(" | ") for line in table.splitlines() if "GLA (yours)" in line]
    assert row[4:6] == [f"{new['test_acc']:.3f}", train.acc_text(new["test_acc"])], row
    assert note.startswith("results/runs/frontier/ also holds 1 run of") and old in note


def test_a_sweep_of_your_mixer_says_how_long_it_will_take_before_it_trains(tmp_path, monkeypatch,
                                                                          capsys):
    """Before your runs train, one line: how many, the seconds of a training step timed at
    each cell's size, the time at most, and that it is an upper bound; nothing once every run
    has finished, nor with --dry_run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(frontier.SWEEPS["frontier"], "cpu", TINY_FRONTIER)
    Path("my_gla.py").write_text(GLA_SOURCE)
    printed, real = [], common.train
    monkeypatch.setattr(common, "train", lambda config: printed.append(
        capsys.readouterr().out) or real(config))
    assert cli.main(["--sweep=frontier", "--mixer=my_gla.py:GLA"]) == 0
    [before] = printed
    assert re.fullmatch(
        r"estimate: 1 run of --mixer=my_gla.py:GLA to train \(cpu scale\), one after another on "
        r"cpu, \d+ threads?: at most about \d+ s\. A training step takes [\d.e-]+ s at N = 16, "
        r"D = 2, d = 16 \(the median of 3 timed steps\), for at most 4 steps a run, with its "
        r"evaluations; an upper bound, as a run stops early once its validation accuracy "
        r"passes 0\.99\. --workers=K runs K at once on the same cores\.\n", before), before
    for args in ([], ["--dry_run"]):
        assert cli.main(["--sweep=frontier", "--mixer=my_gla.py:GLA", *args]) == 0
        assert "estimate" not in capsys.readouterr().out


def test_a_runs_time_estimate_counts_its_schedules_steps_and_evaluations(monkeypatch):
    """run_seconds: the timed step times the steps the schedule runs (budget_steps where it
    cuts max_steps), plus each evaluation's probe of both splits every eval_every steps and
    the whole splits at the end, at the seconds per example an evaluation took (a clock that
    reads one second later at every reading: 1 s for the batch)."""
    monkeypatch.setattr(bench, "timed_step", lambda *args: 0.25)
    clock = itertools.count()
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    config = train.make_config(seq_len=16, num_kv_pairs=2, vocab_size=64, d_model=16,
                               batch_size=8, max_steps=100, budget_steps=40, eval_every=10,
                               eval_probe=16, num_valid=48, num_test=64)
    scored = 40 // 10 * (16 + 16) + 48 + 64                  # probes, then the whole splits
    assert bench.run_seconds(config) == (0.25, 0.25 * 40 + scored / 8)


# ----------------------------------------------------------------------------------------
# experiments/lm.py: the corpus, language models on real text (Section 3.1), appendix G

def test_lm_figures_colour_bars_by_model_and_mark_table1(monkeypatch):
    """lm.png from results/lm.json: every bar in its model's colour (the slices told apart
    by hatching, not by other models' colours), the paper's Table 1 a cross on each slice
    of the models it has; lm_curves.png names Table 1's perplexities (off its token axis),
    and draws no curve without a validation split."""
    monkeypatch.chdir(REPO)
    drawn = drawn_figures(monkeypatch)
    summary = json.loads((REPO / "results" / "lm.json").read_text())
    lm.plot_lm(summary["rows"], "lm.png", "800 steps")
    lm.plot_lm_curves(summary["rows"], summary["tokens_per_step"], "lm_curves.png",
                      "800 steps")
    bars, curves = drawn
    ax = bars.axes[0]
    labels = list(dict.fromkeys(r["label"] for r in summary["rows"]))
    patches = [p for p in ax.patches if p.get_width() > 0]
    assert len(patches) == 3 * len(labels)
    for i, p in enumerate(patches):
        name = lm.LM_LABELS.get(labels[i % len(labels)], labels[i % len(labels)])
        assert matplotlib.colors.same_color(p.get_facecolor()[:3], figures.model_color(name)[:3])
    for j, label in enumerate(labels):
        for i, value in enumerate(lm.PAPER_TABLE1.get(label, ())):
            assert has_point(crosses(ax), j + 0.27 * (i - 1), value), (label, i)
    legend = " ".join(text.get_text() for text in curves.axes[0].get_legend().get_texts())
    for label in labels:
        if label in lm.PAPER_TABLE1:
            assert f"{lm.PAPER_TABLE1[label][0]:.2f}" in legend, label
    for fig in drawn:
        assert not clipped_texts(fig), clipped_texts(fig)
    lm.plot_lm_curves([dict(r, curve=[]) for r in summary["rows"]],    # no validation split
                      summary["tokens_per_step"], "lm_curves.png", "800 steps")
    assert "no validation split" in drawn[-1].axes[0].texts[0].get_text()


def test_default_corpus_is_the_standard_library_without_tests():
    root, files = lm.corpus_files()
    names = [f.relative_to(root).as_posix() for f in files]
    assert len(files) > 100 and all(name.endswith(".py") for name in names)
    assert "os.py" in names and not any(
        set(name.split("/")[:-1]) & {"test", "tests", "site-packages"} for name in names)
    assert names == sorted(names)


def test_corpus_split_vocabulary_and_encoding(tmp_path):
    (tmp_path / "a.txt").write_text("x = y\nx = z\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("y y z")
    (tmp_path / ".hidden").write_text("never read")
    texts = lm.read_corpus(tmp_path)
    assert [name for name, _ in texts] == ["a.txt", "sub/b.txt"]
    tokens = [lm.TOKEN_PATTERN.findall(text) for _, text in texts]
    assert tokens[0] == ["x", "=", "y", "\n", "x", "=", "z", "\n"]
    tokens[1].append("yz")
    # characters: y 4, z 3, newline, = and x 2; (7 - 2) // 4 = 1 of them (y); then tokens:
    # y 3 (in), newline, =, x and z 2 (ties sorted), yz 1 (no room: spelled y z)
    vocab = lm.build_vocabulary(tokens, 7)
    assert vocab == ["<unk>", "<eof>", "y", "\n", "=", "x", "z"]
    assert lm.encode(["x", "yz", "q", "y"], vocab).tolist() == [5, 2, 6, 0, 2]
    names = [f"file{i}.py" for i in range(2000)]
    valid = [name for name in names if lm.is_validation_file(name)]
    # pinned: the split is crc32 of the name, the same on every machine and Python (hash()
    # would change with PYTHONHASHSEED)
    assert valid[:9] == ["file4.py", "file20.py", "file35.py", "file36.py", "file44.py",
                         "file51.py", "file52.py", "file78.py", "file99.py"]
    assert 150 < len(valid) < 250                                           # about 10%
    assert mqar.scaled_threshold(10_000_000_000) == 1250 and mqar.scaled_threshold(1000) == 1


def test_bad_corpus_gets_an_error_naming_the_path(tmp_path):
    with pytest.raises(ValueError, match="no such file or folder"):
        lm.read_corpus(tmp_path / "missing")
    with pytest.raises(ValueError, match="holds no files"):
        lm.read_corpus(tmp_path)
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="hold no text"):
        lm.read_corpus(tmp_path)
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00abc")
    with pytest.raises(ValueError, match="binary.txt.*cannot be read as UTF-8"):
        lm.read_corpus(tmp_path)


@pytest.mark.parametrize("P", [1, 16, 64, 256])
def test_bigram_recall_sequences(P):
    ids = torch.arange(100, 2000)
    N, filler = 1024, 500
    x, ar, fill = lm.bigram_recall_sequences(ids, 20, P, filler_id=filler, seed=P)
    assert x.shape == ar.shape == fill.shape == (20, N)
    assert torch.equal(fill, x == filler) and (fill.sum(1) == N - 4 * P).all()
    assert (ar.sum(1) == P).all()
    for row, mask in zip(x.tolist(), ar.tolist()):
        seen, expected = {}, []
        for t in range(0, N, 2):
            if row[t] == filler:
                assert row[t + 1] == filler
                continue
            k, v = row[t], row[t + 1]
            expected.append(k in seen)
            if k in seen:
                assert seen[k] == v, "a repeated key has the same value"
            seen[k] = v
            assert mask[t] is False
        assert len(seen) == P and all(100 <= k < 2000 and k != filler for k in seen)
        assert len(set(seen.values()) | set(seen)) == 2 * P, "2P distinct ids"
        assert [mask[t + 1] for t in range(0, N, 2) if row[t] != filler] == expected


def test_bigram_recall_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_pairs"):
        lm.bigram_recall_sequences(torch.arange(10_000), 2, 300, filler_id=0)
    with pytest.raises(ValueError, match="token_ids"):
        lm.bigram_recall_sequences(torch.arange(10), 2, 8, filler_id=0)


def _tiny_corpus(folder):
    """30 small files of Python-like text with repeated names: AR hits in every context."""
    rng = random.Random(0)
    folder.mkdir(exist_ok=True)
    for i in range(30):
        names = [f"name{rng.randrange(500)}" for _ in range(6)]
        lines = [f"{rng.choice(names)} = {rng.choice(names)}({rng.choice(names)})"
                 for _ in range(60)]
        (folder / f"f{i}.py").write_text("\n".join(lines) + "\n")
    assert any(lm.is_validation_file(f"f{i}.py") for i in range(30))
    return folder


LM_TINY = dict(task="lm", vocab_size=128, seq_len=32, d_model=16, n_layers=2, batch_size=8,
               num_train=64, num_test=8, num_valid=0, max_steps=4, eval_every=2, progress=False)


def test_lm_data_are_next_token_contexts_of_the_split_and_token_nll_is_the_loss_per_token(tmp_path):
    corpus = _tiny_corpus(tmp_path / "corpus")
    config = train.make_config(corpus=str(corpus), **{**LM_TINY, "num_valid": 2})
    (x, y), (xt, yt), (xv, yv) = lm.lm_data(config)
    train_ids, valid_ids, _ = lm.corpus_streams(str(corpus), 128)
    assert x.shape == (64, 32) and xt.shape == (8, 32) and xv.shape == (2, 32)
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(xt[:, 1:], yt[:, :-1])
    held = torch.from_numpy(valid_ids[:10 * 33]).reshape(10, 33)
    assert torch.equal(xt, held[:8, :-1]) and torch.equal(yv, held[8:, 1:])
    text = " " + " ".join(map(str, train_ids.tolist())) + " "       # ids apart: 1 23 != 12 3
    assert all(f" {' '.join(map(str, row))} " in text
               for row in torch.cat([x[:3], y[:3, -1:]], 1).tolist())
    model = train.LanguageModel(config)
    nll = lm.token_nll(model, xt, yt, batch_size=3)
    assert nll.shape == (8, 32)
    assert math.isclose(nll.mean(), train.labelled_loss(model, xt, yt)[0].item(), rel_tol=1e-5)
    with pytest.raises(ValueError, match="num_test=100000 with num_valid=0 is not allowed"):
        lm.lm_data(train.make_config(corpus=str(corpus), **{**LM_TINY, "num_test": 100_000}))


def test_a_language_model_trains_on_the_labs_data_and_train_py_alone_refuses_it(tmp_path):
    """task="lm": train.train without data refuses it, naming the LM experiment (the corpus
    is the lab's), and so does python train.py; python -m experiments --task=lm ... (the
    one-run command a sweep's worker runs) trains on lm_data: the run of train.train given
    lm_data, step for step."""
    corpus = _tiny_corpus(tmp_path / "corpus")
    config = train.make_config(corpus=str(corpus), out_dir=str(tmp_path / "direct"),
                               **LM_TINY)
    with pytest.raises(ValueError, match="task='lm' is not allowed without its data: the LM "
                                         r"experiment \(python -m experiments --lm"):
        train.train(config)
    args = [f"--corpus={corpus}", *(f"--{k}={v}" for k, v in LM_TINY.items())]
    assert train.main(args) == 2
    direct = train.train(config, lm.lm_data(config))
    assert cli.main([*args, f"--out_dir={tmp_path / 'one_run'}"]) == 0
    [record] = common.load_records(tmp_path / "one_run")
    assert record["steps"] == direct["steps"] == 4
    assert [h["loss"] for h in record["history"]] == [h["loss"] for h in direct["history"]]


def test_lm_slices_flag_the_label_whose_loss_they_slice_and_share_the_gap_by_seed():
    """A hand-made context 3 1 2 4 1 2 5 1 (inputs its first 7 tokens, labels its last 7):
    the bigram (1, 2) recurs at the context's token 5, which is label 4, so label 4 alone is
    an AR hit (the input that ends the bigram is input 5: its flag, the token before, would
    mark label 5). With per-label NLL 1 1 1 1 0.5 3 1 the AR
    perplexity is e^0.5 and the other tokens' e^(8/6). Each model's gap share is against
    attention of its own seed: hyena seed 1 minus attention seed 1 is 0 2 0 1 per token,
    2 of 3 on the hit (against attention seed 0 it would be 2 of 6)."""
    x, y = np.array([[3, 1, 2, 4, 1, 2, 5]]), np.array([[1, 2, 4, 1, 2, 5, 1]])
    bigrams = mqar.bigram_counts(np.array([1, 2, 1, 2, 6]), 8)   # (1, 2) twice in training
    hits = lm.label_hits(x, y, bigrams, 8, 2)
    assert hits.tolist() == [[False, False, False, False, True, False, False]]
    assert not lm.label_hits(x, y, bigrams, 8, 1).any()            # (1, 2) too common at 1
    sliced = mqar.sliced_perplexity(np.array([[1, 1, 1, 1, 0.5, 3, 1]]), hits)
    assert math.isclose(sliced["ppl_ar"], math.exp(0.5), rel_tol=1e-12), sliced
    assert math.isclose(sliced["ppl_other"], math.exp(8 / 6), rel_tol=1e-12), sliced
    hit = np.array([False, True, False, False])
    nll = {("attention", 0): np.array([1., 1, 1, 1]), ("attention", 1): np.array([2., 1, 2, 2]),
           ("hyena", 0): np.array([1., 2, 1, 2]), ("hyena", 1): np.array([2., 3, 2, 3]),
           ("hyena", 2): np.array([5., 5, 5, 5])}
    shares = lm.ar_shares(nll, hit)
    assert sorted(shares) == sorted(nll)
    assert math.isclose(shares["hyena", 0], 1 / 2, rel_tol=1e-12), shares
    assert math.isclose(shares["hyena", 1], 2 / 3, rel_tol=1e-12), shares
    assert all(math.isnan(shares[k]) for k in [("attention", 0), ("attention", 1), ("hyena", 2)])


def test_lm_experiment_chooses_rates_on_validation_slices_perplexity_and_resumes(
        tmp_path, monkeypatch):
    """Every model trains at every rate with the first seed, then at the rate of least
    validation loss with every seed; every (model, seed) row's perplexity is sliced by AR
    hits; a second run loads the models instead of training them."""
    corpus = _tiny_corpus(tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lm, "LM_LRS", (3e-2, 0.3))      # both chosen, 4 steps
    overrides = {**{k: v for k, v in LM_TINY.items() if k != "progress"}, "num_valid": 4,
                 "corpus": str(corpus)}
    summary = lm.run_lm_experiment(overrides, threshold=10 ** 6, g_samples=4)
    rows = summary["rows"]
    assert [(r["label"], r["seed"]) for r in rows] == [
        (label, seed) for label in lm.LM_MODELS for seed in lm.LM_SEEDS]
    assert all(r["steps"] == 4 and 0 < r["ar_tokens"] < r["tokens"] == 8 * 32 for r in rows)
    # the rate: the least validation loss of the first seed's runs, one per rate
    records = {(r["config"]["label"], r["config"]["lr"], r["config"]["seed"]): r
               for r in common.load_records(tmp_path / "results" / "lm")}
    assert len(records) == len(lm.LM_MODELS) * 3        # 2 rates, then the second seed
    for r in rows:
        losses = [records[r["label"], lr, 0]["valid_loss"] for lr in lm.LM_LRS]
        assert summary["lr_valid_loss"][r["label"]] == losses
        assert r["lr"] == lm.LM_LRS[losses.index(min(losses))]
        assert r["valid_loss"] == records[r["label"], r["lr"], r["seed"]]["valid_loss"]
        assert [s for s, _ in r["curve"]] == [2, 4]              # every evaluation's loss
    assert len({r["lr"] for r in rows}) == 2, "a choice that never varies tests nothing"
    # the slices partition the tokens: log ppl is the token-weighted mean of the two
    for r in rows:
        weighted = (r["ar_tokens"] * math.log(r["ppl_ar"])
                    + (r["tokens"] - r["ar_tokens"]) * math.log(r["ppl_other"])) / r["tokens"]
        assert math.log(r["ppl"]) == pytest.approx(weighted, rel=1e-9)
        assert math.isnan(r["ar_share"]) == (r["label"] == "attention")
    # lm.json is strict JSON (no NaN literal): attention's share is null
    written = json.loads((tmp_path / "results" / "lm.json").read_text(),
                         parse_constant=lambda constant: pytest.fail(f"{constant} in lm.json"))
    assert written["rows"][0]["label"] == "attention" and written["rows"][0]["ar_share"] is None
    # a looser threshold only adds hits; the experiment's threshold is the rows' slice
    cuts = [cut["threshold"] for cut in summary["thresholds"]]
    assert cuts == sorted({10, 100, 10 ** 6, summary["train_tokens"]})
    counts = [cut["ar_tokens"] for cut in summary["thresholds"]]
    assert counts == sorted(counts) and counts[cuts.index(10 ** 6)] == rows[0]["ar_tokens"]
    assert all(r["ppl_ar_by_threshold"][cuts.index(10 ** 6)] == r["ppl_ar"] for r in rows)
    assert all([g["num_pairs"] for g in r["appendix_g"]] == [2, 4, 8] for r in rows)
    tables = lm.lm_tables(summary)
    assert len(tables[""].splitlines()) == 2 + len(rows)
    assert len(tables["lr"].splitlines()) == 2 + len(lm.LM_MODELS)
    assert len(list((tmp_path / "results" / "lm").glob("*.pt"))) == len(records)
    assert all(p.stat().st_size > 5000 for p in lm.lm_outputs("results/lm")[1:])
    monkeypatch.setattr(lm, "train",
                        lambda config, data: pytest.fail("retrained a finished model"))
    again = lm.run_lm_experiment(overrides, threshold=10 ** 6, g_samples=4)
    assert [r["ppl"] for r in again["rows"]] == [r["ppl"] for r in rows]
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    # one rate needs no validation split; another out_dir leaves results/lm.* as they were
    before = (tmp_path / "results" / "lm.json").read_text()
    with pytest.raises(ValueError, match="num_valid=0 is not allowed while the experiment "
                                         "chooses among 3 learning rates"):
        lm.run_lm_experiment({**overrides, "num_valid": 0})
    short = lm.run_lm_experiment({**overrides, "num_valid": 0, "lr": 1e-3, "seed": 5,
                                  "max_steps": 2, "out_dir": "results/lm_short"},
                                 threshold=10 ** 6, g_samples=4)
    assert (tmp_path / "results" / "lm.json").read_text() == before
    assert {(r["lr"], r["seed"], r["steps"]) for r in short["rows"]} == {(1e-3, 5, 2)}
    assert all(math.isnan(r["valid_loss"]) and r["curve"] == [] for r in short["rows"])
    assert all(p.exists() for p in lm.lm_outputs("results/lm_short"))
    out = subprocess.run([*LAB, "--lm", "--mixer=h3"], capture_output=True, text=True,
                         cwd=tmp_path, env=LAB_ENV)
    assert out.returncode == 2 and "--mixer is not allowed with --lm" in out.stderr
    out = subprocess.run([*LAB, "--lm", f"--corpus={tmp_path / 'missing'}"],
                         capture_output=True, text=True, cwd=tmp_path, env=LAB_ENV)
    assert out.returncode == 2 and "missing' is not allowed: no such file or folder" in out.stderr


def test_gap_share_is_shown_only_where_there_is_a_gap():
    """Section 3.1's share needs a model worse than attention; one at or below it has no gap
    to attribute, and the table says so instead of printing a ratio of two negatives. Each
    seed's share is against attention of the same seed."""
    assert lm.gap_share_text(0.8, 12.0, 11.0) == "80%"
    assert lm.gap_share_text(0.8, 10.0, 11.0) == "no gap"
    assert lm.gap_share_text(float("nan"), 11.0, 11.0) == ""
    row = lambda label, seed, ppl, share: dict(
        label=label, seed=seed, lr=1e-3, n_params=1, steps=4, train_time_s=1.0, final_loss=2.5,
        valid_loss=None, ppl=ppl, ppl_ar=7.0, ppl_other=12.5, ar_tokens=3, tokens=9,
        ar_share=share, ppl_ar_by_threshold=[7.0], appendix_g=[dict(num_pairs=2, ppl_ar=30.0)])
    rows = [row("attention", 0, 11.0, None), row("attention", 1, 13.0, None),
            row("h3", 0, 12.0, 0.5), row("h3", 1, 12.0, 0.5)]
    tables = lm.lm_tables(dict(corpus="c", threshold=1, train_tokens=100, rows=rows,
                               lrs=[1e-3, 1e-2], seeds=[0, 1],
                               lr_valid_loss=dict(attention=[2.0, None], h3=[2.5, 2.75]),
                               thresholds=[dict(threshold=1, ar_tokens=3)]))
    lines = [line.split(" | ") for line in tables[""].splitlines()[2:]]
    assert [line[12] for line in lines] == ["", "", "50%", "no gap"]         # gap due to AR
    assert lines[2][7] == "–" and "12.06 / 6.75 / 12.60" in lines[2][13]    # Table 1's H3
    assert tables["lr"].splitlines()[2:] == ["| attention | 2.000 | – | 0.001 |",
                                             "| H3 | 2.500 | 2.750 | 0.001 |"]
    assert tables["thresholds"].splitlines()[0] == "| model | seed | 1 (3 tokens) |"
    assert tables["thresholds"].splitlines()[4] == "| H3 | 0 | 7.0 |"
    assert tables["appendix_g"].splitlines()[2] == "| attention | 0 | 30 |"


def test_appendix_g_scores_the_ar_and_filler_tokens():
    """A logits function that knows every next token scores perplexity 1 on both sets; a
    uniform one scores the vocabulary size; one that knows only the filler separates them.
    The AR tokens are P per sequence."""
    V, N, filler = 50, 64, 7
    ids = torch.arange(V)
    oracle = lambda x: 30.0 * F.one_hot(torch.roll(x, -1, 1), V).float()     # reads ahead
    uniform = lambda x: torch.zeros(*x.shape, V)
    fill_only = lambda x: 30.0 * F.one_hot(torch.full_like(x, filler), V).float()
    rows = {name: lm.appendix_g(fn, ids, filler, (2, 8), num_samples=6, seq_len=N,
                                batch_size=4)
            for name, fn in [("oracle", oracle), ("uniform", uniform), ("fill", fill_only)]}
    assert [r["ar_tokens"] for r in rows["oracle"]] == [6 * 2, 6 * 8]
    for name, want in (("oracle", 1.0), ("uniform", V)):
        assert all(math.isclose(r[k], want, rel_tol=1e-6) for r in rows[name]
                   for k in ("ppl_ar", "ppl_filler")), name
    assert all(r["ppl_filler"] < 1.001 and r["ppl_ar"] > 1e6 for r in rows["fill"])


@pytest.mark.parametrize("kind", ["llama", "rwkv"])
def test_appendix_g_runs_on_a_tiny_hugging_face_model_saved_offline(kind, tmp_path):
    """A randomly initialised LlamaForCausalLM / RwkvForCausalLM built from a config, saved
    to a folder and loaded back by hf_causal_lm (no hub), through the protocol; its
    perplexities are near the vocabulary size, as an untrained model's are."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    V = 300
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=2,
                                          num_key_value_heads=2, max_position_embeddings=128,
                                          bos_token_id=1, eos_token_id=2)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.RwkvConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                         attention_hidden_size=32, intermediate_size=64,
                                         context_length=128, bos_token_id=0, eos_token_id=0)
        model = transformers.RwkvForCausalLM(config)
    model.save_pretrained(tmp_path / kind)
    logits_fn, ids, filler = lm.hf_causal_lm(str(tmp_path / kind))
    assert filler not in (1, 2) if kind == "llama" else filler == 1
    assert len(ids) == V - (2 if kind == "llama" else 1)
    rows = lm.appendix_g(logits_fn, ids, filler, (2, 4), num_samples=4, seq_len=64)
    assert [r["num_pairs"] for r in rows] == [2, 4]
    assert all(V / 3 < r[k] < 3 * V for r in rows for k in ("ppl_ar", "ppl_filler"))


def test_hf_without_transformers_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)            # import fails
    with pytest.raises(ValueError, match=r"transformers.*pip install transformers==5\.24\.0"):
        lm.hf_causal_lm("any/model")


class EvaluationStopped(Exception):
    """Raised by EvaluationDevices where an evaluation on the meta device needs data."""


class EvaluationDevices(TorchFunctionMode):
    """The device types of the tensors that reach a model's embedding (its ids and table),
    the loss (logits and labels) and the masks that select from the loss, by what they
    reach. It stops the evaluation (EvaluationStopped) at the first such selection or move
    to the CPU: a meta tensor holds no values to select or copy."""

    def __init__(self):
        super().__init__()
        self.seen, self.loss = {}, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        selection = func is torch.Tensor.__getitem__ and tensors[0] is self.loss
        what = {F.embedding: "embedding", F.cross_entropy: "loss"}.get(func,
                                                                     selection and "mask")
        if what:
            self.seen.setdefault(what, set()).update(t.device.type for t in tensors)
        if selection or func is torch.Tensor.cpu:
            raise EvaluationStopped
        out = func(*args, **(kwargs or {}))
        if func is F.cross_entropy:
            self.loss = out
        return out


def test_the_lm_evaluation_runs_on_the_runs_device(tmp_path, monkeypatch):
    """The LM experiment's model loads onto its run's device (train.resolve_device of its
    `device`; here it resolves to the meta device) and scores the held-out tokens there
    (token_nll) and appendix G's sequences (appendix_g): every tensor that reaches the
    embedding, the loss and the masks is on that device. The model trains on the CPU
    first (train's own resolve_device)."""
    corpus = _tiny_corpus(tmp_path / "corpus")
    c = train.make_config(corpus=str(corpus), out_dir=str(tmp_path), save_model=True, **LM_TINY)
    asked = []
    monkeypatch.setattr(lm, "resolve_device", raising=False,
                        value=lambda name: asked.append(name) or torch.device("meta"))
    model, record = lm.trained_model(c)
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}
    assert asked == ["auto"] and record["device"] == "cpu"
    _, (x_test, y_test), _ = lm.lm_data(c)
    with EvaluationDevices() as devices, pytest.raises(EvaluationStopped):
        lm.token_nll(model, x_test, y_test, batch_size=3)
    assert devices.seen == {"embedding": {"meta"}, "loss": {"meta"}}
    with EvaluationDevices() as devices, pytest.raises(EvaluationStopped):
        lm.appendix_g(lambda ids: model.logits(model(ids)), torch.arange(2, 128), 2, (2,),
                      num_samples=4, seq_len=32, batch_size=2, device=torch.device("meta"))
    assert devices.seen == {"embedding": {"meta"}, "loss": {"meta"}, "mask": {"meta"}}


def test_appendix_g_of_a_hugging_face_model_runs_on_the_device_auto_finds(tmp_path,
                                                                          monkeypatch):
    """--hf=PATH: the model and appendix G's sequences are on resolve_device("auto") (a
    GPU where there is one; here it resolves to the meta device)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=1, eos_token_id=2)).save_pretrained(tmp_path / "llama")
    monkeypatch.chdir(tmp_path)
    asked, devices = [], EvaluationDevices()
    monkeypatch.setattr(cli, "resolve_device", raising=False,
                        value=lambda name: asked.append(name) or torch.device("meta"))
    def appendix_g(*args, **kwargs):                  # the evaluation alone, recorded
        with devices:
            return lm.appendix_g(*args, **kwargs)
    monkeypatch.setattr(cli, "appendix_g", appendix_g)
    with pytest.raises(EvaluationStopped):
        cli.main([f"--hf={tmp_path / 'llama'}", "--samples=4"])
    assert devices.seen == {"embedding": {"meta"}, "loss": {"meta"}, "mask": {"meta"}}
    assert asked == ["auto"]


# ----------------------------------------------------------------------------------------
# experiments/bench.py: the benchmarks

def test_the_full_logits_loss_is_labelled_loss():
    """bench.full_logits_loss (the official harness's loss: logits at every position, then
    ignore_index) is train.labelled_loss, which projects only the labelled rows."""
    _, model, x, y = small_model(4, data_seed=3, double=True)
    with torch.no_grad():
        loss, _, _ = train.labelled_loss(model, x, y)
    assert torch.allclose(loss, bench.full_logits_loss(model, x, y), atol=1e-12)

def test_bench_times_each_recurrence_on_the_arguments_its_layer_hands_it():
    """`python -m experiments --bench=mixers` times each recurrence alone on what its layer
    passes it: the captured call is the fast form's (whose output matches the reference form's
    on the same arguments), and the forms' table is left as it was."""
    x = torch.randn(2, 40, 8)
    for name, impls in bench.RECURRENCES:
        before = dict(impls)
        args, kwargs = bench._recurrence_call(name, impls, x)
        assert impls == before, name
        assert any(isinstance(a, torch.Tensor) and 40 in a.shape for a in args), name
        with torch.no_grad():
            fast, ref = (impls[form](*args, **kwargs) for form in ("fast", "reference"))
        first = lambda y: y[0] if isinstance(y, tuple) else y
        assert torch.allclose(first(fast), first(ref), atol=1e-4), name


def test_step_memory_on_the_meta_device_is_the_cpu_runs_byte_for_byte():
    """bench.step_memory counts the same bytes on the meta device as in a real CPU forward of
    every mixer's model at a small size (scaled_dot_product_attention as the CPU's fused
    kernel keeps it: fused_attention); and train's loss in a plain CPU forward, its labelled
    positions found by labelled_loss itself, saves what step_memory counts."""
    for name in mixers.MIXERS:
        config = presets.make_config(mixer=name, d_model=16, seq_len=32, num_kv_pairs=4,
                                     batch_size=3, vocab_size=64)
        meta, cpu = bench.step_memory(config, "meta"), bench.step_memory(config, "cpu")
        assert meta == cpu, name
        assert meta["total"] == meta["saved"] + 4 * meta["parameters"], name
    torch.manual_seed(config.seed)
    model = train.LanguageModel(config)
    inputs, labels = multiquery_ar(config.batch_size, config.vocab_size, config.seq_len,
                                   config.num_kv_pairs, config.power_a, seed=config.seed)
    params, saved = {id(p.untyped_storage()) for p in model.parameters()}, {}

    def pack(t):
        if id(t.untyped_storage()) not in params:
            saved[id(t.untyped_storage())] = t.untyped_storage()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = train.labelled_loss(model, inputs, labels)[0] + model.aux_loss()
    assert loss.requires_grad
    assert sum(s.nbytes() for s in saved.values()) == cpu["saved"]


# each mixer's budget for a training step at Figure 2's largest cell (bench.memory_configs),
# GiB: 8 for every paper form and Figure 2's runs, but the recall mixers since the paper,
# whose chunked forms keep a state or a (C, C) decay table per chunk for backward: each at
# its total rounded up to the next GiB, so that none grows unseen
MEMORY_BUDGET_GIB = 8
MEMORY_BUDGETS_OVER = {"`gla`": 12, "`mamba2`": 11, "`deltanet`": 11, "`gated_deltanet`": 13,
                       "`rwkv7`": 23}


@functools.cache
def memory_rows():
    """bench.memory_rows (step_memory of every row of the memory table), once a run."""
    return bench.memory_rows()


def test_every_training_step_fits_its_memory_budget_at_figure2s_largest_cell():
    """Each row of `python -m experiments --bench=memory`, (B, N, d) = (128, 512, 512), 2
    layers, counted by bench.step_memory: its total within its budget (MEMORY_BUDGET_GIB or
    MEMORY_BUDGETS_OVER); Mamba's paper form and Figure 2's Mamba run among them."""
    rows = dict(memory_rows())
    assert set(MEMORY_BUDGETS_OVER) < set(rows) and "`mamba`, Figure 2's run" in rows
    over = {label: round(memory["total"] / 2**30, 2) for label, memory in rows.items()
            if memory["total"] > MEMORY_BUDGETS_OVER.get(label, MEMORY_BUDGET_GIB) * 2**30}
    assert over == {}, f"GiB over budget: {over}"


def test_the_readme_memory_table_is_what_bench_memory_prints():
    """The first table under the lab README's "### Memory at the paper's scale" is, character
    for character, the table `python -m experiments --bench=memory` prints."""
    text = (REPO / "experiments/README.md").read_text()
    section = text[text.index("\n### Memory at the paper's scale\n"):]
    table = re.search(r"^\|.*\n(?:\|.*\n?)+", section, re.M).group(0)
    assert table.rstrip("\n") == bench.memory_table(memory_rows())


# ----------------------------------------------------------------------------------------
# experiments/gpu_check.py: the GPU check, on the CPU at its tiny setting

def test_gpu_check_on_the_cpu_reports_every_part_passed_and_writes_its_files(tmp_path, capsys):
    """python -m experiments --gpu_check --out=DIR without a GPU: CPU_SETTING's layers
    trained in float32 and under amp and checked against the contract, the main job, the two
    benchmarks and one run of fig2_plotted_grid, every row "pass" with its measurements; the
    report printed is DIR/report.md, and the log, the records and the JSON are written."""
    out, s = tmp_path / "check", gpu_check.CPU_SETTING
    assert cli.main(["--gpu_check", f"--out={out}"]) == 0
    printed = capsys.readouterr().out
    assert printed == (out / "report.md").read_text()
    report = json.loads((out / "report.json").read_text())
    rows = report["rows"]
    assert [r["result"] for r in rows] == ["pass"] * len(rows), rows
    assert [r["part"] for r in rows] == (["train"] * 2 * len(s.layers) + ["contract"] * len(
        s.layers) + ["main job"] + ["bench"] * len(s.bench_runs) + ["mixers", "fig2"])
    assert report["seconds"] < s.total
    for r in rows[:2 * len(s.layers)]:
        assert math.isfinite(r["numbers"]["loss"]) and r["numbers"]["seconds_per_step"] > 0
    assert all(r["numbers"] == dict.fromkeys(gpu_check.DEVICE_CHECKS, "pass")
               for r in rows if r["part"] == "contract")
    assert rows[-3]["numbers"]["tokens_per_s"] > 0 and len(rows[-2]["numbers"]["rows"]) == len(
        mixers.MIXERS) + len(bench.BENCH_VARIANTS)
    table = [line.split(" | ") for line in printed.splitlines() if line.startswith("| ")]
    layers = [gpu_check.layer_label(*layer) for layer in s.layers]
    assert [t[0][2:] for t in table[2:2 + len(layers)]] == layers
    assert all(cell.startswith("pass") for t in table[2:2 + len(layers)] for cell in t[1:])
    assert [t[0][2:] for t in table if t[0][2:] in ("main job", "mixers_bench")] == [
        "main job", "mixers_bench"] and table[-1][0].startswith("| fig2: base_conv d=16")
    assert len(list((out / "main").glob("*.json"))) == 2
    assert len(list((out / gpu_check.GRID).glob("*.json"))) == 1
    assert (out / "log.txt").read_text().count("\n=== ") == len(rows) - 1


def test_gpu_check_reports_a_failing_item_in_its_row_and_goes_on(tmp_path):
    """An item that raises, or runs past its time, is a FAIL row with the error's first line
    (its traceback in DIR/log.txt); the items after it run."""
    setting = dataclasses.replace(gpu_check.CPU_SETTING, layers=(
        ("no_such_mixer", "paper"), ("attention", "paper")), budgets=(("train", 60, 30),),
        grid_runs=0)
    rows = gpu_check.gpu_check(tmp_path, setting)
    assert [(r["item"], r["result"]) for r in rows] == [
        ("no_such_mixer: float32", "FAIL"), ("no_such_mixer: amp", "FAIL"),
        ("attention: float32", "pass"), ("attention: amp", "pass")]
    assert rows[0]["measured"].startswith("ValueError: mixer='no_such_mixer' is not allowed")
    assert (tmp_path / "log.txt").read_text().count("Traceback (most recent call last)") == 2
    check = gpu_check.Check(tmp_path, setting, torch.device("cpu"))
    t0 = time.perf_counter()
    row = check.item("bench", "slow", lambda: time.sleep(30), until=60, cap=1)
    assert (row["result"], row["measured"]) == ("FAIL", "out of time (1 s)")
    assert time.perf_counter() - t0 < 5 and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_gpu_check_stops_a_run_of_fig2_at_its_time_and_the_next_call_continues_it(tmp_path):
    """A run of part 5 still training at the end of its time stops as Ctrl-C stops a run (its
    checkpoint and an "interrupted" record written): its row says where; the next call
    resumes it from there."""
    setting = dataclasses.replace(gpu_check.CPU_SETTING, grid_overrides=tuple(
        (k, v) for k, v in gpu_check.CPU_SETTING.grid_overrides if k != "budget_steps"))
    overrides = gpu_check.grid_runs(setting, tmp_path)[0]
    config = presets.make_config(**overrides)
    path = train.record_path(config)
    steps = []
    for seconds in (6, 3):
        check = gpu_check.Check(tmp_path, setting, torch.device("cpu"))
        row = check.item("fig2", "run", functools.partial(gpu_check.grid_item, overrides), 60,
                         seconds, stop_train=True,
                         stopped=functools.partial(gpu_check.grid_stopped, overrides))
        record = json.loads(path.read_text())
        steps.append(record["steps"])
        assert row["result"] == "stopped" and record["ended"] == "interrupted"
        assert row["measured"] == (f"stopped at step {steps[-1]:,} of {config.max_steps:,}, "
                                   "checkpointed: the same command continues")
        assert path.with_suffix(".ckpt").exists()
    assert 0 < steps[0] < steps[1] and record["resumed"][0]["step"] == steps[0]


@pytest.mark.parametrize("args,message", [
    (["--gpu_check", "--sweep=main"], "--sweep is not allowed with --gpu_check"),
    (["--gpu_check", "--lr=1e-3"], "--lr=1e-3 is not allowed with --gpu_check"),
    (["--gpu_check=yes"], "--gpu_check='yes' is not allowed"),
    (["--out=check"], "--out is not allowed without --gpu_check"),
    (["--gpu_check", "--out="], "--out='' is not allowed"),
    (["--gpu_check", "--out=README.md"], "--out='README.md' is not allowed: it is a file")])
def test_gpu_check_refuses_other_commands_and_a_bad_out(args, message, capsys, monkeypatch):
    """One line on stderr, exit status 2, before anything runs (no log is opened)."""
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(gpu_check, "Check", lambda *a: pytest.fail("the check started"))
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


# ----------------------------------------------------------------------------------------
# experiments/cli.py: the lab's command line

def test_the_benchmarks_are_the_labs(monkeypatch):
    """python -m experiments --bench=mixers [--threads=COUNT] runs mixers_bench with that many
    threads (1 by default), --bench=mqar runs mqar_bench, --bench=memory memory_bench;
    python mixers.py --bench and python mqar.py --bench are unknown arguments there
    (argparse's error, exit status 2)."""
    calls = []
    monkeypatch.setattr(cli, "mixers_bench", lambda threads: calls.append(threads))
    monkeypatch.setattr(cli, "mqar_bench", lambda: calls.append("mqar"))
    monkeypatch.setattr(cli, "memory_bench", lambda: calls.append("memory"))
    for args in (["--bench=mixers"], ["--bench=mixers", "--threads=3"], ["--bench=mqar"],
                 ["--bench=memory"]):
        assert cli.main(args) == 0
    assert calls == [1, 3, "mqar", "memory"]
    for module in ("mixers", "mqar"):
        out = subprocess.run([sys.executable, f"{module}.py", "--bench"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, module
        assert out.stderr.endswith(f"{module}.py: error: unrecognized arguments: --bench\n"), (
            out.stderr)


@pytest.mark.parametrize("args,message", [
    (["--sweep=main", "--launcher=slurm", "--dry_run"], "--dry_run is not allowed with --launcher"),
    (["--sweep=main", "--launcher=slurm", "--workers=2"],
     "--workers is not allowed with --launcher"),
    (["--sweep=main", "--partition=gpu"], "--partition is not allowed without --launcher=slurm"),
    (["--sweep=main", "--launcher=pbs"], "launcher='pbs' is not allowed"),
    (["--sweep=main", "--launcher=slurm", "--parallel=-1"], "--parallel=-1 is not allowed"),
    (["--sweep=main", "--dry_run", "--workers=2"], "--workers is not allowed with --dry_run"),
    (["--workers=2"], "--launcher and --workers are not allowed without --sweep"),
    (["--sweep=main", "--workers_per_gpu=2"], "--workers_per_gpu is not allowed without --workers"),
    (["--sweep=main", "--workers=2", "--workers_per_gpu=0"], "--workers_per_gpu=0 is not allowed"),
    (["--sweep=main", "--workers=0"], "--workers=0 is not allowed"),
    (["--hf=gpt2", "--samples=0"], "--samples=0 is not allowed"),
    (["--lm", "--samples=-3"], "--samples=-3 is not allowed"),
    (["--seeds=two"], "--seeds='two' is not allowed"), (["--seeds=0"], "--seeds=0 is not allowed"),
    (["--dry_run"], "--dry_run and --scale are not allowed without --sweep"),
    (["--scale=paper", "--mixer=h3"], "--dry_run and --scale are not allowed without --sweep"),
    (["--lm", "--ar_threshold=-1"], "--ar_threshold=-1 is not allowed"),
    (["--lm", "--seeds=3"], "--seeds is not allowed with --lm"),
    (["--lm", "--bench"], "--bench is not allowed with --lm"),
    (["--bench=mixer"], "--bench='mixer' is not allowed"),
    (["--bench=mixers", "--lr=1e-3"], "is not allowed with --bench=mixers"),
    (["--bench=mixers", "--threads=0"], "threads=0 is not allowed"),
    (["--bench=mqar", "--seq_len=32"], "'--seq_len=32' is not allowed with --bench=mqar"),
    (["--bench=memory", "--batch_size=8"],
     "'--batch_size=8' is not allowed with --bench=memory"),
    (["--lm", "--task=mqar"], "--task is not allowed with --lm"),
    (["--lm", "--sweep=fig2"], "--lm is not allowed with --sweep"),
    (["--sweep=frontier", "--mixer=my_gla.py:GLA", "--launcher=slurm"],
     "--launcher is not allowed with --mixer"),
    (["--ar_threshold=5", "--mixer=h3"], "--ar_threshold and --samples are not allowed without"),
    (["--samples=5", "--task=lm"], "--ar_threshold and --samples are not allowed without"),
    # a sweep's, a plot's or a table's settings are its grid's: a --key=value would be ignored
    (["--sweep=main", "--lr=1e-3"], "'--lr=1e-3' is not allowed with --sweep, --plot or --table"),
    (["--plot=fig2", "--seed=1"], "'--seed=1' is not allowed with --sweep, --plot or --table"),
    (["--table=main", "--lr=1e-3"], "'--lr=1e-3' is not allowed with --sweep, --plot or --table"),
    (["--table=frontier", "--mixer=my_gla.py:GLA", "--seed=1"],
     "'--seed=1' is not allowed with --sweep, --plot or --table")])
def test_the_command_line_refuses_bad_values_and_options_that_would_do_nothing(
        args, message, capsys, monkeypatch):
    """Exit status 2 and the message, before anything trains."""
    monkeypatch.setattr(cli, "run_lm_experiment", lambda *a: pytest.fail("started training"))
    assert cli.main(args) == 2 and message in capsys.readouterr().err


# a hook on the import system that prints PYTORCH_ENABLE_MPS_FALLBACK as it is when torch
# is imported (torch reads it then, once: aten/src/ATen/mps/MPSFallback.mm registers the
# fallback as its library loads), then the lab's entry that follows it
TORCH_IMPORT_PROBE = """import os, runpy, sys
class Probe:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            print("at torch's import:", os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK"),
                  file=sys.stderr)
sys.meta_path.insert(0, Probe())
"""


@pytest.mark.parametrize("entry,user,seen", [
    ("runpy.run_module('experiments', run_name='__main__', alter_sys=True)", None, "1"),
    ("import experiments.common", None, "1"), ("import experiments.cli", "0", "0")])
def test_the_lab_turns_the_mps_fallback_on_before_torch_is_imported(entry, user, seen):
    """python -m experiments --help (run as -m runs it) and an import of a lab module (as a
    Slurm job imports experiments.common) import torch with PYTORCH_ENABLE_MPS_FALLBACK=1,
    so that on an Apple GPU an op mps lacks runs on the CPU; a value the user set stays."""
    env = {k: v for k, v in LAB_ENV.items() if k != "PYTORCH_ENABLE_MPS_FALLBACK"}
    if user is not None:
        env["PYTORCH_ENABLE_MPS_FALLBACK"] = user
    out = subprocess.run([sys.executable, "-c", TORCH_IMPORT_PROBE + entry, "--help"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"at torch's import: {seen}\n" in out.stderr, out.stderr[-2000:]


COMMAND_FUNCTIONS = ("table_command", "plot_command", "submit_command", "sweep_command",
                     "hf_command", "lm_command", "one_run_command", "bench_command",
                     "main_job_command")


@pytest.mark.parametrize("args,chosen", [
    ([], "main_job_command"), (["--sweep=fig2", "--dry_run"], "sweep_command"),
    (["--table=main"], "table_command"), (["--plot=fig2"], "plot_command"),
    (["--sweep=fig2", "--launcher=slurm"], "submit_command"), (["--hf=gpt2"], "hf_command"),
    (["--lm", "--max_steps=4"], "lm_command"), (["--mixer=h3"], "one_run_command"),
    (["--task=lm", "--mixer=h3"], "one_run_command"),
    (["--bench"], "bench_command"), (["--seeds=3", "--lr=1e-3"], "one_run_command")])
def test_main_hands_each_command_to_its_own_function(args, chosen, monkeypatch):
    """main dispatches: exactly one command function runs, with the flags and the
    --key=value settings split apart, and its exit status is main's."""
    called = []
    for name in COMMAND_FUNCTIONS:
        monkeypatch.setattr(cli, name, lambda flags, rest, name=name: called.append(
            (name, flags, rest)) or 7)
    assert cli.main(args) == 7 and [call[0] for call in called] == [chosen]
    _, flags, rest = called[0]
    assert sorted([*(f"{k}={v}" if v else k for k, v in flags.items()), *rest]) == sorted(args)
    assert all(a.split("=")[0] in cli.COMMANDS for a in flags) and not any(
        a.split("=")[0] in cli.COMMANDS for a in rest)


# ----------------------------------------------------------------------------------------
# experiments/protocols.py: MQAR as the field runs it

def test_mqar_standard_at_paper_scale_is_the_official_recipe():
    """Every paper run is the official recipe (original_mqar_configs.py at d88d6f5: the
    numbers of protocols.STANDARD_SOURCES): its segments and slices, 707 batches of 256 an
    epoch (the count PROTOCOLS.md gives for the official DataLoader), 32 epochs, the four
    lrs, fillers uniform, the model's longest sequence 1024, no positions, 2 layers a short
    BaseConv then the mixer; the validation split the test's slices, 1,000 examples each."""
    runs = common.sweep_runs("mqar_standard", protocols.SWEEPS["mqar_standard"], "paper")
    configs = [presets.make_config(**o) for _, o in runs[::7]]
    for config in configs:
        assert train.segments(config, "train") == list(protocols.STANDARD_TRAIN)
        assert train.segments(config, "test") == train.segments(config, "valid") == \
            list(protocols.STANDARD_TEST)
        assert (train.steps_per_epoch(config), config.batch_size, config.max_steps) == (
            707, 256, 32 * 707)
        assert (config.eval_every, config.schedule, config.shuffle) == (707, "cosine_epochs",
                                                                        False)
        assert (config.vocab_size, config.fillers, config.seq_len, config.n_layers) == (
            8192, "uniform", 1024, 2)
        assert (config.weight_decay, config.decay_all, config.target_acc, config.dropout) == (
            0.1, True, 0.99, 0.1)
        assert config.layers[0] == ("base_conv", {"kernel_size": 3})
        assert not train.LanguageModel(config.replace(d_model=8)).pos
    assert sorted({o["lr"] for _, o in runs}) == [0.001, 0.00316, 0.01, 0.0316]
    assert {o["label"].split()[0] for _, o in runs} == set(protocols.PROTOCOL_MIXERS)


def test_mamba2_harder_is_a_curriculum_over_d_in_batches_of_2_18_tokens():
    """Each N of the paper grid: D = N/32, N/16, N/8, N/4 in turn, 8 passes of 2^18
    examples each, batches of 2^18 tokens, tested at D = N/4; d from 32 to 256, three lrs."""
    runs = common.sweep_runs("mamba2_harder", protocols.SWEEPS["mamba2_harder"], "paper")
    seen = set()
    for _, o in runs[::12]:
        config = presets.make_config(**o)
        N = config.seq_len
        seen.add(N)
        assert train.segments(config, "train") == [(N, N // k, 2**18) for k in (32, 16, 8, 4)]
        assert config.segment_passes == 8 and config.batch_size * N == 2**18
        assert train.segments(config, "test") == [(N, N // 4, 1000)]
    assert seen == {256, 512, 1024}
    assert sorted({o["d_model"] for _, o in runs}) == [32, 64, 128, 256]


def test_state_size_in_both_conventions_is_the_hand_count():
    """Two attention layers of width 8 keep keys and values, 2·d numbers a token each: per
    sequence at the longest training length (256) 2·2·8·256; the official bytes at the
    longest test length (1024), 4 per number: 4·2·2·8·1024."""
    config = train.make_config(mixer="attention", d_model=8, seq_len=1024,
                               train_segments="64:4:100,256:16:100",
                               test_slices="64:4:10,1024:256:10", num_train=100_000)
    assert protocols.state_columns(config) == (2 * 2 * 8 * 256, 4 * 2 * 2 * 8 * 1024)


TINY_PROTOCOL = dict(models={"attention": protocols.STACK.format("attention")}, d_model=[16],
                     lr=[3e-3], seed=[0], vocab_size=[64], seq_len=[32],
                     position_embedding=["none"], train_segments=["16:2:32,32:4:16"],
                     test_slices=["16:2:8,32:4:8,32:8:8"], num_valid=[4], batch_size=[16],
                     max_steps=[3], eval_every=[3], fillers=["uniform"])


def test_a_protocol_tables_and_draws_each_slice_and_your_mixer_beside(tmp_path, monkeypatch,
                                                                      capsys):
    """A tiny protocol (segments at N = 16 and 32, slices to D = 8): --table prints each
    cell's slices (none past training: N = 32 is trained) and the official state bytes;
    --plot draws the slices and the state, and mamba2_harder's Figure 8 too; --mixer of your
    own trains yours alone and its row follows the built-ins'; --mixer of a built-in is
    refused."""
    monkeypatch.chdir(tmp_path)
    for name in ("mqar_standard", "mamba2_harder"):
        monkeypatch.setitem(protocols.SWEEPS[name], "cpu", TINY_PROTOCOL)
    assert cli.main(["--sweep=mqar_standard"]) == 0
    capsys.readouterr()
    assert cli.main(["--table=mqar_standard"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = [cell.strip() for cell in lines[0].split("|")[1:-1]]
    assert header[-3:] == ["16:2", "32:4", "32:8"] and len(lines) == 3
    rows = {cells[0]: cells for line in lines[2:]
            for cells in [[c.strip() for c in line.split("|")[1:-1]]]}
    records = common.load_records("results/mqar_standard")
    attention = next(r for r in records if r["config"]["label"] == "attention")
    assert rows["attention"][-1] == train.acc_text(attention["test_slices"]["32:8"]["acc"])
    official = 4 * protocols.state_size(train.Config(**attention["config"]), 32)
    assert rows["attention"][5] == f"{official:,}"
    assert cli.main(["--plot=mqar_standard"]) == 0
    for suffix in ("_slices", "_state"):
        assert (tmp_path / f"results/mqar_standard{suffix}.png").stat().st_size > 10_000
    (tmp_path / "my_gla.py").write_text(GLA_SOURCE)
    mine = "--mixer=my_gla.py:GLA"
    capsys.readouterr()
    assert cli.main(["--sweep=mqar_standard", mine]) == 0
    assert re.match(r"estimate: 1 run of --mixer=my_gla.py:GLA to train \(cpu scale\), .* at most "
                    r"about \d+ (s|min)\. A training step takes .* at the mean over its segments",
                    capsys.readouterr().out)
    assert len(list((tmp_path / "results/runs/mqar_standard").glob("*.json"))) == 1
    capsys.readouterr()
    assert cli.main(["--table=mqar_standard", mine]) == 0
    labels = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines()[2:]]
    assert labels == ["attention", "GLA (yours)"]
    assert cli.main(["--plot=mqar_standard", mine]) == 0
    assert (tmp_path / "results/runs/mqar_standard_slices.png").exists()
    assert cli.main(["--sweep=mqar_standard", "--mixer=gla"]) == 2
    assert "built-in" in capsys.readouterr().err
    protocols.plot_protocol("mamba2_harder", {"cpu": TINY_PROTOCOL},
                            records, out=str(tmp_path / "harder"))
    assert (tmp_path / "harder.png").stat().st_size > 10_000


def test_a_protocol_past_its_training_length_is_marked_in_its_table():
    """The slices longer than every training sequence are the table's "past training"
    columns: at cpu scale (512:128) and (1024:256), nothing else."""
    sweep = protocols.SWEEPS["mqar_standard"]
    [(_, o), *_] = common.sweep_runs("mqar_standard", sweep, "cpu")
    record = dict(config=dataclasses.asdict(presets.make_config(**o)))
    config = train.Config(**record["config"])
    past = [s for s, N, _ in protocols.slices_of(record) if N > protocols.trained_length(config)]
    assert past == ["512:128", "1024:256"]
