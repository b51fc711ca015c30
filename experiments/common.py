"""What the lab's experiments share (Arora et al., 2023): sweeps as data and the machinery
that runs them, in this process, in worker processes or as Slurm jobs (submitit); the
records the runs write, and the statistics of a sweep's cells.

The experiments are one file each (figure2.py, figure6.py, hybrids.py, f2.py, frontier.py,
lm.py, bench.py), presets.py and figures.py hold the presets and the tables and figures they
share, and cli.py is the command line that gathers them. This file imports train.py,
mixers.py and mqar.py and none of those: an experiment hands it its sweep (its grids by
scale) and the lab's make_config (presets.make_config, which knows the presets).
"""
import dataclasses
import itertools
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mixers import check_choice
from train import (NOT_IDENTITY, Config, finished_record, identity, markdown, record_path,
                   run_name, train)

REPO = Path(__file__).resolve().parent.parent        # where `python -m experiments` runs from


# ----------------------------------------------------------------------------------------
# sweeps as data: one run per grid point, one JSON file per run, resumable

# A sweep is {scale: grid or list of grids} (each experiment's SWEEPS; cli.SWEEPS has them
# all). A grid lists its models as label -> mixer setting, "nd" the (N, D) pairs, and the
# values of every other key it sets; its runs are the product of them all. "paper" is the
# paper's grid (on the official recipe, --preset=figure2, where the paper used it); "cpu" a
# reduced one for two CPU cores, every reduction said in experiments/README.md ("The
# paper's experiments").
def sweep_runs(name, sweep, scale):
    """The runs of sweep `name` (its grids by scale: `sweep`) at `scale`, as (label, Config
    overrides) pairs."""
    check_choice("scale", scale, tuple(sweep))
    grids, runs = sweep[scale], []
    for grid in grids if isinstance(grids, list) else [grids]:       # a list: grids in turn
        grid = dict(grid)
        models, nd = grid.pop("models"), grid.pop("nd", [(None, None)])
        for label, model in models.items():
            model = model if isinstance(model, dict) else dict(mixer=model)
            for (N, D), *values in itertools.product(nd, *grid.values()):
                overrides = dict(label=label, **model, out_dir=f"results/{name}",
                                 progress=False, **dict(zip(grid, values)))
                if N is not None:
                    overrides.update(seq_len=N, num_kv_pairs=D)
                runs.append((label, overrides))
    return runs


def model_order(name, sweep):
    """The labels of sweep `name`'s models (its grids by scale: `sweep`; {} for a folder that
    is no sweep) in the order its grids list them (tables follow it)."""
    order = {}
    for scale in sweep:
        for label, _ in sweep_runs(name, sweep, scale):
            order.setdefault(label, len(order))
    return order


def run_sweep(name, sweep, scale, make_config, dry_run=False, resume=True, workers=1,
              workers_per_gpu=1):
    """Run every run of sweep `name` (its grids by scale: `sweep`) at `scale` that has no
    finished record yet (a killed sweep resumes where it stopped, each unfinished run from its
    checkpoint; resume=False trains the finished runs again too), each run's Config from
    `make_config` (presets.make_config: the lab's presets), with a bar over runs: in this
    process, or in `workers` processes at once, `workers_per_gpu` at most on one GPU
    (run_in_processes); with dry_run, print one command line per run instead."""
    runs = sweep_runs(name, sweep, scale)
    if dry_run:
        for _, overrides in runs:                  # the command line of each run
            print("python -m experiments " + " ".join(shlex.quote(f"--{k}={v}")
                                                for k, v in overrides.items()))
        return []

    def finished():
        """Finished runs by what they ran (a record from before a new Config key reads as
        having its default); read before every run, so that runs other workers finish
        (--dry_run lines) are skipped too. A foreign file stops the sweep before any run."""
        return {identity(Config(**r["config"])): r for r in load_records(f"results/{name}")
                if r["ended"] != "interrupted"} if resume else {}

    finished()
    if workers > 1:
        todo = [(label, o) for label, o in runs if identity(make_config(**o)) not in finished()]
        run_in_processes([o for _, o in todo], make_config, workers, f"{name} ({scale})",
                         len(runs), workers_per_gpu)
        done = finished()
        return [done[identity(make_config(**o))] for _, o in runs]
    records = []
    for label, overrides in tqdm(runs, desc=f"{name} ({scale})", unit="run"):
        config = make_config(**{**overrides, "progress": True})
        records.append(finished().get(identity(config)) or train(config))
    return records


# what a worker process runs: python ONE_RUN --key=value ... (one run, the lab's presets)
ONE_RUN = ["-m", "experiments"]


class SweepFailed(RuntimeError):
    """Runs of run_in_processes failed; their logs say why."""


def worker_gpus(workers, workers_per_gpu=1):
    """The CUDA_VISIBLE_DEVICES of each of `workers` worker slots, or None without a CUDA GPU
    (the workers' environment unchanged; an Apple GPU is one device that every worker
    shares). Slot i gets the GPUs this process sees in turn (torch.cuda.device_count of
    them: the first entries of a CUDA_VISIBLE_DEVICES the user set, as CUDA ignores the
    entries from an invalid one on: CUDA Programming Guide, "CUDA Environment Variables"),
    so that each worker has a GPU of its own. More workers than GPUs, `workers_per_gpu` on
    each at most, only where asked: processes on one GPU each hold a CUDA context and a copy
    of the data there and take turns on it (without NVIDIA's MPS server the GPU time-slices
    between processes: docs.nvidia.com/deploy/mps), which pays only where one run leaves
    the GPU idle between its small kernels."""
    count = torch.cuda.device_count()
    if count == 0:
        return None
    if workers > workers_per_gpu * count:
        raise ValueError(f"--workers={workers} is not allowed with {count} GPU"
                         f"{'s' if count > 1 else ''} and --workers_per_gpu={workers_per_gpu}: "
                         f"each worker takes a GPU of its own; give --workers <= "
                         f"{workers_per_gpu * count}, or --workers_per_gpu="
                         f"{math.ceil(workers / count)} to share them")
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = ([d.strip() for d in listed.split(",")][:count] if listed is not None
               else [str(i) for i in range(count)])
    return [visible[slot % count] for slot in range(workers)]


def run_in_processes(runs, make_config, workers, desc, total=None, workers_per_gpu=1):
    """Run `runs` (Config overrides, made Configs by `make_config` to name their logs) as
    `python -m experiments --key=value ...` processes (from this repository), `workers` at a
    time, each with an equal share of this process's threads (OMP_NUM_THREADS) and, where
    there are CUDA GPUs, its worker slot's GPU as its only one (worker_gpus; a run takes a
    free slot, so no two running runs share a GPU unless `workers_per_gpu` lets them); the
    bar counts finished runs out of `total` (the whole sweep). A run's output goes to a .log
    beside its record, kept only if it fails. SIGINT (Ctrl-C) or SIGTERM to this process is
    passed on as SIGINT to every running run, which checkpoints and stops (train); no run
    starts after it, and once they have stopped KeyboardInterrupt is raised here. A run
    stopped by a SIGINT of its own stops the sweep alike. A run that fails is named with
    its log, the others go on, and SweepFailed is raised at the end."""
    total = total or len(runs)
    gpus = worker_gpus(workers, workers_per_gpu)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, torch.get_num_threads() // workers)),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    pending, running, failed, asked = list(runs), {}, [], []
    bar = tqdm(total=total, initial=total - len(runs), desc=desc, unit="run")
    # the signals are noted here and handled in the loop (so that none falls between
    # starting a run and holding it), also where a shell started this in the background
    # (which ignores SIGINT); the runs have sessions of their own, so only this hears them
    main = threading.current_thread() is threading.main_thread()
    previous = ({s: signal.signal(s, lambda signum, frame: asked.append(signum))
                 for s in (signal.SIGINT, signal.SIGTERM)} if main else {})
    forwarded = 0
    try:
        while running or (pending and not asked):
            while pending and not asked and len(running) < workers:
                overrides = pending.pop(0)
                slot = min(set(range(workers)) - {s for _, s in running.values()})
                log = record_path(make_config(**overrides)).with_suffix(".log")
                log.parent.mkdir(parents=True, exist_ok=True)
                args = [f"--{k}={v}" for k, v in overrides.items()]
                with log.open("w") as out:
                    proc = subprocess.Popen(
                        [sys.executable, *ONE_RUN, *args], stdout=out, stderr=subprocess.STDOUT,
                        env=env if gpus is None else {**env, "CUDA_VISIBLE_DEVICES": gpus[slot]},
                        start_new_session=True)
                running[proc] = log, slot
            time.sleep(0.1)
            for _ in range(forwarded, len(asked)):     # each signal passed on once: the
                for proc in running:                   # second stops the runs at once
                    proc.send_signal(signal.SIGINT)
            forwarded = len(asked)
            for proc in [p for p in running if p.poll() is not None]:
                log, _ = running.pop(proc)
                bar.update(proc.returncode != 130)    # a stopped run is not done
                if proc.returncode in (0, 130):   # done, or stopped as asked: no failure
                    log.unlink()
                else:
                    failed.append(log)
                    tqdm.write(f"a run failed (exit code {proc.returncode}); its output: {log}")
                if proc.returncode == 130 and not asked:    # stopped by a SIGINT of its own:
                    asked.append(signal.SIGINT)             # stop the others too
    finally:
        bar.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if asked:
        raise KeyboardInterrupt
    if failed:
        raise SweepFailed(f"{len(failed)} of {len(runs)} runs failed; their output: "
                          + ", ".join(map(str, failed)))


SUBMITIT = "submitit==1.5.4"                      # the optional package, the version tested


class SweepJob:
    """One run of a sweep as a submitit job (submit_sweep): trains it (its Config from
    `make_config`, the lab's) unless its record has finished, and returns the record's path.
    On a time-out or a preemption Slurm signals the job (USR2) and submitit calls
    `checkpoint`, which requeues the same run; it continues from its own last checkpoint
    (train)."""

    def __init__(self, make_config):
        self.make_config = make_config

    def __call__(self, overrides):
        config = self.make_config(**overrides)
        if finished_record(config):                  # a job run twice trains nothing
            print(f"already run: {record_path(config)}")
        else:
            train(config)
        return str(record_path(config))

    def checkpoint(self, overrides):
        import submitit
        return submitit.helpers.DelayedSubmission(self, overrides)


def submit_sweep(name, sweep, scale, make_config, cluster="slurm", partition="", time_min=60,
                 gpus_per_run=0, cpus_per_run=1, parallel=0):
    """Submit the unfinished runs of sweep `name` (its grids by scale: `sweep`; each run's
    Config from `make_config`, the lab's) as one job array through submitit (optional: pip
    install submitit==1.5.4), one run per job; return the jobs.

    cluster="slurm": sbatch with `partition` ("" for the cluster's default), `time_min`
    minutes and `gpus_per_run`, `cpus_per_run` per job, at most `parallel` jobs at once (0:
    no cap). cluster="local": submitit's LocalExecutor, every job a local process at once
    (for tests). The jobs write the same records to results/NAME, from the directory this
    is called in, and import this lab; a job that times out is requeued (by submitit,
    up to 3 times) and continues from its checkpoint; submitting again submits only the
    runs that have not finished, and those continue from their checkpoints too. submitit's
    logs go to results/NAME/submitit/.
    """
    check_choice("cluster", cluster, ("slurm", "local"))
    for key, value, low in (("time_min", time_min, 1), ("cpus_per_run", cpus_per_run, 1),
                            ("gpus_per_run", gpus_per_run, 0), ("parallel", parallel, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"--{key}={value!r} is not allowed: it must be an integer >= {low}")
    try:
        import submitit
    except ImportError:
        raise ValueError(f"--launcher={cluster} needs the optional package submitit: "
                         f"pip install {SUBMITIT}") from None
    here = str(REPO)                # where the jobs import experiments (SweepJob) from
    todo = [o for _, o in sweep_runs(name, sweep, scale)
            if not finished_record(make_config(**o))]
    if not todo:
        return []
    executor = submitit.AutoExecutor(folder=f"results/{name}/submitit/%j", cluster=cluster)
    executor.update_parameters(
        timeout_min=time_min, gpus_per_node=gpus_per_run or None, cpus_per_task=cpus_per_run,
        slurm_array_parallelism=parallel or len(todo),
        slurm_setup=[f"export PYTHONPATH={shlex.quote(here)}${{PYTHONPATH:+:$PYTHONPATH}}"],
        **({"slurm_partition": partition} if partition else {}))
    previous = os.environ.get("PYTHONPATH")           # the local jobs inherit it
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, previous]))
    # local jobs inherit SIGINT's disposition too, and submitit cancels one with SIGINT: from a
    # shell's background job (`nohup ... &`), which starts with SIGINT ignored, no job could
    # be cancelled, so the jobs start with Python's own handler
    interrupt = (signal.signal(signal.SIGINT, signal.default_int_handler)
                 if threading.current_thread() is threading.main_thread() else None)
    try:
        return executor.map_array(SweepJob(make_config), todo)
    finally:
        if interrupt is not None:     # None: not the main thread, or a handler set outside Python
            signal.signal(signal.SIGINT, interrupt)
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous


# ----------------------------------------------------------------------------------------
# a sweep's records, and the statistics of its cells: means, intervals, width trends

def load_records(folder):
    """Every run record in `folder` (none if it does not exist), one per run. A file that is
    not a record of train.py, two files of one run, and a record whose config is not the run
    its file name says (edited by hand, or named by another version of train.py) each raise
    a ValueError naming the files."""
    records, paths, configs = {}, {}, {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            config = Config(**record["config"])
            float(record["test_acc"]), record["history"], record["ended"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a run record of train.py ({type(e).__name__}: "
                             f"{e}); move it out of {folder}") from None
        run = identity(config)
        if run in paths:
            raise ValueError(f"{paths[run]} and {path} are records of the same run; keep one "
                             f"of them in {folder}")
        paths[run], records[run], configs[run] = path, record, config
    for run, path in paths.items():
        name = run_name(configs[run])
        if path.name != f"{name}.json":
            raise ValueError(f"{path} holds the record of the run {name}, not of the run its "
                             "file name says: a record edited by hand or named by another "
                             f"version of train.py; move it out of {folder}")
    return list(records.values())


def t_quantile(p, dof):
    """The p-quantile (p > 0.5) of Student's t with `dof` degrees of freedom: the x where
    P(|X| < x) = 2p − 1 for X of that law, by bisection on that probability, the density's
    integral from 0 to x by Simpson's rule on 2,000 intervals (error far below the 4th
    decimal)."""
    log_norm = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    density = lambda x: math.exp(log_norm - (dof + 1) / 2 * math.log1p(x * x / dof))
    def mass(bound, intervals=2000):                   # P(|X| < bound)
        step = bound / intervals
        odd = sum(density((2 * i - 1) * step) for i in range(1, intervals // 2 + 1))
        even = sum(density(2 * i * step) for i in range(1, intervals // 2))
        return 2 * step / 3 * (density(0) + 4 * odd + 2 * even + density(bound))
    low, high = 0.0, 1.0
    while mass(high) < 2 * p - 1:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if mass(mid) < 2 * p - 1 else (low, mid)
    return (low + high) / 2


def mean_interval(values):
    """(mean, half-width of its 95% t-interval); the half-width is nan for one value."""
    count, mean = len(values), sum(values) / len(values)
    if count < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
    return mean, t_quantile(0.975, count - 1) * sd / math.sqrt(count)


CELL_KEYS = ("mixer", "seq_len", "num_kv_pairs", "d_model")


def cells(records):
    """One row per cell (mixer, N, D, d), with its label: the learning rate with the best
    mean validation accuracy over its seeds, and over that lr's seeds the mean test accuracy
    and its 95% interval; `runs` are that lr's records, `by_lr` the cell's at every lr. A
    cell's runs at one lr must differ in their seed only (so seeds count runs, never files),
    and a cell of several lrs needs validation scores to choose."""
    by_cell = {}
    for r in records:
        cell = tuple(r["config"][k] for k in CELL_KEYS)
        by_cell.setdefault(cell, {}).setdefault(r["config"]["lr"], []).append(r)
    rows = []
    for cell, by_lr in sorted(by_cell.items(), key=lambda item: item[0]):
        for lr, runs in by_lr.items():
            configs = [dataclasses.asdict(Config(**r["config"])) for r in runs]
            differ = [k for k in configs[0] if k not in (*NOT_IDENTITY, "seed")
                      and len({json.dumps(config[k]) for config in configs}) > 1]
            if differ:
                raise ValueError(f"the runs of cell {dict(zip(CELL_KEYS, cell))} at lr {lr:g} "
                                 f"differ in {', '.join(differ)}, not only in their seed: "
                                 "keep one kind of run per folder")
        if len(by_lr) > 1 and any("valid_acc" not in r for runs in by_lr.values() for r in runs):
            raise ValueError(f"cell {dict(zip(CELL_KEYS, cell))} has runs at lrs "
                             f"{', '.join(f'{lr:g}' for lr in by_lr)} and a run without a "
                             "validation score: the lr is chosen on validation only")
        score = lambda lr: sum(r.get("valid_acc", math.nan) for r in by_lr[lr]) / len(by_lr[lr])
        lr = max(by_lr, key=score)
        mean, half = mean_interval([r["test_acc"] for r in by_lr[lr]])
        label = by_lr[lr][0]["config"].get("label") or cell[0]
        rows.append(dict(zip(CELL_KEYS, cell), label=label, lr=lr, seeds=len(by_lr[lr]),
                         test_acc=mean, interval=half, valid_acc=score(lr), runs=by_lr[lr],
                         by_lr=by_lr))
    return rows


def width_trend(points, permutations=20_000):
    """How strong "accuracy rises with width" is over runs `points` ((d, accuracy) pairs,
    every seed its own point): the correlation of log2 d with accuracy, and the one-sided
    p-value of a permutation test (the accuracies shuffled over the runs, numpy seed 0):
    the share of shuffles whose correlation is at least the observed one."""
    x, y = np.log2([d for d, _ in points]), np.array([a for _, a in points])
    corr = lambda acc: np.corrcoef(x, acc)[0, 1]
    observed = corr(y)
    rng = np.random.default_rng(0)
    shuffled = np.array([corr(rng.permutation(y)) for _ in range(permutations)])
    return observed, ((shuffled >= observed - 1e-12).sum() + 1) / (permutations + 1)


def trend_table(name, sweep):
    """`--table=NAME:trend`: for each model and N of sweep `name` (its grids by scale:
    `sweep`) with several widths at its lr, the width_trend over every run (each seed a
    point)."""
    rows = cells(load_records(f"results/{name}"))
    order = model_order(name, sweep)
    groups = {}
    for r in rows:
        groups.setdefault((r["label"], r["seq_len"], r["num_kv_pairs"]), []).append(r)
    table = []
    for (label, N, D), cell_rows in sorted(groups.items(),
                                           key=lambda g: (order.get(g[0][0], 0), g[0][1:])):
        if len(cell_rows) < 2:
            continue
        points = [(r["d_model"], run["test_acc"]) for r in cell_rows for run in r["runs"]]
        corr, p = width_trend(points)
        table.append([label, N, D, " ".join(str(r["d_model"]) for r in cell_rows),
                      len(points), f"{corr:.2f}", "< 0.0001" if p < 1e-4 else f"{p:.4f}"])
    return markdown(["model", "N", "D", "widths d", "runs", "correlation of log d and "
                     "accuracy", "one-sided p (permutation)"], table)


def strict_json(summary):
    """`summary` as JSON that any parser reads: nan (an empty slice, no gap share) as null."""
    def clean(x):
        if isinstance(x, float) and math.isnan(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        return [clean(v) for v in x] if isinstance(x, (list, tuple)) else x
    return json.dumps(clean(summary), indent=1, allow_nan=False)
