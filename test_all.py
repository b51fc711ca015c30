"""Every test of the project, in the order of the modules: mqar, mixers, train, README.

Run with `python -m pytest -q test_all.py` (the README's test command). Statistical tests use
fixed seeds and state their thresholds; tolerances are explicit at each assert.
"""
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mixers
import mqar
import train
from mixers import MIXERS
from mqar import IGNORE

REPO = Path(__file__).resolve().parent


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


def check_mqar_layout(inputs, labels, vocab_size, num_kv_pairs, random_non_queries=False):
    """Assert every invariant of the official layout (SPEC §1) on a batch."""
    B, N = inputs.shape
    D, c = num_kv_pairs, vocab_size
    assert inputs.dtype == labels.dtype == torch.int64 and labels.shape == (B, N)
    keys, values = inputs[:, 0:2 * D:2], inputs[:, 1:2 * D:2]
    assert ((keys >= 1) & (keys < c // 2)).all()
    assert ((values >= c // 2) & (values < c)).all()
    assert (keys.sort(1).values.diff(dim=1) > 0).all(), "keys distinct within an example"
    assert (values.sort(1).values.diff(dim=1) > 0).all(), "values distinct within an example"
    g = query_slots(inputs, D)
    pos = 2 * D + 2 * g
    assert torch.equal(labels.gather(1, pos), values), "label at a query = its key's value"
    assert ((labels != IGNORE).sum(1) == D).all(), "exactly D labelled positions"
    others = torch.ones(B, N, dtype=torch.bool)
    others[:, :2 * D] = False
    others.scatter_(1, pos, False)
    if random_non_queries:
        rest = inputs.masked_fill(~others, -1)
        assert not (rest[:, :, None] == keys[:, None, :]).any(), "filler never equals a key"
        assert ((inputs[others] >= 0) & (inputs[others] < c)).all()
    else:
        assert (inputs[others] == 0).all(), "filler is 0"


# ----------------------------------------------------------------------------------------
# mqar.py: Procedure 1

@pytest.mark.parametrize("N,D,c", [(64, 4, 8192), (128, 8, 200), (256, 16, 8192),
                                   (16, 4, 17), (512, 64, 8192)])
@pytest.mark.parametrize("random_non_queries", [False, True])
def test_mqar_layout_invariants(N, D, c, random_non_queries):
    x, y = mqar.multiquery_ar(500, vocab_size=c, seq_len=N, num_kv_pairs=D,
                              random_non_queries=random_non_queries, seed=3)
    assert x.shape == (500, N)
    check_mqar_layout(x, y, c, D, random_non_queries)


def test_per_example_baseline_has_the_same_layout():
    x, y = mqar.multiquery_ar_per_example(300, vocab_size=300, seq_len=128, num_kv_pairs=8)
    check_mqar_layout(x, y, 300, 8)


@pytest.mark.parametrize("alpha", [0.01, 0.1, 1.0, 2.0])
def test_first_query_slot_follows_the_power_law(alpha):
    """Key 1 is drawn first, so its slot g is distributed exactly as P(g) ∝ α(g+1)^(α-1).

    Chi-square goodness of fit over 20,000 examples, rejected at the 0.999 level.
    """
    N, D = 128, 8
    x, _ = mqar.multiquery_ar(20_000, seq_len=N, num_kv_pairs=D, power_a=alpha, seed=11)
    space = (N - 2 * D) // 2
    counts = np.bincount(query_slots(x, D)[:, 0].numpy(), minlength=space)
    stat, dof = chi2_gof(counts, mqar.power_law_probs(space, alpha))
    assert stat < chi2_critical(dof), (stat, dof)


def test_power_law_test_has_power():
    """The same test rejects slots drawn with the wrong α: it can fail."""
    N, D = 128, 8
    x, _ = mqar.multiquery_ar(20_000, seq_len=N, num_kv_pairs=D, power_a=0.1, seed=11)
    space = (N - 2 * D) // 2
    counts = np.bincount(query_slots(x, D)[:, 0].numpy(), minlength=space)
    stat, dof = chi2_gof(counts, mqar.power_law_probs(space, 0.01))
    assert stat > chi2_critical(dof)


@pytest.mark.parametrize("alpha", [0.01, 1.0])
def test_all_query_slots_match_the_official_algorithm(alpha):
    """Each key's slot distribution equals that of per-example `choice(replace=False, p=p)`.

    Two-sample chi-square per key index (vectorized vs baseline, 8,000 examples each), at
    the 0.999 level with a Bonferroni-style margin (z = 3.5) over the D keys.
    """
    N, D = 64, 4
    space = (N - 2 * D) // 2
    fast, _ = mqar.multiquery_ar(8000, seq_len=N, num_kv_pairs=D, power_a=alpha, seed=1)
    slow, _ = mqar.multiquery_ar_per_example(8000, seq_len=N, num_kv_pairs=D, power_a=alpha,
                                             seed=2)
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


def test_random_non_queries_are_uniform_over_the_allowed_tokens():
    c, N, D = 24, 20, 2
    x, y = mqar.multiquery_ar(20_000, vocab_size=c, seq_len=N, num_kv_pairs=D,
                              random_non_queries=True, seed=9)
    keys = x[:, 0:2 * D:2]
    filler = x[:, -1]                        # the last position is never a query (odd)
    assert not (filler[:, None] == keys).any()
    # condition on one key set to check uniformity over the c - D allowed tokens
    counts = np.bincount(filler.numpy(), minlength=c)
    assert (counts[0] > 0) and (counts[c // 2:] > 0).all()
    # P(token t) = P(t not a key) / (c - D): compute it from the key frequencies
    key_freq = np.bincount(keys.flatten().numpy(), minlength=c) / len(x)
    probs = (1 - key_freq) / (c - D)
    stat, dof = chi2_gof(counts, probs / probs.sum())
    assert stat < chi2_critical(dof), stat


def test_mqar_is_deterministic_and_seeded():
    a = mqar.multiquery_ar(100, seed=7, random_non_queries=True)
    b = mqar.multiquery_ar(100, seed=7, random_non_queries=True)
    c = mqar.multiquery_ar(100, seed=8, random_non_queries=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_mqar_neither_reads_nor_changes_global_rng():
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    first = mqar.multiquery_ar(50, seed=1, random_non_queries=True)
    after = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    assert before[0] == after[0] and np.array_equal(before[1], after[1])
    assert torch.equal(before[2], after[2])
    random.seed(123), np.random.seed(123), torch.manual_seed(123)
    second = mqar.multiquery_ar(50, seed=1, random_non_queries=True)
    assert torch.equal(first[0], second[0])


@pytest.mark.parametrize("kwargs,name", [
    (dict(seq_len=63), "seq_len"),
    (dict(seq_len=64, vocab_size=64), "vocab_size"),
    (dict(seq_len=64, num_kv_pairs=17), "num_kv_pairs"),
    (dict(num_kv_pairs=0), "num_kv_pairs"),
    (dict(num_examples=-1), "num_examples"),
    (dict(num_examples=2.5), "num_examples"),
    (dict(power_a=0), "power_a"),
    (dict(power_a=-1.0), "power_a"),
    (dict(seed=-3), "seed"),
    (dict(random_non_queries="yes"), "random_non_queries"),
])
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
# mqar.py: single-query AR and the appendix G sequences

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


@pytest.mark.parametrize("P", [1, 16, 64, 256])
def test_bigram_recall_sequences(P):
    ids = torch.arange(100, 2000)
    N, filler = 1024, 500
    x, ar, fill = mqar.bigram_recall_sequences(ids, 20, P, filler_id=filler, seed=P)
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
        mqar.bigram_recall_sequences(torch.arange(10_000), 2, 300, filler_id=0)
    with pytest.raises(ValueError, match="token_ids"):
        mqar.bigram_recall_sequences(torch.arange(10), 2, 8, filler_id=0)


# ----------------------------------------------------------------------------------------
# mixers.py: properties every mixer must have

def make_mixer(name, D=16, T=24, dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    return MIXERS[name](D, T, **kwargs).to(dtype)


def run_steps(mixer, x):
    """Run `step` over a whole sequence; returns (outputs (B, T, D), states after each t)."""
    state, ys, states = None, [], []
    for t in range(x.shape[1]):
        y, state = mixer.step(x[:, t], state)
        ys.append(y)
        states.append(state)
    return torch.stack(ys, 1), states


@pytest.mark.parametrize("name", list(MIXERS))
def test_mixer_is_causal(name):
    m = make_mixer(name).eval()
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    for t in (0, 7, 23):
        x2 = x.clone()
        x2[:, t] += torch.randn(2, 16, dtype=torch.float64)
        y, y2 = m(x), m(x2)
        assert torch.allclose(y[:, :t], y2[:, :t], atol=1e-12, rtol=0)
        assert not torch.allclose(y[:, t:], y2[:, t:]), "the change must be seen at t"


@pytest.mark.parametrize("name", list(MIXERS))
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_mixer_step_equals_forward(name, dtype, tol):
    m = make_mixer(name, dtype=dtype).eval()
    x = torch.randn(3, 24, 16, dtype=dtype)
    with torch.no_grad():
        ys, _ = run_steps(m, x)
        y = m(x)
    assert y.dtype == ys.dtype == dtype
    assert torch.allclose(ys, y, atol=tol, rtol=tol), (ys - y).abs().max()


@pytest.mark.parametrize("name", list(MIXERS))
def test_mixer_state_size_is_the_real_state(name):
    m = make_mixer(name).eval()
    with torch.no_grad():
        _, states = run_steps(m, torch.randn(2, 24, 16, dtype=torch.float64))
    for t in (1, 2, 5, 24):
        state = states[t - 1]
        assert all(s.shape[0] == 2 for s in state), "batch is dimension 0 of every state"
        assert mixers.state_numel(state) == m.state_size(t)


@pytest.mark.parametrize("name", [n for n in MIXERS if "impl" in
                                  MIXERS[n].__init__.__code__.co_varnames])
def test_mixer_fast_equals_reference(name):
    fast, ref = make_mixer(name, impl="fast"), make_mixer(name, impl="reference")
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 24, 16, dtype=torch.float64, requires_grad=True)
    yf, yr = fast(x), ref(x)
    assert torch.allclose(yf, yr, atol=1e-10, rtol=1e-10)
    gy = torch.randn_like(yf)
    gf = torch.autograd.grad(yf, [x, *fast.parameters()], gy)
    gr = torch.autograd.grad(yr, [x, *ref.parameters()], gy)
    for a, b in zip(gf, gr):
        assert torch.allclose(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", list(MIXERS))
def test_gradients_reach_every_parameter(name):
    m = make_mixer(name, dtype=torch.float32)
    m(torch.randn(2, 24, 16)).square().sum().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


def test_attention_reference_is_the_textbook_formula():
    """Checks the reference itself against a loop over query positions."""
    q, k, v = (torch.randn(2, 3, 10, 4, dtype=torch.float64) for _ in range(3))
    y = mixers.attention_reference(q, k, v)
    for i in range(10):
        w = (q[:, :, i:i + 1] @ k[:, :, :i + 1].transpose(-1, -2) / 2).softmax(-1)
        assert torch.allclose(y[:, :, i:i + 1], w @ v[:, :, :i + 1], atol=1e-12)


def test_attention_multihead_and_bad_arguments():
    m = make_mixer("attention", num_heads=4)
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    ys, _ = run_steps(m, x)
    assert torch.allclose(ys, m(x), atol=1e-10)
    with pytest.raises(ValueError, match="num_heads=3"):
        MIXERS["attention"](16, 24, num_heads=3)
    with pytest.raises(ValueError, match="impl='flash'"):
        MIXERS["attention"](16, 24, impl="flash")


# ----------------------------------------------------------------------------------------
# train.py

def small_config(**overrides):
    c = train.Config(seq_len=32, num_kv_pairs=2, vocab_size=256, d_model=32, num_train=512,
                     num_test=64, batch_size=16, max_steps=12, eval_every=4, progress=False)
    for k, v in overrides.items():
        setattr(c, k, v)
    return c


def test_parse_overrides_types_and_errors():
    c = train.parse_overrides(["--lr=1e-3", "--n_layers=3", "--mlp=true", "--mixer=attention"])
    assert (c.lr, c.n_layers, c.mlp) == (1e-3, 3, True)
    with pytest.raises(ValueError, match="unknown key --learning_rate"):
        train.parse_overrides(["--learning_rate=1e-3"])
    with pytest.raises(ValueError, match="did you mean --lr"):
        train.parse_overrides(["--lrr=1e-3"])
    with pytest.raises(ValueError, match=r"--n_layers='two'.*int"):
        train.parse_overrides(["--n_layers=two"])
    with pytest.raises(ValueError, match=r"--mlp='maybe'"):
        train.parse_overrides(["--mlp=maybe"])
    with pytest.raises(ValueError, match="mixer='transformer'"):
        train.parse_overrides(["--mixer=transformer"])
    with pytest.raises(ValueError, match="seq_len=63"):
        train.parse_overrides(["--seq_len=63"])
    with pytest.raises(ValueError, match="--key=value"):
        train.parse_overrides(["lr=3"])


def test_cli_reports_bad_keys_without_a_traceback():
    out = subprocess.run([sys.executable, str(REPO / "train.py"), "--batchsize=3"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2
    assert "unknown key --batchsize" in out.stderr and "batch_size" in out.stderr
    assert "Traceback" not in out.stderr


def test_lr_schedule_warms_up_then_decays_to_zero():
    c = train.Config(lr=1.0, warmup_steps=10, max_steps=110)
    lrs = [train.lr_at(s, c) for s in range(111)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0) and lrs[60] == pytest.approx(0.5)
    assert lrs[110] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_labelled_loss_equals_full_vocabulary_loss():
    """Projecting only the labelled rows (fast) == logits everywhere + ignore_index."""
    c = small_config()
    torch.manual_seed(0)
    model = train.LanguageModel(c).double()
    x, y = mqar.multiquery_ar(8, c.vocab_size, c.seq_len, c.num_kv_pairs)
    loss, correct, n = train.labelled_loss(model, x, y)
    full = train.full_logits_loss(model, x, y)
    assert n == 8 * c.num_kv_pairs
    assert torch.allclose(loss, full, atol=1e-12)
    logits = model.logits(model(x))
    mask = y != IGNORE
    assert int(correct) == int((logits[mask].argmax(-1) == y[mask]).sum())


def test_model_uses_positions_only_for_attention_by_default():
    assert train.LanguageModel(small_config()).pos is not None
    assert train.LanguageModel(small_config(position_embedding="none")).pos is None


def test_training_is_deterministic_and_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    a = train.train(small_config(out_dir=str(tmp_path / "a")))
    assert torch.equal(before, torch.get_rng_state())
    b = train.train(small_config(out_dir=str(tmp_path / "b")))
    assert a["history"] == b["history"] and a["steps"] == 12
    record = json.loads(next((tmp_path / "a").glob("*.json")).read_text())
    assert record["config"]["max_steps"] == 12 and record["ended"] == "max_steps"
    assert {"test_acc", "steps", "wall_time_s", "seed", "device", "torch"} <= set(record)


def test_diverging_run_stops_and_says_so(tmp_path, capsys):
    r = train.train(small_config(lr=1e6, grad_clip=0.0, warmup_steps=0, max_steps=200,
                                 out_dir=str(tmp_path)))
    assert r["ended"] == "diverged" and r["steps"] < 200
    err = capsys.readouterr().err
    assert re.search(r"at step \d+ \(lr 1e\+06\)", err), err


# ----------------------------------------------------------------------------------------
# README: the quick start runs as written

def readme_blocks(lang):
    text = (REPO / "README.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_python_snippets_run():
    blocks = readme_blocks("python")
    assert blocks, "the README has a python quick start"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_readme_main_command_solves_mqar(tmp_path):
    """Runs the README's main command exactly as written (in a scratch folder, so its
    results land there) and checks that attention solved MQAR: a real training run."""
    commands = [line.strip() for block in readme_blocks("bash") for line in block.splitlines()]
    assert "python train.py" in commands
    assert "python -m pytest -q test_all.py" in commands
    out = subprocess.run([sys.executable, str(REPO / "train.py")], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "results").rglob("*.json")]
    attention = [r for r in records if r["config"]["mixer"] == "attention"]
    assert attention and all(r["test_acc"] >= 0.99 for r in attention)
    assert all(r["ended"] == "target_reached" for r in attention)
    assert "test acc" in out.stdout
