"""The lab's command line, python -m experiments: the paper's experiments (Arora et al.,
2023) on the model and loop of train.py.

What train.py runs once, the lab runs as the paper does, one file per experiment:
figure2.py (Figure 2: its sweeps and its runs at the paper's budget), figure6.py (appendix
F.1), hybrids.py (Section 5), f2.py (appendix F.2), frontier.py (the recall frontier), lm.py
(Section 3.1 on real text, and appendix G), official.py (the official code's forms of five
mixers), bench.py (the benchmarks); what they share is in three: presets.py (the official
Figure 2 configuration as presets, make_config, the official grid), figures.py (the tables
and figures in Figure 2's layout, one colour per model, Figure 2's values read off the
plot) and common.py (sweeps and the processes and Slurm jobs that run them, records,
statistics). This file gathers their sweeps (SWEEPS) and tables and hands each command
to its function. The lab imports train.py, mixers.py and mqar.py; they never import it
(the mixer option form=official loads official.py by its name, as any mixer of your own
is loaded).

Usage (python -m experiments ...; experiments/README.md says what each experiment shows):
  --preset=figure2 --mixer=base_conv [--key=value ...]   one run with a preset's settings
                                      (figure2: HEAD's official Figure 2 run; figure2_plotted:
                                      the launch the figure plots), --seeds=COUNT as train.py
  --sweep=NAME [--scale=cpu|paper]    a sweep of SWEEPS (main, every_mixer, frontier, fig2,
                                      fig6, hybrids, fig2_lr, fig2_pilot, fig2_epochs,
                                      fig2_plotted, f2; fig2_plotted_grid at paper scale
                                      only); records in results/<sweep>/, finished runs
                                      skipped, unfinished ones continued; --workers=K runs K
                                      at once, each on a GPU of its own where there are
                                      CUDA GPUs (--workers_per_gpu=N: up to N share one);
                                      --launcher=slurm submits them through
                                      submitit (submit_sweep); --dry_run prints their command
                                      lines instead (xargs -P, ...)
  --sweep=mqar_standard, --sweep=mamba2_harder   MQAR as the field runs it (protocols.py):
                                      a mixture of lengths, scored per slice; --mixer= as
                                      for the frontier
  --sweep=frontier --mixer=path/to/file.py:Class   a mixer of your own on the recall frontier:
                                      trained on its cells (records in results/runs/frontier/);
                                      --table=frontier and --plot=frontier with the same
                                      --mixer show it beside the built-ins' committed records
                                      (figures in results/runs/)
  --plot=NAME                         the table of its cells and its figures (results/NAME.png)
  --table=NAME                        the Markdown table of results/NAME, as the READMEs show it
                                      (a sweep, a folder of runs or an LM experiment)
  --lm [--corpus=PATH]                Section 3.1 on real text: tiny language models, each at
                                      the rate of least validation loss, two seeds, their
                                      held-out perplexity sliced by AR hits (results/lm.json,
                                      lm.png, lm_curves.png, lm_appendix_g.png);
                                      --ar_threshold=COUNT; --out_dir=results/NAME
  --hf=NAME_OR_PATH                   appendix G on a Hugging Face causal LM (optional package
                                      transformers); --samples=COUNT sequences per P
  --bench [--key=value ...]           training-step time vs logits at every position
  --bench=mixers [--threads=COUNT]    every mixer's fast form vs its reference (one thread)
  --bench=mqar                        the MQAR generator vs the official one-example loop
  --bench=memory                      each mixer's training-step memory at Figure 2's largest
                                      cell, counted on the meta device
  --gpu_check [--out=DIR]             the GPU check: every mixer trained in float32 and under
                                      --amp, the mixer contract on the GPU, the main job, the
                                      benchmarks, then fig2_plotted_grid's BaseConv runs while
                                      time is left; 8 minutes at most on a CUDA GPU, a tiny
                                      setting on the CPU (experiments/gpu_check.py); its report
                                      in DIR (default results/runs/gpu_check)
  (no arguments)                      train.py's main job
"""
import dataclasses
import json
import sys
from pathlib import Path

from experiments.bench import bench, memory_bench, mixers_bench, mqar_bench
from experiments.common import (SweepFailed, load_records, model_order, run_sweep, strict_json,
                                submit_sweep, trend_table)
from experiments import f2, figure2, figure6, frontier, hybrids, protocols
from experiments.f2 import f2_table, plot_f2
from experiments.figure2 import (FOLDER_TABLES, fig2_table, plot_epochs, plot_fig2, plot_lr,
                                 plot_plotted, plotted_grid_table)
from experiments.figures import curves_figure
from experiments.figure6 import fig6_table, plot_fig6
from experiments.frontier import (YOURS, frontier_table, plot_frontier, plot_yours,
                                  yours_estimate, yours_sweep, yours_table)
from experiments.gpu_check import gpu_check
from experiments.hybrids import hybrids_table, plot_hybrids
from experiments.lm import (LM_MODELS, LM_RECIPE, appendix_g, hf_causal_lm, lm_data, lm_outputs,
                            lm_tables, plot_appendix_g, run_lm_experiment)
from experiments.presets import PRESETS, make_config
from mixers import check_choice
from train import (BASE_CONV, MAIN_MODELS, MAIN_STEPS, Config, _parse_value, _positive_flag,
                   main_job, parse_arguments, resolve_device, run_command, runs_table)


# ----------------------------------------------------------------------------------------
# every sweep and every table, gathered from the experiments' files

# every mixer at the CPU defaults for 1,000 steps at most; a model is its mixer setting or a
# dict of the settings it changes
EVERY_MIXER_MODELS = {
    "attention": "attention", "sliding window (W = 32)": "sliding_window",
    "blocked attention (b = 32)": "blocked_attention", "short conv": "short_conv",
    "long conv": "long_conv", "BaseConv (paper form, long filter)": "base_conv",
    "BaseConv (paper form, short then long)": BASE_CONV,
    "BaseConv (official forms, Figure 2's stack)":
        "base_conv:kernel_size=3:form=official,base_conv:form=official",
    "Hyena": "hyena", "H3": "h3", "RWKV": "rwkv", "RetNet": "retnet", "Based": "based",
    "Mamba": "mamba", "selective attention (learned)": "selective_attention",
    "selective attention with learned positions": dict(mixer="selective_attention",
                                                       position_embedding="learned"),
    "the Based stack": "base_conv:kernel_size=3,based",
    "BaseConv + programmatic selective attention":
        "base_conv,selective_attention:selection=programmatic",
    # the recall mixers since the paper
    "GLA": "gla", "Mamba-2": "mamba2", "DeltaNet": "deltanet", "Gated DeltaNet": "gated_deltanet",
    "RWKV-7": "rwkv7"}
SWEEPS = {
    # the main job: at one small width attention solves MQAR, a gated convolution does not
    "main": {"cpu": dict(models=MAIN_MODELS, max_steps=[MAIN_STEPS])},
    "every_mixer": {"cpu": dict(models=EVERY_MIXER_MODELS, max_steps=[1000])},
    **frontier.SWEEPS, **figure2.SWEEPS, **figure6.SWEEPS, **hybrids.SWEEPS, **f2.SWEEPS,
    **protocols.SWEEPS}
# the sweeps tabled and drawn by their cells (figures.cells_table, plot_sweep): the table
# and the figures of each, from its experiment's file
CELL_SWEEPS = {"fig2": (fig2_table, plot_fig2), "fig6": (fig6_table, plot_fig6),
               "hybrids": (hybrids_table, plot_hybrids), "f2": (f2_table, plot_f2),
               "frontier": (frontier_table, plot_frontier),
               "fig2_plotted_grid": (plotted_grid_table, plot_fig2)}
# the folders whose runs make one table each (not sweeps), and whether it shows the curves
RUN_TABLES = {"main": False, "every_mixer": False, "seeds": False, "figure2_cpu": True,
              "fig2_budget": True, "fig6_budget": True}


def sweep_of(name):
    """SWEEPS[name], or a ValueError that names the sweeps."""
    check_choice("sweep", name, tuple(SWEEPS))
    return SWEEPS[name]


def markdown_table(name):
    """`--table=NAME`: the README's table of results/NAME. A sweep's cells (CELL_SWEEPS), a
    folder of Figure 2's runs at the paper's budget (FOLDER_TABLES), a folder's runs
    (RUN_TABLES), or an LM experiment's part: lm, lm:lr, lm:thresholds, lm:appendix_g (and
    likewise for an LM experiment in another folder)."""
    folder, _, part = name.partition(":")
    if folder in protocols.SWEEPS:
        return protocols.protocol_table(folder, SWEEPS[folder])
    if folder in CELL_SWEEPS:
        check_choice("table part", part, ("", "trend"))
        return (trend_table(folder, SWEEPS[folder]) if part == "trend"
                else CELL_SWEEPS[folder][0](folder))
    if folder in FOLDER_TABLES:
        return FOLDER_TABLES[folder](folder)
    if folder in RUN_TABLES:
        return runs_table(load_records(f"results/{folder}"),
                          model_order(folder, SWEEPS.get(folder, {})), RUN_TABLES[folder])
    if lm_outputs(f"results/{folder}")[0].exists():
        tables = lm_tables(json.loads(lm_outputs(f"results/{folder}")[0].read_text()))
        check_choice("table part", part, tuple(tables))
        return tables[part]
    raise ValueError(f"--table={name!r} is not allowed: choose a sweep "
                     f"({', '.join(CELL_SWEEPS)}), a folder of runs "
                     f"({', '.join([*RUN_TABLES, *FOLDER_TABLES])}) or an LM experiment with "
                     "its summary in results/ (lm, lm:lr, lm:thresholds, lm:appendix_g)")


# ----------------------------------------------------------------------------------------
# the command line: one function per command

COMMANDS = ("--bench", "--seeds", "--sweep", "--scale", "--dry_run", "--workers",
            "--workers_per_gpu", "--launcher", "--partition", "--time_min", "--gpus_per_run",
            "--cpus_per_run", "--parallel", "--plot", "--table", "--lm", "--ar_threshold", "--hf",
            "--samples", "--gpu_check", "--out")
SWEEP_COMMANDS = ("--sweep", "--plot", "--table")       # with these, --mixer is yours on the
                                                        # frontier (yours_sweep), not a setting
LAUNCHER_OPTIONS = {"--partition": str, "--time_min": int, "--gpus_per_run": int,
                    "--cpus_per_run": int, "--parallel": int}      # submit_sweep's, by flag


def table_command(flags, rest):
    """--table=NAME: print the README's table of results/NAME (markdown_table);
    --table=frontier --mixer=...: the built-ins' cells and yours (yours_table)."""
    if "--mixer" in flags and flags["--table"] in protocols.SWEEPS:
        print(protocols.yours_table(flags["--mixer"], flags["--table"]))
        return
    if "--mixer" in flags:
        print(yours_table(flags["--mixer"]))
        return
    print(markdown_table(flags["--table"]))


def plot_command(flags, rest):
    """--plot=NAME: print a sweep's table and draw its figures (CELL_SWEEPS), or a folder's
    (fig2_epochs, fig2_lr, fig2_plotted)."""
    name, plots = flags["--plot"], {"fig2_epochs": plot_epochs, "fig2_lr": plot_lr,
                                    "fig2_plotted": plot_plotted}
    if "--mixer" in flags and name in protocols.SWEEPS:         # yours beside the built-ins
        _, paths = protocols.plot_yours(flags["--mixer"], name)
        print(protocols.yours_table(flags["--mixer"], name))
        print("wrote " + ", ".join(paths))
        return
    if name in protocols.SWEEPS:
        _, paths = protocols.plot_protocol(name, SWEEPS[name])
        print(protocols.protocol_table(name, SWEEPS[name]))
        print("wrote " + ", ".join(paths))
        return
    if "--mixer" in flags:                     # --plot=frontier --mixer=...: yours beside
        _, paths = plot_yours(flags["--mixer"])          # the built-ins
        print(yours_table(flags["--mixer"]))
        print("wrote " + ", ".join(paths))
        return
    if name in plots:                                # its table is in FOLDER_TABLES
        print(f"{FOLDER_TABLES[name](name)}\nwrote {plots[name](name)}")
        return
    check_choice("plot", name, tuple(CELL_SWEEPS))
    table, plot = CELL_SWEEPS[name]
    _, paths = plot(name)
    print(table(name))
    print("wrote " + ", ".join(paths))


def submit_command(flags, rest):
    """--sweep=NAME --launcher=slurm [--partition=...]: submit the unfinished runs."""
    check_choice("launcher", flags["--launcher"], ("slurm",))
    options = {k[2:]: _parse_value(k[2:], v, LAUNCHER_OPTIONS[k])
               for k, v in flags.items() if k in LAUNCHER_OPTIONS}
    name = flags["--sweep"]
    jobs = submit_sweep(name, sweep_of(name), flags.get("--scale", "cpu"), make_config, **options)
    print(f"submitted {len(jobs)} runs" + (f" (jobs {jobs[0].job_id} ...)" if jobs else
          ": every run has finished") + f"; records in results/{flags['--sweep']}/")


def sweep_command(flags, rest):
    """--sweep=NAME [--scale=...] [--dry_run] [--workers=K [--workers_per_gpu=N]];
    --sweep=main draws results/main.png too (train.py's main job trains the same two runs
    afresh, into results/runs/main/)."""
    name, scale = flags["--sweep"], flags.get("--scale", "cpu")
    workers = dict(workers=_positive_flag(flags, "workers", 1),
                   workers_per_gpu=_positive_flag(flags, "workers_per_gpu", 1))
    if "--mixer" in flags and name in protocols.SWEEPS:     # yours on a protocol
        records = protocols.run_yours(flags["--mixer"], name, scale,
                                      dry_run="--dry_run" in flags, **workers)
        if records:
            print(protocols.yours_table(flags["--mixer"], name))
        return
    if "--mixer" in flags:                       # yours on the frontier: only its runs train
        estimate = None if "--dry_run" in flags else yours_estimate(flags["--mixer"], scale)
        if estimate:
            print(estimate, flush=True)
        records = run_sweep(YOURS, yours_sweep(flags["--mixer"]), scale, make_config,
                            dry_run="--dry_run" in flags, **workers)
        if records:
            print(yours_table(flags["--mixer"]))
        return
    if name in protocols.SWEEPS:
        records = protocols.run_protocol_sweep(name, scale, dry_run="--dry_run" in flags,
                                               **workers)
        if records:
            print(protocols.protocol_table(name, SWEEPS[name]))
        return
    records = run_sweep(name, sweep_of(name), scale, make_config, dry_run="--dry_run" in flags,
                        **workers)
    if records:
        print(CELL_SWEEPS[name][0](name) if name in CELL_SWEEPS else
              runs_table(records, model_order(name, SWEEPS[name])))
    if records and name == "main":
        print(f"wrote {curves_figure(records, 'results/main.png', SWEEPS[name])}")


def bench_command(flags, rest):
    """--bench [--key=value ...]: the training-step benchmark of that run's model (bench);
    --bench=mixers [--threads=COUNT]: every mixer's forms timed (mixers_bench); --bench=mqar:
    the MQAR generator timed (mqar_bench); --bench=memory: each mixer's training-step memory
    at Figure 2's largest cell (memory_bench)."""
    check_choice("--bench", flags["--bench"], ("", "mixers", "mqar", "memory"))
    if flags["--bench"] == "":
        return bench(make_config(**parse_arguments(rest)))
    if flags["--bench"] in ("mqar", "memory"):
        if rest:
            raise ValueError(f"{rest[0]!r} is not allowed with --bench={flags['--bench']}: it "
                             "takes no settings")
        return mqar_bench() if flags["--bench"] == "mqar" else memory_bench()
    threads = [a.partition("=")[2] for a in rest if a.startswith("--threads=")]
    if len(rest) > len(threads) or len(threads) > 1:
        raise ValueError(f"{rest} is not allowed with --bench=mixers: it takes --threads=COUNT "
                         "only")
    mixers_bench(threads=_parse_value("threads", threads[0], int) if threads else 1)


def hf_command(flags, rest):
    """--hf=NAME_OR_PATH [--samples=COUNT]: appendix G on a Hugging Face causal LM, on the
    device "auto" finds (resolve_device: a GPU where there is one)."""
    if rest:
        raise ValueError(f"{rest[0]!r} is not allowed with --hf: it runs appendix G "
                         "on a pretrained model (--samples=COUNT sets its size)")
    samples = _positive_flag(flags, "samples", 1000)
    device = resolve_device("auto")
    rows = appendix_g(*hf_causal_lm(flags["--hf"], device), num_samples=samples, device=device)
    name = "".join(char if char.isalnum() or char in "-." else "_" for char in flags["--hf"])
    Path("results").mkdir(exist_ok=True)
    Path(f"results/appendix_g-{name}.json").write_text(strict_json(rows))
    plot_appendix_g({flags["--hf"]: rows}, f"results/appendix_g-{name}.png",
                    f"appendix G: {flags['--hf']}, N = 1024")
    for r in rows:
        print(f"P = {r['num_pairs']:>3}: AR ppl {r['ppl_ar']:.2f}, filler ppl "
              f"{r['ppl_filler']:.2f}")
    print(f"wrote results/appendix_g-{name}.json, results/appendix_g-{name}.png")


def lm_command(flags, rest):
    """--lm [--key=value ...] [--ar_threshold=COUNT] [--samples=COUNT]: the language-model
    experiment (run_lm_experiment), its tables printed. (One language model of a mixer of
    your choice is one run: --task=lm --mixer=NAME ...)"""
    overrides = parse_arguments(rest)
    for key, why in (("mixer", f"trains every model of LM_MODELS ({', '.join(LM_MODELS)})"),
                     ("task", "trains language models (task='lm')")):
        if key in overrides:
            raise ValueError(f"--{key} is not allowed with --lm: the experiment {why}")
    for flag in ("--seeds", "--bench"):
        if flag in flags:
            raise ValueError(f"{flag} is not allowed with --lm: the experiment "
                             "trains every model of LM_MODELS with LM_RECIPE at the "
                             "seeds of LM_SEEDS (--seed=SEED: one seed)")
    threshold = (_parse_value("ar_threshold", flags["--ar_threshold"], int)
                 if "--ar_threshold" in flags else None)
    if threshold is not None and threshold < 0:
        raise ValueError(f"--ar_threshold={threshold} is not allowed: it must be an "
                         "integer >= 0 (training occurrences of an AR hit's bigram)")
    summary = run_lm_experiment(overrides, threshold, _positive_flag(flags, "samples", 1000))
    titles = {"": f"held-out perplexity on {summary['corpus']}, AR hits at threshold "
                  f"{summary['threshold']:,} ({summary['train_tokens']:,} training tokens)",
              "thresholds": "AR perplexity by the threshold of an AR hit",
              "lr": "validation loss at each learning rate (seed "
                    f"{summary['seeds'][0]}), and the rate each model trains at",
              "appendix_g": "appendix G: AR perplexity by the number of pairs P"}
    for part, table in lm_tables(summary).items():
        print(f"{titles[part]}\n{table}\n")
    out_dir = overrides.get("out_dir", LM_RECIPE["out_dir"])
    print("wrote " + ", ".join(map(str, lm_outputs(out_dir))))


def gpu_check_command(flags, rest):
    """--gpu_check [--out=DIR]: the GPU check (experiments/gpu_check.py), its report in DIR
    (results/runs/gpu_check by default, a folder git ignores); exit status 1 if a row
    failed."""
    check_choice("--gpu_check", flags["--gpu_check"], ("",))
    rows = gpu_check(flags.get("--out", "results/runs/gpu_check"))
    return 1 if any(row["result"] == "FAIL" for row in rows) else 0


def check_flags(flags, rest):
    """Refuse the command-line flags that would do nothing with the others given."""
    if "--gpu_check" in flags:
        other = [f for f in flags if f not in ("--gpu_check", "--out")] + rest
        if other:
            raise ValueError(f"{other[0]} is not allowed with --gpu_check: the check runs its "
                             "own settings (experiments/gpu_check.py), --out=DIR its one option")
    elif "--out" in flags:
        raise ValueError("--out is not allowed without --gpu_check: it is the folder of the "
                         "GPU check's report (a run's folder is --out_dir)")
    if "--mixer" in flags:
        name = next(flags[f] for f in SWEEP_COMMANDS if f in flags)
        if name not in ("frontier", *protocols.SWEEPS):
            raise ValueError(f"--mixer is not allowed with {name!r}: a mixer of your own "
                             "joins the frontier sweep or a protocol ("
                             f"{', '.join(('frontier', *protocols.SWEEPS))}: --sweep=NAME "
                             "--mixer=path/to/file.py:Class, then --table=NAME and --plot=NAME "
                             "with the same --mixer); one run of it: --mixer=... without "
                             "--sweep")
        if "--launcher" in flags:
            raise ValueError("--launcher is not allowed with --mixer: your runs train here "
                             "(--workers=K) or by the command lines of --dry_run")
    if ("--sweep" in flags or "--plot" in flags or "--table" in flags) and rest:
        raise ValueError(f"{rest[0]!r} is not allowed with --sweep, --plot or --table: a "
                         "sweep's settings are its grid (SWEEPS in its experiment's file)")
    if "--workers_per_gpu" in flags and "--workers" not in flags:
        raise ValueError("--workers_per_gpu is not allowed without --workers: it says how "
                         "many of a sweep's workers may share a GPU")
    if "--sweep" not in flags and ("--launcher" in flags or "--workers" in flags):
        raise ValueError("--launcher and --workers are not allowed without --sweep: they "
                         "say where a sweep's runs run")
    wrong = ([f for f in ("--dry_run", "--workers") if f in flags] if "--launcher" in flags
             else [f for f in LAUNCHER_OPTIONS if f in flags])
    if wrong and "--launcher" in flags:
        raise ValueError(f"{wrong[0]} is not allowed with --launcher: the runs go to Slurm "
                         "(--dry_run alone prints them for any other scheduler)")
    if wrong:
        raise ValueError(f"{wrong[0]} is not allowed without --launcher=slurm: it is an "
                         "option of the Slurm jobs")
    if "--sweep" not in flags and ("--dry_run" in flags or "--scale" in flags):
        raise ValueError("--dry_run and --scale are not allowed without --sweep: they say "
                         "how a sweep runs")
    other = [f for f in ("--sweep", "--plot", "--table", "--hf") if f in flags]
    if "--lm" in flags and other:
        raise ValueError(f"--lm is not allowed with {other[0]}: each is a command of its own")
    if "--dry_run" in flags and "--workers" in flags:
        raise ValueError("--workers is not allowed with --dry_run: --dry_run runs nothing, "
                         "it prints the runs' command lines")


def command(flags, rest):
    """The function that runs what the command line asks for (the first that applies)."""
    if "--gpu_check" in flags:
        return gpu_check_command
    if "--table" in flags:
        return table_command
    if "--plot" in flags:
        return plot_command
    if "--launcher" in flags:
        return submit_command
    if "--sweep" in flags:
        return sweep_command
    if not (flags or rest):
        return main_job_command
    if "--hf" in flags:
        return hf_command
    if "--lm" in flags:
        return lm_command
    if "--bench" in flags:
        return bench_command
    return one_run_command


def main_job_command(flags, rest):
    """No arguments: train.py's main job (its records in results/runs/main/)."""
    main_job()


def one_run_command(flags, rest):
    """--key=value ... [--seeds=COUNT]: train.py's run_command with the lab's presets, a
    language model's data (lm_data) given for --task=lm."""
    if "--ar_threshold" in flags or "--samples" in flags:
        raise ValueError("--ar_threshold and --samples are not allowed without --lm (and "
                         "--samples without --hf): they set the language-model experiment's "
                         "AR hits and appendix G samples")
    return run_command(flags, rest, PRESETS,
                       lambda config: lm_data(config) if config.task == "lm" else None)


def main(argv):
    """The command line: the main job (no arguments), one run (--key=value ...),
    --seeds=COUNT runs, --sweep=NAME [--scale=cpu|paper] [--dry_run], --plot=NAME,
    --table=NAME, --lm, --hf=NAME, --bench, --gpu_check; each a function above. Returns the
    exit status: 2 for a bad argument, 1 for a failed run of a sweep or a failed row of the
    GPU check, 130 for Ctrl-C."""
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        for f in dataclasses.fields(Config):
            print(f"  --{f.name}={getattr(Config(), f.name)}")
        return 0
    flags = {a.split("=", 1)[0]: a.partition("=")[2] for a in argv
             if a.split("=", 1)[0] in COMMANDS}
    rest = [a for a in argv if a.split("=", 1)[0] not in COMMANDS]
    if any(f in flags for f in SWEEP_COMMANDS):     # --mixer: a mixer of yours on the frontier
        flags.update((a.split("=", 1)[0], a.partition("=")[2]) for a in rest
                     if a.startswith("--mixer="))
        rest = [a for a in rest if not a.startswith("--mixer=")]
    try:
        check_flags(flags, rest)
        return command(flags, rest)(flags, rest) or 0
    except (ValueError, SweepFailed) as e:   # a bad argument or setting; a worker's run failed
        print(f"experiments: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    except KeyboardInterrupt:                    # Ctrl-C in a sweep
        print("interrupted: the finished runs' records are written, the unfinished runs "
              "checkpointed; the same command continues", file=sys.stderr)
        return 130
