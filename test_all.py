"""The tests of the six files, in sections by module: mqar, mixers, train, theory, the README's
quick start. They import nothing from experiments/, and pass in a copy of the six files
without it (the last test); the lab's tests are experiments/test_lab.py.

Run with `python -m pytest -q test_all.py experiments/test_lab.py` (`make test`, the README's
test command), or this file alone. Statistical tests use fixed seeds and state their
thresholds; tolerances are explicit at each assert.
Symbols are the paper's, as in the modules: N sequence length, D key-value pairs, d width;
T is a mixer's sequence length (time inside a layer), as mixers.py calls it. A written-out
formula loops over channels with ch.
"""
import ast
import collections
import contextlib
import dataclasses
import functools
import inspect
import itertools
import json
import math
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import mixers
import mqar
import theory as th
import train
from mixers import MIXERS
from mqar import IGNORE, multiquery_ar

REPO = Path(__file__).resolve().parent
F64 = torch.float64


# ----------------------------------------------------------------------------------------
# helpers

def chi2_critical(dof, z=3.09):
    """Upper quantile of chi-square(dof) by Wilson-Hilferty; z=3.09 is the 0.999 level.

    Accurate to a few percent for dof >= 3, which is all these tests need: each test
    rejects when the statistic exceeds this value, a 1-in-1000 event under the null.
    """
    k = dof
    return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


def chi2_gof(counts, probs, min_expected=5):
    """(statistic, dof) of a goodness-of-fit test, merging tail bins to expected >= 5."""
    counts, expected = np.asarray(counts, float), np.asarray(probs, float) * np.sum(counts)
    obs_bins, exp_bins, o, e = [], [], 0.0, 0.0
    for ci, ei in zip(counts, expected):
        o, e = o + ci, e + ei
        if e >= min_expected:
            obs_bins.append(o), exp_bins.append(e)
            o = e = 0.0
    if e > 0:  # the leftover tail joins the last bin
        obs_bins[-1] += o
        exp_bins[-1] += e
    obs_bins, exp_bins = np.array(obs_bins), np.array(exp_bins)
    return float(((obs_bins - exp_bins) ** 2 / exp_bins).sum()), len(obs_bins) - 1


def chi2_two_sample(a, b, min_count=10):
    """(statistic, dof) of a homogeneity test between two count vectors over the same bins."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    keep = (a + b) >= min_count
    a = np.append(a[keep], a[~keep].sum())
    b = np.append(b[keep], b[~keep].sum())
    if a[-1] + b[-1] == 0:
        a, b = a[:-1], b[:-1]
    table = np.stack([a, b])
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum()), table.shape[1] - 1


def query_slots(inputs, num_kv_pairs):
    """(B, D) slot index g_i of each key i, read back from a layout (inverse of Procedure 1)."""
    D = num_kv_pairs
    keys = inputs[:, 0:2 * D:2]
    tail = inputs[:, 2 * D::2]                                   # (B, space)
    match = tail[:, None, :] == keys[:, :, None]                 # (B, D, space)
    assert (match.sum(-1) == 1).all(), "every key must be queried exactly once"
    return match.int().argmax(-1)


def check_mqar_layout(inputs, labels, vocab_size, num_kv_pairs, fillers="zeros"):
    """Assert every invariant of the official layout (Procedure 1) on a batch."""
    B, N = inputs.shape
    D, c = num_kv_pairs, vocab_size
    assert inputs.dtype == labels.dtype == torch.int64 and labels.shape == (B, N)
    keys, values = inputs[:, 0:2 * D:2], inputs[:, 1:2 * D:2]
    assert ((keys >= 1) & (keys < c // 2)).all() and ((values >= c // 2) & (values < c)).all()
    assert (keys.sort(1).values.diff(dim=1) > 0).all(), "keys distinct within an example"
    assert (values.sort(1).values.diff(dim=1) > 0).all(), "values distinct within an example"
    # a uniform filler can be a key: read where each key is queried from the labels then
    if fillers == "uniform":
        at = torch.stack([(labels[b] != IGNORE).nonzero()[:, 0] for b in range(B)])    # (B, D)
        match = inputs.gather(1, at)[:, None, :] == keys[:, :, None]                # (B, D, D)
        assert (match.sum(-1) == 1).all(), "every key must be queried exactly once"
        pos = at.gather(1, match.int().argmax(-1))
    else:
        pos = 2 * D + 2 * query_slots(inputs, D)
    assert torch.equal(labels.gather(1, pos), values), "label at a query = its key's value"
    assert ((labels != IGNORE).sum(1) == D).all(), "exactly D labelled positions"
    others = torch.ones(B, N, dtype=torch.bool)
    others[:, :2 * D] = False
    others.scatter_(1, pos, False)
    if fillers != "zeros":
        assert ((inputs[others] >= 0) & (inputs[others] < c)).all()
    if fillers == "random":
        rest = inputs.masked_fill(~others, -1)
        assert not (rest[:, :, None] == keys[:, None, :]).any(), "filler never equals a key"
    if fillers == "zeros":
        assert (inputs[others] == 0).all(), "filler is 0"


# ----------------------------------------------------------------------------------------
# mqar.py: Procedure 1

@pytest.mark.parametrize("N,D,c", [(64, 4, 8192), (128, 8, 200), (256, 16, 8192),
                                   (16, 4, 17), (512, 64, 8192)])
@pytest.mark.parametrize("fillers", mqar.FILLERS)
def test_mqar_layout_invariants(N, D, c, fillers):
    x, y = mqar.multiquery_ar(500, vocab_size=c, seq_len=N, num_kv_pairs=D, fillers=fillers,
                              seed=3)
    assert x.shape == (500, N)
    check_mqar_layout(x, y, c, D, fillers)


def test_per_example_baseline_has_the_same_layout():
    x, y = mqar.multiquery_ar_per_example(300, vocab_size=300, seq_len=128, num_kv_pairs=8)
    check_mqar_layout(x, y, 300, 8)


@pytest.mark.parametrize("alpha", [0.01, 0.1, 1.0, 2.0])
def test_first_query_slot_follows_the_power_law(alpha):
    """Key 1 is drawn first, so its slot g is distributed exactly as P(g) ∝ α(g+1)^(α-1).

    Chi-square goodness of fit over 20,000 examples, rejected at the 0.999 level; at α = 0.1
    the same test rejects the probabilities of the wrong α (0.01), so it can fail.
    """
    N, D = 128, 8
    x, _ = mqar.multiquery_ar(20_000, seq_len=N, num_kv_pairs=D, power_a=alpha, seed=11)
    space = (N - 2 * D) // 2
    counts = np.bincount(query_slots(x, D)[:, 0].numpy(), minlength=space)
    p = (np.arange(space) + 1.0) ** (alpha - 1)           # the formula, not power_law_probs
    stat, dof = chi2_gof(counts, p / p.sum())
    assert stat < chi2_critical(dof), (stat, dof)
    if alpha == 0.1:
        stat, dof = chi2_gof(counts, mqar.power_law_probs(space, 0.01))
        assert stat > chi2_critical(dof)


def test_power_law_probs_are_the_formula_of_procedure_1():
    """P(g) ∝ (g+1)^(α-1), written here: α = 1 is uniform, P(g)/P(0) = (g+1)^(α-1)."""
    space, g = 56, np.arange(56)
    assert np.allclose(mqar.power_law_probs(space, 1.0), 1 / space, rtol=1e-12, atol=0)
    for alpha in (0.01, 0.5, 2.0):
        p = mqar.power_law_probs(space, alpha)
        assert np.allclose(p / p[0], (g + 1.0) ** (alpha - 1), rtol=1e-12, atol=0)
        assert p.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("alpha", [0.01, 1.0])
def test_all_query_slots_match_the_official_algorithm(alpha):
    """Each key's slot distribution equals that of per-example `choice(replace=False, p=p)`.

    Two-sample chi-square per key index (vectorized vs baseline, 8,000 examples each), at
    the 0.999 level with a Bonferroni-style margin (z = 3.5) over the D keys.
    """
    N, D = 64, 4
    space = (N - 2 * D) // 2
    fast, _ = mqar.multiquery_ar(8000, seq_len=N, num_kv_pairs=D, power_a=alpha, seed=1)
    slow, _ = mqar.multiquery_ar_per_example(8000, seq_len=N, num_kv_pairs=D, power_a=alpha, seed=2)
    gf, gs = query_slots(fast, D).numpy(), query_slots(slow, D).numpy()
    for i in range(D):
        stat, dof = chi2_two_sample(np.bincount(gf[:, i], minlength=space),
                                    np.bincount(gs[:, i], minlength=space))
        assert stat < chi2_critical(dof, z=3.5), (i, stat, dof)


def test_keys_and_values_are_uniform():
    """Keys uniform over [1, c/2), values over [c/2, c), in every pair position."""
    c, N, D = 40, 32, 8
    x, _ = mqar.multiquery_ar(20_000, vocab_size=c, seq_len=N, num_kv_pairs=D, seed=5)
    for i in (0, D - 1):
        k = np.bincount(x[:, 2 * i].numpy(), minlength=c)[1:c // 2]
        v = np.bincount(x[:, 2 * i + 1].numpy(), minlength=c)[c // 2:]
        for counts in (k, v):
            stat, dof = chi2_gof(counts, np.full(len(counts), 1 / len(counts)))
            assert stat < chi2_critical(dof), (i, stat)


def test_random_fillers_are_uniform_over_the_allowed_tokens():
    c, N, D = 24, 20, 2
    x, y = mqar.multiquery_ar(20_000, vocab_size=c, seq_len=N, num_kv_pairs=D,
                              fillers="random", seed=9)
    keys = x[:, 0:2 * D:2]
    filler = x[:, -1]                        # the last position is never a query (odd)
    assert not (filler[:, None] == keys).any()
    counts = np.bincount(filler.numpy(), minlength=c)
    assert (counts[0] > 0) and (counts[c // 2:] > 0).all()
    # P(token i) = P(i not a key) / (c - D): compute it from the key frequencies
    key_freq = np.bincount(keys.flatten().numpy(), minlength=c) / len(x)
    probs = (1 - key_freq) / (c - D)
    stat, dof = chi2_gof(counts, probs / probs.sum())
    assert stat < chi2_critical(dof), stat


def test_uniform_fillers_are_the_official_rule_keys_included_at_their_rate():
    """The official rule (random_non_queries=True): every filler uniform over [0, c), so it
    equals one of the example's D keys with probability D/c."""
    c, N, D = 64, 48, 8
    x, y = mqar.multiquery_ar(5_000, vocab_size=c, seq_len=N, num_kv_pairs=D, fillers="uniform",
                              seed=4)
    keys = x[:, 0:2 * D:2]
    filler = x[:, 2 * D + 1::2]              # odd positions after the context: never a query
    counts = np.bincount(filler.flatten().numpy(), minlength=c)
    stat, dof = chi2_gof(counts, np.full(c, 1 / c))
    assert stat < chi2_critical(dof), stat
    is_key = (filler[:, :, None] == keys[:, None, :]).any(-1)
    n, rate = is_key.numel(), D / c
    assert abs(is_key.float().mean().item() - rate) < 4 * math.sqrt(rate * (1 - rate) / n)
    check_mqar_layout(x, y, c, D, "uniform")


def test_mqar_is_seeded_and_neither_reads_nor_changes_global_rng():
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    first = mqar.multiquery_ar(50, seed=1, fillers="uniform")
    after = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    assert before[0] == after[0] and np.array_equal(before[1], after[1])
    assert torch.equal(before[2], after[2])
    random.seed(123), np.random.seed(123), torch.manual_seed(123)
    second = mqar.multiquery_ar(50, seed=1, fillers="uniform")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(first[0], mqar.multiquery_ar(50, seed=2, fillers="uniform")[0])


@pytest.mark.parametrize("kwargs,name", [
    (dict(seq_len=63), "seq_len"), (dict(seq_len=64, vocab_size=64), "vocab_size"),
    (dict(seq_len=64, num_kv_pairs=17), "num_kv_pairs"), (dict(num_kv_pairs=0), "num_kv_pairs"),
    (dict(num_examples=-1), "num_examples"), (dict(num_examples=2.5), "num_examples"),
    (dict(power_a=0), "power_a"), (dict(power_a=-1.0), "power_a"),
    (dict(power_a=float("inf")), "power_a"), (dict(seed=-3), "seed"),
    (dict(fillers="official"), "fillers"), (dict(fillers=True), "fillers")])
def test_mqar_rejects_bad_arguments(kwargs, name):
    args = dict(num_examples=4) | kwargs
    with pytest.raises(ValueError, match=rf"^{name}=.*allowed"):
        mqar.multiquery_ar(**args)


def test_sample_distinct_is_uniform_over_ordered_tuples():
    """Floyd + shuffle: every ordered pair from a range of 4 is equally likely (12 cells)."""
    rng = np.random.default_rng(0)
    s = mqar.sample_distinct(rng, 24_000, 2, 0, 4)
    assert (s[:, 0] != s[:, 1]).all()
    counts = np.bincount(s[:, 0] * 4 + s[:, 1], minlength=16)
    counts = counts[[a * 4 + b for a in range(4) for b in range(4) if a != b]]
    stat, dof = chi2_gof(counts, np.full(12, 1 / 12))
    assert stat < chi2_critical(dof)


# ----------------------------------------------------------------------------------------
# mqar.py: single-query AR

def test_associative_recall_layout():
    x, y = mqar.associative_recall(2000, vocab_size=40, seq_len=20, seed=0)
    D = 9
    assert (x[:, 0] == 0).all()                               # even N: one filler in front
    keys, values = x[:, 1:-1:2], x[:, 2:-1:2]
    assert keys.shape == (2000, D) and (keys.sort(1).values.diff(dim=1) > 0).all()
    assert ((keys >= 1) & (keys < 20)).all() and ((values >= 20) & (values < 40)).all()
    assert ((y != IGNORE).sum(1) == 1).all() and (y[:, :-1] == IGNORE).all()
    which = (keys == x[:, -1:]).int().argmax(1)
    assert ((keys == x[:, -1:]).sum(1) == 1).all()
    assert torch.equal(y[:, -1], values.gather(1, which[:, None])[:, 0])
    # the queried pair is uniform over the D pairs
    stat, dof = chi2_gof(np.bincount(which.numpy(), minlength=D), np.full(D, 1 / D))
    assert stat < chi2_critical(dof)
    with pytest.raises(ValueError, match="vocab_size"):
        mqar.associative_recall(2, vocab_size=10, seq_len=33)


# ----------------------------------------------------------------------------------------
# mqar.py: the AR hits of real text (Section 3.1)

def test_ar_hits_are_a_loop_over_each_context():
    """A token is an AR hit iff its bigram (x[t-1], x[t]) ends earlier in the same context
    and occurs at most `threshold` times in the training stream: as plain loops, on random
    streams from a small vocabulary (many repeats), for thresholds 0 to 3."""
    rng = np.random.default_rng(0)
    c = 6
    train_stream = rng.integers(0, c, 300)
    contexts = rng.integers(0, c, (5, 40))
    counts = {}
    for a, b in zip(train_stream[:-1].tolist(), train_stream[1:].tolist()):
        counts[a, b] = counts.get((a, b), 0) + 1
    bigrams = mqar.bigram_counts(train_stream, c)
    assert dict(zip(bigrams[0].tolist(), bigrams[1].tolist())) == {
        a * c + b: count for (a, b), count in counts.items()}
    for threshold in range(4):
        want = np.zeros(contexts.shape, dtype=bool)
        for row, x in enumerate(contexts.tolist()):
            for t in range(1, len(x)):
                earlier = {(x[j - 1], x[j]) for j in range(1, t)}
                want[row, t] = ((x[t - 1], x[t]) in earlier
                                and counts.get((x[t - 1], x[t]), 0) <= threshold)
        got = mqar.ar_hits(contexts, bigrams, c, threshold)
        assert np.array_equal(got, want), threshold
    assert 0 < want.sum() < want.size
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert np.array_equal(mqar.ar_hits(contexts, empty, c, 0)[:, 1:],
                          mqar.ar_hits(contexts, bigrams, c, 10 ** 6)[:, 1:])


def test_ar_gap_share_and_sliced_perplexity_are_the_formulas():
    """Δlog(ppl_AR)·|T_AR| / (Δlog(ppl)·|T|) written with the perplexities themselves, on
    random per-token losses, and the three perplexities as loops."""
    rng = np.random.default_rng(1)
    nll_a, nll_b = rng.exponential(1.0, 200), rng.exponential(1.5, 200)
    hits = rng.random(200) < 0.2
    ppl = lambda v: math.exp(sum(v) / len(v))
    a_ar, b_ar = [v for v, h in zip(nll_a, hits) if h], [v for v, h in zip(nll_b, hits) if h]
    want = ((math.log(ppl(b_ar)) - math.log(ppl(a_ar))) * hits.sum()
            / ((math.log(ppl(nll_b)) - math.log(ppl(nll_a))) * 200))
    assert math.isclose(mqar.ar_gap_share(nll_a, nll_b, hits), want, rel_tol=1e-9)
    assert math.isnan(mqar.ar_gap_share(nll_a, nll_a, hits))             # no gap to share
    sliced = mqar.sliced_perplexity(nll_b, hits)
    assert math.isclose(sliced["ppl"], ppl(nll_b), rel_tol=1e-9)
    assert math.isclose(sliced["ppl_ar"], ppl(b_ar), rel_tol=1e-9)
    assert math.isclose(sliced["ppl_other"], ppl([v for v, h in zip(nll_b, hits) if not h]),
                        rel_tol=1e-9)
    assert (sliced["tokens"], sliced["ar_tokens"]) == (200, hits.sum())


# ----------------------------------------------------------------------------------------
# mixers.py: helpers

def make_mixer(name, d=16, T=24, dtype=F64, seed=0, **kwargs):
    torch.manual_seed(seed)
    return mixers.build_mixer(name, d, T, **kwargs).to(dtype)


# mixer(x) with token ids for a mixer that takes them, torch's generator seeded for the call
# (the random selective-attention control draws its rows from it); `step` over a whole
# sequence, (outputs (B, T, d), states after each t): the mixer contract's own (check_mixer)
mix, run_steps = mixers.seeded_forward, mixers.seeded_steps


def perturb_(module, scale, only=""):
    """Add scale·N(0, 1) noise to every parameter whose name contains `only`, in order."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if only in name:
                p.add_(scale * torch.randn_like(p))


HALF = (torch.float16, torch.bfloat16)
WIDE = (torch.float64, torch.complex128)                # what an Apple GPU (mps) does not have
FFT_FUNCTIONS = {getattr(torch.fft, name) for name in torch.fft.__all__ if name != "Tensor"}


class FFTInputs(TorchFunctionMode):
    """Records (function, dtypes of its tensor arguments) of every torch.fft call, as called:
    a function mode sees a call before autocast's dispatcher casts anything, so on the CPU it
    sees what cuFFT would get on CUDA (whose autocast has no rule for torch.fft)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FFT_FUNCTIONS:
            self.calls.append((func.__name__, *[t.dtype for t in tree_leaves((args, kwargs))
                                                if isinstance(t, torch.Tensor)]))
        return func(*args, **kwargs)


class ProducedDtypes(TorchDispatchMode):
    """Records (aten op, dtype) of every tensor each op produces, backward's included."""

    def __init__(self):
        super().__init__()
        self.produced = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.produced.update((str(func), t.dtype) for t in tree_leaves(out)
                             if isinstance(t, torch.Tensor))
        return out


# every mixer with its defaults, and the options that change the code path it takes (the
# official forms' cases are the lab's: OFFICIAL_CASES in experiments/test_lab.py)
CASES = [(name, {}) for name in MIXERS] + [
    ("attention", dict(num_heads=4)), ("attention", dict(rotary=True, num_heads=2)),
    ("attention", dict(short_conv=3)),
    ("sliding_window", dict(window=5)), ("sliding_window", dict(window=1)),
    ("sliding_window", dict(window=5, num_heads=4)),
    ("blocked_attention", dict(block_size=5)), ("blocked_attention", dict(block_size=1)),
    ("short_conv", dict(kernel_size=1)), ("short_conv", dict(kernel_size=30)),
    ("long_conv", dict(filter="implicit")), ("long_conv", dict(filter="mlp")),
    ("base_conv", dict(kernel_size=3)),
    ("hyena", dict(order=1)), ("hyena", dict(order=3, short_kernel_size=4)),
    ("h3", dict(head_dim=4, d_state=8)), ("h3", dict(d_state=4, shift_size=3)),
    ("h3", dict(shift_size=20)),
    # chunk_size=5 makes T=24 span several chunks (and a ragged last one)
    ("rwkv", dict(chunk_size=5)),
    ("retnet", dict(chunk_size=5)), ("retnet", dict(num_heads=1)),
    ("based", dict(chunk_size=5)), ("based", dict(feature_dim=4, num_heads=2)),
    ("mamba", dict(chunk_size=5)),
    ("mamba", dict(chunk_size=8)),           # T=24 = 3 chunks, no padding: the views path
    ("selective_attention", dict(selection="random")),
    ("selective_attention", dict(selection="programmatic")),
    ("input_dependent_conv", dict(filters="autocorrelation")),
    ("input_dependent_conv", dict(filters="autocorrelation", num_lags=1)),
    ("gla", dict(num_heads=2, expand_k=1.0, chunk_size=5)),
    ("mamba2", dict(d_state=4, headdim=4, chunk_size=5)),
    ("deltanet", dict(num_heads=2, chunk_size=5)),
    ("gated_deltanet", dict(num_heads=2, chunk_size=5, conv_size=1)),
    ("rwkv7", dict(num_heads=4, chunk_size=5)),
]


def case_ids(cases):
    """The test id of each (name, options) case: the name, then each option."""
    return [name + "".join(f"-{k}={v}" for k, v in kw.items()) for name, kw in cases]


IDS = case_ids(CASES)


# ----------------------------------------------------------------------------------------
# mixers.py: properties every mixer must have, over CASES

@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_every_mixer_keeps_the_mixer_contract(name, kw):
    """mixers.check_mixer, the check `python mixers.py --check` runs on a mixer of your own:
    (B, T, d) in and out in float32 and float64, causal (exactly, in float64), batch rows
    independent, a gradient for every parameter, step == forward token by token, state_size
    == the numbers step carries, deterministic in eval mode, runs on the meta device. Every
    mixer here has every part (none absent)."""
    results = mixers.check_mixer(name, kw, d_model=16, seq_len=24)
    assert [r.check for r in results] == list(mixers.CONTRACT)
    assert [r for r in results if r.status != "pass"] == []


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_mixer_fast_equals_reference(name, kw, monkeypatch):
    """Outputs and gradients; SHORT_FILTER = 0 sends even short filters through the FFT,
    so that the fast form is never the reference's direct sum."""
    monkeypatch.setattr(mixers, "SHORT_FILTER", 0)
    fast, ref = make_mixer(name, impl="fast", **kw), make_mixer(name, impl="reference", **kw)
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 24, 16, dtype=F64, requires_grad=True)
    yf, yr = mix(fast, x), mix(ref, x)
    assert torch.allclose(yf, yr, atol=1e-10, rtol=1e-10)
    gy = torch.randn_like(yf)
    gf = torch.autograd.grad(yf, [x, *fast.parameters()], gy)
    gr = torch.autograd.grad(yr, [x, *ref.parameters()], gy)
    for a, b in zip(gf, gr, strict=True):
        assert torch.allclose(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", ["retnet", "rwkv", "based", "mamba", "gla", "mamba2",
                                  "deltanet", "gated_deltanet", "rwkv7"])
def test_default_chunks_are_crossed_and_fast_equals_reference(name):
    """The DEFAULT options (chunks of 8 to 64) on T = 150: three chunks or more, so that a
    state is carried over two chunk boundaries (at T = 24, CASES never crosses a default
    chunk of 32 or 64)."""
    fast, ref = (make_mixer(name, d=8, T=150, impl=impl) for impl in ("fast", "reference"))
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 150, 8, dtype=F64)
    assert torch.allclose(fast(x), ref(x), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_no_fft_receives_half_precision_under_autocast(name, kw):
    """bfloat16 autocast, forward and backward at T = 24 > SHORT_FILTER (the long filters
    convolve by FFT): every torch.fft call gets float32 or wider. cuFFT has no bfloat16
    transform, and CUDA autocast, unlike the CPU's, casts nothing for torch.fft
    (torch._C._dispatch_dump("aten::fft_rfft") lists AutocastCPU only), so what FFTInputs
    sees here is what a GPU would get."""
    assert 24 > mixers.SHORT_FILTER
    m = make_mixer(name, dtype=torch.float32, **kw)
    x = torch.randn(2, 24, 16, requires_grad=True)
    with FFTInputs() as fft:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = mix(m, x)
        y.float().square().sum().backward()
    assert [call for call in fft.calls if set(call[1:]) & set(HALF)] == []


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_float32_forward_and_backward_make_no_float64(name, kw):
    """An Apple GPU (mps) has no float64 and no complex128: a float32 forward and backward of
    every mixer produces none (float32, complex64, integers and booleans only)."""
    m = make_mixer(name, dtype=torch.float32, **kw)
    x = torch.randn(2, 24, 16, requires_grad=True)
    with ProducedDtypes() as mode:
        mix(m, x).square().sum().backward()
    assert sorted((op, dtype) for op, dtype in mode.produced if dtype in WIDE) == []


def test_the_reference_files_never_import_the_lab():
    """mixers.py, mqar.py, train.py and theory.py import nothing from experiments/ (a mixer's
    official form loads experiments/official.py when a run asks for it: the lab's test)."""
    code = ("import sys, mixers, mqar, train, theory\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'experiments'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split("\n")[0] == "[]", out.stderr


def test_a_copy_of_mixers_alone_runs_its_paper_forms_and_names_the_lab_for_an_official_one(
        tmp_path):
    """mixers.py copied alone into an empty folder builds every paper form; form=official
    there is a ValueError that says the official forms are the lab's (experiments/official.py)."""
    (tmp_path / "mixers.py").write_text((REPO / "mixers.py").read_text())
    code = ("import mixers\n"
            "for name in mixers.MIXERS: mixers.build_mixer(name, 8, 8)\n"
            "try:\n    mixers.build_mixer('h3', 8, 8, form='official')\n"
            "except ValueError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("form='official' of h3 is not allowed here: the official forms "
                                 "are the lab's, experiments.official:OfficialH3"), out.stdout


@pytest.mark.parametrize("name, form", [(name, "paper") for name in MIXERS])
def test_a_registered_mixer_provides_the_interface(name, form):
    """What adding a mixer takes: a Mixer subclass built as cls(d_model, seq_len, **options)
    with a default for every option, boolean class facts, an aux_loss that is None or a
    scalar after forward, and the mixer contract (checked over CASES, where it has a case)."""
    cls = mixers.mixer_class(name, form)
    assert (cls is MIXERS[name]) == (form == "paper") and issubclass(cls, mixers.Mixer)
    d_model, seq_len, *options = inspect.signature(cls).parameters.values()
    assert (d_model.name, seq_len.name) == ("d_model", "seq_len")
    assert all(p.default is not p.empty for p in options), "every option has a default"
    for fact in ("uses_positions", "takes_tokens", "keeps_own_init", "rescale_out_proj"):
        assert isinstance(getattr(cls, fact), bool), fact
    m = cls(16, 24)
    mix(m, torch.randn(3, 24, 16))
    assert m.aux_loss is None or m.aux_loss.shape == ()
    # forward, step and state_size on (B, T, d) and (B, d): the mixer contract, over CASES
    assert any(case == name and kw.get("form", "paper") == form for case, kw in CASES)


# ----------------------------------------------------------------------------------------
# mixers.py: a mixer of your own, by its path, and the mixer contract on it

# the README's "Bring your own mixer" file, my_gla.py: gated linear attention (Yang et al.,
# 2024) with one head, its recurrence written once, in step; an nn.Module and nothing else
GLA_SOURCE = re.search(r"```python\n(# my_gla\.py\n.*?)```", (REPO / "README.md").read_text(),
                       re.S).group(1)


# the layers that break the contract, each on top of GLA
BROKEN_SOURCE = GLA_SOURCE + '''

class Leaky(GLA):
    """Reads the next token too."""

    def forward(self, x):
        return super().forward(x + torch.cat([x[:, 1:], x[:, :1] * 0], 1))


class Undercount(GLA):
    """Counts one row of its (d, d) state."""

    def state_size(self, t):
        return self.out_proj.in_features if t else 0


class Sloppy(GLA):
    """Mixes the rows of a batch, keeps a parameter it does not use, counts its calls, and
    makes a tensor on the CPU."""

    def __init__(self, d_model, seq_len):
        super().__init__(d_model, seq_len)
        self.unused, self.calls = nn.Parameter(torch.zeros(d_model)), 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x) + x.mean(0) + self.calls + torch.arange(x.shape[1])[:, None]


class OnCpu(GLA):
    """Makes a tensor on the CPU inside forward: right on a CPU, an error on a GPU."""

    def forward(self, x):
        return super().forward(x) * torch.ones(x.shape[-1])


class Wide(nn.Module):
    """Returns 2d channels."""

    def __init__(self, d_model, seq_len):
        super().__init__()
        self.proj = nn.Linear(d_model, 2 * d_model)

    def forward(self, x):
        return self.proj(x)


class Shift(nn.Module):
    """y_t = proj(x_(t-shift)): no step, no state_size."""

    def __init__(self, d_model, seq_len, shift=1):
        super().__init__()
        self.proj, self.shift = nn.Linear(d_model, d_model), shift

    def forward(self, x):
        return self.proj(torch.cat([x[:, :self.shift] * 0, x[:, :-self.shift]], 1))
'''


def contract(entry, d_model=16, seq_len=24):
    """{check: (status, measured)} of check_mixer on a `mixer` setting's entry."""
    return {r.check: (r.status, r.measured)
            for r in mixers.check_mixer(*mixers.parse_mixer(entry), d_model, seq_len)}


def test_the_contract_on_mixers_of_your_own_names_what_each_breaks(tmp_path, monkeypatch,
                                                                    capsys):
    """check_mixer on layers written to a file: GLA keeps every promise; Leaky is caught at
    the first position an edit leaks to; Undercount with both state sizes; Sloppy on each
    promise it breaks, with what was measured; Shift has no step or state_size (absent, not
    failed). check_command's exit status is 1 where a check fails, else 0."""
    monkeypatch.chdir(tmp_path)
    Path("layers.py").write_text(BROKEN_SOURCE)
    assert {status for status, _ in contract("layers.py:GLA").values()} == {"pass"}
    assert contract("layers.py:GLA")["step"][1].startswith("largest difference from forward ")
    status, measured = contract("layers.py:Leaky")["causal"]
    assert status == "fail" and measured.startswith(
        "in eval mode, an edit at t=1 changes the output at t=0 ")
    assert measured.endswith("every leak (edit -> earlier output): 1 -> 0, 2 -> 1, 3 -> 2, "
                             "4 -> 3, 5 -> 4, 6 -> 5, ... (23 in all)"), measured
    assert contract("layers.py:Undercount")["state_size"] == (
        "fail", "after t = 1, 2, 5, 24 tokens: state_size 16, 16, 16, 16; step carries 256, "
                "256, 256, 256")
    sloppy = contract("layers.py:Sloppy")
    # (its count of calls changes every output between two forwards: causal fails too)
    assert {k for k, (status, _) in sloppy.items() if status == "fail"} == {
        "causal", "batch rows", "gradients", "step", "deterministic", "device"}
    assert sloppy["gradients"][1] == ("1 of 7 parameters get no gradient (none, or all "
                                      "zeros): unused")
    assert sloppy["deterministic"][1] == "two forwards differ by 1"
    assert "meta" in sloppy["device"][1] and "cpu" in sloppy["device"][1]
    shift = contract("layers.py:Shift:shift=2")
    assert shift["step"][0] == shift["state_size"][0] == "absent"
    assert {status for k, (status, _) in shift.items() if "step" not in k and
            "state" not in k} == {"pass"}
    # the table prints every check with what it measured; the exit status
    for entry, status, shown in [
            ("layers.py:GLA", 0, "largest difference from forward"),
            ("layers.py:Leaky", 1, "an edit at t=1 changes the output at t=0"),
            ("layers.py:Undercount", 1, "state_size 16, 16, 16, 16; step carries 256, 256, 256"),
            ("layers.py:Shift", 0, "absent")]:
        assert mixers.check_command(entry, 16, 24) == status, entry
        out = capsys.readouterr().out
        assert f"the mixer contract on {entry}, d_model=16, seq_len=24" in out
        assert all(check in out for check in mixers.CONTRACT) and shown in out, out


def test_python_mixers_py_check_runs_the_contract_on_a_file(tmp_path):
    """The command line itself: a table of the checks, exit status 1 for a leak."""
    (tmp_path / "layers.py").write_text(BROKEN_SOURCE)
    out = subprocess.run([sys.executable, str(REPO / "mixers.py"), "--check",
                          "layers.py:Leaky", "--d_model=8", "--seq_len=24"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    lines = [line for line in out.stdout.splitlines() if "causal" in line]
    assert len(lines) == 1 and "FAIL" in lines[0]
    assert "an edit at t=1 changes the output at t=0" in lines[0]


# layers that the contract let through or misread (issue 50), most on top of the README's GLA
HOLES_SOURCE = GLA_SOURCE + '''
import torch.nn.functional as F


class Norm(nn.Module):
    """BatchNorm1d over (B, d, T): in train mode its statistics are the batch's and every
    position's, so it reads the future and the other rows."""

    def __init__(self, d_model, seq_len):
        super().__init__()
        self.proj, self.norm = nn.Linear(d_model, d_model), nn.BatchNorm1d(d_model)

    def forward(self, x):
        return self.norm(self.proj(x).transpose(1, 2)).transpose(1, 2)


class Reflect(nn.Module):
    """A causal convolution of 3 taps padded with mode="reflect": x[2], x[1] pad its left, so
    the output at t=0 reads positions 1 and 2."""

    def __init__(self, d_model, seq_len):
        super().__init__()
        self.conv = nn.Conv1d(d_model, d_model, 3, groups=d_model)

    def forward(self, x):
        return self.conv(F.pad(x.transpose(1, 2), (2, 0), mode="reflect")).transpose(1, 2)


class BareState(GLA):
    """Its state is the (B, d, d) tensor S itself."""

    def step(self, x_t, state=None):
        y, (S,) = super().step(x_t, None if state is None else (state,))
        return y, S


class NestedState(GLA):
    """Its state is a dict of a list: {"S": [S]}."""

    def step(self, x_t, state=None):
        y, (S,) = super().step(x_t, None if state is None else (state["S"][0],))
        return y, {"S": [S]}


class Chunked(GLA):
    """A chunked form that forgets the state at each chunk of 16: wrong from t = 16 on."""

    def forward(self, x):
        return torch.cat([super(Chunked, self).forward(c) for c in x.split(16, 1)], 1)


class Nudged(GLA):
    """Its forward is off by 1e-6: within float32's tolerance, not float64's."""

    def forward(self, x):
        return super().forward(x) + 1e-6


class Raises(GLA):
    def forward(self, x):
        return self.out_proj(x[..., 1:])                   # d - 1 channels: raises in torch


class Pair(GLA):
    """Returns (y, an auxiliary loss), not y."""

    def forward(self, x):
        return super().forward(x), 0.0


class Counted(GLA):
    """Counts d·d numbers before the first token too."""

    def state_size(self, t):
        return self.out_proj.in_features ** 2


class Frozen(GLA):
    """Adds 0 · a parameter: its gradient is all zeros."""

    def __init__(self, d_model, seq_len):
        super().__init__(d_model, seq_len)
        self.scale = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return super().forward(x) + 0 * self.scale
'''


@pytest.fixture
def holes(tmp_path, monkeypatch):
    """HOLES_SOURCE as holes.py in the current folder."""
    monkeypatch.chdir(tmp_path)
    Path("holes.py").write_text(HOLES_SOURCE)


def test_the_contract_runs_causal_and_batch_rows_in_train_mode_too(holes):
    """BatchNorm1d over (B, d, T) keeps the contract in eval mode (running statistics) and
    breaks it in train mode, the mode it trains in: an edit at t changes earlier outputs,
    other rows change row 0. A layer with dropout is not a leak: every forward is seeded."""
    results = contract("holes.py:Norm")
    status, measured = results["causal"]
    assert status == "fail" and measured.startswith(
        "in train mode, an edit at t=1 changes the output at t=0 by "), measured
    status, measured = results["batch rows"]
    assert status == "fail" and measured.startswith(
        "in train mode, the other rows changed, row 0's output changes by "), measured
    dropout = contract("attention:dropout=0.5")
    assert dropout["causal"][0] == dropout["batch rows"][0] == "pass", dropout


def test_the_contract_edits_every_position_and_names_each_leak(holes):
    """A reflect-padded convolution leaks positions 1 and 2 into position 0 only: the causal
    check edits every position and lists every leak (edited position -> earlier output)."""
    status, measured = contract("holes.py:Reflect")["causal"]
    assert status == "fail", measured
    assert measured.startswith("in eval mode, an edit at t=1 changes the output at t=0 by ")
    assert measured.endswith("every leak (edit -> earlier output): 1 -> 0, 2 -> 0"), measured
    status, measured = contract("holes.py:GLA")["causal"]
    assert (status, measured) == ("pass", "edits at all 24 positions change no earlier "
                                          "output, eval and train mode (largest change 0, "
                                          "allowed 1e-12)")


def test_the_contract_counts_a_state_of_any_structure(holes):
    """A state is a tensor, or tuples, lists and dicts of them, nested (mixers.state_leaves):
    state_size is checked against the numbers it holds, whatever its structure."""
    for entry in ("holes.py:BareState", "holes.py:NestedState"):
        assert contract(entry)["state_size"] == (
            "pass", "after t = 1, 2, 5, 24 tokens: state_size 256, 256, 256, 256; step carries "
                    "256, 256, 256, 256"), entry
    S, h = torch.zeros(3, 4, 4), torch.zeros(3, 5)
    assert mixers.state_numel({"S": [S], "conv": (h, {"x": h})}) == 16 + 5 + 5
    assert mixers.state_numel(S) == 16 and mixers.state_numel(()) == 0


def test_the_step_check_names_the_first_position_where_step_departs(holes):
    """A chunked form wrong from its second chunk on: the step check says t = 16."""
    status, measured = contract("holes.py:Chunked")["step"]
    assert status == "fail" and "departs first at t = 16" in measured, measured


def test_the_step_check_holds_in_every_dtype_not_only_the_last(holes):
    """A difference of 1e-6 is within float32's tolerance (1e-5) and fails float64's."""
    status, measured = contract("holes.py:Nudged")["step"]
    assert status == "fail", measured
    assert re.search(r"1e-06 in float64 \(tolerance 1e-10; departs first at t = 0\)", measured)
    assert measured.endswith("1e-06 in float32 (tolerance 1e-05)"), measured     # float32 holds


def test_an_exception_in_your_layer_names_its_file_and_line(holes):
    """The check that an exception fails names the innermost line of the user's file it
    passed through; --traceback prints the whole traceback (stderr), the table as before."""
    line = HOLES_SOURCE.splitlines().index(
        "        return self.out_proj(x[..., 1:])                   # d - 1 channels: raises "
        "in torch") + 1
    status, measured = contract("holes.py:Raises")["shape"]
    assert status == "fail" and measured.startswith("raised RuntimeError: "), measured
    assert measured.endswith(f", at holes.py:{line} in forward"), measured
    out = subprocess.run([sys.executable, str(REPO / "mixers.py"), "--check",
                          "holes.py:Raises", "--d_model=8", "--seq_len=8", "--traceback"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and f"holes.py:{line} in forward" in out.stdout, out.stdout
    assert "Traceback (most recent call last)" in out.stderr, out.stderr
    assert f'File "holes.py", line {line}, in forward' in out.stderr, out.stderr


def test_after_a_shape_failure_the_later_checks_are_skipped(holes, capsys):
    """A layer that returns (y, loss) fails the shape check; every later check, which reads a
    (B, T, d) output, is skipped and says why, instead of failing on the tuple."""
    results = contract("holes.py:Pair")
    assert results.pop("shape") == ("fail", "(B, T, d) = (3, 24, 16) float32 in, a tuple out")
    assert set(results.values()) == {("skipped", "the shape check failed: this check reads a "
                                                 "(B, T, d) output")}, results
    assert mixers.check_command("holes.py:Pair", 16, 24) == 1
    assert capsys.readouterr().out.count("skipped") == len(mixers.CONTRACT) - 1


def test_state_size_must_be_0_before_the_first_token(holes):
    """state_size(0) is 0: before the first token a mixer holds nothing."""
    assert contract("holes.py:Counted")["state_size"] == (
        "fail", "after t = 1, 2, 5, 24 tokens: state_size 256, 256, 256, 256; step carries "
                "256, 256, 256, 256; state_size(0) = 256, not 0")


def test_a_parameter_whose_gradient_is_all_zeros_is_not_reached(holes):
    """The gradients check counts a parameter reached where its gradient has a nonzero
    number, not where it has a gradient at all (0 · p has one, of zeros)."""
    assert contract("holes.py:Frozen")["gradients"] == (
        "fail", "1 of 7 parameters get no gradient (none, or all zeros): scale")


def test_training_checks_a_mixer_of_your_own_again_when_its_file_changes(tmp_path,
                                                                         monkeypatch):
    """train.check_outside_mixers remembers the contract's verdict per version of the file
    (train._FAILED is keyed by its digest): a file fixed after it failed trains, a file broken
    after it passed is refused."""
    monkeypatch.chdir(tmp_path)
    leaky = GLA_SOURCE + '''

class GLA(GLA):
    def forward(self, x):                                  # reads the next token too
        return super().forward(x + torch.cat([x[:, 1:], x[:, :1] * 0], 1))
'''
    for path, versions in [("fixed.py", (leaky, GLA_SOURCE)), ("broken.py", (GLA_SOURCE, leaky))]:
        for text in versions:
            Path(path).write_text(text)
            make = lambda: train.make_config(mixer=f"{path}:GLA", d_model=16, seq_len=16,
                                             num_kv_pairs=2, vocab_size=64)
            if text is leaky:
                with pytest.raises(ValueError, match="fails the mixer contract's causal check"):
                    make()
            else:
                assert make().mixer_source == f"{path}={mixers.source_digest(text)}"


def test_a_mixer_setting_names_a_mixer_of_your_own_by_its_path(tmp_path, monkeypatch):
    """split_mixer's grammar: SOURCE:Class, then options; a built-in name, then options."""
    monkeypatch.chdir(tmp_path)
    Path("my").mkdir()
    Path("my/layers.py").write_text(BROKEN_SOURCE)
    assert mixers.split_mixer("my/layers.py:Shift:shift=2") == ("my/layers.py:Shift",
                                                                 ["shift=2"])
    assert mixers.split_mixer("base_conv:kernel_size=3") == ("base_conv", ["kernel_size=3"])
    assert mixers.split_mixer("pkg.layers:Shift") == ("pkg.layers:Shift", [])
    setting = "attention,my/layers.py:Shift:shift=2"
    layers = train.parse_layers(setting, 2)
    assert layers == [("attention", {}), ("my/layers.py:Shift", {"shift": 2})]
    assert mixers.mixer_setting(layers) == setting
    model = train.LanguageModel(small_config(mixer=setting, d_model=16))
    assert type(model.blocks[1].mixer).__name__ == "Shift" and model.blocks[1].mixer.shift == 2
    for entry, match in [("my/layers.py:Shift:width=2", "option 'width=2' of my/layers.py:Shift "
                                                        "is not allowed: .* one of shift"),
                         ("my/layers.py:Shift:shift", "option 'shift' of"),
                         ("my/layers.py:Shift:form=official", "option 'form=official'")]:
        with pytest.raises(ValueError, match=match):
            train.parse_layers(entry, 1)
    # a module on sys.path, by package.module:Class; its source is its file's
    Path("i38_pkg").mkdir()
    Path("i38_pkg/__init__.py").write_text("")
    Path("i38_pkg/layers.py").write_text(BROKEN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = train.make_config(mixer="i38_pkg.layers:GLA", d_model=16, seq_len=16,
                               num_kv_pairs=2, vocab_size=64)
    assert config.mixer_source == f"i38_pkg.layers={mixers.source_digest(BROKEN_SOURCE)}"
    assert train.run_name(config).startswith("i38_pkg.layers-GLA-N16-")


def test_a_mixer_of_your_own_trains_by_its_path_and_its_source_names_the_run(tmp_path,
                                                                              monkeypatch):
    """python train.py --mixer=my/gla.py:GLA: the record holds the path and the digest of the
    file's source (mixer_source), its name the file's name and class; a changed file is
    another run. The class facts the model reads default to Mixer's (no positions, no token
    ids, no auxiliary loss)."""
    monkeypatch.chdir(tmp_path)
    Path("my").mkdir()
    Path("my/gla.py").write_text(GLA_SOURCE)
    args = ["--mixer=my/gla.py:GLA", "--seq_len=16", "--num_kv_pairs=2", "--vocab_size=64",
            "--d_model=16", "--num_train=64", "--num_test=16", "--num_valid=16",
            "--batch_size=16", "--max_steps=2", "--eval_every=2", "--progress=false",
            "--out_dir=runs"]
    assert train.main(args) == 0
    [path] = Path("runs").glob("*.json")
    record = json.loads(path.read_text())
    digest = mixers.source_digest(GLA_SOURCE)
    assert record["config"]["mixer"] == "my/gla.py:GLA"
    assert record["config"]["mixer_source"] == f"my/gla.py={digest}"
    assert json.loads(train.identity(train.Config(**record["config"])))["mixer_source"] == \
        f"my/gla.py={digest}"
    assert path.name.startswith("gla.py-GLA-N16-D2-d16-") and record["steps"] == 2
    config = train.make_config(**train.parse_arguments(args))
    assert train.record_path(config) == path
    model = train.LanguageModel(config)
    assert model.pos is None and model.aux_loss() == 0
    edited = GLA_SOURCE + "# changed\n"
    Path("my/gla.py").write_text(edited)
    changed = train.make_config(**train.parse_arguments(args))
    assert changed.mixer_source == f"my/gla.py={mixers.source_digest(edited)}"
    assert train.record_path(changed) != path
    assert train.run_name(train.Config(**record["config"])) == path.stem  # the record's own
    with pytest.raises(ValueError, match="mixer_source=.* is not allowed: it is filled in"):
        train.check_config(config)                      # made before the file changed


BAD_MIXERS = [  # (the file written, the mixer, what the one line says)
    (None, "missing.py:GLA", "there is no file 'missing.py'"),
    ("import torch\ndef GLA(:\n", "bad.py:GLA", "bad.py fails to import: SyntaxError"),
    ("import no_such_module_i38\n", "bad.py:GLA", "bad.py fails to import: ModuleNotFoundError"),
    (None, "no_such_module_i38.layers:GLA", "module 'no_such_module_i38.layers' fails to import"),
    (GLA_SOURCE, "gla.py:Gla", "gla.py has no 'Gla'; its nn.Module classes: GLA"),
    ("def GLA(d_model, seq_len):\n    pass\n", "f.py:GLA",
     "GLA is a function, not a subclass of torch.nn.Module"),
    ("import torch.nn as nn\nclass One(nn.Module):\n    def __init__(self, d_model):\n"
     "        super().__init__()\n", "one.py:One",
     r"One\(d_model\) does not take \(d_model, seq_len\): a mixer is built as "
     r"One\(d_model, seq_len, \*\*options\)"),
]


@pytest.mark.parametrize("text, entry, message", BAD_MIXERS, ids=[
    "no-file", "syntax-error", "import-error", "no-module", "no-class", "a-function",
    "constructor"])
def test_a_mixer_of_your_own_that_cannot_load_is_refused_in_one_line(text, entry, message,
                                                                     tmp_path, monkeypatch,
                                                                     capsys):
    """train.py and mixers.py --check: exit status 2, one line naming what is wrong, nothing
    written."""
    monkeypatch.chdir(tmp_path)
    if text is not None:
        Path(entry.split(":")[0]).write_text(text)
    before = set(Path().iterdir())
    assert train.main([f"--mixer={entry}", "--out_dir=runs"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1, err
    assert mixers.check_command(entry) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1, err
    assert set(Path().iterdir()) == before


@pytest.mark.parametrize("cls, message", [
    ("Leaky", "fails the mixer contract's causal check at d_model=16, seq_len=16: in eval "
              "mode, an edit at t=1 changes the output at t=0 "),
    ("Wide", r"fails the mixer contract's shape check at d_model=16, seq_len=16: \(B, T, d\) = "
             r"\(3, 16, 16\) float32 in, \(3, 16, 32\) float32 out"),
    ("OnCpu", "fails the mixer contract's device check at d_model=16, seq_len=16: raised "
              "RuntimeError: .*cpu")])
def test_training_refuses_a_mixer_of_your_own_that_breaks_the_contract(cls, message, tmp_path,
                                                                       monkeypatch, capsys):
    """A layer that reads the future, returns another shape, or makes a tensor on the CPU
    (which would train here and fail on a GPU: the whole contract runs, the meta-device check
    included) is refused before a run trains or writes anything (exit status 2, one line);
    --check fails it (exit status 1)."""
    monkeypatch.chdir(tmp_path)
    Path("layers.py").write_text(BROKEN_SOURCE)
    args = [f"--mixer=layers.py:{cls}", "--d_model=16", "--seq_len=16", "--num_kv_pairs=2",
            "--out_dir=runs"]
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1, err
    assert not Path("runs").exists()
    assert mixers.check_command(f"layers.py:{cls}", 16, 16) == 1


@functools.cache
def mixers_top_level(modules=(mixers,)):
    """The top level of `modules` (mixers.py; the lab's official forms copy from it and
    experiments/official.py) as a reader copying from them sees it: (definitions, source,
    imports), with each definition's node by name (a class, a function, or an assignment such
    as a dict of forms or a constant), source(node) its lines, and mixers.py's import lines
    (a module after it imports nothing else but names of mixers.py). `definitions` holds the
    modules' nodes in turn, each in the order of its file: the order a copy lists them in."""
    where = {}                                     # node -> the lines of its file
    definitions, imports = {}, []
    for module in modules:
        lines = Path(module.__file__).read_text().splitlines()
        for node in ast.parse("\n".join(lines)).body:
            where[node] = lines
            if isinstance(node, (ast.Import, ast.ImportFrom)) and module is mixers:
                imports.append("\n".join(lines[node.lineno - 1:node.end_lineno]))
            names = ([node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else
                     [target.id for target in getattr(node, "targets", [])
                      if isinstance(target, ast.Name)])
            definitions.update(dict.fromkeys(names, node))
    source = lambda node: "\n".join(where[node][node.lineno - 1:node.end_lineno])
    return definitions, source, imports


def definitions_needed(name, modules=(mixers,)):
    """The module-level definitions of mixers.py (of `modules`: mixers_top_level) that `name`
    uses, and those they use, and so on: what a reader copies to use it elsewhere."""
    definitions, _, _ = mixers_top_level(modules)
    needed, todo = set(), [name]
    while todo:
        used = todo.pop()
        if used not in needed and used in definitions and used != "MIXERS":
            needed.add(used)
            todo += [m.id for m in ast.walk(definitions[used]) if isinstance(m, ast.Name)]
    return needed - {name}


def copy_line_names(cls, definitions):
    """The top-level names of mixers.py that the "To copy:" line of cls's docstring tells a
    reader to copy, read by the rules in the docstring of the test below."""
    line = re.search(r"To copy: (this class.*?)\.(?:\s|$)", " ".join((cls.__doc__ or "").split()))
    assert line, f"{cls.__name__}'s docstring has a line 'To copy: this class, ...'"
    words = re.findall(r"\w+", line.group(1))
    unknown = {w for w in words if re.search("[_0-9A-Z]", w)} - definitions.keys()
    assert not unknown, f"{cls.__name__}'s line names what mixers.py does not define: {unknown}"
    names = {cls.__name__} | {w for w in words if w in definitions}
    for other in re.findall(r"(\w+) with what its line names", line.group(1)):
        names |= copy_line_names(getattr(mixers, other), definitions)
    return names


def assert_the_copy_runs_as_the_module(cls, modules=(mixers,), **options):
    """cls copied from `modules` (mixers_top_level) as its "To copy:" line says runs as the
    module does, built with `options`: the test below says how."""
    definitions, source, imports = mixers_top_level(modules)
    named = copy_line_names(cls, definitions)
    needed = definitions_needed(cls.__name__, modules) | {cls.__name__}
    assert named == needed, f"the line misses {needed - named}, names unused {named - needed}"
    order = list(definitions.values())
    nodes = sorted({definitions[used] for used in named}, key=order.index)
    copy = "\n".join(imports + [source(node) for node in nodes])
    namespace = {"__name__": "copied"}
    exec(compile(copy, f"<the copy of {cls.__name__}>", "exec"), namespace)
    torch.manual_seed(0)
    module, copied = cls(16, 12, **options), namespace[cls.__name__](16, 12, **options)
    copied.load_state_dict(module.state_dict())
    x = torch.randn(2, 12, 16)
    assert torch.allclose(mix(copied, x), mix(module, x))
    y, states = run_steps(module, x[:, :2])        # from no state, then from the first token's
    y_copied, states_copied = run_steps(copied, x[:, :2])
    assert torch.allclose(y_copied, y)
    assert all(map(torch.allclose, states_copied[-1], states[-1]))


@pytest.mark.parametrize("cls", MIXERS.values(), ids=lambda cls: cls.__name__)
def test_a_mixer_copied_as_its_docstring_says_runs_as_the_module_does(cls):
    """The "To copy:" line of every mixer's docstring names exactly the definitions it uses
    (definitions_needed): every one, for every option, and no other. Copied alone into a
    namespace that holds only mixers.py's imports, they give a layer whose forward and step
    equal the module's with the same weights.

    How the line reads (copy_line_names):
    - it runs from "To copy:" to the first full stop, and starts with "this class" (cls);
    - every other word that is a top-level name of mixers.py is copied, wherever it stands:
      in the list, in a group "X with Y (Z, W)", in parentheses;
    - "X with what its line names" copies X and what X's own "To copy:" line names;
    - the other words are English, and a word that looks like code (an underscore, a digit
      or a capital letter) must be a top-level name of mixers.py."""
    assert_the_copy_runs_as_the_module(cls)


@pytest.mark.parametrize("name", MIXERS)
def test_a_paper_form_copies_without_the_official_machinery(name):
    """A paper form uses no official class, function or filter (the official forms are
    classes of their own) and looks up a filter by name only where a filter is an option
    (long_conv)."""
    needed = definitions_needed(MIXERS[name].__name__)
    # long_conv's filter="mlp" is the official BaseConv's filter, over the official features
    official = {used for used in needed if "official" in used.lower()}
    assert official == ({"OFFICIAL_FREQUENCIES"} if name == "long_conv" else set()), needed
    assert ("FILTERS" in needed) == (name == "long_conv")


def test_base_conv_uses_only_the_causal_convolution_one_filter_and_mixer():
    """The paper's BaseConv, copied, is its function, the causal convolution with its forms,
    one explicit filter and Mixer with its argument checks: nothing of another filter, mixer
    or official form."""
    assert definitions_needed("BaseConv") == {
        "base_conv", "ExplicitFilter", "causal_conv", "causal_conv_direct", "causal_conv_fft",
        "causal_conv_fast", "CONV_IMPLS", "SHORT_FILTER", "Mixer", "check_choice", "check_positive"}


def test_initial_values_are_the_ones_the_papers_fix():
    """What each paper fixes at initialisation, checked on the module as built (a one-line
    change of any of them trains another model and no formula test would see it). A range
    drawn at random is checked at both ends, on enough draws (hundreds) that a narrower or
    constant draw fails."""
    torch.manual_seed(0)

    def spans(values, low, high, log=True):
        """In [low, high] and near both ends: within 2x (log) or 1/16 of the range."""
        lo, hi = values.min().item(), values.max().item()
        if log:
            return low <= lo < 2 * low and high / 2 < hi <= high
        margin = (high - low) / 16
        return low <= lo < low + margin and high - margin < hi <= high

    m = mixers.Mamba(64, 32, d_state=16)                        # Mamba (Gu & Dao, §3.6)
    assert torch.equal(m.A_log, torch.log(torch.arange(1, 17.0)).repeat(128, 1))
    assert torch.equal(m.skip, torch.ones(128))
    assert spans(F.softplus(m.dt_bias), 1e-3, 0.1)                  # log-uniform in [1e-3, 1e-1]
    r = m.dt_proj.in_features
    assert r == 4 and m.dt_proj.weight.abs().max() <= r ** -0.5 < 2 * m.dt_proj.weight.abs().max()
    h3 = mixers.H3(512, 32, d_state=8)                          # S4D-Lin
    assert torch.allclose(-h3.log_neg_A_re.exp(), torch.full((512, 4), -0.5))
    assert torch.allclose(h3.A_im, math.pi * torch.arange(4.0).repeat(512, 1))
    assert spans(h3.log_dt.exp(), 1e-3, 0.1)
    rwkv = mixers.RWKV(9, 32)                                   # RWKV-4's ramps
    ramp = torch.arange(9.0) / 8
    assert torch.allclose(rwkv.w_log, -5 + 8 * ramp ** 0.7)
    assert torch.allclose(rwkv.u, torch.full((9,), math.log(0.3)))
    assert all(torch.equal(mu, ramp) for mu in (rwkv.mix_r, rwkv.mix_k, rwkv.mix_v))
    retnet = mixers.RetNet(16, 32, num_heads=4)                 # γ_h = 1 - 2^(-5-h)
    assert torch.equal(retnet.gamma, 1 - 2.0 ** -torch.arange(5, 9.0))
    sel = mixers.SelectiveAttention(16, 32)                     # every row on: σ(2) ≈ 0.88
    assert torch.equal(sel.gate, torch.zeros(16)) and sel.gate_bias.item() == 2.0
    m2 = mixers.Mamba2(256, 32, headdim=2)                      # Mamba2Simple: a ~ -U(1, 16)
    assert m2.A_log.shape == (256,) and spans(m2.A_log.exp(), 1, 16, log=False)
    assert torch.equal(m2.skip, torch.ones(256)) and spans(F.softplus(m2.dt_bias), 1e-3, 0.1)
    gdn = mixers.GatedDeltaNet(256, 32, num_heads=256)          # Mamba-2's gate: A ~ U(0, 16)
    assert spans(gdn.A_log.exp(), 0, 16, log=False)
    assert spans(F.softplus(gdn.dt_bias), 1e-3, 0.1)
    r7 = mixers.RWKV7(8, 32, num_heads=2)                       # fla's first layer
    ch = torch.arange(8.0)
    assert torch.allclose(r7.mix[0], 1 - (ch / 8) ** 0.2)
    assert torch.allclose(r7.mix[1], 1 - (ch / 8) ** 0.9)
    assert torch.allclose(r7.k_k, 0.71 - 0.1 * (ch / 7 - 0.5)) and torch.all(r7.k_a == 1.02)
    # ((ch mod 4) - 1.5) / 1.5, signed square
    zigzag = torch.tensor([-1.0, -1 / 9, 1 / 9, 1.0]).repeat(2)
    assert torch.allclose(r7.w_lora.up.bias, -6 + 6 * ch / 7 + 0.5 + 2.5 * zigzag)
    assert torch.allclose(r7.k_proj.weight @ r7.k_proj.weight.T, 0.01 * torch.eye(8), atol=1e-6)


# ----------------------------------------------------------------------------------------
# mixers.py: attention

@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_attention_module_is_multihead_softmax_written_out(impl):
    """The whole module, 4 heads of hs = 4: per head softmax_{j<=i}(q_i·k_j / √hs) v_j, the
    heads concatenated in order, then the output projection."""
    T, H, hs = 10, 4, 4
    m = make_mixer("attention", T=T, num_heads=H, impl=impl)
    x = torch.randn(2, T, 16, dtype=F64)
    q, k, v = (x @ m.qkv.weight.T + m.qkv.bias).split(16, -1)
    y = torch.empty(2, T, 16, dtype=F64)
    for h in range(H):
        head = slice(h * hs, (h + 1) * hs)
        for i in range(T):
            w = ((q[:, i:i + 1, head] * k[:, :i + 1, head]).sum(-1) / math.sqrt(hs)).softmax(-1)
            y[:, i, head] = (w[..., None] * v[:, :i + 1, head]).sum(1)
    assert torch.allclose(m(x), y @ m.out_proj.weight.T + m.out_proj.bias, atol=1e-12)


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("name,kw", [("attention", {}), ("sliding_window", dict(window=3)),
                                     ("blocked_attention", dict(block_size=3))])
def test_attention_dropout_drops_weights_in_training_only(name, kw, impl):
    """dropout=0.1 (the official configs'): training outputs are noisy with the eval output
    as their mean (inverted dropout scales kept weights by 1/(1-p)); eval drops nothing.
    T=8 spans several windows and blocks of 3, the last one ragged."""
    m = make_mixer(name, T=8, dropout=0.1, impl=impl, **kw)
    x = torch.randn(1, 8, 16, dtype=F64)
    want = make_mixer(name, T=8, impl=impl, **kw).eval()(x)        # the same weights, no dropout
    assert torch.allclose(m.eval()(x), want, atol=1e-12)
    torch.manual_seed(0)
    with torch.no_grad():
        draws = torch.stack([m.train()(x) for _ in range(4000)])
    assert not torch.allclose(draws[0], want, atol=1e-3), "training drops weights"
    assert (draws.mean(0) - want).abs().max() < 0.05 * want.abs().max()


# ----------------------------------------------------------------------------------------
# sliding-window and blocked attention

def test_masks_are_what_their_docstrings_say():
    T = 9
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    assert np.array_equal(mixers.sliding_window_mask(T, 3).numpy(), (j <= i) & (j > i - 3))
    assert np.array_equal(mixers.block_mask(T, 4).numpy(), (j <= i) & (i // 4 == j // 4))
    assert torch.equal(mixers.sliding_window_mask(T, T), mixers.causal_mask(T))
    assert torch.equal(mixers.block_mask(T, T), mixers.causal_mask(T))


@pytest.mark.parametrize("T", [20, 24])
def test_windowed_fast_forms_equal_their_masked_references(T):
    """Outputs and gradients, heads taken from a (B, T, H, hs) layout as the modules do, T
    a multiple of the window or block (20) or ragged (24), windows from 1 to past T. (CASES
    covers the modules at T=24 with window = block_size = 5 only.)"""
    q, k, v = (torch.randn(2, T, 4, 3, dtype=F64).transpose(1, 2).requires_grad_()
               for _ in range(3))
    for fast, ref in (mixers.SLIDING_WINDOW_IMPLS.values(),
                      mixers.BLOCKED_ATTENTION_IMPLS.values()):
        for window in (1, 4, 5, 7, T - 1, T, T + 5):
            yf, yr = fast(q, k, v, window), ref(q, k, v, window)
            assert torch.allclose(yf, yr, atol=1e-12, rtol=0), (fast.__name__, window)
            gy = torch.randn_like(yf)
            for a, b in zip(torch.autograd.grad(yf, (q, k, v), gy),
                            torch.autograd.grad(yr, (q, k, v), gy)):
                assert torch.allclose(a, b, atol=1e-12, rtol=0), (fast.__name__, window)


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_window_of_T_or_more_is_exactly_attention_and_of_one_attends_only_to_itself(impl):
    """A window of T or more: attention, bit for bit (T - 1 is not). A window of 1: softmax
    over a single key is 1, so y_i = W_o v_i + b_o, and step keeps nothing."""
    x = torch.randn(2, 24, 16, dtype=F64)
    attn = make_mixer("attention", impl=impl)
    y = attn(x)
    for window in (24, 1000):
        m = make_mixer("sliding_window", window=window, impl=impl)
        m.load_state_dict(attn.state_dict())
        assert torch.equal(m(x), y) and torch.equal(run_steps(m, x)[0], run_steps(attn, x)[0])
    # the comparison has power: one token less of window changes the output
    m = make_mixer("sliding_window", window=23, impl=impl)
    m.load_state_dict(attn.state_dict())
    assert not torch.allclose(m(x)[:, 23], y[:, 23], atol=1e-6)
    # (rows the window does not clip: equal up to rounding, the fast form takes another path)
    assert torch.allclose(m(x)[:, :23], y[:, :23], atol=1e-12, rtol=0)
    m = make_mixer("sliding_window", window=1, impl=impl)
    v = m.qkv(x)[..., 32:]
    assert torch.allclose(m(x), m.out_proj(v), atol=1e-12)
    ys, states = run_steps(m, x)
    assert torch.allclose(ys, m.out_proj(v), atol=1e-12)
    assert all(mixers.state_numel(s) == 0 for s in states), "nothing to remember"


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("block_size", [1, 5, 8])
def test_blocked_attention_is_attention_on_each_block(impl, block_size):
    m = make_mixer("blocked_attention", block_size=block_size, impl=impl)
    attn = make_mixer("attention", impl=impl)
    attn.load_state_dict(m.state_dict())
    x = torch.randn(2, 24, 16, dtype=F64)
    y = torch.cat([attn(x[:, s:s + block_size]) for s in range(0, 24, block_size)], dim=1)
    assert torch.allclose(m(x), y, atol=1e-12)
    if block_size > 1:
        assert not torch.allclose(attn(x), y, atol=1e-6), "blocks do change the output"


@pytest.mark.parametrize("T", [128, 4096])
@pytest.mark.parametrize("hs", [16, 64, 128])
def test_rotary_in_float32_turns_as_float64_to_T_ulps(T, hs):
    """rotary on float32 input (angles in float32: an Apple GPU has no float64) against the
    formula written out in float64, channel pairs (i, i + hs/2) turned by t·10000^(-2i/hs):
    every pair's error, relative to its length, within T·2⁻²³ (the angle's float32 rounding
    at t < T; 1.5e-5 at T = 128, the language-model experiment's, and 4.9e-4 at 4096)."""
    x, t = torch.randn(T, hs, dtype=F64), torch.arange(T)
    angle = t[:, None].double() * 10000.0 ** (-2 * torch.arange(hs // 2, dtype=F64) / hs)
    x1, x2 = x[:, :hs // 2], x[:, hs // 2:]
    want = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()],
                     dim=-1)
    got = mixers.rotary(x.float(), t)
    assert got.dtype == torch.float32
    error = got.double() - want
    relative = (error[:, :hs // 2].hypot(error[:, hs // 2:]) / x1.hypot(x2)).max()
    assert relative < T * 2 ** -23, relative


def test_rotary_scores_depend_on_relative_positions_only():
    """q·k after rotary at positions (i, j) equals it at (i + s, j + s), and differs from it
    at (i, j + 1); each vector keeps its norm. An odd head size is refused."""
    q, k = torch.randn(2, 1, 8, dtype=F64), torch.randn(2, 1, 8, dtype=F64)
    score = lambda i, j: (mixers.rotary(q, torch.tensor([i])) *
                          mixers.rotary(k, torch.tensor([j]))).sum(-1)
    assert torch.allclose(score(3, 1), score(10, 8), atol=1e-12)
    assert not torch.allclose(score(3, 1), score(3, 2))
    assert torch.allclose(mixers.rotary(q, torch.tensor([5])).norm(dim=-1), q.norm(dim=-1))
    with pytest.raises(ValueError, match="rotary=True is not allowed with a head size of 5"):
        mixers.Attention(10, 8, num_heads=2, rotary=True)


def test_attention_with_a_short_conv_is_attention_of_x_plus_the_conv():
    """short_conv=3: attention(x + conv(x)), with the plain layer's weights; and the conv's
    filter reaches 2 tokens back, so it changes the output."""
    m, plain = make_mixer("attention", short_conv=3), make_mixer("attention")
    plain.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("conv")})
    x = torch.randn(2, 24, 16, dtype=F64)
    h = m.conv.filter.h                                                     # (d, 3)
    conv = sum(h[:, s] * F.pad(x, (0, 0, s, 0))[:, :24] for s in range(3))  # written out
    with torch.no_grad():
        assert h.shape == (16, 3) and torch.allclose(m.conv(x), conv, atol=1e-12)
        assert torch.allclose(m(x), plain(x + conv), atol=1e-12)
        assert not torch.allclose(m(x), plain(x))
    with pytest.raises(ValueError, match="short_conv=-1 is not allowed"):
        mixers.Attention(16, 24, short_conv=-1)


def test_window_and_block_states_have_the_documented_sizes():
    d, x = 16, torch.randn(1, 24, 16, dtype=F64)
    for m, size in ((make_mixer("sliding_window", window=5), lambda t: 2 * min(t, 4) * d),
                    (make_mixer("blocked_attention", block_size=5), lambda t: 2 * (t % 5) * d)):
        _, states = run_steps(m, x)
        assert [mixers.state_numel(s) for s in states] == [size(t) for t in range(1, 25)]


# ----------------------------------------------------------------------------------------
# the causal convolution shared by every convolving mixer

def conv_by_numpy(u, h):
    """np.convolve per batch row and channel, truncated to the first T outputs."""
    B, T, d = u.shape
    y = np.zeros((B, T, d))
    for b in range(B):
        for ch in range(d):
            y[b, :, ch] = np.convolve(u[b, :, ch].numpy(), h[ch].numpy())[:T]
    return torch.from_numpy(y)


@pytest.mark.parametrize("T", [1, 7, 24, 33])
@pytest.mark.parametrize("K", [1, 3, 16, 17, 24, 40])
def test_causal_conv_forms_agree(T, K):
    """The direct sum is np.convolve, and the FFT is the direct sum, for short filters as for
    long ones. (The fast form is one of the two by K: the next test.)"""
    u, h = torch.randn(2, T, 5, dtype=F64), torch.randn(5, K, dtype=F64)
    ref = mixers.causal_conv_direct(u, h)
    assert torch.allclose(ref, conv_by_numpy(u, h), atol=1e-12)
    assert torch.allclose(mixers.causal_conv_fft(u, h), ref, atol=1e-12)


def test_causal_conv_fast_takes_the_direct_sum_for_short_filters_only(monkeypatch):
    """The fast form is the direct sum up to SHORT_FILTER taps and the FFT beyond (the two
    agree in value and gradient: test_mixer_fast_equals_reference sends every filter through
    the FFT); the direct sum passes gradcheck."""
    monkeypatch.setattr(mixers, "causal_conv_fft", lambda u, h: "fft")
    u = torch.randn(2, 40, 3, dtype=F64)
    for K, form in ((mixers.SHORT_FILTER, "direct"), (mixers.SHORT_FILTER + 1, "fft"), (40, "fft")):
        y = mixers.causal_conv_fast(u, torch.randn(3, K, dtype=F64))
        assert (y == "fft" if form == "fft" else torch.is_tensor(y)), K
    u, h = u[:1, :9].requires_grad_(), torch.randn(3, 4, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(mixers.causal_conv_direct, (u, h))
    with pytest.raises(ValueError, match="impl"):
        mixers.causal_conv(u, h, "refrence")


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_causal_conv_continues_from_its_state(impl):
    """Convolving a sequence in pieces (one token at a time, or 5 + 7) with the state handed
    on is convolving it whole; the state is the last min(t, K-1) inputs."""
    u = torch.randn(2, 12, 3, dtype=F64)
    for K in (1, 4, 12, 20):
        h = torch.randn(3, K, dtype=F64)
        y, _ = mixers.causal_conv(u, h, impl)
        for pieces in ([1] * 12, [5, 7]):
            state, ys, t = None, [], 0
            for length in pieces:
                y_part, state = mixers.causal_conv(u[:, t:t + length], h, impl, state)
                ys.append(y_part)
                t += length
                assert torch.equal(state, u[:, t - min(t, K - 1):t])
            assert torch.allclose(torch.cat(ys, 1), y, atol=1e-12)


def test_implicit_filter_decays_as_documented():
    decay = mixers.exponential_decay(101, 4, dtype=F64)
    assert torch.allclose(decay[:, 0], torch.ones(4, dtype=F64))
    assert decay[-1, 30].item() == pytest.approx(1e-2, rel=1e-9)     # fastest: 1% at t=0.3
    assert decay[0, 100].item() == pytest.approx(1e-2 ** (1 / 1.5), rel=1e-9)
    assert mixers.ImplicitFilter(8, 50).double()().shape == (8, 50)


# ----------------------------------------------------------------------------------------
# BaseConv

def test_base_conv_paper_form_is_the_formula():
    """y[t, ch] = (Σ_e u[t, e] W[e, ch] + b1[t, ch]) · (Σ_{s<=t} h[ch, s] u[t-s, ch] + b2[t, ch])"""
    T, d = 6, 3
    m = make_mixer("base_conv", d=d, T=T)
    with torch.no_grad():
        m.b1.normal_(), m.b2.normal_()
    u = torch.randn(2, T, d, dtype=F64)
    W, h, b1, b2 = m.proj.weight.T, m.filter.h, m.b1, m.b2
    y = torch.zeros(2, T, d, dtype=F64)
    for b in range(2):
        for t in range(T):
            for ch in range(d):
                gate = sum(u[b, t, e] * W[e, ch] for e in range(d)) + b1[t, ch]
                conv = sum(h[ch, s] * u[b, t - s, ch] for s in range(t + 1)) + b2[t, ch]
                y[b, t, ch] = gate * conv
    assert torch.allclose(m(u), y, atol=1e-12) and torch.allclose(run_steps(m, u)[0], y, atol=1e-12)


def test_positional_features_are_the_official_ones():
    """zoology's PositionalEmbedding(emb_dim, seq_len): t = linspace(0, 1, seq_len),
    w = 2π·s/seq_len at s = 0, ..., seq_len - 1, f = linspace(1e-4, bands - 1, bands),
    z = [t, Re, Im of exp(-i f w)]."""
    for seq_len, bands in ((24, 1), (50, 4)):
        t = torch.linspace(0, 1, seq_len, dtype=F64)[:, None]
        w = 2 * math.pi * torch.linspace(0, seq_len - 1, seq_len, dtype=F64)[:, None] / seq_len
        f = torch.linspace(1e-4, bands - 1, bands, dtype=F64)[None]
        z = torch.exp(-1j * f * w)
        expected = torch.cat([t, z.real, z.imag], dim=-1)
        assert torch.allclose(mixers.positional_features(seq_len, f[0], dtype=F64), expected,
                              atol=1e-12)
    z = mixers.positional_features(64, mixers.OFFICIAL_FREQUENCIES, dtype=F64)
    assert z.shape == (64, 3), "t, cos, -sin of one band"
    assert (z[:, 1] - 1).abs().max() < 1e-6 and z[:, 2].abs().max() < 1e-3, "~constants"


def test_base_conv_paper_form_rejects_longer_inputs():
    m = make_mixer("base_conv", form="paper")
    with pytest.raises(ValueError, match="T=25 is not allowed.*seq_len=24"):
        m(torch.randn(1, 25, 16, dtype=F64))
    _, states = run_steps(m, torch.randn(1, 24, 16, dtype=F64))
    with pytest.raises(ValueError, match="T=25 is not allowed"):
        m.step(torch.randn(1, 16, dtype=F64), states[-1])


# ----------------------------------------------------------------------------------------
# Hyena

@pytest.mark.parametrize("order", [1, 2, 3])
def test_hyena_is_algorithm_3(order):
    """A literal loop: projection, short conv, z^0 = v, z^ℓ = p^ℓ ⊙ (h^ℓ ∗ z^{ℓ-1}), W_o."""
    T, d = 6, 2
    m = make_mixer("hyena", d=d, T=T, order=order)
    u = torch.randn(1, T, d, dtype=F64)
    proj = u[0] @ m.in_proj.weight.T + m.in_proj.bias                        # (T, (order+1)·d)
    g, hl = m.short_filter(), m.long_filter()
    short = [[sum(g[ch, s] * proj[t - s, ch] for s in range(min(t + 1, g.shape[1])))
              for ch in range((order + 1) * d)] for t in range(T)]
    p = [[[short[t][l * d + ch] for ch in range(d)] for t in range(T)] for l in range(order)]
    z = [[short[t][order * d + ch] for ch in range(d)] for t in range(T)]       # z^0 = v
    for l in range(order):
        z = [[p[l][t][ch] * sum(hl[l * d + ch, s] * z[t - s][ch] for s in range(t + 1))
              for ch in range(d)] for t in range(T)]
    y = torch.stack([torch.stack(row) for row in z]) @ m.out_proj.weight.T + m.out_proj.bias
    assert torch.allclose(m(u)[0], y, atol=1e-12)


# ----------------------------------------------------------------------------------------
# H3

@pytest.mark.parametrize("discretization", mixers.SSM_DISCRETIZATIONS)
def test_diagonal_ssm_kernel_is_the_recurrences_impulse_response(discretization):
    m = make_mixer("h3", d_state=8)
    log_dt, A, C, _ = m._ssm()
    T = 40
    K = mixers.diagonal_ssm_kernel(log_dt, A, C, T, discretization)    # (channels, T)
    x = torch.zeros(1, *A.shape, dtype=A.dtype)
    response = []
    for t in range(T):
        u_t = torch.zeros(1, A.shape[0], dtype=F64) + (t == 0)
        y_t, x = mixers.diagonal_ssm_step(u_t, x, log_dt, A, C, discretization)
        response.append(y_t[0])
    assert torch.allclose(torch.stack(response, 1), K, atol=1e-12)
    assert K.abs().max() > 1e-3, "a kernel of zeros would pass trivially"


def test_ssm_discretization_is_zero_order_hold():
    """Ā and B̄ are the blocks of exp(Δ·[[A, 1], [0, 0]]) (Van Loan): x' = Ax + u over one
    step of length Δ with u held constant."""
    log_dt = torch.tensor([-1.0, -3.0], dtype=F64)
    A = torch.tensor([[-0.5 + 2.0j], [-0.1 + 0.3j]], dtype=torch.complex128)
    log_dA, dB = mixers.ssm_discretize(log_dt, A)
    for ch in range(2):
        M = torch.zeros(2, 2, dtype=torch.complex128)
        M[0, 0], M[0, 1] = A[ch, 0], 1
        E = torch.linalg.matrix_exp(log_dt[ch].exp() * M)
        assert torch.allclose(log_dA[ch, 0].exp(), E[0, 0], atol=1e-12)
        assert torch.allclose(dB[ch, 0], E[0, 1], atol=1e-12)


def test_ssm_bilinear_discretization_is_the_official_kernels():
    """SSKernelDiag(disc="bilinear"): dA = (1 + ΔA/2)/(1 - ΔA/2), dB = Δ/(1 - ΔA/2), and
    its kernel 2·Re Σ_r C_r dB_r dA_r^ℓ over the modes r (log_vandermonde on dA.log())."""
    torch.manual_seed(0)
    log_dt = torch.empty(3, dtype=F64).uniform_(math.log(1e-3), math.log(1e-1))
    A = torch.complex(-0.5 * torch.ones(3, 4), math.pi * torch.arange(4.0).repeat(3, 1)).to(
        torch.complex128)
    C = torch.randn(3, 4, dtype=torch.complex128)
    dt = log_dt.exp()[:, None]
    dA, dB = (1 + dt * A / 2) / (1 - dt * A / 2), dt / (1 - dt * A / 2)
    log_dA, got_dB = mixers.ssm_discretize(log_dt, A, "bilinear")
    assert torch.allclose(log_dA.exp(), dA, atol=1e-12) and torch.allclose(got_dB, dB)
    ell = torch.arange(30, dtype=F64)
    K = 2 * torch.einsum("dr,drl->dl", C * dB, dA[..., None] ** ell).real
    assert torch.allclose(mixers.diagonal_ssm_kernel(log_dt, A, C, 30, "bilinear"), K, atol=1e-12)
    with pytest.raises(ValueError, match="discretization='euler'"):
        mixers.ssm_discretize(log_dt, A, "euler")


def test_h3_per_head_outer_product_is_the_formula():
    """y_hj[t] = Σ_i q_hi[t] (Σ_{s<=t} K_h[s] k̃_hi[t-s] v_hj[t-s] + D_h k̃_hi[t] v_hj[t])"""
    T, d, hd = 5, 4, 2
    m = make_mixer("h3", d=d, T=T, head_dim=hd, d_state=4, shift_size=2)
    u = torch.randn(1, T, d, dtype=F64)
    q, k, v = (u[0] @ m.qkv.weight.T + m.qkv.bias).split(d, dim=-1)          # (T, d)
    g = m.shift_filter()
    k = torch.stack([sum(g[:, s] * k[t - s] for s in range(min(t + 1, 2)))
                     for t in range(T)])                                     # shift SSM
    A = torch.complex(-m.log_neg_A_re.exp(), m.A_im)
    Kh = mixers.diagonal_ssm_kernel(m.log_dt, A, torch.complex(m.C_re, m.C_im), T)
    y = torch.zeros(T, d, dtype=F64)
    for h in range(d // hd):
        for j in range(hd):
            for t in range(T):
                for i in range(hd):
                    kv = [k[r, h * hd + i] * v[r, h * hd + j] for r in range(T)]
                    s = sum(Kh[h, l] * kv[t - l] for l in range(t + 1)) + m.skip[h] * kv[t]
                    y[t, h * hd + j] += q[t, h * hd + i] * s
    assert torch.allclose(m(u)[0], m.out_proj(y), atol=1e-12)


def test_h3_state_does_not_grow():
    m = make_mixer("h3", d_state=8, head_dim=2)
    assert m.state_size(7) == m.state_size(10_000) == 16 * 7 + 16 * 2 * 8


# ----------------------------------------------------------------------------------------
# errors a user can cause

@pytest.mark.parametrize("name,kwargs,match", [
    ("attention", dict(num_heads=3), "num_heads=3"),
    ("attention", dict(impl="flash"), "impl='flash'"),
    ("attention", dict(dropout=1.0), "dropout=1.0"), ("sliding_window", dict(window=0), "window=0"),
    ("blocked_attention", dict(block_size=2.5), "block_size=2.5"),
    ("sliding_window", dict(impl="flash"), "impl='flash'"),
    ("short_conv", dict(kernel_size=0), "kernel_size=0"),
    ("short_conv", dict(impl="fft"), "impl='fft'"),
    ("long_conv", dict(filter="relu"), "filter='relu'"),
    ("base_conv", dict(form="theory"), "form='theory'"),
    ("hyena", dict(form="zoology"), "form='zoology'"),
    ("h3", dict(form="s4"), "form='s4'"), ("rwkv", dict(form="v5"), "form='v5'"),
    ("selective_attention", dict(form="softmax"), "form='softmax'"),
    ("selective_attention", dict(aux_weight=-1.0), "aux_weight=-1.0"),
    ("base_conv", dict(kernel_size=-1), "kernel_size=-1.*or None"),
    ("base_conv", dict(form="paperish"), "form='paperish'"),
    ("attention", dict(form="official"), "form='official'.*'paper'"),
    ("hyena", dict(order=0), "order=0"),
    ("hyena", dict(short_kernel_size=0), "short_kernel_size=0"),
    ("h3", dict(d_state=5), "d_state=5.*even"),
    ("h3", dict(head_dim=3), "head_dim=3.*divides d_model=16"),
    ("h3", dict(shift_size=0), "shift_size=0"),
    ("rwkv", dict(impl="cuda"), "impl='cuda'"), ("rwkv", dict(chunk_size=0), "chunk_size=0"),
    ("retnet", dict(num_heads=3), "num_heads=3"), ("based", dict(feature_dim=0), "feature_dim=0"),
    ("mamba", dict(d_state=0), "d_state=0"), ("h3", dict(d_state=3), "d_state=3"),
    ("selective_attention", dict(selection="oracle"), "selection='oracle'"),
    ("selective_attention", dict(inference="sample"), "inference='sample'"),
    ("input_dependent_conv", dict(filters="learned"), "filters='learned'"),
    ("input_dependent_conv", dict(num_lags=0), "num_lags=0"),
    ("long_conv", dict(seq_len=0), "seq_len=0 is not allowed"),
    ("base_conv", dict(seq_len=0), "seq_len=0 is not allowed"),
    ("hyena", dict(seq_len=0), "seq_len=0 is not allowed"),
])
def test_bad_arguments_name_the_argument(name, kwargs, match):
    args = dict(d_model=16, seq_len=24) | kwargs
    with pytest.raises(ValueError, match=match):
        mixers.build_mixer(name, **args)
    with pytest.raises(ValueError, match="allowed"):
        mixers.build_mixer(name, **args)


# ----------------------------------------------------------------------------------------
# mixers.py: recurrences, linear attention, Mamba, selective attention: their forms first

def recurrence(name, T, seed=0):
    """(forms, run) of one recurrence on random inputs of T positions: run(form, positions,
    state, chunk_size) calls a form on those positions. State sums compared as (average,
    log-normaliser) for wkv, whose forms keep them scaled differently."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=F64)           # noqa: E731
    if name == "wkv":
        w, u, k, v = r(4).exp(), r(4), 3 * r(2, T, 4), r(2, T, 4)
        return mixers.WKV_IMPLS, lambda f, t, **kw: f(w, u, k[:, t], v[:, t], **kw)
    if name == "retention":
        gamma = (1 - 2.0 ** (-5 - torch.arange(3, dtype=F64))
                 - 0.2 * torch.rand(3, generator=g, dtype=F64))
        q, k, v = r(2, 3, T, 5), r(2, 3, T, 5), r(2, 3, T, 4)
        return mixers.RETENTION_IMPLS, lambda f, t, **kw: f(q[:, :, t], k[:, :, t], v[:, :, t],
                                                            gamma, **kw)
    if name == "based":
        q, k, v = r(2, 2, T, 4), r(2, 2, T, 4), r(2, 2, T, 3)
        return mixers.BASED_IMPLS, lambda f, t, **kw: f(q[:, :, t], k[:, :, t], v[:, :, t], **kw)
    if name == "gla":
        # log decays from -0.01 to -300 a step across the key channels: at -300, e^{-b_j}
        # (a form that divides by the decay) is past float64's range within two steps
        q, k, v = r(2, 3, T, 6), r(2, 3, T, 6), r(2, 3, T, 4)
        scale = torch.tensor([0.01, 0.1, 1.0, 10.0, 100.0, 300.0], dtype=F64)
        log_alpha = -r(2, 3, T, 6).exp() * scale
        return mixers.GLA_IMPLS, lambda f, t, **kw: f(q[:, :, t], k[:, :, t], v[:, :, t],
                                                       log_alpha[:, :, t], **kw)
    if name == "ssd":
        # Δ·a from -0.01 to -300 a step across the heads, as for the scans above
        x, Bm, Cm = r(2, T, 4, 3), r(2, T, 5), r(2, T, 5)
        a = -torch.tensor([0.01, 1.0, 30.0, 300.0], dtype=F64)
        delta = r(2, T, 4).exp()
        return mixers.SSD_IMPLS, lambda f, t, **kw: f(x[:, t], delta[:, t], a, Bm[:, t],
                                                       Cm[:, t], **kw)
    if name == "delta_rule":
        # unit keys (the layers L2-normalise them), β in (0, 1), log decays down to -300
        q, k, v = r(2, 4, T, 5), F.normalize(r(2, 4, T, 5), dim=-1), r(2, 4, T, 3)
        beta = torch.sigmoid(r(2, 4, T))
        log_alpha = -r(2, 4, T).exp() * torch.tensor([0.01, 1.0, 30.0, 300.0], dtype=F64)[:, None]
        return mixers.DELTA_RULE_IMPLS, lambda f, t, **kw: f(
            q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], log_alpha[:, :, t], **kw)
    if name == "dplr":
        # RWKV-7's: α = -κ̂, β = κ̂ ⊙ a with κ̂ unit and a in (0, 1); log decays to -300
        r_, k, v = r(2, 3, T, 4), r(2, 3, T, 4), r(2, 3, T, 3)
        kk, a = F.normalize(r(2, 3, T, 4), dim=-1), torch.sigmoid(r(2, 3, T, 4))
        log_w = -r(2, 3, T, 4).exp() * torch.tensor([0.01, 1.0, 30.0, 300.0], dtype=F64)
        return mixers.DPLR_IMPLS, lambda f, t, **kw: f(
            r_[:, :, t], k[:, :, t], v[:, :, t], log_w[:, :, t], -kk[:, :, t],
            (kk * a)[:, :, t], **kw)
    x, Bm, Cm, A, skip = r(2, T, 6), r(2, T, 4), r(2, T, 4), -r(6, 4).exp(), r(6)
    # Δ from 0.01 to 300 across the channels: at 300, e^{ΔA} underflows inside a chunk
    delta = r(2, T, 6).exp() * torch.tensor([0.01, 0.1, 1.0, 10.0, 100.0, 300.0], dtype=F64)
    return mixers.SCAN_IMPLS, lambda f, t, **kw: f(x[:, t], delta[:, t], A, Bm[:, t], Cm[:, t],
                                                   skip, **kw)


def comparable(state):
    if len(state) == 3:                                                      # wkv's (a, b, p)
        a, b, p = state
        return a / b, p + torch.log(b)
    return state if isinstance(state, tuple) else (state,)


@pytest.mark.parametrize("name", ["wkv", "retention", "based", "selective_scan", "gla",
                                  "ssd", "delta_rule", "dplr"])
def test_every_form_of_a_recurrence_is_the_reference_and_continues_from_its_state(name):
    """Every other form (chunk sizes 1, 4 and 8 across T = 29, ragged last chunk; 64 > T)
    gives the reference's outputs and final state; every form, the reference too, run in
    two pieces with the state handed on gives what it gives run whole."""
    T, cut_at = 29, 11
    forms, run = recurrence(name, T)
    y, state = run(forms["reference"], slice(None))
    close = lambda a, b: torch.allclose(a, b, atol=1e-10, rtol=1e-10)
    dim = 1 if name in ("wkv", "selective_scan", "ssd") else 2
    for key, form in forms.items():
        for chunk_size in (1, 4, 8, 64):
            y_whole, s_whole = run(form, slice(None), chunk_size=chunk_size)
            y1, s1 = run(form, slice(0, cut_at), chunk_size=chunk_size)
            y2, s2 = run(form, slice(cut_at, T), state=s1, chunk_size=chunk_size)
            assert close(torch.cat([y1, y2], dim), y_whole), (key, chunk_size)
            assert all(close(a, b) for a, b in zip(comparable(s2), comparable(s_whole),
                                                   strict=True)), (key, chunk_size)
            if key != "reference":
                assert close(y_whole, y), (key, chunk_size)
                assert all(close(a, b) for a, b in zip(comparable(s_whole), comparable(state),
                                                       strict=True)), (key, chunk_size)


# ----------------------------------------------------------------------------------------
# RWKV

@pytest.mark.parametrize("impl,chunk_size", [("fast", 5), ("fast", 64), ("reference", 64)])
def test_rwkv_module_is_time_mixing_written_out(impl, chunk_size):
    """Token shift x'_t = μ x_t + (1-μ) x_{t-1} (x_{-1} = 0), then
    wkv_t = (Σ_{i<t} e^{-(t-1-i)w + k_i} v_i + e^{u+k_t} v_t) / (the same without v),
    w = exp(w_log) > 0, out = W_o(σ(r) ⊙ wkv); every μ, w_log and u perturbed."""
    T = 12
    m = make_mixer("rwkv", T=T, impl=impl, chunk_size=chunk_size)
    with torch.no_grad():
        for p in (m.mix_r, m.mix_k, m.mix_v):
            p.uniform_(0, 1)
        m.w_log.normal_(0, 1), m.u.normal_(0, 1)
    x = torch.randn(2, T, 16, dtype=F64)
    x_prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)
    r, k, v = ((mu * x + (1 - mu) * x_prev) @ lin.weight.T for mu, lin in
               ((m.mix_r, m.receptance), (m.mix_k, m.key), (m.mix_v, m.value)))
    w, wkv = torch.exp(m.w_log), torch.empty_like(x)
    for t in range(T):
        e = [torch.exp(-(t - 1 - i) * w + k[:, i]) for i in range(t)] + [torch.exp(m.u + k[:, t])]
        wkv[:, t] = sum(e_i * v[:, i] for i, e_i in enumerate(e)) / sum(e)
    assert torch.allclose(m(x), (torch.sigmoid(r) * wkv) @ m.out_proj.weight.T, atol=1e-12)


def test_wkv_survives_keys_that_overflow_exp():
    """k ~ 1000: e^k is inf even in float64, so the naive ratio is nan; the stable forms give
    the answer of the same keys shifted by a constant (the ratio is shift-invariant), and
    also handle keys that differ by thousands inside one chunk."""
    torch.manual_seed(0)
    B, T, d = 2, 40, 4
    k, v = torch.randn(B, T, d, dtype=F64), torch.randn(B, T, d, dtype=F64)
    w, u = torch.rand(d, dtype=F64) + 0.1, torch.randn(d, dtype=F64)
    naive = torch.exp(k[:, :1] + 1000)
    assert torch.isinf(naive).all(), "the test must use keys that overflow a naive form"
    want, _ = mixers.wkv_reference(w, u, k, v)
    for wkv in (mixers.wkv_reference, lambda *a: mixers.wkv_chunked(*a, chunk_size=8)):
        for dtype in (F64, torch.float32):
            got, _ = wkv(w.to(dtype), u.to(dtype), (k + 1000).to(dtype), v.to(dtype))
            tol = 1e-10 if dtype == F64 else 1e-3
            assert torch.allclose(got.double(), want, atol=tol, rtol=tol)
    wild = 1000 * torch.randn(B, T, d, dtype=F64)                              # spread ±3000
    ref = mixers.wkv_reference(w, u, wild, v)[0]
    fast = mixers.wkv_chunked(w, u, wild, v, chunk_size=8)[0]
    assert torch.isfinite(ref).all() and torch.allclose(fast, ref, atol=1e-10, rtol=1e-10)
    # and both are the softmax the recurrence stands for, written out over every row:
    # scores k_i - (t-1-i)·w for i < t, u + k_t at i = t
    t, i = torch.arange(T)[:, None], torch.arange(T)[None, :]
    scores = wild[:, None, :, :] - ((t - 1 - i)[..., None] * w)              # (B, t, i, d)
    scores = scores.masked_fill((i > t)[..., None], -math.inf)
    scores[:, t[:, 0], t[:, 0]] = u + wild
    written = (scores.softmax(2) * v[:, None]).sum(2)
    assert torch.allclose(ref, written, atol=1e-10, rtol=1e-10)


def test_rwkv_step_is_stable_over_a_long_sequence():
    m = make_mixer("rwkv", dtype=torch.float32).eval()
    x = 30 * torch.randn(1, 600, 16)                                          # large keys
    with torch.no_grad():
        y = m(x)
        ys, _ = run_steps(m, x)
    assert torch.isfinite(y).all() and torch.allclose(ys, y, atol=1e-3, rtol=1e-3)


# ----------------------------------------------------------------------------------------
# mixers.RetNet

@pytest.mark.parametrize("impl", ["fast", "reference", "parallel"])
def test_retnet_module_is_multi_scale_retention_written_out(impl):
    """Head h: o_t = Σ_{j<=t} γ_h^{t-j} (q_t·k_j/√hs) v_j, γ_h = 1 - 2^(-5-h); each head's o_t
    normalised to mean 0, variance 1 (group norm, eps 1e-5, no affine); then
    W_O(swish(x W_G) ⊙ o). Small inputs, so that the eps makes the 1/√hs visible."""
    T, H, hs = 12, 4, 4
    m = make_mixer("retnet", T=T, num_heads=H, impl=impl, chunk_size=5)
    x = 0.3 * torch.randn(2, T, 16, dtype=F64)
    q, k, v, g = (x @ lin.weight.T for lin in (m.q_proj, m.k_proj, m.v_proj, m.g_proj))
    o = torch.zeros(2, T, 16, dtype=F64)
    for h in range(H):
        head, gamma = slice(h * hs, (h + 1) * hs), 1 - 2.0 ** (-5 - h)
        for t in range(T):
            o_t = sum(gamma ** (t - j) * (q[:, t, head] * k[:, j, head]).sum(-1, keepdim=True)
                      / math.sqrt(hs) * v[:, j, head] for j in range(t + 1))
            o[:, t, head] = (o_t - o_t.mean(-1, keepdim=True)) / torch.sqrt(
                o_t.var(-1, unbiased=False, keepdim=True) + 1e-5)
    want = (torch.nn.functional.silu(g) * o) @ m.out_proj.weight.T
    assert torch.allclose(m(x), want, atol=1e-12)


# ----------------------------------------------------------------------------------------
# mixers.Based

def test_taylor_feature_maps_give_the_taylor_kernel():
    """φ(q)·φ(k) = 1 + s/√d' + s²/(2d'), s = q·k: the full map (1 + d' + d'² features), as
    _taylor_kernel computes it, and the compact one (1 + d' + d'(d'+1)/2) gives the same
    kernel."""
    torch.manual_seed(0)
    dp = 16                                                        # dp: Based's d'
    q, k = torch.randn(5, dp, dtype=F64), torch.randn(5, dp, dtype=F64)
    s = (q * k).sum(-1)
    fq, fk = mixers.taylor_feature_map(q), mixers.taylor_feature_map(k)
    lhs = (fq * fk).sum(-1)
    assert fq.shape == (5, 1 + dp + dp * dp)
    assert torch.allclose(lhs, 1 + s / math.sqrt(dp) + s ** 2 / (2 * dp), atol=1e-12)
    assert torch.allclose(mixers._taylor_kernel(q, k).diagonal(), lhs, atol=1e-12)
    cq, ck = mixers.taylor_feature_map_compact(q), mixers.taylor_feature_map_compact(k)
    assert cq.shape == (5, 1 + dp + dp * (dp + 1) // 2)
    assert torch.allclose(cq @ ck.T, fq @ fk.T, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("impl", ["fast", "reference", "parallel"])
def test_based_module_is_taylor_linear_attention_written_out(impl):
    """Head h: y_i = Σ_{j<=i} K_ij v_j / Σ_{j<=i} K_ij with K_ij = 1 + s + s²/2,
    s = q_i·k_j/√d' (φ(q)·φ(k) for φ(x) = [1, x/d'^¼, x⊗x/(√2·√d')]), then W_o; q and k
    have d' features per head, v has d/H."""
    T, H, dp, hv = 12, 2, 4, 8                                     # dp: Based's d'
    m = make_mixer("based", T=T, feature_dim=dp, num_heads=H, impl=impl, chunk_size=5)
    x = torch.randn(2, T, 16, dtype=F64)
    q, k, v = (x @ lin.weight.T for lin in (m.q_proj, m.k_proj, m.v_proj))
    y = torch.empty(2, T, 16, dtype=F64)
    for h in range(H):
        cq, cv = slice(h * dp, (h + 1) * dp), slice(h * hv, (h + 1) * hv)
        for i in range(T):
            s = (q[:, i:i + 1, cq] * k[:, :i + 1, cq]).sum(-1) / math.sqrt(dp)      # (B, i+1)
            a = 1 + s + s * s / 2
            y[:, i, cv] = (a[..., None] * v[:, :i + 1, cv]).sum(1) / a.sum(1, keepdim=True)
    assert torch.allclose(m(x), y @ m.out_proj.weight.T, atol=1e-12)


def test_based_state_size_counts_features_times_values_plus_normaliser():
    m = mixers.Based(64, 32, feature_dim=16, num_heads=2)
    features = 1 + 16 + 16 * 17 // 2            # the compact features: each x_a x_b once
    assert m.state_size(7) == 2 * (32 * features + features)


# ----------------------------------------------------------------------------------------
# mixers.GLA

def naive_recurrent_gla(q, k, v, gk, initial_state=None):
    """flash-linear-attention's naive_recurrent_gla (fla/ops/gla/naive.py, commit bc3b101),
    transcribed in float64: q, k, gk (B, T, H, K), v (B, T, H, V), q scaled by K^-1/2 inside;
    h = h ⊙ e^{gk_i} + k_i v_iᵀ, o_i = Σ_K q_i h. Returns (o (B, T, H, V), h)."""
    q, k, v, gk = (x.transpose(1, 2) for x in (q, k, v, gk))
    B, H, T, K, V = *q.shape, v.shape[-1]
    o = torch.zeros_like(v)
    scale = K ** -0.5
    h = q.new_zeros(B, H, K, V)
    if initial_state is not None:
        h += initial_state
    for i in range(T):
        q_i = q[:, :, i] * scale
        k_i = k[:, :, i]
        v_i = v[:, :, i]
        gk_i = gk[:, :, i].exp()
        kv_i = k_i[..., None] * v_i[..., None, :]
        h = h * gk_i[..., None] + kv_i
        o[:, :, i] = (q_i[..., None] * h).sum(-2)
    return o.transpose(1, 2), h


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_gla_forms_are_flash_linear_attentions_naive_recurrence(impl):
    """Both forms, from a state, against the transcription (the gate as the GLA layer makes
    it: logsigmoid / 16)."""
    B, T, H, K, V = 2, 19, 3, 4, 5
    q, k, gk = (torch.randn(B, T, H, K, dtype=F64) for _ in range(3))
    v, S0 = torch.randn(B, T, H, V, dtype=F64), torch.randn(B, H, K, V, dtype=F64)
    gk = F.logsigmoid(gk) / 16
    want, S = naive_recurrent_gla(q, k, v, gk, S0)
    heads = lambda x: x.transpose(1, 2)
    got, S_got = mixers.GLA_IMPLS[impl](heads(q) * K ** -0.5, heads(k), heads(v), heads(gk),
                                        S0, chunk_size=4)
    assert torch.allclose(heads(got), want, atol=1e-12) and torch.allclose(S_got, S, atol=1e-12)


def test_gla_module_is_the_papers_layer_written_out():
    """q, k, v, g projections; log α = logsigmoid(x W_α1 W_α2 + b_α)/16; per head the
    recurrence (the transcription); RMSNorm of each head's output (its own weight), times
    swish(g), W_o. Every parameter perturbed so that each matters."""
    T, d = 10, 16
    m = make_mixer("gla", d=d, T=T, num_heads=2, chunk_size=3)
    perturb_(m, 0.3)
    x = torch.randn(2, T, d, dtype=F64)
    split = lambda tensor: tensor.unflatten(-1, (2, -1))                   # (B, T, H, ·)
    q, k, v = (split(x @ w.weight.T) for w in (m.q_proj, m.k_proj, m.v_proj))
    gk = split(F.logsigmoid((x @ m.gate_down.weight.T) @ m.gate_up.weight.T + m.gate_up.bias) / 16)
    o, _ = naive_recurrent_gla(q, k, v, gk)                                # (B, T, H, dv)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * m.norm.weight
    g = x @ m.g_proj.weight.T
    y = (o.flatten(-2) * g * torch.sigmoid(g)) @ m.out_proj.weight.T
    assert torch.allclose(m(x), y, atol=1e-12)
    assert m.state_size(T) == 2 * 4 * 8                                    # H·dk·dv


# ----------------------------------------------------------------------------------------
# mixers.Mamba2

def segsum(x):
    """mamba_ssm/modules/ssd_minimal.py's segsum (commit e9594ce), transcribed: (..., T) ->
    (..., T, T), entry (i, j) = x[j+1] + ... + x[i] for j <= i, -inf above."""
    T = x.size(-1)
    x = x[..., None].repeat_interleave(T, -1)                                # "... d -> ... d e"
    mask = torch.tril(torch.ones(T, T, dtype=bool), diagonal=-1)
    x = x.masked_fill(~mask, 0)
    x_segsum = torch.cumsum(x, dim=-2)
    mask = torch.tril(torch.ones(T, T, dtype=bool), diagonal=0)
    return x_segsum.masked_fill(~mask, -torch.inf)


def ssd_minimal_discrete(X, A, B, C, block_len, initial_states=None):
    """ssd_minimal.py's ssd_minimal_discrete (Listing 1 of the paper), transcribed with
    einops' rearranges written as reshapes and its L, the decays within a chunk, named
    `decay` (L is the number of layers here): X (b, l, h, p), A (b, l, h), B, C (b, l, h, n)."""
    b, l, h, p = X.shape
    X, A, B, C = (x.reshape(b, l // block_len, block_len, *x.shape[2:]) for x in (X, A, B, C))
    A = A.permute(0, 3, 1, 2)                                                 # b h c l
    A_cumsum = torch.cumsum(A, dim=-1)
    decay = torch.exp(segsum(A))
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, decay, X)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, X)
    if initial_states is None:
        initial_states = torch.zeros_like(states[:, :1])
    states = torch.cat([initial_states, states], dim=1)
    decay_chunk = torch.exp(segsum(F.pad(A_cumsum[:, :, :, -1], (1, 0))))
    new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    state_decay_out = torch.exp(A_cumsum)
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, state_decay_out)
    return (Y_diag + Y_off).reshape(b, l, h, p), final_state


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_ssd_forms_are_the_papers_listing_1(impl):
    """Both forms, from a state, against ssd_minimal_discrete, whose X is Δ·x and A is Δ·a
    (B and C one group, broadcast to the heads)."""
    b, l, h, p, d_state = 2, 12, 3, 4, 5
    x, Bm, Cm = (torch.randn(b, l, h, p, dtype=F64), torch.randn(b, l, d_state, dtype=F64),
                 torch.randn(b, l, d_state, dtype=F64))
    delta, a = torch.rand(b, l, h, dtype=F64) + 0.1, -torch.rand(h, dtype=F64) - 0.5
    h0 = torch.randn(b, h, p, d_state, dtype=F64)
    want, final = ssd_minimal_discrete(delta[..., None] * x, delta * a,
                                       Bm[:, :, None].expand(b, l, h, d_state),
                                       Cm[:, :, None].expand(b, l, h, d_state), 4, h0[:, None])
    got, h_got = mixers.SSD_IMPLS[impl](x, delta, a, Bm, Cm, h0, chunk_size=4)
    assert torch.allclose(got, want, atol=1e-12) and torch.allclose(h_got, final, atol=1e-12)


def test_mamba2_module_is_mamba2_simple_written_out():
    """in_proj to (z, xBC, dt); depthwise causal conv with bias and SiLU on xBC; Δ =
    softplus(dt + dt_bias); the SSD recurrence with a = -exp(A_log) and skip; norm after
    the gate, RMSNorm(y ⊙ SiLU(z)) ⊙ w; out_proj. Every parameter perturbed."""
    T, d, d_state, P = 9, 8, 4, 4
    m = make_mixer("mamba2", d=d, T=T, d_state=d_state, headdim=P, chunk_size=4)
    perturb_(m, 0.3)
    u = torch.randn(2, T, d, dtype=F64)
    z, xBC, dt = (u @ m.in_proj.weight.T).split([16, 16 + 2 * d_state, 4], -1)
    K = m.conv_weight.shape[1]
    xBC = F.silu(torch.stack([sum(m.conv_weight[:, s] * xBC[:, t - s] for s in range(min(K, t + 1)))
                              for t in range(T)], 1) + m.conv_bias)
    x, Bm, Cm = xBC.split([16, d_state, d_state], -1)
    x = x.unflatten(-1, (4, P))                                              # (B, T, H, P)
    delta, a = F.softplus(dt + m.dt_bias), -m.A_log.exp()
    h, ys = torch.zeros(2, 4, P, d_state, dtype=F64), []
    for t in range(T):
        h = (delta[:, t] * a).exp()[..., None, None] * h + \
            (delta[:, t, :, None] * x[:, t])[..., None] * Bm[:, t, None, None, :]
        ys.append((h * Cm[:, t, None, None, :]).sum(-1) + m.skip[:, None] * x[:, t])
    y = torch.stack(ys, 1).flatten(-2) * F.silu(z)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * m.norm.weight
    assert torch.allclose(m(u), y @ m.out_proj.weight.T, atol=1e-12)


# ----------------------------------------------------------------------------------------
# mixers.DeltaNet, mixers.GatedDeltaNet

def delta_rule_recurrence(q, k, v, beta, initial_state=None):
    """flash-linear-attention's delta_rule_recurrence (fla/ops/delta_rule/naive.py, commit
    bc3b101), transcribed in float64: q, k (b, h, l, d_k), v (b, h, l, d_v), beta (b, h, l)."""
    b, h, l, d_k = q.shape
    d_v = v.shape[-1]
    o = torch.zeros_like(v)
    S = torch.zeros(b, h, d_k, d_v).to(v)
    q = q * (d_k ** -0.5)
    if beta.ndim < v.ndim:
        beta = beta[..., None]
    if initial_state is not None:
        S += initial_state
    for i in range(l):
        _k = k[:, :, i]
        _q = q[:, :, i]
        _v = v[:, :, i].clone()
        beta_i = beta[:, :, i]
        _v = _v - (S.clone() * _k[..., None]).sum(-2)
        _v = _v * beta_i
        S = S.clone() + _k.unsqueeze(-1) * _v.unsqueeze(-2)
        o[:, :, i] = torch.einsum("bhd,bhdm->bhm", _q, S)
    return o, S


def naive_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=None):
    """fla/ops/gated_delta_rule/naive.py's naive_recurrent_gated_delta_rule (commit
    bc3b101), transcribed in float64: q, k (B, T, H, K), v (B, T, H, V), beta, g (B, T, H)."""
    q, k, v, beta, g = (x.transpose(1, 2) for x in (q, k, v, beta, g))
    B, H, T, K, V = *k.shape, v.shape[-1]
    o = torch.zeros(B, H, T, V).to(v)
    h = torch.zeros(B, H, K, V).to(v)
    if initial_state is not None:
        h = initial_state
    q = q * (1 / (q.shape[-1] ** 0.5))
    for i in range(T):
        b_q = q[:, :, i]
        b_k = k[:, :, i]
        b_v = v[:, :, i].clone()
        h = h.clone() * g[:, :, i].exp()[..., None, None]
        b_beta = beta[:, :, i]
        b_v = b_v - (h.clone() * b_k[..., None]).sum(-2)
        b_v = b_v * b_beta[..., None]
        h = h.clone() + b_k.unsqueeze(-1) * b_v.unsqueeze(-2)
        o[:, :, i] = torch.einsum("bhd,bhdm->bhm", b_q, h)
    return o.transpose(1, 2), h


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_delta_rule_forms_are_flash_linear_attentions_naive_recurrences(impl):
    """Both forms, from a state: without a gate against delta_rule_recurrence, with one
    (as Gated DeltaNet makes it) against naive_recurrent_gated_delta_rule."""
    b, h, l, dk, dv = 2, 3, 13, 4, 5
    q, v = torch.randn(b, h, l, dk, dtype=F64), torch.randn(b, h, l, dv, dtype=F64)
    k = F.normalize(torch.randn(b, h, l, dk, dtype=F64), dim=-1)
    beta, S0 = torch.rand(b, h, l, dtype=F64), torch.randn(b, h, dk, dv, dtype=F64)
    g = -torch.rand(h, dtype=F64)[:, None] * F.softplus(torch.randn(b, h, l, dtype=F64))
    form = mixers.DELTA_RULE_IMPLS[impl]
    want, S = delta_rule_recurrence(q, k, v, beta, S0)
    got, S_got = form(q * dk ** -0.5, k, v, beta, None, S0, chunk_size=4)
    assert torch.allclose(got, want, atol=1e-12) and torch.allclose(S_got, S, atol=1e-12)
    swap = lambda x: x.transpose(1, 2)                         # (B, H, T, ·) <-> (B, T, H, ·)
    want, S = naive_recurrent_gated_delta_rule(swap(q), swap(k), swap(v), swap(beta), swap(g), S0)
    got, S_got = form(q * dk ** -0.5, k, v, beta, g, S0, chunk_size=4)
    assert torch.allclose(swap(got), want, atol=1e-12) and torch.allclose(S_got, S, atol=1e-12)


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet"])
def test_delta_rule_layers_are_written_out(name):
    """q, k, v projections, a short causal conv and SiLU each, L2-normalised q and k, β =
    σ(x W_β), (Gated: log α = -exp(A_log)·softplus(x W_a + dt_bias)), the recurrence (the
    transcriptions), RMSNorm per head (Gated: times SiLU(x W_g)), W_o. All perturbed."""
    T, d, H = 9, 8, 2
    m = make_mixer(name, d=d, T=T, num_heads=H, conv_size=3, chunk_size=4)
    perturb_(m, 0.3)
    x = torch.randn(2, T, d, dtype=F64)
    qkv = torch.cat([x @ p.weight.T for p in (m.q_proj, m.k_proj, m.v_proj)], -1)
    w = m.conv_weight
    qkv = F.silu(torch.stack([sum(w[:, s] * qkv[:, t - s] for s in range(min(3, t + 1)))
                              for t in range(T)], 1))
    split = lambda tensor: tensor.unflatten(-1, (H, -1))                   # (B, T, H, dh)
    q, k, v = (split(part) for part in qkv.chunk(3, -1))
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    beta = torch.sigmoid(x @ m.b_proj.weight.T)                            # (B, T, H)
    g = (torch.zeros_like(beta) if name == "deltanet" else
         -m.A_log.exp() * F.softplus(x @ m.a_proj.weight.T + m.dt_bias))
    o, _ = naive_recurrent_gated_delta_rule(q, k, v, beta, g)              # (B, T, H, dh)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * m.norm.weight
    if name == "gated_deltanet":
        o = o * F.silu(split(x @ m.g_proj.weight.T))
    assert torch.allclose(m(x), o.flatten(-2) @ m.out_proj.weight.T, atol=1e-12)


# ----------------------------------------------------------------------------------------
# mixers.RWKV7

def dplr_recurrence(q, k, v, alpha, beta, gk, initial_state=None):
    """flash-linear-attention's dplr_recurrence (fla/ops/generalized_delta_rule/dplr/
    naive.py, commit bc3b101), transcribed in float64: q, k, alpha, beta, gk (b, h, l, d_k),
    v (b, h, l, d_v); q scaled by d_k^-1/2 inside."""
    b, h, l, d_k = q.shape
    d_v = v.shape[-1]
    o = torch.zeros_like(v)
    S = torch.zeros(b, h, d_k, d_v).to(v)
    q = q * (d_k ** -0.5)
    if initial_state is not None:
        S += initial_state
    for i in range(l):
        _k = k[:, :, i]
        _q = q[:, :, i]
        _v = v[:, :, i]
        _alpha = alpha[:, :, i].clone()
        _beta = beta[:, :, i].clone()
        _kv = _k[..., None] * _v[..., None, :] + (S.clone() * _alpha[..., None]).sum(
            -2, keepdim=True) * _beta[..., None]
        S = S.clone() * gk[:, :, i].exp()[..., None] + _kv
        o[:, :, i] = torch.einsum("bhd,bhdm->bhm", _q, S)
    return o, S


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_dplr_forms_are_flash_linear_attentions_naive_recurrence(impl):
    """Both forms, from a state, against dplr_recurrence with RWKV-7's α = -κ̂, β = κ̂ ⊙ a."""
    b, h, l, dk, dv = 2, 3, 13, 4, 5
    r, k = torch.randn(b, h, l, dk, dtype=F64), torch.randn(b, h, l, dk, dtype=F64)
    v, S0 = torch.randn(b, h, l, dv, dtype=F64), torch.randn(b, h, dk, dv, dtype=F64)
    kk = F.normalize(torch.randn(b, h, l, dk, dtype=F64), dim=-1)
    a, log_w = torch.rand(b, h, l, dk, dtype=F64), -0.6 * torch.rand(b, h, l, dk, dtype=F64)
    want, S = dplr_recurrence(r, k, v, -kk, kk * a, log_w, S0)
    got, S_got = mixers.DPLR_IMPLS[impl](r * dk ** -0.5, k, v, log_w, -kk, kk * a, S0, chunk_size=4)
    assert torch.allclose(got, want, atol=1e-12) and torch.allclose(S_got, S, atol=1e-12)


def test_rwkv7_and_mamba2_fixed_values_written_out():
    """Values fixed at construction that step == forward cannot see (both forms share them).
    RWKV-7 (fla's RWKV7Attention, layer 0; BlinkDL's x070 the same): the token-shift mixes
    1 - (ch/d)^p at channel ch, p = 0.2 for r and g, 0.9 for w and a, 0.7 for k and v; here
    d = 4.
    Mamba-2 (Mamba2Simple): headdim 64, or d_inner = 2d where that is smaller, so one head
    below d = 32 and 2d/64 heads from there."""
    rwkv = mixers.RWKV7(4, 8)
    p02 = [1.0, 0.242141716745, 0.129449436704, 0.055912488705]
    p09 = [1.0, 0.712825411251, 0.464113268732, 0.228110493276]
    p07 = [1.0, 0.621070858372, 0.384427793328, 0.182396231823]
    want = torch.tensor([p02, p09, p07, p07, p09, p02])             # r, w, k, v, a, g
    assert torch.allclose(rwkv.mix.detach(), want, atol=1e-9)
    for d, heads in ((8, 1), (16, 1), (32, 1), (64, 2), (128, 4)):
        m = mixers.Mamba2(d, 8)
        assert (m.headdim, m.dt_bias.numel()) == (min(64, 2 * d), heads), d


def test_rwkv7_module_is_fla_rwkv7_attention_written_out():
    """Token shift and six mixes; r, k, v; log w = -e^{-1/2} σ(LoRA_w); a = σ(LoRA_a);
    κ̂ = L2norm(k ⊙ k_k); k̃ = k ⊙ (1 + (a - 1) k_a); the recurrence (the transcription,
    scale 1); GroupNorm per head; + (Σ r ⊙ k̃ ⊙ r_k) v; ⊙ g; W_o. All perturbed."""
    T, d, H = 7, 8, 2
    m = make_mixer("rwkv7", d=d, T=T, num_heads=H, chunk_size=3)
    perturb_(m, 0.3)
    x = torch.randn(2, T, d, dtype=F64)
    shifted = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)
    xr, xw, xk, xv, xa, xg = (x + (shifted - x) * m.mix[i] for i in range(6))
    lora = lambda l, z, act: act(z @ l.down.weight.T) @ l.up.weight.T + (
        l.up.bias if l.up.bias is not None else 0)
    r, k, v = xr @ m.r_proj.weight.T, xk @ m.k_proj.weight.T, xv @ m.v_proj.weight.T
    log_w = -math.exp(-0.5) * torch.sigmoid(lora(m.w_lora, xw, torch.tanh))
    a = torch.sigmoid(lora(m.a_lora, xa, lambda z: z))
    g = lora(m.g_lora, xg, torch.sigmoid)
    heads = lambda tensor: tensor.unflatten(-1, (H, -1)).transpose(1, 2)   # (B, H, T, dh)
    kk = heads(k * m.k_k)
    kk = kk / kk.norm(dim=-1, keepdim=True)
    k = k * (1 + (a - 1) * m.k_a)
    o, _ = dplr_recurrence(heads(r) * 2, heads(k), heads(v), -kk, kk * heads(a), heads(log_w))
    o = o.transpose(1, 2).reshape(2, T, d)                # (dh = 4: × 2 undoes the scale)
    o = torch.nn.functional.group_norm(o.reshape(2 * T, d), H, m.norm.weight, m.norm.bias,
                                       4e-5).view(2, T, d)
    bonus = (heads(r) * heads(k) * m.r_k[:, None]).sum(-1, keepdim=True) * heads(v)
    y = (o + bonus.transpose(1, 2).flatten(-2)) * g
    assert torch.allclose(m(x), y @ m.out_proj.weight.T, atol=1e-12)


# ----------------------------------------------------------------------------------------
# mixers.Mamba

@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_mamba_module_is_the_selective_ssm_written_out(impl):
    """Gu & Dao: (x, z) = in_proj(u); x' = SiLU(Σ_s conv_weight[:, s] x_{t-s} + conv_bias);
    (dt, B_t, C_t) = x_proj(x'); Δ = softplus(dt_proj(dt) + dt_bias); A = -exp(A_log);
    h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x'_t; y_t = C_t·h_t + skip x'_t; out_proj(y ⊙ SiLU(z)).
    dt_bias, A_log, skip and the conv bias perturbed so that each matters."""
    T, silu = 10, torch.nn.functional.silu
    m = make_mixer("mamba", d=8, T=T, impl=impl, chunk_size=4)
    with torch.no_grad():
        m.dt_bias.normal_(0, 1), m.A_log.add_(torch.randn_like(m.A_log) / 2)
        m.skip.normal_(0, 1), m.conv_bias.normal_(0, 1)
    u = torch.randn(2, T, 8, dtype=F64)
    xs, z = (u @ m.in_proj.weight.T).chunk(2, -1)
    d_state, r, K = m.A_log.shape[1], m.dt_proj.in_features, m.conv_weight.shape[1]
    h, y = torch.zeros(2, xs.shape[-1], d_state, dtype=F64), []
    for t in range(T):
        x_t = silu(sum(m.conv_weight[:, s] * xs[:, t - s] for s in range(min(K, t + 1)))
                   + m.conv_bias)                                            # (B, d_inner)
        dt, B_t, C_t = (x_t @ m.x_proj.weight.T).split([r, d_state, d_state], -1)
        delta = torch.nn.functional.softplus(dt @ m.dt_proj.weight.T + m.dt_bias)
        h = torch.exp(delta[..., None] * -torch.exp(m.A_log)) * h + \
            (delta * x_t)[..., None] * B_t[:, None, :]                # (B, d_inner, d_state)
        y.append(((h * C_t[:, None, :]).sum(-1) + m.skip * x_t) * silu(z[:, t]))
    assert torch.allclose(m(u), torch.stack(y, 1) @ m.out_proj.weight.T, atol=1e-12)


def test_mamba_is_initialised_as_mamba_initialises_itself():
    """mamba_simple.py (copied by zoology/mixers/mamba.py): dt_proj U(±dt_rank^-1/2), the
    conv and the Linear layers as PyTorch draws them: U(±1/√fan_in). No Linear has a bias
    (dt_bias is its own parameter), so zeroing Linear biases cannot undo the Δ init."""
    m = make_mixer("mamba", d=64)
    assert all(mod.bias is None for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    r = m.dt_proj.in_features
    for p, bound in ((m.dt_proj.weight, r ** -0.5), (m.conv_weight, 0.5), (m.conv_bias, 0.5),
                     (m.in_proj.weight, 64 ** -0.5), (m.x_proj.weight, 128 ** -0.5),
                     (m.out_proj.weight, 128 ** -0.5)):
        assert p.abs().max() <= bound and p.abs().max() > 0.9 * bound, (p.shape, bound)
    assert mixers.Mamba.keeps_own_init


def test_mamba_chunked_scan_keeps_no_state_per_position_for_backward():
    """The fast form's forward keeps for backward (autograd's saved tensors, each storage once,
    parameters aside; on the meta device, so no math runs) at most 16 (B, T, d_inner)
    float32 tensors' worth: its scan keeps the (B, chunks, d_state, d_inner) state every
    SCAN_SEGMENT = 16 positions of each of its two passes, 2·d_state/16 = 2 such tensors'
    worth, and recomputes the steps between in backward, where keeping each step's decay
    and state would be 2·2·d_state = 64; the layer's own (its input, in_proj's output, the
    conv's, Δ, Δ·x, the gated output, ...) are about 11."""
    B, T, d = 8, 512, 64
    m = mixers.Mamba(d, T).to("meta")
    d_inner = m.in_proj.out_features // 2
    params = {id(p.untyped_storage()) for p in m.parameters()}
    saved = {}

    def pack(t):
        if id(t.untyped_storage()) not in params:
            saved[id(t.untyped_storage())] = t.untyped_storage()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(torch.empty(B, T, d, device="meta", requires_grad=True))
    tensors = sum(s.nbytes() for s in saved.values()) / (B * T * d_inner * 4)
    assert tensors <= 16, f"{tensors:.1f} (B, T, d_inner) tensors kept"


# ----------------------------------------------------------------------------------------
# selective attention

def test_programmatic_selection_is_a_loop_over_earlier_tokens_and_the_mixer_keeps_those_rows():
    """f[i] = 1 iff token i occurred before i, as a Python loop on random sequences, for the
    function and for the rows the mixer keeps: attention's output there, zeros elsewhere; step
    with the tokens gives the same, its state as state_size says."""
    T = 30
    tokens = torch.randint(0, 8, (4, T), generator=torch.Generator().manual_seed(0))
    want = torch.tensor([[tokens[b, i].item() in tokens[b, :i].tolist() for i in range(T)]
                         for b in range(4)])
    assert torch.equal(mixers.programmatic_selection(tokens), want)
    m = make_mixer("selective_attention", T=T, selection="programmatic").eval()
    x = torch.randn(4, T, 16, dtype=F64)
    with torch.no_grad():
        y = m(x, tokens=tokens)
        full = m.attention(x)
        ys, states = run_steps(m, x, token=tokens)
    assert torch.equal((y != 0).any(-1), want)
    assert torch.equal(y[~want], torch.zeros_like(y[~want]))
    assert torch.allclose(y[want], full[want])
    assert torch.allclose(ys, y, atol=1e-12)
    assert mixers.state_numel(states[9]) == m.state_size(10) == 2 * 10 * 16 + 10
    with pytest.raises(ValueError, match="tokens=None"):
        m(x)


def test_chosen_keys_are_a_loop_over_the_prefix():
    """S_i as plain loops on random token rows: the distances at which u_i occurred before
    (programmatic), and the num_lags lags of largest prefix autocorrelation, ties to the smaller
    lag (autocorrelation), which at the last position are theory.top_lags of the row; each
    lag s of row i at its key position i - s."""
    B, T, num_lags = 3, 20, 4
    tokens = torch.randint(0, 3, (B, T), generator=torch.Generator().manual_seed(1))
    lags = lambda chosen, b, i: {i - j for j in chosen[b, i].nonzero().flatten().tolist()}
    got_p = mixers.chosen_keys(tokens, "programmatic", num_lags)
    got_a = mixers.chosen_keys(tokens, "autocorrelation", num_lags)
    for b in range(B):
        u = tokens[b].tolist()
        for i in range(T):
            hits = {s for s in range(1, i + 1) if u[i] == u[i - s]}
            r = {s: sum(u[j] == u[j - s] for j in range(s, i + 1)) for s in range(1, i + 1)}
            top = set(sorted(r, key=lambda s: (-r[s], s))[:num_lags])
            assert lags(got_p, b, i) == hits and lags(got_a, b, i) == top
        assert sorted(lags(got_a, b, T - 1)) == th.top_lags(tokens[b:b + 1], 3, num_lags)[0]


def _one_hot_input_dependent_conv(c, filters, num_lags):
    """Thm 4.5's weights in the trainable layer: q = k = √c·u, v = u, W_o = I on one-hot u."""
    m = make_mixer("input_dependent_conv", d=c, T=64, filters=filters, num_lags=num_lags)
    with torch.no_grad():
        eye = torch.eye(c, dtype=F64)
        m.qkv.weight.copy_(torch.cat([c ** 0.25 * eye, c ** 0.25 * eye, eye]))
        m.out_proj.weight.copy_(eye)
        m.qkv.bias.zero_(), m.out_proj.bias.zero_()
    return m


def test_input_dependent_conv_with_thm_4_5_weights_answers_mqar():
    """With the construction's weights, programmatic filters answer every MQAR query with no
    training (the query's only earlier copy is its key); so do all N-1 autocorrelation lags.
    Two lags miss distances on a filler-0 sequence (the H.8 erratum), and accuracy drops."""
    c, N = 80, 64
    x, y = mqar.multiquery_ar(16, c, N, 4, seed=0)
    u = torch.nn.functional.one_hot(x, c).to(F64)
    acc = {}
    for filters, num_lags in [("programmatic", 1), ("autocorrelation", N - 1),
                              ("autocorrelation", 2)]:
        with torch.no_grad():
            out = _one_hot_input_dependent_conv(c, filters, num_lags)(u, tokens=x)
        acc[filters, num_lags] = th.mqar_accuracy(out.argmax(-1), y)
    assert acc["programmatic", 1] == acc["autocorrelation", N - 1] == 1.0
    assert acc["autocorrelation", 2] < 0.9, acc


def test_input_dependent_conv_needs_token_ids():
    m = make_mixer("input_dependent_conv")
    with pytest.raises(ValueError, match="tokens=None"):
        m(torch.randn(2, 24, 16, dtype=F64))
    with pytest.raises(ValueError, match="token=None"):
        m.step(torch.randn(2, 16, dtype=F64))


def test_learned_aux_loss_is_the_formula():
    f = torch.tensor([[0.9, 0.8, 0.7, 0.1], [0.1, 0.1, 0.2, 0.1]])
    k = 2
    want = (max(0.0, 2.5 - k) / 4 + max(0.0, 0.5 - k) / 4) / 2
    assert torch.allclose(mixers.selection_aux_loss(f, k), torch.tensor(want))
    m = make_mixer("selective_attention", top_k=3).train()
    x = torch.randn(2, 24, 16, dtype=F64)
    m(x)
    soft = torch.sigmoid(x @ m.gate + m.gate_bias)
    assert torch.allclose(m.aux_loss, torch.relu(soft.sum(-1) - 3).mean() / 24)
    m.aux_loss.backward()                                # reaches the gate parameters
    assert m.gate.grad.abs().sum() > 0 and m.gate_bias.grad != 0


def test_learned_gate_is_soft_in_training_and_hard_at_inference():
    m = make_mixer("selective_attention")
    with torch.no_grad():
        m.gate.normal_()
    x = torch.randn(2, 24, 16, dtype=F64)
    (soft, _), (hard, _) = m.train().selection_mask(x), m.eval().selection_mask(x)
    assert ((soft > 0) & (soft < 1)).all()
    assert torch.equal(hard, (soft > 0.5).to(F64)) and 0 < hard.sum() < hard.numel()


def test_random_selection_draws_exactly_top_k_rows_afresh_for_every_example():
    """Exactly top_k rows (default N/4) of every example, another set for every example and
    every call, each row as likely as any other (over 4,000 examples, every position's
    count within 5 standard deviations of its mean), whatever the tokens."""
    torch.manual_seed(0)
    T = 40
    for top_k, k in ((None, T // 4), (7, 7)):
        m = mixers.SelectiveAttention(8, T, selection="random", top_k=top_k).double().eval()
        x = torch.randn(4000, T, 8, dtype=F64)
        with torch.no_grad():
            kept = (m(x) != 0).any(-1)                                        # (B, T)
            again = (m(x) != 0).any(-1)
        assert (kept.sum(-1) == k).all() and not torch.equal(kept, again)
        assert len({tuple(row.tolist()) for row in kept[:100]}) == 100
        mean, sd = 4000 * k / T, math.sqrt(4000 * k / T * (1 - k / T))
        assert ((kept.sum(0) - mean).abs() < 5 * sd).all()
    tokens = torch.randint(0, 9, (50, T))
    with torch.no_grad():                               # the same draw, whatever the tokens
        torch.manual_seed(1)
        plain = (m(x[:50]) != 0).any(-1)
        torch.manual_seed(1)
        assert torch.equal((m(x[:50], tokens=tokens) != 0).any(-1), plain)
    with pytest.raises(ValueError, match="T=41"):
        m(torch.randn(1, 41, 8, dtype=F64))


def test_programmatic_selection_on_mqar_and_its_budget():
    """On MQAR with the filler 0, the plain rule keeps N - 2D - 1 rows of every example
    (everything after the context but the filler's first occurrence); with a budget it
    keeps the first repeat of each token: the D queries and the filler's second occurrence,
    the first top_k of them."""
    N, D = 64, 4
    x, y = multiquery_ar(500, 256, N, D, seed=2)
    plain = mixers.programmatic_selection(x)
    assert (plain.sum(-1) == N - 2 * D - 1).all()
    budget = mixers.first_repeats(x, N)
    queries = y != IGNORE
    assert (budget & queries).sum() == queries.sum() and (budget.sum(-1) == D + 1).all()
    capped = mixers.first_repeats(x, 3)
    assert (capped.sum(-1) == 3).all() and (capped <= budget).all()
    first_three = budget.int().cumsum(-1) <= 3
    assert torch.equal(capped, budget & first_three)
    # the layer with a budget: step == forward, its state as state_size says, rows as above
    m = mixers.SelectiveAttention(16, N, selection="programmatic", top_k=3).double().eval()
    h = torch.randn(8, N, 16, dtype=F64)
    with torch.no_grad():
        ys, states = run_steps(m, h, token=x[:8])
        y = m(h, tokens=x[:8])
    assert torch.allclose(ys, y, atol=1e-12) and torch.equal((y != 0).any(-1), capped[:8])
    assert mixers.state_numel(states[-1]) == m.state_size(N) == 2 * N * 16 + N + 1


def test_whole_sequence_top_k_is_not_causal_and_the_default_is():
    """Raising one later score evicts an earlier row under the paper's top-k, so the
    output before t changes; the default threshold rule never looks ahead, and `step`
    keeps and drops the rows forward does with a gate that drops some (the gate as built
    keeps every row, so CASES' step == forward cannot see a step that ignores it)."""
    scores = torch.tensor([[0.9, 0.6, 0.7, 0.2]])
    later = torch.tensor([[0.9, 0.6, 0.7, 0.95]])                     # the last score raised
    assert torch.equal(mixers.top_k_rows(scores, 2), torch.tensor([[True, False, True, False]]))
    assert torch.equal(mixers.top_k_rows(later, 2), torch.tensor([[True, False, False, True]]))
    m = make_mixer("selective_attention", top_k=6, inference="topk").eval()
    with torch.no_grad():
        m.gate.normal_()
        m.gate_bias.zero_()
    x = torch.randn(1, 24, 16, dtype=F64)
    raised = [x.clone() for _ in range(24)]
    for t, x2 in enumerate(raised):
        x2[:, t] = 3 * x2[:, t] + 5 * m.gate / m.gate.norm()    # raise row t's score
    changed = sum(not torch.allclose(m(x)[:, :t], m(raised[t])[:, :t]) for t in range(1, 24))
    assert changed > 0, "some earlier row must have been evicted by a later one"
    with pytest.raises(ValueError, match="inference='topk'"):
        m.step(x[:, 0])
    m.inference = "threshold"
    for t in range(1, 24):
        assert torch.allclose(m(x)[:, :t], m(raised[t])[:, :t], atol=1e-12)
    with torch.no_grad():
        y, (ys, _) = m(x), run_steps(m, x)
    assert 0.2 < (y.abs().sum(-1) > 0).double().mean() < 0.8, "some rows kept, some dropped"
    assert torch.allclose(ys, y, atol=1e-10, rtol=1e-10)


# ----------------------------------------------------------------------------------------
# train.py

def small_config(**overrides):
    config = train.Config(seq_len=32, num_kv_pairs=2, vocab_size=256, d_model=32, num_train=512,
                          num_test=64, num_valid=48, batch_size=16, max_steps=12, eval_every=4,
                          progress=False)
    for k, v in overrides.items():
        setattr(config, k, v)
    return config


def small_model(n, data_seed=0, double=False, eval=False, **overrides):
    """(config, model, x, y): config = small_config(**overrides), the model built after
    torch.manual_seed(0) (float64 if double, in eval mode if eval), then n MQAR examples
    drawn with data_seed (from their own generator)."""
    config = small_config(**overrides)
    torch.manual_seed(0)
    model = train.LanguageModel(config)
    model = model.double() if double else model
    model = model.eval() if eval else model
    return (config, model) + multiquery_ar(n, config.vocab_size, config.seq_len,
                                           config.num_kv_pairs, seed=data_seed)


def model_steps(model, x):
    """model.step over every position of x (B, T), without gradients: the outputs stacked."""
    states, steps = None, []
    with torch.no_grad():
        for t in range(x.shape[1]):
            h, states = model.step(x[:, t], t, states)
            steps.append(h)
    return torch.stack(steps, 1)


def test_command_line_settings_parse_to_their_types_and_errors():
    config = train.make_config(**train.parse_arguments(["--lr=1e-3", "--n_layers=3",
                                                        "--mlp=true", "--mixer=attention"]))
    assert (config.lr, config.n_layers, config.mlp) == (1e-3, 3, True)
    for arg, match in [("--learning_rate=1e-3", "unknown key --learning_rate"),
                       ("--lrr=1e-3", "did you mean --lr"),
                       ("--n_layers=two", r"--n_layers='two'.*an integer"),
                       ("--mlp=maybe", r"--mlp='maybe'"), ("--seq_len=63", "seq_len=63"),
                       ("--mixer=transformer", "mixer='transformer'"),
                       ("--seed=-1", "^seed=-1 "), ("lr=3", "--key=value")]:
        with pytest.raises(ValueError, match=match):
            train.make_config(**train.parse_arguments([arg]))


def test_a_run_that_could_not_train_or_be_saved_is_refused_before_it_trains(tmp_path,
                                                                           monkeypatch, capsys):
    """An out_dir that is a file, is under a file or cannot be written in would fail at the
    first checkpoint, minutes into training; lr = 0 would train nothing; a misspelt mixer is
    named with the nearest one. Each is one line and exit status 2, before anything trains."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "train", lambda *a: pytest.fail("started training"))
    Path("taken").write_text("a file")
    locked = Path("locked")
    locked.mkdir()
    locked.chmod(0o555)               # root writes there all the same: then /proc, which no one
    unwritable = "/proc/zoology_runs" if os.geteuid() == 0 else "locked/runs"
    for arg, says in [("--out_dir=taken", f"out_dir='taken' is not allowed: {tmp_path}/taken "
                                          "is a file, not a folder"),
                      ("--out_dir=taken/runs", f"{tmp_path}/taken is a file"),
                      (f"--out_dir={unwritable}", f"out_dir='{unwritable}' is not allowed: no "
                                                  "file can be written in"),
                      ("--lr=0", "lr=0.0 is not allowed: it must be > 0"),
                      ("--mixer=atention", "'atention' is not one of attention, .*; did you "
                                           "mean 'attention'\\?"),
                      ("--mixer=base_conv:kernel_size=3,gated_delta_net",
                       "did you mean 'gated_deltanet'\\?")]:
        assert train.main([arg, "--max_steps=2", "--progress=false"]) == 2, arg
        err = capsys.readouterr().err
        assert re.search(says, err) and err.count("\n") == 1, (arg, err)
    assert sorted(p.name for p in Path().iterdir()) == ["locked", "taken"]


def test_a_config_parses_its_mixer_once_across_seeds_and_checks(monkeypatch):
    """make_config parses the mixer setting; Config.replace keeps the parse (a run's seeds,
    train's own check_config parse nothing again) unless mixer or n_layers changes."""
    parsed = []
    parse = train.parse_layers
    monkeypatch.setattr(train, "parse_layers", lambda *a: parsed.append(a) or parse(*a))
    config = train.make_config(mixer="base_conv:kernel_size=3,base_conv")
    for seed in (1, 2):
        train.check_config(config.replace(seed=seed))
    assert config.replace(seed=3).layers == config.layers and len(parsed) == 1
    h3 = config.replace(mixer="h3")
    assert h3.layers == [("h3", {})] * 2 and len(parsed) == 2
    # n_layers alone changed: parsed again, no stale list of two layers kept
    assert h3.replace(n_layers=3).layers == [("h3", {})] * 3 and len(parsed) == 3
    assert config.replace(mixer="h3", n_layers=4).layers == [("h3", {})] * 4 and len(parsed) == 4


def test_mixer_setting_gives_one_mixer_per_layer(tmp_path, capsys):
    layers = train.parse_layers("base_conv:kernel_size=3,base_conv", 2)
    assert layers == [("base_conv", {"kernel_size": 3}), ("base_conv", {})]
    assert train.parse_layers("hyena", 3) == [("hyena", {})] * 3
    model = train.LanguageModel(small_config(mixer="short_conv,sliding_window:window=4"))
    assert isinstance(model.blocks[0].mixer, mixers.ShortConv)
    assert model.blocks[1].mixer.window == 4 and model.pos is None
    assert train.LanguageModel(small_config(mixer="sliding_window")).pos is not None
    for setting, match in [("hyena,h3,hyena", "lists 3 layers but n_layers=2"),
                           ("hyna", "'hyna' is not one of"),
                           ("base_conv:kernel=3", "option 'kernel=3' of base_conv")]:
        with pytest.raises(ValueError, match=match):
            train.parse_layers(setting, 2)
    # an option's value is checked where the mixer is built, once: with the model, before
    # a run trains or writes anything
    with pytest.raises(ValueError, match="window=0 is not allowed"):
        train.LanguageModel(small_config(mixer="sliding_window:window=0"))
    assert train.main(["--mixer=sliding_window:window=0", f"--out_dir={tmp_path}"]) == 2
    assert "window=0 is not allowed" in capsys.readouterr().err and not list(tmp_path.iterdir())
    # the setting is parsed once per config, and again only once it has changed
    config = small_config(mixer="hyena")
    assert config.layers is config.layers and "layers" not in dataclasses.asdict(config)
    config.mixer = "h3"
    assert config.layers == [("h3", {})] * config.n_layers


@pytest.mark.parametrize("name", list(MIXERS))
def test_every_mixer_trains_in_the_model(name, tmp_path):
    """A few steps of train.py with each mixer: the loss falls on a fixed batch, and every
    parameter of every mixer layer gets a gradient (the embeddings alone could lower the
    loss: a mixer that returned 0 would pass the first check, not the second)."""
    config, model, x, y = small_model(16, data_seed=1, mixer=name, lr=3e-3, warmup_steps=0,
                                      out_dir=str(tmp_path))
    opt = train.make_optimizer(model, config)
    first = train.labelled_loss(model, x, y)[0].item()
    mixer_params = {f"{i}.{name}": p for i, block in enumerate(model.blocks)
                    for name, p in block.mixer.named_parameters()}
    reached = dict.fromkeys(mixer_params, 0.0)
    for _ in range(15):
        loss = train.labelled_loss(model, x, y)[0]
        opt.zero_grad()
        loss.backward()
        for key, p in mixer_params.items():
            reached[key] += 0.0 if p.grad is None else p.grad.abs().sum().item()
        opt.step()
    assert loss.item() < first - 0.1, (first, loss.item())
    assert [key for key, g in reached.items() if g == 0] == [], "no gradient reached these"


def test_cli_reports_bad_keys_without_a_traceback():
    out = subprocess.run([sys.executable, str(REPO / "train.py"), "--batchsize=3"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "unknown key --batchsize" in out.stderr and "batch_size" in out.stderr


def test_a_run_is_named_by_the_settings_that_differ_from_their_defaults(monkeypatch):
    """identity: the schema and the non-default settings, never where the record goes or
    its label; a setting given at its default is no setting; and a new option whose default
    keeps the old behaviour renames no run (a Config with one more field, monkeypatched in)."""
    config = train.Config(mixer="h3", d_model=128, seed=2)
    assert json.loads(train.identity(config)) == {"schema": train.RECORD_SCHEMA, "mixer": "h3",
                                                  "d_model": 128, "seed": 2}
    same = dataclasses.replace(config, lr=train.Config.lr, out_dir="elsewhere", label="H3",
                               progress=False, save_model=True)
    assert train.run_name(same) == train.run_name(config)
    assert train.run_name(dataclasses.replace(config, lr=1e-3)) != train.run_name(config)
    name = train.run_name(config)
    Newer = dataclasses.make_dataclass("Newer", [("new_option", int, 7)], bases=(train.Config,))
    monkeypatch.setattr(train, "Config", Newer)
    assert train.run_name(Newer(mixer="h3", d_model=128, seed=2)) == name
    assert train.run_name(Newer(mixer="h3", d_model=128, seed=2, new_option=8)) != name


def test_a_finished_run_run_again_trains_nothing_and_writes_nothing(tmp_path, capsys, monkeypatch):
    args = ["--seq_len=32", "--num_kv_pairs=2", "--vocab_size=256", "--d_model=32",
            "--num_train=512", "--num_test=64", "--num_valid=48", "--batch_size=16",
            "--max_steps=8", "--eval_every=4", "--progress=false", f"--out_dir={tmp_path}"]
    assert train.main(args) == 0
    [path] = tmp_path.glob("*.json")
    before = path.read_text()
    monkeypatch.setattr(train, "train", lambda config: pytest.fail("trained again"))
    assert train.main(args) == 0 and f"already run: {path}" in capsys.readouterr().out
    assert [path] == list(tmp_path.glob("*.json")) and path.read_text() == before


# A run that dies after the checkpoint of step `kill_at`: SIGKILL (nothing more is written)
# or SIGINT (Ctrl-C: the step in flight ends, then a checkpoint and an "interrupted" record)
KILL_SCRIPT = """import os, signal, sys, train
def save_then_die(checkpoints, run, save=train.Checkpoints.save):
    save(checkpoints, run)
    if run["step"] == int(sys.argv[2]):
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
if sys.argv[1] != "none":
    train.Checkpoints.save = save_then_die
sys.exit(train.main(sys.argv[3:]))
"""


# dropout, shuffled epochs of 13 steps (the last batch partial): every random draw matters
RESUME_ARGS = ["--seq_len=16", "--num_kv_pairs=2", "--vocab_size=64", "--d_model=16",
               "--dropout=0.1", "--mixer=attention:dropout=0.1", "--num_train=200",
               "--num_test=64", "--num_valid=64", "--batch_size=16", "--max_steps=40",
               "--eval_every=6", "--target_acc=1.0", "--save_model=true", "--progress=false"]


def test_a_killed_run_resumes_exactly(tmp_path):
    """40 steps straight, and a run killed after the checkpoint of step 20 (mid-epoch, epochs
    of 13 steps) or 26 (an epoch's end), or twice, and run again with the same command, give
    bit-identical weights, history and scores: SIGKILL right after the checkpoint; SIGINT
    (Ctrl-C) finishes the step in flight and checkpoints it (so 25 ends at 26). The resumed
    record counts the training seconds of both segments, the checkpoint is gone once the
    record is written, and a checkpoint of another device is refused."""
    script = tmp_path / "run.py"
    script.write_text(KILL_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    def run(signal_name, kill_at, out_dir, *extra):
        return subprocess.run([sys.executable, str(script), signal_name, str(kill_at),
                               *RESUME_ARGS, f"--out_dir={out_dir}", *extra], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
    # a checkpoint after every step (checkpoint_every: a nanosecond), so that one is at each
    straight = run("none", 0, tmp_path / "straight", "--checkpoint_every=1e-9")
    assert straight.returncode == 0, straight.stderr[-2000:]
    [a] = (tmp_path / "straight").glob("*.json")
    a = json.loads(a.read_text())
    # training seconds count each one once, however many checkpoints (40 here)
    assert a["history"][-1]["seconds"] <= a["train_time_s"] <= a["wall_time_s"]
    wa = torch.load(next((tmp_path / "straight").glob("*.pt")), weights_only=True)
    drop = lambda h: [{k: v for k, v in e.items() if k != "seconds"} for e in h]
    def same_as_straight(folder):
        """The resumed run's record (returned): the straight run's history (seconds aside),
        scores and weights."""
        [b] = folder.glob("*.json")
        b = json.loads(b.read_text())
        assert drop(a["history"]) == drop(b["history"]) and len(a["history"]) == 7
        assert all(a[k] == b[k] for k in ("steps", "test_acc", "valid_acc")), folder.name
        wb = torch.load(next(folder.glob("*.pt")), weights_only=True)
        assert all(torch.equal(wa[k], wb[k]) for k in wa), folder.name
        return b
    for how, kill_at, stopped_at in (("SIGKILL", 20, 20), ("SIGKILL", 26, 26),
                                     ("SIGINT", 20, 21), ("SIGINT", 25, 26)):
        folder = tmp_path / f"{how}{kill_at}"
        killed = run(how, kill_at, folder, "--checkpoint_every=1e-9")
        [checkpoint] = folder.glob("*.ckpt")
        if how == "SIGKILL":
            assert killed.returncode == -9 and not list(folder.glob("*.json"))
        else:
            assert killed.returncode == 130, killed.stderr[-2000:]
            [record] = folder.glob("*.json")
            assert json.loads(record.read_text())["ended"] == "interrupted"
        state = torch.load(checkpoint, weights_only=True)
        assert state["run"]["step"] == stopped_at
        resumed = run("none", 0, folder)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert not list(folder.glob("*.ckpt"))
        b = same_as_straight(folder)
        assert [r["step"] for r in b["resumed"]] == [stopped_at]
        assert b["train_time_s"] > state["run"]["train_time"]
    # killed twice: after 24, and after 30 in the run that continued; its checkpoint then
    # holds the first resume's provenance, and the third run reads it. The training
    # seconds add up over all three segments: the second checkpoint counts the first
    # segment's 24 steps besides its own 6, and the record both checkpoints' seconds
    folder = tmp_path / "twice"
    def seconds():                                        # the checkpoint's training seconds
        return torch.load(next(folder.glob("*.ckpt")), weights_only=True)["run"]["train_time"]
    run("SIGKILL", 24, folder, "--checkpoint_every=1e-9")
    first = seconds()
    assert run("SIGKILL", 30, folder, "--checkpoint_every=1e-9").returncode == -9
    second = seconds()
    assert run("none", 0, folder).returncode == 0
    b = same_as_straight(folder)
    assert [r["step"] for r in b["resumed"]] == [24, 30]
    assert first < second < b["history"][-1]["seconds"] <= b["train_time_s"]
    # Ctrl-C during the last step: the run is finished and recorded, and still stops its
    # caller (exit 130)
    last = run("SIGINT", 39, tmp_path / "last", "--checkpoint_every=1e-9")
    [record] = (tmp_path / "last").glob("*.json")
    assert last.returncode == 130 and json.loads(record.read_text())["ended"] == "max_steps"
    assert not list((tmp_path / "last").glob("*.ckpt"))
    # a checkpoint written on another device
    run("SIGKILL", 20, tmp_path / "moved", "--checkpoint_every=1e-9")
    [checkpoint] = (tmp_path / "moved").glob("*.ckpt")
    state = torch.load(checkpoint, weights_only=True)
    torch.save({**state, "device": "cuda"}, checkpoint)
    out = run("none", 0, tmp_path / "moved")
    assert out.returncode != 0 and "was written on cuda and this run is on cpu" in out.stderr


def test_dropout_draws_from_the_runs_seed_never_the_callers_rng(tmp_path):
    """A run with dropout is the same whatever the caller's RNG holds, and leaves it as it was."""
    records = []
    for caller_seed in (1, 2):
        config = small_config(dropout=0.1, mixer="attention:dropout=0.1", max_steps=6,
                              eval_every=3, out_dir=str(tmp_path / str(caller_seed)))
        torch.manual_seed(caller_seed)
        before = torch.get_rng_state()
        records.append(train.train(config))
        assert torch.equal(torch.get_rng_state(), before)
    assert [h["loss"] for h in records[0]["history"]] == [h["loss"] for h in records[1]["history"]]


def test_device_auto_picks_cuda_then_mps_then_cpu_and_mps_refuses_what_it_lacks(monkeypatch):
    """What is available is faked: --device=auto takes the first of cuda, mps, cpu; a device
    that is not there, and amp or compile on mps, are refused naming the setting."""
    for cuda, mps, expected in [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
        assert train.resolve_device("auto").type == expected
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='mps' is not allowed: .* no Apple GPU"):
        train.make_config(device="mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cuda' is not allowed"):
        train.make_config(device="cuda")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert train.make_config(device="mps").device == "mps"
    for setting in (dict(amp=True), dict(compile="inductor")):
        for device in ("mps", "auto"):
            with pytest.raises(ValueError, match="is not allowed on 'mps'"):
                train.make_config(device=device, **setting)
    assert os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] == "1"     # set by train.py


def test_query_key_positions_find_each_querys_key():
    """Key i sits at 2i and its query at a labelled position holding the same token."""
    x, y = multiquery_ar(200, 64, 32, 4, power_a=0.1, seed=1)
    q, k = mqar.query_key_positions(x, y)
    assert len(q) == 200 * 4 and torch.all(k % 2 == 0) and torch.all(k < 8)
    b = (y != IGNORE).nonzero()[:, 0]
    assert torch.equal(x[b, q], x[b, k]) and torch.equal(y[b, q], x[b, k + 1])


def test_a_selective_attention_run_records_the_rows_it_attends_at(tmp_path):
    """selected_rows counts what each selection keeps on the test split: the random
    control exactly top_k rows, programmatic N - 2D - 1 with every query among them."""
    N, D = 32, 2
    for selection, rows in (("random:top_k=5", 5), ("programmatic", N - 2 * D - 1)):
        config = small_config(
            mixer=f"base_conv:kernel_size=3,selective_attention:selection={selection}",
            seq_len=N, num_kv_pairs=D, max_steps=2, out_dir=str(tmp_path))
        [stats] = train.train(config)["selection"]
        assert stats["rows"] == rows
        if selection == "programmatic":
            assert stats["coverage"] == 1 and math.isclose(stats["queries"], D / rows)
        else:
            assert 0 < stats["coverage"] < 1
    assert "selection" not in train.train(small_config(max_steps=2, out_dir=str(tmp_path)))


@pytest.mark.parametrize("args, message", [
    (["--sweep=fig2"], "unknown key --sweep; did you mean --seed? (keys: mixer, "),
    (["--sweep=fig2", "--dry_run"], "argument '--dry_run' is not allowed: write --key=value "),
    (["--table=main"], "unknown key --table; did you mean --label? (keys: mixer, "),
    (["--plot=fig2"], "unknown key --plot (keys: mixer, "),
    (["--lm"], "argument '--lm' is not allowed: write --key=value "),
    (["--hf=gpt2"], "unknown key --hf (keys: mixer, "),
    (["--bench"], "argument '--bench' is not allowed: write --key=value "),
    (["--preset=figure2", "--mixer=base_conv"],
     "preset='figure2' is not allowed here: choose one of cpu\n")])
def test_train_refuses_flags_that_are_not_its_keys(args, message, capsys, monkeypatch):
    """A flag that is not a key of Config, or a preset train.py does not have, is a bad
    argument like any other: exit status 2 and one line that names it and what is allowed,
    before anything trains."""
    monkeypatch.setattr(train, "train", lambda config: pytest.fail("trained"))
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"train.py: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("mixer", list(MIXERS))
def test_amp_loss_and_gradients_are_close_to_float32(mixer):
    """bfloat16 autocast (amp=True) on the CPU: the training loss within 3% of float32's and
    every gradient finite and pointing the same way (cosine > 0.95)."""
    _, model, x, y = small_model(16, data_seed=1, mixer=mixer)
    grads = []
    for amp in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = train.labelled_loss(model, x, y)[0] + model.aux_loss()
        loss.backward()
        grads.append((loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()
                                              if p.grad is not None])))
    (loss32, g32), (loss16, g16) = grads
    assert abs(loss16 - loss32) < 0.03 * loss32 and torch.isfinite(g16).all()
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) > 0.95


def test_amp_and_compiled_training_run_and_compile_matches_eager(tmp_path, monkeypatch):
    """amp=True trains under bfloat16 autocast; compile='aot_eager' (torch.compile's tracing
    without a C compiler) compiles the model and gives eager training's losses and
    accuracies at every evaluation; an unknown backend is refused."""
    calls, compile_, autocast = [], torch.compile, torch.autocast

    def recording_compile(model, backend):
        calls.append(("compile", backend))
        return compile_(model, backend=backend)

    def recording_autocast(device_type, dtype, enabled=True):
        calls.append(("autocast", dtype, enabled))
        return autocast(device_type, dtype=dtype, enabled=enabled)

    monkeypatch.setattr(torch, "compile", recording_compile)
    monkeypatch.setattr(torch, "autocast", recording_autocast)
    runs, seen = {}, {}
    for name, kw in [("eager", {}), ("compiled", dict(compile="aot_eager")),
                     ("amp", dict(amp=True))]:
        calls.clear()
        runs[name] = train.train(small_config(out_dir=str(tmp_path), **kw))
        seen[name] = set(calls)
    assert seen["eager"] == {("autocast", torch.bfloat16, False)}
    assert seen["compiled"] == {("compile", "aot_eager"), ("autocast", torch.bfloat16, False)}
    assert seen["amp"] == {("autocast", torch.bfloat16, True)}
    assert len(runs["eager"]["history"]) == len(runs["compiled"]["history"]) > 1
    for a, b in zip(runs["eager"]["history"], runs["compiled"]["history"]):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-4) and a.get("test_acc") == \
            b.get("test_acc")
    assert runs["amp"]["ended"] == "max_steps" and runs["amp"]["history"]
    with pytest.raises(ValueError, match="compile='fast' is not allowed"):
        train.check_config(small_config(compile="fast"))


def test_the_lm_experiment_s_model_makes_no_float64_in_float32():
    """The language-model experiment's model (the Llama block around rotary attention, no
    learned positions): its float32 loss and backward produce no float64 or complex128
    tensor, which an Apple GPU (mps) does not have (test_float32_forward_and_backward_make_no_
    float64 is the same over every mixer)."""
    _, model, x, y = small_model(16, mixer="attention:rotary=true", block="rms_pre_norm",
                                 mlp=True, position_embedding="none")
    with ProducedDtypes() as mode:
        (train.labelled_loss(model, x, y)[0] + model.aux_loss()).backward()
    assert sorted((op, dtype) for op, dtype in mode.produced if dtype in WIDE) == []


def a_gpu(monkeypatch, name, capability):
    """torch.cuda as on a machine whose one GPU is `name` of compute `capability` (major,
    minor), for what check_config and resolve_device read."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    # is_bf16_supported's rule: native from compute capability 8.0, emulated below it
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: including_emulation or
                        capability >= (8, 0))


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_amp_is_refused_on_a_gpu_without_native_bfloat16(device, monkeypatch):
    """amp=True on a GPU that emulates bfloat16 (a Turing T4, compute 7.5; is_bf16_supported()
    counts emulation by default) is one line that says why and what to do; on an Ampere GPU
    (8.0) it passes, and float32 passes on both."""
    a_gpu(monkeypatch, "Tesla T4", (7, 5))
    with pytest.raises(ValueError) as refused:
        train.check_config(small_config(device=device, amp=True))
    assert str(refused.value) == (
        f"amp=True is not allowed on Tesla T4 (device={device!r}, compute capability 7.5): it "
        "has no native bfloat16 (compute capability 8.0 and later do), and emulated bfloat16 "
        "runs slower than float32; train in float32 with --amp=false")
    assert train.check_config(small_config(device=device)).amp is False
    a_gpu(monkeypatch, "NVIDIA A100-SXM4-40GB", (8, 0))
    assert train.check_config(small_config(device=device, amp=True)).amp is True


def test_tf32_and_deterministic_hold_for_the_run_only_and_name_it(tmp_path, monkeypatch):
    """A run sets torch's TF32 flag for float32 matrix products (tf32) and its deterministic
    algorithms (deterministic, by torch.use_deterministic_algorithms) to its settings at every
    training step and evaluation, and gives the caller's flags back after it; each is part of
    the identity when on and absent when off (the default)."""
    calls, seen = [], []
    use_deterministic, loss = torch.use_deterministic_algorithms, train.labelled_loss

    def recording_use_deterministic(mode, **kwargs):
        calls.append(mode)
        use_deterministic(mode, **kwargs)

    def recording_loss(*args):
        seen.append((torch.backends.cuda.matmul.allow_tf32,
                     torch.are_deterministic_algorithms_enabled()))
        return loss(*args)

    monkeypatch.setattr(torch, "use_deterministic_algorithms", recording_use_deterministic)
    monkeypatch.setattr(train, "labelled_loss", recording_loss)
    before = (torch.backends.cuda.matmul.allow_tf32, torch.are_deterministic_algorithms_enabled())
    assert before == (False, False)
    for on in (True, False):
        calls.clear(), seen.clear()
        config = small_config(out_dir=str(tmp_path), max_steps=2, eval_every=2, tf32=on,
                              deterministic=on)
        train.train(config)
        assert set(seen) == {(on, on)} and len(seen) > 2, "every step and evaluation"
        assert calls == [on, False], "set for the run, then the caller's setting back"
        assert (torch.backends.cuda.matmul.allow_tf32,
                torch.are_deterministic_algorithms_enabled()) == before
        named = json.loads(train.identity(config))
        assert (named.get("tf32"), named.get("deterministic")) == ((True, True) if on else
                                                                    (None, None))


def test_lr_schedule_warms_up_then_decays_to_zero():
    config = train.Config(lr=1.0, warmup_steps=10, max_steps=110)
    lrs = [train.lr_at(s, config) for s in range(111)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0) and lrs[60] == pytest.approx(0.5)
    assert lrs[110] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_labelled_loss_is_cross_entropy_at_the_labelled_positions_written_out():
    """Mean over labelled positions of logsumexp(scores) - the label's score, scores = the
    hidden state times the tied embedding (projecting only the labelled rows);
    `right` counts each row's argmax hits (half the labels are set to the argmax here, so the
    count is not trivially 0) and `labelled` its labels; the same to the bit as the rows a
    boolean mask picks; and with rows of fewer labels than others (some removed), padded
    with unlabelled positions."""
    config, model, x, y = small_model(4, data_seed=3, double=True)
    with torch.no_grad():
        hidden = model(x)
        for b, t in (y != IGNORE).nonzero().tolist():
            if (b + t) % 2:
                y[b, t] = (hidden[b, t] @ model.embed.weight.T).argmax()
        ragged = y.clone()
        ragged[0, ragged[0] != IGNORE] = IGNORE                           # row 0: no label
        ragged[1, (ragged[1] != IGNORE).nonzero()[0]] = IGNORE            # row 1: one fewer
        for labels, n_labels in ((y, 4 * config.num_kv_pairs), (ragged, 3 * config.num_kv_pairs - 1)):
            terms, hits, count = [], [0] * len(x), [0] * len(x)
            for b, t in (labels != IGNORE).nonzero().tolist():
                scores = hidden[b, t] @ model.embed.weight.T                   # (c,)
                terms.append(torch.logsumexp(scores, 0) - scores[labels[b, t]])
                hits[b] += int(scores.argmax() == labels[b, t])
                count[b] += 1
            loss, right, labelled = train.labelled_loss(model, x, labels)
            assert labelled.tolist() == count and sum(count) == len(terms) == n_labels
            assert right.tolist() == hits and sum(hits) > 0
            assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-12)
        # the rows a boolean mask picks, in its order: the same loss to the bit
        mask = y != IGNORE
        assert torch.equal(train.labelled_loss(model, x, y)[0],
                           F.cross_entropy(model.logits(hidden[mask]), y[mask]))


def test_labelled_positions_lists_each_rows_labels_in_order_then_unlabelled_ones():
    labels = torch.tensor([[IGNORE, 5, IGNORE, 7, IGNORE],
                           [3, IGNORE, IGNORE, IGNORE, IGNORE],
                           [1, 2, IGNORE, IGNORE, IGNORE]])
    positions = train.labelled_positions(labels)
    assert positions.shape == (3, 2) and positions[0].tolist() == [1, 3]
    assert positions[1, 0] == 0 and labels[1, positions[1, 1]] == IGNORE
    assert positions[2].tolist() == [0, 1]


@pytest.mark.parametrize("mixer", ["attention", "base_conv:kernel_size=3,base_conv",
                                   "base_conv,selective_attention:selection=programmatic",
                                   "h3,selective_attention"])
def test_model_step_equals_forward(mixer):
    """The whole model token by token (tokens reach selective attention in both views)."""
    _, model, x, _ = small_model(3, data_seed=2, double=True, eval=True, mixer=mixer)
    with torch.no_grad():
        full = model(x)
    assert torch.allclose(model_steps(model, x), full, atol=1e-10)


def test_learned_selection_adds_its_aux_loss(tmp_path):
    _, model, x, _ = small_model(4, mixer="base_conv,selective_attention:top_k=1")
    assert model.aux_loss() == 0.0
    model(x)
    sel = model.blocks[1].mixer
    assert torch.equal(model.aux_loss(), sel.aux_loss) and sel.aux_loss.item() > 0
    runs = [train.train(small_config(mixer=f"base_conv,selective_attention:top_k=1:aux_weight={w}",
                                     out_dir=str(tmp_path / str(w)), save_model=True))
            for w in (0.0, 1.0)]
    assert all(r["ended"] == "max_steps" for r in runs)
    assert runs[0]["history"][0]["loss"] != runs[1]["history"][0]["loss"], "aux loss is added"
    # ... and trained on: the gate learns otherwise (a logged but detached term would not)
    gates = [torch.load(next((tmp_path / str(w)).glob("*.pt")), weights_only=True)
             ["blocks.1.mixer.gate"] for w in (0.0, 1.0)]
    assert not torch.allclose(*gates, atol=1e-6)


def test_model_uses_positions_when_every_mixer_asks_for_them():
    has_pos = lambda **kw: train.LanguageModel(small_config(**kw)).pos is not None
    assert has_pos() and has_pos(mixer="sliding_window,blocked_attention")
    assert not has_pos(mixer="base_conv") and not has_pos(mixer="attention,base_conv")
    assert not has_pos(position_embedding="none")
    assert has_pos(mixer="h3", position_embedding="learned")


def test_training_is_deterministic_and_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    a = train.train(small_config(out_dir=str(tmp_path / "a")))
    assert torch.equal(before, torch.get_rng_state())
    b = train.train(small_config(out_dir=str(tmp_path / "b")))
    untimed = lambda r: [{k: v for k, v in h.items() if k != "seconds"} for h in r["history"]]
    assert untimed(a) == untimed(b) and a["steps"] == 12
    record = json.loads(next((tmp_path / "a").glob("*.json")).read_text())
    assert record["config"]["max_steps"] == 12 and record["ended"] == "max_steps"
    assert {"test_acc", "steps", "wall_time_s", "seed", "device", "torch"} <= set(record)


def test_diverging_run_stops_and_says_so(tmp_path, capsys, monkeypatch):
    """A training loss that is not finite ends the run "diverged", its steps those before
    that loss, as the message says. It is noticed at the next evaluation (the training steps
    read nothing back from the device), or before a checkpoint, so that no checkpoint holds
    a diverged model (checkpoint_every: a nanosecond, one after every step)."""
    losses, saved, loss, save = [], [], train.labelled_loss, train.Checkpoints.save

    def recording_loss(model, *args):
        out = loss(model, *args)
        if model.training:
            losses.append(out[0].item())
        return out

    monkeypatch.setattr(train, "labelled_loss", recording_loss)
    monkeypatch.setattr(train.Checkpoints, "save",
                        lambda self, run: saved.append(run["step"]) or save(self, run))
    c = small_config(lr=1e6, grad_clip=0.0, warmup_steps=0, max_steps=200, eval_every=5,
                     out_dir=str(tmp_path))
    r = train.train(c)
    first = [math.isfinite(x) for x in losses].index(False)
    assert r["ended"] == "diverged" and r["steps"] == first < 200
    assert len(losses) == (first // 5 + 1) * 5, "noticed at the next evaluation"
    assert re.search(rf"at step {first} \(lr 1e\+06\)", capsys.readouterr().err)
    losses.clear()
    r = train.train(c.replace(checkpoint_every=1e-9, out_dir=str(tmp_path / "saved")))
    assert r["ended"] == "diverged" and r["steps"] == first and len(losses) == first + 1
    assert saved == list(range(1, first + 1)), "no checkpoint after the loss was not finite"


class HostSyncs(TorchDispatchMode):
    """Records the aten ops run inside it that make the host wait for a GPU: a value read
    back (.item(), bool(), int(): _local_scalar_dense; is_nonzero, equal), a result whose
    size depends on the values (nonzero, masked_select, an index by a boolean mask, in the
    forward or the backward) and a copy between a CPU tensor and another device (CUDA copies
    from pageable host memory synchronously). `seen`: (tag, what, its first tensor) for each,
    `tag` being the caller's label of the moment (nothing is recorded while it is None). A
    read of a CPU tensor that bypasses aten (tolist, numpy) is not seen."""

    READS = {"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select"}

    def __init__(self):
        super().__init__()
        self.tag, self.seen = None, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if name in ("index", "index_put", "index_put_", "_index_put_impl_") and any(
                i is not None and i.dtype == torch.bool for i in args[1]):
            name += " by a boolean mask"
        elif name == "_to_copy" and args[0].device != out.device:
            name += f" {args[0].device.type} -> {out.device.type}"
        elif name == "copy_" and args[0].device != args[1].device:
            name += f" {args[1].device.type} -> {args[0].device.type}"
        elif name not in self.READS:
            return out
        if self.tag is not None:
            self.seen.append((self.tag, name, tensors[0] if tensors else None))
        return out


def test_training_steps_between_evaluations_make_no_host_sync(tmp_path, monkeypatch):
    """20 training steps between evaluations (eval_every beyond them; gradient clipping on)
    under HostSyncs: no op makes the host wait for the device but AdamW's reads of its step
    counts, which it keeps on the CPU whatever its parameters' device (capturable and fused
    off: torch/optim/adam.py), so not even those on a GPU. The batch's rows: BatchOrder on
    the meta device, standing in for a GPU (a copy from the CPU to it is an op, where one to
    the CPU itself is none), copies one permutation per epoch to it, and nothing between."""
    syncs, optimizers = HostSyncs(), []
    batches, make_optimizer = train.BatchOrder.batches, train.make_optimizer

    def tagged_batches(order, step):
        for step, segment, rows in batches(order, step):
            syncs.tag = ("step", step) if step < 20 else None
            yield step, segment, rows

    def hooked_optimizer(model, config):
        """make_optimizer's, the ops of its step tagged "optimizer" instead of "step"."""
        optimizer = make_optimizer(model, config)
        retag = lambda to: lambda *_: setattr(syncs, "tag", syncs.tag and (to, syncs.tag[1]))
        optimizer.register_step_pre_hook(retag("optimizer"))
        optimizer.register_step_post_hook(retag("step"))
        optimizers.append(optimizer)
        return optimizer

    monkeypatch.setattr(train.BatchOrder, "batches", tagged_batches)
    monkeypatch.setattr(train, "make_optimizer", hooked_optimizer)
    with syncs:
        record = train.train(small_config(max_steps=25, eval_every=100, grad_clip=1.0,
                                          out_dir=str(tmp_path)))
    assert record["ended"] == "max_steps" and [h["step"] for h in record["history"]] == [25]
    in_steps = collections.Counter(name for (where, _), name, _ in syncs.seen
                                   if where == "step")
    # the batch order on a device: 512 rows in batches of 16, epochs of 32 steps
    order, copies = train.BatchOrder(small_config(), torch.device("meta")), HostSyncs()
    copies.tag = "BatchOrder"
    with copies:
        rows = [rows for _, _, rows in itertools.islice(order.batches(0), 70)]
    assert all(r.device.type == "meta" and len(r) == 16 for r in rows)
    copied = collections.Counter(name for _, name, _ in copies.seen)
    assert in_steps == {} and copied == {"_to_copy cpu -> meta": 3}, (
        f"20 training steps: {dict(in_steps)}; 70 batches of 3 epochs: {dict(copied)}")
    [optimizer] = optimizers
    counters = {state["step"].data_ptr() for state in optimizer.state.values()}
    own = [(name, t.data_ptr() in counters) for (where, _), name, t in syncs.seen
           if where == "optimizer"]
    assert own and set(own) == {("_local_scalar_dense", True)}, own


def test_batch_order_on_cuda_copies_from_pinned_memory_without_blocking(monkeypatch):
    """On CUDA (faked: a TorchFunctionMode answers pin_memory, which needs a GPU, and the
    copy to "cuda" with a tensor on the meta device) each epoch's permutation is pinned, then
    copied to the device with non_blocking: once an epoch (40 steps: two epochs)."""
    calls = []

    class FakeCuda(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.pin_memory:
                calls.append("pin_memory")
                pinned = args[0].clone()
                pinned.pinned = True
                return pinned
            if func is torch.Tensor.to and torch.device(args[1]).type == "cuda":
                calls.append(("to cuda", getattr(args[0], "pinned", False),
                              kwargs.get("non_blocking", False)))
                return args[0].to("meta")
            return func(*args, **kwargs)

    order = train.BatchOrder(small_config(), torch.device("cuda"))   # epochs of 32 steps
    with FakeCuda():
        batches = list(itertools.islice(order.batches(0), 40))
    assert calls == ["pin_memory", ("to cuda", True, True)] * 2
    assert all(rows.device.type == "meta" for _, _, rows in batches)


def official_backbone(model, tokens, block):
    """zoology/model.py's LMBackbone.forward, transcribed over our model's modules (eval
    mode, so its dropouts are the identity): blocks pass (hidden_states, residual) on."""
    hidden = model.embed(tokens)
    if model.pos is not None:
        hidden = hidden + model.pos(torch.arange(tokens.shape[1]))
    residual = None
    for b in model.blocks:
        residual = hidden + residual if residual is not None else hidden
        hidden = b.mixer(b.norm1(residual))
        if block == "identity_mlp":               # TransformerBlock, state_mixer = Identity
            residual = hidden + residual
            hidden = b.norm2(residual)
    return model.norm(hidden + residual)


@pytest.mark.parametrize("block,mixer", [("identity_mlp", "attention"),
                                         ("identity_mlp", "base_conv:kernel_size=3,h3"),
                                         ("rms_pre_norm", "mamba")])
def test_official_blocks_are_the_official_transcription(block, mixer):
    """identity_mlp is TransformerBlock with the identity as state mixer: r + mixer(LN1(r)),
    then r + LN2(r); rms_pre_norm is MambaBlock: r + mixer(RMSNorm(r)). Also checks that
    the model's own step agrees."""
    _, model, x, _ = small_model(3, data_seed=2, double=True, eval=True, mixer=mixer, block=block)
    if block == "rms_pre_norm":
        assert isinstance(model.blocks[0].norm1, torch.nn.RMSNorm)
        with torch.no_grad():
            model.blocks[0].norm1.weight.uniform_(0.5, 1.5)
    with torch.no_grad():
        want = official_backbone(model, x, block)
        assert torch.allclose(model(x), want, atol=1e-12)
        if block == "identity_mlp":              # not the plain pre-norm block
            plain = small_model(1, double=True, eval=True, mixer=mixer, block="pre_norm")[1]
            assert not torch.allclose(plain(x), want)
    assert torch.allclose(model_steps(model, x), want, atol=1e-10)
    with pytest.raises(ValueError, match="mlp=True is not allowed with block='identity_mlp'"):
        train.check_config(small_config(block="identity_mlp", mlp=True))


@pytest.mark.parametrize("mlp", [False, True])
def test_pre_norm_model_is_its_formula(mlp):
    """block="pre_norm" (the default; the other two blocks are checked just above): after
    embedding + positions, h = h + mixer(LN₁(h)), then h = h + MLP(LN₂(h)) if mlp, and a
    final LN; written with the model's parameters, norms perturbed. A post-norm block,
    LN(h + mixer(h)), fails this."""
    config, model, x, _ = small_model(2, data_seed=2, double=True, eval=True, mlp=mlp)
    perturb_(model, 0.5, only="norm")
    def ln(h, norm):
        mu, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
        return (h - mu) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias
    with torch.no_grad():
        h = model.embed.weight[x] + model.pos.weight[:config.seq_len]
        for b in model.blocks:
            h = h + b.mixer(ln(h, b.norm1))
            if mlp:
                a = ln(h, b.norm2) @ b.mlp.fc.weight.T + b.mlp.fc.bias
                a = a * (1 + torch.erf(a / math.sqrt(2))) / 2                  # GELU
                h = h + a @ b.mlp.out_proj.weight.T + b.mlp.out_proj.bias
        assert torch.allclose(model(x), ln(h, model.norm), atol=1e-12)


def weights_of(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_llama_block_is_its_formula():
    """block="rms_pre_norm" with mlp and rotary attention, no learned positions: the Llama
    recipe. h = h + attention(RMSNorm₁(h)), h = h + W_o(silu(W_g a) ⊙ W_u a) with
    a = RMSNorm₂(h), written out with the model's parameters; step agrees. The final norm is
    the LayerNorm of every model here (the official code's ln_f; Llama's is an RMSNorm), as
    the README's LM section says."""
    config, model, x, _ = small_model(2, data_seed=2, double=True, eval=True,
                                      mixer="attention:rotary=true", block="rms_pre_norm",
                                      mlp=True, position_embedding="none")
    assert model.pos is None and model.blocks[0].mlp.gate.out_features == 88    # 8·⌈32/3⌉
    perturb_(model, 0.5, only="norm")
    rms = lambda h, norm: h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-5) * norm.weight
    with torch.no_grad():
        h = model.embed.weight[x]
        for b in model.blocks:
            h = h + b.mixer(rms(h, b.norm1))
            a = rms(h, b.norm2)
            hidden = F.silu(a @ b.mlp.gate.weight.T) * (a @ b.mlp.up.weight.T)
            h = h + hidden @ b.mlp.out_proj.weight.T
        want = F.layer_norm(h, (32,), model.norm.weight, model.norm.bias)
        assert torch.allclose(model(x), want, atol=1e-12)
    assert torch.allclose(model_steps(model, x), want, atol=1e-10)


def test_normal_init_leaves_mixers_that_keep_their_own():
    config, model, _, _ = small_model(1, mixer="mamba,hyena")
    before = weights_of(model)
    torch.manual_seed(1)
    train.init_weights(model, "normal", config.n_layers)
    after = weights_of(model)
    own = [k for k in before if k.startswith("blocks.0.mixer.") or ".long_filter." in k]
    assert own and all(torch.equal(before[k], after[k]) for k in own)
    assert not torch.equal(before["embed.weight"], after["embed.weight"])
    assert not torch.equal(before["blocks.1.mixer.in_proj.weight"],
                           after["blocks.1.mixer.in_proj.weight"])
    assert after["blocks.1.mixer.out_proj.weight"].std() == pytest.approx(0.02, rel=0.2)


def test_gpt2_init_is_the_official_init_weights():
    """Every Linear and Embedding N(0, 0.02), biases 0; the out_proj of the MLP
    N(0, 0.02/√(2L)), not RWKV's or Based's (the official Hyena's and H3's: the lab's
    test)."""
    L = 2
    std = lambda tensor: tensor.std().item()
    m = small_model(1, mixer="rwkv,based", init="gpt2", d_model=64, block="pre_norm", mlp=True)[1]
    for b in m.blocks:
        assert std(b.mixer.out_proj.weight) == pytest.approx(0.02, rel=0.1)
        assert std(b.mlp.out_proj.weight) == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.1)


def test_gpt2_init_with_the_mamba_block_takes_the_official_mamba_branch():
    """_init_weights with block_type MambaBlock: Embedding N(0, 0.02), Linear biases 0,
    out_proj PyTorch's draw divided by √L; Mamba's own weights untouched."""
    config, m, _, _ = small_model(1, mixer="mamba", block="rms_pre_norm", init="gpt2", d_model=64)
    out = m.blocks[0].mixer.out_proj.weight
    bound = 1 / math.sqrt(out.shape[1]) / math.sqrt(config.n_layers)
    assert out.abs().max() <= bound and out.abs().max() > 0.9 * bound
    before = weights_of(m)
    train.init_weights(m, "gpt2", config.n_layers, "rms_pre_norm")
    after = weights_of(m)
    for k in before:
        same = torch.equal(before[k], after[k])
        assert same == (k.endswith(("in_proj.weight", "x_proj.weight", "dt_proj.weight",
                                    "conv_weight", "A_log", "dt_bias", "norm1.weight",
                                    "norm.weight", "norm.bias", ".skip", "conv_bias"))), k


def test_cosine_epochs_is_torch_cosine_annealing_stepped_per_epoch():
    """The official trainer: CosineAnnealingLR(T_max=max_epochs, eta_min=0), .step() after
    each epoch; our lr_at reads the same value at every step of an epoch."""
    config = train.Config(lr=1e-2, num_train=1000, batch_size=300, max_steps=4 * 7,
                          schedule="cosine_epochs")
    assert train.steps_per_epoch(config) == 4             # 300, 300, 300, 100 examples
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=config.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7, eta_min=0.0)
    for epoch in range(7):
        for b in range(4):
            assert train.lr_at(4 * epoch + b, config) == pytest.approx(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    with pytest.raises(ValueError, match="warmup_steps=5 is not allowed"):
        train.check_config(dataclasses.replace(config, warmup_steps=5))


# Every Config field, placed: a value other than its default (on TINY's base, which sets
# some of them), and whether that value changes what a tiny run computes on this machine.
# Fields outside NOT_IDENTITY must rename a run; those in NOT_IDENTITY must change nothing
# a run computes. A new field fails test_every_setting_is_placed until it is placed here.
TINY = dict(seq_len=16, num_kv_pairs=2, vocab_size=64, d_model=16, num_train=64, num_test=32,
            num_valid=32, batch_size=16, max_steps=6, eval_every=2, progress=False)


OTHER_VALUE = {   # field: (another value, it changes the tiny run here)
    "mixer": ("base_conv", True),
    "mixer_source": ("gla.py=0123456789abcdef", False),   # check_config's, from your file
    "d_model": (8, True), "n_layers": (1, True),
    "block": ("rms_pre_norm", True), "mlp": (True, True),
    "mlp_activation": ("tanh", True),          # (with mlp=True: check_config asks for it)
    "position_embedding": ("none", True), "dropout": (0.5, True), "init": ("gpt2", True),
    "task": ("lm", False), "corpus": ("a.txt", False),      # the LM experiment's data
    "vocab_size": (32, True), "seq_len": (12, True), "num_kv_pairs": (1, True),
    "power_a": (0.5, True), "fillers": ("uniform", True), "num_train": (48, True),
    "num_test": (16, True),
    # a mixture and slices need num_train and num_test at their defaults: the mixture tests
    "train_segments": ("16:2:64,8:2:32", False), "test_slices": ("16:2:32,8:2:16", False),
    "segment_passes": (2, False),    # one segment twice an epoch: the same draws as 2 epochs
    "num_valid": (16, True), "batch_size": (8, True), "lr": (1e-1, True), "beta2": (0.5, True),
    "weight_decay": (0.9, True), "decay_all": (True, True), "grad_clip": (1e-3, True),
    "warmup_steps": (3, True), "max_steps": (4, True), "schedule": ("cosine_epochs", True),
    "budget_steps": (2, True), "shuffle": (False, True), "eval_every": (3, True),
    "eval_probe": (8, True), "target_acc": (0.01, True),
    "preset": ("figure2", False),      # names where the values came from: make_config
    "seed": (1, True), "device": ("cpu", False),       # "auto" is the CPU on this machine
    "amp": (True, True), "compile": ("eager", False),  # the same arithmetic, traced
    "tf32": (True, False),                             # cuBLAS's: nothing on the CPU
    "deterministic": (True, False),                    # the CPU's kernels are already
    "out_dir": ("elsewhere", False), "save_model": (True, False),
    "checkpoint_every": (1e-9, False), "progress": (True, False), "label": ("x", False),
}


def test_every_setting_is_placed():
    fields = [f.name for f in dataclasses.fields(train.Config)]
    assert sorted(OTHER_VALUE) == sorted(fields)
    assert set(train.NOT_IDENTITY) <= set(fields)


@pytest.mark.parametrize("key", list(OTHER_VALUE))
def test_a_setting_renames_a_run_iff_it_changes_what_the_run_computes(key, tmp_path):
    """A setting outside NOT_IDENTITY renames the run (so a setting that changes the
    arithmetic, amp for one, cannot be moved out of the identity unseen: it changes the
    tiny run below); one in NOT_IDENTITY changes nothing the run computes: its history
    (seconds aside), steps, end and scores are those of the run without it."""
    value, computes = OTHER_VALUE[key]
    base = dict(TINY, out_dir=str(tmp_path / "a"), **({"mlp": True} if key == "mlp_activation"
                                                      else {}))
    if key == "out_dir":
        value = str(tmp_path / "b")
    a, b = train.Config(**base), train.Config(**{**base, key: value})
    assert (train.identity(a) == train.identity(b)) == (key in train.NOT_IDENTITY)
    if not computes and key not in train.NOT_IDENTITY:
        return                        # renamed, and nothing to run here shows a difference
    if key != "out_dir":
        b.out_dir = str(tmp_path / "b")
    computed = lambda r: ({k: r[k] for k in ("steps", "ended", "test_acc", "valid_acc")},
                          [{k: v for k, v in e.items() if k != "seconds"} for e in r["history"]])
    changed = computed(train.train(a)) != computed(train.train(b))
    assert changed == computes and not (changed and key in train.NOT_IDENTITY)


def test_the_learning_rate_at_every_step_of_short_schedules_written_out():
    """cosine: linear warmup over 2 steps, then (1 + cos(π (s - 2) / 4)) / 2 to step 6;
    cosine_epochs with epochs of 3 steps (4, 4 and 2 examples) and max_steps = 7 ending
    mid-epoch: E = ⌈7 / 3⌉ = 3 epochs, lr (1 + cos(π e / 3)) / 2 in epoch e, the partial
    last epoch included."""
    config = train.Config(lr=1.0, warmup_steps=2, max_steps=6)
    want = [0.5, 1.0, 1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0]
    assert [train.lr_at(s, config) for s in range(7)] == pytest.approx(want, abs=1e-12)
    config = train.Config(lr=1.0, num_train=10, batch_size=4, max_steps=7, schedule="cosine_epochs")
    want = [1.0, 1.0, 1.0, 0.75, 0.75, 0.75, 0.25]
    assert [train.lr_at(s, config) for s in range(7)] == pytest.approx(want, abs=1e-12)


def test_optimizer_decays_what_the_recipe_says():
    m = train.LanguageModel(small_config())
    groups = train.make_optimizer(m, small_config(decay_all=True, beta2=0.95)).param_groups
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1
    assert groups[0]["betas"] == (0.9, 0.95)
    assert len(groups[0]["params"]) == len(list(m.parameters()))
    groups = train.make_optimizer(m, small_config(weight_decay=0.05, lr=2e-3)).param_groups
    assert all(p.dim() >= 2 for p in groups[0]["params"]) and groups[1]["weight_decay"] == 0
    assert all(p.dim() < 2 for p in groups[1]["params"]) and groups[0]["betas"] == (0.9, 0.999)
    assert groups[0]["weight_decay"] == 0.05 and [g["lr"] for g in groups] == [2e-3, 2e-3]
    # every parameter in exactly one group
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in m.parameters()) and len(set(ids)) == len(ids)


def mixture_config(**overrides):
    """small_config trained on three segments of 40, 24 and 16 examples (batches of 16: 3, 2
    and 1 batches, each segment's last one partial) and scored on three slices."""
    return small_config(**{**dict(train_segments="32:2:40,16:2:24,32:8:16", num_train=100_000,
                                  test_slices="32:2:20,16:4:12,32:8:8", num_test=3_000,
                                  num_valid=8, shuffle=False), **overrides})


def epoch_batches(config, epochs=2):
    """BatchOrder's (segment, rows) of the first `epochs` epochs, rows as lists."""
    order = train.BatchOrder(config, torch.device("cpu"))
    count = epochs * train.steps_per_epoch(config)
    return [(s, rows.tolist()) for _, s, rows in itertools.islice(order.batches(0), count)]


def test_a_mixture_batches_each_segment_apart_in_the_official_order():
    """shuffle=False (the official _SyntheticDataset under a DataLoader without shuffling):
    segment after segment, each cut in order with its last batch partial, the same order
    every epoch; the data: each segment its own (N, D), from its own seed."""
    config = mixture_config()
    want = [(0, list(range(0, 16))), (0, list(range(16, 32))), (0, list(range(32, 40))),
            (1, list(range(16))), (1, list(range(16, 24))), (2, list(range(16)))]
    assert train.steps_per_epoch(config) == 6 and epoch_batches(config) == want * 2
    assert train.batch_sizes(config) == [16, 16, 8, 16, 8, 16]
    assert train.examples_seen(config, 6 + 4) == 80 + 56
    train_set, test, valid = train.make_data(config)
    assert [tuple(x.shape) for x, _ in train_set] == [(40, 32), (24, 16), (16, 32)]
    assert [tuple(x.shape) for x, _ in test] == [(20, 32), (12, 16), (8, 32)]
    assert [tuple(x.shape) for x, _ in valid] == [(8, 32), (8, 16), (8, 32)]
    assert [int((y != IGNORE).sum(1)[0]) for _, y in train_set] == [2, 2, 8]
    assert not torch.equal(train_set[0][0][:16], train_set[2][0][:16])     # seeds apart


def test_a_shuffled_mixture_draws_every_batch_once_an_epoch_in_a_new_order():
    """shuffle=True: each epoch every segment's rows once, in batches that never mix
    segments, the batches of all segments in a new order each epoch; resumed at any step,
    the same batches."""
    config = mixture_config(shuffle=True, seed=3)
    batches = epoch_batches(config, epochs=3)
    epochs = [batches[i:i + 6] for i in (0, 6, 12)]
    for epoch in epochs:
        for s, n in enumerate((40, 24, 16)):
            rows = sorted(r for seg, rows in epoch if seg == s for r in rows)
            assert rows == list(range(n))
        assert sorted(len(rows) for _, rows in epoch) == [8, 8, 16, 16, 16, 16]
    assert len({tuple(s for s, _ in epoch) for epoch in epochs}) > 1, "the order is new"
    for step in (4, 6, 9):                       # a continued run: state, then the same draws
        order, fresh = (train.BatchOrder(config, torch.device("cpu")) for _ in range(2))
        list(itertools.islice(order.batches(0), step))
        fresh.generator.set_state(order.state(step))
        again = [(s, r.tolist()) for _, s, r in itertools.islice(fresh.batches(step), 5)]
        assert again == batches[step:step + 5]


def test_segment_passes_is_a_curriculum_each_segment_in_turn():
    """segment_passes=2: each segment twice, a new permutation each pass, before the next;
    the curriculum's order is kept even when shuffled."""
    config = mixture_config(segment_passes=2, shuffle=True)
    batches = epoch_batches(config, epochs=1)
    assert [s for s, _ in batches] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    first, second = (sorted(r for _, rows in batches[i:i + 3] for r in rows) for i in (0, 3))
    assert first == second == list(range(40))
    assert batches[0][1] != batches[3][1], "each pass its own permutation"
    assert train.steps_per_epoch(config) == 12


class NextToken(torch.nn.Module):
    """A stand-in model that predicts token x + 1 at every position, for hand counts."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, tokens):
        return F.one_hot((tokens + 1) % self.vocab_size, self.vocab_size).double()

    def logits(self, hidden):
        return hidden


def test_per_query_and_per_sequence_accuracy_and_slices_by_hand():
    """Three examples of two queries: right 2, 1 and 0 of them (per query 3/6, per sequence
    1/3), a second slice of one example with both right; the mean over slices weighs each
    by its examples (the official valid/accuracy: the mean over every example)."""
    x = torch.tensor([[1, 5, 2, 7], [1, 5, 2, 7], [1, 5, 2, 7]])
    y = torch.tensor([[2, IGNORE, 3, IGNORE], [2, IGNORE, 9, IGNORE], [9, IGNORE, 9, IGNORE]])
    model = NextToken(16)
    scores = train.evaluate(model, x, y, batch_size=2)
    assert (scores["acc"], scores["seq_acc"], scores["examples"]) == (0.5, 1 / 3, 3)
    other = (torch.tensor([[4, 4, 4]]), torch.tensor([[IGNORE, 5, 5]]))
    split = train.score_split(model, [(x, y), other], ["4:2", "3:2"])
    assert split["slices"] == {"4:2": dict(acc=0.5, seq_acc=1 / 3),
                               "3:2": dict(acc=1.0, seq_acc=1.0)}
    assert split["acc"] == pytest.approx((3 * 0.5 + 1 * 1.0) / 4)
    assert split["seq_acc"] == pytest.approx((1 + 1) / 4)
    assert "slices" not in train.score_split(model, [(x, y)], ["4:2"])
    assert train.score_split(model, [(x, y), other], ["4:2", "3:2"], limit=1)["slices"]["4:2"] == \
        dict(acc=1.0, seq_acc=1.0)                                  # a probe: the first one


def test_a_run_on_a_mixture_records_every_slice_and_decides_on_validation(tmp_path, monkeypatch):
    """A mixture run's history and record hold each slice's accuracy, the test's and the
    validation's; the early stop reads the validation slices' mean: a run whose validation
    slices pass the target stops, though its test slices do not."""
    config = mixture_config(max_steps=8, eval_every=4, eval_probe=0, out_dir=str(tmp_path))
    r = train.train(config)
    names = ["32:2", "16:4", "32:8"]
    assert list(r["test_slices"]) == list(r["valid_slices"]) == names
    assert list(r["history"][-1]["test_slices"]) == names
    want = sum(r["test_slices"][s]["acc"] * n for s, n in zip(names, (20, 12, 8))) / 40
    assert r["test_acc"] == pytest.approx(want) and 0 <= r["test_seq_acc"] <= r["test_acc"]
    _, test, _ = train.make_data(config)
    is_test = lambda x: any(x.shape == t.shape and torch.equal(x, t) for t, _ in test)
    monkeypatch.setattr(train, "evaluate", scoring(lambda x: 0.2 if is_test(x) else 1.0))
    r = train.train(config.replace(out_dir=str(tmp_path / "stubbed")))
    assert (r["ended"], r["steps"], r["test_acc"], r["valid_acc"]) == (
        "target_reached", 4, pytest.approx(0.2), 1.0)


@pytest.mark.parametrize("overrides,name", [
    (dict(train_segments="64:4:100"), "train_segments"),             # longer than seq_len
    (dict(test_slices="32:9:10"), "test_slices"),                    # D does not fit N
    (dict(test_slices=","), "test_slices"),                          # an empty slice list
    (dict(train_segments="32:2"), "train_segments"),                 # not N:D:examples
    (dict(train_segments="32:2:10,32:2:5"), "train_segments"),       # an (N, D) twice
    (dict(train_segments="32:2:10", num_train=64), "num_train"),     # examples twice
    (dict(test_slices="32:2:10", num_test=64), "num_test"),
    (dict(fillers="official"), "fillers"), (dict(segment_passes=0), "segment_passes"),
    (dict(task="lm", test_slices="32:2:10"), "train_segments")])
def test_bad_segments_and_slices_are_refused_before_anything_trains(overrides, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*not allowed"):
        train.check_config(small_config(**{"num_train": 100_000, "num_test": 3_000,
                                           **overrides}))


def test_unshuffled_epochs_repeat_the_official_batch_order(tmp_path, monkeypatch):
    """shuffle=False (the official DataLoader): batches in order, a partial last batch,
    the same order every epoch; budget_steps stops mid-schedule."""
    seen, loss = [], train.labelled_loss
    monkeypatch.setattr(train, "labelled_loss", lambda m, x, *rest: (
        seen.append(x.clone()) if m.training else None) or loss(m, x, *rest))
    config = small_config(num_train=40, batch_size=16, shuffle=False, max_steps=100,
                          budget_steps=5, eval_every=50, out_dir=str(tmp_path))
    r = train.train(config)
    assert r["ended"] == "budget_steps" and r["steps"] == 5
    [(x, _)], *_ = train.make_data(config)
    want = [x[0:16], x[16:32], x[32:40], x[0:16], x[16:32]]
    assert len(seen) == 5 and all(torch.equal(a, b) for a, b in zip(seen, want))


def test_a_run_ends_budget_steps_only_where_its_budget_cut_the_schedule(tmp_path):
    """budget_steps below max_steps stops the schedule there, "budget_steps"; a budget at or
    past max_steps, or none (0), cuts nothing: the run ends at max_steps, "max_steps"."""
    for budget, steps, ended in ((3, 3, "budget_steps"), (4, 4, "max_steps"),
                                 (9, 4, "max_steps"), (0, 4, "max_steps")):
        r = train.train(small_config(max_steps=4, budget_steps=budget, eval_every=50,
                                     target_acc=1.0, out_dir=str(tmp_path / str(budget))))
        assert (r["steps"], r["ended"]) == (steps, ended), budget


def test_checkpoint_every_0_checkpoints_at_epoch_ends_only(tmp_path, monkeypatch):
    """checkpoint_every = 0 turns the timed checkpoints off: epochs of 3 steps checkpoint
    after steps 3 and 6 (not after 7, the last: its record follows); a checkpoint_every of a
    nanosecond checkpoints after every step but the last."""
    saved, save = [], train.Checkpoints.save
    monkeypatch.setattr(train.Checkpoints, "save", lambda self, run: saved.append(run["step"])
                        or save(self, run))
    for every, want in ((0, [3, 6]), (1e-9, [1, 2, 3, 4, 5, 6])):
        saved.clear()
        train.train(small_config(num_train=48, batch_size=16, max_steps=7, eval_every=50,
                                 checkpoint_every=every, out_dir=str(tmp_path / str(every))))
        assert saved == want, every


def test_evaluate_loss_is_the_mean_cross_entropy_over_every_labelled_position():
    """Batches of 7 rows (the last one ragged) weigh each position once: the whole split's
    mean, and the accuracies of one forward over all of it."""
    _, model, x, y = small_model(40, data_seed=3, eval=True)
    scores = train.evaluate(model, x, y, batch_size=7)
    with torch.no_grad():
        whole, right, labelled = train.labelled_loss(model, x, y)
    assert math.isclose(scores["loss"], whole.item(), rel_tol=1e-5)
    assert scores["acc"] == right.sum().item() / labelled.sum().item()
    assert scores["seq_acc"] == (right == labelled).float().mean().item()
    assert scores == {**train.evaluate(model, x, y), "loss": pytest.approx(scores["loss"])}


def test_evaluate_scores_in_eval_mode_and_hands_the_model_back_training():
    """Dropout is off while a split is scored (two scores of a training model agree, and
    equal the eval-mode score), and the model is in training mode afterwards."""
    _, model, x, y = small_model(40, data_seed=3, dropout=0.5)
    first = train.evaluate(model, x, y)
    assert model.training and train.evaluate(model, x, y) == first
    with torch.no_grad():
        model.eval()
        loss, right, labelled = train.labelled_loss(model, x, y)
    assert (first["acc"], first["loss"]) == (right.sum().item() / labelled.sum().item(),
                                             pytest.approx(loss.item(), rel=1e-5))
    model.train()
    with torch.no_grad():           # the check has power: dropout changes the loss
        assert not math.isclose(train.labelled_loss(model, x, y)[0].item(), loss.item())


def scoring(score):
    """A stand-in for train.evaluate that scores the inputs x as score(x) (loss 0)."""
    return lambda m, x, y, **kw: dict(acc=score(x), seq_acc=0.0, loss=0.0, examples=len(x))


def test_validation_probe_decides_when_the_whole_splits_are_scored(tmp_path, monkeypatch):
    """eval_probe=16: each evaluation scores the first 16 validation and 16 test examples,
    both whole splits (48 and 64) only where the validation probe passes target_acc, and on
    the final step; the record's scores are the final evaluation's."""
    sizes, evaluate = [], train.evaluate
    monkeypatch.setattr(train, "evaluate", lambda m, x, y, **kw: sizes.append(len(x)) or
                        evaluate(m, x, y, **kw))
    config = small_config(eval_probe=16, eval_every=4, max_steps=12, out_dir=str(tmp_path))
    r = train.train(config)
    assert sizes == [16, 16, 16, 16, 48, 64] and r["ended"] == "max_steps", "whole at the end"
    assert [sorted(h) for h in r["history"]] == [
        ["loss", "seconds", "step", "test_probe", "valid_probe"]] * 2 + [
        ["loss", "seconds", "step", "test_acc", "test_seq_acc", "valid_acc", "valid_loss",
         "valid_seq_acc"]]
    assert (r["test_acc"], r["valid_acc"]) == (r["history"][-1]["test_acc"],
                                               r["history"][-1]["valid_acc"])
    sizes.clear()                                      # a probe that passes: the whole splits
    monkeypatch.setattr(train, "evaluate", scoring(lambda x: sizes.append(len(x)) or 1.0))
    r = train.train(config)
    assert r["ended"] == "target_reached" and r["steps"] == 4 and sizes == [16, 48, 64]


def test_early_stopping_reads_the_validation_split_never_the_test_split(tmp_path, monkeypatch):
    """Every decision reads validation: a run whose validation accuracy stays below the
    target while its test accuracy passes it does not stop, and the mirror case stops at its
    first evaluation; a run without a validation split cannot stop early."""
    config = small_config(eval_probe=0, eval_every=4, max_steps=12, out_dir=str(tmp_path))
    _, [(x_test, _)], [(x_valid, _)] = train.make_data(config)
    is_test = lambda x: len(x) == len(x_test) and torch.equal(x, x_test)
    for test_score, valid_score, ended, steps in [(1.0, 0.5, "max_steps", 12),
                                                  (0.5, 1.0, "target_reached", 4)]:
        monkeypatch.setattr(train, "evaluate", scoring(lambda x: test_score if is_test(x)
                                                       else valid_score))
        r = train.train(config)
        assert (r["ended"], r["steps"], r["test_acc"], r["valid_acc"]) == (
            ended, steps, test_score, valid_score)
    monkeypatch.setattr(train, "evaluate", scoring(lambda x: 1.0))
    r = train.train(dataclasses.replace(config, num_valid=0))
    assert r["ended"] == "max_steps" and "valid_acc" not in r
    assert all("valid_acc" not in h and h["test_acc"] == 1.0 for h in r["history"])


def test_evaluation_scores_held_out_data_only(tmp_path, monkeypatch):
    """Every evaluated example is a validation or test example, and none was trained on
    (train and test sets of one size, so only their content tells them apart); the
    validation split is apart from the test set."""
    trained, scored = [], []
    loss, evaluate = train.labelled_loss, train.evaluate
    monkeypatch.setattr(train, "labelled_loss", lambda m, x, *rest: (
        trained.append(x) if m.training else None) or loss(m, x, *rest))
    monkeypatch.setattr(train, "evaluate",
                        lambda m, x, y, **kw: scored.append(x) or evaluate(m, x, y, **kw))
    config = small_config(num_train=64, num_test=64, eval_probe=16, max_steps=4, eval_every=2,
                          num_valid=32, out_dir=str(tmp_path))
    record = train.train(config)                    # probes at step 2, the whole splits at 4
    _, [(x_test, _)], [(x_valid, _)] = train.make_data(config)
    seen = {tuple(row) for x in trained for row in x.tolist()}
    assert len(seen) == 64 and [len(x) for x in scored] == [16, 16, 32, 64]
    assert all(torch.equal(x, want) for x, want in zip(
        scored, [x_valid[:16], x_test[:16], x_valid, x_test]))
    assert 0 <= record["valid_acc"] <= 1
    test_rows = {tuple(row) for row in x_test.tolist()}
    assert not any(tuple(row) in seen for x in scored for row in x.tolist())
    assert not any(tuple(row) in test_rows for row in x_valid.tolist())


def test_summary_counts_runs_that_never_passed_as_the_longest():
    runs = [dict(ended="target_reached", steps=steps, train_time_s=seconds,
                 config=dict(target_acc=0.99))
            for steps, seconds in ((900, 40.5), (700, 36.6), (600, 26.3))]
    runs += [dict(ended="max_steps", steps=3000, train_time_s=99.0,
                  config=dict(target_acc=0.99))] * 2
    line = train.summarize(runs)
    assert line.startswith("3/5 runs passed validation accuracy 0.99")
    assert "steps median 900 (min 600, max > 3000)" in line
    assert "training seconds median 40.5 (min 26.3, max > 99)" in line
    assert "steps median > 3000" in train.summarize(runs[2:])


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


# ----------------------------------------------------------------------------------------
# train.py: the programmatic filters trained

def test_programmatic_filters_solve_mqar_where_fixed_filters_do_not(tmp_path):
    """Figure 2's lower rows in miniature (Thm 4.5 against Thm 4.4): at d = 32 < N = 64, a
    short BaseConv then input_dependent_conv passes 0.99 within 400 steps of 64; the same
    stack with BaseConv's fixed long filter stays near its 1/D plateau on that budget."""
    acc = {}
    for second in ("input_dependent_conv", "base_conv"):
        config = small_config(mixer=f"base_conv:kernel_size=3,{second}", seq_len=64,
                              num_kv_pairs=4, vocab_size=512, num_train=64 * 400, num_test=500,
                              batch_size=64, max_steps=400, eval_every=50, out_dir=str(tmp_path))
        acc[second] = train.train(config)["test_acc"]
    assert acc["input_dependent_conv"] > 0.99 and acc["base_conv"] < 0.5, acc


# ----------------------------------------------------------------------------------------
# theory.py: H.1 notation

@pytest.mark.parametrize("n", [1, 2, 7, 16, 33])
def test_poly_star_coeff_roundtrip(n):
    u = rand(n, seed=n)
    x = torch.tensor(0.7, dtype=F64)
    # poly*(u)(x) = x^{n-1} poly(u)(1/x)
    assert torch.allclose(th.poly_eval(th.poly_star(u), x),
                          x ** (n - 1) * th.poly_eval(th.poly(u), 1 / x), atol=1e-9)
    assert torch.equal(th.coeff(th.poly(u), n), u)
    assert torch.equal(th.coeff(th.poly(u), n + 3)[n:], torch.zeros(3, dtype=F64))


def test_poly_eval_is_the_sum_of_powers():
    """The identities above hold for a poly_eval that reads the coefficients backwards too;
    this pins the order: p(x) = Σ p[i] x^i, written out."""
    p, x = rand(3, 7, seed=5), torch.tensor([0.7, -1.3, 2.0], dtype=F64)
    assert torch.allclose(th.poly_eval(p, x), sum(p[:, i] * x ** i for i in range(7)),
                          atol=1e-12)
    assert th.poly_eval(torch.tensor([1.0, 2.0], dtype=F64), 3.0) == 7.0     # 1 + 2·3


@pytest.mark.parametrize("n", [1, 5, 16, 31])
def test_poly_mul_is_polynomial_product(n):
    a, b = rand(3, n, seed=n), rand(3, n + 2, seed=n + 100)
    x = torch.tensor(-0.9, dtype=F64)
    assert torch.allclose(th.poly_eval(th.poly_mul(a, b), x),
                          th.poly_eval(a, x) * th.poly_eval(b, x), atol=1e-9)


def test_hadamard():
    u, v = rand(6, seed=0), rand(6, seed=1)
    assert torch.equal(th.hadamard(u, v), u * v)


# ----------------------------------------------------------------------------------------
# H.1 arithmetic circuits (Def H.1)

def test_circuit_measures_on_a_small_circuit():
    # (x0 + x1) * x0: levels 0, 0, 1, 2
    circuit = th.Circuit(2, (("var", 0), ("var", 1), ("+", 0, 1), ("*", 2, 0)))
    assert (th.size(circuit), th.depth(circuit), th.width(circuit)) == (4, 2, 3)
    assert th.live_values(circuit) == [[0, 1], [0, 2]]
    assert (th.degree(circuit, "symbolic") == th.degree(circuit, "random")
            == th.degree_bound(circuit) == 2)
    x = rand(5, 2, seed=0)
    assert torch.allclose(th.evaluate(circuit, x), (x[:, 0] + x[:, 1]) * x[:, 0])


def test_degree_sees_cancellation_that_the_bound_misses():
    # x0*x0 + (-1)*(x0*x0) = 0 and x0*x1 + 2*x0 - x0*x1 = 2 x0
    zero = th.Circuit(1, (("var", 0), ("const", -1), ("*", 0, 0), ("*", 1, 2), ("+", 2, 3)))
    assert th.degree_bound(zero) == 2 and th.degree(zero) == th.degree(zero, "symbolic") == -1
    lin = th.Circuit(2, (("var", 0), ("var", 1), ("const", 2), ("const", -1), ("*", 0, 1),
                         ("*", 2, 0), ("*", 3, 4), ("+", 4, 5), ("+", 7, 6)))
    assert th.degree_bound(lin) == 2 and th.degree(lin) == th.degree(lin, "symbolic") == 1


# ----------------------------------------------------------------------------------------
# H.2 gated convolution model (Def H.2), K-matrices (Def H.3, H.17)

def test_embed_and_read_out():
    u = rand(2, 5, 3, seed=0)
    z = th.embed(u, 8, 7)
    assert z.shape == (2, 8, 7) and torch.equal(z[:, :5, :3], u)
    assert z.abs().sum() == u.abs().sum()
    assert torch.equal(th.read_out(z, 5, 3), u)
    # an identity model returns its input; a model that doubles returns 2u
    assert torch.equal(th.gated_conv_model(u, [], 8, 7), u)
    assert torch.equal(th.gated_conv_model(u, [lambda z: 2 * z], 6, 3), 2 * u)


# ----------------------------------------------------------------------------------------
# Section 4 and H.3: BaseConv and its primitives

SHAPES = [(1, 1), (4, 3), (9, 5), (16, 8)]


@pytest.mark.parametrize("Np,dp", SHAPES + [(33, 3)])      # N' = 33: the fast form's FFT
@pytest.mark.parametrize("cyclic", [False, True])
def test_baseconv_matches_the_formula_written_out(Np, dp, cyclic):
    g = torch.Generator().manual_seed(Np * dp)
    layer = th.random_layer(Np, dp, g, cyclic)
    u = rand(2, Np, dp, seed=Np)
    y = th.baseconv(u, layer)
    assert torch.allclose(y, th.baseconv(u, layer, impl="reference"), atol=1e-10)
    for i in range(Np):
        left = u[:, i] @ layer.W + layer.b1[i]                               # (2, d')
        ks = range(Np) if cyclic else range(i + 1)
        right = sum(layer.h[:, k] * u[:, (i - k) % Np] for k in ks) + layer.b2[i]
        assert torch.allclose(y[:, i], left * right, atol=1e-10)


@pytest.mark.parametrize("Np,dp", SHAPES)
def test_projection_convolution_gate(Np, dp):
    u, W, h, gates = rand(3, Np, dp, seed=1), rand(dp, dp, seed=2), rand(dp, Np, seed=3), \
        rand(Np, dp, seed=4)
    assert torch.allclose(th.baseconv_stack(u, th.projection(W, Np)), u @ W, atol=1e-10)
    ref = th.conv(u.mT, h, impl="poly").mT                  # each channel's polynomial product
    assert torch.allclose(th.baseconv_stack(u, th.convolution(h)), ref, atol=1e-10)
    assert torch.allclose(th.baseconv_stack(u, th.gate(gates)), gates * u, atol=1e-12)
    assert torch.allclose(th.baseconv_stack(u, th.identity(Np, dp)), u, atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_causal_stacks_cannot_move_information_up(seed):
    """Row i of a causal stack's output depends on rows <= i only: shift_up needs ⊛."""
    Np, dp = 8, 4
    g = torch.Generator().manual_seed(seed)
    layers = [th.random_layer(Np, dp, g) for _ in range(3)]
    u = rand(Np, dp, seed=seed)
    v = u.clone()
    v[5:] += 1.0
    yu, yv = th.baseconv_stack(u, layers), th.baseconv_stack(v, layers)
    assert torch.allclose(yu[:5], yv[:5], atol=1e-10) and not torch.allclose(yu[5:], yv[5:])


@pytest.mark.parametrize("n,dp", [(1, 1), (3, 2), (8, 5)])
def test_add(n, dp):
    x, S = rand(n, dp, seed=n), rand(n, dp, seed=n + 1)
    u = torch.cat([x, S, torch.zeros(n, dp, dtype=F64)])
    want = torch.cat([x, S + x, torch.zeros(n, dp, dtype=F64)])
    layers = th.add(n, dp)
    assert len(layers) <= 2 and torch.allclose(th.baseconv_stack(u, layers), want, atol=1e-12)


def test_baseconv_model_embeds_and_reads_out():
    g = torch.Generator().manual_seed(0)
    layers = [th.random_layer(12, 6, g) for _ in range(2)]
    u = rand(3, 7, 4, seed=0)
    y = th.baseconv_model(u, layers)
    assert y.shape == (3, 7, 4)
    assert torch.allclose(y, th.baseconv_stack(th.embed(u, 12, 6), layers)[:, :7, :4])


# ----------------------------------------------------------------------------------------
# H.6: the helpers of the state bound; its claims are theory's checks (below)

CONTEXT_SIZES = [(2, 2, 1, False), (3, 2, 2, False), (3, 3, 2, True), (4, 3, 2, True),
                 (3, 4, 3, True), (4, 2, 3, False)]                      # (c_k, c_v, D, distinct)


def _conflicting_pairs(contexts, c_k):
    """The reference: every pair (i, j) of contexts that a shared query answers differently."""
    A = th.answers(contexts, c_k).tolist()
    return {(i, j) for i in range(len(A)) for j in range(i + 1, len(A))
            if any(a >= 0 and b >= 0 and a != b for a, b in zip(A[i], A[j]))}


@pytest.mark.parametrize("c_k,c_v,D,distinct", CONTEXT_SIZES)
def test_mqar_contexts_are_every_context_once(c_k, c_v, D, distinct):
    ctx = th.mqar_contexts(c_k, c_v, D, distinct)
    want = {(tuple(ks), tuple(vs))
            for ks in itertools.product(range(c_k), repeat=D) if len(set(ks)) == D
            for vs in itertools.product(range(c_v), repeat=D)
            if not distinct or len(set(vs)) == D}
    got = {(tuple(context[:, 0].tolist()), tuple(context[:, 1].tolist())) for context in ctx}
    assert got == want and len(ctx) == len(want)
    assert ((th.answers(ctx, c_k) >= 0).sum(1) == D).all()


@pytest.mark.parametrize("c_k,c_v,D,distinct", CONTEXT_SIZES[:4])
def test_find_confusion_agrees_with_the_pairwise_loop(c_k, c_v, D, distinct):
    """On all contexts (keys from c_k) equal states need not confuse: keys may differ."""
    ctx = th.mqar_contexts(c_k, c_v, D, distinct)
    conflicts = _conflicting_pairs(ctx, c_k)
    g = torch.Generator().manual_seed(c_k + c_v + D)
    _, G = th.min_states(c_k, c_v, D, distinct)
    candidates = [torch.randint(k, (len(ctx),), generator=g) for k in (2, 4, 8, 16, len(ctx))]
    candidates.append(th.cover_states(ctx, G))
    for states in candidates:
        st = states.tolist()
        confused = any(st[i] == st[j] for i, j in conflicts)
        assert (th.find_confusion(ctx, states, c_k) is not None) == confused
        assert th._confuses(ctx, states, c_k) == confused       # and the pair it names is one
    assert th.find_confusion(ctx, candidates[-1], c_k) is None


def test_key_query_distances_reach_back_to_the_key_not_an_earlier_query():
    """A key queried twice (key 7 with value 1 at positions 0-1, its queries at 2 and 4):
    both queries read the key's position 0, so the distances are 2 and 4, not 2 and 2 (the
    latest earlier 7 is the first query, whose next token is no value)."""
    tokens = torch.tensor([[7, 1, 7, 3, 7, 5]])
    labels = torch.full_like(tokens, IGNORE)
    labels[0, 2] = labels[0, 4] = 1
    assert th.key_query_distances(tokens, labels) == [2, 4]
    assert th.needed_distances(tokens, labels) == [[2, 4]]


def test_retnet_state_loop_equals_parallel_form():
    k, v = rand(3, 5, 4, seed=0), rand(3, 5, 2, seed=1)
    for gamma in (1.0, 0.9):
        w = gamma ** torch.arange(4, -1, -1, dtype=F64)
        assert torch.allclose(th.retnet_state(k, v, gamma),
                              torch.einsum("t,mtk,mtv->mkv", w, k, v), atol=1e-12)


@pytest.mark.parametrize("c_k,c_v,D,distinct", CONTEXT_SIZES)
def test_retnet_state_solves_every_context(c_k, c_v, D, distinct):
    ctx = th.mqar_contexts(c_k, c_v, D, distinct)
    pred, S = th.retnet_recall(ctx, c_k, c_v)
    assert torch.equal(pred, th.answers(ctx, c_k))
    b = max(1, math.ceil(math.log2(c_v)))
    assert S.shape == (len(ctx), c_k, b) and set(S.unique().tolist()) <= {0.0, 1.0}
    assert th.find_confusion(ctx, S, c_k) is None


# ----------------------------------------------------------------------------------------
# theory.py as a whole: every check of its report, every error a caller can cause

THEORY_CASES = [(check, {}) for check in th.CHECKS] + [      # the table's sizes, then others
    (th.check_convolutions, dict(sizes=(1, 4, 17))), (th.check_degree, dict(count=12)),
    (th.check_kmatrices, dict(m=2)), (th.check_kmatrices, dict(m=16, w=2)),
    (th.check_primitives, dict(Np=1, dp=1)), (th.check_primitives, dict(Np=9, dp=5)),
    (th.check_prop_4_3, dict(sizes=((16, 2, 40), (32, 4, 64)))),
    (th.check_thm_4_4, dict(sizes=((16, 2, 20), (32, 8, 256)), fillers="random")),
    (th.check_thm_4_5, dict(sizes=((24, 6, 32),))),
    (th.check_thm_h5, dict(N=1, d=1, depths=(1, 3), widths=(1, 3))),
    (th.check_thm_h5, dict(N=2, d=2, depths=(1, 2, 3, 4), widths=(1, 2, 3))),
    (th.check_hyena, dict(d_model=4, T=8, orders=(1,))),
    (th.check_hyena, dict(d_model=6, T=13, orders=(3,), seq_len=24)),
    (th.check_h3, dict(d_model=8, T=12, head_dims=(4,), d_state=4, shift_size=3)),
    (th.check_h3, dict(d_model=6, T=10, head_dims=(3,), d_state=4, shift_size=5)),
    (th.check_retnet, dict(d_model=12, T=10, num_heads=3)),
    (th.check_retnet, dict(d_model=4, num_heads=1)),
    (th.check_rwkv, dict(d_model=6, T=13)), (th.check_rwkv, dict(d_model=4, T=1)),
    (th.check_index, dict(sizes=((1, 3, False), (2, 2, False), (2, 3, True), (3, 2, False),
                                 (3, 4, True), (3, 8, True)))),
    (th.check_min_states, dict(sizes=((2, 2, 1, False), (3, 3, 1, True), (3, 2, 2, False),
                                      (5, 2, 2, False), (3, 2, 3, False), (4, 2, 3, False),
                                      (3, 3, 2, True), (3, 4, 2, True)))),
    (th.check_mqar_retnet, dict(N=16, D=2, c=40)), (th.check_mqar_retnet, dict(N=32, D=4, c=64)),
]


@pytest.mark.parametrize("check,sizes", THEORY_CASES,
                         ids=[f"{check.__name__}-{i}" for i, (check, _) in enumerate(THEORY_CASES)])
def test_theory_check_passes(check, sizes):
    """Every row of `python theory.py`'s table (seed 0), and the same checks at other sizes
    (seed 1): each runs its construction on random instances and its negative controls."""
    rows = check(seed=1 if sizes else 0, **sizes)
    assert rows and all(isinstance(check, th.Check) and check.ok for _, check, _ in rows), rows


def test_theory_report_shows_each_check_and_fails_on_a_failed_one(monkeypatch, capsys):
    """The report colours a check's bool, not its text: a failed check makes the exit
    status 1 whatever its evidence says. Statements and resources print as written, brackets
    included (rich would read "[erratum]" as markup and drop it)."""
    monkeypatch.setattr(th, "CHECKS", [lambda seed: [("a[1]", th.Check(True, " 3 of 3"),
                                                      "r [erratum]")]])
    out = capsys.readouterr().out if th.main() == 0 else ""
    assert "pass" in out and " 3 of 3" in out and "a[1]" in out and "r [erratum]" in out
    monkeypatch.setattr(th, "CHECKS", [lambda seed: [("a", th.Check(True, ""), "r"),
                                                     ("b", th.Check(False, " pass"), "r")]])
    assert th.main() == 1 and "FAIL" in capsys.readouterr().out


THEORY_ERRORS = [                                        # (what the message names, call)
    ("impl", lambda: th.conv(rand(6, seed=0), rand(6, seed=1), impl="fast")),
    ("modulus", lambda: th.poly_mod(rand(6, seed=0), 3, "X^n+1")),
    ("length", lambda: th.conv(rand(6, seed=0), rand(4, seed=1))),
    ("integer constants", lambda: th.degree(th.Circuit(1, (("var", 0), ("const", 0.5),
                                                            ("*", 0, 1))))),
    ("num_vars", lambda: th.evaluate(th.Circuit(1, (("var", 0),)), rand(3, 2, seed=0))),
    ("depth", lambda: th.random_circuit(2, 0, 2, seed=0)),
    ("Np", lambda: th.embed(rand(2, 5, 3, seed=0), 4, 7)),
    ("power of two", lambda: th.dft_butterfly(12)),
    ("impl", lambda: th.kmatrix_apply(rand(4, seed=0), th.dft_butterfly(4)[0], impl="slow")),
    ("inner dimensions", lambda: th.stack(th.identity(4, 2), th.identity(5, 2))),
    ("s=", lambda: th.shift_down(4, 2, 4)),
    ("num_vars", lambda: th.compile_circuit(th.random_circuit(3, 2, 2, seed=0), 2, 2)),
    ("T=", lambda: th.hyena_as_baseconv(th.random_mixer(mixers.Hyena, 4, 8, seed=0), 0)),
    ("H must divide d_model", lambda: th.retention_as_baseconv(*[torch.eye(6, dtype=F64)] * 3,
                                                         torch.full((4,), 0.9, dtype=F64), 8)),
    ("c_v", lambda: th.mqar_contexts(3, 2, 3)),            # 3 distinct values from 2
    ("c_k", lambda: th.mqar_contexts(2, 4, 3)), ("contexts", lambda: th.mqar_contexts(12, 12, 6)),
    ("contexts", lambda: th.index_contexts(6, 64)), ("search", lambda: th.min_states(5, 3, 2)),
    ("states", lambda: th.find_confusion(th.index_contexts(2, 3), torch.zeros(5), 2)),  # 6 ctx
]


@pytest.mark.parametrize("match,call", THEORY_ERRORS, ids=[m for m, _ in THEORY_ERRORS])
def test_theory_errors_name_the_argument(match, call):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------------------
# README: the quick start runs as written

def readme_blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)


def test_readme_python_snippets_run():
    blocks = readme_blocks("python")
    assert blocks, "the README has a python quick start"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def readme_section(name, heading):
    """The section of README `name` under `## heading`, up to the next section."""
    text = (REPO / name).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_readme_file_sizes_are_their_line_counts():
    """The README's Files table gives each file's length as "`path` (~N lines)", and each is
    its count by `wc -l` to within 10%, so that the promise cannot drift. The five Python files
    of the reference are all given; a file in a folder that is not here (the lab's, in a copy of
    the six files without it) is not counted."""
    stated = re.findall(r"`([\w./]+)` \(~([\d,]+) lines\)", readme_section("README.md", "Files"))
    assert {"mqar.py", "mixers.py", "train.py", "theory.py", "test_all.py"} <= dict(stated).keys()
    off = []
    for path, lines in stated:
        if not (REPO / path).parent.is_dir():
            continue
        promised = int(lines.replace(",", ""))
        if not (REPO / path).is_file():
            off.append(f"{path}: ~{promised:,} lines in the README, and no such file")
            continue
        counted = (REPO / path).read_bytes().count(b"\n")
        if abs(counted - promised) > promised / 10:
            off.append(f"{path}: ~{promised:,} lines in the README, {counted:,} by wc -l")
    assert not off, off


def test_readme_bring_your_own_mixer_runs_as_printed(tmp_path):
    """The README's "Bring your own mixer": its file, written as my_gla.py, and its two
    commands (bash blocks), run as printed (one torch thread, in a scratch folder): --check
    prints the README's table (a difference below 1e-6 may print as another small number on
    another machine) and exits 0; the training command writes a record that names the file
    and its digest, and ends at the test accuracy the README states (and explains)."""
    (tmp_path / "my_gla.py").write_text(GLA_SOURCE)
    section = readme_section("README.md", "Bring your own mixer")
    check, run = [line for block in re.findall(r"```bash\n(.*?)```", section, re.S)
                  for line in block.splitlines()]
    shown = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = lambda line: [sys.executable, str(REPO / shlex.split(line)[1]),
                            *shlex.split(line)[2:]]
    out = subprocess.run(command(check), capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    tiny = re.compile(r"(?<![\w.])(?:0|\d(?:\.\d+)?e-\d\d)(?![\w.])")
    rows = lambda table: [[tiny.sub("~0", cell.strip()) for cell in line.split("│")[1:-1]]
                          for line in table.splitlines() if line.startswith("│")]
    assert rows(out.stdout) == rows(shown) and len(rows(shown)) == len(mixers.CONTRACT)
    assert out.stdout.splitlines()[0].strip() == shown.splitlines()[0].strip()
    out = subprocess.run(command(run), capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    [record] = [json.loads(p.read_text()) for p in (tmp_path / "results/runs").glob("*.json")]
    assert record["config"]["mixer_source"] == f"my_gla.py={mixers.source_digest(GLA_SOURCE)}"
    assert record["steps"] == 50
    stated = re.search(r"ends at test accuracy (\.\d{3}), after (\d+) steps", section)
    assert stated and stated.groups() == (train.acc_text(record["test_acc"]), "50"), stated
    assert "max_steps" in out.stdout.splitlines()[-1]


def test_readme_copy_list_for_attention_matches_its_docstring():
    """The README's list of what to copy for attention names what Attention's "To copy:"
    line names (test_a_mixer_copied_as_its_docstring_says_runs_as_the_module_does)."""
    listed = re.search(r"For attention:\n\n((?:[- ] .*\n)+)", (REPO / "README.md").read_text())
    assert listed, "the README lists what to copy for attention"
    definitions, _, _ = mixers_top_level()
    assert (set(re.findall(r"`(\w+)`", listed.group(1))) ==
            copy_line_names(mixers.Attention, definitions))


def test_readme_main_command_solves_mqar(tmp_path):
    """The README's two commands are `make run` and `make test`, .ci/run runs `make test`,
    and the Makefile's targets run train.py and the test suite in the venv it sets up. This
    runs what `make run` runs, `python train.py`, in this interpreter (in a scratch folder,
    so that its results land there), and checks that attention solved MQAR and the gated
    convolution did not: real training runs. (`bash .ci/run` on a clean clone runs the set-up
    itself.)"""
    commands = [line.strip() for block in readme_blocks("bash") for line in block.splitlines()]
    assert commands[:2] == ["make run", "make test"], commands
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^run: .*\n\t\$\(PYTHON\) train\.py \$\(ARGS\)$", makefile, re.M)
    assert re.search(r"^test: .*\n\t\$\(PYTHON\) -m pytest -q test_all\.py "
                     r"experiments/test_lab\.py$", makefile, re.M)
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-3] == "make run" and ci[-1] == "make test", ci
    assert ci[-2].startswith('test -z "$(git status --porcelain)" ||'), "the tree stays clean"
    # bounded so that a hang fails, not a slow machine (two minutes here, alone)
    out = subprocess.run([sys.executable, str(REPO / "train.py")], capture_output=True,
                         text=True, cwd=tmp_path, timeout=3600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "wrote results/runs/main.png" in out.stdout and not (tmp_path / "results/main").exists()
    records = {}
    for path in (tmp_path / "results" / "runs" / "main").glob("*.json"):
        record = json.loads(path.read_text())
        assert path.stem == train.run_name(train.Config(**record["config"])), path
        records[record["config"]["label"]] = record
    assert set(records) == {"attention", "base_conv"}
    assert records["attention"]["ended"] == "target_reached"        # on validation, so
    assert records["attention"]["valid_acc"] > 0.99 and records["attention"]["test_acc"] > 0.98
    assert records["base_conv"]["test_acc"] < 0.9
    assert "test acc" in out.stdout
    assert (tmp_path / "results" / "runs" / "main.png").stat().st_size > 1e4


# ----------------------------------------------------------------------------------------
# test_all.py alone: the six files pass their own tests in a copy without the lab

# the six files, and what their tests read besides (the README's test reads the Makefile and
# .ci/run): a reader's copy
COPIED = ("mixers.py", "mqar.py", "train.py", "theory.py", "test_all.py", "README.md", "Makefile",
          ".ci/run")
# a test or two of each section, run in the copy: mqar, mixers, train, theory, README
IN_THE_COPY = [
    "test_all.py::test_power_law_probs_are_the_formula_of_procedure_1",
    "test_all.py::test_ar_hits_are_a_loop_over_each_context",
    "test_all.py::test_every_mixer_keeps_the_mixer_contract[h3]",
    "test_all.py::test_a_mixer_copied_as_its_docstring_says_runs_as_the_module_does[BaseConv]",
    "test_all.py::test_a_mixer_of_your_own_trains_by_its_path_and_its_source_names_the_run",
    "test_all.py::test_lr_schedule_warms_up_then_decays_to_zero",
    "test_all.py::test_baseconv_model_embeds_and_reads_out",
    "test_all.py::test_theory_report_shows_each_check_and_fails_on_a_failed_one",
    "test_all.py::test_readme_copy_list_for_attention_matches_its_docstring",
]


def test_the_six_files_pass_their_own_tests_in_a_copy_without_the_lab(tmp_path):
    """COPIED (every file of the repository this one reads, by its REPO path) in an empty
    folder, no experiments/ beside them and none on the path: test_all.py imports there and
    collects the same tests as here, and IN_THE_COPY pass there (all of them take minutes:
    the suite runs them here)."""
    read = {"/".join(re.findall(r'"([^"]+)"', path))
            for path in re.findall(r'REPO((?: / "[^"]+")+)', (REPO / "test_all.py").read_text())}
    assert read <= set(COPIED), f"the copy lacks {read - set(COPIED)}"
    for name in COPIED:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    pytest_ = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    env = {**os.environ, "PYTHONPATH": ""}
    collected = [subprocess.run([*pytest_, "--collect-only", "test_all.py"], cwd=folder, env=env,
                                capture_output=True, text=True, timeout=300)
                 for folder in (REPO, tmp_path)]
    here, there = ([line for line in out.stdout.splitlines() if line.startswith("test_all.py::")]
                   for out in collected)
    assert collected[1].returncode == 0, collected[1].stdout[-3000:]
    assert there == here and len(here) > 500, (len(here), len(there))
    out = subprocess.run([*pytest_, *IN_THE_COPY], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0 and f"{len(IN_THE_COPY)} passed" in out.stdout, out.stdout[-3000:]
