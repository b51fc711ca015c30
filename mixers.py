"""Sequence mixers for Zoology (Arora et al., 2023), each runnable in parallel and token by token.

The mixers of Figure 2 and Figure 6 (appendix H.2 defines the gated convolutions):
  attention          softmax(QKᵀ/√d_h + causal mask) V, multi-head, output projection
                     (Vaswani et al., 2017; the baseline of Figure 2).
  sliding_window     attention restricted to the last `window` tokens (appendix F.1,
                     Figure 6).
  blocked_attention  attention restricted to the token's own block of block_size tokens
                     (Figure 6).
  short_conv         depthwise causal convolution with a short filter (K = 3).
  long_conv          causal convolution with a filter as long as the sequence, explicit or
                     implicit (Table 1's "long conv"; Fu et al., 2023b).
  base_conv          y = (u·W + b1) ⊙ (h ∗ u + b2) (Section 4), and the form of the
                     official code, y = conv(u) ⊙ (u·W + b) + u.
  hyena              Algorithm 3 of appendix H.2.1: z^ℓ = p^ℓ ⊙ (h^ℓ ∗ z^{ℓ-1})
                     (Poli et al., 2023), and the official order-2 operator.
  h3                 q ⊙ SSM_diag(SSM_shift(k) ⊙ v) (Fu et al., 2023a; its diagonal SSM is
                     S4D, Gu et al., 2022).
and the recurrences, linear attention and hybrids the paper studies or names:
  rwkv               RWKV-4 time mixing (Peng et al., 2023): wkv by a running-max recurrence
                     (reference) or by chunks merged in log space (fast).
  retnet             multi-scale retention (Sun et al., 2023): recurrent (reference),
                     chunkwise (fast) and parallel forms of one function.
  based              Based linear attention (Arora et al., 2024), 2nd-order Taylor feature
                     map: recurrent (reference), chunked (fast) and quadratic forms.
  mamba              the selective SSM (Gu & Dao, 2023): sequential scan (reference) and a
                     chunked scan (fast).
  selective_attention  Section 5: attention whose output row i is kept only where
                     f(u)[i] = 1, f programmatic, learned or random.
  input_dependent_conv  BaseConv with filters chosen from the input (Thm 4.5, Figure 2's
                     lower rows): shifts at the distances where a token repeats, or at the
                     top autocorrelation lags.
and the recall mixers since, each with a recurrent reference and a chunked fast form:
  gla                gated linear attention (Yang et al., 2024): a decay per key channel.
  mamba2             Mamba-2's SSD (Dao & Gu, 2024): a scalar decay per head.
  deltanet           the delta rule (Schlag et al., 2021; Yang et al., 2024): each step
                     corrects what the state recalls for its key.
  gated_deltanet     the delta rule with Mamba-2's decay (Yang et al., 2025).
  rwkv7              RWKV-7 (Peng et al., 2025): a diagonal decay plus a low-rank removal.

Two forms, where the paper and the code behind its figures differ. Where the paper's text
(or the mixer's own paper) defines the operator, that form is the class in MIXERS, and it
reads straight through. Where the official code (HazyResearch/zoology, read at commit
d88d6f5) trained something else for a figure, a class of its own computes that, in the lab:
experiments/official.py (OfficialBaseConv, OfficialHyena, OfficialH3, OfficialRWKV,
OfficialSelectiveAttention), each docstring naming the file and each difference. The mixer
option form=official (build_mixer(name, d_model, seq_len, form="official")) loads the one
OFFICIAL_FORMS names, as a mixer of your own is loaded; `python -m experiments
--preset=figure2` assembles the forms Figure 2 used. Under each paper form's heading, one
line says what to copy to use it elsewhere.

The interface every mixer follows (`MIXERS[name](d_model, seq_len, **options)`, and the
official forms alike):
  forward(x)          x (B, T, d) -> y (B, T, d), causal: y[:, t] depends on x[:, :t+1] only.
  step(x_t, state)    x_t (B, d); state=None starts a sequence; returns (y_t, new_state)
                      with y_t == forward(x)[:, t]. The state holds tensors whose leading
                      dimension is B: a tuple of them in the mixers here; in a mixer of your
                      own a tensor, or tuples, lists and dicts of them, nested.
  state_size(t)       numbers per sequence that the state holds after t tokens (0 for t=0):
                      the paper's "recall vs memory" axis.
One rule for every mixer: state_size counts everything `step` carries to the next token,
the recurrent matrix and the buffers of its short convolutions and token shifts alike
(test_all checks it against the real state of every mixer). States are as small as each
mixer allows: a window of `window` tokens keeps the window-1 before the next token, a filter
of K taps the last K-1 inputs, an SSM its d_state numbers per channel. A complex SSM state is stored
as pairs of reals (torch.view_as_real), so the count is in real numbers. The official code
counts otherwise from mixer to mixer (zoology/mixers at commit d88d6f5): its GLA adds its
short convolutions' state, its DeltaNet and Gated DeltaNet leave theirs out, its Mamba-2
counts 2·d_model·d_state (the recurrent state at expand 2, no convolution); so its points
on Figure 2's state axis are not all measured alike.

The mixer contract, the interface above as checks, is one function, check_mixer: (B, T, d)
in and out in float32 and float64, causal at every position and the rows of a batch
independent (in eval and in train mode), a gradient for every parameter, step == forward,
state_size == the numbers step carries, deterministic in eval mode, and forward and step on
PyTorch's meta device (what it does not check, its docstring says). test_all.py runs it on
every mixer here; `python mixers.py --check path/to/file.py:Class` runs it on a mixer of
your own: any nn.Module built as Class(d_model, seq_len, **options), named by its path
wherever a mixer is named ("my/gla.py:GLA", "mypackage.gla:GLA", options after it:
split_mixer's grammar), its step and state_size optional, the facts of Mixer's docstring
Mixer's where it does not say.

The math lives in pure functions on tensors (`causal_conv(u, h, impl, state)`,
`hyena_operator(ps, v, hs, impl, state)`, `retention_recurrent(q, k, v, gamma, state)`, ...);
an nn.Module only holds parameters and calls them. A computation with several forms keeps
them in one dict (the `*_IMPLS` dicts, e.g. CONV_IMPLS): the forms of one computation take
the same arguments, a module's `impl` option names one, and the tests assert they agree.
Forms of a recurrence take the state before their first position (state=None: the start)
and return (y, the state after their last), as flash-linear-attention's naive kernels do
(initial_state, output_final_state). So `step` is a recurrence run on one token: the
reference form of RetNet, Based and Mamba, RWKV's wkv_step (the one step its reference
loops over), causal_conv with its state in the convolutions.

Glossary (code name -> paper symbol). One meaning per letter in the whole project: N the
sequence length, D the number of key-value pairs, d the model width. Inside a layer the
sequence length is T (time; T = N). What the SSM papers call N, B, D and h is d_state, Bm,
skip and S here.
  B batch, T sequence length, d model width, H heads, hs = d // H head size (d_h),
  c vocabulary size, t a position (time) or a number of tokens, ch a channel,
  K filter length (taps), h filter (d, K) with h[:, s] the weight of lag s,
  W BaseConv's projection and b1, b2 its biases (Section 4; W_o, W_q, ... other layers'),
  p^ℓ, v, z^ℓ Hyena's gates, value and iterates, ℓ = 1..order (Algorithm 3);
  an SSM has A, Bm, C, Δ (dt), d_state numbers of state per channel and state S;
  w, u RWKV's per-channel decay (w > 0) and bonus; gamma RetNet's decay γ, per head;
  d' (feature_dim) Based's feature dimension; d_inner Mamba's inner width; skip Mamba's
  and H3's skip vector (their papers' D); f selective attention's row selection;
  S the state of a linear recurrence, Λ the running sum of its log decay in a chunk.
Spelled out rather than lettered: window (sliding window), block_size, order (Hyena's,
Algorithm 3's number of gated convolutions), chunk_size (a chunked form's; chunk in a
form, `chunks` of them), H3's modes, top_k (a selection's budget), features (the size of
Based's compact φ). F is torch.nn.functional; L, as in train.py and theory.py, the number
of layers.
"""
import argparse
import difflib
import hashlib
import importlib
import inspect
import math
import sys
import traceback
import types
from collections import namedtuple
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


# ----------------------------------------------------------------------------------------
# argument checks shared by the mixers

def check_choice(name, value, allowed):
    """Raise a ValueError naming `name` unless `value` is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be one of "
                         f"{', '.join(repr(a) for a in allowed)}")


def check_divides(name, value, d_model):
    """Raise a ValueError unless `value` is a positive int dividing d_model."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or d_model % value:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be a positive "
                         f"integer that divides d_model={d_model}")


def check_positive(name, value, allowed="an integer >= 1"):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be {allowed}")


class Mixer(nn.Module):
    """What every mixer of MIXERS is: the interface of this module's docstring (forward,
    step, state_size), plus facts that a model reads from the class rather than from lists
    of names, each False/None unless a mixer says otherwise:
      uses_positions    a model's position_embedding="auto" gives it learned position
                        embeddings (attention's family: a set of keys under its mask);
      takes_tokens      forward(x, tokens) and step(x_t, state, token) need the token ids;
      keeps_own_init    a model's default initialisation (init="normal") leaves its
                        parameters as it drew them (any submodule may say so too: the
                        implicit filters do); the official init="gpt2" redraws them, as
                        the official code does, except with the Mamba block (there only
                        biases and out_proj, its Mamba branch);
      rescale_out_proj  the official GPT-2 initialisation rescales its `out_proj` (False
                        where the official layer has another name for it);
      aux_loss          set by forward: the weighted auxiliary loss that training adds to
                        the objective (Section 5's learned selection), else None.
    """

    uses_positions = takes_tokens = keeps_own_init = False
    rescale_out_proj = True
    aux_loss = None


def mixer_fact(mixer, fact):
    """A fact of Mixer's docstring (uses_positions, takes_tokens, ...) read from a mixer or its
    class: Mixer's default where the class does not say, as a mixer of your own (any
    nn.Module, load_outside) need not."""
    return getattr(mixer, fact, getattr(Mixer, fact))


def state_leaves(state):
    """What a state holds, flattened: a state is a tensor, or tuples, lists and dicts of them,
    nested (a user writes any; the mixers here keep tuples)."""
    if isinstance(state, dict):
        state = list(state.values())
    if isinstance(state, (tuple, list)):
        return [leaf for part in state for leaf in state_leaves(part)]
    return [state]


def state_numel(state):
    """Numbers per sequence in a state (state_leaves: tensors with batch as dimension 0)."""
    return sum(s[0].numel() for s in state_leaves(state))


# ----------------------------------------------------------------------------------------
# attention and its masks (Figure 2's baseline; the window and blocks of Figure 6, appendix F.1)

def causal_mask(T, device=None):
    """(T, T) bool, True where query i may attend to key j: j <= i."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def sliding_window_mask(T, window, device=None):
    """(T, T) bool: i - window < j <= i, the last `window` tokens including i itself."""
    i = torch.arange(T, device=device)
    return causal_mask(T, device) & (i[None, :] > i[:, None] - window)


def block_mask(T, block_size, device=None):
    """(T, T) bool: j <= i within the same block of block_size tokens."""
    block = torch.arange(T, device=device) // block_size
    return causal_mask(T, device) & (block[:, None] == block[None, :])


def attention_reference(q, k, v, dropout=0.0, mask=None):
    """Masked softmax attention, written out: softmax(q kᵀ/√hs, -inf off the mask) v.

    q, k, v: (B, H, T, hs); dropout: the probability of dropping an attention weight
    (training only: pass 0 at inference); mask: (T, T) bool, True where query i may attend
    to key j (None: the causal mask; the windowed references pass theirs). Materializes
    the (B, H, T, T) score matrix.
    """
    T, hs = q.shape[-2], q.shape[-1]
    if mask is None:
        mask = causal_mask(T, q.device)
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(hs)         # (B, H, T, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.dropout(scores.softmax(dim=-1), dropout) if dropout else scores.softmax(-1)
    return torch.einsum("bhij,bhjd->bhid", weights, v)                      # (B, H, T, hs)


def attention_fast(q, k, v, dropout=0.0):
    """The same function through PyTorch's fused kernel (flash / memory-efficient on GPU)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)


def sliding_window_reference(q, k, v, window, dropout=0.0):
    """Attention under sliding_window_mask: materializes (B, H, T, T), T·window of them used."""
    mask = sliding_window_mask(q.shape[2], window, q.device)
    return attention_reference(q, k, v, dropout, mask)


def sliding_window_fast(q, k, v, window, dropout=0.0):
    """Each block of `window` queries attends to its own block and the one before (2·window
    keys), masked to i - window < j <= i: B·H·T·2·window scores, time and memory linear in T.
    Block 0 has no block before it: it is causal attention on its own `window` tokens.

    The key blocks are windows of k and v (unfold, a view: no copy), and T is padded to a
    multiple of `window` only when it is not one (the padded queries are dropped; real queries
    never see padded keys), so that beyond the scores the layer pays for one copy of the
    output (the concatenation of block 0 and the rest).
    """
    B, H, T, hs = q.shape
    if window >= T:                             # one window holds the whole sequence
        return attention_fast(q, k, v, dropout)
    if T % window:
        q, k, v = (F.pad(t, (0, 0, 0, -T % window)) for t in (q, k, v))
    blocks = q.shape[2] // window
    first = F.scaled_dot_product_attention(q[:, :, :window], k[:, :, :window],
                                           v[:, :, :window], is_causal=True, dropout_p=dropout)
    # query r of block m >= 1 is token i = m·window + r, key s of its window j = (m-1)·window + s
    r = torch.arange(window, device=q.device)[:, None]
    s = torch.arange(2 * window, device=q.device)
    mask = ((s > r) & (s <= r + window))[None, None]          # (1, 1, window, 2·window)
    q = q[:, :, window:].reshape(B * H, blocks - 1, window, hs)
    k, v = (t.reshape(B * H, blocks * window, hs).unfold(1, 2 * window, window).transpose(2, 3)
            for t in (k, v))                          # (B·H, blocks-1, 2·window, hs), views
    # a 4-d mask (the fused CPU kernel takes no other), broadcast over the blocks
    rest = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    y = torch.cat([first, rest.reshape(B, H, (blocks - 1) * window, hs)], dim=2)
    return y[:, :, :T]                                                       # (B, H, T, hs)


def blocked_attention_reference(q, k, v, block_size, dropout=0.0):
    """Attention under block_mask: materializes (B, H, T, T), T·block_size of them used."""
    mask = block_mask(q.shape[2], block_size, q.device)
    return attention_reference(q, k, v, dropout, mask)


def blocked_attention_fast(q, k, v, block_size, dropout=0.0):
    """Causal attention within reshaped blocks (B·H, T/block_size, block_size, hs):
    B·H·T·block_size scores, time and memory linear in T. T is padded to a multiple of
    block_size only when it is not one (the padded queries are dropped)."""
    B, H, T, hs = q.shape
    if block_size >= T:                         # one block holds the whole sequence
        return attention_fast(q, k, v, dropout)
    if T % block_size:
        q, k, v = (F.pad(t, (0, 0, 0, -T % block_size)) for t in (q, k, v))
    q, k, v = (t.reshape(B * H, -1, block_size, hs) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
    return y.reshape(B, H, -1, hs)[:, :, :T]                                # (B, H, T, hs)


# every form of one computation takes the same arguments; a module picks one by `impl`
ATTENTION_IMPLS = {"fast": attention_fast, "reference": attention_reference}
SLIDING_WINDOW_IMPLS = {"fast": sliding_window_fast, "reference": sliding_window_reference}
BLOCKED_ATTENTION_IMPLS = {"fast": blocked_attention_fast,
                           "reference": blocked_attention_reference}


def rotary(x, positions, base=10000.0):
    """Rotary position embedding (Su et al., 2021) of x (..., T, hs) at `positions` (T,):
    channel i of the first half and i of the second, a pair, turned by the angle
    t·base^(-2i/hs) at position t (the Llama / GPT-NeoX layout), so that q·k after it depends
    on the positions only through their difference. The angles are computed in x's
    precision, float32 at least (an Apple GPU has no float64; Hugging Face's Llama computes
    them in float32 too): over T positions, float32's turns are float64's to T·2⁻²³ radians
    (5e-4 at T = 4096; test_all.py)."""
    hs = x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    freqs = base ** (-2 * torch.arange(hs // 2, dtype=dtype, device=x.device) / hs)
    angles = positions.to(dtype)[:, None] * freqs                           # (T, hs/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :hs // 2], x[..., hs // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(Mixer):
    """Multi-head causal self-attention with an output projection.

    dropout: the probability of dropping an attention weight in training; the official
    Figure 2 configs use 0.1 (and 1 head), the default is 0. In eval mode no weight is
    dropped, so there `forward` and `step` compute one function.
    rotary: turn q and k by their positions (rotary: the Llama recipe's positions, which
    the paper's language-model attention used), instead of leaving positions to the model's
    learned embedding (the Figure 2 configs). Full attention only.
    short_conv=K: first x = x + ShortConv_K(x), a depthwise causal convolution of K taps
    (the locality prior that every gated convolution of the paper has and attention lacks;
    the control of the language-model experiment). Full attention only.
    The state of `step` is the KV cache: 2·t·d numbers after t tokens (and with short_conv
    the last K - 1 inputs).
    Subclasses narrow what a token sees by overriding `impls`, `form_args` and `cache_len`.
    To copy: this class, ATTENTION_IMPLS (attention_fast, attention_reference), causal_mask,
    rotary, Mixer, check_choice, check_divides, check_positive and, for the short convolution
    option, ShortConv with Convolution, ExplicitFilter and causal_conv with CONV_IMPLS
    (causal_conv_direct, causal_conv_fft, causal_conv_fast, SHORT_FILTER).
    """

    uses_positions = True               # a set of keys under a mask: no order of its own
    impls = ATTENTION_IMPLS             # the forms of this class's computation, by `impl`

    def __init__(self, d_model, seq_len, num_heads=1, dropout=0.0, impl="fast", bias=True,
                 rotary=False, short_conv=0):
        super().__init__()
        check_divides("num_heads", num_heads, d_model)
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout={dropout!r} is not allowed: dropout must be in [0, 1)")
        check_choice("impl", impl, tuple(self.impls))
        if rotary and (d_model // num_heads) % 2:
            raise ValueError(f"rotary={rotary!r} is not allowed with a head size of "
                             f"{d_model // num_heads}: rotary turns pairs of channels, so the "
                             "head size d_model / num_heads must be even")
        self.num_heads, self.dropout, self.impl, self.rotary = num_heads, dropout, impl, rotary
        if isinstance(short_conv, bool) or not isinstance(short_conv, int) or short_conv < 0:
            raise ValueError(f"short_conv={short_conv!r} is not allowed: it must be 0 (none) "
                             "or the number of taps, an integer >= 1")
        self.conv = ShortConv(d_model, seq_len, short_conv, impl) if short_conv else None
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    form_args = ()                      # what a subclass's forms take besides q, k, v, dropout

    def attend(self, q, k, v, dropout):
        """(B, H, T, hs) -> (B, H, T, hs) in the form `impl` picks."""
        return self.impls[self.impl](q, k, v, *self.form_args, dropout)

    def cache_len(self, length):
        """How many of the `length` most recent keys/values a later token can still attend to."""
        return length

    def _heads(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        return [t.view(B, T, self.num_heads, d // self.num_heads).transpose(1, 2)
                for t in (q, k, v)]                                          # (B, H, T, hs)

    def forward(self, x):
        B, T, d = x.shape
        if self.conv is not None:
            x = x + self.conv(x)
        q, k, v = self._heads(x)
        if self.rotary:
            positions = torch.arange(T, device=x.device)
            q, k = rotary(q, positions), rotary(k, positions)
        dropout = self.dropout if self.training else 0.0
        y = self.attend(q, k, v, dropout)                                    # (B, H, T, hs)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, d))

    def step(self, x_t, state=None):
        B, d = x_t.shape
        if self.conv is not None:
            conv_t, (past,) = self.conv.step(x_t, None if state is None else state[2:])
            x_t = x_t + conv_t
        q, k, v = self._heads(x_t[:, None])                                  # (B, H, 1, hs)
        if self.rotary:                          # this token's position: the keys cached
            t = torch.tensor([0 if state is None else state[0].shape[2]], device=x_t.device)
            q, k = rotary(q, t), rotary(k, t)
        if state is not None:
            k = torch.cat([state[0], k], dim=2)                     # (B, H, cached + 1, hs)
            v = torch.cat([state[1], v], dim=2)
        # the cache holds only keys the newest query may see: no mask needed
        scores = torch.einsum("bhd,bhjd->bhj", q[:, :, 0], k) / math.sqrt(d // self.num_heads)
        y = torch.einsum("bhj,bhjd->bhd", scores.softmax(dim=-1), v)        # (B, H, hs)
        keep = k.shape[2] - self.cache_len(k.shape[2])
        state = (k[:, :, keep:], v[:, :, keep:])
        return self.out_proj(y.reshape(B, d)), state + ((past,) if self.conv else ())

    def state_size(self, t):
        conv = self.conv.state_size(t) if self.conv is not None else 0
        return 2 * self.cache_len(t) * self.out_proj.in_features + conv


class SlidingWindowAttention(Attention):
    """Token i attends to the last `window` tokens, i-window+1..i (appendix F.1, Figure 6).

    Convention: the window counts the token itself. The official code (Zoology's
    sliding-window mixer) attends to window+1 tokens, i-window..i, so its window is our
    window+1. A window >= T is exactly causal attention (the fast form then calls
    attention_fast). `step` keeps the window-1 most recent keys and values, all a later
    token can see: state 2·min(t, window-1)·d numbers, constant in t once t >= window-1.
    To copy: this class, SLIDING_WINDOW_IMPLS (sliding_window_fast, sliding_window_reference),
    sliding_window_mask and Attention with what its line names.
    """

    impls = SLIDING_WINDOW_IMPLS

    def __init__(self, d_model, seq_len, window=32, num_heads=1, dropout=0.0, impl="fast",
                 bias=True):
        check_positive("window", window)
        super().__init__(d_model, seq_len, num_heads, dropout, impl, bias)
        self.window, self.form_args = window, (window,)

    def cache_len(self, length):
        return min(length, self.window - 1)


class BlockedAttention(Attention):
    """Token i attends causally within its own block of block_size tokens,
    [block_size·⌊i/block_size⌋, i] (Figure 6).

    `step` keeps the keys and values of the current block only: after t tokens that is
    t mod block_size of them (state 2·(t mod block_size)·d numbers; empty right after a block
    fills up, since the next token opens a new block).
    To copy: this class, BLOCKED_ATTENTION_IMPLS (blocked_attention_fast,
    blocked_attention_reference), block_mask and Attention with what its line names.
    """

    impls = BLOCKED_ATTENTION_IMPLS

    def __init__(self, d_model, seq_len, block_size=32, num_heads=1, dropout=0.0, impl="fast",
                 bias=True):
        check_positive("block_size", block_size)
        super().__init__(d_model, seq_len, num_heads, dropout, impl, bias)
        self.block_size, self.form_args = block_size, (block_size,)

    def cache_len(self, length):
        return length % self.block_size


# ----------------------------------------------------------------------------------------
# causal convolution: the one operator every convolving mixer shares (appendix H.1's u ∗ h)

SHORT_FILTER = 16  # the fast form convolves directly up to this many taps, by FFT beyond


def causal_conv_direct(u, h):
    """y[:, t, ch] = Σ_{s=0}^{min(t, K-1)} h[ch, s] · u[:, t-s, ch], as a loop over lags s.

    u: (B, T, d), h: (d, K) with any K (taps past T never reach an output).
    Costs O(B·T·d·K) time and O(B·T·d) memory: it never materializes a (T, T) matrix.
    The reference form for every K, and the fast form for K <= SHORT_FILTER (the benchmark
    section of experiments/README.md says why).
    """
    B, T, d = u.shape
    # row s of `taps` is every channel's lag-s weight; a contiguous row rather than the
    # strided column h[:, s] makes each step several times faster
    taps = h[:, :T].T.contiguous()                                          # (K, d)
    y = torch.zeros_like(u)
    for s, h_s in enumerate(taps):
        y[:, s:] += h_s * u[:, :T - s]                                      # (B, T-s, d)
    return y


def causal_conv_fft(u, h):
    """The same sum by FFT, O(B·d·T log T), the fast form for long filters.

    FFT multiplication is a cyclic convolution; zero-padding both signals to 2T makes it
    the linear one, u ∗ h = iFFT(FFT(u)·FFT(h)), and we keep the first T outputs (without
    the padding the same formula gives the cyclic convolution u ⊛ h: test_all.py shows it).
    Computed and returned in float32 or wider, under autocast too (as CPU autocast does).
    """
    B, T, d = u.shape
    padded = 2 * T
    # cuFFT has no bfloat16 transform (torch.fft's docs: half only, at powers of two), and
    # CUDA autocast, unlike the CPU's, casts nothing for torch.fft
    # (torch._C._dispatch_dump("aten::fft_rfft") lists AutocastCPU only)
    dtype = torch.promote_types(torch.promote_types(u.dtype, h.dtype), torch.float32)
    u_f = torch.fft.rfft(u.transpose(1, 2).to(dtype), n=padded)             # (B, d, T+1)
    h_f = torch.fft.rfft(h[:, :T].to(dtype), n=padded)                      # (d, T+1)
    return torch.fft.irfft(u_f * h_f, n=padded)[..., :T].transpose(1, 2)    # (B, T, d)


def causal_conv_fast(u, h):
    """The direct sum for K <= SHORT_FILTER taps, the FFT beyond: whichever measured faster."""
    return (causal_conv_direct if h.shape[1] <= SHORT_FILTER else causal_conv_fft)(u, h)


CONV_IMPLS = {"fast": causal_conv_fast, "reference": causal_conv_direct}


def causal_conv(u, h, impl="fast", state=None):
    """Depthwise causal convolution y = h ∗ u of u (B, T, d) with h (d, K), any K.

    state: the inputs before u, (B, P, d) oldest first (None: the sequence starts here).
    Returns y (B, T, d) and the state after u: its last min(P+T, K-1) inputs, all that a
    later output can still reach.
    impl="reference" is the direct sum over lags; "fast" is the same sum for
    K <= SHORT_FILTER and the FFT for longer filters (CONV_IMPLS). One token at a time,
    u (B, 1, d), is the step: one output, the sum over its window in one product, O(K)
    rather than a convolution of the whole history.
    """
    check_choice("impl", impl, tuple(CONV_IMPLS))
    P = 0 if state is None else state.shape[1]
    if P:
        u = torch.cat([state, u], dim=1)                                    # (B, P+T, d)
    if u.shape[1] - P == 1:                         # y_t = Σ_s h[:, s] u_{t-s}
        window = u[:, -h.shape[1]:].flip(1)                                  # u_t, u_{t-1}, ...
        y = torch.einsum("bsd,ds->bd", window, h[:, :window.shape[1]])[:, None]
    else:
        y = CONV_IMPLS[impl](u, h)[:, P:]
    return y, u[:, max(0, u.shape[1] - (h.shape[1] - 1)):]


# ----------------------------------------------------------------------------------------
# filters: explicit (one parameter per tap) and implicit (an MLP over positions)

def positional_features(length, frequencies, dtype=None, device=None):
    """(length, 1 + 2·len(frequencies)): at tap s, [t, cos(ν·ω_s), -sin(ν·ω_s)] for each
    frequency ν, the real and imaginary parts of exp(-i ν ω_s), ω_s = 2πs/length;
    t = s/(length - 1) in [0, 1].

    The input of an implicit filter's MLP (Hyena, Poli et al., 2023, §3.3: "a truncated
    complex exponential basis"). Features depend on the filter length, not on the input's T.
    """
    lag = torch.arange(length, dtype=dtype, device=device)
    t = lag / max(length - 1, 1)
    angle = lag[:, None] * 2 * math.pi / length * torch.as_tensor(frequencies, dtype=dtype,
                                                                  device=device)
    return torch.cat([t[:, None], angle.cos(), -angle.sin()], dim=-1)


# The official code's features (zoology/mixers/hyena.py and convolution.py, PositionalEmbedding
# with emb_dim=3): one band, at frequency linspace(1e-4, bands - 1, bands) = 1e-4. So its MLPs
# see t and two near-constants (cos ≈ 1, -sin ≈ -0.0006·s/length at tap s): in effect t alone.
OFFICIAL_FREQUENCIES = (1e-4,)


def exponential_decay(length, channels, fast=0.3, slow=1.5, target=1e-2, dtype=None,
                      device=None):
    """(channels, length) window exp(-α_ch t) of channel ch, t = s / (length - 1) at tap s
    (Hyena's modulation).

    Rates α_ch spread linearly from one that reaches `target` at t = `slow` (past the end)
    to one that reaches it at t = `fast`: the official ExponentialModulation's defaults.
    """
    t = torch.arange(length, dtype=dtype, device=device) / max(length - 1, 1)
    rate = torch.linspace(math.log(1 / target) / slow, math.log(1 / target) / fast,
                          channels, dtype=dtype, device=device)
    return torch.exp(-rate[:, None] * t)


class ExplicitFilter(nn.Module):
    """A filter stored as it is: h (channels, length), one parameter per tap.

    Taps start as N(0, 1/length), so that h ∗ u has about the variance of u.
    """

    def __init__(self, channels, length):
        super().__init__()
        self.h = nn.Parameter(torch.randn(channels, length) / math.sqrt(length))

    def forward(self):
        return self.h                                                        # (channels, K)


class ImplicitFilter(nn.Module):
    """h[ch, s] = MLP(z_s)[ch] · exp(-α_ch t_s): Hyena's implicit filter (Poli et al. 2023,
    §3.3).

    An MLP with sine activations maps the positional features z_s (positional_features, at
    frequencies 1..4) to one value per channel: hidden width 32, one inner layer, sin(x);
    an exponential decay window (exponential_decay) fades it. Parameters do not grow with
    the length. The official code's filter is experiments/official.py's OfficialImplicitFilter.
    `keeps_own_init`: a model's default initialisation leaves the MLP as PyTorch draws it,
    so that the filter starts non-trivial (the official init re-draws it at N(0, 0.02)).
    """

    keeps_own_init = True

    def __init__(self, channels, length, hidden=32, inner=1, frequencies=(1.0, 2.0, 3.0, 4.0)):
        super().__init__()
        # z (K, 1 + 2·len(frequencies)): each tap's positional features
        self.register_buffer("z", positional_features(length, frequencies))
        self.layers = nn.ModuleList([nn.Linear(self.z.shape[1], hidden)] +
                                    [nn.Linear(hidden, hidden) for _ in range(inner)])
        self.out = nn.Linear(hidden, channels, bias=False)
        self.register_buffer("decay", exponential_decay(length, channels))  # (channels, K)

    def activation(self, a):
        return torch.sin(a)

    def forward(self):
        a = self.z
        for layer in self.layers:
            a = self.activation(layer(a))                                   # (K, hidden)
        return self.out(a).T * self.decay                                    # (channels, K)


class MLPFilter(nn.Module):
    """h[ch, s] = MLP(z_s)[ch], a ReLU MLP over the official positional features, no decay:
    Zoology's ImplicitLongConvolution (zoology/mixers/convolution.py, d_emb=3, d_hidden=16),
    the long filter of the official BaseConv that Figure 2 trained. Nothing fades its far
    taps, unlike ImplicitFilter's decay window; its features are fixed.
    """

    keeps_own_init = True

    def __init__(self, channels, length, hidden=16):
        super().__init__()
        self.register_buffer("z", positional_features(length, OFFICIAL_FREQUENCIES))
        self.fc1 = nn.Linear(self.z.shape[1], hidden)
        self.fc2 = nn.Linear(hidden, channels)

    def forward(self):
        return self.fc2(F.relu(self.fc1(self.z))).T                          # (channels, K)


FILTERS = {"explicit": ExplicitFilter, "implicit": ImplicitFilter, "mlp": MLPFilter}


# ----------------------------------------------------------------------------------------
# short and long convolutions (appendix H.2)

class Convolution(Mixer):
    """y = h ∗ u per channel, no projections: the shared body of ShortConv and LongConv.

    `step` keeps the last K-1 inputs: state min(t, K-1)·d numbers after t tokens.
    """

    def __init__(self, filter, kernel_size, impl):
        super().__init__()
        check_choice("impl", impl, tuple(CONV_IMPLS))
        self.impl, self.kernel_size, self.filter = impl, kernel_size, filter

    def forward(self, x):
        return causal_conv(x, self.filter(), self.impl)[0]                   # (B, T, d)

    def step(self, x_t, state=None):
        y, past = causal_conv(x_t[:, None], self.filter(), self.impl,
                              None if state is None else state[0])
        return y[:, 0], (past,)

    def state_size(self, t):
        return min(t, self.kernel_size - 1) * self.filter().shape[0]


class ShortConv(Convolution):
    """Depthwise causal convolution with a short explicit filter, K = 3 by default.

    The official ShortConvolution (an nn.Conv1d) also adds a per-channel bias; we do not.
    To copy: this class, Convolution, ExplicitFilter, causal_conv with CONV_IMPLS
    (causal_conv_direct, causal_conv_fft, causal_conv_fast, SHORT_FILTER), Mixer, check_choice
    and check_positive.
    """

    def __init__(self, d_model, seq_len, kernel_size=3, impl="fast"):
        check_positive("kernel_size", kernel_size)
        super().__init__(ExplicitFilter(d_model, kernel_size), kernel_size, impl)


class LongConv(Convolution):
    """Causal convolution with a filter of seq_len taps (Table 1's long conv).

    filter="explicit" (default, Fu et al., 2023b): d·seq_len parameters; "implicit":
    Hyena's MLP-with-decay filter; "mlp": the official BaseConv's ReLU MLP. (The official
    LongConvolution's filter is explicit too, but its fft_conv also adds u.) Inputs longer than
    seq_len are convolved with the filter as it is (zero past seq_len taps).
    `step` keeps the input history, state min(t, seq_len-1)·d = t·d for t < seq_len: a
    generic long filter has no smaller state.
    To copy: this class, Convolution, FILTERS (ExplicitFilter, ImplicitFilter and MLPFilter,
    with positional_features, exponential_decay and OFFICIAL_FREQUENCIES), causal_conv with
    CONV_IMPLS (causal_conv_direct, causal_conv_fft, causal_conv_fast, SHORT_FILTER), Mixer,
    check_choice and check_positive.
    """

    def __init__(self, d_model, seq_len, filter="explicit", impl="fast"):
        check_positive("seq_len", seq_len)
        check_choice("filter", filter, tuple(FILTERS))
        super().__init__(FILTERS[filter](d_model, seq_len), seq_len, impl)


# ----------------------------------------------------------------------------------------
# BaseConv (Section 4; appendix H.2)

def base_conv(u, W, b1, h, b2, impl="fast", state=None):
    """y = (u·W + b1) ⊙ (h ∗ u + b2): the BaseConv layer (Section 4).

    u: (B, T, d), W: (d, d), h: (d, K); b1, b2 broadcast against (T, d): per position
    (T, d) in the paper, per channel (d,) or 0 in the official code. state: the inputs
    before u, as causal_conv's. Returns (y (B, T, d), the state after u).
    """
    conv, state = causal_conv(u, h, impl, state)
    return (u @ W + b1) * (conv + b2), state


def conv1d_init_(*tensors, fan_in):
    """Draw tensors from U(-1/√fan_in, 1/√fan_in): PyTorch's default initialisation of an
    nn.Conv1d's weight and bias (kaiming_uniform_ with a=√5), which the official code keeps
    for its short convolutions."""
    bound = 1 / math.sqrt(fan_in)
    with torch.no_grad():
        for t in tensors:
            t.uniform_(-bound, bound)


class BaseConv(Mixer):
    """BaseConv as the paper defines it (Section 4): y = (u·W + b1) ⊙ (h ∗ u + b2).

    Position-dependent biases b1, b2 (T, d) and no residual: the layer appendix H composes.
    Its biases need the position of each token, so `step` carries it (one number) and
    inputs are limited to seq_len. The filter is explicit, h (d, K), as in the definition.
    kernel_size: None (or seq_len) for a filter as long as the sequence, 3 for a short one.
    `step` keeps the last K-1 inputs and the position: min(t, K-1)·d + 1 numbers.
    To copy: this class, base_conv, ExplicitFilter, causal_conv with CONV_IMPLS
    (causal_conv_direct, causal_conv_fft, causal_conv_fast, SHORT_FILTER), Mixer, check_choice
    and check_positive.
    The layer Figure 2 trained is experiments/official.py's OfficialBaseConv (form="official").
    """

    def __init__(self, d_model, seq_len, kernel_size=None, impl="fast"):
        super().__init__()
        check_positive("seq_len", seq_len)
        if kernel_size is not None:
            check_positive("kernel_size", kernel_size,
                           "an integer >= 1, or None for a filter of seq_len taps")
        check_choice("impl", impl, tuple(CONV_IMPLS))
        self.seq_len, self.impl = seq_len, impl
        self.kernel_size = seq_len if kernel_size is None else kernel_size
        self.proj = nn.Linear(d_model, d_model, bias=False)                  # W
        self.filter = ExplicitFilter(d_model, self.kernel_size)              # h
        self.b1 = nn.Parameter(torch.zeros(seq_len, d_model))
        self.b2 = nn.Parameter(torch.zeros(seq_len, d_model))

    def _check_length(self, T):
        if T > self.seq_len:
            raise ValueError(f"sequence length T={T} is not allowed: BaseConv has one bias "
                             f"row per position, so T must be <= seq_len={self.seq_len}")

    def forward(self, x):
        B, T, d = x.shape
        self._check_length(T)
        return base_conv(x, self.proj.weight.T, self.b1[:T], self.filter(), self.b2[:T],
                         self.impl)[0]

    def step(self, x_t, state=None):
        past, position = (None, x_t.new_zeros(x_t.shape[0], 1, dtype=torch.long)) \
            if state is None else state                                      # position (B, 1)
        # each row's bias rows by indexing with its position, not a Python int, so that step
        # runs on PyTorch's meta device too (the mixer contract's device check), where the
        # position has no value to check against seq_len
        if not position.is_meta:
            self._check_length(int(position.max()) + 1)
        y, past = base_conv(x_t[:, None], self.proj.weight.T, self.b1[position], self.filter(),
                            self.b2[position], self.impl, past)
        return y[:, 0], (past, position + 1)

    def state_size(self, t):
        return min(t, self.kernel_size - 1) * self.proj.in_features + (t > 0)


# ----------------------------------------------------------------------------------------
# Hyena (appendix H.2.1, Algorithm 3)

def hyena_operator(ps, v, hs, impl="fast", state=None):
    """Algorithm 3's recurrence: z^0 = v, z^ℓ = p^ℓ ⊙ (h^ℓ ∗ z^{ℓ-1}) for ℓ = 1..order,
    returns z^order.

    ps: `order` gates p^ℓ (B, T, d); v: (B, T, d); hs: `order` filters h^ℓ (d, K). state:
    the input history of each convolution (None: empty). Returns (z^order, the histories).
    """
    z, pasts = v, []
    for p, h, past in zip(ps, hs, state or [None] * len(hs)):
        conv, past = causal_conv(z, h, impl, past)
        z = p * conv                                                         # (B, T, d)
        pasts.append(past)
    return z, tuple(pasts)


class Hyena(Mixer):
    """Hyena of any order (appendix H.2.1, Algorithm 3; Poli et al., 2023).

    A linear layer to (order+1)·d channels and a short explicit convolution give
    p^1..p^order and v; `order` gated long convolutions with implicit filters h^ℓ
    (ImplicitFilter); an output projection. `step` keeps the last K_short-1 projected inputs
    and the history of each long convolution's input:
    min(t, K_short-1)·(order+1)·d + order·min(t, seq_len-1)·d numbers.
    To copy: this class, hyena_operator, ImplicitFilter (with positional_features and
    exponential_decay), ExplicitFilter, causal_conv with CONV_IMPLS (causal_conv_direct,
    causal_conv_fft, causal_conv_fast, SHORT_FILTER), Mixer, check_choice and check_positive.
    The layer Figure 2 trained is experiments/official.py's OfficialHyena (form="official").
    """

    def __init__(self, d_model, seq_len, order=2, short_kernel_size=3, impl="fast"):
        super().__init__()
        check_positive("seq_len", seq_len)
        check_positive("order", order)
        check_positive("short_kernel_size", short_kernel_size)
        check_choice("impl", impl, tuple(CONV_IMPLS))
        self.d_model, self.seq_len, self.order, self.impl = d_model, seq_len, order, impl
        self.short_kernel_size = short_kernel_size
        self.in_proj = nn.Linear(d_model, (order + 1) * d_model)
        self.short_filter = ExplicitFilter((order + 1) * d_model, short_kernel_size)
        self.long_filter = ImplicitFilter(order * d_model, seq_len)
        self.out_proj = nn.Linear(d_model, d_model)

    def _mix(self, x, state):
        """x (B, T, d) after the histories `state` (None: none): (y, the new histories)."""
        d = x.shape[-1]
        u, short_past = causal_conv(self.in_proj(x), self.short_filter(), self.impl,
                                    None if state is None else state[0])
        *ps, v = u.split(d, dim=-1)                                          # (B, T, d) each
        hs = self.long_filter().split(d, dim=0)                              # (d, seq_len) each
        y, pasts = hyena_operator(ps, v, hs, self.impl, None if state is None else state[1:])
        return self.out_proj(y), (short_past, *pasts)

    def forward(self, x):
        return self._mix(x, None)[0]

    def step(self, x_t, state=None):
        y, state = self._mix(x_t[:, None], state)
        return y[:, 0], state

    def state_size(self, t):
        d, order = self.d_model, self.order
        return (min(t, self.short_kernel_size - 1) * (order + 1) * d
                + order * min(t, self.seq_len - 1) * d)


# ----------------------------------------------------------------------------------------
# H3: a shift SSM and a diagonal SSM (Fu et al., 2023a; S4D, Gu et al., 2022)

SSM_DISCRETIZATIONS = ("zoh", "bilinear")


def ssm_discretize(log_dt, A, method="zoh"):
    """The discrete SSM of x' = A x + u (an input map of ones) with step Δ = exp(log_dt):
    (log Ā, B̄), each (channels, modes) complex (returning log Ā lets the kernel raise Ā to
    any power by exp).

    zoh       Ā = exp(ΔA),                   B̄ = (exp(ΔA) - 1) / A   (zero-order hold,
              S4D's default)
    bilinear  Ā = (1 + ΔA/2) / (1 - ΔA/2),   B̄ = Δ / (1 - ΔA/2)     (the official H3
              kernel's, SSKernelDiag's default disc="bilinear")
    """
    check_choice("discretization", method, SSM_DISCRETIZATIONS)
    dt = log_dt.exp()[:, None]
    dtA = dt * A                                                      # (channels, modes)
    if method == "zoh":
        return dtA, (dtA.exp() - 1) / A
    return torch.log((1 + dtA / 2) / (1 - dtA / 2)), dt / (1 - dtA / 2)


def exp_complex(z):
    """exp(x + iy) = e^x (cos y + i sin y), from real operations: on a CPU ~3x faster than
    torch.exp on a complex tensor."""
    return torch.polar(z.real.exp(), z.imag)


def diagonal_ssm_kernel(log_dt, A, C, T, discretization="zoh"):
    """The SSM's convolution kernel, kernel[ch, ℓ] = 2·Re Σ_r C[ch, r] B̄[ch, r] Ā[ch, r]^ℓ
    over its modes r, ℓ < T.

    log_dt: (channels,) real; A, C: (channels, modes) complex, d_state/2 modes whose
    conjugates make the state real (hence 2·Re); S4D's kernel.
    Writing ℓ = m·i + j with m = ⌈√T⌉, Ā^ℓ = exp(m·i·log Ā)·exp(j·log Ā): two
    (channels, modes, m) tables of exponentials and a batched matmul, instead of
    channels·modes·T complex exponentials (which cost more than the convolution they feed).
    """
    log_dA, dB = ssm_discretize(log_dt, A, discretization)            # (channels, modes)
    m = math.isqrt(T - 1) + 1
    j = torch.arange(m, dtype=log_dt.dtype, device=log_dt.device)
    coarse, fine = exp_complex(log_dA[..., None] * (m * j)), exp_complex(log_dA[..., None] * j)
    kernel = torch.einsum("dr,dri,drj->dij", C * dB, coarse, fine)   # (channels, m, m)
    return 2 * kernel.real.flatten(1)[:, :T]                          # (channels, T)


def diagonal_ssm_step(u_t, x, log_dt, A, C, discretization="zoh"):
    """One step of the recurrence: x_t = Ā x_{t-1} + B̄ u_t, y_t = 2·Re Σ_r C_r x_t[r].

    u_t: (B, channels) real, x: (B, channels, modes) complex. Its impulse response is
    diagonal_ssm_kernel.
    """
    log_dA, dB = ssm_discretize(log_dt, A, discretization)
    x = exp_complex(log_dA) * x + dB * u_t[..., None]                 # (B, channels, modes)
    return 2 * (C * x).sum(-1).real, x


class H3(Mixer):
    """H3 (Fu et al., 2023a): y = W_o (q ⊙ SSM_diag(SSM_shift(k) ⊙ v)).

    Per head of head_dim channels the product is an outer product, k_i v_j, and the output
    y_j = Σ_i q_i · SSM_diag(k ⊗ v)_{ij}; head_dim=1 (default) is the elementwise
    q ⊙ SSM(k ⊙ v). One diagonal SSM per head, shared by its head_dim² channels, with a
    skip term (S4D's D).
    Shift SSM: A is the shift matrix and its input map e_0, so its state is the last inputs
    and its kernel is its C vector: a causal convolution with a learned filter of shift_size taps
    (default d_state: the official code uses one state size for both SSMs); its skip term
    is folded into tap 0.
    Diagonal SSM: S4D-Lin init, A_r = -1/2 + iπr for mode r, Δ log-uniform in [1e-3, 1e-1],
    C normal; d_state real numbers per channel (d_state/2 complex modes and their
    conjugates), discretized by zero-order hold (S4D's). Shift taps start
    N(0, 1/shift_size).
    Fast form: the SSM's kernel through the FFT convolution; reference: the direct sum.
    `step` runs both SSMs as recurrences: the state is the shift SSM's last inputs,
    min(t, shift_size-1)·d numbers, and the diagonal SSM's (d/head_dim)·head_dim²·d_state.
    To copy: this class, diagonal_ssm_kernel, diagonal_ssm_step, ssm_discretize (with
    SSM_DISCRETIZATIONS), exp_complex, ExplicitFilter, causal_conv with CONV_IMPLS
    (causal_conv_direct, causal_conv_fft, causal_conv_fast, SHORT_FILTER), Mixer, check_choice,
    check_divides and check_positive.
    The layer Figure 2 trained is experiments/official.py's OfficialH3 (form="official").
    """

    rescale_out_proj = False   # the official output_linear escapes its _init_weights' rescale
    discretization = "zoh"

    def __init__(self, d_model, seq_len, d_state=64, head_dim=1, shift_size=None,
                 impl="fast"):
        super().__init__()
        if isinstance(d_state, bool) or not isinstance(d_state, int) or d_state < 2 or d_state % 2:
            raise ValueError(f"d_state={d_state!r} is not allowed: it must be an even integer >= 2")
        check_divides("head_dim", head_dim, d_model)
        shift_size = d_state if shift_size is None else shift_size
        check_positive("shift_size", shift_size, "an integer >= 1, or None for d_state")
        check_choice("impl", impl, tuple(CONV_IMPLS))
        H, modes = d_model // head_dim, d_state // 2
        self.d_state, self.head_dim, self.shift_size = d_state, head_dim, shift_size
        self.impl = impl
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.shift_filter = self.shift_taps(d_model, shift_size)
        self.log_dt = nn.Parameter(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1)))
        self.log_neg_A_re = nn.Parameter(torch.full((H, modes), math.log(0.5)))
        self.A_im = nn.Parameter(math.pi * torch.arange(modes).float().repeat(H, 1))
        self.C_re = nn.Parameter(torch.randn(H, modes) * math.sqrt(0.5))
        self.C_im = nn.Parameter(torch.randn(H, modes) * math.sqrt(0.5))
        self.skip = nn.Parameter(torch.randn(H))
        self.out_proj = nn.Linear(d_model, d_model)

    def _ssm(self):
        """(log_dt, A, C, skip) of the diagonal SSM, repeated over each head's head_dim²
        channels."""
        r = self.head_dim ** 2
        A = torch.complex(-self.log_neg_A_re.exp(), self.A_im)
        C = torch.complex(self.C_re, self.C_im)
        return (self.log_dt.repeat_interleave(r), A.repeat_interleave(r, 0),
                C.repeat_interleave(r, 0), self.skip.repeat_interleave(r))

    def _outer(self, k, v):
        """k ⊗ v per head: (..., d), (..., d) -> (..., H·hd·hd), channel (head, i, j) =
        k[head, i]·v[head, j]."""
        hd = self.head_dim
        k, v = k.unflatten(-1, (-1, hd)), v.unflatten(-1, (-1, hd))
        return (k[..., :, None] * v[..., None, :]).flatten(-3)

    def _gate(self, q, ssm):
        """y[head, j] = Σ_i q[head, i]·ssm[head, i, j]: (..., d), (..., H·hd·hd) -> (..., d)."""
        hd = self.head_dim
        q, ssm = q.unflatten(-1, (-1, hd)), ssm.unflatten(-1, (-1, hd, hd))
        return (q[..., None] * ssm).sum(-2).flatten(-2)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)                               # (B, T, d)
        k, _ = causal_conv(k, self.shift_filter(), self.impl)
        kv = self._outer(k, v)                                               # (B, T, H·hd²)
        log_dt, A, C, skip = self._ssm()
        kernel = diagonal_ssm_kernel(log_dt, A, C, T, self.discretization)   # (H·hd², T)
        ssm, _ = causal_conv(kv, kernel, self.impl)
        return self.out_proj(self._gate(q, ssm + skip * kv))

    def step(self, x_t, state=None):
        B, d = x_t.shape
        log_dt, A, C, skip = self._ssm()
        if state is None:
            shift_x = None
            ssm_x = torch.zeros(B, *A.shape, dtype=A.dtype, device=A.device)
        else:
            shift_x, ssm_x = state[0], torch.view_as_complex(state[1])
        q, k, v = self.qkv(x_t).split(d, dim=-1)                             # (B, d)
        k, shift_x = causal_conv(k[:, None], self.shift_filter(), self.impl, shift_x)
        kv = self._outer(k[:, 0], v)                                         # (B, H·hd²)
        ssm, ssm_x = diagonal_ssm_step(kv, ssm_x, log_dt, A, C, self.discretization)
        y_t = self.out_proj(self._gate(q, ssm + skip * kv))
        return y_t, (shift_x, torch.view_as_real(ssm_x))

    def state_size(self, t):
        d = self.out_proj.in_features
        return d * min(t, self.shift_size - 1) + d * self.head_dim * self.d_state if t else 0

    def shift_taps(self, d_model, shift_size):
        """The shift SSM's C, a filter of shift_size taps, as first drawn."""
        return ExplicitFilter(d_model, shift_size)


# ----------------------------------------------------------------------------------------
# helpers shared by the chunked forms


def _pad_to_chunks(x, chunk_size, dim, value=0.0):
    """Pad `x` along `dim` with `value` to a multiple of chunk_size; returns (padded, T)."""
    T = x.shape[dim]
    pad = (-T) % chunk_size
    if pad:
        shape = list(x.shape)
        shape[dim] = pad
        x = torch.cat([x, x.new_full(shape, value)], dim=dim)
    return x, T


# ----------------------------------------------------------------------------------------
# RWKV-4 time mixing (appendix H.2; Peng et al., 2023, eq. 14-16)
#
# wkv_t = (Σ_{i<t} e^{-(t-1-i)w + k_i} v_i + e^{u + k_t} v_t)
#       / (Σ_{i<t} e^{-(t-1-i)w + k_i}     + e^{u + k_t})
# is, per channel, a softmax over positions i <= t of the scores
#   score[t, i] = k_i - (t-1-i) w  (i < t),   u + k_t  (i = t)
# applied to v. The recurrence keeps every sum as (a, b, p) = (a·e^p, b·e^p) and rescales to
# the largest p before adding, so keys of any size (e^1000 overflows float64) give the right
# ratio. The scales cancel in the ratio, so they are detached: they carry no gradient.
# The chunked form keeps a sum as its weighted average and log-normaliser instead (below):
# stable for the same reason, and fewer operations per merge.


def _merge(*parts):
    """Add sums given as (numerator a, denominator b, log-scale p) meaning (a·e^p, b·e^p).

    The result is scaled to the largest p (detached: the scale cancels in a / b). Empty
    sums carry p = finfo.min, never -inf, so that no exp(-inf + inf) can appear.
    """
    p = torch.stack([q for _, _, q in parts]).amax(0).detach()
    scales = [torch.exp(q - p) for _, _, q in parts]
    return (sum(s * a for s, (a, _, _) in zip(scales, parts)),
            sum(s * b for s, (_, b, _) in zip(scales, parts)), p)


def _empty(like):
    """The empty sum: a = b = 0 at the smallest finite log-scale."""
    zeros = torch.zeros_like(like)
    return zeros, zeros, torch.full_like(like, torch.finfo(like.dtype).min)


def wkv_step(w, u, k_t, v_t, state=None):
    """One step of the wkv recurrence in log space (the RWKV-4 CUDA kernel's form).

    state (a, b, p) holds the numerator a·e^p and denominator b·e^p of the sum over i < t;
    p is the running maximum. k_t, v_t (B, d); w, u (d,). Returns (wkv_t, new state).
    """
    a, b, p = _empty(k_t) if state is None else state
    # output: the term e^{u+k_t} v_t joins the sum over i < t
    num, den, _ = _merge((a, b, p), (v_t, torch.ones_like(v_t), u + k_t))
    # state: the old sum decays by e^{-w}, the term e^{k_t} v_t joins it
    return num / den, _merge((a, b, p - w), (v_t, torch.ones_like(v_t), k_t))


def wkv_reference(w, u, k, v, state=None, chunk_size=None):
    """wkv by the stable recurrence, one position at a time. k, v (B, T, d) -> (B, T, d).

    state: wkv_step's (a, b, p) before the first position (None: empty). Returns (wkv, the
    state after the last position). T sequential steps of O(B·d) work each: time is
    dominated by the Python loop. chunk_size is the chunked form's (every wkv form takes
    the same arguments); unused here.
    """
    out = []
    for t in range(k.shape[1]):
        y, state = wkv_step(w, u, k[:, t], v[:, t], state)
        out.append(y)
    return torch.stack(out, 1), state


def _add_term(avg, log_z, v, score):
    """Add e^score·v to a sum kept as (avg, log_z) = (Σe^{s_i}v_i / Σe^{s_i}, log Σe^{s_i}).

    The new term's share of the average is σ(score - log_z): finite for scores of any size.
    Adding another sum (avg', log_z') is adding the term v = avg', score = log_z'. Empty sums
    have log_z = finfo.min, not -inf, so that σ and logaddexp never see inf - inf.
    """
    return torch.lerp(avg, v, torch.sigmoid(score - log_z)), torch.logaddexp(log_z, score)


def wkv_chunked(w, u, k, v, state=None, chunk_size=64):
    """The same recurrence in three phases, chunk + chunks Python steps instead of
    T = chunks·chunk (chunk = chunk_size positions each):

    1. every chunk runs the recurrence from an empty sum, all chunks at once (`chunk` steps
       of O(B·chunks·d)), keeping the local sum before each position;
    2. the sums entering each chunk: the previous one decayed by e^{-chunk·w} plus that
       chunk's local end sum (`chunks` steps of O(B·d));
    3. every position at once: carried sum decayed by e^{-j·w} + local sum + bonus term.
    A sum is kept as (average, log-normaliser) (see _add_term): decaying it by e^{-w} is
    log_z - w, adding a term is a σ-weighted lerp and a logaddexp: four element-wise
    operations per merge instead of the fifteen or so of _merge's rescaling.
    Materializes the local sums before every position: 2 (B, T, d) tensors.
    state: as wkv_reference's, (a, b, p) = (avg, 1, log_z) in this form's terms. The padding
    keys are finfo.min, terms of weight 0: the carry after the last chunk is the final
    state, decayed pad·w too far, which the end undoes.
    """
    chunk = min(chunk_size, k.shape[1])             # a chunk never longer than the sequence
    tiny = torch.finfo(k.dtype).min
    (kc, T), (vc, _) = _pad_to_chunks(k, chunk, 1, tiny), _pad_to_chunks(v, chunk, 1)
    B, Tp, d = kc.shape
    chunks = Tp // chunk
    kc, vc = kc.view(B, chunks, chunk, d), vc.view(B, chunks, chunk, d)   # (B, chunks, chunk, d)
    zero = torch.zeros_like(kc[:, :, 0])                                      # (B, chunks, d)
    (avg, log_z), before = (zero, torch.full_like(zero, tiny)), []            # empty sums
    for j in range(chunk):                                                    # 1.
        before.append((avg, log_z))
        avg, log_z = _add_term(avg, log_z - w, vc[:, :, j], kc[:, :, j])
    if state is None:
        c_avg, c_log_z = zero[:, 0], torch.full_like(zero[:, 0], tiny)         # (B, d)
    else:
        a, b, p = state
        c_avg, c_log_z = a / b, p + torch.log(b)
    carried = []
    for i in range(chunks):                                                   # 2.
        carried.append((c_avg, c_log_z))
        c_avg, c_log_z = _add_term(c_avg, c_log_z - chunk * w, avg[:, i], log_z[:, i])
    final = c_avg, torch.ones_like(c_avg), c_log_z + (Tp - T) * w
    j = torch.arange(chunk, device=k.device)[:, None]                         # (chunk, 1)
    c_avg, c_log_z = (torch.stack(s, 1)[:, :, None] for s in zip(*carried))  # (B, chunks, 1, d)
    avg, log_z = (torch.stack(s, 2) for s in zip(*before))                   # (B, chunks, chunk, d)
    avg, log_z = _add_term(avg, log_z, c_avg, c_log_z - j * w)
    y = torch.lerp(avg, vc, torch.sigmoid(u + kc - log_z))                   # the bonus term
    return y.reshape(B, Tp, d)[:, :T], final


WKV_IMPLS = {"fast": wkv_chunked, "reference": wkv_reference}


def _at_least_float32(*tensors):
    """bfloat16 or float16 tensors (autocast's outputs) as float32; others as they are."""
    return [t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors]


class RWKV(Mixer):
    """RWKV-4 time mixing: token shift, wkv, σ(r) gate, output projection (Peng et al., 2023).

    x'_t = μ ⊙ x_t + (1-μ) ⊙ x_{t-1} with one μ each for r, k, v (x_{-1} = 0);
    out_t = W_o(σ(r_t) ⊙ wkv_t). w = exp(w_log) > 0 and u are per channel, with one
    initialisation for every layer, after RWKV-4's ramps over the channels i:
    w_log = -5 + 8·r_i^0.7, u = log 0.3, μ = r_i, r_i = i/(d-1).
    No channel-mixing block (the blocks of train.py hold the MLP, if any).
    State of `step`: (a, b, p) of wkv and the previous input: 4·d numbers at every t.
    To copy: this class, WKV_IMPLS (wkv_chunked, wkv_reference), wkv_step (with _merge, _empty,
    _add_term, _pad_to_chunks), _at_least_float32, Mixer, check_choice and check_positive.
    The layer Figure 2 trained is experiments/official.py's OfficialRWKV
    (form="official"), which starts from other values.
    """

    rescale_out_proj = False   # the official layer is named `output`: no rescale

    def __init__(self, d_model, seq_len, impl="fast", chunk_size=64):
        super().__init__()
        check_choice("impl", impl, tuple(WKV_IMPLS))
        check_positive("chunk_size", chunk_size)
        d = d_model
        self.impl, self.chunk_size = impl, chunk_size
        ramp = torch.arange(d, dtype=torch.float32) / max(d - 1, 1)
        self.w_log = nn.Parameter(-5 + 8 * ramp ** 0.7)
        self.u = nn.Parameter(torch.full((d,), math.log(0.3)))
        self.mix_r, self.mix_k, self.mix_v = (nn.Parameter(ramp.clone()) for _ in range(3))
        self.receptance, self.key, self.value, self.out_proj = (
            nn.Linear(d, d, bias=False) for _ in range(4))

    def _rkv(self, x, x_prev):
        r = self.receptance(self.mix_r * x + (1 - self.mix_r) * x_prev)
        k = self.key(self.mix_k * x + (1 - self.mix_k) * x_prev)
        v = self.value(self.mix_v * x + (1 - self.mix_v) * x_prev)
        return r, k, v

    def forward(self, x):
        x_prev = F.pad(x, (0, 0, 1, -1))                                      # token shift
        r, k, v = self._rkv(x, x_prev)
        k, v = _at_least_float32(k, v)        # under autocast too: the official kernel's sums
        y, _ = WKV_IMPLS[self.impl](torch.exp(self.w_log), self.u, k, v,
                                    chunk_size=self.chunk_size)
        return self.out_proj(torch.sigmoid(r) * y)

    def step(self, x_t, state=None):
        wkv_state, x_prev = (None, torch.zeros_like(x_t)) if state is None else (
            state[:3], state[3])
        r, k, v = self._rkv(x_t, x_prev)
        y, wkv_state = wkv_step(torch.exp(self.w_log), self.u, *_at_least_float32(k, v),
                                wkv_state)
        return self.out_proj(torch.sigmoid(r) * y), (*wkv_state, x_t)

    def state_size(self, t):
        return 4 * self.out_proj.in_features if t else 0


# ----------------------------------------------------------------------------------------
# RetNet multi-scale retention (appendix H.2; Sun et al., 2023, eq. 5-9)
#
# recurrent  S_t = γ S_{t-1} + k_tᵀ v_t,  y_t = q_t S_t
# parallel   Y = (Q Kᵀ ⊙ Γ) V,  Γ[t, s] = γ^{t-s} for t >= s else 0 (RetNet's D)
# chunkwise  per chunk [i] of `chunk` positions:
#            Y_[i] = (Q_[i] K_[i]ᵀ ⊙ Γ) V_[i] + (Q_[i] ⊙ ξ) R_[i-1],  ξ_j = γ^{j+1}
#            R_[i] = K_[i]ᵀ (V_[i] ⊙ ζ) + γ^chunk R_[i-1],  ζ_j = γ^{chunk-1-j}
# Every form takes (q, k, v, gamma, state=None, chunk_size): q, k (B, H, T, hs),
# v (B, H, T, hv), gamma (H,), state S (B, H, hs, hv) before the first position (None: 0);
# chunk_size is the chunkwise form's, the others ignore it. Each returns (y, S after the
# last position).


def _decay_matrix(gamma, T):
    """Γ (H, T, T): γ^{t-s} below and on the diagonal, 0 above."""
    t = torch.arange(T, device=gamma.device)
    dist = t[:, None] - t[None, :]                                            # (T, T)
    decay = torch.exp(dist.clamp_min(0) * torch.log(gamma)[:, None, None])    # (H, T, T)
    return decay.masked_fill(dist < 0, 0.0)


def _powers(gamma, exponents):
    """γ^e of every head for every exponent e: (H, len(exponents), 1)."""
    return torch.exp(exponents * torch.log(gamma)[:, None])[..., None]


def _state_after(k, v, gamma, state=None):
    """γ^T S + Σ_j γ^{T-1-j} k_jᵀ v_j: the state after k, v (..., H, T, .) from the state S
    before them (None: 0)."""
    T = k.shape[-2]
    zeta = _powers(gamma, torch.arange(T - 1, -1, -1, device=k.device))      # (H, T, 1)
    after = (k * zeta).transpose(-1, -2) @ v                                  # (..., H, hs, hv)
    return after if state is None else after + gamma[:, None, None] ** T * state


def _read_state(q, gamma, state):
    """(q ⊙ ξ) S, ξ_j = γ^{j+1}: what the state S before q (..., H, T, hs) adds to y."""
    return (q * _powers(gamma, torch.arange(1, q.shape[-2] + 1, device=q.device))) @ state


def retention_parallel(q, k, v, gamma, state=None, chunk_size=None):
    """(Q Kᵀ ⊙ Γ) V. Materializes (B, H, T, T)."""
    y = (torch.einsum("bhid,bhjd->bhij", q, k) * _decay_matrix(gamma, q.shape[2])) @ v
    if state is not None:
        y = y + _read_state(q, gamma, state)
    return y, _state_after(k, v, gamma, state)                               # (B, H, T, hv)


def retention_recurrent(q, k, v, gamma, state=None, chunk_size=None):
    """S_t = γ S_{t-1} + k_tᵀ v_t, y_t = q_t S_t, one position at a time (T Python steps)."""
    B, H, T, hs = q.shape
    S = q.new_zeros(B, H, hs, v.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        S = gamma[:, None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append(torch.einsum("bhd,bhde->bhe", q[:, :, t], S))
    return torch.stack(out, 2), S                                             # (B, H, T, hv)


def retention_chunkwise(q, k, v, gamma, state=None, chunk_size=32):
    """The chunkwise form: parallel inside chunks of `chunk` positions, recurrent across them.

    The intra-chunk products are batched matmuls over all chunks at once; the recurrence
    R_[i] = γ^chunk R_[i-1] + K_[i]ᵀ(V_[i] ⊙ ζ) is `chunks` steps of one fused multiply-add
    on (B, H, hs, hv). Costs B·H·T·chunk·(hs + hv) inside chunks and 2·B·H·T·hs·hv to build
    and read the states; materializes (B, H, chunks, chunk, chunk) and one (hs, hv) state
    per chunk. The final state comes from the last chunk's real positions (its zero padding
    would count in the decay).
    """
    chunk = min(chunk_size, q.shape[2])             # a chunk never longer than the sequence
    (q, T), (k, _), (v, _) = (_pad_to_chunks(t, chunk, 2) for t in (q, k, v))
    B, H, Tp, hs = q.shape
    chunks = Tp // chunk
    # one copy each into contiguous chunks (B, chunks, H, chunk, .), not one in every matmul
    q, k, v = (t.view(B, H, chunks, chunk, -1).transpose(1, 2).contiguous() for t in (q, k, v))
    y = ((q @ k.transpose(-1, -2)) * _decay_matrix(gamma, chunk)) @ v  # (B, chunks, H, chunk, hv)
    adds = _state_after(k, v, gamma)       # each chunk's own sum at its end (B, chunks, H, hs, hv)
    states = [torch.zeros_like(adds[:, 0]) if state is None else state]
    for i in range(chunks - 1):                     # the states entering each chunk
        states.append(torch.addcmul(adds[:, i], gamma[:, None, None] ** chunk, states[-1]))
    y = y + _read_state(q, gamma, torch.stack(states, 1))
    r = T - (chunks - 1) * chunk                    # the last chunk's real positions
    final = _state_after(k[:, -1, :, :r], v[:, -1, :, :r], gamma, states[-1])
    return y.transpose(1, 2).reshape(B, H, Tp, -1)[:, :, :T], final


RETENTION_IMPLS = {"fast": retention_chunkwise, "reference": retention_recurrent,
                   "parallel": retention_parallel}


class RetNet(Mixer):
    """Multi-scale retention: H heads, head j with γ = 1 - 2^(-5-j), group norm, swish gate.

    MSR(X) = (swish(X W_G) ⊙ GroupNorm_H(retention heads)) W_O (RetNet §2.2), k scaled by
    1/√hs. Simplifications, named: value heads have the key's size hs (RetNet doubles them);
    no xPos/rotary rotation (the decay alone tells positions apart; a rotation would need the
    position in the step state, and it is not tested, so it is left out); group norm without
    affine parameters and without RetNet's score normalisations (§2.4, for fp16 stability).
    State of `step`: one (hs, hs) matrix per head, d·d/H numbers at every t.
    To copy: this class, RETENTION_IMPLS (retention_chunkwise, retention_recurrent,
    retention_parallel, with _decay_matrix, _powers, _state_after, _read_state, _pad_to_chunks),
    Mixer, check_choice, check_divides and check_positive.
    """

    def __init__(self, d_model, seq_len, num_heads=4, impl="fast", chunk_size=32):
        super().__init__()
        check_divides("num_heads", num_heads, d_model)
        check_choice("impl", impl, tuple(RETENTION_IMPLS))
        check_positive("chunk_size", chunk_size)
        self.num_heads, self.impl, self.chunk_size = num_heads, impl, chunk_size
        self.register_buffer("gamma", 1 - 2.0 ** (-5 - torch.arange(num_heads)))
        self.q_proj, self.k_proj, self.v_proj, self.g_proj, self.out_proj = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(5))

    def _heads(self, x):
        *lead, d = x.shape
        hs = d // self.num_heads
        q, k, v = (proj(x).view(*lead, self.num_heads, hs)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        return q, k / math.sqrt(hs), v

    def _output(self, x, y):
        """y (..., H, hs) per-head retention -> group norm per head, swish gate, W_O."""
        y = F.layer_norm(y, y.shape[-1:]).flatten(-2)                         # group norm
        return self.out_proj(F.silu(self.g_proj(x)) * y)

    def forward(self, x):
        q, k, v = (t.transpose(1, 2) for t in self._heads(x))                 # (B, H, T, hs)
        y, _ = RETENTION_IMPLS[self.impl](q, k, v, self.gamma, chunk_size=self.chunk_size)
        return self._output(x, y.transpose(1, 2))                             # (B, T, d)

    def step(self, x_t, state=None):
        q, k, v = (t[:, :, None] for t in self._heads(x_t))                  # (B, H, 1, hs)
        y, S = retention_recurrent(q, k, v, self.gamma, None if state is None else state[0])
        return self._output(x_t, y[:, :, 0]), (S,)

    def state_size(self, t):
        d = self.out_proj.in_features
        return d * d // self.num_heads if t else 0


# ----------------------------------------------------------------------------------------
# Based linear attention (Arora et al., 2024, "Simple linear attention language
# models balance the recall-throughput tradeoff", §3)
#
# φ(x) = [1, x / d'^{1/4}, vec(x xᵀ) / (√2 · √d')],  so  φ(q)·φ(k) = 1 + q·k/√d' + (q·k)²/(2d')
# y_i = Σ_{j<=i} φ(q_i)·φ(k_j) v_j / Σ_{j<=i} φ(q_i)·φ(k_j)
# The kernel 1 + s + s²/2 = ((1 + s)² + 1)/2 is positive, so the ratio needs no epsilon.
# The state, S = Σ_j φ(k_j)ᵀ v_j and z = Σ_j φ(k_j), is kept in the features of
# taylor_feature_map_compact: the same kernel, fewer features.
# Every form takes (q, k, v, state=None, chunk_size): q, k (B, H, T, d'), v (B, H, T, hv),
# state (S (B, H, features, hv), z (B, H, features)) before the first position (None: zeros),
# `features` = 1 + d' + d'(d'+1)/2 of taylor_feature_map_compact; chunk_size
# is the chunked form's, the others ignore it. Each returns (y, the state after the last
# position).


def taylor_feature_map(x):
    """φ(x): (..., d') -> (..., 1 + d' + d'²), the 2nd-order Taylor expansion of exp(q·k/√d')."""
    feature_dim = x.shape[-1]
    x2 = (x[..., :, None] * x[..., None, :]).flatten(-2)                      # (..., d'²)
    return torch.cat([torch.ones_like(x[..., :1]), x / feature_dim ** 0.25,
                      x2 / (math.sqrt(2) * math.sqrt(feature_dim))], dim=-1)


def taylor_feature_map_compact(x):
    """φ with each product x_i x_j once (i <= j): (..., d') -> (..., 1 + d' + d'(d'+1)/2).

    x xᵀ is symmetric, so the pair (i, j), i < j, stands for both of its entries with
    weight √2 (its product in φ(q)·φ(k) counts twice): the same kernel 1 + s + s²/2 with
    153 features instead of 273 for d' = 16. Every form's state is in these features (Based's
    code keeps all d'² products, a state 1.8 times as large for the same function).
    """
    feature_dim = x.shape[-1]
    off = x / math.sqrt(feature_dim)            # x_i x_j / √d' = √2 · (x_i x_j / √(2d'))
    rows = [x[..., i:i + 1] * off[..., i + 1:] for i in range(feature_dim - 1)]
    return torch.cat([torch.ones_like(x[..., :1]), x / feature_dim ** 0.25,
                      x * x / math.sqrt(2 * feature_dim), *rows], dim=-1)


def _taylor_kernel(q, k):
    """φ(q)·φ(k) for every pair, without the features: 1 + s + s²/2, s = q·k/√d'."""
    s = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1])
    return 1 + s + s * s / 2


def _read_linear_state(fq, state):
    """What the state (S, z) before queries with features fq adds to the numerator and to
    the denominator: (fq S, fq·z)."""
    S, z = state
    return fq @ S, (fq @ z[..., None])[..., 0]


def based_parallel(q, k, v, state=None, chunk_size=None):
    """The quadratic form: the causal (T, T) kernel matrix. Materializes (B, H, T, T)."""
    kernel = torch.tril(_taylor_kernel(q, k))                                 # (B, H, T, T)
    num, den = kernel @ v, kernel.sum(-1)
    fk = taylor_feature_map_compact(k)
    S, z = fk.transpose(-1, -2) @ v, fk.sum(-2)
    if state is not None:
        add_num, add_den = _read_linear_state(taylor_feature_map_compact(q), state)
        num, den, S, z = num + add_num, den + add_den, S + state[0], z + state[1]
    return num / den[..., None], (S, z)


def based_recurrent(q, k, v, state=None, chunk_size=None):
    """The recurrent form: S_t = S_{t-1} + φ(k_t)ᵀ v_t, z_t = z_{t-1} + φ(k_t),
    y_t = φ(q_t) S_t / φ(q_t)·z_t. T Python steps; state features·hv + features per head."""
    fq, fk = taylor_feature_map_compact(q), taylor_feature_map_compact(k)  # (B, H, T, features)
    B, H, T, features = fq.shape
    S, z = (q.new_zeros(B, H, features, v.shape[-1]), q.new_zeros(B, H, features)) \
        if state is None else state
    out = []
    for t in range(T):
        S = S + fk[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + fk[:, :, t]
        num, den = _read_linear_state(fq[:, :, t, None], (S, z))             # (B, H, 1, .)
        out.append(num / den[..., None])
    return torch.cat(out, 2), (S, z)                                          # (B, H, T, hv)


def based_chunkwise(q, k, v, state=None, chunk_size=64):
    """The chunked form: the kernel matrix inside chunks of `chunk` positions, the state S, z
    across them.

    Inside a chunk: B·H·T·chunk·(d' + hv) multiply-adds. Across chunks the states are sums of
    φ(k)ᵀv over the earlier chunks; building and reading them, 2·B·H·T·features·hv, is the
    dominant cost (features = 1 + d' + d'(d'+1)/2, the compact ones). Materializes
    (B, H, chunks, chunk, chunk), the features of every q and k, and one (features, hv)
    state per chunk.
    """
    chunk = min(chunk_size, q.shape[2])             # a chunk never longer than the sequence
    (q, T), (k, _), (v, _) = (_pad_to_chunks(t, chunk, 2) for t in (q, k, v))
    B, H, Tp, _ = q.shape
    chunks = Tp // chunk
    # one copy each into contiguous chunks, rather than one inside every matmul below
    q, k, v = (t.contiguous().view(B, H, chunks, chunk, -1)
               for t in (q, k, v))                                      # (B, H, chunks, chunk, .)
    kernel = torch.tril(_taylor_kernel(q, k))                      # (B, H, chunks, chunk, chunk)
    fq, fk = (taylor_feature_map_compact(t) for t in (q, k))    # (B, H, chunks, chunk, features)
    # states entering each chunk: running sums over the earlier chunks, S by a loop over the
    # chunks (several times faster than torch.cumsum along dimension 2, which strides
    # through memory), the small z by cumsum
    adds = fk.transpose(-1, -2) @ v                               # (B, H, chunks, features, hv)
    S0, z0 = (torch.zeros_like(adds[:, :, 0]), torch.zeros_like(fk[:, :, 0, 0])) \
        if state is None else state                                           # entering chunk 0
    S, states = S0, []
    for i in range(chunks):
        states.append(S)
        S = S + adds[:, :, i]
    z = torch.cumsum(fk.sum(3), 2)          # (B, H, chunks, features); padding has φ(0) ≠ 0,
    z_final = z0 + fk.flatten(2, 3)[:, :, :T].sum(2)    # so the final z skips it
    z = F.pad(z, (0, 0, 1, -1)) + z0[:, :, None]                             # entering
    num, den = _read_linear_state(fq, (torch.stack(states, 2), z))
    num, den = kernel @ v + num, kernel.sum(-1) + den
    return (num / den[..., None]).reshape(B, H, Tp, -1)[:, :, :T], (S, z_final)


BASED_IMPLS = {"fast": based_chunkwise, "reference": based_recurrent, "parallel": based_parallel}


class Based(Mixer):
    """Based's linear attention layer: q, k projected to H heads of d' features, v to H heads
    of d/H, Taylor feature map, causal normalised linear attention, output projection.

    The Based layer itself has no convolution: the Based *model* interleaves it with short
    convolution (BaseConv) layers and small sliding-window attention layers, which train.py
    expresses as a per-layer list of mixers, not inside this class.
    Figure 2's Based model (configs.py) alternates a short official BaseConv with this layer
    at feature_dim=8, one head; the official layer (zoology/mixers/based.py, train_view
    "quadratic": our "parallel" form) adds 1e-12 to the denominator, which needs none here:
    the kernel 1 + s + s²/2 is at least 1/2.
    State of `step`: S (features, d/H) and z (features,) per head in the compact features,
    features = 1 + d' + d'(d'+1)/2: H·features·(d/H + 1) numbers.
    To copy: this class, BASED_IMPLS (based_chunkwise, based_recurrent, based_parallel, with
    taylor_feature_map_compact, _taylor_kernel, _read_linear_state, _pad_to_chunks), Mixer,
    check_choice, check_divides and check_positive.
    """

    rescale_out_proj = False   # the official layer is named proj_o: no rescale

    def __init__(self, d_model, seq_len, feature_dim=16, num_heads=1, impl="fast",
                 chunk_size=64):
        super().__init__()
        check_positive("feature_dim", feature_dim)
        check_divides("num_heads", num_heads, d_model)
        check_choice("impl", impl, tuple(BASED_IMPLS))
        check_positive("chunk_size", chunk_size)
        self.feature_dim, self.num_heads = feature_dim, num_heads
        self.impl, self.chunk_size = impl, chunk_size
        self.q_proj = nn.Linear(d_model, num_heads * feature_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_heads * feature_dim, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _heads(self, x):
        *lead, d = x.shape
        H = self.num_heads
        return (self.q_proj(x).view(*lead, H, -1), self.k_proj(x).view(*lead, H, -1),
                self.v_proj(x).view(*lead, H, d // H))

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._heads(x))                 # (B, H, T, .)
        y, _ = BASED_IMPLS[self.impl](q, k, v, chunk_size=self.chunk_size)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, d))

    def step(self, x_t, state=None):
        B, d = x_t.shape
        q, k, v = (t[:, :, None] for t in self._heads(x_t))                  # (B, H, 1, .)
        y, state = based_recurrent(q, k, v, state)
        return self.out_proj(y.reshape(B, d)), state

    def state_size(self, t):
        features = 1 + self.feature_dim + self.feature_dim * (self.feature_dim + 1) // 2
        return self.num_heads * features * (self.out_proj.in_features // self.num_heads + 1) \
            if t else 0


# ----------------------------------------------------------------------------------------
# Mamba, the selective SSM (Gu & Dao, 2023, Algorithm 2 and §3.6)
#
# S_t = exp(Δ_t A) ⊙ S_{t-1} + Δ_t Bm_t x_t     S, A = -exp(A_log): (d_inner, d_state)
# y_t = C_t S_t + skip ⊙ x_t                     (Bm, C, skip: Mamba's B, C, D; its h is S)
# Both scans take (x, delta, A, Bm, Cm, skip, state=None, chunk_size): x, delta
# (B, T, d_inner), A (d_inner, d_state), Bm, Cm (B, T, d_state), skip (d_inner,), state S
# (B, d_inner, d_state) before the first position (None: 0); chunk_size is the chunked
# scan's, the sequential one ignores it. Each returns (y, S after the last position).


def selective_scan_sequential(x, delta, A, Bm, Cm, skip, state=None, chunk_size=None):
    """The recurrence as written, one position at a time (T Python steps of
    B·d_inner·d_state)."""
    B, T, d_inner = x.shape
    S = x.new_zeros(B, d_inner, A.shape[1]) if state is None else state
    out = []
    for t in range(T):
        S = torch.exp(delta[:, t, :, None] * A) * S + \
            (delta[:, t] * x[:, t])[:, :, None] * Bm[:, t, None, :]  # (B, d_inner, d_state)
        out.append(torch.einsum("bdn,bn->bd", S, Cm[:, t]))
    return torch.stack(out, 1) + skip * x, S                            # (B, T, d_inner)


# positions per segment of the chunked scan that backward recomputes. L layers keep
# 2·L·chunk/SCAN_SEGMENT states and a segment's recomputation holds 2·SCAN_SEGMENT more, so
# backward's peak is least at SCAN_SEGMENT = √(L·chunk): for chunks of 64, 8 and 16 are
# alike at 2 layers, and 16 is the better from 3 layers on
SCAN_SEGMENT = 16


def _scan_segment(S, dc, A2, Bc, u, Cc=None):
    """S_t = e^{Δ_t A} S_{t-1} + Bm_t Δ_t x_t in every chunk at once, for each of the k
    positions of Δ_t and Δ_t x_t, dc and u (B, chunks, k, d_inner), and Bc
    (B, chunks, k, d_state), from S (B, chunks, d_state, d_inner); A2 = A/ln 2
    (d_state, d_inner). With Cc (B, k, chunks, d_state), y_t = C_t S_t too. Returns (S after
    the k steps, [y_t])."""
    ys = []
    for j in range(dc.shape[2]):
        S = torch.addcmul(torch.exp2(dc[:, :, j, None] * A2) * S, Bc[:, :, j, :, None],
                          u[:, :, j, None])
        if Cc is not None:
            ys.append(Cc[:, j, :, None] @ S)                       # (B, chunks, 1, d_inner)
    return S, ys


def selective_scan_chunked(x, delta, A, Bm, Cm, skip, state=None, chunk_size=64):
    """The same recurrence with its chunks = T/chunk chunks (chunk = chunk_size positions)
    run side by side: chunk + chunks + chunk Python steps instead of T, each
    chunks·B·d_inner·d_state numbers wide instead of B·d_inner·d_state:

    1. every chunk scanned from a zero state, all chunks at once (`chunk` steps): its end
       state;
    2. the state entering each chunk: the previous one times the chunk's total decay
       exp(A · Σ_chunk Δ) plus that chunk's end state (`chunks` steps of B·d_inner·d_state);
    3. every chunk scanned again, all at once, from its true entering state (`chunk` steps),
       reading y_t = C_t S_t on the way.
    Every factor is a decay exp(ΔA) <= 1, so nothing overflows whatever Δ and A are.
    Cost: 2·B·T·d_inner·d_state exponentials and multiply-adds, twice the sequential scan's;
    the gain is the T Python steps (experiments/README.md, "Benchmarks": what else was tried).
    Materializes no (B, T, d_inner, d_state) tensor, and keeps none for backward: passes 1
    and 3 run in segments of SCAN_SEGMENT positions, each recomputed in backward from the
    state entering it (torch.utils.checkpoint). Autograd keeps 2·chunk/SCAN_SEGMENT states
    (B, chunks, d_state, d_inner), 2·B·T·d_inner·d_state/SCAN_SEGMENT numbers, where every
    step's decay and the state it multiplies would be 4·B·T·d_inner·d_state (32 GiB for
    two Mamba layers at (B, T, d) = (128, 512, 512)); the price is passes 1 and 3 run once
    more in backward. The padding has Δ = 0 (decay 1, input 0), so the carry after the last
    chunk is the final state.
    """
    chunk = min(chunk_size, x.shape[1])             # a chunk never longer than the sequence
    (x, T), (delta, _), (Bm, _), (Cm, _) = (_pad_to_chunks(t, chunk, 1)
                                            for t in (x, delta, Bm, Cm))
    B, Tp, d_inner = x.shape
    chunks, d_state = Tp // chunk, A.shape[1]
    # e^{ΔA} = 2^{ΔA·log2 e}: PyTorch's exp2 is several times faster than exp on a CPU;
    # A2 is made contiguous so that the broadcast product below runs along d_inner
    A2 = (A.T / math.log(2)).contiguous()                               # (d_state, d_inner)
    dc = delta.view(B, chunks, chunk, d_inner)                    # (B, chunks, chunk, d_inner)
    u = (delta * x).view(B, chunks, chunk, d_inner)               # (B, chunks, chunk, d_inner)
    Bc = Bm.view(B, chunks, chunk, d_state)

    def scan(S, Cc=None):
        """Pass 1 (Cc None) or 3 from S, a segment at a time; (S after it, [y_t] with Cc)."""
        ys = []
        for j in range(0, chunk, SCAN_SEGMENT):
            s = slice(j, j + SCAN_SEGMENT)
            # every tensor the segment reads is an argument, which checkpoint keeps for the
            # recomputation
            args = (S, dc[:, :, s], A2, Bc[:, :, s], u[:, :, s],
                    None if Cc is None else Cc[:, s])
            # use_reentrant=False is PyTorch's recommended form, and there are no random
            # draws to replay; under no_grad nothing is kept, and checkpoint would only cost
            # its overhead (about 40 µs a call, and its first call imports torch._dynamo)
            S, y = (torch.utils.checkpoint.checkpoint(_scan_segment, *args, use_reentrant=False,
                                                      preserve_rng_state=False)
                    if torch.is_grad_enabled() else _scan_segment(*args))
            ys += y
        return S, ys

    S, _ = scan(x.new_zeros(B, chunks, d_state, d_inner))                      # 1.
    chunk_decay = torch.exp2(dc.sum(2)[:, :, None] * A2)     # (B, chunks, d_state, d_inner)
    carry = x.new_zeros(B, d_state, d_inner) if state is None else state.transpose(1, 2)
    entering = []
    for i in range(chunks):                                                   # 2.
        entering.append(carry)
        carry = torch.addcmul(S[:, i], chunk_decay[:, i], carry)
    Cc = Cm.view(B, chunks, chunk, d_state).transpose(1, 2).contiguous()
    # Cc (B, chunk, chunks, d_state)
    _, y = scan(torch.stack(entering, 1), Cc)                                  # 3.
    y = torch.cat(y, 2).view(B, Tp, d_inner)                              # (B, T, d_inner)
    return (y + skip * x)[:, :T], carry.transpose(1, 2)


SCAN_IMPLS = {"fast": selective_scan_chunked, "reference": selective_scan_sequential}


class Mamba(Mixer):
    """The Mamba block: in_proj to (x, z); short causal depthwise conv and SiLU on x;
    input-dependent Δ = softplus(dt_proj(x W_Δ) + dt_bias), Bm_t, C_t; the selective scan;
    y ⊙ SiLU(z); out_proj. Defaults as Mamba's: expand 2, d_state = 16 (Mamba's N),
    conv 4, dt_rank = ⌈d/16⌉.

    Initialised as Mamba initialises itself (Gu & Dao's mamba_simple.py, which the official
    zoology/mixers/mamba.py copies): A S4D-real (A[:, j] = -(j+1)), skip = 1 (Mamba's D), Δ
    log-uniform in [1e-3, 1e-1] through dt_bias = softplus⁻¹(Δ), dt_proj's weight
    U(±dt_rank^-1/2), the conv as PyTorch draws an nn.Conv1d, in_proj, x_proj and out_proj as
    PyTorch draws an nn.Linear. `keeps_own_init`: a model's default initialisation leaves all
    of it alone, and so does init="gpt2" with the Mamba block, as the official model does
    (its MambaBlock branch only rescales out_proj; train.init_weights). dt_bias is a
    separate parameter rather than dt_proj's bias (the official code marks that bias
    `_no_reinit` for the same reason).
    State of `step`: S (d_inner, d_state) and the last conv inputs:
    d_inner·(d_state + min(t, d_conv - 1)).
    To copy: this class, SCAN_IMPLS (selective_scan_chunked with _scan_segment and
    SCAN_SEGMENT, selective_scan_sequential, with _pad_to_chunks), causal_conv with
    CONV_IMPLS (causal_conv_direct, causal_conv_fft, causal_conv_fast, SHORT_FILTER),
    conv1d_init_, Mixer, check_choice and check_positive.
    """

    keeps_own_init = True

    def __init__(self, d_model, seq_len, d_state=16, expand=2, d_conv=4, dt_rank=None,
                 impl="fast", chunk_size=64):
        super().__init__()
        dt_rank = math.ceil(d_model / 16) if dt_rank is None else dt_rank
        for name, value in (("d_state", d_state), ("expand", expand), ("d_conv", d_conv),
                            ("dt_rank", dt_rank), ("chunk_size", chunk_size)):
            check_positive(name, value)
        check_choice("impl", impl, tuple(SCAN_IMPLS))
        d_inner = expand * d_model
        self.impl, self.chunk_size, self.d_state = impl, chunk_size, d_state
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(d_inner, d_conv))
        self.conv_bias = nn.Parameter(torch.empty(d_inner))
        conv1d_init_(self.conv_weight, self.conv_bias, fan_in=d_conv)
        self.x_proj = nn.Linear(d_inner, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, d_inner, bias=False)
        nn.init.uniform_(self.dt_proj.weight, -dt_rank ** -0.5, dt_rank ** -0.5)
        dt = torch.exp(torch.rand(d_inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))       # softplus⁻¹(dt)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(d_inner, 1))
        self.skip = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def _ssm_inputs(self, xc):
        """xc (..., d_inner) after conv and SiLU -> Δ (..., d_inner), Bm_t, C_t (..., d_state)."""
        dt, Bm, Cm = self.x_proj(xc).split(
            [self.dt_proj.in_features, self.d_state, self.d_state], dim=-1)
        return F.softplus(self.dt_proj(dt) + self.dt_bias), Bm, Cm

    def _mix(self, x, state, scan):
        """x (B, T, d) after `state` (None: the start), by `scan`: (y, the new state)."""
        S, past = (None, None) if state is None else state
        xi, z = self.in_proj(x).chunk(2, dim=-1)                              # (B, T, d_inner)
        xc, past = causal_conv(xi, self.conv_weight, state=past)
        xc = F.silu(xc + self.conv_bias)
        delta, Bm, Cm = self._ssm_inputs(xc)
        A = -torch.exp(self.A_log)                                      # (d_inner, d_state)
        y, S = scan(xc, delta, A, Bm, Cm, self.skip, S, self.chunk_size)
        return self.out_proj(y * F.silu(z)), (S, past)

    def forward(self, x):
        return self._mix(x, None, SCAN_IMPLS[self.impl])[0]

    def step(self, x_t, state=None):
        y, state = self._mix(x_t[:, None], state, selective_scan_sequential)
        return y[:, 0], state

    def state_size(self, t):
        d_inner, K = self.conv_weight.shape
        return d_inner * (self.d_state + min(t, K - 1)) if t else 0


# ----------------------------------------------------------------------------------------
# Selective attention (Section 5)
#
# y[i] = f(u)[i] · W_o softmax(q_i Kᵀ/√hs) V, where f(u) ∈ {0, 1}^T chooses the rows
# (programmatically, learned or at random: SelectiveAttention). Every key stays in the
# cache: f only decides which rows (queries) produce output.
# This reference computes every row and then zeroes the unselected ones; the saving the
# paper is after (attention on a budget of rows only) is not realised here.


def programmatic_selection(tokens):
    """f[:, i] = 1 iff tokens[:, i] == tokens[:, j] for some j < i. tokens (B, T) -> bool.

    Materializes (B, T, T).
    """
    seen = (tokens[:, :, None] == tokens[:, None, :]).tril(-1)                # (B, T, T)
    return seen.any(-1)


def first_repeats(tokens, budget):
    """f[:, i] = 1 iff tokens[:, i] is the second occurrence of its token, and fewer than
    `budget` such rows came before i: attention once per recalled token, on a budget of
    rows. Causal. tokens (B, T) -> bool. On MQAR with a filler these are the queries (one
    per key-value pair) and the filler's second occurrence, not the filler's every repeat."""
    earlier = (tokens[:, :, None] == tokens[:, None, :]).tril(-1).sum(-1)    # (B, T)
    second = earlier == 1
    return second & (second.cumsum(-1) <= budget)


def selection_aux_loss(f, budget):
    """(1/N) · max(0, Σ_i f[i] - budget) for each sequence, averaged over the batch. f (B, N)."""
    return torch.relu(f.sum(-1) - budget).mean() / f.shape[-1]


def top_k_rows(scores, budget):
    """The paper's inference rule: keep the `budget` highest-scoring rows of the WHOLE
    sequence.

    Not causal: whether row i is kept depends on the scores of rows after i.
    """
    idx = scores.topk(min(budget, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, idx, True)


class SelectiveAttention(Mixer):
    """Attention whose output rows are kept only where f(u)[i] = 1 (Section 5).

    selection="learned" (default) gates with σ(u·gate + gate_bias). In training the gate is
    soft (the row is multiplied by σ) and forward sets `aux_loss` to
    aux_weight·(1/N)·max(0, Σ σ - top_k) for the training loop to add. At inference the row
    is kept iff σ > 0.5 (inference="threshold", the default): causal, so step == forward.
    inference="topk" is the paper's rule, the top_k rows of the whole sequence; it is NOT
    causal (a row's fate depends on later scores), so `step` refuses it. gate_bias starts at
    +2 (σ ≈ 0.88: every row on, as attention) and is a separate parameter so a model's
    "biases 0" initialisation leaves it alone. top_k defaults to N/4, aux_weight to 1. The
    official code's learned selection is experiments/official.py's OfficialSelectiveAttention
    (form="official").
    selection="programmatic" needs the token ids (`takes_tokens`). It keeps every row whose
    token appeared before (on MQAR with the filler 0: every row after the context but the
    filler's first, N - 2D - 1 of N), or, given top_k, the first repeat of each token, the
    first top_k of them (first_repeats): "attention on a few rows", to set against "on
    almost every row".
    selection="random" is the control of Section 5: for every example a fresh, uniformly
    random set of exactly top_k rows (default N/4), drawn from torch's generator at each
    forward (in `step`, at the first token, for the whole sequence), so that it matches the
    selection it controls in the number of rows and differs in what chooses them. It is
    causal because the rows do not depend on the tokens at all; a count matched to
    another selection example by example could not be (that count depends on the whole
    example), which is why the count is a setting: N - 2D - 1 matches programmatic
    selection on MQAR.
    State of `step`: the KV cache, 2·t·d numbers, plus the t token ids for "programmatic"
    (and the count of rows kept, with a budget), the seq_len drawn rows for "random".
    To copy: this class, top_k_rows, selection_aux_loss, programmatic_selection, first_repeats
    and Attention with what its line names.
    """

    takes_tokens = True
    selected = None     # after a forward: the rows it kept, (B, T) (train.selected_rows)
    # uses_positions stays False: in train.py's CPU recipe (N=64, D=4, d=64, 1000 steps, seed 0)
    # a pure selective-attention model reached 0.860 without positions, 0.242 with learned ones

    def __init__(self, d_model, seq_len, num_heads=1, selection="learned", top_k=None,
                 inference="threshold", aux_weight=1.0, impl="fast"):
        super().__init__()
        check_choice("selection", selection, ("learned", "programmatic", "random"))
        check_choice("inference", inference, ("threshold", "topk"))
        if top_k is not None:
            check_positive("top_k", top_k)
        if not aux_weight >= 0:
            raise ValueError(f"aux_weight={aux_weight!r} is not allowed: it must be >= 0")
        self.selection, self.inference = selection, inference
        self.top_k, self.aux_weight, self.seq_len = top_k, aux_weight, seq_len
        self.attention = Attention(d_model, seq_len, num_heads=num_heads, impl=impl)
        if selection == "learned":     # the other rules have no parameters of their own
            self.gate = nn.Parameter(torch.zeros(d_model))
            self.gate_bias = nn.Parameter(torch.tensor(2.0))

    def _budget(self, T):
        """The row budget for a sequence of T: top_k, else N/4."""
        return self.top_k if self.top_k is not None else max(1, T // 4)

    def _gate(self, x):
        return torch.sigmoid(x @ self.gate + self.gate_bias)                # (B, T) or (B,)

    def random_rows(self, B, device):
        """A fresh, uniformly random set of exactly top_k of the seq_len rows for each of B
        examples: (B, seq_len) bool."""
        return top_k_rows(torch.rand(B, self.seq_len, device=device),
                          self._budget(self.seq_len))

    def selection_mask(self, x, tokens=None):
        """f(u) for a whole sequence x (B, T, d): (B, T), soft in learned training mode.
        Returns (f, the weighted auxiliary loss, None but for the learned selection)."""
        B, T, d = x.shape
        if self.selection == "programmatic":
            if tokens is None:
                raise ValueError("tokens=None is not allowed with selection='programmatic': "
                                 "pass the token ids, forward(x, tokens=(B, T) ids)")
            f = (programmatic_selection(tokens) if self.top_k is None
                 else first_repeats(tokens, self.top_k))
            return f.to(x.dtype), None
        if self.selection == "random":
            if T > self.seq_len:
                raise ValueError(f"T={T} is not allowed: the random rows are drawn for "
                                 f"seq_len={self.seq_len} positions")
            return self.random_rows(B, x.device)[:, :T].to(x.dtype), None
        f, budget = self._gate(x), self._budget(T)
        aux_loss = self.aux_weight * selection_aux_loss(f, budget)
        if self.training:
            return f, aux_loss
        keep = top_k_rows(f, budget) if self.inference == "topk" else f > 0.5
        return keep.to(x.dtype), aux_loss

    def forward(self, x, tokens=None):
        f, self.aux_loss = self.selection_mask(x, tokens)
        self.selected = f.detach()                 # the last forward's rows (train.py counts)
        return self.attention(x) * f[..., None]

    def step(self, x_t, state=None, token=None):
        if self.selection == "learned" and self.inference == "topk":
            raise ValueError("inference='topk' is not allowed in step: the whole-sequence "
                             "top-k is not causal; use inference='threshold'")
        y, kv = self.attention.step(x_t, None if state is None else state[:2])
        t = kv[0].shape[2] - 1                                               # this position
        if self.selection == "programmatic":
            if token is None:
                raise ValueError("token=None is not allowed with selection='programmatic': "
                                 "pass the token id, step(x_t, state, token=(B,) ids)")
            past = token.new_zeros(token.shape[0], 0) if state is None else state[2]
            tokens = torch.cat([past, token[:, None]], 1)
            if self.top_k is None:
                f = (past == token[:, None]).any(-1)
                return y * f[:, None].to(y.dtype), (*kv, tokens)
            kept = token.new_zeros(token.shape[0]) if state is None else state[3]  # (B,)
            f = ((past == token[:, None]).sum(-1) == 1) & (kept < self.top_k)
            return y * f[:, None].to(y.dtype), (*kv, tokens, kept + f)
        if self.selection == "random":
            if t >= self.seq_len:
                raise ValueError(f"position {t} is not allowed: the random rows are drawn "
                                 f"for seq_len={self.seq_len} positions")
            rows = self.random_rows(x_t.shape[0], x_t.device) if state is None else state[2]
            return y * rows[:, t, None].to(y.dtype), (*kv, rows)
        f = self._gate(x_t)
        if not self.training:
            f = (f > 0.5).to(y.dtype)
        return y * f[:, None], kv

    def state_size(self, t):
        d = self.attention.out_proj.in_features
        if t == 0:
            return 0
        if self.selection == "programmatic":
            return 2 * t * d + t + (self.top_k is not None)         # token ids (and count)
        return 2 * t * d + (self.seq_len if self.selection == "random" else 0)


# ----------------------------------------------------------------------------------------
# BaseConv with input-dependent filters (Thm 4.5, appendix H.8; Figure 2's lower rows)
#
# Thm 4.5 solves MQAR with O(1) BaseConv layers whose filters depend on the input: for each
# distance s of a set S, the shift filters X^s and X^{s-1} bring the token s back and the
# token after it to position i, a gate multiplies the first with u_i, a projection sums
# that match over the channels and a second gate puts it on the second:
#   y_i = Σ_{s ∈ S_i} (q_i · k_{i-s}) v_{i-s+1}
# theory.mqar_input_dependent_layers builds it with one-hot q = k = v = u. The trainable
# layer learns q, k, v and an output projection, scales the match by 1/√d as attention
# does, and averages over the |S_i| distances that reach back into the sequence (s <= i),
# so that a row with many matches stays on scale. Two rules choose S_i from the token ids:
#   programmatic     the distances at which u_i occurred before: {s >= 1 : u_{i-s} = u_i}
#   autocorrelation  the num_lags lags of largest autocorrelation r_i(s) = #{j <= i : u_j = u_{j-s}}
#                    (ties to the smaller lag), the rule H.8 proposes, over the prefix
#                    u_0..u_i so that the layer stays causal; at the last position it is
#                    the whole sequence's rule (theory.top_lags).
# The filler token repeats at every lag, so the top lags of an MQAR sequence with filler 0
# need not be the key-query distances (the H.8 erratum that theory.check_thm_4_5 shows).

def chosen_keys(tokens, filters, num_lags):
    """S_i by key position, (B, T, T) bool: chosen[:, i, j] iff the lag i - j is in S_i
    (so j < i). Programmatic: u_j = u_i. Autocorrelation: the lags are counted and ranked
    as lags (r_i(s) over s = 1..i), then put back at their key positions j = i - s."""
    B, T = tokens.shape
    i = torch.arange(T, device=tokens.device)
    earlier = i[None, :] < i[:, None]                                        # j < i
    same = (tokens[:, :, None] == tokens[:, None, :]) & earlier              # u_j = u_i
    if filters == "programmatic":
        return same
    flip = (i[:, None] - i[None, :]).clamp(min=0).expand(B, T, T)           # [i, x] = i - x
    reach = (i[None, :] <= i[:, None]) & (i[None, :] >= 1)                   # lags 1 <= s <= i
    hits = same.gather(2, flip) & reach                                      # [:, i, s]
    r = hits.long().cumsum(1).masked_fill(~reach, -1)                       # r_i(s), s <= i
    top = torch.argsort(-r, dim=-1, stable=True)[..., :num_lags]           # ties: smaller s
    lags = torch.zeros_like(hits).scatter(-1, top, True) & reach
    return lags.gather(2, flip) & earlier                                    # [:, i, j]


def input_dependent_conv_reference(q, k, v, chosen):
    """Thm 4.5's layers, one shift per lag: match_s = Σ_a q^a ⊙ shift_down(k, s)^a, gated
    onto shift_down(v, s - 1), summed over the chosen lags and averaged.

    q, k, v: (B, T, d); chosen: (B, T, T) bool by key position (chosen_keys), so lag s of
    row i is chosen[:, i, i - s], the s-th diagonal below the main one. Returns (B, T, d).
    """
    T, d = q.shape[1], q.shape[2]
    y = torch.zeros_like(v)
    for s in range(1, T):
        match = (q[:, s:] * k[:, :T - s]).sum(-1) / math.sqrt(d)           # (B, T - s)
        lag_s = torch.diagonal(chosen, -s, dim1=1, dim2=2)                   # [i - s] for i >= s
        y[:, s:] += (match * lag_s)[..., None] * v[:, 1:T - s + 1]
    return y / chosen.sum(-1, keepdim=True).clamp(min=1)


def input_dependent_conv_fast(q, k, v, chosen):
    """The same as one masked product: weights[i, j] = q_i·k_j/√d where chosen[i, j] (the
    lag i - j is in S_i); y = weights · v_next / |S_i|. Materializes (B, T, T)."""
    d = q.shape[2]
    weights = (q @ k.transpose(1, 2) / math.sqrt(d)) * chosen                # (B, T, T)
    v_next = F.pad(v[:, 1:], (0, 0, 0, 1))                                   # v_{j+1}
    return weights @ v_next / chosen.sum(-1, keepdim=True).clamp(min=1)


INPUT_DEPENDENT_CONV_IMPLS = {"fast": input_dependent_conv_fast,
                              "reference": input_dependent_conv_reference}


class InputDependentConv(Mixer):
    """BaseConv with input-dependent filters: Thm 4.5's layer with learned projections.

    y = W_o (Σ_{s ∈ S_i} (q_i·k_{i-s}/√d) v_{i-s+1}) / |S_i|, q, k, v = x W_q, x W_k, x W_v,
    S_i chosen from the token ids by `filters` ("programmatic" or "autocorrelation", see the
    section's comment). num_lags: how many lags the autocorrelation rule keeps (Thm 4.5's t
    distinct interaction distances; "programmatic" does not use it). The paper gives no
    trainable form of this layer and the official code has none, so Figure 2's lower rows
    are rebuilt here (experiments/README.md, "Figure 2 at cpu scale"). forward(x, tokens) and
    step(x_t, state, token) take the token ids, as selective attention does.
    State of `step` after t tokens: the keys and values (2·t·d numbers), the t token ids,
    and for "autocorrelation" the counts r(s) of the lags 1..t-1.
    To copy: this class, INPUT_DEPENDENT_CONV_IMPLS (input_dependent_conv_fast,
    input_dependent_conv_reference), chosen_keys, Mixer, check_choice and check_positive.
    """

    takes_tokens = True

    def __init__(self, d_model, seq_len, filters="programmatic", num_lags=8, impl="fast"):
        super().__init__()
        check_choice("filters", filters, ("programmatic", "autocorrelation"))
        check_positive("num_lags", num_lags)
        check_choice("impl", impl, tuple(INPUT_DEPENDENT_CONV_IMPLS))
        self.filters, self.num_lags, self.impl = filters, num_lags, impl
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, tokens=None):
        if tokens is None:
            raise ValueError("tokens=None is not allowed: input_dependent_conv chooses its "
                             "filters from the token ids, forward(x, tokens=(B, T) ids)")
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        chosen = chosen_keys(tokens, self.filters, self.num_lags)
        return self.out_proj(INPUT_DEPENDENT_CONV_IMPLS[self.impl](q, k, v, chosen))

    def step(self, x_t, state=None, token=None):
        if token is None:
            raise ValueError("token=None is not allowed: input_dependent_conv chooses its "
                             "filters from the token ids, step(x_t, state, token=(B,) ids)")
        q, k, v = self.qkv(x_t).chunk(3, dim=-1)                              # (B, d) each
        B, d = q.shape
        if state is None:
            empty, none = q.new_zeros(B, 0, d), token.new_zeros(B, 0)
            state = (empty, empty, none) + ((none,) if self.filters != "programmatic" else ())
        keys, values, past, *counts = state           # after t tokens; counts: lags 1..t-1
        t = past.shape[1]
        hits = (past == token[:, None]).flip(1)                  # [s - 1] = (u_t = u_{t-s})
        if self.filters == "programmatic":
            chosen = hits
        else:
            counts = [F.pad(counts[0], (0, t - counts[0].shape[1])) + hits]    # r_t(s), s <= t
            top = torch.argsort(-counts[0], dim=-1, stable=True)[:, :self.num_lags]
            chosen = torch.zeros_like(hits).scatter(-1, top, True)
        match = (keys.flip(1) @ q[:, :, None])[..., 0] / math.sqrt(d)      # [s - 1]: k_{t-s}
        v_after = torch.cat([values[:, 1:], v[:, None]], 1).flip(1)       # [s - 1]: v_{t-s+1}
        y = ((match * chosen)[..., None] * v_after).sum(1)
        y = self.out_proj(y / chosen.sum(-1, keepdim=True).clamp(min=1))
        keys, values = torch.cat([keys, k[:, None]], 1), torch.cat([values, v[:, None]], 1)
        return y, (keys, values, torch.cat([past, token[:, None]], 1), *counts)

    def state_size(self, t):
        d = self.out_proj.in_features
        return 2 * t * d + t + (max(t - 1, 0) if self.filters == "autocorrelation" else 0)


# ----------------------------------------------------------------------------------------
# GLA, gated linear attention (Yang et al., 2024, "Gated Linear Attention Transformers with
# Hardware-Efficient Training", §4)
#
# S_t = Diag(α_t) S_{t-1} + k_tᵀ v_t,   o_t = q_t S_t       per head: S (dk, dv), α_t (dk,)
# log α_t = logsigmoid(x_t W_α1 W_α2 + b_α) / 16            (a low-rank gate, §4.4)
# Every form takes (q, k, v, log_alpha, state=None, chunk_size): q, k, log_alpha
# (B, H, T, dk), v (B, H, T, dv), state S (B, H, dk, dv) before the first position (None: 0);
# chunk_size is the chunked form's. Each returns (o, S after the last position). The
# module scales q by dk^-1/2 before (as flash-linear-attention does).


def gla_recurrent(q, k, v, log_alpha, state=None, chunk_size=None):
    """The recurrence as written, one position at a time (T Python steps)."""
    B, H, T, dk = q.shape
    S = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        S = log_alpha[:, :, t, :, None].exp() * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(out, 2), S                                            # (B, H, T, dv)


def gla_chunked(q, k, v, log_alpha, state=None, chunk_size=8):
    """The chunked form: inside a chunk of `chunk` positions,
    o_i = Σ_{j<=i} (Σ_ch q_i[ch] k_j[ch] e^{Λ_i[ch] - Λ_j[ch]}) v_j with Λ the running sum
    of log α from the chunk's start; across the chunks the state, read as (q_i ⊙ e^{Λ_i}) S
    and carried as S ← e^{Λ_end} ⊙ S + Σ_j (k_j ⊙ e^{Λ_end - Λ_j})ᵀ v_j, Λ_end the
    chunk's last Λ. Every exponent is <= 0 (a decay), so nothing overflows however strong the gates
    are: the inner products carry the per-channel decay between i and j as a
    (dk, chunk, chunk) table instead of dividing by e^{Λ_j} (which a strong gate sends past
    float range); above the diagonal the table is clamped to 1 and the scores masked. What
    each chunk writes, and what each reads from the state entering it, are batched matrix
    products over all chunks; only the carry of the state, one step a chunk, is a Python
    loop.
    Costs B·H·T·chunk·dk for the table, which is most of this form's time: channel-major, so
    that its element-wise passes run over rows of `chunk`, and built in place.
    """
    chunk = min(chunk_size, q.shape[2])
    (q, T), (k, _), (v, _) = (_pad_to_chunks(t, chunk, 2) for t in (q, k, v))
    log_alpha, _ = _pad_to_chunks(log_alpha, chunk, 2)      # padding: decay 1, input 0
    B, H, Tp, dk = q.shape
    chunks, dv = Tp // chunk, v.shape[-1]
    q, k, log_alpha = (t.view(B, H, chunks, chunk, dk) for t in (q, k, log_alpha))
    v = v.view(B, H, chunks, chunk, dv)
    cum = log_alpha.cumsum(3)                                   # Λ (B, H, chunks, chunk, dk)
    cum_c, qc, kc = (t.transpose(-1, -2).contiguous()
                     for t in (cum, q, k))                      # (B, H, chunks, dk, chunk)
    decay = (cum_c[..., :, None] - cum_c[..., None, :]).clamp_(max=0).exp_()
    scores = (decay * (qc[..., :, None] * kc[..., None, :])).sum(3).tril()  # (.., chunk, chunk)
    o = scores @ v                                                           # within chunks
    read, write = q * cum.exp(), k * (cum[..., -1:, :] - cum).exp()
    written = write.transpose(-1, -2) @ v                               # (B, H, chunks, dk, dv)
    carry = cum[..., -1, :, None].exp()                                 # (B, H, chunks, dk, 1)
    S = q.new_zeros(B, H, dk, dv) if state is None else state
    entering = []
    for i in range(chunks):
        entering.append(S)
        S = torch.addcmul(written[:, :, i], carry[:, :, i], S)
    o = o + read @ torch.stack(entering, 2)                                  # from past chunks
    return o.reshape(B, H, Tp, dv)[:, :, :T], S


GLA_IMPLS = {"fast": gla_chunked, "reference": gla_recurrent}


class GLA(Mixer):
    """Gated linear attention (Yang et al., 2024): per head, the recurrence above with a
    data-dependent decay per key channel, then an RMSNorm of each head's output, a swish
    output gate and an output projection:

        q, k = x W_q, x W_k (d·expand_k channels), v, g = x W_v, x W_g (d·expand_v);
        log α = logsigmoid(x W_α1 W_α2 + b_α) / gate_normalizer (rank gate_rank);
        y = W_o (RMSNorm(o) ⊙ swish(g)).

    The paper's defaults: expand_k 0.5, expand_v 1, 4 heads, rank 16, normalizer 16 (so
    that α starts close to 1: slow forgetting), no short convolution. No bias but the gate's.
    State of `step`: S, H·dk·dv numbers (dk = d·expand_k/H, dv = d·expand_v/H) at every t.
    To copy: this class, GLA_IMPLS (gla_chunked, gla_recurrent, with _pad_to_chunks), Mixer,
    check_choice and check_positive.
    """

    def __init__(self, d_model, seq_len, num_heads=4, expand_k=0.5, expand_v=1.0,
                 gate_rank=16, gate_normalizer=16.0, impl="fast", chunk_size=8):
        super().__init__()
        key_dim, value_dim = int(d_model * expand_k), int(d_model * expand_v)
        for name, value in (("num_heads", num_heads), ("gate_rank", gate_rank),
                            ("chunk_size", chunk_size)):
            check_positive(name, value)
        for name, dim in (("expand_k", key_dim), ("expand_v", value_dim)):
            if dim < 1 or dim % num_heads:
                raise ValueError(f"{name}={expand_k if name == 'expand_k' else expand_v!r} is "
                                 f"not allowed with d_model={d_model}, num_heads={num_heads}: "
                                 f"d_model·{name} = {dim} must be a multiple of num_heads")
        if not gate_normalizer > 0:
            raise ValueError(f"gate_normalizer={gate_normalizer!r} is not allowed: it must "
                             "be > 0")
        check_choice("impl", impl, tuple(GLA_IMPLS))
        self.num_heads, self.impl, self.chunk_size = num_heads, impl, chunk_size
        self.gate_normalizer = gate_normalizer
        self.q_proj = nn.Linear(d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        self.g_proj = nn.Linear(d_model, value_dim, bias=False)
        self.gate_down = nn.Linear(d_model, gate_rank, bias=False)
        self.gate_up = nn.Linear(gate_rank, key_dim)
        self.norm = nn.RMSNorm(value_dim // num_heads, eps=1e-5)
        self.out_proj = nn.Linear(value_dim, d_model, bias=False)

    def _inputs(self, x):
        """x (..., T, d) -> q (scaled by dk^-1/2), k, v, log α as (..., H, T, head dim)."""
        heads = lambda t: t.unflatten(-1, (self.num_heads, -1)).transpose(-2, -3)
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        log_alpha = F.logsigmoid(self.gate_up(self.gate_down(x))) / self.gate_normalizer
        return q * q.shape[-1] ** -0.5, k, v, heads(log_alpha)

    def _output(self, o, x):
        """o (..., H, T, dv) -> y (..., T, d): norm per head, swish gate, projection."""
        o = self.norm(o).transpose(-2, -3).flatten(-2)                       # (..., T, H·dv)
        return self.out_proj(o * F.silu(self.g_proj(x)))

    def forward(self, x):
        o, _ = GLA_IMPLS[self.impl](*self._inputs(x), chunk_size=self.chunk_size)
        return self._output(o, x)

    def step(self, x_t, state=None):
        x = x_t[:, None]                                                     # (B, 1, d)
        o, S = gla_recurrent(*self._inputs(x), None if state is None else state[0])
        return self._output(o, x)[:, 0], (S,)

    def state_size(self, t):
        H = self.num_heads
        return H * (self.q_proj.out_features // H) * (self.v_proj.out_features // H) if t else 0


# ----------------------------------------------------------------------------------------
# Mamba-2, the SSD layer (Dao & Gu, 2024, "Transformers are SSMs", §7 and Listing 1)
#
# S_t = e^{Δ_t a} S_{t-1} + Δ_t x_t Bm_tᵀ,   y_t = S_t C_t + skip x_t   per head:
# S (P, d_state) (its paper's h), a = -exp(A_log) one scalar per head (Mamba's is one per
# channel and state), x_t (P,), Bm_t, C_t (d_state,) shared by the heads (one group).
# Both forms take (x, delta, a, Bm, Cm, state=None, chunk_size): x (B, T, H, P), delta
# (B, T, H), a (H,), Bm, Cm (B, T, d_state), state S (B, H, P, d_state) before the first
# position (None: 0). Each returns (y without the skip term, S after the last position).


def ssd_recurrent(x, delta, a, Bm, Cm, state=None, chunk_size=None):
    """The recurrence as written, one position at a time (T Python steps)."""
    B, T, H, P = x.shape
    S = x.new_zeros(B, H, P, Bm.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        decay = torch.exp(delta[:, t] * a)[:, :, None, None]                 # (B, H, 1, 1)
        S = decay * S + (delta[:, t, :, None] * x[:, t])[..., None] * Bm[:, t, None, None, :]
        out.append(S @ Cm[:, t, None, :, None])                               # (B, H, P, 1)
    return torch.cat(out, -1).permute(0, 3, 1, 2), S                          # (B, T, H, P)


def ssd_chunked(x, delta, a, Bm, Cm, state=None, chunk_size=64):
    """The SSD algorithm (Listing 1): a scalar decay per head makes a chunk's map a masked
    attention, y_i = Σ_{j<=i} (C_i·Bm_j) e^{Λ_i - Λ_j} Δ_j x_j with Λ the running sum of Δa,
    computed as matrix products; the state carries across the chunks (one Python step a
    chunk), read as e^{Λ_i} C_i S and updated as
    e^{Λ_end} S + Σ_j e^{Λ_end - Λ_j} Δ_j x_j Bm_jᵀ, Λ_end the chunk's last Λ. Every exponent
    is <= 0. Costs B·H·T·chunk·(d_state + P) inside chunks of `chunk` positions and
    2·B·H·T·P·d_state across them."""
    chunk = min(chunk_size, x.shape[1])
    (x, T), (delta, _), (Bm, _), (Cm, _) = (_pad_to_chunks(t, chunk, 1)
                                            for t in (x, delta, Bm, Cm))
    B, Tp, H, P = x.shape
    chunks, d_state = Tp // chunk, Bm.shape[-1]
    u = (delta[..., None] * x).view(B, chunks, chunk, H, P).permute(0, 3, 1, 2, 4)
    cum = (delta * a).view(B, chunks, chunk, H).permute(0, 3, 1, 2).cumsum(-1)        # Λ
    Bc, Cc = Bm.view(B, 1, chunks, chunk, d_state), Cm.view(B, 1, chunks, chunk, d_state)
    below = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    decay = torch.where(below, cum[..., :, None] - cum[..., None, :], -math.inf).exp()
    y = ((Cc @ Bc.transpose(-1, -2)) * decay) @ u                     # (B, H, chunks, chunk, P)
    write = (cum[..., -1:] - cum).exp()[..., None] * u                # (B, H, chunks, chunk, P)
    S = x.new_zeros(B, H, P, d_state) if state is None else state
    past = []
    for i in range(chunks):
        past.append(cum[:, :, i, :, None].exp() * (Cc[:, :, i] @ S.transpose(-1, -2)))
        S = cum[:, :, i, -1, None, None].exp() * S + write[:, :, i].transpose(-1, -2) @ Bc[:, :, i]
    y = y + torch.stack(past, 2)
    return y.permute(0, 2, 3, 1, 4).reshape(B, Tp, H, P)[:, :T], S


SSD_IMPLS = {"fast": ssd_chunked, "reference": ssd_recurrent}


class Mamba2(Mixer):
    """The Mamba-2 layer (Dao & Gu, 2024; mamba_ssm's Mamba2Simple): one projection to
    (z, x, Bm, C, Δ); a short causal depthwise convolution and SiLU on (x, Bm, C); Δ =
    softplus(Δ + dt_bias) per head; the SSD recurrence above with skip; RMSNorm(y ⊙ SiLU(z))
    (norm after the gate, as Mamba2Simple); an output projection.

    Defaults: expand 2, d_state 64, headdim 64 (H = expand·d / headdim heads; None: 64, or
    d_inner where that is smaller), conv 4, one group of Bm and C. Initialised as
    Mamba2Simple: a = -U(1, 16) per head, Δ log-uniform in [1e-3, 1e-1] through dt_bias, skip = 1,
    the conv as PyTorch draws an nn.Conv1d; no biases in the projections. `keeps_own_init`:
    a model's default initialisation leaves it so.
    State of `step`: S, H·P·d_state numbers, and the last conv inputs,
    min(t, d_conv - 1)·(d_inner + 2·d_state).
    To copy: this class, SSD_IMPLS (ssd_chunked, ssd_recurrent, with _pad_to_chunks),
    causal_conv with CONV_IMPLS (causal_conv_direct, causal_conv_fft, causal_conv_fast,
    SHORT_FILTER), conv1d_init_, Mixer, check_choice and check_positive.
    """

    keeps_own_init = True

    def __init__(self, d_model, seq_len, d_state=64, expand=2, headdim=None, d_conv=4,
                 impl="fast", chunk_size=64):
        super().__init__()
        d_inner = expand * d_model if isinstance(expand, int) else 0
        headdim = min(64, d_inner) if headdim is None and d_inner > 0 else headdim
        for name, value in (("d_state", d_state), ("expand", expand), ("headdim", headdim),
                            ("d_conv", d_conv), ("chunk_size", chunk_size)):
            check_positive(name, value)
        if d_inner % headdim:
            raise ValueError(f"headdim={headdim} is not allowed with d_model={d_model}, "
                             f"expand={expand}: it must divide d_inner = {d_inner}")
        check_choice("impl", impl, tuple(SSD_IMPLS))
        H = d_inner // headdim
        self.impl, self.chunk_size, self.d_state, self.headdim = impl, chunk_size, d_state, headdim
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * d_state + H, bias=False)
        conv_dim = d_inner + 2 * d_state
        self.conv_weight = nn.Parameter(torch.empty(conv_dim, d_conv))
        self.conv_bias = nn.Parameter(torch.empty(conv_dim))
        conv1d_init_(self.conv_weight, self.conv_bias, fan_in=d_conv)
        dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))       # softplus⁻¹(dt)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1, 16)))
        self.skip = nn.Parameter(torch.ones(H))
        self.norm = nn.RMSNorm(d_inner, eps=1e-5)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def _mix(self, u, state, scan):
        """u (B, T, d) after `state` (None, or (S, the conv's past inputs)): (y, new state)."""
        d_inner = self.out_proj.in_features
        z, xBC, dt = self.in_proj(u).split([d_inner, d_inner + 2 * self.d_state,
                                            self.skip.shape[0]], dim=-1)
        xBC, past = causal_conv(xBC, self.conv_weight, state=None if state is None else state[1])
        x, Bm, Cm = F.silu(xBC + self.conv_bias).split([d_inner, self.d_state, self.d_state], -1)
        x = x.unflatten(-1, (-1, self.headdim))                              # (B, T, H, P)
        delta = F.softplus(dt + self.dt_bias)                                # (B, T, H)
        y, S = scan(x, delta, -torch.exp(self.A_log), Bm, Cm,
                    None if state is None else state[0], chunk_size=self.chunk_size)
        y = (y + self.skip[:, None] * x).flatten(-2)                         # (B, T, d_inner)
        return self.out_proj(self.norm(y * F.silu(z))), (S, past)

    def forward(self, x):
        return self._mix(x, None, SSD_IMPLS[self.impl])[0]

    def step(self, x_t, state=None):
        y, state = self._mix(x_t[:, None], state, ssd_recurrent)
        return y[:, 0], state

    def state_size(self, t):
        d_inner = self.out_proj.in_features
        conv = min(t, self.conv_weight.shape[1] - 1) * self.conv_weight.shape[0]
        return d_inner * self.d_state + conv if t else 0


# ----------------------------------------------------------------------------------------
# DeltaNet and Gated DeltaNet (Schlag et al., 2021; Yang et al., 2024, "Parallelizing
# Linear Transformers with the Delta Rule"; Yang et al., 2025, "Gated Delta Networks")
#
# S_t = α_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t   per head: S (dk, dv)
# (α_t = 1: DeltaNet). With e_t = β_t (v_t - (α_t S_{t-1})ᵀ k_t) the update is
# S_t = α_t S_{t-1} + k_t e_tᵀ: each step writes the correction e_t of what the state
# recalls for k_t. Both forms take (q, k, v, beta, log_alpha, state=None, chunk_size): q, k
# (B, H, T, dk), v (B, H, T, dv), beta, log_alpha (B, H, T) (log_alpha None: DeltaNet),
# state S (B, H, dk, dv) before the first position (None: 0). Each returns (o, S after the
# last position). The layers scale q by dk^-1/2 before (as flash-linear-attention does).


def delta_rule_recurrent(q, k, v, beta, log_alpha=None, state=None, chunk_size=None):
    """The recurrence as written, one position at a time (T Python steps)."""
    B, H, T, dk = q.shape
    S = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        if log_alpha is not None:
            S = log_alpha[:, :, t, None, None].exp() * S
        k_t = k[:, :, t]
        e_t = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, k_t))
        S = S + k_t[..., None] * e_t[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))
    return torch.stack(out, 2), S                                            # (B, H, T, dv)


def delta_rule_chunked(q, k, v, beta, log_alpha=None, state=None, chunk_size=16):
    """The chunkwise form (the WY representation of Yang et al., 2024, with the gate of
    Yang et al., 2025). In a chunk of `chunk` positions, with Λ the running sum of log α from
    its start and S_0 the state entering it, the corrections E (rows e_t) solve a unit
    lower-triangular system,
        (I + diag(β) G) E = diag(β) (V - diag(e^Λ) K S_0),  G_jm = e^{Λ_j - Λ_m} k_j·k_m (m < j),
    so E = E_v - E_k S_0 (E_v, E_k: one triangular solve for all chunks at once); then
        O = P E + diag(e^Λ) Q S_0,   P_im = e^{Λ_i - Λ_m} q_i·k_m (m <= i),
        S_end = e^{Λ_end} S_0 + (K ⊙ e^{Λ_end - Λ})ᵀ E,   Λ_end the chunk's last Λ.
    Only the state's carry runs chunk by chunk (one Python step of matrix products a
    chunk); what each chunk reads from the state entering it is one batched product after.
    Every exponent is <= 0 (above the diagonal, clamped to 1 and masked). Costs
    B·H·T·chunk·(dk + dv) for the chunks' matrices and the solve.
    """
    chunk = min(chunk_size, q.shape[2])
    (q, T), (k, _), (v, _) = (_pad_to_chunks(t, chunk, 2) for t in (q, k, v))
    beta, _ = _pad_to_chunks(beta, chunk, 2)                 # padding: β = 0, nothing written
    B, H, Tp, dk = q.shape
    chunks, dv = Tp // chunk, v.shape[-1]
    q, k = q.view(B, H, chunks, chunk, dk), k.view(B, H, chunks, chunk, dk)
    v, beta = v.view(B, H, chunks, chunk, dv), beta.view(B, H, chunks, chunk, 1)
    G, P = k @ k.transpose(-1, -2), q @ k.transpose(-1, -2)       # (B, H, chunks, chunk, chunk)
    if log_alpha is None:                                  # no gate: every decay is 1
        gated_q, gated_k, write = q, k, k.transpose(-1, -2)
    else:
        cum = _pad_to_chunks(log_alpha, chunk, 2)[0].view(B, H, chunks, chunk).cumsum(-1)  # Λ
        decay = (cum[..., :, None] - cum[..., None, :]).clamp_(max=0).exp_()  # e^{Λ_i - Λ_m}
        G, P = decay * G, decay * P
        gated_q, gated_k = cum.exp()[..., None] * q, cum.exp()[..., None] * k
        write = (k * (cum[..., -1:] - cum).exp()[..., None]).transpose(-1, -2)
        carry = cum[..., -1, None, None].exp()                          # (B, H, chunks, 1, 1)
    # I + diag(β) G: a unit lower-triangular solve reads only below the diagonal, so G's
    # diagonal and upper half stay as they are
    E_v, E_k = torch.linalg.solve_triangular(beta * G, beta * torch.cat([v, gated_k], -1),
                                             upper=False, unitriangular=True).split([dv, dk], -1)
    P = P.masked_fill_(~torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(), 0)
    O0, read = P @ E_v, gated_q - P @ E_k
    S = q.new_zeros(B, H, dk, dv) if state is None else state
    entering = []
    for i in range(chunks):
        entering.append(S)
        update = write[:, :, i] @ (E_v[:, :, i] - E_k[:, :, i] @ S)
        S = S + update if log_alpha is None else torch.addcmul(update, carry[:, :, i], S)
    out = O0 + read @ torch.stack(entering, 2)
    return out.reshape(B, H, Tp, dv)[:, :, :T], S


DELTA_RULE_IMPLS = {"fast": delta_rule_chunked, "reference": delta_rule_recurrent}


class DeltaNet(Mixer):
    """DeltaNet (Yang et al., 2024, as flash-linear-attention's DeltaNet layer): q, k, v
    projections, each through a short causal convolution (K = 4, no bias) and SiLU; q and
    k L2-normalised per head (so that each step's β k kᵀ is a projection, and the state
    stays bounded); β = σ(x W_β) per head; the delta rule above; an RMSNorm of each head's
    output; an output projection. No bias but none: every projection is bias-free.
    State of `step`: S, H·dk·dv numbers (dk = dv = d/H), and the three convolutions' last
    inputs, 3·d·min(t, K - 1).
    To copy: this class, DELTA_RULE_IMPLS (delta_rule_chunked, delta_rule_recurrent, with
    _pad_to_chunks), causal_conv with CONV_IMPLS (causal_conv_direct, causal_conv_fft,
    causal_conv_fast, SHORT_FILTER), conv1d_init_, _at_least_float32, Mixer, check_choice,
    check_divides and check_positive.
    """

    def __init__(self, d_model, seq_len, num_heads=4, conv_size=4, impl="fast",
                 chunk_size=16):
        super().__init__()
        check_divides("num_heads", num_heads, d_model)
        check_positive("conv_size", conv_size)
        check_positive("chunk_size", chunk_size)
        check_choice("impl", impl, tuple(DELTA_RULE_IMPLS))
        self.num_heads, self.impl, self.chunk_size = num_heads, impl, chunk_size
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, d_model, bias=False)
                                                 for _ in range(3))
        self.conv_weight = nn.Parameter(torch.empty(3 * d_model, conv_size))   # q, k, v
        conv1d_init_(self.conv_weight, fan_in=conv_size)
        self.b_proj = nn.Linear(d_model, num_heads, bias=False)
        self.norm = nn.RMSNorm(d_model // num_heads, eps=1e-5)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _log_alpha(self, x):
        return None                                        # DeltaNet: no decay

    def _output(self, o, x):
        return self.norm(o)

    def _mix(self, x, state, rule):
        """x (B, T, d) after `state` (None, or (S, the convolutions' past inputs))."""
        heads = lambda t: t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)
        qkv, past = causal_conv(qkv, self.conv_weight, state=None if state is None else state[1])
        q, k, v = (heads(t) for t in F.silu(qkv).chunk(3, -1))              # (B, H, T, dh)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)                 # (B, H, T)
        log_alpha = self._log_alpha(x)
        # under autocast too: the triangular solve has no bfloat16 kernel
        q, k, v, beta = _at_least_float32(q, k, v, beta)
        o, S = rule(q * q.shape[-1] ** -0.5, k, v, beta, log_alpha,
                    None if state is None else state[0], chunk_size=self.chunk_size)
        o = self._output(o, x).transpose(1, 2).flatten(-2)                   # (B, T, d)
        return self.out_proj(o), (S, past)

    def forward(self, x):
        return self._mix(x, None, DELTA_RULE_IMPLS[self.impl])[0]

    def step(self, x_t, state=None):
        y, state = self._mix(x_t[:, None], state, delta_rule_recurrent)
        return y[:, 0], state

    def state_size(self, t):
        d = self.out_proj.in_features
        return d * d // self.num_heads + min(t, self.conv_weight.shape[1] - 1) * 3 * d if t else 0


class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet (Yang et al., 2025, as flash-linear-attention's GatedDeltaNet layer):
    DeltaNet's layer with a decay per head and step, Mamba-2's,
    log α = -exp(A_log)·softplus(x W_a + dt_bias) (A from U(0, 16), Δ log-uniform in
    [1e-3, 1e-1] through dt_bias), and an output gate: RMSNorm(o) ⊙ SiLU(x W_g).
    State of `step`: as DeltaNet's.
    To copy: this class and DeltaNet with what its line names.
    """

    def __init__(self, d_model, seq_len, num_heads=4, conv_size=4, impl="fast",
                 chunk_size=16):
        super().__init__(d_model, seq_len, num_heads, conv_size, impl, chunk_size)
        self.a_proj = nn.Linear(d_model, num_heads, bias=False)
        self.g_proj = nn.Linear(d_model, d_model, bias=False)
        dt = torch.exp(torch.rand(num_heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))       # softplus⁻¹(dt)
        self.A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(0, 16)))

    def _log_alpha(self, x):
        return (-self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)).transpose(1, 2)

    def _output(self, o, x):
        gate = self.g_proj(x).unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
        return self.norm(o) * F.silu(gate)


# ----------------------------------------------------------------------------------------
# RWKV-7 "Goose" (Peng et al., 2025): a delta rule with a diagonal decay and an in-context
# learning rate
#
# S_t = (Diag(w_t) - κ̂_t (a_t ⊙ κ̂_t)ᵀ) S_{t-1} + k̃_t v_tᵀ,   o_t = S_tᵀ r_t
# per head: S (dk, dv) (the paper's transposed), w_t = e^{log w_t} the decay per key channel,
# κ̂ the L2-normalised removal key, a the in-context learning rate, k̃ the replacement key.
# As a diagonal-plus-low-rank update: S_t = Diag(w_t) S_{t-1} + β_t (αᵀ_t S_{t-1}) + k̃_t v_tᵀ
# with α = -κ̂, β = κ̂ ⊙ a (flash-linear-attention's dplr form). Both forms take
# (r, k, v, log_w, alpha, beta, state=None, chunk_size): r, k, log_w, alpha, beta
# (B, H, T, dk), v (B, H, T, dv), state S (B, H, dk, dv). Each returns (o, S after the last
# position).


def dplr_recurrent(r, k, v, log_w, alpha, beta, state=None, chunk_size=None):
    """The recurrence as written, one position at a time (T Python steps)."""
    B, H, T, dk = r.shape
    S = r.new_zeros(B, H, dk, v.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        recalled = torch.einsum("bhk,bhkv->bhv", alpha[:, :, t], S)          # αᵀ S_{t-1}
        S = (log_w[:, :, t, :, None].exp() * S + beta[:, :, t, :, None] * recalled[:, :, None]
             + k[:, :, t, :, None] * v[:, :, t, None, :])
        out.append(torch.einsum("bhk,bhkv->bhv", r[:, :, t], S))
    return torch.stack(out, 2), S                                            # (B, H, T, dv)


def dplr_chunked(r, k, v, log_w, alpha, beta, state=None, chunk_size=8):
    """The chunkwise form. In a chunk of `chunk` positions, with Λ_i the running sum of log w
    from its start (per key channel) and S_0 the state entering it, the recalled values
    z_j = α_jᵀ S_{j-1} solve a unit lower-triangular system,
        (I - G_αβ) Z = G_αk V + (α ⊙ e^{Λ_{j-1}}) S_0,
    G_αx[j, m] = Σ_ch α_j[ch] x_m[ch] e^{Λ_{j-1}[ch] - Λ_m[ch]} (m < j), so Z = Z_v + Z_α S_0;
    then
        O = G_rβ Z + G_rk V + (r ⊙ e^Λ) S_0,
        G_rx[i, m] = Σ_ch r_i[ch] x_m[ch] e^{Λ_i[ch] - Λ_m[ch]} (m <= i),
        S_end = e^{Λ_end} ⊙ S_0 + Σ_m e^{Λ_end - Λ_m} ⊙ (β_m z_mᵀ + k_m v_mᵀ),
    Λ_end the chunk's last Λ. The pairwise decays are (dk, chunk, chunk) tables, one for the
    rows of G_α· and one for G_r· (a per-channel decay has no rank-1 form that is stable, as
    GLA's); every exponent is <= 0. Only the state runs chunk by chunk.
    """
    chunk = min(chunk_size, r.shape[2])
    (r, T), (k, _), (v, _), (alpha, _), (beta, _) = (_pad_to_chunks(t, chunk, 2)
                                                     for t in (r, k, v, alpha, beta))
    log_w, _ = _pad_to_chunks(log_w, chunk, 2)               # padding: decay 1, nothing written
    B, H, Tp, dk = r.shape
    chunks, dv = Tp // chunk, v.shape[-1]
    r, k, alpha, beta, log_w = (t.view(B, H, chunks, chunk, dk)
                                for t in (r, k, alpha, beta, log_w))
    v = v.view(B, H, chunks, chunk, dv)
    cum = log_w.cumsum(3)                                                    # Λ_i, inclusive
    before = cum - log_w                                                     # Λ_{j-1}
    # channel-major (B, H, chunks, dk, chunk): the tables' element-wise passes run over rows
    rc, kc, ac, bc, gc, pc = (t.transpose(-1, -2).contiguous()
                              for t in (r, k, alpha, beta, cum, before))
    ones = torch.ones(chunk, chunk, dtype=torch.bool, device=r.device)

    # G_y[i, m] = Σ_ch x_i[ch] y_m[ch] e^{gx_i[ch] - Λ_m[ch]} on the mask
    def pairs(xc, gx, mask):
        table = torch.where(mask, gx[..., :, None] - gc[..., None, :], -math.inf).exp_()
        table = table * xc[..., :, None]                    # (B, H, chunks, dk, chunk, chunk)
        return [(table * yc[..., None, :]).sum(3) for yc in (bc, kc)]        # y = β, k

    (G_ab, G_ak), (G_rb, G_rk) = pairs(ac, pc, ones.tril(-1)), pairs(rc, gc, ones.tril())
    # I - G_αβ: a unit lower-triangular solve reads only below the diagonal
    solve = lambda rhs: torch.linalg.solve_triangular(-G_ab, rhs, upper=False,
                                                      unitriangular=True)
    Z_v, Z_alpha = solve(G_ak @ v), solve(alpha * before.exp())        # Z = Z_v + Z_α S_0
    O0, read = G_rb @ Z_v + G_rk @ v, r * cum.exp() + G_rb @ Z_alpha
    fade = (cum[..., -1:, :] - cum).exp()                                    # e^{Λ_end - Λ_m}
    carry = cum[..., -1, :, None].exp()                                 # (B, H, chunks, dk, 1)
    faded_beta, written = (fade * beta).transpose(-1, -2), (fade * k).transpose(-1, -2) @ v
    S = r.new_zeros(B, H, dk, dv) if state is None else state
    out = []
    for i in range(chunks):
        out.append(O0[:, :, i] + read[:, :, i] @ S)
        Z = Z_v[:, :, i] + Z_alpha[:, :, i] @ S
        S = torch.addcmul(written[:, :, i] + faded_beta[:, :, i] @ Z, carry[:, :, i], S)
    return torch.stack(out, 2).reshape(B, H, Tp, dv)[:, :, :T], S


DPLR_IMPLS = {"fast": dplr_chunked, "reference": dplr_recurrent}


class LoRA(nn.Module):
    """x -> (activation(x W_down)) W_up (+ bias): RWKV-7's low-rank maps."""

    def __init__(self, d_in, d_out, rank, activation=None, bias=True):
        super().__init__()
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, d_out, bias=bias)
        self.activation = activation

    def forward(self, x):
        hidden = self.down(x)
        return self.up(hidden if self.activation is None else self.activation(hidden))


class RWKV7(Mixer):
    """RWKV-7 time mixing (Peng et al., 2025), as flash-linear-attention's RWKV7Attention,
    an educational core: no value residual (the first layer's v, mixed into the others' v,
    which needs the model to pass it between layers), no fused kernels.

    Token shift: x_* = x + (x_{t-1} - x) ⊙ μ_* for r, w, k, v, a, g. r, k, v projections;
    log w = -e^{-1/2}·σ(LoRA_w(x_w)) (a decay per key channel, in (e^{-e^{-1/2}}, 1));
    a = σ(LoRA_a(x_a)); κ̂ = L2norm(k ⊙ k_k) per head; k̃ = k ⊙ (1 + (a - 1) ⊙ k_a); the
    recurrence above with α = -κ̂, β = κ̂ ⊙ a; GroupNorm per head; a bonus
    (Σ_ch r ⊙ k̃ ⊙ r_k) v per head; times g = LoRA_g(x_g) (a sigmoid inside); W_o.
    LoRA ranks as fla's (32 at d <= 163). Initialised as fla's first layer (its values
    depend on the layer's depth; ours are layer 0's), over the channels i: the mixes
    1 - (i/d)^power (power 0.2 for r and g, 0.9 for w and a, 0.7 for k and v),
    k_k = 0.71 - 0.1·(i/(d-1) - 1/2), k_a = 1.02, r_k = -0.04, the decay's bias
    -6 + 6i/(d-1) + 1/2 + 2.5·zigzag (zigzag over each head's channels, from -1 to 1,
    squared with its sign), a's bias -0.19 + 0.3·zigzag + 0.4·(i/(d-1) - 1/2), r, k
    (gain 0.1), v orthogonal; the output projection is left as
    PyTorch draws it (fla zeroes it, which leaves every other parameter without a gradient
    at the first step). `keeps_own_init`: a model's default initialisation leaves it so.
    State of `step`: S, H·dk·dv numbers, and the previous input, d.
    To copy: this class, LoRA, DPLR_IMPLS (dplr_chunked, dplr_recurrent, with _pad_to_chunks),
    _at_least_float32, Mixer, check_choice, check_divides and check_positive.
    """

    keeps_own_init = True

    def __init__(self, d_model, seq_len, num_heads=None, head_dim=64, impl="fast",
                 chunk_size=8):
        super().__init__()
        head_dim = d_model // num_heads if num_heads is not None else min(head_dim, d_model)
        check_divides("head_dim", head_dim, d_model)
        check_positive("chunk_size", chunk_size)
        check_choice("impl", impl, tuple(DPLR_IMPLS))
        d, H = d_model, d_model // head_dim
        self.num_heads, self.impl, self.chunk_size = H, impl, chunk_size
        rank = lambda factor: max(32, int(round(factor * d ** 0.5 * head_dim / 64 / 32) * 32))
        self.mix = nn.Parameter(torch.zeros(6, d))                # μ for r, w, k, v, a, g
        self.k_k, self.k_a = nn.Parameter(torch.zeros(d)), nn.Parameter(torch.zeros(d))
        self.r_k = nn.Parameter(torch.zeros(H, head_dim))
        self.r_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d, d, bias=False) for _ in range(4))
        self.w_lora = LoRA(d, d, rank(2.5), torch.tanh)
        self.a_lora = LoRA(d, d, rank(2.5))
        self.g_lora = LoRA(d, d, max(32, int(round(5 * d ** 0.5 / 32) * 32)), torch.sigmoid,
                           bias=False)
        self.norm = nn.GroupNorm(H, d, eps=head_dim * 1e-5)
        i = torch.arange(d, dtype=torch.float32)
        linear = i / max(d - 1, 1) - 0.5
        zigzag = ((i % head_dim) - (head_dim - 1) / 2) / max((head_dim - 1) / 2, 1)
        zigzag = zigzag * zigzag.abs()
        with torch.no_grad():
            powers = torch.tensor([0.2, 0.9, 0.7, 0.7, 0.9, 0.2])[:, None]
            self.mix.copy_(1 - (i / d) ** powers)
            self.k_k.fill_(0.71).sub_(0.1 * linear)
            self.k_a.fill_(1.02), self.r_k.fill_(-0.04)
            self.w_lora.up.bias.copy_(-6 + 6 * (linear + 0.5) + 0.5 + 2.5 * zigzag)
            self.a_lora.up.bias.copy_(-0.19 + 0.3 * zigzag + 0.4 * linear)
        for proj, gain in ((self.r_proj, 1.0), (self.k_proj, 0.1), (self.v_proj, 1.0)):
            nn.init.orthogonal_(proj.weight, gain=gain)

    def _mix(self, x, x_prev, state, rule):
        """x (B, T, d) after the previous inputs x_prev (B, T, d): (y, S after x)."""
        B, T, d = x.shape
        xr, xw, xk, xv, xa, xg = (x + (x_prev - x) * mu for mu in self.mix)
        heads = lambda t: t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
        r, k, v = self.r_proj(xr), self.k_proj(xk), self.v_proj(xv)
        log_w = -math.exp(-0.5) * torch.sigmoid(self.w_lora(xw))
        a = torch.sigmoid(self.a_lora(xa))
        kk = F.normalize(heads(k * self.k_k), dim=-1)                        # κ̂
        k = k * (1 + (a - 1) * self.k_a)                                     # k̃
        r, k, log_w, a = (heads(t) for t in (r, k, log_w, a))
        # under autocast too: the triangular solve has no bfloat16 kernel
        r, k, v, log_w, kk, a = _at_least_float32(r, k, heads(v), log_w, kk, a)
        o, S = rule(r, k, v, log_w, -kk, kk * a, state, chunk_size=self.chunk_size)
        o = self.norm(o.transpose(1, 2).reshape(B * T, d)).view(B, T, d)
        bonus = (r * k * self.r_k[:, None]).sum(-1, keepdim=True) * v        # (B, H, T, dv)
        o = (o + bonus.transpose(1, 2).flatten(-2)) * self.g_lora(xg)
        return self.out_proj(o), S

    def forward(self, x):
        x_prev = F.pad(x, (0, 0, 1, -1))                                     # token shift
        return self._mix(x, x_prev, None, DPLR_IMPLS[self.impl])[0]

    def step(self, x_t, state=None):
        S, x_prev = (None, torch.zeros_like(x_t)) if state is None else state
        y, S = self._mix(x_t[:, None], x_prev[:, None], S, dplr_recurrent)
        return y[:, 0], (S, x_t)

    def state_size(self, t):
        d = self.out_proj.in_features
        return d * d // self.num_heads + d if t else 0


# ----------------------------------------------------------------------------------------
# a mixer of your own, by its path: the one place a string names code (the user's class
# cannot be in MIXERS). "path/to/file.py:Class" (a file, from the current folder) or
# "package.module:Class" (importable from sys.path), built as Class(d_model, seq_len,
# **options) like every mixer here; its facts (Mixer's docstring) default to Mixer's
# (mixer_fact), and `step` and `state_size` are optional (check_mixer says which it has).

def is_outside(name):
    """Whether mixer `name` (as parse_mixer returns it) is a mixer of your own: its name
    holds the source and the class, "source:Class"; a name of MIXERS has no colon."""
    return ":" in name


def source_digest(text):
    """The first 16 hex digits of the SHA-256 of a mixer's source: what a run's identity keeps
    of a mixer of your own, so that a changed file is another run."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_LOADED = {}   # (file, digest of its source) -> its module: a file loads once, again if changed


def _load_file(name, source):
    """The module of file `source`, run from the text whose digest the run keeps."""
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"mixer={name!r} is not allowed: there is no file {source!r} (from "
                         f"{Path.cwd()}); write path/to/file.py:Class")
    text = path.read_text()
    key = (str(path.resolve()), source_digest(text))
    if key not in _LOADED:
        module = types.ModuleType(f"mixer_{path.stem}_{key[1]}")
        module.__file__ = str(path)
        sys.modules[module.__name__] = module      # where dataclasses and pickle look it up
        try:
            exec(compile(text, str(path), "exec"), module.__dict__)
        except Exception as e:
            del sys.modules[module.__name__]
            raise ValueError(f"mixer={name!r} is not allowed: {source} fails to import: "
                             f"{type(e).__name__}: {e}") from None
        _LOADED[key] = module
    return _LOADED[key], key[1]


def _load_module(name, source):
    """The module `source` (package.module), imported, and the digest of its file's source."""
    try:
        module = importlib.import_module(source)
    except Exception as e:
        raise ValueError(f"mixer={name!r} is not allowed: module {source!r} fails to import "
                         f"({type(e).__name__}: {e}); write package.module:Class for a module "
                         "on sys.path, or path/to/file.py:Class") from None
    file = getattr(module, "__file__", None)
    return module, source_digest(Path(file).read_text() if file else "")


def load_outside(name):
    """(the class, the digest of its source) of a mixer of your own, "path/to/file.py:Class"
    or "package.module:Class": a ValueError names what is wrong with it (no such file or
    module, an import that fails, no such class, not an nn.Module, a constructor that does
    not take (d_model, seq_len))."""
    source, _, class_name = name.rpartition(":")
    file = source.endswith(".py") or "/" in source
    module, digest = (_load_file if file else _load_module)(name, source)
    cls = getattr(module, class_name, None)
    if cls is None:
        classes = [k for k, v in vars(module).items()
                   if isinstance(v, type) and issubclass(v, nn.Module)]
        raise ValueError(f"mixer={name!r} is not allowed: {source} has no {class_name!r}; its "
                         f"nn.Module classes: {', '.join(classes) or 'none'}")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"mixer={name!r} is not allowed: {class_name} is a "
                         f"{type(cls).__name__}, not a subclass of torch.nn.Module")
    try:
        inspect.signature(cls).bind_partial(0, 0)
    except TypeError:
        raise ValueError(f"mixer={name!r} is not allowed: {class_name}"
                         f"{inspect.signature(cls)} does not take (d_model, seq_len): a mixer "
                         f"is built as {class_name}(d_model, seq_len, **options)") from None
    return cls, digest


# ----------------------------------------------------------------------------------------
# the registry: name -> paper-form class (MIXERS), name -> official form (OFFICIAL_FORMS),
# and the functions that read a mixer's name and options and build it

MIXERS = {
    "attention": Attention,
    "sliding_window": SlidingWindowAttention,
    "blocked_attention": BlockedAttention,
    "short_conv": ShortConv,
    "long_conv": LongConv,
    "base_conv": BaseConv,
    "hyena": Hyena,
    "h3": H3,
    "rwkv": RWKV,
    "retnet": RetNet,
    "based": Based,
    "mamba": Mamba,
    "selective_attention": SelectiveAttention,
    "input_dependent_conv": InputDependentConv,
    "gla": GLA,
    "mamba2": Mamba2,
    "deltanet": DeltaNet,
    "gated_deltanet": GatedDeltaNet,
    "rwkv7": RWKV7,
}
# form="official": the official code's layer, where a figure or section (Figure 2, Section 5)
# trained another than the paper's. They live in the lab, experiments/official.py, and load
# as a mixer of your own does, by name, when a run asks for one
OFFICIAL_FORMS = {"base_conv": "experiments.official:OfficialBaseConv",
                  "hyena": "experiments.official:OfficialHyena",
                  "h3": "experiments.official:OfficialH3",
                  "rwkv": "experiments.official:OfficialRWKV",
                  "selective_attention": "experiments.official:OfficialSelectiveAttention"}


def mixer_class(name, form="paper"):
    """The class of mixer `name` in `form`: "paper" (MIXERS) or, where the official code
    trained another layer for a figure, "official" (the class OFFICIAL_FORMS names); the
    class of a mixer of your own, "source:Class", is the one its file defines (load_outside)."""
    if is_outside(name):
        check_choice("form", form, ("paper",))
        return load_outside(name)[0]
    check_choice("mixer", name, tuple(MIXERS))
    check_choice("form", form, ("paper", "official") if name in OFFICIAL_FORMS else ("paper",))
    if form == "paper":
        return MIXERS[name]
    try:
        return load_outside(OFFICIAL_FORMS[name])[0]
    except ValueError as e:                      # mixers.py copied without the lab beside it
        raise ValueError(f"form='official' of {name} is not allowed here: the official forms "
                         f"are the lab's, {OFFICIAL_FORMS[name]} (experiments/official.py "
                         f"beside mixers.py), which does not load: {e}") from None


def build_mixer(name, d_model, seq_len, form="paper", **options):
    """MIXERS[name](d_model, seq_len, **options), its official form, or a mixer of your own
    (mixer_class)."""
    return mixer_class(name, form)(d_model, seq_len, **options)


def split_mixer(entry):
    """One layer's entry of a `mixer` setting -> (name, its option texts), by the grammar
    alone (nothing is loaded):

      NAME[:key=value...]           a mixer of MIXERS: "base_conv:kernel_size=3"
      SOURCE:Class[:key=value...]   a mixer of your own, SOURCE a file ("my/gla.py") or an
                                    importable module ("mypackage.gla"), its name "SOURCE:Class":
                                    "my/gla.py:GLA:num_heads=2"

    The segment after a name not in MIXERS is the class where it has no "=" (an option always
    has one), so a class is never read as an option nor an option as a class. A source holds
    no ":", "," or "=" (so no Windows drive letter), an option's value no ":" or ",".
    """
    name, *options = entry.strip().split(":")
    if name not in MIXERS and options and "=" not in options[0]:
        name = f"{name}:{options.pop(0)}"
    return name, options


def mixer_setting(layers):
    """One (name, options) per layer as a `mixer` setting, the inverse of reading it (entries
    joined by commas, each split_mixer's grammar; train.parse_layers):
    [("base_conv", {"kernel_size": 3})] -> "base_conv:kernel_size=3"."""
    text = lambda v: str(v).lower() if isinstance(v, bool) else str(v)
    return ",".join(":".join([name, *(f"{k}={text(v)}" for k, v in options.items())])
                    for name, options in layers)


def option_value(text):
    """A mixer option's value from its text: int, float, true/false/none, or the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def parse_mixer(entry):
    """One layer's entry of a `mixer` setting (split_mixer's grammar) -> (name, options).

    A ValueError names an unknown mixer, an option that its class does not take, and a mixer
    of your own that cannot be loaded (load_outside) or called with its options; the values
    themselves are checked where the mixer is built."""
    name, texts = split_mixer(entry)
    if name not in MIXERS and not is_outside(name):
        close = difflib.get_close_matches(name, MIXERS, n=1)
        raise ValueError(f"mixer={entry!r} is not allowed: {name!r} is not one of "
                         f"{', '.join(MIXERS)}, nor a mixer of your own (path/to/file.py:Class "
                         "or package.module:Class)" + (f"; did you mean {close[0]!r}?" if close
                                                       else ""))
    options = {key: option_value(text) for key, _, text in (t.partition("=") for t in texts)}
    # the options are those of the class of its form (official or paper): its parameters
    # after the two positional ones, d_model and seq_len
    cls = mixer_class(name, options.get("form", "paper") if name in MIXERS else "paper")
    params = list(inspect.signature(cls).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    allowed = [p.name for p in params if p not in positional[:2] and p.name != "form"
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if name in OFFICIAL_FORMS:
        allowed.append("form")
    any_key = any(p.kind is p.VAR_KEYWORD for p in params)
    for text in texts:
        key, sep, _ = text.partition("=")
        if not sep or not (key in allowed or any_key and key.isidentifier()):
            raise ValueError(f"mixer option {text!r} of {name} is not allowed: write key=value "
                             f"with key one of {', '.join(allowed)}")
    if is_outside(name):
        try:
            inspect.signature(cls).bind(0, 0, **options)
        except TypeError as e:
            raise ValueError(f"mixer={entry!r} is not allowed: {cls.__name__}"
                             f"{inspect.signature(cls)} cannot be built as {cls.__name__}"
                             f"(d_model, seq_len, **options) with these options: {e}") from None
    return name, options


# ----------------------------------------------------------------------------------------
# the mixer contract: what every mixer here keeps (this module's docstring), checked on any
# mixer by one function. test_all.py runs check_mixer on every built-in mixer and its
# options; `python mixers.py --check path/to/file.py:Class` on yours (check_command); and
# train.py will not train a mixer of your own that fails any check (at seq_len 64 at most:
# train.CONTRACT_LENGTH).

CONTRACT_BATCH = 3     # B of every check (3, not 2: a batch-first state is not told from heads=2)
F64 = torch.float64    # what must hold exactly is checked in float64
Clause = namedtuple("Clause", "check status measured")   # "pass", "fail", "absent", "skipped"


def token_ids(x, c=4):
    """Fixed token ids (B, T) on x's device for a mixer that takes them, from c ids so that
    they repeat."""
    ids = torch.randint(0, c, x.shape[:2], generator=torch.Generator().manual_seed(0))
    return ids.to(x.device)


def seeded_forward(mixer, x, tokens=None, seed=0):
    """mixer(x) with torch's CPU generator seeded (`seed`) for the call and the caller's given
    back after it (the random selection control of Section 5 draws its rows from it), and
    token ids (token_ids(x) unless given) for a mixer that takes them."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        if not mixer_fact(mixer, "takes_tokens"):
            return mixer(x)
        return mixer(x, tokens=token_ids(x) if tokens is None else tokens)


def seeded_steps(mixer, x, token=None):
    """`step` over the whole of x (B, T, d) from state=None, the generator as seeded_forward's:
    (the outputs (B, T, d), the state after each position); token (B, T) ids, token_ids(x)
    unless given, for a mixer that takes them."""
    takes = mixer_fact(mixer, "takes_tokens")
    token = token_ids(x) if takes and token is None else token
    state, ys, states = None, [], []
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(0)
        for t in range(x.shape[1]):
            y, state = mixer.step(x[:, t], state, **({"token": token[:, t]} if takes else {}))
            ys.append(y)
            states.append(state)
    return torch.stack(ys, 1), states


def _inputs(B, T, d, dtype, seed=0):
    return torch.randn(B, T, d, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _dtype(dtype):
    return str(dtype).removeprefix("torch.")


def check_shape(build, B, T, d):
    """(B, T, d) in, (B, T, d) out in the input's dtype, float32 and float64."""
    for dtype in (torch.float32, F64):
        with torch.no_grad():
            y = seeded_forward(build(dtype).eval(), _inputs(B, T, d, dtype))
        if not isinstance(y, torch.Tensor) or y.shape != (B, T, d) or y.dtype != dtype:
            out = (f"{tuple(y.shape)} {_dtype(y.dtype)}" if isinstance(y, torch.Tensor)
                   else f"a {type(y).__name__}")
            return "fail", f"(B, T, d) = {(B, T, d)} {_dtype(dtype)} in, {out} out"
    return "pass", f"(B, T, d) = {(B, T, d)} in and out, float32 and float64"


def edit_changes(mixer, x, noise):
    """(T, T): [t, s] the largest change of mixer's output at position s (over the batch and
    the channels) when the input at position t alone is edited (noise[:, t] added to it),
    every forward seeded alike (seeded_forward: dropout draws the same mask)."""
    with torch.no_grad():
        y, changes = seeded_forward(mixer, x), []
        for t in range(x.shape[1]):
            x2 = x.clone()
            x2[:, t] += noise[:, t]
            changes.append((seeded_forward(mixer, x2) - y).abs().amax(dim=(0, 2)))  # (T,)
    return torch.stack(changes)


def check_causal(build, B, T, d):
    """An edit of the input at any one position t changes no output before t, to 1e-12 in
    float64 (an FFT convolution spreads rounding over every position), in eval mode and in
    train mode, the mode training runs it in (a BatchNorm reads the future there only). Every
    position is edited in turn: a leak into one position alone (a reflect-padded convolution
    reads positions 1 and 2 at 0) shows. An edit in the first half must change some output at
    t or after (the second half is exempt: a shift, or the random selection control, may drop
    the last rows)."""
    x, noise, largest = _inputs(B, T, d, F64), _inputs(B, T, d, F64, seed=1), 0.0
    for mode in ("eval", "train"):
        change = edit_changes(build(F64).train(mode == "train"), x, noise)         # (T, T)
        leaks = (change.tril(-1) > 1e-12).nonzero().tolist()     # [t, s], s < t, by t then s
        if leaks:
            (t, s), shown = leaks[0], ", ".join(f"{t} -> {s}" for t, s in leaks[:6])
            more = f", ... ({len(leaks):,} in all)" if len(leaks) > 6 else ""
            return "fail", (f"in {mode} mode, an edit at t={t} changes the output at t={s} by "
                            f"{change[t, s].item():.2g}: it leaks from the future (allowed "
                            f"1e-12); every leak (edit -> earlier output): {shown}{more}")
        dead = [t for t in range(T // 2) if not change[t, t:].max() > 1e-12]
        if dead:
            return "fail", (f"in {mode} mode, an edit at t={dead[0]} changes no output at t "
                            "or after")
        largest = max(largest, change.tril(-1).max().item())
    return "pass", (f"edits at all {T} positions change no earlier output, eval and train "
                    f"mode (largest change {largest:.1g}, allowed 1e-12)")


def check_batch_rows(build, B, T, d):
    """Row 0's output does not change when the batch's other rows do (to 1e-12, float64), in
    eval mode and in train mode (a BatchNorm mixes the rows there only), both forwards seeded
    alike."""
    x = _inputs(B, T, d, F64)
    x2 = torch.cat([x[:1], _inputs(B - 1, T, d, F64, seed=1)])
    largest = 0.0
    for mode in ("eval", "train"):
        m = build(F64).train(mode == "train")
        with torch.no_grad():
            change = (seeded_forward(m, x2)[0] - seeded_forward(m, x)[0]).abs().max().item()
        if change > 1e-12:
            return "fail", (f"in {mode} mode, the other rows changed, row 0's output changes by "
                            f"{change:.2g} (allowed 1e-12)")
        largest = max(largest, change)
    return "pass", (f"the other rows changed, row 0's output changes by {largest:.1g}, eval and "
                    "train mode (allowed 1e-12)")


def check_gradients(build, B, T, d):
    """Every parameter gets a gradient from the output with a nonzero number in it (float32,
    training mode): one of zeros, as 0 · p has, reaches nothing."""
    m = build(torch.float32)
    seeded_forward(m, _inputs(B, T, d, torch.float32)).square().sum().backward()
    params = dict(m.named_parameters())
    without = [name for name, p in params.items()
               if p.grad is None or not p.grad.abs().sum() > 0]
    if without:
        return "fail", (f"{len(without)} of {len(params)} parameters get no gradient (none, "
                        f"or all zeros): {', '.join(without)}")
    return "pass", (f"all {len(params)} parameters "
                    f"({sum(p.numel() for p in params.values()):,} numbers) get a gradient")


def check_step(build, B, T, d):
    """`step`, token by token from state=None, equals forward: to 1e-10 in float64, 1e-5 in
    float32 (absolute and relative), both; where it does not, the first position where step
    departs is named (a chunked form wrong from its second chunk on departs at chunk_size)."""
    if not callable(getattr(build(F64), "step", None)):
        return "absent", "no step: the layer runs over whole sequences only"
    ok, differences = True, []
    for dtype, tol in ((F64, 1e-10), (torch.float32, 1e-5)):
        m, x = build(dtype).eval(), _inputs(B, T, d, dtype)
        with torch.no_grad():
            ys, y = seeded_steps(m, x)[0], seeded_forward(m, x)
        if ys.shape != y.shape:
            return "fail", (f"step's outputs stack to {tuple(ys.shape)}, forward's are "
                            f"{tuple(y.shape)}")
        close = torch.isclose(ys, y, atol=tol, rtol=tol).all(dim=2).all(dim=0)      # (T,)
        ok &= bool(close.all())
        departs = f"; departs first at t = {int((~close).nonzero()[0])}" if not close.all() else ""
        differences.append(f"{(ys - y).abs().max().item():.2g} in {_dtype(dtype)} "
                           f"(tolerance {tol:g}{departs})")
    return "pass" if ok else "fail", "largest difference from forward " + ", ".join(differences)


def check_state_size(build, B, T, d):
    """state_size(t) equals the numbers per sequence that `step` carries after t tokens
    (state_numel: its tensors, batch first, in any structure of state_leaves), and is 0
    before the first token."""
    m = build(F64).eval()
    if not callable(getattr(m, "state_size", None)):
        return "absent", "no state_size"
    if not callable(getattr(m, "step", None)):
        return "absent", "state_size, but no step whose state it would count"
    with torch.no_grad():
        _, states = seeded_steps(m, _inputs(B, T, d, F64))
    ts = sorted({1, 2, 5, T} & set(range(1, T + 1)))
    for t in ts:
        leaves = state_leaves(states[t - 1])
        if not all(isinstance(s, torch.Tensor) and s.ndim and s.shape[0] == B for s in leaves):
            shapes = [tuple(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__
                      for s in leaves]
            return "fail", (f"the state after t={t} holds {shapes}, not only tensors with "
                            f"batch (B={B}) first")
    claimed, carried = [m.state_size(t) for t in ts], [state_numel(states[t - 1]) for t in ts]
    measured = (f"after t = {', '.join(map(str, ts))} tokens: state_size "
                f"{', '.join(map(str, claimed))}; step carries {', '.join(map(str, carried))}")
    if m.state_size(0) != 0:
        measured += f"; state_size(0) = {m.state_size(0)}, not 0"
    return "pass" if claimed == carried and m.state_size(0) == 0 else "fail", measured


def check_deterministic(build, B, T, d):
    """Two forwards in eval mode agree exactly, torch's generator seeded alike for both: a
    draw from it is allowed (the random selection control of Section 5 draws its rows), a
    state that forward changes is not; whether it draws is said."""
    m, x = build(F64).eval(), _inputs(B, T, d, F64)
    with torch.no_grad():
        y = seeded_forward(m, x)
        change = (seeded_forward(m, x) - y).abs().max().item()
        draws = change == 0 and not torch.equal(seeded_forward(m, x, seed=1), y)
    return ("pass" if change == 0 else "fail",
            f"two forwards differ by {change:.1g}" + ("; another seed of torch's generator "
                                                      "changes the output" if draws else ""))


def check_device(build, B, T, d):
    """forward, and step where there is one, run on PyTorch's meta device (shapes, no data):
    a tensor made on the CPU inside the layer is an error here, as it would be on a GPU."""
    m, x = build(torch.float32).eval().to("meta"), torch.empty(B, T, d, device="meta")
    with torch.no_grad():
        outputs, ran = [seeded_forward(m, x)], "forward"
        if callable(getattr(m, "step", None)):
            outputs.append(seeded_steps(m, x[:, :min(T, 3)])[0])
            ran += f" and {min(T, 3)} steps"
    if not all(y.is_meta for y in outputs):
        return "fail", f"{ran} on the meta device return a tensor on another device"
    return "pass", f"{ran} run on the meta device"


CONTRACT = {"shape": check_shape, "causal": check_causal, "batch rows": check_batch_rows,
            "gradients": check_gradients, "step": check_step, "state_size": check_state_size,
            "deterministic": check_deterministic, "device": check_device}


def check_mixer(name, options=None, d_model=64, seq_len=64, checks=tuple(CONTRACT),
                wrap=None, tracebacks=False):
    """The mixer contract on mixer `name` (parse_mixer's: a key of MIXERS or "source:Class")
    built as build_mixer(name, d_model, seq_len, **options), each check on a fresh copy with
    the same weights (torch's CPU generator seeded for the build, the caller's given back):
    one Clause(check, status, measured) per check of CONTRACT (or `checks`). status is "pass",
    "fail", "absent" (step and state_size are optional) or "skipped" (every check after a
    failed shape check: each reads a (B, T, d) output); an exception is a "fail" that
    names it and the line of your code it came from (_raised), its whole traceback printed
    to stderr with `tracebacks` (--check --traceback). A mixer that cannot be built raises a
    ValueError before any check. `wrap`, if given, is applied to each copy before its check
    (the lab's GPU check moves the layer to a GPU behind the checks' CPU inputs:
    experiments/gpu_check.py).

    What the contract does not check: a real GPU ("device" runs on PyTorch's meta device,
    shapes without numbers: no CUDA kernel runs; the lab's --gpu_check runs the other checks
    on one); precisions other than float32 and float64 (bfloat16, float16, autocast); sizes
    other than one (B = 3, T = seq_len, d = d_model), so neither numerical stability at long
    lengths nor step past seq_len; inputs other than one random draw (a leak behind a branch
    that draw does not take passes) and, for a mixer that takes token ids, one fixed draw of
    ids, never edited (a leak through the ids passes); that gradients are right (only that
    each is nonzero); step, state_size and determinism in train mode (causal, batch rows and
    gradients run in it); state_size at t other than 1, 2, 5 and T; memory; speed; whether
    the layer learns anything (training does)."""
    options = options or {}
    check_positive("d_model", d_model)
    check_positive("seq_len", seq_len)

    def build(dtype):
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(0)
            mixer = build_mixer(name, d_model, seq_len, **options).to(dtype)
        return wrap(mixer) if wrap else mixer

    def shown(error, what):
        if tracebacks:
            print(f"{what} raised:", file=sys.stderr)
            traceback.print_exception(error)
        return _raised(error)

    try:
        build(torch.float32)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"mixer={name!r} is not allowed: building it as {name}(d_model="
                         f"{d_model}, seq_len={seq_len}, **{options}) raised "
                         f"{shown(e, 'building it')}") from None
    results = []
    for check in checks:
        if any(r.check == "shape" and r.status == "fail" for r in results):
            results.append(Clause(check, "skipped", "the shape check failed: this check reads "
                                                    "a (B, T, d) output"))
            continue
        try:
            status, measured = CONTRACT[check](build, CONTRACT_BATCH, seq_len, d_model)
        except Exception as e:
            status, measured = "fail", f"raised {shown(e, f'the {check} check')}"
        results.append(Clause(check, status, measured))
    return results


def _first_line(error):
    return (str(error).strip().splitlines() or [""])[0]


def _raised(error):
    """An exception in one line: its type, its message's first line and where it was raised
    in your code, the innermost frame outside torch and outside this file (a mixer of your
    own, or what it calls), else outside torch (a mixer here)."""
    torch_dir, here = Path(torch.__file__).parent.resolve(), Path(__file__).resolve()
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if torch_dir not in Path(f.filename).resolve().parents]
    frame = next((f for f in reversed(frames) if Path(f.filename).resolve() != here),
                 frames[-1] if frames else None)
    at = f", at {frame.filename}:{frame.lineno} in {frame.name}" if frame else ""
    return f"{type(error).__name__}: {_first_line(error)}{at}"


def check_command(entry, d_model=64, seq_len=64, tracebacks=False):
    """`python mixers.py --check MIXER [--traceback]`: check_mixer on MIXER (a `mixer`
    setting's entry, parse_mixer) as a table, each exception's traceback on stderr with
    `tracebacks`. Returns the exit status: 1 when a check fails, 2 when the mixer cannot be
    loaded or built (the error on stderr), else 0 (step and state_size absent included)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    try:
        name, options = parse_mixer(entry)
        results = check_mixer(name, options, d_model, seq_len, tracebacks=tracebacks)
    except ValueError as e:
        print(f"mixers.py: {e}", file=sys.stderr)
        return 2
    table = Table("check", "result", "measured", title=f"the mixer contract on {entry}, "
                  f"d_model={d_model}, seq_len={seq_len}, B={CONTRACT_BATCH}")
    marks = {"pass": "[green]pass[/green]", "fail": "[red]FAIL[/red]",
             "absent": "[yellow]absent[/yellow]", "skipped": "[yellow]skipped[/yellow]"}
    for r in results:
        table.add_row(r.check, marks[r.status], escape(r.measured))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    return 1 if any(r.status == "fail" for r in results) else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", metavar="MIXER",
                        help="check the mixer contract on MIXER: path/to/file.py:Class, "
                             "package.module:Class or a name of MIXERS, with :key=value options")
    parser.add_argument("--d_model", type=int, default=64, help="d of --check (default 64)")
    parser.add_argument("--seq_len", type=int, default=64, help="T of --check (default 64)")
    parser.add_argument("--traceback", action="store_true",
                        help="print the whole traceback of each exception --check meets")
    args = parser.parse_args()
    try:
        for key in ("d_model", "seq_len"):
            check_positive(key, getattr(args, key))
    except ValueError as error:
        parser.error(str(error))
    if args.check:
        sys.exit(check_command(args.check, args.d_model, args.seq_len, args.traceback))
    else:
        for name, cls in MIXERS.items():
            m = cls(64, 64)
            print(f"{name:<20}{sum(p.numel() for p in m.parameters()):>8} parameters, "
                  f"state after 64 tokens: {m.state_size(64)} numbers")
