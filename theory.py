"""Appendix H of Zoology (Arora et al., 2023), executable and checked on random instances.

Implements, in the order of the paper's appendix H:
  H.1     notation: poly, poly*, coeff; linear and cyclic convolution three ways; Hadamard.
  H.1     arithmetic circuits (Def H.1): size, depth, width, degree.
  H.2     the (N, L, d, N', d') gated convolution model (Def H.2): zero-padding embedding and
          top-left read-out; K-matrices (Def H.3, H.17): butterfly factors and products.
  H.3     BaseConv y = (uW + b1) ⊙ (h * u + b2) (Section 4), its stacks and primitives
          (projection, convolution, gate, shift_down, shift_up, add, stacking, remember).
  H.7-8   MQAR constructions of Section 4: Prop 4.3 (attention, 2 layers), Thm 4.4
          (input-independent filters, width ~ N; H.7), Thm 4.5 (input-dependent filters,
          autocorrelation lags; H.8).
  H.5     arithmetic circuits compiled into BaseConv stacks (Thm H.5).
  Thm 4.2 the Hyena, H3, RetNet and RWKV layers of mixers.py (random, float64) as BaseConv
          stacks with weights set from the layer: Hyena and H3 exactly; RetNet up to its
          retention heads (group norm and swish are not polynomials); RWKV's wkv numerator
          and denominator from e^k (exp and the division are not polynomials).
  H.6     the state a gated recurrence needs for MQAR (INDEX bound, counting form): every
          context enumerated for tiny sizes; states with fewer bits confuse two contexts
          (found explicitly); the least number of states by exhaustive search; a RetNet
          d x d state of the bound's size that is exact.

Glossary (code name -> paper symbol):
  N          sequence length N (rows of u);     d   model width d (columns of u)
  Np, dp     inner dimension N', d' of Def H.2
  L          number of layers of a stack;        Layer(W, b1, h, b2, cyclic) one BaseConv layer
  W          projection W in R^{d' x d'};   b1, b2 in R^{N' x d'} (position-dependent
             biases); h the filters, one per channel: the paper's h in R^{N' x d'} stored
             transposed, (d', N') with lag s in column s, as mixers.py stores filters (d, K)
  c          vocabulary size; D number of key-value pairs; b = ceil(log2 c) bits per token
  s          shift / look-back distance; num_lags the number of interaction distances
             (Thm 4.5's t, mixers.InputDependentConv's num_lags)
  d_model, T, H, hd, hs  in the Thm 4.2 section: a mixer's width d_model, its sequence
             length T (= N), heads H, H3's head_dim hd, RetNet's head size hs
  n          the length of a vector (H.1: poly, coeff, the moduli X^n and X^n - 1)
  num_vars, size, depth, width   an arithmetic circuit's variables, nodes, depth and width
             (Def H.1)
  m          size of a K-matrix (a power of two)
  c_k, c_v   numbers of keys and of values of the enumerated MQAR contexts (H.6), `contexts`
             their number; d_k x d_v the RetNet state (d x d in the paper), gamma its decay
Spelled out rather than lettered, as in mixers.py: the gating matrix of `gate` (gates),
Hyena's order (order); F is torch.nn.functional and M train.py's labelled positions.

Conventions: 1-D convolutions act on the last axis ("vectors", H.1); in layers and models the
sequence is the second-to-last axis of u (..., N, d) and every channel is convolved with its
own filter (the paper's column-wise extension). The linear convolutions and the BaseConv
layer are mixers.py's (causal_conv_direct, causal_conv_fft, base_conv); what is written here
is what mixers.py has no use for: the polynomial and cyclic forms. Computations run in
float64 so that checks of exact constructions can use tight tolerances.

Errata of the printed paper each have a test showing the printed form fails:
shift_down uses the filter X^s (not X^{s+1}); cyclic convolution with the identity filter
is the identity, it does not reverse; the attention construction needs a causal mask;
the top autocorrelation lags need not cover the needed distances; an FFT convolution needs
zero padding to 2N to be linear.

Each claim has a check_...(seed) right below its construction, returning report rows
(statement, check, resources vs bound) computed on random instances; CHECKS lists them.
`python theory.py` prints them as a table, and test_all.py asserts that every row passes.
"""
import itertools
import math
import random
from dataclasses import dataclass, replace

import torch

import mixers
from mixers import check_choice
from mqar import IGNORE, check_int, multiquery_ar

DTYPE = torch.float64


@dataclass(frozen=True)
class Check:
    """The check column of a report row: whether the check held, and its evidence (what was
    measured). The tests assert `ok`; the report colours it."""
    ok: bool
    evidence: str = ""

    def __str__(self):                                                      # rich markup
        return ("[green]pass[/green]" if self.ok else "[red]FAIL[/red]") + self.evidence


def _ok(flag, evidence=""):
    return Check(bool(flag), evidence)


def _exact_row(statement, pred, labels, resources, controls=True):
    """A report row for a construction that must answer every MQAR query (and whose
    negative controls, if any, must hold)."""
    acc = mqar_accuracy(pred, labels)
    return statement, _ok(acc == 1.0 and controls, f" acc {acc:.2f}"), resources


# ----------------------------------------------------------------------------------------
# H.1 notation: polynomials, convolutions, Hadamard product

def poly(u):
    """poly(u) = sum_{i<n} u[i] X^i (H.1). A polynomial is its coefficient vector, so this is u."""
    return u.clone()


def poly_star(u):
    """poly*(u) = sum_{i<n} u[i] X^{n-1-i} (H.1): the coefficients reversed."""
    return u.flip(-1)


def coeff(p, n):
    """coeff: 𝔽[X] -> 𝔽^n, the coefficients of degree 0..n-1 (H.1); missing ones are 0."""
    return torch.nn.functional.pad(p, (0, n - p.shape[-1]))       # negative (n shorter): crops


def poly_eval(p, x):
    """p(x) = sum_i p[i] x^i, by Horner's rule."""
    out = torch.zeros_like(p[..., 0] * x)
    for a in p.flip(-1).unbind(-1):
        out = out * x + a
    return out


def poly_mul(a, b):
    """The full product a(X) b(X): coefficient k is sum_{i+j=k} a[i] b[j] (degree n_a+n_b-2)."""
    na, nb = a.shape[-1], b.shape[-1]
    outer = a[..., :, None] * b[..., None, :]                               # (..., na, nb)
    k = (torch.arange(na)[:, None] + torch.arange(nb)[None, :]).flatten()
    out = outer.new_zeros(*outer.shape[:-2], na + nb - 1)
    return out.index_add_(-1, k, outer.flatten(-2))


def poly_mod(p, n, modulus):
    """p(X) mod X^n ("X^n": drop degrees >= n) or mod X^n - 1 ("X^n-1": X^n = 1, so degree k
    folds onto k mod n)."""
    check_choice("modulus", modulus, ("X^n", "X^n-1"))
    if modulus == "X^n":
        return coeff(p, n)
    k = torch.arange(p.shape[-1]) % n
    return p.new_zeros(*p.shape[:-1], n).index_add_(-1, k, p)


def _per_channel(conv_fn, u, v):
    """A mixers.py convolution (u (B, T, d) by h (d, K)) on vectors u, v (..., n): each
    leading index one channel."""
    u, v = torch.broadcast_tensors(u, v)
    n = u.shape[-1]
    return conv_fn(u.reshape(1, -1, n).mT, v.reshape(-1, n)).mT.reshape(u.shape)


def conv_direct(u, v):
    """Linear (acyclic) convolution (u * v)[i] = sum_{j<=i} u[j] v[i-j], i < n (H.1).

    The reference, mixers.causal_conv_direct: a loop over the n lags.
    """
    return _per_channel(mixers.causal_conv_direct, u, v)


def conv_poly(u, v):
    """u * v = coeff(u(X) v(X) mod X^n) (H.1)."""
    return poly_mod(poly_mul(poly(u), poly(v)), u.shape[-1], "X^n")


def conv_fft(u, v):
    """u * v = iFFT(FFT(u) FFT(v)) with both zero-padded to 2n, then the first n
    (mixers.causal_conv_fft): a linear, not cyclic, convolution needs the padding (an
    erratum of the printed paper). Without it the FFT product is cyclic_conv_fft.
    """
    return _per_channel(mixers.causal_conv_fft, u, v)


def cyclic_conv_direct(u, v):
    """Cyclic convolution (u ⊛ v)[i] = sum_j u[j] v[(i-j) mod n] (H.1). Materializes (n, n)."""
    n = u.shape[-1]
    circulant = v[..., (torch.arange(n)[:, None] - torch.arange(n)[None, :]) % n]  # (..., n, n)
    return torch.einsum("...ij,...j->...i", circulant, u)


def cyclic_conv_poly(u, v):
    """u ⊛ v = coeff(u(X) v(X) mod X^n - 1) (H.1)."""
    return poly_mod(poly_mul(poly(u), poly(v)), u.shape[-1], "X^n-1")


def cyclic_conv_fft(u, v):
    """u ⊛ v = iFFT(FFT(u) FFT(v)) with n points, no padding."""
    n = u.shape[-1]
    return torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(v, n=n), n=n)


LINEAR_CONV_IMPLS = {"direct": conv_direct, "poly": conv_poly, "fft": conv_fft}
CYCLIC_CONV_IMPLS = {"direct": cyclic_conv_direct, "poly": cyclic_conv_poly,
                     "fft": cyclic_conv_fft}


def conv(u, v, cyclic=False, impl="fft"):
    """u * v (cyclic=False) or u ⊛ v (cyclic=True) along the last axis; impl picks the way."""
    impls = CYCLIC_CONV_IMPLS if cyclic else LINEAR_CONV_IMPLS
    check_choice("impl", impl, tuple(impls))
    if u.shape[-1] != v.shape[-1]:
        raise ValueError(f"v has length {v.shape[-1]}; it must equal the length of u, "
                         f"{u.shape[-1]} (pad the shorter one with zeros)")
    return impls[impl](u, v)


def hadamard(u, v):
    """u ⊙ v = coeff(sum_i u[i] v[i] X^i) (H.1): the coefficient-wise product, i.e. gating."""
    return coeff(poly(u) * poly(v), u.shape[-1])


def check_convolutions(seed=0, sizes=(7, 64)):
    """H.1: u * v and u ⊛ v the three ways agree with the defining sum; two errata: the FFT
    product without zero padding is cyclic, not linear, and 'u ⊛ e_0 reverses u' is false."""
    g = torch.Generator().manual_seed(seed)
    ok = unpadded = kept = True
    for n in sizes:
        u, v = torch.randn(2, 3, n, generator=g, dtype=DTYPE)
        i = n // 2
        for cyclic in (False, True):
            ref = conv(u, v, cyclic, "direct")
            loop = sum(u[..., j] * v[..., (i - j) % n] for j in range(n if cyclic else i + 1))
            ok &= torch.allclose(ref[..., i], loop, atol=1e-9) and all(
                torch.allclose(conv(u, v, cyclic, im), ref, atol=1e-9) for im in ("poly", "fft"))
        fft = torch.fft.irfft(torch.fft.rfft(u) * torch.fft.rfft(v), n=n)
        unpadded &= torch.allclose(fft, conv(u, v, True, "direct")) and (
            n == 1 or not torch.allclose(fft, conv(u, v, False, "direct"), atol=1e-3))
        e0 = torch.eye(n, dtype=DTYPE)[0]
        for impl in ("direct", "poly", "fft"):
            out = conv(u, e0.expand_as(u), True, impl)
            kept &= torch.allclose(out, u) and (n == 1 or not torch.allclose(out, u.flip(-1)))
    return [("H.1  u*v, u⊛v: direct = poly mod = FFT = the sum", _ok(ok), f"n = {sizes}"),
            ("erratum: u * v = iFFT(FFT(u) FFT(v)) unpadded (printed)",
             _ok(unpadded, " (that is u ⊛ v)"), "pad both to 2n"),
            ("erratum: 'u ⊛ e_0 reverses u' (printed)", _ok(kept, " (claim false)"),
             "u ⊛ e_0 = u")]


# ----------------------------------------------------------------------------------------
# H.1 arithmetic circuits (Def H.1)

@dataclass(frozen=True)
class Circuit:
    """An arithmetic circuit in num_vars variables (Def H.1): a DAG listed in topological order.

    Node k is ("var", i) for x_i, ("const", value), ("+", a, b) or ("*", a, b) with a, b < k
    (fan-in 2). The output is the last node.
    """
    num_vars: int
    nodes: tuple


def evaluate(circuit, x, modulus=None):
    """The polynomial computed at the output node, at x.

    x: a tensor (..., num_vars) (returns (...)), or a sequence of num_vars Python ints;
    with `modulus` the arithmetic is done modulo it (exact, for the degree test below).
    """
    xs = x.unbind(-1) if torch.is_tensor(x) else list(x)
    if len(xs) != circuit.num_vars:
        raise ValueError(f"x has {len(xs)} variables; the circuit has "
                         f"num_vars={circuit.num_vars}")
    vals = []
    for node in circuit.nodes:
        if node[0] == "var":
            v = xs[node[1]]
        elif node[0] == "const":
            v = torch.full_like(x[..., 0], node[1]) if torch.is_tensor(x) else node[1]
        elif node[0] == "+":
            v = vals[node[1]] + vals[node[2]]
        else:
            v = vals[node[1]] * vals[node[2]]
        vals.append(v % modulus if modulus is not None else v)
    return vals[-1]


def levels(circuit):
    """level(k): 0 for inputs, 1 + max(level of the two operands) for a gate."""
    lev = []
    for node in circuit.nodes:
        lev.append(0 if node[0] in ("var", "const") else 1 + max(lev[node[1]], lev[node[2]]))
    return lev


def size(circuit):
    """The number of nodes, the circuit's size (Def H.1)."""
    return len(circuit.nodes)


def depth(circuit):
    """The depth: the length (in edges) of the longest path from an input node to the output."""
    return levels(circuit)[-1]


def _edges(circuit):
    return [(a, k) for k, node in enumerate(circuit.nodes) if node[0] in ("+", "*")
            for a in node[1:]]


def width(circuit):
    """The width: the most wires crossing one horizontal cut (Def H.1), made precise as follows.

    Place each node at its level; the cut between levels l and l+1 (l = 0..depth-1) is
    crossed by every edge a -> k with level(a) <= l < level(k). The width is the largest
    such count over the `depth` cuts (a circuit of depth 0 has width 1: its output wire).
    Distinct values crossing a cut (`live_values`) are never more than the wires.
    """
    lev, edges = levels(circuit), _edges(circuit)
    cuts = [sum(lev[a] <= l < lev[k] for a, k in edges) for l in range(depth(circuit))]
    return max(cuts, default=1)


def live_values(circuit):
    """For each cut l: the sorted nodes at level <= l used by some node at level > l."""
    lev, edges = levels(circuit), _edges(circuit)
    return [sorted({a for a, k in edges if lev[a] <= l < lev[k]})
            for l in range(depth(circuit))]


def degree_bound(circuit):
    """deg <= the propagated bound: 1 for a variable, 0 for a constant, max for +, sum for x."""
    deg = []
    for node in circuit.nodes:
        if node[0] in ("var", "const"):
            deg.append(int(node[0] == "var"))
        elif node[0] == "+":
            deg.append(max(deg[node[1]], deg[node[2]]))
        else:
            deg.append(deg[node[1]] + deg[node[2]])
    return deg[-1]


def expand(circuit):
    """The output polynomial as {exponent tuple: integer coefficient} (integer constants only).

    The reference for `degree`: exact, but the number of monomials can grow exponentially.
    """
    _check_integer_constants(circuit)
    num_vars, polys = circuit.num_vars, []
    for node in circuit.nodes:
        if node[0] == "var":
            p = {tuple(int(j == node[1]) for j in range(num_vars)): 1}
        elif node[0] == "const":
            p = {(0,) * num_vars: node[1]} if node[1] else {}
        elif node[0] == "+":
            p = dict(polys[node[1]])
            for mono, a in polys[node[2]].items():
                p[mono] = p.get(mono, 0) + a
        else:
            p = {}
            for (mono1, a1), (mono2, a2) in itertools.product(polys[node[1]].items(),
                                                              polys[node[2]].items()):
                mono = tuple(e1 + e2 for e1, e2 in zip(mono1, mono2))
                p[mono] = p.get(mono, 0) + a1 * a2
        polys.append({mono: a for mono, a in p.items() if a})
    return polys[-1]


def _check_integer_constants(circuit):
    for node in circuit.nodes:
        if node[0] == "const" and not isinstance(node[1], int):
            raise ValueError(f"constant {node[1]!r} is not allowed here: the exact degree "
                             "needs integer constants")


PRIME = 2**61 - 1


def degree_symbolic(circuit, seed=0):
    """deg of the output polynomial by expanding it (-1 for the zero polynomial)."""
    return max((sum(mono) for mono in expand(circuit)), default=-1)


def degree_random(circuit, seed=0):
    """deg of the output polynomial, exact with probability >= 1 - deg/p (Schwartz-Zippel).

    Restrict p to a random line q(t) = p(a + t b) over Z_p, p = 2^61 - 1: deg q = deg p
    unless the top homogeneous part of p vanishes at b. Evaluate q at t = 0..bound
    (degree_bound) and take the highest k whose k-th forward difference at 0 is nonzero:
    for a polynomial of degree k < p that difference is k! times its leading coefficient.
    Cost: bound + 1 circuit evaluations, no expansion.
    """
    _check_integer_constants(circuit)
    rng = random.Random(seed)
    a = [rng.randrange(PRIME) for _ in range(circuit.num_vars)]
    b = [rng.randrange(PRIME) for _ in range(circuit.num_vars)]
    bound = degree_bound(circuit)
    diffs = [evaluate(circuit, [(ai + t * bi) % PRIME for ai, bi in zip(a, b)], PRIME)
             for t in range(bound + 1)]
    deg = -1
    for k in range(bound + 1):
        if diffs[0] % PRIME:
            deg = k
        diffs = [(y1 - y0) % PRIME for y0, y1 in zip(diffs, diffs[1:])]
    return deg


DEGREE_IMPLS = {"symbolic": degree_symbolic, "random": degree_random}


def degree(circuit, impl="random", seed=0):
    """The degree of the polynomial the circuit computes (Def H.1); -1 for the zero polynomial."""
    check_choice("impl", impl, tuple(DEGREE_IMPLS))
    return DEGREE_IMPLS[impl](circuit, seed)


def random_circuit(num_vars, depth, width, seed, num_consts=2):
    """A random circuit of exactly the given depth, about `width` gates per level.

    Level 0 holds x_0..x_{num_vars-1} and `num_consts` integer constants from [-2, 2]. Each gate of
    level l takes one operand from level l-1 and one from any earlier level, with + or x
    at random; the last level is one gate, the output. Nodes that do not reach the output
    are dropped, so size counts only nodes that matter.
    """
    check_int("num_vars", num_vars, 1, "an integer >= 1")
    check_int("depth", depth, 1, "an integer >= 1")
    check_int("width", width, 1, "an integer >= 1")
    rng = random.Random(seed)
    nodes = [("var", i) for i in range(num_vars)]
    nodes += [("const", rng.randint(-2, 2)) for _ in range(num_consts)]
    prev = list(range(len(nodes)))
    for l in range(1, depth + 1):
        start = len(nodes)
        for _ in range(width if l < depth else 1):
            nodes.append((rng.choice("+*"), rng.choice(prev), rng.randrange(start)))
        prev = list(range(start, len(nodes)))
    return _prune(Circuit(num_vars, tuple(nodes)))


def _prune(circuit):
    """Keep the variables and the ancestors of the output, renumbered in the same order."""
    keep = {len(circuit.nodes) - 1}
    for k, node in reversed(list(enumerate(circuit.nodes))):
        if k in keep and node[0] in ("+", "*"):
            keep.update(node[1:])
    keep.update(k for k, node in enumerate(circuit.nodes) if node[0] == "var")
    new = {k: j for j, k in enumerate(sorted(keep))}
    nodes = tuple(node if node[0] in ("var", "const") else (node[0], new[node[1]], new[node[2]])
                  for k, node in enumerate(circuit.nodes) if k in keep)
    return Circuit(circuit.num_vars, nodes)


def check_degree(seed=0, count=8):
    """Def H.1 on random circuits: the Schwartz-Zippel degree is the expanded one, at most the
    bound; depth is as asked, width bounds the live values, evaluation is the expansion. And
    on x0·x1 + (-1)·(x0·x1) + x0, whose degree 1 is below its bound 2 (partial cancellation,
    which random circuits this small rarely show)."""
    g = torch.Generator().manual_seed(seed)
    cs = [random_circuit(1 + k % 3, 1 + k % 4, 1 + k % 3, seed=seed + k) for k in range(count)]
    cancelling = Circuit(2, (("var", 0), ("var", 1), ("const", -1), ("*", 0, 1), ("*", 2, 3),
                             ("+", 3, 4), ("+", 5, 0)))
    ok = (degree(cancelling, "random", seed) == degree(cancelling, "symbolic") == 1
          < degree_bound(cancelling) == 2)
    for k, circuit in enumerate(cs):
        x = torch.randn(circuit.num_vars, generator=g, dtype=DTYPE)
        ref = sum(a * math.prod(x[j].item() ** e for j, e in enumerate(mono))
                  for mono, a in expand(circuit).items())
        ok &= (degree(circuit, "random", seed) == degree(circuit, "symbolic")
               <= degree_bound(circuit) and depth(circuit) == 1 + k % 4
               and all(len(l) <= width(circuit) for l in live_values(circuit))
               and abs(evaluate(circuit, x).item() - ref) <= 1e-8 * (1 + abs(ref)))
    return [("Def H.1  degree (Schwartz-Zippel) = expanded", _ok(ok),
             f"{count} circuits, sizes {min(map(size, cs))}-{max(map(size, cs))}")]


# ----------------------------------------------------------------------------------------
# H.2 the gated convolution model (Def H.2) and K-matrices (Def H.3, H.17)

def embed(u, Np, dp):
    """u' in R^{N' x d'} with u'[i, j] = u[i, j] if i < N and j < d, else 0 (Def H.2)."""
    N, d = u.shape[-2:]
    if Np < N or dp < d:
        raise ValueError(f"inner dimension (Np, dp)=({Np}, {dp}) is not allowed: it must be "
                         f"at least the input's (N, d)=({N}, {d})")
    return torch.nn.functional.pad(u, (0, dp - d, 0, Np - N))


def read_out(z, N, d):
    """y = the top-left N x d entries of the last layer's output z (Def H.2)."""
    return z[..., :N, :d]


def gated_conv_model(u, layers, Np, dp):
    """An (N, L, d, N', d') gated convolution model (Def H.2): embed, L layers, read out.

    layers: L functions from (..., N', d') to (..., N', d'), each built from gating,
    convolution and linear projection (for BaseConv see `baseconv_model`).
    """
    N, d = u.shape[-2:]
    z = embed(u, Np, dp)
    for layer in layers:
        z = layer(z)
    return read_out(z, N, d)


def butterfly_factor_dense(twiddle):
    """The butterfly factor matrix B_k^{(m)} (Def H.17) as a dense (m, m) matrix.

    twiddle: (m/k, 4, k/2), the diagonals of the m/k blocks [[D1, D2], [D3, D4]] of size k
    on the block diagonal. 2m nonzeros. The reference; materializes (m, m).
    """
    blocks, _, half = twiddle.shape
    k, m = 2 * half, blocks * 2 * half
    dense = twiddle.new_zeros(m, m)
    i = torch.arange(half)
    for blk, o in enumerate(range(0, m, k)):
        for q, (row, col) in enumerate(((0, 0), (0, half), (half, 0), (half, half))):
            dense[o + row + i, o + col + i] = twiddle[blk, q]
    return dense


def butterfly_factor_apply(x, twiddle):
    """B_k^{(m)} x for each row x of (..., m), in O(m): split each block in halves x1, x2,
    return (D1 x1 + D2 x2, D3 x1 + D4 x2)."""
    blocks, _, half = twiddle.shape
    x1, x2 = x.reshape(*x.shape[:-1], blocks, 2, half).unbind(-2)           # (..., m/k, k/2)
    y1 = twiddle[:, 0] * x1 + twiddle[:, 1] * x2
    y2 = twiddle[:, 2] * x1 + twiddle[:, 3] * x2
    return torch.stack([y1, y2], dim=-2).reshape(x.shape)


def butterfly_factor_adjoint(twiddle):
    """(B_k^{(m)})^* is again a butterfly factor: [[D1*, D3*], [D2*, D4*]]."""
    return twiddle[:, [0, 2, 1, 3]].conj()


def kmatrix_dense(factors):
    """The product of the butterfly factor matrices, factors[0] leftmost. Materializes (m, m)."""
    product = butterfly_factor_dense(factors[0])
    for tw in factors[1:]:
        product = product @ butterfly_factor_dense(tw)
    return product


def kmatrix_apply(x, factors, impl="fast"):
    """The K-matrix (kmatrix_dense's product of the r factors) times each row x of (..., m):
    "dense" multiplies by the materialized matrix (O(m^2)), "fast" applies the factors right
    to left (O(r m))."""
    check_choice("impl", impl, ("dense", "fast"))
    if impl == "dense":
        return x @ kmatrix_dense(factors).T
    for tw in reversed(factors):
        x = butterfly_factor_apply(x, tw)
    return x


def _check_power_of_two(name, m):
    if isinstance(m, bool) or not isinstance(m, int) or m < 2 or m & (m - 1):
        raise ValueError(f"{name}={m!r} is not allowed: {name} must be a power of two >= 2")


def bit_reversal(m):
    """perm with (P x)[i] = x[perm[i]], perm[i] = i with its log2(m) bits reversed."""
    _check_power_of_two("m", m)
    bits = m.bit_length() - 1
    return torch.tensor([int(format(i, f"0{bits}b")[::-1], 2) for i in range(m)])


def dft_butterfly(m):
    """The DFT matrix F_m[j, k] = w^{jk}, w = exp(-2 pi i / m), as butterfly factors (Def H.17).

    Cooley-Tukey: F_m = B_m (I_2 (x) F_{m/2}) P_m, with B_k = [[I, Om], [I, -Om]],
    Om = diag(w_k^j, j < k/2). Unrolled: F_m = B_m^{(m)} B_{m/2}^{(m)} ... B_2^{(m)} P with P
    the bit-reversal permutation: log2(m) factors of 2m nonzeros each.
    Returns (factors, perm) with F_m x = kmatrix_apply(x[..., perm], factors).
    """
    _check_power_of_two("m", m)
    factors, k = [], m
    while k >= 2:
        half = k // 2
        om = torch.exp(-2j * math.pi * torch.arange(half, dtype=DTYPE) / k)
        one = torch.ones(half, dtype=torch.complex128)
        block = torch.stack([one, om, one, -om])                             # (4, k/2)
        factors.append(block.expand(m // k, 4, half).clone())
        k = half
    return factors, bit_reversal(m)


def random_kmatrix(m, w, generator):
    """A random K-matrix in (B B^*)^w (Def H.3, H.17): w products of a butterfly matrix
    B = B_m ... B_2 and the adjoint of another, 2 w log2(m) factors, 4 w m log2(m) parameters.
    (The expansion e of Def H.17, embedding in a larger matrix and taking the top-left
    block, is omitted: it only matters for non-power-of-two sizes.)"""
    _check_power_of_two("m", m)
    check_int("w", w, 1, "an integer >= 1")
    sizes = [m >> j for j in range(m.bit_length() - 1)]                      # m, m/2, ..., 2
    factors = []
    for _ in range(w):
        butterfly, other = ([torch.randn(m // k, 4, k // 2, generator=generator, dtype=DTYPE)
                             for k in sizes] for _ in range(2))
        factors += butterfly + [butterfly_factor_adjoint(tw) for tw in reversed(other)]
    return factors


def kmatrix_params(factors):
    """Number of parameters (= nonzeros of the factors): 2m per factor."""
    return sum(tw.numel() for tw in factors)


def check_kmatrices(seed=0, m=64, w=1):
    """Def H.17: DFT_m is log2 m butterfly factors times the bit reversal (without it, not the
    DFT); Def H.3: a K-matrix in (BB*)^w, fast = dense, dense from 4 w m log m numbers."""
    g, logm = torch.Generator().manual_seed(seed), m.bit_length() - 1
    factors, perm = dft_butterfly(m)
    j = torch.arange(m, dtype=DTYPE)
    dft_matrix = torch.exp(-2j * math.pi * torch.outer(j, j) / m)
    x = torch.randn(4, m, generator=g, dtype=DTYPE)
    xc = x.to(torch.complex128)
    nnz = sum(int((butterfly_factor_dense(tw) != 0).sum()) for tw in factors)
    dft = (torch.allclose(kmatrix_dense(factors)[:, perm.argsort()], dft_matrix, atol=1e-9)
           and torch.allclose(kmatrix_apply(xc[:, perm], factors), torch.fft.fft(xc), atol=1e-9)
           and len(factors) == logm and nnz == kmatrix_params(factors) == 2 * m * logm
           and (m == 2 or not torch.allclose(kmatrix_dense(factors), dft_matrix, atol=1e-3)))
    K = random_kmatrix(m, w, g)
    fast = (torch.allclose(kmatrix_apply(x, K), kmatrix_apply(x, K, "dense"), atol=1e-9)
            and len(K) == 2 * w * logm and kmatrix_params(K) == 4 * w * m * logm
            and (kmatrix_dense(K) != 0).all()
            # the adjoint is the conjugate transpose: on K's real factor and the DFT's complex ones
            and all(torch.equal(butterfly_factor_dense(butterfly_factor_adjoint(tw)),
                                butterfly_factor_dense(tw).T.conj()) for tw in [K[-1], *factors]))
    return [("Def H.17 DFT_m = B_m...B_2 P (bit reversal)", _ok(dft),
             f"m={m}: {kmatrix_params(factors)} nonzeros = 2m log m vs m² = {m * m}"),
            (f"Def H.3  K-matrix (BB*)^{w}: fast = dense", _ok(fast),
             f"{kmatrix_params(K)} params = 4wm log m vs m² = {m * m}")]


# ----------------------------------------------------------------------------------------
# Section 4 and H.3: the BaseConv layer, its stacks and its primitives

@dataclass(frozen=True)
class Layer:
    """The parameters of one BaseConv layer on N' x d' inputs (Section 4).

    W (d', d') projection; b1, b2 (N', d') position-dependent biases; h (d', N') one filter
    per channel, lag s in column s (mixers.py's layout, the transpose of the paper's
    h in R^{N' x d'}); cyclic: convolve cyclically (u ⊛ h, used by shift_up and Thm H.5) or
    causally.
    """
    W: torch.Tensor
    b1: torch.Tensor
    h: torch.Tensor
    b2: torch.Tensor
    cyclic: bool = False


def baseconv(u, layer, impl="fast"):
    """y = (u W + b1) ⊙ (h * u + b2)   (Section 4, the BaseConv layer; ⊛ when cyclic).

    u: (..., N', d'). Computed by mixers.base_conv, with its impl ("fast" or "reference").
    mixers.py has no cyclic convolution: a cyclic layer is the same layer on [u; u] (and
    [b; b]), read at the last N' rows, since h has N' taps and row N' + i of h * [u; u] is
    sum_{s<N'} h[s] u[(i - s) mod N'] = (h ⊛ u)[i].
    """
    Np, dp = u.shape[-2:]
    if layer.h.shape != (dp, Np) or layer.W.shape != (dp, dp):
        raise ValueError(f"u has (N', d')=({Np}, {dp}) but the layer is built for "
                         f"h {tuple(layer.h.shape)} and W {tuple(layer.W.shape)}")
    z, b1, b2 = (torch.cat([t] * (1 + layer.cyclic), -2) for t in (u, layer.b1, layer.b2))
    y, _ = mixers.base_conv(z.reshape(-1, *z.shape[-2:]), layer.W, b1, layer.h, b2, impl)
    return y[:, -Np:].reshape(u.shape)


def baseconv_stack(u, layers, impl="fast"):
    """Apply the layers in order: the stacked model of Def H.2 without embedding / read-out."""
    for layer in layers:
        u = baseconv(u, layer, impl)
    return u


def baseconv_model(u, layers, impl="fast"):
    """The (N, L, d, N', d') BaseConv model of Def H.2: embed u (..., N, d) into the layers'
    N' x d', apply the L layers, read out the top-left N x d block."""
    Np, dp = layers[0].b1.shape
    return gated_conv_model(u, [lambda z, l=l: baseconv(z, l, impl) for l in layers], Np, dp)


def inner_dim(layers):
    """(L, N', d') of a stack."""
    return (len(layers), *layers[0].b1.shape)


def _zeros(Np, dp):
    return torch.zeros(Np, dp, dtype=DTYPE)


def _ones(Np, dp):
    return torch.ones(Np, dp, dtype=DTYPE)


def impulse(Np, dp, s):
    """The filter X^s in each of dp channels, (dp, N'): column s is 1, the rest 0."""
    h = _zeros(dp, Np)
    h[:, s] = 1
    return h


def projection(W, Np):
    """u -> u W in one layer (H.3): h = 0, b2 = 1, b1 = 0."""
    dp = W.shape[0]
    return [Layer(W.to(DTYPE), _zeros(Np, dp), _zeros(dp, Np), _ones(Np, dp))]


def convolution(h, cyclic=False):
    """u -> h * u in one layer (H.3): W = 0, b1 = 1, b2 = 0."""
    dp, Np = h.shape
    return [Layer(_zeros(dp, dp), _ones(Np, dp), h.to(DTYPE), _zeros(Np, dp), cyclic)]


def gate(gates, cyclic=False):
    """u -> gates ⊙ u in one layer (H.3): W = 0, h = e_0 (the identity filter), b1 = gates,
    b2 = 0."""
    Np, dp = gates.shape
    return [Layer(_zeros(dp, dp), gates.to(DTYPE), impulse(Np, dp, 0), _zeros(Np, dp), cyclic)]


def identity(Np, dp, cyclic=False):
    """u -> u in one layer: the gate by the all-ones matrix."""
    return gate(_ones(Np, dp), cyclic)


def _check_shift(s, Np):
    check_int("s", s, 0, f"an integer in [0, N') = [0, {Np})")
    if s >= Np:
        raise ValueError(f"s={s} is not allowed: s must be in [0, N') = [0, {Np})")


def shift_down(Np, dp, s):
    """shift_down(u, s)[i] = u[i - s] (0 for i < s): one causal layer with filter X^s (H.3).

    Erratum of the printed paper: one place of it writes the filter as X^{s+1}; that shifts by s+1.
    """
    _check_shift(s, Np)
    return convolution(impulse(Np, dp, s))


def shift_up(Np, dp, s):
    """shift_up(u, s)[i] = u[i + s] (0 for i >= N' - s): one cyclic layer (H.3, corrected).

    A causal convolution cannot move row i + s to row i (row i of h * u sees rows <= i only).
    The cyclic filter X^{(N'-s) mod N'} rotates every row up by s; b1 = 1 on rows i < N' - s
    and 0 below zeroes the rows that wrapped around. The paper uses three layers for this;
    one suffices once the middle one is cyclic.
    """
    _check_shift(s, Np)
    keep = _zeros(Np, dp)
    keep[:Np - s] = 1
    return [Layer(_zeros(dp, dp), keep, impulse(Np, dp, (Np - s) % Np),
                  _zeros(Np, dp), cyclic=True)]


def add(n, dp):
    """Row blocks (x, S, 0) of n rows each -> (x, S + x, 0) (H.3, "add").

    One layer: filter 1 + X^n adds every row to the row n below it, giving (x, S + x, S),
    and b1 zeroes the last block (W = 0). The paper states it with two layers.
    """
    check_int("n", n, 1, "an integer >= 1")
    h = impulse(3 * n, dp, 0) + impulse(3 * n, dp, n)
    keep = _zeros(3 * n, dp)
    keep[:2 * n] = 1
    return [Layer(_zeros(dp, dp), keep, h, _zeros(3 * n, dp))]


def stack(*stacks):
    """Composition: an L1-layer and an L2-layer BaseConv give an (L1 + L2)-layer one (H.3)."""
    shapes = {layers[0].b1.shape for layers in stacks if layers}
    if len(shapes) > 1:
        raise ValueError(f"the stacks have inner dimensions {sorted(shapes)}; they must agree "
                         "(embed the smaller one first)")
    return [layer for layers in stacks for layer in layers]


def parallel(a, b):
    """Run stack a on the first d_a channels and stack b on the last d_b, side by side.

    Block-diagonal W, biases and filters concatenated along channels: since W never mixes
    the two blocks and every channel has its own filter, neither stack sees the other.
    The shorter stack is padded with identity layers; layer l of both must agree on cyclic.
    """
    (Na, da), (Nb, db) = a[0].b1.shape, b[0].b1.shape
    if Na != Nb:
        raise ValueError(f"the stacks have N'={Na} and N'={Nb}; they must agree")
    L = max(len(a), len(b))
    a = a + [identity(Na, da, a[-1].cyclic)[0]] * (L - len(a))
    b = b + [identity(Nb, db, b[-1].cyclic)[0]] * (L - len(b))
    if any(la.cyclic != lb.cyclic for la, lb in zip(a, b)):
        raise ValueError("layer pairs must agree on cyclic; pad with identity layers "
                         "built with the other's cyclic flag")
    return [Layer(torch.block_diag(la.W, lb.W), torch.cat([la.b1, lb.b1], 1),
                  torch.cat([la.h, lb.h]), torch.cat([la.b2, lb.b2], 1), la.cyclic)
            for la, lb in zip(a, b)]


def remember(layers, d_carry):
    """Compute on some channels while carrying the others unchanged (the H.3 "remember").

    Statement implemented (our precise form): for every L-layer BaseConv f on N' x d1 and
    every r in R^{N' x d2} there is an L-layer BaseConv g on N' x (d1 + d2) with
    g([v | r]) = [f(v) | r] for all v. Assumption: the carried data sits in its own
    channels (columns). The paper's proofs also carry rows; that form needs shifts and is
    not stated precisely in the text we have, so it is not implemented here.
    """
    Np = layers[0].b1.shape[0]
    return parallel(layers, [identity(Np, d_carry, l.cyclic)[0] for l in layers])


def random_layer(Np, dp, generator, cyclic=False):
    """A BaseConv layer with standard normal parameters (for tests)."""
    def r(*shape):
        return torch.randn(*shape, generator=generator, dtype=DTYPE)
    return Layer(r(dp, dp) / math.sqrt(dp), r(Np, dp), r(dp, Np) / math.sqrt(Np), r(Np, dp),
                 cyclic)


def check_primitives(seed=0, Np=12, dp=4):
    """H.3 on a random u (Np, dp), every s: shift_down (the printed X^{s+1} shifts by s+1),
    shift_up (one cyclic layer; causal, it fails), stack and remember."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(2, Np, dp, generator=g, dtype=DTYPE)
    ok, printed = True, False
    for s in range(Np):
        down, up = torch.zeros_like(u), torch.zeros_like(u)
        down[:, s:], up[:, :Np - s] = u[:, :Np - s], u[:, s:]
        causal = [replace(l, cyclic=False) for l in shift_up(Np, dp, s)]
        ok &= (torch.allclose(baseconv_stack(u, shift_down(Np, dp, s)), down)
               and torch.allclose(baseconv_stack(u, shift_up(Np, dp, s)), up)
               and (s == 0 or not torch.allclose(baseconv_stack(u, causal), up, atol=1e-3)))
        if s + 1 < Np:
            printed |= torch.allclose(baseconv_stack(u, convolution(impulse(Np, dp, s + 1))),
                                      down, atol=1e-3)
    f1 = [random_layer(Np, dp, g) for _ in range(2)]
    f2 = [random_layer(Np, dp, g, cyclic=True) for _ in range(3)]
    r = torch.randn(2, Np, 3, generator=g, dtype=DTYPE)
    kept = remember(stack(f1, f2), 3)
    ok &= (torch.allclose(baseconv_stack(u, stack(f1, f2)),
                          baseconv_stack(baseconv_stack(u, f1), f2))
           and inner_dim(kept) == (5, Np, dp + 3) and torch.allclose(
               baseconv_stack(torch.cat([u, r], -1), kept),
               torch.cat([baseconv_stack(u, stack(f1, f2)), r], -1)))
    return [("H.3  shift_down, shift_up (1 cyclic layer), stack, remember", _ok(ok),
             f"1, 1, L1+L2, L layers; every s < N' = {Np}"),
            ("erratum: shift_down filter X^{s+1} (printed)", _ok(not printed, " (fails)"),
             "X^s is right")]


# ----------------------------------------------------------------------------------------
# Section 4.2: MQAR constructions (Prop 4.3, Thm 4.4, Thm 4.5)

def one_hot(tokens, c):
    """(B, N) token ids -> (B, N, c) one-hot rows in {0,1}^c."""
    return torch.nn.functional.one_hot(tokens, c).to(DTYPE)


def to_bits(tokens, b):
    """(B, N) token ids -> (B, N, b) binary digits, least significant first: {0,1}^{O(log c)}."""
    return ((tokens[..., None] >> torch.arange(b)) & 1).to(DTYPE)


def from_bits(bits):
    """Round each digit to 0/1 and read the number back."""
    return ((bits > 0.5).long() << torch.arange(bits.shape[-1])).sum(-1)


def mqar_accuracy(pred, labels):
    """The fraction of labelled positions (label != -100) where pred equals the label."""
    at = labels != IGNORE
    return (pred[at] == labels[at]).double().mean().item()


def key_query_distances(tokens, labels):
    """For each labelled position i: i - p, with p the first earlier position holding tokens[i]."""
    out = []
    for x, y in zip(tokens.tolist(), labels.tolist()):
        first = {}
        for i, tok in enumerate(x):
            if y[i] != IGNORE:
                out.append(i - first[tok])
            first.setdefault(tok, i)
    return out


def attention_plain(q, k, v, mask="strict", beta=None):
    """(Q K^T ⊙ allowed) V without softmax (beta=None), or softmax(beta Q K^T + log allowed) V.

    mask "strict": allowed[i, j] = [j < i]; "causal": [j <= i]; "none": all ones. A row whose
    mask is empty (row 0 under "strict") outputs 0. Materializes (B, N, N).
    """
    N = q.shape[-2]
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    masks = {"strict": j < i, "causal": j <= i, "none": torch.ones(N, N, dtype=torch.bool)}
    check_choice("mask", mask, tuple(masks))
    allowed = masks[mask]
    scores = torch.einsum("bid,bjd->bij", q, k)                              # (B, N, N)
    if beta is None:
        return torch.einsum("bij,bjd->bid", scores * allowed, v)
    weights = torch.softmax((beta * scores).masked_fill(~allowed, float("-inf")),
                            dim=-1).nan_to_num(0.0)
    return torch.einsum("bij,bjd->bid", weights, v)


def mqar_attention(tokens, c, softmax=False, mask="strict"):
    """Prop 4.3: attention on one-hot inputs solves MQAR in 2 layers, even without softmax.

    Layer 1 (previous token): hidden rows [e_{x_i} | e_i] (token and position one-hot);
      q_i = e_{i-1}, k_j = e_j, v_j = e_{x_j}, so row i receives e_{x_{i-1}}: each value
      now sits next to its key (a key at p, its value at p + 1).
    Layer 2 (recall): q_i = e_{x_i}, k_j = e_{x_{j-1}}, v_j = e_{x_j}; with the strict mask
      j < i, row i sums the values whose preceding token is x_i: at a query, exactly v.
    Parameters: W_Q1, W_K1 (N x N), W_V1, W_Q2, W_K2, W_V2 (c x c): 4c^2 + 2N^2 = O(c^2)
    as MQAR needs c > N. Time O(N c^2 + N^2 c).
    With softmax the scores are scaled by beta = 30 + ln N: the weight off the one match is
    below N e^{-beta}, so argmax decodes exactly.
    Deviation: the paper's input is u in {0,1}^{N x 3c}; here position one-hots drive
    layer 1, as attention in the experiments gets position embeddings.
    Erratum of the printed proof of Prop 4.3: it sums over all j (mask="none"); then row i also
    receives x_{i+1}, whose preceding token is the query, and fails on every instance.
    mask="causal" (j <= i) fails when a query's preceding token equals it.
    Returns (predicted tokens (B, N), output scores (B, N, c)).
    """
    B, N = tokens.shape
    beta = 30.0 + math.log(N) if softmax else None
    x, pos = one_hot(tokens, c), torch.eye(N, dtype=DTYPE).expand(B, N, N)
    S = torch.diag(torch.ones(N - 1, dtype=DTYPE), -1)                      # e_i -> e_{i-1}
    prev = attention_plain(pos @ S, pos, x, "strict", beta)                  # (B, N, c)
    out = attention_plain(x, prev, x, mask, beta)                            # (B, N, c)
    return out.argmax(-1), out


def _margin(out, labels):
    """At labelled positions: the label's score minus the best other score."""
    at = labels != IGNORE
    o, lab = out[at], labels[at][:, None]
    return o.gather(-1, lab)[:, 0] - o.scatter(-1, lab, float("-inf")).max(-1).values


def check_prop_4_3(seed=0, sizes=((64, 8, 128), (128, 16, 256))):
    """Prop 4.3 on mqar.py instances, with and without softmax and random non-queries: exact,
    each label ahead by > 0.99. Unmasked (the printed proof's sum), the token after each key
    ties with its value; with a non-strict mask a query right after itself fails."""
    rows = []
    for N, D, c in sizes:
        ok = True
        for fillers, sm in itertools.product(("zeros", "random"), (False, True)):
            x, y = multiquery_ar(16, c, N, D, fillers=fillers, seed=seed)
            pred, out = mqar_attention(x, c, sm, "strict")
            ok &= mqar_accuracy(pred, y) == 1.0 and _margin(out, y).min() > 0.99
            r, col = (y != IGNORE).nonzero(as_tuple=True)
            tie = x[r, col + 1] != y[r, col]
            ok &= (tie.sum() >= len(tie) // 2
                   and (_margin(mqar_attention(x, c, sm, "none")[1], y)[tie] < 1e-6).all())
        bad = mqar_accuracy(mqar_attention(x, c, False, "none")[0], y)
        late = col > 2 * D                      # the token before the query is not context
        x = x.clone()
        x[r[late], col[late] - 1] = x[r[late], col[late]]
        pred = mqar_attention(x, c, False, "causal")[0]
        ok &= (late.any() and mqar_accuracy(mqar_attention(x, c, False, "strict")[0], y) == 1.0
               and (pred[r[late], col[late]] != y[r[late], col[late]]).all())
        rows.append((f"Prop 4.3 attention, N={N} D={D} c={c}",
                     _ok(ok, " acc 1.00 (no/softmax), margin > 0.99"),
                     f"L=2, params 4c²+2N² = {4 * c * c + 2 * N * N}; unmasked (printed) "
                     f"acc {bad:.2f}; mask j <= i fails a query after itself"))
    return rows


def mqar_baseconv_input_independent(tokens, c, distances):
    """Thm 4.4 (direct construction): a BaseConv with input-independent filters on tokens as
    bits in {0,1}^b, b = ceil(log2 c), one channel group per look-back distance s.

    Group s has b channels A_s and b channels V_s; d' = 2 b |S|, N' = N.
      1. affine:   A_s <- 2x - 1 (spins sigma), V_s <- x with row 0 zeroed (a value is never
                   at position 0, and this keeps the rows i < s exact)
      2. shift:    A_s <- sigma_i ⊙ sigma_{i-s} (filter X^s; 0 for i < s),
                   V_s <- x_{i-s+1} (filter X^{s-1})
      3. product:  eq_s = prod_j (1 + A_s^j)/2 by a tree of gates, ceil(log2 b) layers:
                   eq_s[i] = [x_i = x_{i-s}] for i >= s; for i < s it is 2^{-b}, but
                   there V_s is 0 (row 0 zeroed above), so nothing reaches the output
      4. gate:     V_s <- eq_s ⊙ V_s
      5. sum:      out = sum_s V_s, the bits of the value following the earlier copy of x_i
    Every filter is X^s, X^{s-1} or e_0 whatever the input: input-independent. A query at
    distance s is answered iff s is in `distances`; for all queries the width needed is
    2b (N - 1), linear in N (the paper's explanation of Figure 2).
    Returns (predicted tokens (B, N), layers).
    """
    B, N = tokens.shape
    b = max(1, math.ceil(math.log2(c)))
    layers = mqar_input_independent_layers(N, b, distances)
    bits = baseconv_model(to_bits(tokens, b), layers)                        # (B, N, b)
    return from_bits(bits), layers


def _check_distances(distances, N):
    if not distances:
        raise ValueError("distances=[] is not allowed: give at least one distance in [1, N)")
    for s in distances:
        check_int("distances", s, 1, f"a list of integers in [1, N) = [1, {N})")
        if s >= N:
            raise ValueError(f"distances contains {s}: each must be in [1, N) = [1, {N})")


def mqar_input_independent_layers(N, b, distances):
    """The layers of `mqar_baseconv_input_independent` for sequence length N and b bits."""
    _check_distances(distances, N)
    G, dp = len(distances), 2 * b * len(distances)
    A = [list(range(2 * b * g, 2 * b * g + b)) for g in range(G)]           # channel indices
    V = [list(range(2 * b * g + b, 2 * b * (g + 1))) for g in range(G)]
    zero, one = _zeros(N, dp), _ones(N, dp)
    Z, eye = _zeros(dp, dp), torch.eye(b, dtype=DTYPE)

    # 1. affine: y = u W + b1 (h = 0, b2 = 1)
    W, b1, b2 = Z.clone(), zero.clone(), one.clone()
    for g in range(G):
        W[:b, A[g]], b1[:, A[g]] = 2 * eye, -1.0
        W[:b, V[g]], b2[0, V[g]] = eye, 0.0
    layers = [Layer(W, b1, _zeros(dp, N), b2)]

    # 2. shift: left = copy of the channel (A) or 1 (V); right = shifted channel
    W, b1, h = Z.clone(), zero.clone(), _zeros(dp, N)
    for g, s in enumerate(distances):
        W[A[g], A[g]] = 1.0                                                 # W[a, a], a in A_s
        h[A[g], s] = 1.0
        b1[:, V[g]] = 1.0
        h[V[g], s - 1] = 1.0
    layers.append(Layer(W, b1, h, zero.clone()))

    # 3. product tree over the b factors of each group; the first level maps P -> (1 + P)/2
    active = [list(A[g]) for g in range(G)]
    alpha, beta = 0.5, 0.5
    while True:
        W, b1, h, b2 = Z.clone(), one.clone(), impulse(N, dp, 0), zero.clone()
        for g, act in enumerate(active):
            half = (len(act) + 1) // 2
            for a, p in itertools.zip_longest(act[:half], act[half:]):
                h[a, 0], b2[:, a] = alpha, beta                               # alpha u_a + beta
                if p is not None:
                    W[p, a], b1[:, a] = alpha, beta                           # alpha u_p + beta
            active[g] = act[:half]
        layers.append(Layer(W, b1, h, b2))
        alpha, beta = 1.0, 0.0
        if all(len(act) == 1 for act in active):
            break

    # 4. gate the shifted values by eq_s (now in channel A[g][0])
    W, b1 = Z.clone(), one.clone()
    for g in range(G):
        b1[:, A[g]] = 0.0
        W[A[g][0], V[g]], b1[:, V[g]] = 1.0, 0.0
    layers.append(Layer(W, b1, impulse(N, dp, 0), zero.clone()))

    # 5. sum the groups into channels 0..b-1
    W = Z.clone()
    for g in range(G):
        W[V[g], :b] = eye
    return layers + projection(W, N)


def check_thm_4_4(seed=0, sizes=((16, 2, 32), (32, 4, 64), (64, 8, 128)), fillers="zeros"):
    """Thm 4.4 on mqar.py instances: exact with every distance 1..N-1 (every labelled row's
    output is the value's bits, not only after rounding) and with just the distances present
    (without the largest, a query fails), width 2b(N-1), the same fixed filters for another,
    independently drawn input."""
    rows = []
    for N, D, c in sizes:
        x, y = multiquery_ar(8, c, N, D, fillers=fillers, seed=seed)
        b, need = math.ceil(math.log2(c)), sorted(set(key_query_distances(x, y)))
        layers = mqar_input_independent_layers(N, b, list(range(1, N)))
        bits = baseconv_model(to_bits(x, b), layers)          # what the predictions round
        pred, at = from_bits(bits), y != IGNORE
        L, Np, dp = inner_dim(layers)
        other, _ = multiquery_ar(8, c, N, D, fillers=fillers, seed=seed + 1)
        again = mqar_baseconv_input_independent(other, c, list(range(1, N)))[1]
        controls = ((Np, dp) == (N, 2 * b * (N - 1)) and L == 4 + max(1, math.ceil(math.log2(b)))
                    and torch.allclose(bits[at], to_bits(y[at], b), atol=1e-9)
                    and all(torch.equal(l.h, l2.h) for l, l2 in zip(layers, again))
                    and mqar_accuracy(mqar_baseconv_input_independent(x, c, need)[0], y) == 1.0
                    > mqar_accuracy(mqar_baseconv_input_independent(x, c, need[:-1])[0], y))
        rows.append(_exact_row(f"Thm 4.4 input-indep. filters, N={N} c={c}", pred, y,
                               f"(L,N',d')={inner_dim(layers)}; d' = 2b(N-1); max distance "
                               f"used {need[-1]} -> width {2 * b * need[-1]} = "
                               f"{2 * b * need[-1] / N:.1f} N", controls))
    return rows


def mqar_input_dependent_layers(N, c, distances):
    """Thm 4.5: the BaseConv whose filters are chosen from the input (the distances), on
    one-hot tokens. Group s has c channels A_s and c channels V_s;
    d' = 2 c num_lags (num_lags = len(distances), Thm 4.5's t), N' = N, L = 4.
      1. projection:  A_s <- u, V_s <- u
      2. shift:       A_s <- u ⊙ shift_down(u, s)   (filter X^s)
                      V_s <- shift_down(u, s - 1)   (filter X^{s-1}, the value after the key)
      3. broadcast:   V_s <- match_s ⊙ V_s with match_s[i] = sum_a A_s^a[i] = [x_i = x_{i-s}]
                      (W sums the A_s channels into every V_s channel)
      4. sum:         out = sum_s V_s
    Parameters: the N x d' filters, O(num_lags N c) as in Thm 4.5 (W is a fixed 0/1 matrix).
    The construction needs no gate that zeroes query rows (an erratum of H.8): a query is never
    matched with itself because every s >= 1.
    """
    _check_distances(distances, N)
    num_lags, dp = len(distances), 2 * c * len(distances)
    A = [slice(2 * c * g, 2 * c * g + c) for g in range(num_lags)]
    V = [slice(2 * c * g + c, 2 * c * (g + 1)) for g in range(num_lags)]
    eye = torch.eye(c, dtype=DTYPE)
    zero, one = _zeros(N, dp), _ones(N, dp)
    W = _zeros(dp, dp)
    for g in range(num_lags):
        W[:c, A[g]], W[:c, V[g]] = eye, eye
    layers = projection(W, N)
    W, b1, h = _zeros(dp, dp), zero.clone(), _zeros(dp, N)
    for g, s in enumerate(distances):
        W[A[g], A[g]] = eye
        h[A[g], s] = 1.0
        b1[:, V[g]] = 1.0
        h[V[g], s - 1] = 1.0
    layers.append(Layer(W, b1, h, zero.clone()))
    W, b1 = _zeros(dp, dp), one.clone()
    for g in range(num_lags):
        W[A[g], V[g]] = 1.0
        b1[:, V[g]] = 0.0
    layers.append(Layer(W, b1, impulse(N, dp, 0), zero.clone()))
    W = _zeros(dp, dp)
    for g in range(num_lags):
        W[V[g], :c] = eye
    return layers + projection(W, N)


def mqar_baseconv_input_dependent(tokens, c, distances):
    """Thm 4.5 on a batch: `distances` is one list per example (the filters depend on the
    input). Returns (predicted tokens (B, N), the layers of the last example)."""
    if len(distances) != len(tokens):
        raise ValueError(f"distances has {len(distances)} lists; it needs one per example "
                         f"({len(tokens)})")
    preds = []
    for x, ds in zip(tokens, distances):
        layers = mqar_input_dependent_layers(len(x), c, ds)
        out = baseconv_model(one_hot(x[None], c), layers)[0]                  # (N, c)
        preds.append(torch.where(out.max(-1).values > 0.5, out.argmax(-1), -1))
    return torch.stack(preds), layers


def autocorrelation(tokens, c):
    """r[s] = sum_i <u_i, u_{i-s}> = #{i : x_i = x_{i-s}} for s = 0..N-1 (one-hot u), per row."""
    u = one_hot(tokens, c)                                                   # (B, N, c)
    N = tokens.shape[-1]
    return torch.stack([(u[:, s:] * u[:, :N - s]).sum((-1, -2)) for s in range(N)], -1)


def top_lags(tokens, c, num_lags):
    """The num_lags lags s >= 1 of largest autocorrelation, per row (ties to the smaller lag).

    The rule offered for choosing the distances of Thm 4.5. It can miss a needed distance
    (an erratum of H.8): repeated filler tokens correlate at every even lag.
    """
    r = autocorrelation(tokens, c)[:, 1:]                                    # (B, N-1)
    order = torch.argsort(-r, dim=-1, stable=True)[:, :num_lags] + 1
    return [sorted(row) for row in order.tolist()]


def needed_distances(tokens, labels):
    """Per example, the sorted set of key-query distances its queries need."""
    return [sorted(set(key_query_distances(x[None], y[None]))) for x, y in zip(tokens, labels)]


def check_thm_4_5(seed=0, sizes=((16, 2, 24), (32, 4, 40))):
    """Thm 4.5 on mqar.py instances: exact with the needed distances (every labelled row's
    output is the value's one-hot row, not only after the argmax; one distance missing per
    example breaks a query), L = 4, d' = 2 c num_lags. Erratum of H.8: the top num_lags
    autocorrelation lags need not cover those distances; with them, an example is exact
    exactly when they do."""
    rows = []
    for N, D, c in sizes:
        covered, iff = [], True
        for fillers in ("zeros", "random"):
            x, y = multiquery_ar(8, c, N, D, fillers=fillers, seed=seed)
            need = needed_distances(x, y)
            lags = [top_lags(x[i:i + 1], c, len(dists))[0] for i, dists in enumerate(need)]
            cover = [set(dists) <= set(l) for dists, l in zip(need, lags)]
            pred = mqar_baseconv_input_dependent(x, c, lags)[0]
            iff &= all((mqar_accuracy(pred[i:i + 1], y[i:i + 1]) == 1.0) == cov
                       for i, cov in enumerate(cover))
            covered.append(sum(cover))
        pred, layers = mqar_baseconv_input_dependent(x, c, need)        # random non-queries
        num_lags = max(map(len, need))
        short = [dists[1:] or [N - 1] for dists in need]        # layers: the last example's
        outputs = [baseconv_model(one_hot(x[i:i + 1], c), mqar_input_dependent_layers(N, c, ds))
                   for i, ds in enumerate(need)]
        exact = all(torch.allclose(out[0][y[i] != IGNORE], one_hot(y[i][y[i] != IGNORE], c),
                                   atol=1e-9) for i, out in enumerate(outputs))
        controls = (iff and exact and inner_dim(layers) == (4, N, 2 * c * len(need[-1]))
                    and mqar_accuracy(mqar_baseconv_input_dependent(x, c, short)[0], y) < 1.0)
        rows.append(_exact_row(f"Thm 4.5 input-dep. filters, N={N} c={c}", pred, y,
                               f"L=4, d'=2ct ≤ {2 * c * num_lags}; top-t lags cover "
                               f"{covered[0]}/8 "
                               f"(filler), {covered[1]}/8 (random) [erratum]", controls))
    return rows


# ----------------------------------------------------------------------------------------
# H.5: arithmetic circuits compiled into BaseConv (Thm H.5)

def compile_circuit(circuit, N, d):
    """Thm H.5 (our construction): a BaseConv stack computing a circuit of Nd variables (of
    any size, depth and width) on the flattened input, x_{i d + j} = u[i, j], with the output
    at y[0, 0].

    Every value lives in its own channel at row 0; all other rows stay 0.
      gather (2 layers): an affine layer copies column j of u into one channel per variable
        x_{i d + j} and writes each constant as a bias; a cyclic layer with filter
        X^{(N-i) mod N} moves row i of that channel to row 0 and b1 zeroes the other rows.
      per level l = 1..depth: an affine layer A writes, in a fresh layout, the values still
        needed (carried), a + b for each + gate, b and a copy of a for each x gate; if the
        level has x gates, a layer B multiplies: (u W)_g = a picks the copy, h = e_0 keeps b.
      read-out: a projection moves the output to channel 0.
    Resources: L <= 2·depth + 3 layers, N' = N, d' <= max(num_vars + #constants, 3·width)
    channels. Against Thm H.5's O(depth·log width) layers and inner dimension O(width): dense
    projections route any channel to any channel in one layer, which is what the theorem's
    log width factor pays for with K-matrices; our d' includes one channel per input variable
    (num_vars <= 2·width when every variable is used).
    Returns the layers; `baseconv_model(u, layers)[..., 0, 0]` is the circuit's value.
    """
    if circuit.num_vars != N * d:
        raise ValueError(f"circuit.num_vars={circuit.num_vars} is not allowed: the input has "
                         f"N*d={N * d} entries, one variable each")
    lev, live = levels(circuit), live_values(circuit)
    top = lev[-1]                                                   # the circuit's depth
    gates = [[k for k, l in enumerate(lev) if l == level and circuit.nodes[k][0] in "+*"]
             for level in range(top + 1)]
    inputs = [k for k, node in enumerate(circuit.nodes) if node[0] in ("var", "const")]
    carried = [[k for k in live[lv] if lev[k] < lv] for lv in range(top)] + [[]]  # per level
    times = [[g for g in gs if circuit.nodes[g][0] == "*"] for gs in gates]
    widths = [len(k) + len(g) + len(t) for k, g, t in zip(carried, gates, times)]
    dp = max(len(inputs), d, *widths)
    row0 = _zeros(N, dp)
    row0[0] = 1
    Z = _zeros(dp, dp)

    # gather: channel col[k] = position of input node k in `inputs`
    col = {k: channel for channel, k in enumerate(inputs)}
    W, b1, h = Z.clone(), _zeros(N, dp), _zeros(dp, N)
    for k in inputs:
        node = circuit.nodes[k]
        if node[0] == "var":
            i, j = divmod(node[1], d)
            W[j, col[k]] = 1.0
            h[col[k], (N - i) % N] = 1.0
        else:
            b1[:, col[k]] = float(node[1])
            h[col[k], 0] = 1.0
    layers = [Layer(W, b1, _zeros(dp, N), _ones(N, dp)),
              Layer(Z.clone(), row0.clone(), h, _zeros(N, dp), cyclic=True)]

    for level in range(1, top + 1):
        new = {k: channel for channel, k in enumerate(carried[level] + gates[level])}
        copy = {g: len(new) + t for t, g in enumerate(times[level])}
        W = Z.clone()
        for k in carried[level]:
            W[col[k], new[k]] = 1.0
        for g in gates[level]:
            op, a, b = circuit.nodes[g]
            W[col[b], new[g]] += 1.0
            if op == "+":
                W[col[a], new[g]] += 1.0
            else:
                W[col[a], copy[g]] = 1.0
        layers.append(Layer(W, _zeros(N, dp), _zeros(dp, N), row0.clone()))   # A
        if times[level]:
            W, b1 = Z.clone(), row0.clone()
            for g in times[level]:
                W[copy[g], new[g]], b1[:, new[g]] = 1.0, 0.0
            layers.append(Layer(W, b1, impulse(N, dp, 0), _zeros(N, dp)))    # B
        col = new
    W = Z.clone()
    W[col[len(circuit.nodes) - 1], 0] = 1.0
    return layers + projection(W, N)


def _informative_circuit(num_vars, depth, width, seed):
    """random_circuit, drawn again (seed + 1000, + 2000, ...) until its polynomial has degree
    >= 2 in two variables or more (in the one there is, if one): a constant polynomial (0
    included) would pass a compiler that ignores its inputs, and a polynomial in one of
    several variables one that mixes them up."""
    for attempt in range(100):
        circuit = random_circuit(num_vars, depth, width, seed=seed + 1000 * attempt)
        poly = expand(circuit)
        used = {j for monomial in poly for j, e in enumerate(monomial) if e}
        if max(map(sum, poly), default=0) >= 2 and len(used) >= min(2, num_vars):
            return circuit
    raise ValueError(f"no circuit of depth={depth}, width={width} on {num_vars} variables "
                     "with degree >= 2 in two of them in 100 draws")


def check_thm_h5(seed=0, N=3, d=2, depths=(2, 4, 6), widths=(2, 4)):
    """Thm H.5: random circuits (of degree >= 2 in two variables or more) compiled into
    BaseConv compute their polynomial in y[0, 0] (flipping the output gate changes it), with
    L <= 2·depth + 3 and d' <= max(Nd + 2, 3·width). Also x_0 x_{Nd-1} + k for every constant
    k that random_circuit draws: a constant written wrong (2 as 1) fails even where no random
    circuit's output depends on that constant."""
    g = torch.Generator().manual_seed(seed)
    ok, worst_L, worst_d = True, 0.0, 0.0
    num_vars = N * d
    circuits = [_informative_circuit(num_vars, dlt, wd, seed=seed + dlt * wd)
                for dlt, wd in itertools.product(depths, widths)]
    circuits += [Circuit(num_vars, (("var", 0), ("var", num_vars - 1), ("const", k),
                                    ("*", 0, 1), ("+", 3, 2)))
                 for k in range(-2, 3)]
    for circuit in circuits:
        layers = compile_circuit(circuit, N, d)
        u = torch.rand(4, N, d, generator=g, dtype=DTYPE) * 2 - 1
        y, ref = baseconv_model(u, layers), evaluate(circuit, u.reshape(4, N * d))
        L, Np, dp = inner_dim(layers)
        ok &= (torch.allclose(y[:, 0, 0], ref, rtol=1e-9, atol=1e-9) and Np == N
               and torch.count_nonzero(y.abs() > 1e-9) <= torch.count_nonzero(ref)
               and L <= 2 * depth(circuit) + 3 and dp <= max(N * d + 2, 3 * width(circuit)))
        op, a, b = circuit.nodes[-1]
        other = Circuit(circuit.num_vars, circuit.nodes[:-1] + (("+" if op == "*" else "*", a, b),))
        if expand(other) != expand(circuit):
            ok &= not torch.allclose(baseconv_model(u, compile_circuit(other, N, d))[:, 0, 0],
                                     ref, atol=1e-6)
        worst_L = max(worst_L, L / (depth(circuit) * max(1, math.log2(width(circuit)))))
        worst_d = max(worst_d, dp / width(circuit))
    return [(f"Thm H.5 circuit -> BaseConv, {len(depths) * len(widths)} random circuits, "
             "x_0 x_n-1 + k for k = -2..2", _ok(ok),
             f"max L/(Δ log2 w) = {worst_L:.2f}, max d'/w = {worst_d:.2f}")]


# ----------------------------------------------------------------------------------------
# Thm 4.2: the Hyena, H3, RetNet and RWKV layers of mixers.py as BaseConv stacks
#
# What one BaseConv layer can multiply: channel ch outputs
# ((u W)_ch + b1_ch) ⊙ (h_ch * u_ch + b2_ch), a linear function of all channels times a
# convolution of channel ch alone. So p ⊙ (h * z) with p and z in different channels is one
# layer when z sits in channel ch (W copies p into column ch; h_ch = h). A product of two
# projections of the layer input (H3's k ⊙ v, retention's k_i v_j) takes two layers: a
# projection first writes one factor into a channel of its own, the next layer multiplies it
# by a linear function of the others.
# A channel a layer only carries gets W column 0, b1 = 1, h = e_0, b2 = 0: the identity
# block of `remember`, set per channel here because the computing channels of the same
# layer read the carried ones through W (which `parallel` keeps block diagonal).
# The mixers' filters are evaluated once and stored as explicit (d_model, T) filters (`coeff`
# drops lags s >= T, which never reach an output, and pads short ones): the MLP of
# Hyena's implicit filter and the parameters of H3's SSMs are how a layer stores h, not part
# of its map from x to y. Projections are dense (Remark H.4, as in the experiments), not
# K-matrices. Each stack is exact in exact arithmetic (the module's sums, in another order).
# What no stack computes: a BaseConv layer is a polynomial (of degree 2) in its input, so a
# stack is a polynomial; a function bounded and not constant on some half-line λ -> λ u_0,
# λ >= 0 (a norm, σ, swish), or unchanged by u -> λ u for all λ > 0 and not constant (a
# ratio of two degree-1 terms, as RWKV's wkv), is none, and neither is exp.

def random_mixer(cls, d_model, seq_len, seed, noise=0.1, **options):
    """A mixers.py module in float64 whose every parameter is its init plus N(0, noise^2).

    The noise keeps a construction from leaning on an init's special values (RWKV's equal
    bonuses u, H3's A_r = -1/2 + iπr for mode r). Built inside fork_rng, so the global RNG is
    left as it was.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = cls(d_model, seq_len, **options).to(DTYPE)
    with torch.no_grad():
        for p in module.parameters():
            p += noise * torch.randn(p.shape, generator=g, dtype=DTYPE)
    return module


def _input(seed, B=4, T=32, d_model=8):
    """A random x (B, T, d_model) for the checks of this section."""
    return torch.randn(B, T, d_model, generator=torch.Generator().manual_seed(seed), dtype=DTYPE)


def _module_row(name, m, layers, x, dims, broken=()):
    """A Thm 4.2 report row: the stack against the module m on x, equal up to rounding, with
    inner dimensions `dims`; each stack in `broken` (a layer dropped, a filter changed) must
    not compute m."""
    B, T, d_model = x.shape
    with torch.no_grad():
        want = m(x)
        err = (baseconv_model(x, layers) - want).abs().max().item()
        ok = err < 1e-10 and inner_dim(layers) == dims and not any(
            torch.allclose(baseconv_model(x, b), want, atol=1e-6) for b in broken)
    return (f"Thm 4.2 {name} (d_model={d_model}, T={T}) = BaseConv stack",
            _ok(ok, f" max|Δ| {err:.0e}; {len(broken)} broken stacks differ"),
            f"(L,N',d') = {inner_dim(layers)} vs d = {d_model}")


def _with_h(layers, i, edit):
    """The stack with layer i's filter h changed by edit(h), in place on a copy."""
    h = layers[i].h.clone()
    edit(h)
    return layers[:i] + [replace(layers[i], h=h)] + layers[i + 1:]


def affine(W, b, Np):
    """u -> u W + b in one layer: `projection` with b1 = b on the first len(b) channels."""
    layers = projection(W.detach(), Np)
    layers[0].b1[:, :b.shape[-1]] = b.detach()
    return layers


def _blank(Np, dp):
    """W, b1, h, b2 of a layer that outputs 0 in every channel until some are set."""
    return _zeros(dp, dp), _zeros(Np, dp), _zeros(dp, Np), _zeros(Np, dp)


def _carry(b1, h, channels):
    """Let `channels` pass through unchanged: b1 = 1, h = e_0 (their W column and b2 are 0)."""
    b1[:, channels] = 1.0
    h[channels, 0] = 1.0


def hyena_as_baseconv(hyena, T):
    """Thm 4.2 for Hyena (Algorithm 3, mixers.Hyena): layers with baseconv_model(x, layers)
    = hyena(x) for x (..., T, d_model). Channel blocks of d_model: p^1..p^order, v (= z^0);
    d' = (order+1) d_model.
      1.        affine:      [p^1 .. p^order, v] = x W_in + b_in
      2.        convolution: every channel by its short filter (W = 0, b1 = 1, b2 = 0)
      2+l.      gated long convolution, l = 1..order: block z <- p^l ⊙ (h^l * z): W copies
                block p^l into block z (the gate side), h = h^l on block z; p's carried
      order+3.  affine:      y = z^order W_out + b_out, into channels 0..d_model-1
    (L, N', d') = (order+3, T, (order+1) d_model): Algorithm 3's `order` gated convolutions,
    one layer each.
    """
    check_int("T", T, 1, "an integer >= 1")
    d_model, order = hyena.d_model, hyena.order
    dp = (order + 1) * d_model
    z = slice(order * d_model, dp)
    with torch.no_grad():
        W = _zeros(dp, dp)
        W[:d_model] = hyena.in_proj.weight.T
        layers = stack(affine(W, hyena.in_proj.bias, T),
                       convolution(coeff(hyena.short_filter(), T)))
        for l, h_l in enumerate(hyena.long_filter().split(d_model, dim=0)):
            W, b1, h, b2 = _blank(T, dp)
            W[l * d_model:(l + 1) * d_model, z] = torch.eye(d_model, dtype=DTYPE)
            h[z] = coeff(h_l, T)
            _carry(b1, h, slice(0, order * d_model))
            layers.append(Layer(W, b1, h, b2))
        W = _zeros(dp, dp)
        W[z, :d_model] = hyena.out_proj.weight.T
        return stack(layers, affine(W, hyena.out_proj.bias, T))


def check_hyena(seed=0, d_model=8, T=32, orders=(2, 3), seq_len=None):
    """Thm 4.2: random Hyena layers are their BaseConv stacks; without any one gated long
    convolution, or with one tap of its filter changed, they are not."""
    x = _input(seed, T=T, d_model=d_model)
    rows = []
    for o in orders:
        m = random_mixer(mixers.Hyena, d_model, seq_len or T, seed, order=o)
        layers = hyena_as_baseconv(m, T)
        broken = [layers[:l] + layers[l + 1:] for l in range(2, o + 2)]
        broken.append(_with_h(layers, 2, lambda h: h[o * d_model, T - 1].add_(1.0)))
        rows.append(_module_row(f"Hyena order {o}", m, layers, x, (o + 3, T, (o + 1) * d_model),
                                broken))
    return rows


def outer_product_conv_as_baseconv(W, b, shift, kernel, W_o, b_o, hd, T):
    """The layer H3 and retention share, as 4 BaseConv layers:

        [q | k | v] = x W + b,   y_gj = Σ_i q_gi ⊙ (K_gij * ((s_gi * k_gi) ⊙ v_gj)),
        out = y W_o + b_o,

    per head g of hd channels (i, j < hd): a short filter s on k, the outer product k ⊗ v,
    a long filter K_gij per (g, i, j), the sum over i gated by q. x (..., T, d_in);
    W (d_in, 3 d_model), b (3 d_model,); shift (d_model, K1); kernel (d_model hd, K2), row
    (g hd + i) hd + j; W_o (d_model, d_out). Channel blocks: q (d_model), v (d_model),
    kv (d_model hd, channel (g, i, j)); d' = max(d_in, d_model (2 + hd), d_out).
      1. affine:   q, v, and every k_gi copied into the hd channels (g, i, j), j < hd: a
                   causal convolution acts per channel, so k_gi must sit in each channel
                   that multiplies it
      2. product:  (g, i, j) <- v_gj ⊙ (s_gi * k_gi): W routes v_gj, h = s_gi; q carried
      3. product:  (g, i, j) <- q_gi ⊙ (K_gij * kv_gij): W routes q_gi, h = K_gij
      4. affine:   out = Σ_{g,i,j} kv_gij W_o[g hd + j] + b_o: the sum over i and W_o in one
    """
    d_in, d_model = W.shape[0], W.shape[1] // 3
    dp = max(d_in, d_model * (2 + hd), W_o.shape[1])
    ch = torch.arange(d_model * hd)
    qk_of, v_of = ch // hd, (ch // (hd * hd)) * hd + ch % hd   # k_gi (and q_gi), v_gj of (g,i,j)
    q, v, kv = torch.arange(d_model), d_model + torch.arange(d_model), 2 * d_model + ch
    with torch.no_grad():
        W1, b = _zeros(dp, dp), b.detach().to(DTYPE)
        (Wq, Wk, Wv), (bq, bk, bv) = W.split(d_model, dim=1), b.split(d_model)
        W1[:d_in, q], W1[:d_in, v], W1[:d_in, kv] = Wq, Wv, Wk[:, qk_of]
        layers = affine(W1, torch.cat([bq, bv, bk[qk_of]]), T)
        W2, b1, h, b2 = _blank(T, dp)
        W2[v[v_of], kv] = 1.0
        h[kv] = coeff(shift, T)[qk_of]
        _carry(b1, h, q)
        layers.append(Layer(W2, b1, h, b2))
        W3, b1, h, b2 = _blank(T, dp)
        W3[q[qk_of], kv] = 1.0
        h[kv] = coeff(kernel, T)
        layers.append(Layer(W3, b1, h, b2))
        W4 = _zeros(dp, dp)
        W4[kv, :W_o.shape[1]] = W_o.detach().to(DTYPE)[v_of]
        return stack(layers, affine(W4, b_o, T))


def h3_as_baseconv(h3, T):
    """Thm 4.2 for H3 (mixers.H3): layers with baseconv_model(x, layers) = h3(x),
    x (..., T, d_model).

    H3 is `outer_product_conv_as_baseconv` with the shift SSM as its short filter (A the
    shift matrix and its input map e_0: the kernel is C, the learned filter) and the diagonal
    SSM as its long one, K_gij = the S4D kernel (T taps) with the skip term (S4D's D) folded
    into tap 0.
    (L, N', d') = (4, T, 3 d_model) for head_dim = 1 (q ⊙ SSM(shift(k) ⊙ v)); head_dim hd > 1
    needs hd copies of every k channel and the sum over i folded into W_o: (4, T, (2 + hd) d_model).
    """
    check_int("T", T, 1, "an integer >= 1")
    with torch.no_grad():
        log_dt, A, C, skip = h3._ssm()
        kernel = mixers.diagonal_ssm_kernel(log_dt, A, C, T)
        kernel[:, 0] += skip
        return outer_product_conv_as_baseconv(h3.qkv.weight.T, h3.qkv.bias, h3.shift_filter(),
                                              kernel, h3.out_proj.weight.T, h3.out_proj.bias,
                                              h3.head_dim, T)


def check_h3(seed=0, d_model=8, T=32, head_dims=(1, 2), d_state=16, **options):
    """Thm 4.2: random H3 layers are their BaseConv stacks; without the skip term folded into
    tap 0, or without the shift SSM (filter e_0), they are not."""
    x = _input(seed, T=T, d_model=d_model)
    rows = []
    for hd in head_dims:
        m = random_mixer(mixers.H3, d_model, T, seed, head_dim=hd, d_state=d_state, **options)
        layers = h3_as_baseconv(m, T)
        skip = m._ssm()[3].detach()
        broken = [_with_h(layers, 2, lambda h: h[2 * d_model:, 0].sub_(skip)),
                  _with_h(layers, 1, lambda h: (h[2 * d_model:].zero_(),
                                                h[2 * d_model:, 0].fill_(1.0)))]
        rows.append(_module_row(f"H3 head_dim {hd}", m, layers, x, (4, T, (2 + hd) * d_model),
                                broken))
    return rows


def retention_as_baseconv(W_q, W_k, W_v, gamma, T):
    """Thm 4.2 for retention: layers computing the heads of Y = (Q K^T ⊙ Γ) V (RetNet,
    mixers.retention_parallel) from x (..., T, d_in), with Q = x W_q, K = x W_k, V = x W_v,
    W_* (d_in, d_model), H = len(gamma) heads of hs = d_model / H. The heads land in channels
    0..d_model-1 (y_t[g, j] in channel g hs + j, as RetNet flattens them); every other
    channel is 0.

    Y is no convolution of x: its filter Q K^T ⊙ Γ depends on x, and Y is cubic in x
    (Y(λ x) = λ^3 Y(x)). Written out it is a sum of gated long convolutions with a fixed
    filter, ρ_g[l] = γ_g^l for head g:
        y_t[g, j] = Σ_{s<=t} γ_g^{t-s} (q_t · k_s) v_s[j]
                  = Σ_i q_t[g, i] (ρ_g * (k_gi ⊙ v_gj))_t,
    hs^2 channels per head: `outer_product_conv_as_baseconv` with hd = hs, no short filter
    (s = e_0), K_gij = ρ_g and W_o = I. (L, N', d') = (4, T, max(d_in, (2 + hs) d_model)):
    the hs x hs per-head state of the recurrent form, as hs^2 channels.
    """
    check_int("T", T, 1, "an integer >= 1")
    H, d_model = len(gamma), W_q.shape[1]
    if d_model % H:
        raise ValueError(f"W_q has d_model={d_model} columns and gamma H={H} heads: H must "
                         "divide d_model")
    hs = d_model // H
    g = gamma.to(DTYPE)[:, None] ** torch.arange(T, dtype=DTYPE)               # (H, T)
    return outer_product_conv_as_baseconv(
        torch.cat([W_q, W_k, W_v], 1), torch.zeros(3 * d_model, dtype=DTYPE),
        torch.ones(d_model, 1, dtype=DTYPE), g.repeat_interleave(hs * hs, 0),
        torch.eye(d_model, dtype=DTYPE), torch.zeros(d_model, dtype=DTYPE), hs, T)


def retnet_as_baseconv(retnet, T):
    """mixers.RetNet up to its retention heads, before the group norm (k scaled by 1/√hs as
    the module does): baseconv_model(x, layers) = the heads y (..., T, d_model), and
    retnet._output(x, y.unflatten(-1, (H, hs))) = retnet(x).

    The rest is no BaseConv stack, whatever its size (a stack is a polynomial in its input):
    along y = λ y_0 the group norm is bounded in λ and not constant, and so is swish(z) =
    z σ(z) for z = λ z_0 < 0, λ >= 0; no polynomial is. Were norm(y) and swish(x W_G) given
    as inputs, their product (one layer) and W_O (one more) would finish the module.
    """
    H = retnet.num_heads
    hs = retnet.q_proj.weight.shape[0] // H
    return retention_as_baseconv(retnet.q_proj.weight.T, retnet.k_proj.weight.T / math.sqrt(hs),
                                 retnet.v_proj.weight.T, retnet.gamma, T)


def check_retnet(seed=0, d_model=8, T=32, num_heads=2):
    """Thm 4.2: a random RetNet's heads are a BaseConv stack, cubic in x (no convolution of
    x); the group norm and swish gate on top give its output. Another decay, or no k ⊙ v
    product layer, breaks the stack."""
    x = _input(seed, T=T, d_model=d_model)
    H, hs = num_heads, d_model // num_heads
    m = random_mixer(mixers.RetNet, d_model, T, seed, num_heads=H, chunk_size=4)
    layers = retnet_as_baseconv(m, T)
    with torch.no_grad():
        q, k, v = (t.transpose(1, 2) for t in m._heads(x))
        heads = mixers.retention_parallel(q, k, v, m.gamma)[0].transpose(1, 2).flatten(2)
        y = baseconv_model(x, layers)
        err = (y - heads).abs().max().item()
        err_out = (m._output(x, y.unflatten(-1, (H, hs))) - m(x)).abs().max().item()
        other = retention_as_baseconv(m.q_proj.weight.T, m.k_proj.weight.T / math.sqrt(hs),
                                      m.v_proj.weight.T, m.gamma**2, T)
        ok = (max(err, err_out) < 1e-10 and inner_dim(layers) == (4, T, (2 + hs) * d_model)
              and torch.allclose(baseconv_model(2 * x, layers), 8 * heads, atol=1e-9)
              and not any(torch.allclose(baseconv_model(x, b), heads, atol=1e-6)
                          for b in (other, layers[:1] + layers[2:])))
    return [(f"Thm 4.2 RetNet H={H}: retention heads = BaseConv stack",
             _ok(ok, f" max|Δ| heads {err:.0e}, output {err_out:.0e} (norm, swish outside)"),
             f"(L,N',d') = {inner_dim(layers)} = (4, T, (2+hs)d_model), cubic in x; group norm, "
             "swish: not polynomial")]


def wkv_filter(w, u, T):
    """RWKV's f (d_model, T): f[:, 0] = e^u, f[:, s] = e^{-(s-1) w} for s >= 1 (appendix H.2)."""
    s = torch.arange(T, dtype=DTYPE)
    return torch.where(s == 0, torch.exp(u.to(DTYPE))[:, None],
                       torch.exp(-(s - 1) * w.to(DTYPE)[:, None]))


def wkv_as_baseconv(w, u, W_v, mix_v, T):
    """RWKV's wkv up to its division: from [E | x] (..., T, 2 d_model), E = e^k given, the layers
    compute [num | den] with
        num_t = Σ_{i<t} e^{-(t-1-i) w} E_i v_i + e^u E_t v_t = (f * (E ⊙ v))_t,
        den_t = (f * E)_t,    wkv_t = num_t / den_t   (f = `wkv_filter`),
    v = x' W_v, x' = μ ⊙ x_t + (1 - μ) ⊙ x_{t-1} (RWKV's token shift: the causal filter
    (μ, 1 - μ) per channel; μ = 1 turns it off). w, u, mix_v (d_model,); W_v (d_model, d_model).
      1. convolution: x -> x' (filter (μ, 1 - μ)); E carried (filter e_0)
      2. product:     E slots <- (x' W_v) ⊙ (e_0 * E) = E ⊙ v; x' slots <- E (a copy: W, b2 = 1)
      3. convolution: both blocks by f
    (L, N', d') = (3, T, 2 d_model). Not exact beyond this, whatever the size: E = e^k is not a
    polynomial in x (so it is an input here), and wkv = num / den is unchanged when E is
    scaled by any λ > 0 while not constant in E, which no polynomial is.
    """
    check_int("T", T, 1, "an integer >= 1")
    d_model = W_v.shape[0]
    E, x = slice(0, d_model), slice(d_model, 2 * d_model)
    with torch.no_grad():
        shift = torch.stack([mix_v, 1 - mix_v], 1)                               # (d_model, 2)
        layers = convolution(torch.cat([impulse(T, d_model, 0), coeff(shift, T)]))
        W, b1, h, b2 = _blank(T, 2 * d_model)
        W[x, E] = W_v.detach().to(DTYPE)
        h[E, 0] = 1.0
        W[E, x] = torch.eye(d_model, dtype=DTYPE)
        b2[:, x] = 1.0
        layers.append(Layer(W, b1, h, b2))
        f = wkv_filter(w, u, T)
        return stack(layers, convolution(torch.cat([f, f])))


def rwkv_as_baseconv(rwkv, T):
    """mixers.RWKV up to the division: layers mapping [e^k | x] to [num | den] of its wkv,
    k from the module's token shift and key projection (`rwkv._rkv`). Then
    rwkv.out_proj(σ(r) ⊙ num / den) = rwkv(x); σ and the division are the steps that are
    not BaseConv (`wkv_as_baseconv`)."""
    return wkv_as_baseconv(torch.exp(rwkv.w_log), rwkv.u, rwkv.value.weight.T, rwkv.mix_v, T)


def check_rwkv(seed=0, d_model=8, T=32):
    """Thm 4.2: a random RWKV's output from the stack's num, den (degree 1 in e^k, while wkv
    is unchanged by 3 e^k), each the sum wkv_as_baseconv states, written out. Without the
    bonus e^u, or the token shift on v, num is another."""
    x = _input(seed, T=T, d_model=d_model)
    m = random_mixer(mixers.RWKV, d_model, T, seed, chunk_size=4)
    layers = rwkv_as_baseconv(m, T)
    w, mix_v, W_v = torch.exp(m.w_log), m.mix_v, m.value.weight.T
    with torch.no_grad():
        r, k, v = m._rkv(x, torch.nn.functional.pad(x, (0, 0, 1, -1)))
        out = baseconv_model(torch.cat([k.exp(), x], -1), layers)
        num, den = out[..., :d_model], out[..., d_model:]
        # weight of position i in the sum at t: e^{-(t-1-i) w} for i < t, e^u at i = t, written
        # out here rather than read from wkv_filter, which the stack itself uses
        t, i = torch.arange(T)[:, None, None], torch.arange(T)[None, :, None]
        weight = torch.where(i < t, torch.exp(-(t - 1 - i) * w), (i == t) * torch.exp(m.u))
        sums = [torch.einsum("tid,bid->btd", weight, a) for a in (k.exp() * v, k.exp())]
        err = (m.out_proj(torch.sigmoid(r) * num / den) - m(x)).abs().max().item()
        scaled = mixers.wkv_reference(w, m.u, k + math.log(3.0), v)[0]
        no_bonus, no_shift = (baseconv_model(torch.cat([k.exp(), x], -1), wkv_as_baseconv(*a, T))
                              for a in ((w, 0 * m.u, W_v, mix_v), (w, m.u, W_v, 1 + 0 * mix_v)))
        ok = (err < 1e-10 and inner_dim(layers) == (3, T, 2 * d_model)
              and all(torch.allclose(a, b, atol=1e-10, rtol=1e-10) for a, b in
                      zip((num, den), sums, strict=True))
              and torch.allclose(scaled, num / den, atol=1e-10) and torch.allclose(
                  baseconv_model(torch.cat([3 * k.exp(), x], -1), layers), 3 * out)
              and not torch.allclose(no_bonus[..., :d_model], num, atol=1e-6)
              and not torch.allclose(no_shift[..., :d_model], num, atol=1e-6)
              and torch.allclose(no_shift[..., d_model:], den))
    return [("Thm 4.2 RWKV: wkv's num, den = BaseConv stack (inputs e^k, x)",
             _ok(ok, f" max|Δ| {err:.0e} (σ, ÷ outside)"),
             f"(L,N',d') = {inner_dim(layers)}; ÷ is no polynomial (num/den same for "
             "3e^k), nor is e^k")]


# ----------------------------------------------------------------------------------------
# H.6: the state a gated recurrence needs for MQAR (the INDEX bound), made concrete
#
# The argument (a counting form of the reduction from INDEX, appendix H.6): a recurrent model
# reads the context k_1 v_1 ... k_D v_D into a state s, and its answer to the first query q
# after the context is some function f(s, q); later queries are functions of s and the
# queries before them. So two contexts that end in the same state get the same answer to
# every query. If the model is exact on a family ℱ of contexts that pairwise disagree on
# some query they share, the states of ℱ are pairwise distinct: at least |ℱ| states, at
# least log2 |ℱ| bits. The INDEX family (the keys fixed, every value assignment) is such a
# family. What this section proves, and what it only exhibits, is said function by function.

def _check_contexts(c_k, c_v, D, distinct_values):
    check_int("D", D, 1, "an integer >= 1")
    check_int("c_k", c_k, D, f"an integer >= D={D} (the D keys of a context are distinct)")
    low = D if distinct_values else 1
    check_int("c_v", c_v, low, f"an integer >= {low}" + (f" (D={D} distinct values)"
                                                          if distinct_values else ""))


def _value_tuples(c_v, D, distinct_values):
    """Every value assignment (v_1..v_D): ordered without repeats (MQAR) or with (INDEX)."""
    tuples = (itertools.permutations(range(c_v), D) if distinct_values
              else itertools.product(range(c_v), repeat=D))
    return torch.tensor(list(tuples), dtype=torch.long).reshape(-1, D)


MAX_CONTEXTS = 2**20


def _check_count(c_k, c_v, D, key_orders, distinct_values):
    count = key_orders * (math.perm(c_v, D) if distinct_values else c_v**D)
    if count > MAX_CONTEXTS:
        raise ValueError(f"(c_k, c_v, D)=({c_k}, {c_v}, {D}) gives {count} contexts; at most "
                         f"{MAX_CONTEXTS} are enumerated")


def mqar_contexts(c_k, c_v, D, distinct_values=True):
    """Every MQAR context k_1 v_1 ... k_D v_D as (contexts, D, 2) (key, value) pairs.

    D distinct keys from [0, c_k) in every order; values from [0, c_v), distinct within a
    context as in the paper's layout (Procedure 1), or with repeats (distinct_values=False).
    contexts = c_k!/(c_k-D)! * (c_v!/(c_v-D)! or c_v^D). The context has N = 2D tokens; MQAR's
    queries come after it.
    """
    _check_contexts(c_k, c_v, D, distinct_values)
    _check_count(c_k, c_v, D, math.perm(c_k, D), distinct_values)
    keys = torch.tensor(list(itertools.permutations(range(c_k), D)), dtype=torch.long)
    vals = _value_tuples(c_v, D, distinct_values)
    K = keys[:, None].expand(-1, len(vals), -1)                              # (#keys, #vals, D)
    V = vals[None].expand(len(keys), -1, -1)
    return torch.stack([K, V], -1).reshape(-1, D, 2)


def index_contexts(D, c_v, distinct_values=True):
    """The INDEX family: keys 0..D-1 in this order, every value assignment, as
    (contexts, D, 2).

    Alice's input of INDEX is the value string, Bob's the index, i.e. the query key.
    contexts = c_v!/(c_v-D)! (distinct values, MQAR's layout) or c_v^D (INDEX proper).
    """
    _check_contexts(D, c_v, D, distinct_values)
    _check_count(D, c_v, D, 1, distinct_values)
    vals = _value_tuples(c_v, D, distinct_values)
    keys = torch.arange(D).expand(len(vals), D)
    return torch.stack([keys, vals], -1)


def answers(contexts, c_k):
    """(contexts, c_k): the value each key gets in each context; -1 where the key is absent (MQAR
    never queries a key that is not in the context)."""
    A = torch.full((len(contexts), c_k), -1, dtype=torch.long)
    return A.scatter_(1, contexts[..., 0], contexts[..., 1])


def index_bound_bits(D, c_v, distinct_values=True):
    """H.6 (counting form): log2 |ℱ| for the INDEX family ℱ, the state bits an exact model
    needs.

    Proved (see the section comment): the contexts of ℱ share their keys and differ in
    some value, so every two of them disagree on a query; an exact recurrent model gives
    them pairwise distinct states. |ℱ| = c_v!/(c_v-D)! >= (c_v-D+1)^D, or c_v^D with repeats.
    In MQAR terms (Procedure 1: values from c/2 tokens, c > N >= 4D, so c_v - D >= c/4) this is
    >= D log2(c/4) bits, and D can be N/4: Omega(N log c) bits, the Omega(N) of H.6 times
    log c. A d x d state of p-bit numbers therefore needs p d^2 >= D log2(c/4).
    Only deterministic, exact models are covered here. INDEX's linear lower bound also holds for
    randomized one-way protocols with error 1/3, which the paper's reduction can carry over
    to models that err; no enumeration shows that part.
    """
    _check_contexts(D, c_v, D, distinct_values)
    return math.log2(math.perm(c_v, D) if distinct_values else c_v**D)


def count_states(states):
    """The number of distinct states among the rows of `states` (contexts, ...)."""
    return len(torch.unique(states.reshape(len(states), -1), dim=0))


def find_confusion(contexts, states, c_k, queries=None):
    """Two contexts i, j with the same state and a query q both hold, answered differently.

    states: (contexts, ...), row i the state of a model after context i (any tensor; equal rows
    are equal states). Returns (i, j, q), or None when no two equal states conflict, i.e.
    when some read-out f(state, q) answers every context exactly. `queries` restricts q.
    By the pigeonhole, a model with fewer distinct states than the INDEX family has contexts
    always yields a confusion on it.
    """
    if len(states) != len(contexts):
        raise ValueError(f"states has {len(states)} rows; it needs one per context "
                         f"({len(contexts)})")
    A = answers(contexts, c_k)
    _, sid = torch.unique(states.reshape(len(states), -1), dim=0, return_inverse=True)
    for q in (range(c_k) if queries is None else queries):
        rows = (A[:, q] >= 0).nonzero()[:, 0]
        pairs = torch.unique(sid[rows] * (A.max() + 1) + A[rows, q])   # (state, answer), sorted
        shared = pairs[1:] // (A.max() + 1)
        same = shared == pairs[:-1] // (A.max() + 1)
        if same.any():
            rows = rows[sid[rows] == shared[same][0]]                        # one shared state
            j = rows[A[rows, q] != A[rows[0], q]][0]
            return int(rows[0]), int(j), int(q)
    return None


def min_states(c_k, c_v, D, distinct_values=True):
    """The exact least number of states after the context of any recurrent model that answers
    every query of every MQAR context (keys from c_k, any order) exactly, by exhaustive search.

    A set of contexts can share a state iff no two of them conflict, iff one global
    assignment g: [c_k] -> [c_v] extends all of them. So the least number of states is the
    least number of assignments G such that every context is a restriction of one (a
    covering array of strength D). The search tries 1, 2, ... states and, for each count,
    every choice of that many assignments by depth-first search (branch on the assignments
    extending the first uncovered context; prune when those left cannot cover what is
    uncovered). Context order is irrelevant (it does not change the answers), so contexts
    are key sets. Returns (states, G (states, c_k)); a context's state is the index of the
    first g extending it.

    Checks of the counting bound: states >= |INDEX family|, with equality for c_k = D. For
    c_k > D it can be larger (c_k = 4, D = 2, c_v = 2: 5 > 4), and it is far below the number
    of distinct answer functions: contexts with different keys need not conflict, so log2
    of that number is not a lower bound. Exponential: for tiny sizes only.
    """
    _check_contexts(c_k, c_v, D, distinct_values)
    if c_v**(c_k - D) > 16:
        raise ValueError(f"(c_k, c_v, D)=({c_k}, {c_v}, {D}): the search branches "
                         f"c_v^(c_k-D)={c_v**(c_k - D)} ways at each depth; at most 16 are "
                         "searched (c_k=5, c_v=3, D=2 would take minutes)")
    ctx = [(ks, vs) for ks in itertools.combinations(range(c_k), D)
           for vs in _value_tuples(c_v, D, distinct_values).tolist()]
    G_all = list(itertools.product(range(c_v), repeat=c_k))
    cover = [sum(1 << i for i, (ks, vs) in enumerate(ctx)
                 if all(g[k] == v for k, v in zip(ks, vs))) for g in G_all]
    extend = [[a for a, mask in enumerate(cover) if mask >> i & 1] for i in range(len(ctx))]
    full, most = (1 << len(ctx)) - 1, max(bin(mask).count("1") for mask in cover)

    def search(covered, left):
        if covered == full:
            return []
        if left * most < len(ctx) - bin(covered).count("1"):
            return None
        first = (~covered & (covered + 1)).bit_length() - 1                  # lowest uncovered
        for a in extend[first]:
            rest = search(covered | cover[a], left - 1)
            if rest is not None:
                return [a] + rest
        return None

    states = 1
    while (chosen := search(0, states)) is None:
        states += 1
    return states, torch.tensor([G_all[a] for a in chosen],
                                dtype=torch.long).reshape(states, c_k)


def cover_states(contexts, G):
    """The state of each context under a cover G (states, c_k) of `min_states`: the index of the
    first assignment that extends it (-1 if none). The read-out is f(s, q) = G[s, q]."""
    agree = (G[None, :, :].expand(len(contexts), -1, -1)
             .gather(2, contexts[..., 0][:, None, :].expand(-1, len(G), -1))
             == contexts[..., 1][:, None, :]).all(-1)                # (contexts, states)
    return torch.where(agree.any(-1), agree.int().argmax(-1), -1)


def check_min_states(seed=0, sizes=((4, 2, 2, False), (4, 3, 2, True))):
    """H.6: the least number of states (by search) answers every context (its cover is a
    model), is at least INDEX's count and equal to it when every key is in every context,
    and one assignment fewer covers no more (all tried where there are few); for c_v = D = 2 it
    is Kleitman and Spencer's least binary covering array of strength 2. Distinct answer
    functions overstate it."""
    rows = []
    for c_k, c_v, D, distinct in sizes:
        states, G = min_states(c_k, c_v, D, distinct)
        ctx = mqar_contexts(c_k, c_v, D, distinct)
        st, A = cover_states(ctx, G), answers(ctx, c_k)
        index = round(2**index_bound_bits(D, c_v, distinct))
        nf = count_states(A)
        ok = ((st >= 0).all() and ((G[st] == A) | (A < 0)).all() and states >= index
              and (states == index if c_k == D else nf > states)
              and find_confusion(ctx, st, c_k) is None)
        if c_v == 2 and D == 2 and not distinct:
            ok &= states == next(size for size in itertools.count(4)
                                 if math.comb(size - 1, math.ceil(size / 2)) >= c_k)
        if c_v**c_k <= 16:
            ok &= all((cover_states(ctx, torch.tensor(fewer).reshape(states - 1, c_k)) < 0).any()
                      for fewer in itertools.combinations(
                          itertools.product(range(c_v), repeat=c_k), states - 1))
        rows.append((f"H.6  least states by search, all contexts c_k={c_k} c_v={c_v} D={D}"
                     f"{' (distinct values)' if distinct else ''}", _ok(ok),
                     f"{states} states ({math.log2(states):.2f} bits) >= INDEX {index} "
                     f"({math.log2(index):.2f}); "
                     f"distinct answer functions {nf} ({math.log2(nf):.2f} bits) overstate"))
    return rows


def retnet_state(k, v, gamma=1.0):
    """RetNet's recurrent form, one head: S_t = gamma S_{t-1} + k_t^T v_t, S_0 = 0.

    k: (..., T, d_k), v: (..., T, d_v) -> S_T (..., d_k, d_v), the d_k x d_v state (d x d in the
    paper): the state mixers.retention_recurrent returns (its outputs, read with q = k, are
    not used). The parallel form is S_T = sum_t gamma^{T-t} k_t^T v_t.
    """
    gamma = torch.tensor([gamma], dtype=k.dtype)
    _, S = mixers.retention_recurrent(k[:, None], k[:, None], v[:, None], gamma)
    return S[:, 0]


def retnet_recall(contexts, c_k, c_v, d_k=None):
    """H.6, the matching upper side: a RetNet state (gamma = 1) that answers MQAR exactly.

    One recurrent step per key-value pair: k_t = e_{k_t mod d_k} (one-hot key, folded onto
    d_k rows when d_k < c_k), v_t = the b = ceil(log2 c_v) bits of the value, S = sum_t
    k_t^T v_t; the answer to query q is y = e_{q mod d_k} S rounded to bits.
    Exact (d_k = c_k): the keys are orthogonal, every entry of S is 0 or 1 and y is the
    value's bits, on every context; the state is c_k x b, c_k b bits. On the INDEX family
    (c_k = D) that is D ceil(log2 c_v) bits; for D = d, c_v = 2^d a d x d state of d^2
    bits, the bound itself with repeats and the bound rounded up, ceil(index_bound_bits),
    with distinct values (checked for d <= 30).
    Fails (d_k < D, proved for this folding): two keys of one context share a row, and S
    keeps only the sum of their codes, so swapping their (different) values gives another
    context with the same S and other answers: a confusion, whatever decodes S.
    Not claimed: that every d_k < D embedding fails. The bound counts bits, not numbers: a
    1 x 1 state S = sum_t v_t c_v^{k_t} also holds every value, in one number of
    D log2 c_v bits (its read-out is digit extraction, not y = q S).
    Deviation: a token-level model sees the key one step before its value; it needs a
    width-2 shift (H3's shift SSM, a short convolution) to pair them, and then carries
    one more token in its state. Returns (predictions (contexts, c_k), -1 for absent keys;
    S).
    """
    d_k = c_k if d_k is None else d_k
    check_int("d_k", d_k, 1, "an integer >= 1")
    b = max(1, math.ceil(math.log2(c_v)))
    keys, vals = contexts[..., 0], contexts[..., 1]
    S = retnet_state(one_hot(keys % d_k, d_k), to_bits(vals, b))        # (contexts, d_k, b)
    y = torch.einsum("qk,mkv->mqv", one_hot(torch.arange(c_k) % d_k, d_k), S)  # (., c_k, b)
    return torch.where(answers(contexts, c_k) >= 0, from_bits(y), -1), S


def _confuses(contexts, states, c_k):
    """find_confusion finds two contexts with one state and a query they answer differently
    (and the triple it returns is such a pair)."""
    found = find_confusion(contexts, states, c_k)
    if found is None:
        return False
    i, j, q = found
    A = answers(contexts, c_k)
    return torch.equal(states[i], states[j]) and 0 <= A[i, q] != A[j, q] >= 0


def check_index(seed=0, sizes=((2, 4, False), (3, 8, False))):
    """H.6 on INDEX (keys 0..D-1, every value assignment, pairwise conflicting): the D x b
    RetNet state is exact and injective, D x D bits (the bound) for c_v = 2^D. Fewer states
    confuse: the state less any one bit, d_k < D key rows (swapping the values of keys 0 and
    d_k keeps the state), one state fewer than the contexts or 2^(⌈bound⌉ - 1) random
    states."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for D, c_v, distinct in sizes:
        ctx = index_contexts(D, c_v, distinct)
        count, A, bound = len(ctx), answers(ctx, D), index_bound_bits(D, c_v, distinct)
        pred, S = retnet_recall(ctx, D, c_v)
        flat = S.flatten(1)
        below = [torch.cat([flat[:, :e], flat[:, e + 1:]], 1) for e in range(flat.shape[1])]
        below += [torch.randint(fewer, (count,), generator=g)
                  for fewer in (count - 1, 2**(math.ceil(bound) - 1)) for _ in range(3)]
        swaps = True
        for d_k in range(1, D):
            p, S_k = retnet_recall(ctx, D, c_v, d_k=d_k)
            swapped = ctx.clone()
            swapped[:, [0, d_k], 1] = ctx[:, [d_k, 0], 1]
            swaps &= bool((p != A).any()) and torch.equal(S_k, retnet_recall(swapped, D, c_v,
                                                                              d_k=d_k)[1])
            below.append(S_k)
        ok = ((A >= 0).all() and count_states(A) == count == (math.perm(c_v, D) if distinct
                                                          else c_v**D)
              and (ctx[..., 0] == torch.arange(D)).all()
              and math.isclose(bound, math.log2(count))
              and torch.equal(pred, A) and count_states(S) == count and swaps
              and find_confusion(ctx, S, D) is None and all(_confuses(ctx, s, D) for s in below))
        if c_v == 2**D:
            ok &= S.shape[1:] == (D, D) and math.ceil(bound) == D * D
        rows.append((f"H.6  INDEX D={D} c_v={c_v}: RetNet {D}x{S.shape[2]} exact, fewer states "
                     "confuse", _ok(ok),
                     f"bound log2 {count} = {bound:.2f} bits vs {D}x{S.shape[2]} 0/1 state = "
                     f"{flat.shape[1]}; confused: any {flat.shape[1] - 1} of its bits, random "
                     f"{count - 1} or {2**(math.ceil(bound) - 1)} states, {D - 1} key rows"))
    return rows


def mqar_retnet(tokens, c, D):
    """retnet_recall on mqar.py sequences: the state after the context k_1 v_1 ... k_D v_D
    (positions 0..2D-1), read at every position; keys one-hot over all c tokens, values
    (from [c/2, c)) as the bits of v - c/2. Returns predicted tokens (B, N)."""
    B, N = tokens.shape
    b = max(1, math.ceil(math.log2(c - c // 2)))
    ctx = tokens[:, :2 * D].reshape(B, D, 2)
    S = retnet_state(one_hot(ctx[..., 0], c), to_bits(ctx[..., 1] - c // 2, b))  # (B, c, b)
    y = torch.einsum("bnk,bkv->bnv", one_hot(tokens, c), S)                   # (B, N, b)
    return from_bits(y) + c // 2


def check_mqar_retnet(seed=0, N=64, D=8, c=128):
    """H.6 on mqar.py instances: the one-hot-key RetNet state answers every query, from the
    state (give k_1 another value and its query gets that value), above the bound
    D log2(c/4) on MQAR's layout."""
    x, y = multiquery_ar(16, c, N, D, fillers="random", seed=seed)
    b = math.ceil(math.log2(c // 2))
    x2 = x.clone()
    x2[:, 1] = (x[:, 1] - c // 2 + 1) % (c - c // 2) + c // 2
    pred = mqar_retnet(x2, c, D)
    r, col = (y != IGNORE).nonzero(as_tuple=True)
    first = x[r, col] == x[r, 0]
    controls = (mqar_accuracy(pred, y) == 1 - 1 / D and index_bound_bits(D, c // 2) >= D *
                math.log2(c / 4) and torch.equal(pred[r, col][first], x2[r[first], 1]))
    return [_exact_row(f"H.6  RetNet (one-hot keys) on mqar.py, N={N} D={D} c={c}",
                       mqar_retnet(x, c, D), y, f"state c x b = {c}x{b} = {c * b} bits vs "
                       f"bound {index_bound_bits(D, c // 2):.1f}: orthogonal keys need a row "
                       "per token", controls)]


# ----------------------------------------------------------------------------------------
# report: every check above, in the order of the paper

CHECKS = [check_convolutions, check_degree, check_kmatrices, check_primitives, check_prop_4_3,
          check_thm_4_4, check_thm_4_5, check_thm_h5, check_hyena, check_h3, check_retnet,
          check_rwkv, check_index, check_min_states, check_mqar_retnet]


def report(seed=0):
    """Rows (statement, Check on random instances, resources vs bound), computed live."""
    return [row for check in CHECKS for row in check(seed)]


def main():
    """`python theory.py`: the report as a table; exit status 1 if any check failed."""
    import sys

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    table = Table("statement", "check", "resources vs bound",
                  title="Zoology appendix H, checked on random instances")
    report_rows = report()
    for statement, check, resources in report_rows:
        table.add_row(escape(statement), str(check), escape(resources))  # plain text
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    return 0 if all(check.ok for _, check, _ in report_rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
