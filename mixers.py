"""Sequence mixers for Zoology (Arora et al., 2023), each runnable in parallel and token by token.

Implements SPEC §3 (../shared/paper/SPEC.md), the mixers the paper compares:
  attention   softmax(QKᵀ/√d_h + causal mask) V, multi-head, output projection
              (Vaswani et al., 2017; the baseline of Figure 2).

The interface every mixer follows (`MIXERS[name](d_model, seq_len, **options)`):
  forward(x)          x (B, T, D) -> y (B, T, D), causal: y[:, t] depends on x[:, :t+1] only.
  step(x_t, state)    x_t (B, D); state=None starts a sequence; returns (y_t, new_state)
                      with y_t == forward(x)[:, t]. The state is a tuple of tensors whose
                      leading dimension is B.
  state_size(t)       numbers per sequence that the state holds after t tokens; equal to the
                      real size of what `step` returns (the paper's "recall vs memory" axis).

The math lives in pure functions on tensors (`attention(q, k, v)`); an nn.Module only holds
parameters and calls them. Where a mixer has a fast form and a readable reference, both
take the same arguments and an `impl` argument picks one; the tests assert they agree.

Glossary (code name -> paper symbol):
  B batch, T sequence length (the paper's N), D model width (d), H heads,
  hs = D // H head size (d_h), c vocabulary size.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


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


def check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be an integer >= 1")


def state_numel(state):
    """Numbers per sequence in a state (a tuple of tensors with batch as dimension 0)."""
    return sum(s[0].numel() for s in state)


# ----------------------------------------------------------------------------------------
# attention (SPEC §3; Figure 2's baseline)

def attention_reference(q, k, v):
    """Causal softmax attention, written out: softmax(QKᵀ/√hs + M) V, M[i, j] = -inf for j > i.

    q, k, v: (B, H, T, hs). Materializes the (B, H, T, T) score matrix.
    """
    T, hs = q.shape[-2], q.shape[-1]
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(hs)         # (B, H, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("bhij,bhjd->bhid", scores.softmax(dim=-1), v)      # (B, H, T, hs)


def attention_fast(q, k, v):
    """The same function through PyTorch's fused kernel (flash / memory-efficient on GPU)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


ATTENTION_IMPLS = {"fast": attention_fast, "reference": attention_reference}


class Attention(nn.Module):
    """Multi-head causal self-attention with an output projection.

    The official MQAR configs use 1 head and attention dropout 0.1. We use no dropout, so
    that `forward` and `step` compute one function; on MQAR a run reaches 0.99 before it
    has seen its 100,000 training examples once, so there is little to regularise.
    The state of `step` is the KV cache: 2·t·D numbers after t tokens.
    """

    def __init__(self, d_model, seq_len, num_heads=1, impl="fast", bias=True):
        super().__init__()
        check_divides("num_heads", num_heads, d_model)
        check_choice("impl", impl, tuple(ATTENTION_IMPLS))
        self.num_heads, self.impl = num_heads, impl
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _heads(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        return [t.view(B, T, self.num_heads, D // self.num_heads).transpose(1, 2)
                for t in (q, k, v)]                                          # (B, H, T, hs)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self._heads(x)
        y = ATTENTION_IMPLS[self.impl](q, k, v)                              # (B, H, T, hs)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))

    def step(self, x_t, state=None):
        B, D = x_t.shape
        q, k, v = self._heads(x_t[:, None])                                  # (B, H, 1, hs)
        if state is not None:
            k = torch.cat([state[0], k], dim=2)                              # (B, H, t, hs)
            v = torch.cat([state[1], v], dim=2)
        # the newest query may see every cached key: no mask needed
        w = torch.einsum("bhd,bhjd->bhj", q[:, :, 0], k) / math.sqrt(D // self.num_heads)
        y = torch.einsum("bhj,bhjd->bhd", w.softmax(dim=-1), v)             # (B, H, hs)
        return self.out_proj(y.reshape(B, D)), (k, v)

    def state_size(self, t):
        return 2 * t * self.out_proj.in_features


# ----------------------------------------------------------------------------------------
# the registry: one plain dict

MIXERS = {
    "attention": Attention,
}


# ----------------------------------------------------------------------------------------
# benchmark: fast form vs reference for every mixer

def _forward_seconds(mixer, x, repeats=3):
    with torch.no_grad():
        mixer(x)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            mixer(x)
            best = min(best, time.perf_counter() - t0)
    return best


def bench(shapes=((8, 512, 64), (2, 4096, 64))):
    """Forward time of each mixer's fast form and reference, and its state size."""
    torch.manual_seed(0)
    print(f"{'mixer':<20}{'B':>3}{'T':>6}{'D':>4}{'fast s':>10}{'ref s':>10}{'ref/fast':>9}"
          f"{'state':>10}")
    for B, T, D in shapes:
        x = torch.randn(B, T, D)
        for name, cls in MIXERS.items():
            fast, ref = cls(D, T, impl="fast"), cls(D, T, impl="reference")
            ref.load_state_dict(fast.state_dict())
            tf, tr = _forward_seconds(fast, x), _forward_seconds(ref, x)
            print(f"{name:<20}{B:>3}{T:>6}{D:>4}{tf:>10.4f}{tr:>10.4f}{tr / tf:>9.1f}"
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
