"""The official code's forms of five mixers: the layers HazyResearch/zoology (read at commit
d88d6f5) trained where a figure or section trained something other than the operator the
paper's text defines (Figure 2's BaseConv, Hyena, H3 and RWKV rows; Section 5's learned
selection). mixers.py holds the paper's form of each; here is the official one, a class
of its own whose docstring names the official file and each difference, checked in
experiments/test_lab.py against a literal transcription of the official forward.

A model reaches them as it reaches any mixer outside mixers.py (mixers.load_outside): the
mixer option form=official (`--mixer=base_conv:form=official`, and the per-layer forms of
`--preset=figure2`) names mixers.OFFICIAL_FORMS[name], "experiments.official:OfficialX",
which mixers.py loads by that name when a run asks for it; mixers.py does not import this
module. A record names the mixer by its name and form (base_conv:form=official), not by
the module that holds its class.

Each class keeps mixers.py's interface and contract (forward, step, state_size; mixers.py's
docstring); its "To copy:" line names what to copy from here and from mixers.py.
"""
import math

import torch
import torch.nn as nn

from mixers import (CONV_IMPLS, FILTERS, OFFICIAL_FREQUENCIES, Attention, ExplicitFilter, H3,
                    ImplicitFilter, Mixer, RWKV, causal_conv, check_choice, check_positive,
                    conv1d_init_, top_k_rows)


class OfficialImplicitFilter(ImplicitFilter):
    """Zoology's hyena.Filter as Figure 2's Hyena ran it (emb_dim=3, order=64,
    num_inner_mlps=2, w=1): the official features (OFFICIAL_FREQUENCIES), which are a
    parameter there, hidden width 64, two inner layers, and sin(a ⊙ x) with one learned
    frequency vector a (starting at 1) shared by its three activations."""

    def __init__(self, channels, length):
        super().__init__(channels, length, hidden=64, inner=2, frequencies=OFFICIAL_FREQUENCIES)
        self.z = nn.Parameter(self.z)            # learned there; a buffer no more
        self.frequency = nn.Parameter(torch.ones(64))

    def activation(self, a):
        return torch.sin(self.frequency * a)


class OfficialBaseConv(Mixer):
    """form="official": Zoology's BaseConv (zoology/mixers/base_conv.py), the layer Figure
    2's BaseConv rows were trained with: y = conv(u) ⊙ (u·W + b) + u.

    For a short filter (kernel_size=3 in Figure 2) conv is an nn.Conv1d: h ∗ u plus a
    per-channel bias, both drawn as PyTorch draws a Conv1d. For a long one conv(u) = h ∗ u + u
    (its fft_conv adds u), with h the ReLU MLP of ImplicitLongConvolution (MLPFilter), no
    decay window. Figure 2 stacks a short and a long layer (configs.py: kernel_size
    [3, -1, 3, -1]).
    filter: None picks the official one ("explicit" for a short filter, "mlp" for a long
    one); any key of FILTERS may be given.
    `step` keeps the last K-1 inputs: min(t, K-1)·d numbers.
    To copy: this class, conv1d_init_, FILTERS (ExplicitFilter, ImplicitFilter and MLPFilter,
    with positional_features, exponential_decay and OFFICIAL_FREQUENCIES), causal_conv with
    CONV_IMPLS (causal_conv_direct, causal_conv_fft, causal_conv_fast, SHORT_FILTER), Mixer,
    check_choice and check_positive.
    """

    def __init__(self, d_model, seq_len, kernel_size=None, filter=None, impl="fast"):
        super().__init__()
        check_positive("seq_len", seq_len)
        if kernel_size is not None:
            check_positive("kernel_size", kernel_size,
                           "an integer >= 1, or None for a filter of seq_len taps")
        self.kernel_size = seq_len if kernel_size is None else kernel_size
        self.long = self.kernel_size >= seq_len
        if filter is None:
            filter = "mlp" if self.long else "explicit"
        check_choice("filter", filter, tuple(FILTERS))
        check_choice("impl", impl, tuple(CONV_IMPLS))
        self.impl = impl
        self.proj = nn.Linear(d_model, d_model)
        self.filter = FILTERS[filter](d_model, self.kernel_size)
        if not self.long:                     # an nn.Conv1d: its bias, and its taps if explicit
            self.conv_bias = nn.Parameter(torch.empty(d_model))
            conv1d_init_(self.conv_bias, *([self.filter.h] if filter == "explicit" else []),
                         fan_in=self.kernel_size)

    def _mix(self, u, past):
        conv, past = causal_conv(u, self.filter(), self.impl, past)
        return (conv + (u if self.long else self.conv_bias)) * self.proj(u) + u, past

    def forward(self, x):
        return self._mix(x, None)[0]

    def step(self, x_t, state=None):
        y, past = self._mix(x_t[:, None], None if state is None else state[0])
        return y[:, 0], (past,)

    def state_size(self, t):
        return min(t, self.kernel_size - 1) * self.proj.in_features


def hyena_official_operator(x1, x2, v, h, bias, impl="fast", state=None):
    """The official order-2 Hyena (zoology/mixers/hyena.py): gate before and after one long
    convolution, y = x2 ⊙ (h ∗ (x1 ⊙ v) + bias ⊙ (x1 ⊙ v)).

    x1, x2, v: (B, T, d); h: (d, K); bias: (d,), the fftconv's per-channel skip term.
    state: the convolution's input history, as hyena_operator's (a tuple of one).
    """
    z = x1 * v                                                               # pre-gate
    conv, past = causal_conv(z, h, impl, None if state is None else state[0])
    return x2 * (conv + bias * z), (past,)


class OfficialHyena(Mixer):
    """form="official": Zoology's Hyena as Figure 2 ran it (hyena.py, filter_order=64,
    short_filter_order=3). The same in_proj and short convolution as Hyena's (an nn.Conv1d,
    so with a per-channel bias, drawn as PyTorch draws it) give x1, x2, v, then ONE long
    convolution gated before and after, y = x2 ⊙ (h ∗ (x1 ⊙ v) + bias ⊙ (x1 ⊙ v)), with
    bias ~ N(0, 1) per channel and h the official filter (OfficialImplicitFilter). Its
    "order 2" counts the gates; Algorithm 3's order counts convolutions: only order=2.
    `step`'s state: min(t, K_short-1)·3·d + min(t, seq_len-1)·d numbers.
    To copy: this class, hyena_official_operator, OfficialImplicitFilter (with ImplicitFilter,
    positional_features, exponential_decay and OFFICIAL_FREQUENCIES), ExplicitFilter,
    conv1d_init_, causal_conv with CONV_IMPLS (causal_conv_direct, causal_conv_fft,
    causal_conv_fast, SHORT_FILTER), Mixer, check_choice and check_positive.
    """

    def __init__(self, d_model, seq_len, order=2, short_kernel_size=3, impl="fast"):
        super().__init__()
        check_positive("seq_len", seq_len)
        check_positive("short_kernel_size", short_kernel_size)
        check_choice("impl", impl, tuple(CONV_IMPLS))
        if order != 2:
            raise ValueError(f"order={order} is not allowed with form='official': the "
                             "official operator has order 2 (two gates, one convolution)")
        self.d_model, self.seq_len, self.impl = d_model, seq_len, impl
        self.short_kernel_size = short_kernel_size
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.short_filter = ExplicitFilter(3 * d_model, short_kernel_size)
        self.long_filter = OfficialImplicitFilter(d_model, seq_len)
        self.short_bias = nn.Parameter(torch.empty(3 * d_model))
        conv1d_init_(self.short_filter.h, self.short_bias, fan_in=short_kernel_size)
        self.bias = nn.Parameter(torch.randn(d_model))
        self.out_proj = nn.Linear(d_model, d_model)

    def _mix(self, x, state):
        d = x.shape[-1]
        u, short_past = causal_conv(self.in_proj(x), self.short_filter(), self.impl,
                                    None if state is None else state[0])
        x1, x2, v = (u + self.short_bias).split(d, dim=-1)
        y, pasts = hyena_official_operator(x1, x2, v, self.long_filter(), self.bias,
                                           self.impl, None if state is None else state[1:])
        return self.out_proj(y), (short_past, *pasts)

    def forward(self, x):
        return self._mix(x, None)[0]

    def step(self, x_t, state=None):
        y, state = self._mix(x_t[:, None], state)
        return y[:, 0], state

    def state_size(self, t):
        return (min(t, self.short_kernel_size - 1) * 3 * self.d_model
                + min(t, self.seq_len - 1) * self.d_model)


class OfficialH3(H3):
    """form="official": Zoology's H3 (zoology/mixers/h3/), as Figure 2 ran it with d_state=N
    and head_dim=2 (configs.py; set those two as options): the bilinear discretization of
    its SSKernelDiag, shift taps drawn as its SSKernelShift draws C (U(±1/√shift_size)) plus
    its skip ssm_k_D ~ N(0, 1) on tap 0. Deviations left: the official kernels also train
    the input maps (the shift SSM's, starting at e_0, and the diagonal SSM's, starting at 1),
    which only reparametrises the same kernels; its output channels come in (j, head) order, a
    permutation that the output projection absorbs.
    To copy: this class, conv1d_init_ and H3 with what its line names.
    """

    discretization = "bilinear"

    def shift_taps(self, d_model, shift_size):
        taps = ExplicitFilter(d_model, shift_size)
        conv1d_init_(taps.h, fan_in=shift_size)
        with torch.no_grad():
            taps.h[:, 0] += torch.randn(d_model)
        return taps


class OfficialRWKV(RWKV):
    """form="official": RWKVTimeMixer's initialisation (zoology/mixers/rwkv.py), which ramps
    with the layer: with a = layer_idx/(n_layer-1), b = 1 - layer_idx/n_layer and the
    official default n_layer = 12 (Figure 2's configs do not pass it),
    w_log = -5 + 8·(i/(d-1))^(0.7 + 1.3a), u = log 0.3 + 0.5·((i+1) mod 3 - 1),
    μ_k = (i/d)^b, μ_v = (i/d)^b + 0.3a, μ_r = (i/d)^(b/2). The same layer as RWKV's
    otherwise. Deviation: the official CUDA kernel returns wkv in bfloat16; ours stays in
    the input's precision.
    To copy: this class and RWKV with what its line names.
    """

    def __init__(self, d_model, seq_len, layer_idx=0, impl="fast", chunk_size=64):
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
            raise ValueError(f"layer_idx={layer_idx!r} is not allowed: layer_idx must be an "
                             "integer >= 0")
        super().__init__(d_model, seq_len, impl, chunk_size)
        d, n_layer = d_model, 12
        i = torch.arange(d, dtype=torch.float32)
        a, b = layer_idx / (n_layer - 1), 1 - layer_idx / n_layer
        with torch.no_grad():                    # values only: nothing random is drawn
            self.w_log.copy_(-5 + 8 * (i / max(d - 1, 1)) ** (0.7 + 1.3 * a))
            self.u.copy_(math.log(0.3) + 0.5 * ((i + 1) % 3 - 1))
            self.mix_r.copy_((i / d) ** (0.5 * b))
            self.mix_k.copy_((i / d) ** b)
            self.mix_v.copy_((i / d) ** b + 0.3 * a)


def official_selection_aux_loss(f, budget):
    """max(0, mean(f) - budget/N), the mean over batch and positions: the official
    SigmoidLookups' penalty (before its weight). f (B, N)."""
    return torch.relu(f.mean() - budget / f.shape[-1])


class OfficialSelectiveAttention(Mixer):
    """form="official": Zoology's SigmoidLookups (zoology/mixers/selective.py), a learned
    selection: f = σ(u·gate) without a bias (gate drawn N(0, 0.02), as the official init
    draws its nn.Linear(d, 1, bias=False)), y = f ⊙ attention(u) + u (the input passes
    through every row), aux loss aux_weight·max(0, mean(f) - top_k/N) over batch and
    positions with aux_weight 0.001 and top_k = √N (its defaults). At inference (inference="topk", its rule)
    the ⌈√N⌉ rows of largest f get u + f ⊙ attention(u), the others u; "threshold" keeps
    the rows with f > 0.5 (causal: `step` runs it). State of `step`: the KV cache, 2·t·d.
    To copy: this class, top_k_rows, official_selection_aux_loss and Attention with what its
    line names.
    """

    selected = None     # after a forward: the rows it kept, (B, T) (train.selected_rows)

    def __init__(self, d_model, seq_len, num_heads=1, top_k=None, inference="topk",
                 aux_weight=0.001, impl="fast"):
        super().__init__()
        check_choice("inference", inference, ("threshold", "topk"))
        if top_k is not None:
            check_positive("top_k", top_k)
        if not aux_weight >= 0:
            raise ValueError(f"aux_weight={aux_weight!r} is not allowed: it must be >= 0")
        self.inference, self.top_k, self.aux_weight = inference, top_k, aux_weight
        self.attention = Attention(d_model, seq_len, num_heads=num_heads, impl=impl)
        self.gate = nn.Parameter(0.02 * torch.randn(d_model))

    def forward(self, x, tokens=None):
        f = torch.sigmoid(x @ self.gate)                                     # (B, T)
        budget = self.top_k if self.top_k is not None else math.sqrt(x.shape[1])
        self.aux_loss = self.aux_weight * official_selection_aux_loss(f, budget)
        if not self.training:         # the kept rows carry their soft f
            f = f * (top_k_rows(f, math.ceil(budget)) if self.inference == "topk" else f > 0.5)
        self.selected = f.detach()                 # the last forward's rows (train.py counts)
        return self.attention(x) * f[..., None] + x

    def step(self, x_t, state=None):
        if self.inference == "topk":
            raise ValueError("inference='topk' is not allowed in step: the whole-sequence "
                             "top-k is not causal; use inference='threshold'")
        y, kv = self.attention.step(x_t, state)
        f = torch.sigmoid(x_t @ self.gate)                                   # (B,)
        if not self.training:
            f = f * (f > 0.5)
        return y * f[:, None] + x_t, kv

    def state_size(self, t):
        return 2 * t * self.attention.out_proj.in_features
