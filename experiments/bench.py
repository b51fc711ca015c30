"""The benchmarks: each timing is a ratio against a baseline timed in the same run.

- The training step (bench): a step that projects to logits at the labelled positions only
  (train.labelled_loss, this reference's) against one with logits at every position
  (full_logits_loss, the official harness's), on one MQAR batch.
- The mixers (mixers_bench): every mixer's fast form against its reference form, and its
  time over attention's, as a whole layer and (RECURRENCES) its recurrence alone.
- The MQAR generator (mqar_bench): multiquery_ar against the official algorithm one example
  at a time, in time and peak memory.
- The memory of a training step (memory_bench): what each mixer's step keeps on its device
  at Figure 2's largest cell (step_memory), counted on the meta device, with no data.

Rerun: python -m experiments --bench [--key=value ...]   (any run's settings, e.g.
--mixer=base_conv --seq_len=512 --batch_size=64), python -m experiments --bench=mixers
[--threads=COUNT] (one thread by default), python -m experiments --bench=mqar and
python -m experiments --bench=memory; experiments/README.md, "Benchmarks".
"""
import math
import time
import tracemalloc
from functools import partial

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from mixers import (BASED_IMPLS, DELTA_RULE_IMPLS, DPLR_IMPLS, GLA_IMPLS, MIXERS, RETENTION_IMPLS,
                    SCAN_IMPLS, SSD_IMPLS, WKV_IMPLS, attention_fast, blocked_attention_fast,
                    build_mixer, check_positive, sliding_window_fast)
from experiments.presets import FIGURE2_MIXERS, PAPER_GRID, figure2_batch_size, make_config
from mqar import IGNORE, multiquery_ar, multiquery_ar_per_example
from train import (LanguageModel, evaluate, labelled_loss, labelled_positions,
                   make_optimizer, resolve_device, segments, steps_per_epoch)


def full_logits_loss(model, inputs, labels):
    """The official harness's loss: logits at every position, then ignore_index."""
    logits = model.logits(model(inputs))                                     # (B, T, c)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def one_batch(config):
    """(device, model, optimizer, inputs, labels): `config`'s model (seeded by its seed) and
    optimizer on its device, and one MQAR batch of its size there."""
    device = resolve_device(config.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LanguageModel(config).to(device)
    inputs, labels = (x.to(device) for x in multiquery_ar(
        config.batch_size, config.vocab_size, config.seq_len, config.num_kv_pairs, config.power_a,
        seed=config.seed))
    return device, model, make_optimizer(model, config), inputs, labels


def timed_step(model, optimizer, loss_fn, inputs, labels, device):
    """Seconds of one training step (forward, backward, optimizer step) of loss_fn, the
    device waited for before and after."""
    if device.type != "cpu":
        getattr(torch, device.type).synchronize()              # torch.cuda or torch.mps
    t0 = time.perf_counter()
    loss = loss_fn(model, inputs, labels)
    loss = loss[0] if isinstance(loss, tuple) else loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if device.type != "cpu":
        getattr(torch, device.type).synchronize()
    return time.perf_counter() - t0


def run_seconds(config, steps=3):
    """(seconds of one training step of `config`'s run, seconds of the whole run at most): a
    step timed on one batch of each training segment's size on its device (train's loss;
    the median of `steps` after one that warms up), weighed by the segment's share of the
    batches, times the steps of its schedule (budget_steps where that cuts it), plus its
    evaluations as if none passed the target (a probe of each split every eval_every steps,
    both splits whole at the end: train.evaluation), each slice at the seconds per example
    of one evaluation of a batch of its size. What a sweep's time estimate adds up
    (frontier.yours_estimate)."""
    device, model, optimizer, _, _ = one_batch(config)
    batch = lambda N, D: (x.to(device) for x in multiquery_ar(
        config.batch_size, config.vocab_size, N, D, config.power_a, seed=config.seed))
    epoch = steps_per_epoch(config) / config.segment_passes
    step = per_example = 0.0
    for N, D, examples in segments(config, "train"):
        inputs, labels = batch(N, D)
        loss = partial(labelled_loss, positions=labelled_positions(labels))   # once, as train
        times = [timed_step(model, optimizer, loss, inputs, labels, device)
                 for _ in range(steps + 1)]
        step += sorted(times[1:])[steps // 2] * math.ceil(examples / config.batch_size) / epoch
    stop = min(config.max_steps, config.budget_steps or config.max_steps)
    probe = lambda n: config.eval_probe if 0 < config.eval_probe < n else n
    evaluations = 0.0
    for N, D, examples in segments(config, "test"):
        inputs, labels = batch(N, D)
        t0 = time.perf_counter()
        evaluate(model, inputs, labels)               # reads the result back: the device waits
        per_example = (time.perf_counter() - t0) / len(inputs)
        evaluations += per_example * ((stop // config.eval_every) * (probe(config.num_valid)
                                                                     + probe(examples))
                                      + config.num_valid + examples)
    return step, step * stop + evaluations


def bench(config):
    device, model, optimizer, inputs, labels = one_batch(config)
    ours = partial(labelled_loss, positions=labelled_positions(labels))   # once, as in train
    # alternate the two, so that a busy moment of the machine hits both alike
    times = {ours: [], full_logits_loss: []}
    for i in range(12):                                # the first two rounds warm up
        for fn in times:
            seconds = timed_step(model, optimizer, fn, inputs, labels, device)
            if i >= 2:
                times[fn].append(seconds)
    ours, full = (sorted(runs)[len(runs) // 2] for runs in times.values())
    print(f"training step, {config.mixer}, B={config.batch_size}, N={config.seq_len}, "
          f"D={config.num_kv_pairs}, d={config.d_model}, c={config.vocab_size}, {device} "
          "(median of 10 steps each, alternating)")
    print(f"  logits at the {config.num_kv_pairs} labelled positions per example: "
          f"{ours * 1e3:8.1f} ms")
    print(f"  logits at all {config.seq_len} positions (official harness): {full * 1e3:8.1f} ms")
    print(f"  speedup {full / ours:.1f}x")


# ----------------------------------------------------------------------------------------
# the mixers: fast form vs reference for every mixer

BENCH_VARIANTS = [("long_conv", dict(filter="implicit")), ("base_conv", dict(kernel_size=3)),
                  ("base_conv", dict(form="official")), ("hyena", dict(form="official")),
                  ("h3", dict(form="official", head_dim=2))]


def _forward_seconds(mixer, x, budget=1.0, max_calls=10):
    """Best time of up to `max_calls` calls made within `budget` seconds (at least one; the
    first is also the warm-up). The minimum is the least disturbed by other processes."""
    times, start = [], time.perf_counter()
    with torch.no_grad():
        while not times or (len(times) < max_calls and time.perf_counter() - start < budget):
            t0 = time.perf_counter()
            mixer(x)
            times.append(time.perf_counter() - t0)
    return min(times)


def mixers_bench(shapes=((8, 512, 64), (2, 4096, 64)), threads=1):
    """Forward time of each mixer's fast form and reference, and its state size. fast/attn is
    the fast form's time over attention's fast form (scaled_dot_product_attention) at the
    same shape. One thread by default: timings on a shared machine vary less."""
    check_positive("threads", threads)
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    print(f"float32, torch.set_num_threads({threads}); seconds per forward: the best of up "
          f"to 10 calls within 1 s")
    rows = [(name, {}) for name in MIXERS] + BENCH_VARIANTS
    print(f"{'mixer':<28}{'B':>3}{'T':>6}{'d':>4}{'fast s':>10}{'ref s':>10}{'ref/fast':>9}"
          f"{'fast/attn':>10}{'state':>10}")
    for B, T, d in shapes:
        x = torch.randn(B, T, d)
        for name, kwargs in rows:
            label = name + "".join(f" {k}={v}" for k, v in kwargs.items())
            fast = build_mixer(name, d, T, impl="fast", **kwargs)
            ref = build_mixer(name, d, T, impl="reference", **kwargs)
            ref.load_state_dict(fast.state_dict())
            extra = {"tokens": torch.randint(0, 16, (B, T))} if fast.takes_tokens else {}
            tf, tr = (_forward_seconds(partial(m, **extra), x) for m in (fast, ref))
            if name == "attention":
                t_attention = tf                              # the first row of MIXERS
            print(f"{label:<28}{B:>3}{T:>6}{d:>4}{tf:>10.4f}{tr:>10.4f}{tr / tf:>9.1f}"
                  f"{tf / t_attention:>10.2f}{fast.state_size(T):>10}")
    # the windowed forms alone: the rows above also time the projections, which cost every
    # attention module the same and so bound the windowed modules' fast/attn from below
    B, T, d = shapes[-1]
    q, k, v = (torch.randn(B, 1, T, d) for _ in range(3))
    t_full, ratios = _forward_seconds(lambda q: attention_fast(q, k, v), q), []
    for f in (sliding_window_fast, blocked_attention_fast):
        seconds = _forward_seconds(lambda q: f(q, k, v, 32), q)
        ratios.append(f"{f.__name__}(q, k, v, 32) {seconds / t_full:.3f}")
    print(f"time over attention_fast(q, k, v)'s at (B, H, T, hs) = {(B, 1, T, d)}: "
          + ", ".join(ratios))
    # the recurrences alone, on the arguments each layer hands them at (B, T, d): the rows
    # above also time what a layer's two forms share (projections, short convolutions,
    # norms, gates), which bounds a layer's ref/fast from above
    print(f"the recurrences alone at (B, T, d) = {(B, T, d)}, as each layer calls them:")
    print(f"{'mixer':<16}{'function':<24}{'fast s':>10}{'ref s':>10}{'ref/fast':>9}")
    x = torch.randn(B, T, d)
    for name, impls in RECURRENCES:
        args, kwargs = _recurrence_call(name, impls, x)
        tf, tr = (_forward_seconds(lambda _: impls[form](*args, **kwargs), None)
                  for form in ("fast", "reference"))
        print(f"{name:<16}{impls['fast'].__name__:<24}{tf:>10.4f}{tr:>10.4f}{tr / tf:>9.1f}")


# the mixers whose recurrence has a fast form beside its reference, and their forms
RECURRENCES = [("rwkv", WKV_IMPLS), ("retnet", RETENTION_IMPLS), ("based", BASED_IMPLS),
               ("mamba", SCAN_IMPLS), ("gla", GLA_IMPLS), ("mamba2", SSD_IMPLS),
               ("deltanet", DELTA_RULE_IMPLS), ("gated_deltanet", DELTA_RULE_IMPLS),
               ("rwkv7", DPLR_IMPLS)]


def _recurrence_call(name, impls, x):
    """The (args, kwargs) that mixer `name`'s fast form hands impls["fast"] on x."""
    calls, fast = [], impls["fast"]
    impls["fast"] = lambda *args, **kwargs: calls.append((args, kwargs)) or fast(*args, **kwargs)
    try:
        with torch.no_grad():
            build_mixer(name, x.shape[-1], x.shape[1])(x)
    finally:
        impls["fast"] = fast
    return calls[0]


# ----------------------------------------------------------------------------------------
# the MQAR generator: vectorized against one example at a time

def _seconds(fn, *args, repeats=3, **kwargs):
    """Best wall time of `repeats` calls (after one warm-up call when repeats > 1)."""
    if repeats > 1:
        fn(*args, **kwargs)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best


def _peak_bytes(fn, *args, **kwargs):
    """(peak bytes traced by tracemalloc during one call, bytes of its output tensors)."""
    tracemalloc.start()
    out = fn(*args, **kwargs)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, sum(tensor.numel() * tensor.element_size() for tensor in out)


def mqar_bench():
    """MQAR's generator (multiquery_ar) against the official algorithm one example at a time
    (multiquery_ar_per_example), time and peak memory, measured in this run."""
    N, D, MiB = 256, 16, 2**20
    print(f"MQAR generator benchmark, N={N}, D={D}, c=8192 "
          "(time: best of 3 after a warm-up; peak memory: tracemalloc, one call)")
    fast_s = _seconds(multiquery_ar, 10_000, seq_len=N, num_kv_pairs=D)
    slow_s = _seconds(multiquery_ar_per_example, 10_000, seq_len=N, num_kv_pairs=D,
                      repeats=1)
    fast_peak, out_bytes = _peak_bytes(multiquery_ar, 10_000, seq_len=N, num_kv_pairs=D)
    slow_peak, _ = _peak_bytes(multiquery_ar_per_example, 10_000, seq_len=N, num_kv_pairs=D)
    print(f"  10,000 examples   vectorized  {fast_s:7.3f} s  peak {fast_peak / MiB:6.1f} MiB")
    print(f"                    per-example {slow_s:7.3f} s  peak {slow_peak / MiB:6.1f} MiB")
    print(f"                    speedup {slow_s / fast_s:.1f}x, output {out_bytes / MiB:.1f} MiB")
    big_s = _seconds(multiquery_ar, 100_000, seq_len=N, num_kv_pairs=D, repeats=1)
    big_peak, big_out = _peak_bytes(multiquery_ar, 100_000, seq_len=N, num_kv_pairs=D)
    print(f"  100,000 examples  vectorized  {big_s:7.3f} s  peak {big_peak / MiB:6.1f} MiB, "
          f"output {big_out / MiB:.1f} MiB, peak/output {big_peak / big_out:.2f}x")


# ----------------------------------------------------------------------------------------
# the memory of a training step, counted on the meta device

def fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None):
    """F.scaled_dot_product_attention by the fused kernel a CPU runs, which keeps for backward
    what a GPU's fused kernels keep (q, k, v, the output and a logsumexp per query, a float
    mask where one is given): the meta device has no kernel to choose and runs the composite
    form, which keeps the (B, H, T, T) weights. A boolean mask becomes the float mask the
    CPU's dispatcher turns it into (0 where True, -inf elsewhere)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype,
                                device=attn_mask.device).masked_fill(~attn_mask, -math.inf)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


class FusedAttentionOnMeta(TorchFunctionMode):
    """scaled_dot_product_attention on meta tensors runs fused_attention."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention and args[0].is_meta:
            return fused_attention(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def step_memory(config, device="meta"):
    """The bytes one training step of config's model keeps on its device, short of what
    backward makes as it runs: the storages autograd saves in forward and the loss for
    backward, the parameters, their gradients and AdamW's two moments (exp_avg, exp_avg_sq).
    On the meta device (the default) a tensor has its shape and no data, so nothing is
    computed and nothing allocated: the paper's scale is counted in seconds on a laptop. What
    it counts there is what a CPU run saves, byte for byte (a test checks every paper form),
    but for attention with dropout, which the CPU runs in its composite form: on the meta
    device attention is counted as the fused kernels of a CPU and a GPU keep it
    (fused_attention), dropout or not.

    Counted: every storage torch.autograd.graph.saved_tensors_hooks is handed (the inputs
    torch.utils.checkpoint keeps for its recomputation among them), once however many saved
    tensors view it, parameters not among them; each parameter's bytes four times (itself,
    its gradient, AdamW's two moments). The loss is train's, labelled_loss plus the mixers'
    aux_loss, at the B·D labelled rows of an MQAR batch, their positions found on the CPU
    (labelled_positions reads the data, which the meta device has not), as train finds the
    training split's once.
    Not counted: the allocator's rounding and fragmentation (PyTorch's CUDA caching
    allocator rounds each block up to 512 bytes and keeps freed blocks for reuse), kernel
    workspace (cuBLAS, cuDNN, cuFFT plans), the tensors that an op or backward makes and
    frees (the transient peak: a gradient while it flows, the steps torch.utils.checkpoint
    recomputes), AdamW's step counters, the data set (train moves every split to the device:
    16·(num_train + num_valid + num_test)·N bytes of int64 tokens and labels) and CUDA's
    context. The model runs in float32 whatever config.amp says.
    Returns a dict of bytes: saved, parameters, gradients, adamw and their total.
    """
    inputs, labels = multiquery_ar(config.batch_size, config.vocab_size, config.seq_len,
                                   config.num_kv_pairs, config.power_a, seed=config.seed)
    positions = labelled_positions(labels)                                   # (B, D)
    inputs, labels, positions = (t.to(device) for t in (inputs, labels, positions))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LanguageModel(config).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    kept = {id(p.untyped_storage()) for p in model.parameters()}
    saved = {}                                      # id -> storage, each kept alive till counted

    def pack(t):
        storage = t.untyped_storage()
        if id(storage) not in kept:
            saved[id(storage)] = storage
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), FusedAttentionOnMeta():
        loss = labelled_loss(model, inputs, labels, positions)[0] + model.aux_loss()
    weights = sum(p.numel() * p.element_size() for p in params)
    memory = dict(saved=sum(s.nbytes() for s in saved.values()), parameters=weights,
                  gradients=weights, adamw=2 * weights)
    return {**memory, "total": sum(memory.values())}


def memory_configs():
    """(label, config) of each row of memory_bench, at Figure 2's largest cell (the last N,
    D and d of PAPER_GRID) with the official batch size there: every mixer's paper form in
    the CPU preset's 2-layer model, then Figure 2's official run of each of its models
    (preset figure2: official forms and block, dropout 0.1)."""
    (N, D), d = PAPER_GRID["nd"][-1], PAPER_GRID["d_model"][-1]
    cell = dict(seq_len=N, num_kv_pairs=D, d_model=d)
    return ([(f"`{name}`", make_config(mixer=name, batch_size=figure2_batch_size(N), **cell))
             for name in MIXERS] +
            [(f"`{name}`, Figure 2's run", make_config(preset="figure2", mixer=name, **cell))
             for name in FIGURE2_MIXERS])


def memory_rows():
    """(label, step_memory) of each row of memory_configs."""
    return [(label, step_memory(config)) for label, config in memory_configs()]


def memory_table(rows):
    """The Markdown table of memory_bench: memory_rows in GiB."""
    lines = ["| mixer | saved for backward | weights, gradients, AdamW | total |",
             "|---|---|---|---|"]
    for label, memory in rows:
        saved, total = memory["saved"] / 2**30, memory["total"] / 2**30
        lines.append(f"| {label} | {saved:.2f} | {total - saved:.2f} | {total:.2f} |")
    return "\n".join(lines)


def memory_bench():
    """The memory each mixer's training step keeps (step_memory) at Figure 2's largest cell."""
    _, c = memory_configs()[0]
    print(f"training-step memory, GiB (2^30 bytes), at (B, N, d) = ({c.batch_size}, "
          f"{c.seq_len}, {c.d_model}), D = {c.num_kv_pairs}, c = {c.vocab_size}, "
          f"{c.n_layers} layers, float32, counted on the meta device (step_memory)")
    print(memory_table(memory_rows()))
