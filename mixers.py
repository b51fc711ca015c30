"""Sequence mixers for Zoology (Arora et al., 2023), each runnable in parallel and token by token.

Implements SPEC §3 (../shared/paper/SPEC.md), the mixers of Figure 2 and Figure 6:
  attention          softmax(QKᵀ/√d_h + causal mask) V, multi-head, output projection
                     (Vaswani et al., 2017; the baseline of Figure 2).
  sliding_window     attention restricted to the last W tokens (appendix F.1, Figure 6).
  blocked_attention  attention restricted to the token's own block of b tokens (Figure 6).
  short_conv         depthwise causal convolution with a short filter (K = 3).
  long_conv          causal convolution with a filter as long as the sequence, explicit or
                     implicit (Table 1's "long conv"; Fu et al., 2023b).
  base_conv          y = (u·W + b1) ⊙ (h ∗ u + b2) (Section 4; appendix H.2), and the form
                     of the official code, y = (h ∗ u) ⊙ (u·W + b) + u.
  hyena              Algorithm 3 of appendix H.2.1: z^ℓ = p^ℓ ⊙ (h^ℓ ∗ z^{ℓ-1})
                     (Poli et al., 2023).
  h3                 q ⊙ SSM_diag(SSM_shift(k) ⊙ v) (Fu et al., 2023a; its diagonal SSM is
                     S4D, Gu et al., 2022).

The interface every mixer follows (`MIXERS[name](d_model, seq_len, **options)`):
  forward(x)          x (B, T, D) -> y (B, T, D), causal: y[:, t] depends on x[:, :t+1] only.
  step(x_t, state)    x_t (B, D); state=None starts a sequence; returns (y_t, new_state)
                      with y_t == forward(x)[:, t]. The state is a tuple of tensors whose
                      leading dimension is B.
  state_size(t)       numbers per sequence that the state holds after t tokens (0 for t=0);
                      equal to the real size of what `step` returns (the paper's "recall vs
                      memory" axis).
States are as small as each mixer allows: a window of W tokens keeps the W-1 before the
next token, a filter of K taps the last K-1 inputs, an SSM its d_state numbers per channel. A complex SSM state is stored as pairs of reals (torch.view_as_real),
so the count is in real numbers.

The math lives in pure functions on tensors (`attention_reference(q, k, v, mask)`,
`causal_conv(u, h, impl)`, `hyena_operator(ps, v, hs, impl)`, `diagonal_ssm_kernel(...)`);
an nn.Module only holds parameters and calls them. Where a mixer has a fast form and a
readable reference, both take the same arguments and an `impl` argument picks one; the
tests assert they agree.

Glossary (code name -> paper symbol):
  B batch, T sequence length (the paper's N), D model width (d), H heads,
  hs = D // H head size (d_h), c vocabulary size, W sliding window, b block size,
  K filter length (taps), h filter (D, K) with h[:, s] the weight of lag s,
  L Hyena order (Algorithm 3's L: number of gated convolutions), p^ℓ, v, z^ℓ Hyena's
  projections and iterates; an SSM has A, B, C, Δ (dt) and d_state numbers of state per
  channel (the SSM functions call their channels D too: H·head_dim² of them in H3).
"""
import argparse
import inspect
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------------------
# argument checks shared by the mixers

IMPLS = ("fast", "reference")


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


def check_even(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 2 or value % 2:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be an even "
                         f"integer >= 2")


def state_numel(state):
    """Numbers per sequence in a state (a tuple of tensors with batch as dimension 0)."""
    return sum(s[0].numel() for s in state)


# ----------------------------------------------------------------------------------------
# attention and its masks (SPEC §3; Figure 2's baseline, Figure 6's window and blocks)

def causal_mask(T, device=None):
    """(T, T) bool, True where query i may attend to key j: j <= i."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def sliding_window_mask(T, window, device=None):
    """(T, T) bool: i - W < j <= i, the last W tokens including i itself."""
    i = torch.arange(T, device=device)
    return causal_mask(T, device) & (i[None, :] > i[:, None] - window)


def block_mask(T, block_size, device=None):
    """(T, T) bool: j <= i within the same block of b tokens (i // b == j // b)."""
    block = torch.arange(T, device=device) // block_size
    return causal_mask(T, device) & (block[:, None] == block[None, :])


def attention_reference(q, k, v, mask=None):
    """Masked softmax attention, written out: softmax(QKᵀ/√hs + M) V, M = -inf off the mask.

    q, k, v: (B, H, T, hs); mask: (T, T) bool, True where query i may attend to key j
    (None: the causal mask). Materializes the (B, H, T, T) score matrix.
    """
    T, hs = q.shape[-2], q.shape[-1]
    if mask is None:
        mask = causal_mask(T, q.device)
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(hs)         # (B, H, T, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhij,bhjd->bhid", scores.softmax(dim=-1), v)      # (B, H, T, hs)


def attention_fast(q, k, v, mask=None):
    """The same function through PyTorch's fused kernel (flash / memory-efficient on GPU).

    With a mask the kernel still visits all T² scores: sliding-window and blocked attention
    gain no asymptotic speed here, only the fused implementation.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


ATTENTION_IMPLS = {"fast": attention_fast, "reference": attention_reference}


class Attention(nn.Module):
    """Multi-head causal self-attention with an output projection.

    The official MQAR configs use 1 head and attention dropout 0.1. We use no dropout, so
    that `forward` and `step` compute one function; on MQAR a run reaches 0.99 before it
    has seen its 100,000 training examples once, so there is little to regularise.
    The state of `step` is the KV cache: 2·t·D numbers after t tokens.
    Subclasses narrow what a token sees by overriding `mask` and `cache_len`.
    """

    def __init__(self, d_model, seq_len, num_heads=1, impl="fast", bias=True):
        super().__init__()
        check_divides("num_heads", num_heads, d_model)
        check_choice("impl", impl, tuple(ATTENTION_IMPLS))
        self.num_heads, self.impl = num_heads, impl
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def mask(self, T):
        """(T, T) bool of allowed (query, key) pairs; None is the plain causal mask."""
        return None

    def cache_len(self, n):
        """How many of the n most recent keys/values a later token can still attend to."""
        return n

    def _heads(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        return [t.view(B, T, self.num_heads, D // self.num_heads).transpose(1, 2)
                for t in (q, k, v)]                                          # (B, H, T, hs)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self._heads(x)
        y = ATTENTION_IMPLS[self.impl](q, k, v, self.mask(T))                # (B, H, T, hs)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))

    def step(self, x_t, state=None):
        B, D = x_t.shape
        q, k, v = self._heads(x_t[:, None])                                  # (B, H, 1, hs)
        if state is not None:
            k = torch.cat([state[0], k], dim=2)                              # (B, H, n, hs)
            v = torch.cat([state[1], v], dim=2)
        # the cache holds only keys the newest query may see: no mask needed
        w = torch.einsum("bhd,bhjd->bhj", q[:, :, 0], k) / math.sqrt(D // self.num_heads)
        y = torch.einsum("bhj,bhjd->bhd", w.softmax(dim=-1), v)             # (B, H, hs)
        n = k.shape[2]
        keep = n - self.cache_len(n)
        return self.out_proj(y.reshape(B, D)), (k[:, :, keep:], v[:, :, keep:])

    def state_size(self, t):
        return 2 * self.cache_len(t) * self.out_proj.in_features


class SlidingWindowAttention(Attention):
    """Token i attends to the last W tokens, i-W+1..i (appendix F.1, Figure 6).

    Convention: W counts the token itself. The official code (Zoology's sliding-window
    mixer) attends to W+1 tokens, i-W..i, so its window W is our window W+1. A window
    W >= T is exactly causal attention (the fused causal kernel is then used).
    `step` keeps the W-1 most recent keys and values, all a later token can see:
    state 2·min(t, W-1)·D numbers, constant in t once t >= W-1.
    """

    def __init__(self, d_model, seq_len, window=32, num_heads=1, impl="fast", bias=True):
        check_positive("window", window)
        super().__init__(d_model, seq_len, num_heads=num_heads, impl=impl, bias=bias)
        self.window = window

    def mask(self, T):
        if self.window >= T:
            return None
        return sliding_window_mask(T, self.window, self.out_proj.weight.device)

    def cache_len(self, n):
        return min(n, self.window - 1)


class BlockedAttention(Attention):
    """Token i attends causally within its own block of b tokens, [b·⌊i/b⌋, i] (Figure 6).

    `step` keeps the keys and values of the current block only: after t tokens that is
    t mod b of them (state 2·(t mod b)·D numbers; empty right after a block fills up,
    since the next token opens a new block).
    """

    def __init__(self, d_model, seq_len, block_size=32, num_heads=1, impl="fast", bias=True):
        check_positive("block_size", block_size)
        super().__init__(d_model, seq_len, num_heads=num_heads, impl=impl, bias=bias)
        self.block_size = block_size

    def mask(self, T):
        if self.block_size >= T:
            return None
        return block_mask(T, self.block_size, self.out_proj.weight.device)

    def cache_len(self, n):
        return n % self.block_size


# ----------------------------------------------------------------------------------------
# causal convolution: the one operator every convolving mixer shares (SPEC §3, §7)

SHORT_FILTER = 16  # the fast form convolves directly up to this many taps, by FFT beyond


def causal_conv_reference(u, h):
    """y[:, t, d] = Σ_{s=0}^{min(t, K-1)} h[d, s] · u[:, t-s, d], as a loop over lags s.

    u: (B, T, D), h: (D, K) with any K (taps past T never reach an output).
    Costs O(B·T·D·K) time and O(B·T·D) memory: it never materializes a (T, T) matrix.
    """
    B, T, D = u.shape
    # row s of `taps` is every channel's lag-s weight; a contiguous row rather than the
    # strided column h[:, s] makes each step several times faster
    taps = h[:, :T].T.contiguous()                                          # (K, D)
    y = torch.zeros_like(u)
    for s, h_s in enumerate(taps):
        y[:, s:] += h_s * u[:, :T - s]                                      # (B, T-s, D)
    return y


def causal_conv_direct(u, h):
    """The same sum by a depthwise conv1d; O(B·T·D·K), the fast form for short filters.

    conv1d cross-correlates, so the taps are flipped; left padding by K-1 makes it causal.
    """
    B, T, D = u.shape
    K = min(h.shape[1], T)
    w = h[:, :K].flip(-1)[:, None]                                          # (D, 1, K)
    y = F.conv1d(F.pad(u.transpose(1, 2), (K - 1, 0)), w, groups=D)        # (B, D, T)
    return y.transpose(1, 2)


def causal_conv_fft(u, h):
    """The same sum by FFT, O(B·D·T log T), the fast form for long filters.

    FFT multiplication is a cyclic convolution; zero-padding both signals to 2T makes it
    the linear one, u ∗ h = iFFT(FFT(u)·FFT(h)) (SPEC §7), and we keep the first T outputs.
    """
    B, T, D = u.shape
    n = 2 * T
    u_f = torch.fft.rfft(u.transpose(1, 2), n=n)                            # (B, D, T+1)
    h_f = torch.fft.rfft(h[:, :T], n=n)                                     # (D, T+1)
    return torch.fft.irfft(u_f * h_f, n=n)[..., :T].transpose(1, 2)         # (B, T, D)


def causal_conv(u, h, impl="fast"):
    """Depthwise causal convolution y = h ∗ u of u (B, T, D) with h (D, K), any K.

    impl="reference" is the loop over lags; "fast" picks conv1d for K <= SHORT_FILTER and
    the FFT otherwise. All three compute the same sum.
    """
    if impl == "reference":
        return causal_conv_reference(u, h)
    if h.shape[1] <= SHORT_FILTER:
        return causal_conv_direct(u, h)
    return causal_conv_fft(u, h)


def causal_conv_step(u_t, past, h):
    """The newest output of causal_conv, from the newest input and the ones before it.

    u_t: (B, D); past: (B, P, D), the P <= K-1 most recent earlier inputs, oldest first.
    Returns y_t (B, D) and the min(P+1, K-1) most recent inputs, all the next step needs.
    """
    K = h.shape[1]
    window = torch.cat([past, u_t[:, None]], dim=1)                         # (B, P+1, D)
    n = window.shape[1]
    y_t = torch.einsum("bsd,ds->bd", window, h[:, :n].flip(-1))
    return y_t, window[:, max(0, n - (K - 1)):]


def no_history(x_t, width):
    """An empty (B, 0, width) input history: the state of a convolution before any token."""
    return x_t.new_zeros(x_t.shape[0], 0, width)


# ----------------------------------------------------------------------------------------
# filters: explicit (one parameter per tap) and implicit (Hyena's MLP over positions)

def positional_features(length, num_bands, dtype=None, device=None):
    """(length, 1 + 2·num_bands): [t, cos(2π f n/length), sin(2π f n/length)], f = 1..bands.

    n is the position and t = n / (length - 1) in [0, 1]: Hyena's input to the filter MLP
    (Poli et al., 2023, §3.3). Features depend on the filter length, not on the input's T.
    """
    n = torch.arange(length, dtype=dtype, device=device)
    t = n / max(length - 1, 1)
    angle = 2 * math.pi * n[:, None] * torch.arange(1, num_bands + 1, dtype=dtype,
                                                    device=device) / length
    return torch.cat([t[:, None], angle.cos(), angle.sin()], dim=-1)


def exponential_decay(length, channels, fast=0.3, slow=1.5, target=1e-2, dtype=None,
                      device=None):
    """(channels, length) window exp(-α_c t), t = n / (length - 1) (Hyena's modulation).

    Rates α_c spread linearly from one that reaches `target` at t = `slow` (past the end)
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
    """h[c, n] = MLP(z(n))[c] · exp(-α_c t_n), Hyena's implicit filter (Poli et al. 2023, §3.3).

    Parameters do not grow with the length. Simplifications against the official code:
    the sine activations have a fixed frequency 1 (the official one learns it), and the
    filter has no per-channel skip term ("bias" in Hyena, `+ u` in Zoology's fft_conv).
    """

    def __init__(self, channels, length, hidden=32, num_bands=4):
        super().__init__()
        self.channels, self.length, self.num_bands = channels, length, num_bands
        self.fc1 = nn.Linear(1 + 2 * num_bands, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, channels, bias=False)

    def forward(self):
        like = dict(dtype=self.fc1.weight.dtype, device=self.fc1.weight.device)
        z = positional_features(self.length, self.num_bands, **like)         # (K, 1+2·bands)
        a = torch.sin(self.fc2(torch.sin(self.fc1(z))))                      # (K, hidden)
        return self.fc3(a).T * exponential_decay(self.length, self.channels, **like)


FILTERS = {"explicit": ExplicitFilter, "implicit": ImplicitFilter}


# ----------------------------------------------------------------------------------------
# short and long convolutions (SPEC §3)

class Convolution(nn.Module):
    """y = h ∗ u per channel, no projections: the shared body of ShortConv and LongConv.

    `step` keeps the last K-1 inputs: state min(t, K-1)·D numbers after t tokens.
    """

    def __init__(self, d_model, kernel_size, filter, impl):
        super().__init__()
        check_choice("filter", filter, tuple(FILTERS))
        check_choice("impl", impl, IMPLS)
        self.impl, self.kernel_size = impl, kernel_size
        self.filter = FILTERS[filter](d_model, kernel_size)

    def forward(self, x):
        return causal_conv(x, self.filter(), self.impl)                      # (B, T, D)

    def step(self, x_t, state=None):
        past = no_history(x_t, x_t.shape[1]) if state is None else state[0]
        y_t, past = causal_conv_step(x_t, past, self.filter())
        return y_t, (past,)

    def state_size(self, t):
        return min(t, self.kernel_size - 1) * self.filter().shape[0]


class ShortConv(Convolution):
    """Depthwise causal convolution with a short explicit filter, K = 3 by default (SPEC §3).

    The official ShortConvolution (an nn.Conv1d) also adds a per-channel bias; we do not.
    """

    def __init__(self, d_model, seq_len, kernel_size=3, impl="fast"):
        check_positive("kernel_size", kernel_size)
        super().__init__(d_model, kernel_size, "explicit", impl)


class LongConv(Convolution):
    """Causal convolution with a filter of seq_len taps (Table 1's long conv; SPEC §3).

    filter="explicit" (default, as the official LongConvolution and Fu et al., 2023b):
    D·seq_len parameters; "implicit": Hyena's MLP-with-decay filter. Inputs longer than
    seq_len are convolved with the filter as it is (zero past seq_len taps).
    `step` keeps the input history, state min(t, seq_len-1)·D = t·D for t < seq_len: a
    generic long filter has no smaller state.
    """

    def __init__(self, d_model, seq_len, filter="explicit", impl="fast"):
        check_positive("seq_len", seq_len)
        super().__init__(d_model, seq_len, filter, impl)


# ----------------------------------------------------------------------------------------
# BaseConv (Section 4; appendix H.2)

def base_conv(u, W, b1, h, b2, impl="fast"):
    """y = (u·W + b1) ⊙ (h ∗ u + b2): the BaseConv layer (Section 4).

    u: (B, T, D), W: (D, D), h: (D, K); b1, b2 broadcast against (T, D): per position
    (T, D) in the paper, per channel (D,) or 0 in the official code.
    """
    return (u @ W + b1) * (causal_conv(u, h, impl) + b2)                     # (B, T, D)


class BaseConv(nn.Module):
    """BaseConv, in the official code's form (default) or the paper's (Section 4).

    form="official": y = (h ∗ u) ⊙ (u·W + b) + u, as Zoology's BaseConv; that is what
      Figure 2's BaseConv numbers were trained with, and the residual `+ u` helps training.
      The default, so that a run here is comparable with Figure 2.
    form="paper": y = (u·W + b1) ⊙ (h ∗ u + b2) with position-dependent b1, b2 (T, D) and
      no residual; the layer the theory (appendix H) composes. Its biases need the position
      of each token, so `step` carries it (one number) and inputs are limited to seq_len.
    kernel_size: None (or seq_len) for a filter as long as the sequence, 3 for a short one.
      The official configs alternate the two over layers.
    filter: None picks what the official code uses, "implicit" (Hyena-style) for a long
      filter and "explicit" for a short one; pass "explicit" to set h by hand (theory).
    Deviation: the official implicit long convolution also adds u to h ∗ u (tap 0 + 1) and
      the official short one a per-channel bias; neither is here.
    `step` keeps the last K-1 inputs: min(t, K-1)·D numbers (+1 for the position, paper form).
    """

    def __init__(self, d_model, seq_len, kernel_size=None, filter=None, form="official",
                 impl="fast"):
        super().__init__()
        check_positive("seq_len", seq_len)
        if kernel_size is not None:
            check_positive("kernel_size", kernel_size,
                           "an integer >= 1, or None for a filter of seq_len taps")
        kernel_size = seq_len if kernel_size is None else kernel_size
        if filter is None:
            filter = "implicit" if kernel_size >= seq_len else "explicit"
        check_choice("filter", filter, tuple(FILTERS))
        check_choice("form", form, ("official", "paper"))
        check_choice("impl", impl, IMPLS)
        self.seq_len, self.kernel_size, self.form, self.impl = seq_len, kernel_size, form, impl
        self.proj = nn.Linear(d_model, d_model, bias=form == "official")
        self.filter = FILTERS[filter](d_model, kernel_size)
        if form == "paper":
            self.b1 = nn.Parameter(torch.zeros(seq_len, d_model))
            self.b2 = nn.Parameter(torch.zeros(seq_len, d_model))

    def _check_length(self, T):
        if self.form == "paper" and T > self.seq_len:
            raise ValueError(f"sequence length T={T} is not allowed: form='paper' has one "
                             f"bias row per position, so T must be <= seq_len={self.seq_len}")

    def forward(self, x):
        B, T, D = x.shape
        W, h = self.proj.weight.T, self.filter()
        if self.form == "official":
            return base_conv(x, W, self.proj.bias, h, 0.0, self.impl) + x
        self._check_length(T)
        return base_conv(x, W, self.b1[:T], h, self.b2[:T], self.impl)

    def step(self, x_t, state=None):
        B, D = x_t.shape
        if state is None:
            state = (no_history(x_t, D), x_t.new_zeros(B, 1, dtype=torch.long))
        conv_t, past = causal_conv_step(x_t, state[0], self.filter())
        gate_t = self.proj(x_t)                                              # (B, D)
        if self.form == "official":
            return conv_t * gate_t + x_t, (past,)
        position = state[1]                                                  # (B, 1)
        t = int(position[0])
        self._check_length(t + 1)
        return (gate_t + self.b1[t]) * (conv_t + self.b2[t]), (past, position + 1)

    def state_size(self, t):
        history = min(t, self.kernel_size - 1) * self.proj.in_features
        return history + (self.form == "paper" and t > 0)


# ----------------------------------------------------------------------------------------
# Hyena (appendix H.2.1, Algorithm 3)

def hyena_operator(ps, v, hs, impl="fast"):
    """Algorithm 3's recurrence: z^0 = v, z^ℓ = p^ℓ ⊙ (h^ℓ ∗ z^{ℓ-1}), returns z^L.

    ps: L gates p^ℓ (B, T, D); v: (B, T, D); hs: L filters h^ℓ (D, K).
    """
    z = v
    for p, h in zip(ps, hs):
        z = p * causal_conv(z, h, impl)                                      # (B, T, D)
    return z


class Hyena(nn.Module):
    """Hyena of order L (appendix H.2.1, Algorithm 3; Poli et al., 2023).

    A linear layer to (L+1)·D channels and a short explicit convolution give p^1..p^L and
    v; L gated long convolutions with implicit filters h^ℓ; an output projection.
    Deviation: we follow Algorithm 3. The official code (Zoology's hyena.py) runs one long
    convolution gated before and after, y = p^2 ⊙ (h ∗ (p^1 ⊙ v) + bias ⊙ p^1 ⊙ v); its
    "order" counts projections, Algorithm 3's L counts convolutions.
    `step` keeps the last K_short-1 projected inputs and each iterate's history:
    min(t, K_short-1)·(L+1)·D + L·min(t, seq_len-1)·D numbers.
    """

    def __init__(self, d_model, seq_len, order=2, short_kernel_size=3, impl="fast"):
        super().__init__()
        check_positive("seq_len", seq_len)
        check_positive("order", order)
        check_positive("short_kernel_size", short_kernel_size)
        check_choice("impl", impl, IMPLS)
        self.d_model, self.seq_len, self.order, self.impl = d_model, seq_len, order, impl
        self.short_kernel_size = short_kernel_size
        self.in_proj = nn.Linear(d_model, (order + 1) * d_model)
        self.short_filter = ExplicitFilter((order + 1) * d_model, short_kernel_size)
        self.long_filter = ImplicitFilter(order * d_model, seq_len)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, D = x.shape
        u = causal_conv(self.in_proj(x), self.short_filter(), self.impl)    # (B, T, (L+1)·D)
        *ps, v = u.split(D, dim=-1)
        hs = self.long_filter().split(D, dim=0)                              # L × (D, seq_len)
        return self.out_proj(hyena_operator(ps, v, hs, self.impl))

    def step(self, x_t, state=None):
        B, D = x_t.shape
        if state is None:
            state = (no_history(x_t, (self.order + 1) * D),
                     *(no_history(x_t, D) for _ in range(self.order)))
        u_t, short_past = causal_conv_step(self.in_proj(x_t), state[0], self.short_filter())
        *ps, z = u_t.split(D, dim=-1)
        pasts = []
        for p, h, past in zip(ps, self.long_filter().split(D, dim=0), state[1:]):
            conv_t, past = causal_conv_step(z, past, h)
            z = p * conv_t                                                   # (B, D)
            pasts.append(past)
        return self.out_proj(z), (short_past, *pasts)

    def state_size(self, t):
        D, L = self.d_model, self.order
        return (min(t, self.short_kernel_size - 1) * (L + 1) * D
                + L * min(t, self.seq_len - 1) * D)


# ----------------------------------------------------------------------------------------
# H3: a shift SSM and a diagonal SSM (Fu et al., 2023a; S4D, Gu et al., 2022)

def ssm_discretize(log_dt, A):
    """Zero-order hold, B = 1: Ā = exp(ΔA), B̄ = (exp(ΔA) - 1) / A, each (D, n) complex."""
    dtA = log_dt.exp()[:, None] * A
    return dtA.exp(), (dtA.exp() - 1) / A


def exp_complex(z):
    """exp(x + iy) = e^x (cos y + i sin y), from real operations: on a CPU ~3x faster than
    torch.exp on a complex tensor."""
    return torch.polar(z.real.exp(), z.imag)


def diagonal_ssm_kernel(log_dt, A, C, T):
    """The SSM's convolution kernel K[d, ℓ] = 2·Re Σ_n C[d, n] B̄[d, n] Ā[d, n]^ℓ, ℓ < T.

    log_dt: (D,) real; A, C: (D, n) complex, n = d_state/2 modes whose conjugates make the
    state real (hence 2·Re); S4D's kernel.
    Writing ℓ = m·i + j with m = ⌈√T⌉, Ā^ℓ = exp(m·i·ΔA)·exp(j·ΔA): two (D, n, m) tables of
    exponentials and a batched matmul, instead of D·n·T complex exponentials (which cost
    more than the convolution they feed).
    """
    _, dB = ssm_discretize(log_dt, A)
    dtA = log_dt.exp()[:, None] * A                                          # (D, n)
    m = math.isqrt(T - 1) + 1
    j = torch.arange(m, dtype=log_dt.dtype, device=log_dt.device)
    coarse, fine = exp_complex(dtA[..., None] * (m * j)), exp_complex(dtA[..., None] * j)
    K = torch.einsum("dn,dni,dnj->dij", C * dB, coarse, fine)               # (D, m, m)
    return 2 * K.real.flatten(1)[:, :T]                                      # (D, T)


def diagonal_ssm_step(u_t, x, log_dt, A, C):
    """One step of the recurrence: x_t = Ā x_{t-1} + B̄ u_t, y_t = 2·Re Σ_n C_n x_t[n].

    u_t: (B, D) real, x: (B, D, n) complex. Its impulse response is diagonal_ssm_kernel.
    """
    dA, dB = ssm_discretize(log_dt, A)
    x = dA * x + dB * u_t[..., None]                                         # (B, D, n)
    return 2 * (C * x).sum(-1).real, x


def shift_ssm_step(u_t, x, h):
    """Shift SSM x_t = S x_{t-1} + e_0 u_t, y_t = C·x_t, S the shift matrix, C = h (D, n).

    x holds the last n inputs (newest first), so the kernel of this SSM is h itself.
    """
    x = torch.cat([u_t[..., None], x[..., :-1]], dim=-1)                     # (B, D, n)
    return (h * x).sum(-1), x


class H3(nn.Module):
    """H3 (Fu et al., 2023a): y = W_o (q ⊙ SSM_diag(SSM_shift(k) ⊙ v)), SPEC §3.

    Per head of head_dim channels the product is an outer product, k_i v_j, and the output
    y_j = Σ_i q_i · SSM_diag(k ⊗ v)_{ij}; head_dim=1 (default, as the official code) is
    the elementwise q ⊙ SSM(k ⊙ v). One diagonal SSM per head, shared by its head_dim²
    channels, with a skip term D (as S4D).
    Shift SSM: A is the shift matrix and B = e_0, so its kernel is its C vector, a learned
    filter of shift_size taps (default d_state, as the official code, which uses one state
    size for both SSMs); its skip term D is folded into tap 0.
    Diagonal SSM: S4D-Lin init, A_n = -1/2 + iπn, Δ log-uniform in [1e-3, 1e-1], C normal;
    d_state real numbers per channel (d_state/2 complex modes and their conjugates).
    Fast form: the SSM's kernel through the FFT convolution; reference: the direct sum.
    `step` runs both SSMs as recurrences: the state is the shift SSM's D·shift_size numbers
    and the diagonal SSM's (D/head_dim)·head_dim²·d_state, independent of t.
    """

    def __init__(self, d_model, seq_len, d_state=64, head_dim=1, shift_size=None,
                 impl="fast"):
        super().__init__()
        check_even("d_state", d_state)
        check_divides("head_dim", head_dim, d_model)
        shift_size = d_state if shift_size is None else shift_size
        check_positive("shift_size", shift_size, "an integer >= 1, or None for d_state")
        check_choice("impl", impl, IMPLS)
        H, n = d_model // head_dim, d_state // 2
        self.d_state, self.head_dim, self.shift_size = d_state, head_dim, shift_size
        self.impl = impl
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.shift_filter = ExplicitFilter(d_model, shift_size)
        self.log_dt = nn.Parameter(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1)))
        self.log_neg_A_re = nn.Parameter(torch.full((H, n), math.log(0.5)))
        self.A_im = nn.Parameter(math.pi * torch.arange(n).float().repeat(H, 1))
        self.C_re = nn.Parameter(torch.randn(H, n) * math.sqrt(0.5))
        self.C_im = nn.Parameter(torch.randn(H, n) * math.sqrt(0.5))
        self.D = nn.Parameter(torch.randn(H))
        self.out_proj = nn.Linear(d_model, d_model)

    def _ssm(self):
        """(log_dt, A, C, D) of the diagonal SSM, repeated over each head's head_dim² channels."""
        r = self.head_dim ** 2
        A = torch.complex(-self.log_neg_A_re.exp(), self.A_im)
        C = torch.complex(self.C_re, self.C_im)
        return (self.log_dt.repeat_interleave(r), A.repeat_interleave(r, 0),
                C.repeat_interleave(r, 0), self.D.repeat_interleave(r))

    def _outer(self, k, v):
        """k ⊗ v per head: (..., D), (..., D) -> (..., H·hd·hd), channel (h, i, j) = k_hi v_hj."""
        hd = self.head_dim
        k, v = k.unflatten(-1, (-1, hd)), v.unflatten(-1, (-1, hd))
        return (k[..., :, None] * v[..., None, :]).flatten(-3)

    def _gate(self, q, s):
        """y_hj = Σ_i q_hi s_hij: (..., D), (..., H·hd·hd) -> (..., D)."""
        hd = self.head_dim
        q, s = q.unflatten(-1, (-1, hd)), s.unflatten(-1, (-1, hd, hd))
        return (q[..., None] * s).sum(-2).flatten(-2)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)                               # (B, T, D)
        k = causal_conv(k, self.shift_filter(), self.impl)
        kv = self._outer(k, v)                                               # (B, T, H·hd²)
        log_dt, A, C, skip = self._ssm()
        s = causal_conv(kv, diagonal_ssm_kernel(log_dt, A, C, T), self.impl) + skip * kv
        return self.out_proj(self._gate(q, s))

    def step(self, x_t, state=None):
        B, D = x_t.shape
        log_dt, A, C, skip = self._ssm()
        if state is None:
            shift_x = x_t.new_zeros(B, D, self.shift_size)
            ssm_x = torch.zeros(B, *A.shape, dtype=A.dtype, device=A.device)
        else:
            shift_x, ssm_x = state[0], torch.view_as_complex(state[1])
        q, k, v = self.qkv(x_t).split(D, dim=-1)                             # (B, D)
        k, shift_x = shift_ssm_step(k, shift_x, self.shift_filter())
        kv = self._outer(k, v)                                               # (B, H·hd²)
        s, ssm_x = diagonal_ssm_step(kv, ssm_x, log_dt, A, C)
        y_t = self.out_proj(self._gate(q, s + skip * kv))
        return y_t, (shift_x, torch.view_as_real(ssm_x))

    def state_size(self, t):
        D = self.out_proj.in_features
        if t == 0:
            return 0                                    # no state before the first token
        return D * self.shift_size + D * self.head_dim * self.d_state


# ----------------------------------------------------------------------------------------
# the registry: one plain dict

MIXERS = {
    "attention": Attention,
    "sliding_window": SlidingWindowAttention,
    "blocked_attention": BlockedAttention,
    "short_conv": ShortConv,
    "long_conv": LongConv,
    "base_conv": BaseConv,
    "hyena": Hyena,
    "h3": H3,
}


# ----------------------------------------------------------------------------------------
# benchmark: fast form vs reference for every mixer

BENCH_VARIANTS = [("long_conv", dict(filter="implicit")), ("base_conv", dict(kernel_size=3)),
                  ("base_conv", dict(form="paper"))]


def _forward_seconds(mixer, x, repeats=3):
    """Best of `repeats` timed calls after a warm-up; a single call once it takes > 1 s."""
    with torch.no_grad():
        t0 = time.perf_counter()
        mixer(x)
        best = time.perf_counter() - t0
        for _ in range(repeats if best < 1.0 else 0):
            t0 = time.perf_counter()
            mixer(x)
            best = min(best, time.perf_counter() - t0)
    return best


def bench(shapes=((8, 512, 64), (2, 4096, 64))):
    """Forward time of each mixer's fast form and reference, and its state size."""
    torch.manual_seed(0)
    print(f"float32, {torch.get_num_threads()} CPU threads (OMP_NUM_THREADS sets them)")
    rows = [(name, {}) for name in MIXERS] + BENCH_VARIANTS
    print(f"{'mixer':<28}{'B':>3}{'T':>6}{'D':>4}{'fast s':>10}{'ref s':>10}{'ref/fast':>9}"
          f"{'state':>10}")
    for B, T, D in shapes:
        x = torch.randn(B, T, D)
        for name, kwargs in rows:
            cls = MIXERS[name]
            label = name + "".join(f" {k}={v}" for k, v in kwargs.items())
            if "impl" not in inspect.signature(cls).parameters:
                fast = cls(D, T, **kwargs)
                tf = _forward_seconds(fast, x)
                print(f"{label:<28}{B:>3}{T:>6}{D:>4}{tf:>10.4f}{'-':>10}{'-':>9}"
                      f"{fast.state_size(T):>10}")
                continue
            fast, ref = cls(D, T, impl="fast", **kwargs), cls(D, T, impl="reference", **kwargs)
            ref.load_state_dict(fast.state_dict())
            tf, tr = _forward_seconds(fast, x), _forward_seconds(ref, x)
            print(f"{label:<28}{B:>3}{T:>6}{D:>4}{tf:>10.4f}{tr:>10.4f}{tr / tf:>9.1f}"
                  f"{fast.state_size(T):>10}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", action="store_true", help="time every mixer")
    if parser.parse_args().bench:
        bench()
    else:
        for name, cls in MIXERS.items():
            m = cls(64, 64)
            print(f"{name:<20}{sum(p.numel() for p in m.parameters()):>8} parameters, "
                  f"state after 64 tokens: {m.state_size(64)} numbers")
