"""Synthetic associative-recall data for Zoology (Arora et al., 2023).

Implements, in the order of the paper:
  Procedure 1 (appendix E): multi-query associative recall, `multiquery_ar`; and the older
      single-query AR task it replaces, `associative_recall`.
  Section 3.1: the AR hits among the tokens of real text, which slice a language model's
      loss, `ar_hits`, `ar_gap_share`, `sliced_perplexity` (the corpus, its tokenizer, the
      language models and appendix G's sequences are the lab's: experiments/lm.py).

Glossary (code name -> paper symbol):
  vocab_size   c           vocabulary size; keys come from [1, c/2), values from [c/2, c)
  seq_len      N           sequence length
  num_kv_pairs D           key-value pairs per example (= queries per example)
  power_a      α           power law of the query slots, P(g) ∝ α·(g+1)^(α-1)
  space        N/2 - D     number of query slots after the 2D context tokens
  B                        number of examples

Every generator is vectorized over examples (no Python loop over rows) and draws from its
own `numpy.random.Generator(seed)`: the global numpy / torch / random states are never read
or changed, and the same arguments give the same tensors. Generation runs in numpy, whose
allocations `tracemalloc` can see (the lab's benchmark, `python -m experiments --bench=mqar`,
measures peak memory with it against multiquery_ar_per_example, the official algorithm one
example at a time); the results are handed to torch without a copy.

`python mqar.py` prints one example.
"""
import argparse

import numpy as np
import torch

IGNORE = -100  # label of every position that carries no loss (PyTorch's ignore_index)


# ----------------------------------------------------------------------------------------
# argument checks

def check_int(name, value, low, allowed):
    """Raise a ValueError naming `name` unless `value` is an int >= low."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be {allowed}")


def _check_mqar_args(num_examples, vocab_size, seq_len, num_kv_pairs, power_a, seed):
    check_int("num_examples", num_examples, 0, "an integer >= 0")
    check_int("seq_len", seq_len, 4, "an even integer >= 4")
    if seq_len % 2:
        raise ValueError(f"seq_len={seq_len} is not allowed: seq_len must be even "
                         "(query slots sit at every other position after the context)")
    check_int("num_kv_pairs", num_kv_pairs, 1, "an integer >= 1")
    if 4 * num_kv_pairs > seq_len:
        raise ValueError(f"num_kv_pairs={num_kv_pairs} is not allowed with seq_len={seq_len}: "
                         f"4*num_kv_pairs must be <= seq_len (at most {seq_len // 4}), so that "
                         "every key gets its own query slot")
    check_int("vocab_size", vocab_size, seq_len + 1, f"an integer > seq_len={seq_len}")
    if (isinstance(power_a, bool) or not isinstance(power_a, (int, float, np.floating))
            or not 0 < power_a < float("inf")):
        raise ValueError(f"power_a={power_a!r} is not allowed: power_a must be a finite "
                         "number > 0")
    check_int("seed", seed, 0, "an integer >= 0")


# ----------------------------------------------------------------------------------------
# vectorized sampling helpers

def sample_distinct(rng, num_rows, k, low, high):
    """k distinct integers from [low, high) per row, uniformly over ordered k-tuples (up to
    float32 ties in the shuffle, noted below).

    Floyd's algorithm, vectorized over rows, on the span = high - low integers: for
    j = span-k .. span-1 draw t uniform in [0, j]; take t unless this row already holds it,
    then take j. That gives a uniform k-subset in O(rows·k²) work and O(rows·k) memory
    (never O(rows·span)); a random permutation per row then makes the order uniform too.
    Returns int64 (num_rows, k).
    """
    span = high - low
    assert 0 <= k <= span, (k, span)
    j = np.arange(span - k, span)
    draws = (rng.random((num_rows, k)) * (j + 1)).astype(np.int64)        # t_i in [0, j_i]
    chosen = np.empty((num_rows, k), dtype=np.int64)
    for i in range(k):
        taken = (chosen[:, :i] == draws[:, i:i + 1]).any(axis=1)
        chosen[:, i] = np.where(taken, j[i], draws[:, i])
    # float32 keys: two equal draws (about one row in 10^4 at k = 64) keep their order
    order = np.argsort(rng.random((num_rows, k), dtype=np.float32), axis=1)
    return np.take_along_axis(chosen, order, axis=1) + low


def power_law_probs(space, power_a):
    """P(g) ∝ α·(g+1)^(α-1) for the query slots g = 0..space-1 (Procedure 1).

    Computed in log space and normalised by its largest term, so that a large α neither
    overflows nor underflows (the factor α cancels)."""
    logp = (power_a - 1) * np.log(np.arange(1, space + 1, dtype=np.float64))
    p = np.exp(logp - logp.max())
    return p / p.sum()


def sample_weighted_without_replacement(rng, num_rows, k, probs):
    """k distinct indices per row, drawn one after another with P ∝ probs among those left.

    This is what `numpy.random.choice(len(probs), k, replace=False, p=probs)` does, in the
    same order: the first index is distributed exactly as `probs`. Vectorized with the
    exponential-race trick: index i gets the key E_i / p_i with E_i ~ Exp(1); the k smallest
    keys, in increasing order, are a sequential weighted draw. Returns int64 (num_rows, k).
    """
    E = rng.standard_exponential((num_rows, len(probs)), dtype=np.float32)
    with np.errstate(divide="ignore"):     # E_i = 0 gives -inf (first); p_i = 0 gives +inf
        keys = np.log(E, dtype=np.float64) - np.log(probs)     # log(E_i / p_i), any finite α
    top = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < len(probs) else \
        np.broadcast_to(np.arange(k), (num_rows, k))
    order = np.argsort(np.take_along_axis(keys, top, axis=1), axis=1)
    return np.take_along_axis(top, order, axis=1).astype(np.int64)


# ----------------------------------------------------------------------------------------
# Procedure 1: multi-query associative recall

# the rules for the tokens at the positions that are neither context nor query (multiquery_ar)
FILLERS = ("zeros", "random", "uniform")


def multiquery_ar(num_examples, vocab_size=8192, seq_len=64, num_kv_pairs=4, power_a=0.01,
                  fillers="zeros", seed=0):
    """MQAR examples in the official layout (Procedure 1, appendix E).

    Each row: `k1 v1 k2 v2 ... kD vD` at positions 0..2D-1, keys distinct from [1, c/2),
    values distinct from [c/2, c). After the context there are space = (N - 2D) // 2 query
    slots, slot g at position 2D + 2g. Key i is queried exactly once, at slot g_i, the D
    slots drawn without replacement with P(g) ∝ α(g+1)^(α-1), key 1 drawn first (as
    `np.random.choice(..., replace=False, p=p)` does in the official code). The label at a
    query position is the value paired with that key (the model predicts it as the next
    token); every other label is -100. The other positions hold, by `fillers`:
      "zeros"    the token 0 (Figure 2's runs: the official `random_non_queries=False`);
      "random"   random tokens from [0, c) that never equal a key of the example (ours);
      "uniform"  random tokens uniform over [0, c), keys of the example included: the
                 official `random_non_queries=True` (zoology/data/multiquery_ar.py, the
                 default of its MQARConfig and of the "MQAR (Standard)" recipe).
    "uniform" can put a second, unlabelled copy of a key after its pair, so that a model
    that recalls the latest occurrence of a key reads the filler after it (a reported bug
    of the official data); "random" skips the example's keys (they may still equal its
    values, which is harmless: recall is keyed on keys). A copy never precedes the context,
    so a key's first occurrence is always its place in the context (query_key_positions).

    Returns (inputs, labels): int64 tensors of shape (num_examples, seq_len).
    """
    _check_mqar_args(num_examples, vocab_size, seq_len, num_kv_pairs, power_a, seed)
    if fillers not in FILLERS:
        raise ValueError(f"fillers={fillers!r} is not allowed: choose one of "
                         f"{', '.join(FILLERS)}")
    B, N, D, c = num_examples, seq_len, num_kv_pairs, vocab_size
    rng = np.random.default_rng(seed)
    keys = sample_distinct(rng, B, D, 1, c // 2)                            # (B, D)
    values = sample_distinct(rng, B, D, c // 2, c)                          # (B, D)
    space = (N - 2 * D) // 2
    slots = sample_weighted_without_replacement(rng, B, D, power_law_probs(space, power_a))
    query_pos = 2 * D + 2 * slots                                           # (B, D)

    if fillers == "random":
        inputs = _fill_avoiding(rng, (B, N), c, np.sort(keys, axis=1))
    elif fillers == "uniform":
        inputs = rng.integers(0, c, size=(B, N), dtype=np.int64)
    else:
        inputs = np.zeros((B, N), dtype=np.int64)
    inputs[:, 0:2 * D:2] = keys
    inputs[:, 1:2 * D:2] = values
    np.put_along_axis(inputs, query_pos, keys, axis=1)
    labels = np.full((B, N), IGNORE, dtype=np.int64)
    np.put_along_axis(labels, query_pos, values, axis=1)
    return torch.from_numpy(inputs), torch.from_numpy(labels)


def _fill_avoiding(rng, shape, vocab_size, sorted_avoid):
    """Uniform tokens from [0, c) minus the row's `sorted_avoid` (ascending, distinct).

    Draw r uniform in [0, c - k), then step it past each avoided token in ascending order:
    a bijection from [0, c - k) onto the allowed tokens, so the result is uniform on them.
    """
    k = sorted_avoid.shape[1]
    out = rng.integers(0, vocab_size - k, size=shape, dtype=np.int64)
    for j in range(k):
        out += out >= sorted_avoid[:, j:j + 1]
    return out


def multiquery_ar_per_example(num_examples, vocab_size=8192, seq_len=64, num_kv_pairs=4,
                              power_a=0.01, seed=0):
    """The official algorithm one example at a time: the baseline of the lab's
    `python -m experiments --bench=mqar`.

    Same layout and distribution as `multiquery_ar` (filler 0), drawn the way the official
    code draws each row: numpy's legacy `choice(..., replace=False)` per example (here on a
    private `RandomState(seed)`, where the official code uses the global one). Not the same
    random numbers. Slow by design; kept for the benchmark and for distribution tests.
    """
    _check_mqar_args(num_examples, vocab_size, seq_len, num_kv_pairs, power_a, seed)
    B, N, D, c = num_examples, seq_len, num_kv_pairs, vocab_size
    rng = np.random.RandomState(seed)
    space = (N - 2 * D) // 2
    p = power_law_probs(space, power_a)
    inputs = np.zeros((B, N), dtype=np.int64)
    labels = np.full((B, N), IGNORE, dtype=np.int64)
    for b in range(B):
        keys = rng.choice(np.arange(1, c // 2), D, replace=False)
        values = rng.choice(np.arange(c // 2, c), D, replace=False)
        slots = rng.choice(space, D, replace=False, p=p)
        inputs[b, 0:2 * D:2] = keys
        inputs[b, 1:2 * D:2] = values
        inputs[b, 2 * D + 2 * slots] = keys
        labels[b, 2 * D + 2 * slots] = values
    return torch.from_numpy(inputs), torch.from_numpy(labels)


def query_key_positions(inputs, labels):
    """Where each query of MQAR examples is and where its key is: (q, k), two 1-D int64
    tensors with one entry per labelled position, example by example. k is the first
    position holding the query's token (its key in the context: the filler never equals a
    key, and `random_non_queries` tokens avoid the example's keys)."""
    b, q = (labels != IGNORE).nonzero(as_tuple=True)
    k = (inputs[b] == inputs[b, q][:, None]).int().argmax(dim=1)      # the first occurrence
    return q, k

# ----------------------------------------------------------------------------------------
# the older single-query AR task (Section 3), for contrast


def associative_recall(num_examples, vocab_size=40, seq_len=33, seed=0):
    """Single-query associative recall, as in the H3 / Hyena synthetics (Section 3).

    A small vocabulary (≤ 40 in those papers, below the model width), D = (N - 1) // 2
    pairs `k1 v1 ... kD vD` with distinct keys from [1, c/2) and values from [c/2, c)
    (values may repeat), then ONE query: a key of the example drawn uniformly, at the last
    position, labelled with its value. With even N the first position is the filler 0.
    Gated convolutions solve this easily; that is why MQAR was needed.

    Returns (inputs, labels): int64 tensors (num_examples, seq_len), labels -100 except at
    the last position.
    """
    check_int("num_examples", num_examples, 0, "an integer >= 0")
    check_int("seq_len", seq_len, 3, "an integer >= 3")
    D = (seq_len - 1) // 2
    check_int("vocab_size", vocab_size, 2 * D + 2,
               f"an integer >= {2 * D + 2} (seq_len={seq_len} needs {D} distinct keys "
               "below vocab_size/2)")
    check_int("seed", seed, 0, "an integer >= 0")
    B, N, c = num_examples, seq_len, vocab_size
    rng = np.random.default_rng(seed)
    keys = sample_distinct(rng, B, D, 1, c // 2)
    values = rng.integers(c // 2, c, size=(B, D))
    which = rng.integers(0, D, size=(B, 1))
    inputs = np.zeros((B, N), dtype=np.int64)
    start = N - 1 - 2 * D
    inputs[:, start:N - 1:2] = keys
    inputs[:, start + 1:N - 1:2] = values
    inputs[:, -1] = np.take_along_axis(keys, which, axis=1)[:, 0]
    labels = np.full((B, N), IGNORE, dtype=np.int64)
    labels[:, -1] = np.take_along_axis(values, which, axis=1)[:, 0]
    return torch.from_numpy(inputs), torch.from_numpy(labels)


# ----------------------------------------------------------------------------------------
# Section 3.1: the AR hits among the tokens of real text
#
# The paper slices a language model's loss on the Pile by token: an "AR hit" completes a
# bigram that already appeared earlier in the same context, and that bigram is rare in the
# training data (a threshold of 1,250 occurrences in the paper, whose models saw 10B tokens
# of the Pile; scaled_threshold scales it to a smaller corpus, our reading), so that mostly
# recall from the context can predict it; every other token is "other". The corpus, its
# tokens and the language models are the lab's (experiments/lm.py).

PAPER_THRESHOLD, PAPER_TRAIN_TOKENS = 1250, 10_000_000_000


def bigram_counts(stream, vocab_size):
    """Counts of the bigrams (a, b) of a token stream, as (sorted ids a·c + b, counts)."""
    stream = np.asarray(stream, dtype=np.int64)
    return np.unique(stream[:-1] * vocab_size + stream[1:], return_counts=True)


def scaled_threshold(num_train_tokens):
    """The paper's 1,250 occurrences at 10B training tokens, scaled to this training set
    (at least 1)."""
    return max(1, round(PAPER_THRESHOLD * num_train_tokens / PAPER_TRAIN_TOKENS))


def ar_hits(contexts, train_bigrams, vocab_size, threshold):
    """(B, T) bool: token t of a context is an AR hit if the bigram (x[t-1], x[t]) also ends
    at some earlier position of the same context, and occurs at most `threshold` times in
    the training bigrams (bigram_counts of the training stream). Position 0 never is."""
    x = np.asarray(contexts, dtype=np.int64)
    check_int("threshold", threshold, 0, "an integer >= 0")
    ids = x[:, :-1] * vocab_size + x[:, 1:]                            # ends at t = 1..T-1
    order = np.argsort(ids, axis=1, kind="stable")     # equal ids keep their order in time
    ranked = np.take_along_axis(ids, order, 1)
    again = np.zeros_like(ids, dtype=bool)
    again[:, 1:] = ranked[:, 1:] == ranked[:, :-1]          # not the first of its bigram
    seen = np.zeros_like(again)
    np.put_along_axis(seen, order, again, axis=1)
    known, counts = train_bigrams
    where = np.searchsorted(known, ids).clip(max=max(len(known) - 1, 0))
    in_train = np.where(known[where] == ids, counts[where], 0) if len(known) else 0 * ids
    hits = np.zeros(x.shape, dtype=bool)
    hits[:, 1:] = seen & (in_train <= threshold)
    return hits


def ar_gap_share(nll_reference, nll_model, hits):
    """Section 3.1's attribution of a perplexity gap to the AR hits:
    Δlog(ppl_AR)·|T_AR| / (Δlog(ppl)·|T|), Δ = model minus reference (log ppl is the mean
    NLL, so this is the AR hits' share of the summed NLL difference). nll_*: per-token NLL
    (natural log) of the same tokens; hits: bool, the same shape. nan where the two models'
    summed NLL is equal: there is no gap to share."""
    delta = np.asarray(nll_model, dtype=np.float64) - np.asarray(nll_reference, np.float64)
    total = delta.sum()
    return float(delta[np.asarray(hits)].sum() / total) if total != 0 else float("nan")


def sliced_perplexity(nll, hits):
    """Perplexity overall, on the AR hits and on the other tokens: exp of the mean NLL of
    each set (nan for an empty set), and the number of tokens in each."""
    nll, hits = np.asarray(nll, dtype=np.float64), np.asarray(hits, dtype=bool)
    ppl = lambda values: float(np.exp(values.mean())) if values.size else float("nan")
    return dict(ppl=ppl(nll), ppl_ar=ppl(nll[hits]), ppl_other=ppl(nll[~hits]),
                tokens=int(nll.size), ar_tokens=int(hits.sum()))


# ----------------------------------------------------------------------------------------
# printing

def format_example(inputs, labels):
    """One example as three aligned rows: position, input token, label ('.' when ignored)."""
    rows = [("pos", "input", "label")]
    for t, (x, y) in enumerate(zip(inputs.tolist(), labels.tolist())):
        rows.append((str(t), str(x), "." if y == IGNORE else str(y)))
    width = max(len(cell) for row in rows for cell in row) + 1
    return "\n".join("".join(cell.rjust(width) for cell in col) for col in zip(*rows))


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    x, y = multiquery_ar(1, vocab_size=8192, seq_len=24, num_kv_pairs=4, seed=0)
    print("multiquery_ar(1, vocab_size=8192, seq_len=24, num_kv_pairs=4): "
          "keys, values, then each key queried once; its label is its value\n")
    print(format_example(x[0], y[0]))
