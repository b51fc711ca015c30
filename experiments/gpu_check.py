"""The GPU check (issue 48): python -m experiments --gpu_check [--out=DIR], everything the
project runs on a GPU tried in one command that ends within 8 minutes on a CUDA GPU, so that
one short lease of a GPU says what works there. In order, each part under a time budget of
its own (GPU below; the rest of the 8 minutes goes to part 5):

  part      what it runs                                              budget    per item
  train     every mixer (mixers.MIXERS) and every official form       60 s      10 s
            (mixers.OFFICIAL_FORMS) in train.py's model, 6 steps of
            train.py's training step (labelled_loss, aux_loss, AdamW)
            in float32 and under bfloat16 autocast (--amp): whether
            it runs, the last loss finite, the median time per step
  contract  the mixer contract on each, the layer on the GPU (below)  75 s      15 s
  main job  train.main_job into DIR/main (records, DIR/main.png)      60 s      60 s
  bench     bench.bench on three runs: ms per step, the speedup of    30 s      15 s
            labelled logits, tokens per second, peak GPU memory
            (torch.cuda.max_memory_allocated)
  mixers    bench.mixers_bench at its shapes: every form's time,      150 s     150 s
            ref/fast and fast/attn, peak GPU memory (its clock
            made to wait for the GPU: mixers_item)
  fig2      while time is left, the BaseConv runs of the sweep        the rest  the rest
            fig2_plotted_grid at d = 64 and 128 (paper scale), their
            records written to results/fig2_plotted_grid/ as they
            finish; the run in flight at the end is stopped as a
            Ctrl-C stops it (train: its step ends, it checkpoints),
            so the same command continues it and skips the finished

Why these budgets: at (B, N, d) = (32, 256, 64) a training step of any layer here is a few
milliseconds on a GPU, bound by kernel launches, so 24 layers x 2 precisions x 6 steps take
well under the 60 s, and a layer that needs 10 s has a problem worth its row. The contract
steps each layer token by token over T = 64 positions in float64 and float32 (about a
thousand launches). The main job is at most 2,000 steps of two 2-layer models at d = 64
(attention stops at its target) and their evaluations. bench times 24 steps a run.
mixers_bench gives each form at most 1 s (its own rule) over 24 layers x 2 shapes x 2 forms
and 9 recurrences x 2 forms: at most about 120 s. The whole ends 40 s before 8 minutes
(TOTAL_SECONDS): time for the interpreter and CUDA to start before it, and after it for the
run in flight to stop, checkpoint and write its record, and for the report.

The contract on the GPU: mixers.check_mixer builds the layer on the CPU and makes its inputs
there; here each copy of the layer is wrapped in OnDevice (check_mixer's `wrap`), so every
check but "device" runs check_mixer's own functions and tolerances (step == forward to 1e-10
in float64 and 1e-5 in float32, causality to 1e-12 in float64, the rows of a batch
independent to 1e-12, two forwards equal exactly) on the layer moved to the GPU behind the
checks' CPU inputs. "device" runs the layer on PyTorch's meta device, not on a GPU
(test_all.py runs it).

Without a CUDA GPU it runs on the CPU at a tiny setting (CPU_SETTING: d = 16, two paper
forms and two official forms, 3 steps, the main job's two runs for 2 steps on small splits,
one run of part 5 shrunk likewise, into DIR), in about half a minute, so that it is known
to work before a GPU is at hand (experiments/test_lab.py runs it).

An item that fails is a row that says so (its exception's first line), never a crash: the
report goes on, and every item's output and traceback are in DIR/log.txt. What it writes:
the report (printed, and DIR/report.md), the measurements (DIR/report.json), DIR/log.txt,
the main job's records (DIR/main/) and figure. A Ctrl-C stops it with the report so far.
Budgets are kept by SIGALRM (deadline), so it runs in the main thread of a POSIX system.

The device call of a lent session (the report and up to 8 files come back from $OUT; the
sweep's folder comes back as one archive, to unpack here before a second call, which names
it in carry so that the checkpoint of the run it stopped travels too):

  run(command="PYTHONUNBUFFERED=1 python3 -m experiments --gpu_check --out=$OUT/gpu_check;
      [ ! -d results/fig2_plotted_grid ] || tar -czf $OUT/fig2_plotted_grid.tgz
      results/fig2_plotted_grid", timeout_s=540, carry=["results/fig2_plotted_grid"])

The check ends within 8 minutes by itself; timeout_s=540 adds a minute for what no alarm
cuts short (a CUDA call that hangs). With the machine's start (1 to 2 minutes) a lease of 15
minutes then keeps about 4 for a second call: a fresh start and a short command (one failing
item again), not a second check; the next lease's check continues part 5. The main job's
BaseConv record has a "+" in its name, which does not come back from $OUT (its numbers are
in the report). What to paste in a note: the report as printed (its header names the GPU,
torch, CUDA, native bfloat16 and TF32), and for each FAIL row the last line of its
traceback in DIR/log.txt.
"""
import contextlib
import dataclasses
import functools
import io
import json
import math
import re
import signal
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
import torch.nn as nn

from experiments import bench as bench_module
from experiments.bench import bench, mixers_bench
from experiments.common import strict_json, sweep_runs
from experiments.figure2 import SWEEPS as FIGURE2_SWEEPS
from experiments.presets import make_config
from mixers import CONTRACT, CONTRACT_BATCH, MIXERS, OFFICIAL_FORMS, check_mixer
from mqar import multiquery_ar
from train import (MAIN_MODELS, LanguageModel, acc_text, finished_record, labelled_loss,
                   main_job, make_optimizer, markdown, record_path, seeded_rng, train)

TOTAL_SECONDS = 440           # 8 minutes less 40 s: the interpreter's and CUDA's start
                              # before, the last run's stop and the report after
STOP_GRACE = 15               # seconds a stopped run of train has to checkpoint and end
GRID = "fig2_plotted_grid"    # part 5's sweep, its BaseConv runs at these widths
GRID_WIDTHS = (64, 128)
DEVICE_CHECKS = tuple(check for check in CONTRACT if check != "device")


# ----------------------------------------------------------------------------------------
# what the check runs at: a GPU's setting and the CPU's tiny one

@dataclasses.dataclass(frozen=True)
class Setting:
    """What the check runs at and how long each part may take (seconds)."""
    d_model: int                  # of the training steps (part 1)
    seq_len: int
    num_kv_pairs: int
    batch_size: int
    steps: int                    # training steps per layer and precision; the first warms up
    layers: tuple                 # (name, form) of the layers of parts 1 and 2
    contract_d_model: int         # of the contract (part 2)
    contract_seq_len: int
    main_overrides: tuple         # (): train.main_job as it is; else its two runs with these
                                  # (key, value) settings
    bench_runs: tuple             # make_config overrides of each bench.bench run
    bench_shapes: tuple           # mixers_bench's (B, T, d)
    grid_runs: int | None         # part 5: the first this many runs; None: every one
    grid_overrides: tuple         # part 5: (key, value) on each run, written into DIR
    budgets: tuple                # (part, seconds, seconds per item), in order
    total: float                  # seconds for the whole; part 5 gets what is left


EVERY_LAYER = (tuple((name, "paper") for name in MIXERS)
               + tuple((name, "official") for name in OFFICIAL_FORMS))
# N = 256: the long filters (256 taps) take the FFT path (mixers.SHORT_FILTER = 16), where
# autocast on CUDA differs from the CPU's
GPU_SETTING = Setting(
    d_model=64, seq_len=256, num_kv_pairs=16, batch_size=32, steps=6, layers=EVERY_LAYER,
    contract_d_model=64, contract_seq_len=64, main_overrides=(),
    # the CPU recipe's run; the main job's BaseConv; the model of part 5's runs at d = 128
    bench_runs=((("mixer", "attention"),), (("mixer", MAIN_MODELS["base_conv"]),),
                (("preset", "figure2_plotted"), ("mixer", "base_conv"), ("d_model", 128))),
    bench_shapes=((8, 512, 64), (2, 4096, 64)), grid_runs=None, grid_overrides=(),
    budgets=(("train", 60, 10), ("contract", 75, 15), ("main job", 60, 60), ("bench", 30, 15),
             ("mixers", 150, 150)),
    total=TOTAL_SECONDS)
# N = 32 and T = 20 > SHORT_FILTER: the long filters take the FFT path here too
CPU_SETTING = Setting(
    d_model=16, seq_len=32, num_kv_pairs=4, batch_size=4, steps=3,
    layers=(("attention", "paper"), ("base_conv", "paper"), ("base_conv", "official"),
            ("hyena", "official")),
    contract_d_model=16, contract_seq_len=20,
    main_overrides=(("max_steps", 2), ("num_train", 512), ("num_test", 128), ("num_valid", 128)),
    bench_runs=((("batch_size", 8), ("seq_len", 32), ("d_model", 16)),),
    bench_shapes=((2, 32, 16),), grid_runs=1,
    grid_overrides=(("d_model", 16), ("batch_size", 16), ("num_train", 256), ("num_test", 64),
                    ("num_valid", 64), ("budget_steps", 2)),
    budgets=(("train", 60, 30), ("contract", 60, 30), ("main job", 60, 60), ("bench", 30, 30),
             ("mixers", 60, 60)),
    total=360)


def layer_label(name, form):
    return name if form == "paper" else f"{name} (official)"


def layer_setting(name, form):
    """The `mixer` setting of one layer in `form`."""
    return name if form == "paper" else f"{name}:form=official"


# ----------------------------------------------------------------------------------------
# the pieces each part times

def synchronize(device):
    """Wait for the GPU's queue: CUDA runs kernels asynchronously (PyTorch docs, "CUDA
    semantics", asynchronous execution), so a time read without it is a launch's."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device):
    """Bytes allocated at most since the last reset_peak_memory (a GPU's only), or None."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def reset_peak_memory(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def gib(nbytes):
    return "" if nbytes is None else f", peak {nbytes / 2**30:.2f} GiB"


def training_steps(name, form, amp, setting, device):
    """`setting.steps` of train.py's training step (the step of train.train: labelled_loss
    and the mixers' aux_loss under bfloat16 autocast when `amp`, backward, AdamW) on one
    MQAR batch, each step timed to the end of its kernels; passes if the last loss is
    finite."""
    s = setting
    config = make_config(mixer=layer_setting(name, form), d_model=s.d_model, seq_len=s.seq_len,
                         num_kv_pairs=s.num_kv_pairs, batch_size=s.batch_size, amp=amp,
                         device=str(device), progress=False)
    with seeded_rng(config.seed, device):
        model = LanguageModel(config).to(device)
    optimizer = make_optimizer(model, config)
    inputs, labels = (x.to(device) for x in multiquery_ar(
        s.batch_size, config.vocab_size, s.seq_len, s.num_kv_pairs, config.power_a, seed=0))
    seconds = []
    for _ in range(s.steps):
        synchronize(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss, _, _ = labelled_loss(model, inputs, labels)
            loss = loss + model.aux_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        synchronize(device)
        seconds.append(time.perf_counter() - t0)
    step = sorted(seconds[1:])[(len(seconds) - 1) // 2]     # the median after the warm-up
    loss = loss.item()
    measured = f"{step * 1e3:.1f} ms/step, loss {loss:.2f}"
    # a loss that is not finite is kept as its text: the report's JSON has no nan or inf
    return math.isfinite(loss), measured, dict(seconds_per_step=step, loss=loss if
                                               math.isfinite(loss) else str(loss))


class OnDevice(nn.Module):
    """A mixer on `device` behind tensors on the CPU: its weights, forward and step run on
    the device, their inputs copied there and their outputs back (a state stays there), so
    that the contract's checks, which make their inputs on the CPU, test the layer on the
    device. What a check reads of a mixer (takes_tokens, state_size, whether it has a step)
    is the wrapped mixer's."""

    def __init__(self, mixer, device):
        super().__init__()
        self.mixer, self.device = mixer.to(device), device

    def forward(self, x, **kwargs):
        kwargs = {key: value.to(self.device) for key, value in kwargs.items()}
        return self.mixer(x.to(self.device), **kwargs).to(x.device)

    def step_on_device(self, x_t, state, **kwargs):
        kwargs = {key: value.to(self.device) for key, value in kwargs.items()}
        y, state = self.mixer.step(x_t.to(self.device), state, **kwargs)
        return y.to(x_t.device), state

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)              # parameters, buffers, the mixer
        except AttributeError:
            mixer = super().__getattr__("mixer")
            if name == "step" and callable(getattr(mixer, "step", None)):
                return self.step_on_device
            return getattr(mixer, name)


def contract_on(device, name, options, d_model, seq_len):
    """check_mixer's checks but the meta device's (DEVICE_CHECKS), each on the layer on
    `device` (OnDevice): one Clause per check."""
    return check_mixer(name, options, d_model, seq_len, DEVICE_CHECKS,
                       wrap=lambda mixer: OnDevice(mixer, device))


def contract_item(name, form, setting, device):
    options = {} if form == "paper" else {"form": "official"}
    clauses = contract_on(device, name, options, setting.contract_d_model,
                          setting.contract_seq_len)
    failed = [c for c in clauses if c.status == "fail"]
    absent = sum(c.status == "absent" for c in clauses)
    measured = ("; ".join(f"{c.check}: {c.measured}" for c in failed) if failed else
                f"{len(clauses) - absent} checks" + (f", {absent} absent" if absent else ""))
    return not failed, measured, {c.check: c.status for c in clauses}


def main_job_item(setting, folder):
    """train.main_job into `folder`, or (the CPU's) its two runs with main_overrides."""
    if setting.main_overrides:
        records = [train(make_config(label=label, mixer=mixer, out_dir=str(folder),
                                     progress=False, **dict(setting.main_overrides)))
                   for label, mixer in MAIN_MODELS.items()]
    else:
        records = main_job(str(folder))
    measured = ", ".join(f"{r['config']['label']} {acc_text(r['test_acc'])} ({r['steps']:,} "
                         f"steps, {r['train_time_s']:.0f} s, {r['ended']})" for r in records)
    ok = all(r["ended"] in ("target_reached", "max_steps") for r in records)
    return ok, measured, {r["config"]["label"]: dict(test_acc=r["test_acc"], steps=r["steps"],
                                                     seconds=r["train_time_s"],
                                                     ended=r["ended"]) for r in records}


def printed(fn, *args, **kwargs):
    """What fn(*args, **kwargs) prints, printed again (for the log)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args, **kwargs)
    print(out.getvalue(), end="")
    return out.getvalue()


def bench_item(overrides, device):
    """bench.bench on one run, its printed times read back: ms per step (logits at the
    labelled positions; at all of them), the speedup, tokens per second, peak memory."""
    config = make_config(**overrides, device=str(device), progress=False)
    reset_peak_memory(device)
    text = printed(bench, config)
    ours, full = (float(ms) for ms in re.findall(r"([\d.]+) ms", text))
    tokens = config.batch_size * config.seq_len / (ours / 1e3)
    peak = peak_memory(device)
    measured = (f"{ours:.1f} ms/step ({full:.1f} at every position, {full / ours:.1f}x), "
                f"{tokens:,.0f} tokens/s{gib(peak)}")
    return True, measured, dict(ms=ours, full_ms=full, speedup=full / ours,
                                tokens_per_s=tokens, peak_bytes=peak)


BENCH_ROW = re.compile(r"(\S.*?)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                       r"\s+([\d.]+)\s+(\d+)$")


def mixers_item(shapes, device):
    """bench.mixers_bench on `device` at `shapes`, its table read back. Its tensors and
    layers are made on the device (torch.device as the default device) and its clock waits
    for the GPU's queue before each reading (bench.py's _forward_seconds reads perf_counter
    without synchronize); the thread count and the CPU generator it sets are given back
    after it."""
    threads, clock = torch.get_num_threads(), time.perf_counter
    synced = SimpleNamespace(perf_counter=lambda: synchronize(device) or clock())
    reset_peak_memory(device)
    try:
        with (torch.random.fork_rng(devices=[]), torch.device(device),
              mock.patch.object(bench_module, "time", synced)):
            text = printed(mixers_bench, shapes=shapes)
    finally:
        torch.set_num_threads(threads)
    rows = [dict(layer=m[1], B=int(m[2]), T=int(m[3]), d=int(m[4]), fast_s=float(m[5]),
                 ref_s=float(m[6]), ref_over_fast=float(m[7]), fast_over_attn=float(m[8]))
            for m in map(BENCH_ROW.match, text.splitlines()) if m]
    last = [r for r in rows if (r["B"], r["T"], r["d"]) == shapes[-1]]
    slowest = max(last, key=lambda r: r["fast_over_attn"])
    measured = (f"{len(rows)} rows; at {shapes[-1]} the slowest fast form {slowest['layer']}, "
                f"{slowest['fast_over_attn']:.2f}x attention's{gib(peak_memory(device))}")
    return len(rows) == len(shapes) * len(last), measured, dict(rows=rows,
                                                               peak_bytes=peak_memory(device))


def grid_runs(setting, out):
    """Part 5's runs (Config overrides): the sweep's BaseConv runs at GRID_WIDTHS, into its
    folder; the CPU's first `grid_runs` of them shrunk by grid_overrides, into DIR."""
    runs = [o for label, o in sweep_runs(GRID, FIGURE2_SWEEPS[GRID], "paper")
            if label == "base_conv" and o["d_model"] in GRID_WIDTHS]
    if setting.grid_overrides:
        runs = [{**o, **dict(setting.grid_overrides), "out_dir": str(out / GRID)} for o in runs]
    return runs[:setting.grid_runs]


def grid_item(overrides):
    config = make_config(**overrides)
    record = finished_record(config)
    earlier = " (an earlier call's record)" if record else ""
    record = record or train(config)
    measured = (f"test acc {acc_text(record['test_acc'])}, {record['steps']:,} steps, "
                f"{record['train_time_s']:.0f} s{earlier}")
    return True, measured, dict(test_acc=record["test_acc"], steps=record["steps"],
                                seconds=record["train_time_s"], record=str(record_path(config)))


def grid_stopped(overrides):
    """The row of a run of part 5 stopped at the end of the time: its interrupted record."""
    config = make_config(**overrides)
    path = record_path(config)
    steps = json.loads(path.read_text())["steps"] if path.exists() else 0
    stop = min(config.max_steps, config.budget_steps or config.max_steps)
    return f"stopped at step {steps:,} of {stop:,}, checkpointed: the same command continues"


# ----------------------------------------------------------------------------------------
# time budgets, items and the report

class OutOfTime(Exception):
    """An item ran past its deadline."""


@contextlib.contextmanager
def deadline(seconds, stop_train=False):
    """Stop the block after `seconds` (SIGALRM): OutOfTime is raised in it; with stop_train,
    a Ctrl-C is delivered first (SIGINT), on which a run of train.train ends its step,
    checkpoints, writes an "interrupted" record and raises KeyboardInterrupt, and OutOfTime
    only STOP_GRACE seconds later. Yields a list that holds an entry once the time is up."""
    fired = []

    def handler(signum, frame):
        fired.append(signum)
        if stop_train and len(fired) == 1:
            signal.setitimer(signal.ITIMER_REAL, STOP_GRACE)
            signal.raise_signal(signal.SIGINT)
        else:
            raise OutOfTime(f"out of time ({seconds:.0f} s)")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def first_line(error):
    return (str(error).strip().splitlines() or [""])[0]


class Check:
    """The rows of one GPU check, its log (DIR/log.txt) and its report."""

    def __init__(self, out, setting, device):
        self.out, self.setting, self.device = out, setting, device
        self.start, self.rows = time.perf_counter(), []
        self.log = (out / "log.txt").open("w")

    def elapsed(self):
        return time.perf_counter() - self.start

    def item(self, part, name, fn, until, cap, stop_train=False, stopped=None):
        """Run fn() -> (ok, measured text, numbers) within min(cap, until - now) seconds
        (deadline; stop_train: fn runs train.train, which stops on a Ctrl-C), its output and
        any traceback to the log: one row, "pass", "FAIL" (fn's verdict, an exception, or
        out of time), "stopped" (out of time where `stopped` is given, `stopped()` saying
        where) or "skipped" (no time left). A Ctrl-C of the user's stops the check."""
        seconds = min(cap, until - self.elapsed())
        row = dict(part=part, item=name, result="skipped", measured="no time left",
                   seconds=0.0)
        if seconds >= 1:
            output, t0, trace = io.StringIO(), time.perf_counter(), ""
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                try:
                    with deadline(seconds, stop_train) as fired:
                        ok, measured, numbers = fn()
                    row.update(result="pass" if ok else "FAIL", measured=measured,
                               numbers=numbers)
                except (OutOfTime, KeyboardInterrupt) as e:
                    if not fired:
                        raise
                    row.update(result="stopped" if stopped else "FAIL",
                               measured=stopped() if stopped else f"out of time ({seconds:.0f} s)")
                    trace = traceback.format_exc() if isinstance(e, OutOfTime) else ""
                except Exception as e:
                    row.update(result="FAIL", measured=f"{type(e).__name__}: {first_line(e)}")
                    trace = traceback.format_exc()
            row["seconds"] = round(time.perf_counter() - t0, 2)
            self.log.write(f"=== {part}: {name}: {row['result']} ({row['seconds']} s)\n"
                           f"{output.getvalue()}{trace}\n")
            self.log.flush()
        self.rows.append(row)
        return row

    def header(self):
        d = self.device
        if d.type == "cuda":
            name = (f"{torch.cuda.get_device_name(d)}, torch {torch.__version__}, CUDA "
                    f"{torch.version.cuda}, native bfloat16 "
                    f"{torch.cuda.is_bf16_supported(including_emulation=False)}, TF32 matmul "
                    f"{torch.backends.cuda.matmul.allow_tf32}, cuDNN "
                    f"{torch.backends.cudnn.allow_tf32}")
        else:
            name = f"the CPU ({torch.get_num_threads()} threads), torch {torch.__version__}"
        s = self.setting
        return (f"GPU check on {name}: {self.elapsed():.0f} s of {s.total:.0f}\n"
                f"train: (B, N, D, d) = ({s.batch_size}, {s.seq_len}, {s.num_kv_pairs}, "
                f"{s.d_model}), {s.steps} steps, the median after the first; contract: (B, T, "
                f"d) = ({CONTRACT_BATCH}, {s.contract_seq_len}, {s.contract_d_model})")

    def report(self):
        """The header, one row per layer (parts 1 and 2), one per other item."""
        cell = lambda text, width: text[:width].replace("|", "/")     # a | ends a cell
        cut = lambda row: cell(f"{row['result']} {row['measured']}".strip(), 60)
        by = {(r["part"], r["item"]): r for r in self.rows}
        layers = dict.fromkeys(r["item"].split(": ")[0] for r in self.rows
                               if r["part"] in ("train", "contract"))
        missing = dict(result="skipped", measured="")
        layer_rows = [[layer, *(cut(by.get((part, f"{layer}{what}"), missing)) for part, what
                                in (("train", ": float32"), ("train", ": amp"),
                                    ("contract", "")))] for layer in layers]
        other = [[r["item"], r["result"], cell(r["measured"], 110)] for r in self.rows
                 if r["part"] not in ("train", "contract")]
        contract = f"contract on {self.device.type}"
        tables = [markdown(["mixer", "float32", "amp (bfloat16)", contract], layer_rows)]
        if other:
            tables.append(markdown(["what", "result", "measured"], other))
        return "\n\n".join([self.header(), *tables]) + "\n"

    def write(self):
        (self.out / "report.md").write_text(self.report())
        (self.out / "report.json").write_text(strict_json(dict(
            header=self.header(), setting=dataclasses.asdict(self.setting),
            seconds=round(self.elapsed(), 1), rows=self.rows)))


def check_out(out):
    """DIR as a folder (made if missing), or a ValueError that says why not."""
    if not str(out):
        raise ValueError("--out='' is not allowed: give a folder (made if missing) for the "
                         "report")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out={str(out)!r} is not allowed: it is a file; give a folder "
                         "(made if missing) for the report")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out={str(out)!r} is not allowed: {e.strerror}") from None
    return out


def bench_label(overrides):
    """A bench run's row: "bench: mixer=base_conv, d_model=128 (figure2_plotted)"."""
    settings = dict(overrides)
    preset = settings.pop("preset", None)
    return "bench: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + (
        f" ({preset})" if preset else "")


def part_items(setting, device, out):
    """The items of parts 1 to 4, {part: [(row name, fn)]}, fn() -> (ok, measured text,
    numbers)."""
    layers = [(layer_label(name, form), name, form) for name, form in setting.layers]
    return {
        "train": [(f"{label}: {'amp' if amp else 'float32'}", functools.partial(
                      training_steps, name, form, amp, setting, device))
                  for label, name, form in layers for amp in (False, True)],
        "contract": [(label, functools.partial(contract_item, name, form, setting, device))
                     for label, name, form in layers],
        "main job": [("main job", functools.partial(main_job_item, setting, out / "main"))],
        "bench": [(bench_label(o), functools.partial(bench_item, dict(o), device))
                  for o in setting.bench_runs],
        "mixers": [("mixers_bench", functools.partial(mixers_item, setting.bench_shapes,
                                                      device))]}


def gpu_check(out, setting=None):
    """The GPU check into folder `out` (this module's docstring): on the first CUDA GPU at
    GPU_SETTING if there is one, else on the CPU at CPU_SETTING (or at `setting`). Prints
    the report and returns its rows."""
    out = check_out(out)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    setting = setting or (GPU_SETTING if device.type == "cuda" else CPU_SETTING)
    if device.type == "cuda":
        torch.zeros(1, device=device)             # CUDA starts here, not in the first item
    check, parts = Check(out, setting, device), part_items(setting, device, out)
    try:
        for part, seconds, cap in setting.budgets:
            n = len(parts[part])
            print(f"gpu check: {part}, {n} item{'s' * (n != 1)} in {seconds} s at most",
                  file=sys.stderr)
            until = min(check.elapsed() + seconds, setting.total)
            for name, fn in parts[part]:
                check.item(part, name, fn, until, cap, stop_train=part == "main job")
            check.write()
        runs = grid_runs(setting, out)
        print(f"gpu check: fig2, {len(runs)} run{'s' * (len(runs) != 1)} until "
              f"{setting.total:.0f} s", file=sys.stderr)
        for overrides in runs:
            name = f"fig2: base_conv d={overrides['d_model']} lr={overrides['lr']:g}"
            check.item("fig2", name, functools.partial(grid_item, overrides), setting.total,
                       setting.total, stop_train=True,
                       stopped=functools.partial(grid_stopped, overrides))
            check.write()
    finally:
        check.write()
        check.log.close()
    print(check.report(), end="")
    return check.rows
