"""The training-step benchmark: a step that projects to logits at the labelled positions
only (train.labelled_loss, this reference's) against one with logits at every position
(full_logits_loss, the official harness's), on one MQAR batch.

Rerun: python -m experiments --bench [--key=value ...]   (any run's settings, e.g.
--mixer=base_conv --seq_len=512 --batch_size=64; experiments/README.md, "Benchmarks").
"""
import time

import torch
import torch.nn.functional as F

from mqar import IGNORE, multiquery_ar
from train import LanguageModel, labelled_loss, make_optimizer, resolve_device


def full_logits_loss(model, inputs, labels):
    """The official harness's loss: logits at every position, then ignore_index."""
    logits = model.logits(model(inputs))                                     # (B, T, c)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def bench(config):
    c = config
    device = resolve_device(c.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(c.seed)
        model = LanguageModel(c).to(device)
    optimizer = make_optimizer(model, c)
    inputs, labels = (x.to(device) for x in multiquery_ar(
        c.batch_size, c.vocab_size, c.seq_len, c.num_kv_pairs, c.power_a, seed=c.seed))

    def step_seconds(loss_fn):
        if device.type != "cpu":
            getattr(torch, device.type).synchronize()          # torch.cuda or torch.mps
        t0 = time.perf_counter()
        loss = loss_fn(model, inputs, labels)
        loss = loss[0] if isinstance(loss, tuple) else loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type != "cpu":
            getattr(torch, device.type).synchronize()          # torch.cuda or torch.mps
        return time.perf_counter() - t0

    # alternate the two, so that a busy moment of the machine hits both alike
    times = {labelled_loss: [], full_logits_loss: []}
    for i in range(12):                                # the first two rounds warm up
        for fn in times:
            seconds = step_seconds(fn)
            if i >= 2:
                times[fn].append(seconds)
    ours, full = (sorted(t)[len(t) // 2] for t in times.values())
    print(f"training step, {c.mixer}, B={c.batch_size}, N={c.seq_len}, D={c.num_kv_pairs}, "
          f"d={c.d_model}, c={c.vocab_size}, {device} (median of 10 steps each, alternating)")
    print(f"  logits at the {c.num_kv_pairs} labelled positions per example: {ours * 1e3:8.1f} ms")
    print(f"  logits at all {c.seq_len} positions (official harness): {full * 1e3:8.1f} ms")
    print(f"  speedup {full / ours:.1f}x")
