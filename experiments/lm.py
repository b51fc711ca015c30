"""The recall gap on real text (Section 3.1) and appendix G (Arora et al., 2023): tiny
language models trained on a corpus, their held-out perplexity sliced by AR hits (the
tokens that recall from the context predicts: mqar.ar_hits) and set beside the paper's
Table 1; and appendix G's AR perplexity on repeated key-value bigrams, for those models and
for any pretrained Hugging Face causal LM.

Here: the corpus (a folder of text; by default the Python standard library's source), its
tokens and vocabulary, and the contexts a language model trains on (lm_data: train.train's
`data` for task "lm"); the experiment (run_lm_experiment) with its tables and figures; and
appendix G's sequences and measurement.

Rerun (python -m experiments ...):
  --lm [--corpus=PATH] [--key=value ...] [--ar_threshold=COUNT] [--samples=COUNT]
                    every model of LM_MODELS, each at its rate, two seeds (results/lm/,
                    lm.json, lm.png, lm_curves.png, lm_appendix_g.png)
  --table=lm, --table=lm:lr, --table=lm:thresholds, --table=lm:appendix_g   its tables
  --hf=NAME_OR_PATH [--samples=COUNT]   appendix G on a Hugging Face causal LM
                    (optional package transformers)
  --task=lm --mixer=NAME [--corpus=PATH] [--key=value ...]   one language model
experiments/README.md ("The recall gap on real text") says what it shows.
"""
import functools
import itertools
import math
import re
import sysconfig
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from experiments.common import strict_json
from experiments.figures import model_color
from experiments.presets import make_config
from mixers import check_positive
from mqar import (ar_gap_share, ar_hits, bigram_counts, check_int, sample_distinct,
                  scaled_threshold, sliced_perplexity)
from train import (BASE_CONV, LanguageModel, finished_record, markdown, pyplot, record_path,
                   resolve_device, save_figure, train, wrapped)


# ----------------------------------------------------------------------------------------
# real text: a corpus, its tokens, and the contexts a language model trains on
#
# The corpus is any folder of text; the default, the Python standard library's own source,
# is present wherever Python is. A token is a word (\w+), a newline or one other non-space
# character; the vocabulary holds the characters and the most frequent words of the
# training files, and a word outside it is spelled in characters.

TOKEN_PATTERN = re.compile(r"\w+|\n|[^\w\s]")
UNK, EOF = "<unk>", "<eof>"           # ids 0 and 1; <eof> ends every file
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def corpus_files(path=None):
    """(root, files): the files of a corpus, sorted by path. `path` a file: itself; a folder:
    every file under it (hidden names skipped). path=None: the standard library's .py files
    (sysconfig's "stdlib" folder) without its tests and installed packages."""
    if path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = [p for p in root.rglob("*.py")
                 if not SKIPPED_DIRS & set(p.relative_to(root).parts[:-1])]
    else:
        root = Path(path)
        if not root.exists():
            raise ValueError(f"corpus={str(path)!r} is not allowed: no such file or folder")
        files = [root] if root.is_file() else [
            p for p in root.rglob("*") if p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(root).parts)]
        root = root.parent if root.is_file() else root
    if not files:
        raise ValueError(f"corpus={str(root)!r} is not allowed: it holds no files")
    return root, sorted(files)


def read_corpus(path=None):
    """[(name, text)] for corpus_files(path), name the path relative to the corpus folder,
    text read as UTF-8. A file that cannot be read, or a corpus with no text at all, raises
    a ValueError naming it."""
    root, files = corpus_files(path)
    texts = []
    for file in files:
        try:
            texts.append((file.relative_to(root).as_posix(), file.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"corpus file {str(file)!r} cannot be read as UTF-8 text "
                             f"({type(e).__name__}: {e}); remove it or pass a folder of "
                             "text files only") from None
    if not any(text.strip() for _, text in texts):
        raise ValueError(f"corpus={str(root if path is None else path)!r} is not allowed: "
                         "its files hold no text")
    return texts


def is_validation_file(name, fraction=0.1):
    """The deterministic split by file: crc32 of the file's name (its path relative to the
    corpus) below `fraction` of 2^32 puts it in validation, on every machine."""
    return zlib.crc32(name.encode()) < fraction * 2 ** 32


def build_vocabulary(token_lists, size):
    """<unk>, <eof>, then the training tokens' characters (the most frequent, up to a
    quarter of `size`), then the most frequent longer tokens up to `size` (ties in sorted
    order). A token outside it is spelled in characters by `encode`, so a rare identifier
    repeated in a file still repeats as a sequence of ids (the AR hits of code)."""
    check_int("size", size, 3, "an integer >= 3 (<unk>, <eof> and a token)")
    counts = Counter(token for tokens in token_lists for token in tokens
                     if token not in (UNK, EOF))
    chars = Counter()
    for token, count in counts.items():
        for char in token:
            chars[char] += count
    rank = lambda table: sorted(table, key=lambda key: (-table[key], key))
    vocab = [UNK, EOF] + rank(chars)[:max(1, (size - 2) // 4)]
    known = set(vocab)
    return vocab + [token for token in rank(counts) if token not in known][:size - len(vocab)]


def encode(tokens, vocabulary):
    """Token strings -> ids (int64 numpy array): a token of the vocabulary is its id, any
    other is spelled as the ids of its characters (0, <unk>, for a character outside it)."""
    index = {token: i for i, token in enumerate(vocabulary)}
    ids = []
    for token in tokens:
        if token in index:
            ids.append(index[token])
        else:
            ids.extend(index.get(char, 0) for char in token)
    return np.array(ids, dtype=np.int64)


@functools.lru_cache(maxsize=2)
def corpus_streams(path=None, vocab_size=4096):
    """(training ids, validation ids, vocabulary) of a corpus: its files split by
    is_validation_file, tokenized, each ended by <eof> and concatenated in file order; the
    vocabulary built from the training files alone. Cached: models trained one after
    another in a process read the corpus once."""
    split = {False: [], True: []}
    for name, text in read_corpus(path):
        split[is_validation_file(name)].append(TOKEN_PATTERN.findall(text) + [EOF])
    if not split[False] or not split[True]:
        raise ValueError(f"corpus={str(path)!r} is not allowed: the split by file left no "
                         f"{'training' if not split[False] else 'validation'} files "
                         "(is_validation_file puts about 10% of the files in validation)")
    vocabulary = build_vocabulary(split[False], vocab_size)
    train, valid = ([token for tokens in split[v] for token in tokens] for v in (False, True))
    return encode(train, vocabulary), encode(valid, vocabulary), vocabulary


def lm_data(config):
    """Contexts of seq_len + 1 tokens of the corpus, as (inputs, the next tokens): num_train
    windows at random offsets of the training files' stream (numpy seed 2·seed), then
    num_test and num_valid consecutive windows of the validation files' stream."""
    train_ids, valid_ids, _ = corpus_streams(config.corpus or None, config.vocab_size)
    T = config.seq_len + 1
    starts = np.random.default_rng(2 * config.seed).integers(
        0, len(train_ids) - T + 1, config.num_train)
    num_held = len(valid_ids) // T
    if config.num_test + config.num_valid > num_held:
        raise ValueError(f"num_test={config.num_test} with num_valid={config.num_valid} is not "
                         f"allowed: the validation files of corpus={config.corpus!r} hold "
                         f"{num_held} contexts of seq_len + 1 = {T} tokens")
    held = torch.from_numpy(valid_ids[:num_held * T].reshape(num_held, T))
    pairs = lambda contexts: (contexts[:, :-1], contexts[:, 1:])
    return (pairs(torch.from_numpy(train_ids[starts[:, None] + np.arange(T)])),
            pairs(held[:config.num_test]),
            pairs(held[config.num_test:config.num_test + config.num_valid]))


# ----------------------------------------------------------------------------------------
# the recall gap on real text (Section 3.1): tiny language models, their loss sliced by AR hits

# Table 1 of the paper (the Pile, 10B tokens): perplexity overall, on AR hits, on the others
PAPER_TABLE1 = {"attention": (11.01, 2.16, 12.45), "hyena": (11.60, 5.00, 12.28),
                "rwkv": (11.64, 5.70, 12.29), "h3": (12.06, 6.75, 12.60),
                "long_conv": (16.98, 25.62, 16.46)}
LM_MODELS = {"attention": "attention:rotary=true",
             "attention_short_conv": "attention:rotary=true:short_conv=3",
             "base_conv": BASE_CONV, "hyena": "hyena", "h3": "h3", "rwkv": "rwkv"}
LM_LABELS = {"attention": "attention", "attention_short_conv": "attention + short conv",
             "base_conv": "BaseConv", "hyena": "Hyena", "h3": "H3", "rwkv": "RWKV"}
# one recipe for every model, so that only the mixer differs: the same width and depth and
# the Llama block around each mixer (RMSNorm, a SwiGLU MLP; the paper's attention baseline
# follows the Llama recipe, Section 3.1), no learned positions (attention turns q and k by
# rotary positions), a budget of minutes per model on two cores (experiments/README.md, "The
# recall gap on real text"). The learning rate is each model's own: LM_LRS, chosen on validation.
LM_RECIPE = dict(task="lm", vocab_size=4096, seq_len=128, d_model=64, n_layers=4, mlp=True,
                 block="rms_pre_norm", position_embedding="none", batch_size=32,
                 num_train=25_600, num_test=500, num_valid=500, max_steps=800, eval_every=200,
                 eval_probe=0, target_acc=1.0, save_model=True, out_dir="results/lm")
LM_LRS = (1e-3, 3e-3, 1e-2)        # each model's rate: the least validation loss of these
LM_SEEDS = (0, 1)                  # the first chooses the rate, every one trains at it
APPENDIX_G_PAIRS_OURS = (2, 4, 8, 16, 32)        # P for the LMs of --lm (4P <= seq_len)


@torch.no_grad()
def token_nll(model, inputs, labels, batch_size=None):
    """Per-token negative log-likelihood (natural log) of `labels`, (B, T) float64 numpy,
    computed on the model's device (each batch moved there)."""
    batch_size = batch_size or max(1, 2 ** 14 // inputs.shape[1])
    device = next(model.parameters()).device
    model.eval()
    out = []
    for i in range(0, len(inputs), batch_size):
        x, y = (t[i:i + batch_size].to(device) for t in (inputs, labels))
        logits = model.logits(model(x))                                      # (b, T, c)
        out.append(F.cross_entropy(logits.transpose(1, 2), y, reduction="none"))
    model.train()
    return torch.cat(out).cpu().double().numpy()        # float64 on the CPU: mps has none


def trained_model(config):
    """The model of `config`, trained (train) unless its record and weights exist and the
    record says it finished, then loaded onto its run's device (resolve_device of
    config.device), where it is evaluated: a killed experiment resumes at the model it was
    training. Returns (model, record)."""
    path, record = record_path(config), finished_record(config)
    if record is None or not path.with_suffix(".pt").exists():
        record = train(config, lm_data(config))
    device = resolve_device(config.device)
    with torch.random.fork_rng(devices=[]):
        model = LanguageModel(config).to(device)
    model.load_state_dict(torch.load(path.with_suffix(".pt"), map_location=device))
    return model, record


def label_hits(inputs, labels, train_bigrams, vocab_size, threshold):
    """(B, T) bool: whether labels[:, t], the token whose loss token_nll gives at t, is an AR
    hit (mqar.ar_hits) of its context inputs[:, 0] followed by labels (inputs, labels: the
    (B, T) pairs of lm_data). The flag of the context's token t + 1, the label's own, not of
    the input before it."""
    contexts = np.concatenate([np.asarray(inputs)[:, :1], np.asarray(labels)], 1)   # (B, T + 1)
    return ar_hits(contexts, train_bigrams, vocab_size, threshold)[:, 1:]


def ar_shares(nll, hits):
    """{(label, seed): the share of its perplexity gap to attention of the same seed that
    the AR hits carry (ar_gap_share)}, from nll {(label, seed): per-token NLL}; nan for
    attention itself and where that seed has no attention run."""
    return {(label, seed): (math.nan if label == "attention" or ("attention", seed) not in nll
                            else ar_gap_share(nll["attention", seed], values, hits))
            for (label, seed), values in nll.items()}


def run_lm_experiment(overrides=None, threshold=None, g_samples=1000):
    """Section 3.1 on a corpus: LM_MODELS with LM_RECIPE (and `overrides`, Config keys).

    1. Every model trains at every rate of LM_LRS with the first seed of LM_SEEDS; its rate
       is the one of least validation loss (the validation split: held-out contexts after
       the test ones; the test split decides nothing).
    2. Every model trains with the other seeds at its rate.
    3. Each (model, seed) scores every token of the held-out test contexts, and its
       perplexity is sliced as Section 3.1 does: on AR hits (mqar.ar_hits; threshold None:
       the paper's 1,250 scaled to the training tokens) and on the other tokens, with the
       share of its gap to attention (of the same seed) due to the AR hits; then appendix G
       on it (g_samples sequences per P).
    An `lr` or `seed` among the overrides fixes it (no choice; one seed). Finished runs are
    loaded, not trained again: a killed experiment resumes at the run it was in. Writes
    lm_outputs(out_dir), by default results/lm.json (the summary this returns) and
    results/lm.png, lm_curves.png and lm_appendix_g.png.
    """
    settings = {**LM_RECIPE, **(overrides or {})}
    lrs = (settings.pop("lr"),) if "lr" in settings else LM_LRS
    seeds = (settings.pop("seed"),) if "seed" in settings else LM_SEEDS
    if len(lrs) > 1 and settings["num_valid"] == 0:
        raise ValueError(f"num_valid=0 is not allowed while the experiment chooses among "
                         f"{len(lrs)} learning rates: the choice reads the validation loss; "
                         "give num_valid > 0, or one --lr")

    def config(label, lr, seed):          # a stack of mixers repeats over the layers
        stack = itertools.islice(itertools.cycle(LM_MODELS[label].split(",")),
                                 settings["n_layers"])
        return make_config(**dict(settings, label=label, mixer=",".join(stack), lr=lr, seed=seed))

    valid_loss = {}
    for label, lr in tqdm([(label, lr) for label in LM_MODELS for lr in lrs],
                          desc="learning rates", unit="run", disable=len(lrs) == 1):
        run = config(label, lr, seeds[0])
        record = finished_record(run) or train(run, lm_data(run))
        valid_loss[label, lr] = record.get("valid_loss", math.nan)
    least = lambda label: lambda lr: (math.inf if math.isnan(valid_loss[label, lr])
                                      else valid_loss[label, lr])
    chosen = {label: min(lrs, key=least(label)) for label in LM_MODELS}

    any_run = config(next(iter(LM_MODELS)), lrs[0], seeds[0])     # the held-out data of all
    _, (x_test, y_test), _ = lm_data(any_run)
    train_ids, _, vocabulary = corpus_streams(any_run.corpus or None, any_run.vocab_size)
    threshold = scaled_threshold(len(train_ids)) if threshold is None else threshold
    # the AR hits at the experiment's threshold and, to show how the slice depends on the
    # frequency cut, at looser ones and at none (no bigram occurs more often than that)
    bigrams = bigram_counts(train_ids, len(vocabulary))
    thresholds = sorted({threshold, 10, 100, len(train_ids)})
    hits = {cut: label_hits(x_test.numpy(), y_test.numpy(), bigrams, len(vocabulary), cut)
            for cut in thresholds}
    # appendix G at the models' own length: P up to seq_len / 4, the vocabulary but <unk>
    # and <eof>, its most frequent character (id 2) as the filler
    pairs = [p for p in APPENDIX_G_PAIRS_OURS if 4 * p <= any_run.seq_len]
    rows, nll = [], {}
    for label, seed in tqdm([(label, seed) for label in LM_MODELS for seed in seeds],
                            desc="language models", unit="model"):
        model, record = trained_model(config(label, chosen[label], seed))
        nll[label, seed] = token_nll(model, x_test, y_test)
        model.eval()                      # for appendix_g below (token_nll ends in train mode)
        rows.append(dict(
            label=label, seed=seed, lr=chosen[label], mixer=record["config"]["mixer"],
            n_params=record["n_params"], steps=record["steps"],
            train_time_s=record["train_time_s"], final_loss=record["history"][-1]["loss"],
            valid_loss=record.get("valid_loss", math.nan),
            curve=[[e["step"], e["valid_loss"]] for e in record["history"] if "valid_loss" in e],
            **sliced_perplexity(nll[label, seed], hits[threshold]),
            ppl_ar_by_threshold=[sliced_perplexity(nll[label, seed], hits[cut])["ppl_ar"]
                                 for cut in thresholds],
            appendix_g=appendix_g(lambda ids: model.logits(model(ids)),
                                  torch.arange(2, len(vocabulary)), 2, pairs, g_samples,
                                  any_run.seq_len, batch_size=50,
                                  device=next(model.parameters()).device)))
    shares = ar_shares(nll, hits[threshold])
    for row in rows:
        row["ar_share"] = shares[row["label"], row["seed"]]
    summary = dict(corpus=any_run.corpus or "the Python standard library",
                   train_tokens=len(train_ids), threshold=threshold, lrs=list(lrs),
                   seeds=list(seeds), tokens_per_step=any_run.batch_size * any_run.seq_len,
                   lr_valid_loss={label: [valid_loss[label, lr] for lr in lrs]
                                  for label in LM_MODELS},
                   thresholds=[dict(threshold=cut, ar_tokens=int(hits[cut].sum()))
                               for cut in thresholds], rows=rows)
    summary_path, bars_path, curves_path, g_path = lm_outputs(any_run.out_dir)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(strict_json(summary))
    budget = (f"{any_run.max_steps:,} steps of {summary['tokens_per_step']:,} tokens, "
              f"seeds {', '.join(map(str, seeds))}")
    plot_lm(rows, bars_path, budget)
    plot_lm_curves(rows, summary["tokens_per_step"], curves_path, budget)
    plot_appendix_g({LM_LABELS.get(r["label"], r["label"]): r["appendix_g"]
                     for r in rows if r["seed"] == seeds[0]}, g_path,
                    f"appendix G on the LMs of --lm (N = {any_run.seq_len}, seed {seeds[0]})")
    return summary


def lm_outputs(out_dir):
    """What an LM experiment with records in `out_dir` writes beside that folder: its summary
    (JSON), the sliced perplexities, the validation curves and the appendix G curves (PNG)."""
    folder = Path(out_dir)
    return tuple(folder.with_name(folder.name + end)
                 for end in (".json", ".png", "_curves.png", "_appendix_g.png"))


def gap_share_text(share, ppl, ppl_attention):
    """The AR share of a model's perplexity gap to attention, or why there is none: a model
    at or below attention's perplexity has no gap to attribute (Section 3.1)."""
    if share is None or math.isnan(share):             # None: read back from strict JSON
        return ""
    return f"{100 * share:.0f}%" if ppl > ppl_attention else "no gap"


LM_SLICES = [("ppl", "all tokens", ""), ("ppl_ar", "AR hits", "////"),    # key, name, hatch
             ("ppl_other", "other tokens", "....")]


def plot_lm(rows, path, budget):
    """Perplexity overall, on AR hits and on the other tokens, one group of bars per model in
    its colour (model_color), the slices told apart by hatching: each bar the geometric mean
    over the model's seeds (the perplexity of their tokens pooled), each seed a dot, the
    paper's Table 1 (PAPER_TABLE1: models of 125-169M parameters after 10B tokens of the
    Pile) a black cross on the bar of its model and slice."""
    plt = pyplot()
    from matplotlib.patches import Patch
    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for i, (key, name, hatch) in enumerate(LM_SLICES):
        x = [j + 0.27 * (i - 1) for j in range(len(labels))]
        seeds = [[r[key] for r in rows if r["label"] == label] for label in labels]
        ax.bar(x, [math.exp(np.mean(np.log(v))) for v in seeds], width=0.27, hatch=hatch,
               color=[model_color(LM_LABELS.get(label, label)) for label in labels],
               edgecolor="white", linewidth=0)
        for xi, v in zip(x, seeds):
            ax.plot([xi] * len(v), v, "k.", ms=3)
        paper = [(xi, PAPER_TABLE1[label][i]) for xi, label in zip(x, labels)
                 if label in PAPER_TABLE1]
        if paper:
            ax.scatter(*zip(*paper), marker="x", s=25, color="black", zorder=3)
    ax.set_xticks(range(len(labels)), [LM_LABELS.get(label, label) for label in labels],
                  fontsize=7, rotation=20, ha="right")
    ax.set(ylabel="perplexity (log scale)", yscale="log")
    ax.set_title(wrapped(f"held-out perplexity, sliced by AR hits (Section 3.1)\n{budget}",
                         7), fontsize=10)
    handles = [Patch(facecolor="0.6", edgecolor="white", hatch=hatch, label=name)
               for _, name, hatch in LM_SLICES]
    handles.append(ax.scatter([], [], marker="x", s=25, color="black",
                              label="the paper's Table 1 (125-169M\nparameters, 10B Pile tokens)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return save_figure(fig, path)


def plot_lm_curves(rows, tokens_per_step, path, budget):
    """Validation perplexity against training tokens, log-log (where a power law is a
    line, so that the reader sees where each curve is heading): one colour per model, one
    line style per seed, each model at its chosen rate. The paper's Table 1 (overall
    perplexity after 10B tokens) lies far right of this axis: its values are in the legend."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    seeds = sorted({r["seed"] for r in rows})
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for r in rows:
        if not r["curve"]:
            continue
        steps, loss = zip(*r["curve"])
        name = LM_LABELS.get(r["label"], r["label"])
        ax.plot([s * tokens_per_step for s in steps], np.exp(loss), marker="o", ms=3,
                color=model_color(name), ls=("-", "--", ":", "-.")[seeds.index(r["seed"]) % 4],
                label=f"{name} (lr {r['lr']:g}, seed {r['seed']})")
    curves = any(r["curve"] for r in rows)
    paper = [label for label in dict.fromkeys(r["label"] for r in rows)
             if label in PAPER_TABLE1 and curves]
    note = ("\nthe paper's Table 1 (10B Pile tokens, 125-169M parameters) is off this "
            "axis: its overall perplexity in the legend" if paper else "")
    ax.set(xscale="log", yscale="log", xlabel="training tokens",
           ylabel="validation perplexity (full split)")
    ax.set_title(wrapped(f"validation perplexity while training\n{budget}{note}", 5.5),
                 fontsize=9)
    if curves:                                   # Table 1 in the legend only: off the axis
        handles = ax.get_legend_handles_labels()[0] + [
            Line2D([], [], ls="", marker="x", color=model_color(LM_LABELS.get(label, label)),
                   label=f"{LM_LABELS.get(label, label)}: the paper's {PAPER_TABLE1[label][0]:.2f}")
            for label in paper]
        ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    else:
        ax.text(0.5, 0.5, "no validation split (num_valid = 0)", ha="center",
                transform=ax.transAxes)
    return save_figure(fig, path)


def lm_tables(s):
    """The four tables of an LM experiment (run_lm_experiment's summary `s`): each (model,
    seed)'s sliced perplexities next to the paper's Table 1; the validation loss of each
    model at each rate (the first seed), and the rate chosen; the AR perplexity by the
    threshold of an AR hit; and appendix G's AR perplexity by P."""
    name = lambda label: LM_LABELS.get(label, label)
    number = lambda x, digits: "–" if x is None else f"{x:.{digits}f}"     # None: NaN in JSON
    reference = {r["seed"]: r["ppl"] for r in s["rows"] if r["label"] == "attention"}
    sliced = markdown(
        ["model", "seed", "lr", "params", "steps", "training s", "final training loss",
         "valid loss", "ppl", "AR ppl", "other ppl", "AR tokens", "gap due to AR",
         "the paper (Table 1: ppl / AR / other)"],
        [[name(r["label"]), str(r["seed"]), f"{r['lr']:g}", f"{r['n_params']:,}",
          f"{r['steps']:,}", f"{r['train_time_s']:.0f}", f"{r['final_loss']:.2f}",
          number(r["valid_loss"], 3), f"{r['ppl']:.2f}", f"{r['ppl_ar']:.2f}",
          f"{r['ppl_other']:.2f}", f"{r['ar_tokens']}/{r['tokens']}",
          gap_share_text(r["ar_share"], r["ppl"], reference.get(r["seed"], math.inf)),
          " / ".join(f"{v:.2f}" for v in PAPER_TABLE1.get(r["label"], ()))]
         for r in s["rows"]])
    chosen = {r["label"]: r["lr"] for r in s["rows"]}
    rates = markdown(["model", *(f"valid loss, lr {lr:g}" for lr in s["lrs"]), "chosen lr"],
                     [[name(label), *(number(v, 3) for v in losses), f"{chosen[label]:g}"]
                      for label, losses in s["lr_valid_loss"].items()])
    thresholds = markdown(
        ["model", "seed", *(f"{cut['threshold']:,} ({cut['ar_tokens']:,} tokens)"
                            for cut in s["thresholds"])],
        [[name(r["label"]), str(r["seed"]), *(f"{v:.1f}" for v in r["ppl_ar_by_threshold"])]
         for r in s["rows"]])
    pairs = [g["num_pairs"] for g in s["rows"][0]["appendix_g"]]
    appendix = markdown(["AR perplexity", "seed", *(f"P = {p}" for p in pairs)],
                        [[name(r["label"]), str(r["seed"]),
                          *(f"{g['ppl_ar']:,.0f}" for g in r["appendix_g"])] for r in s["rows"]])
    return {"": sliced, "lr": rates, "thresholds": thresholds, "appendix_g": appendix}


# ----------------------------------------------------------------------------------------
# appendix G: AR perplexity of a pretrained model on repeated key-value bigrams

APPENDIX_G_PAIRS = (16, 32, 64, 128, 256)        # P, at seq_len 1024 (appendix G)
TRANSFORMERS = "transformers==5.24.0"             # the optional package, the version tested


def bigram_recall_sequences(token_ids, num_examples, num_pairs, filler_id, seq_len=1024,
                            seed=0):
    """Sequences for the appendix G measurement: inference only, no labels.

    Each row holds P = num_pairs key-value bigrams, each appearing twice, on 4P of the
    seq_len positions; every other position holds the one `filler_id`. The 2P bigram
    copies sit on distinct aligned slots (positions 2s, 2s+1), chosen uniformly, and the
    two copies of each bigram are placed in random order among them. Keys and values are
    2P distinct ids drawn from `token_ids` (the model's own vocabulary; filler excluded),
    so every repeated key determines its value.

    Returns (inputs, ar_mask, filler_mask), each (num_examples, seq_len); the masks mark
    *target* positions t for next-token prediction from positions < t:
      ar_mask[t]     token t is the value of a bigram whose key is at t-1 for the second
                     time (an AR token: predictable only by recall);
      filler_mask[t] token t is the filler (the paper's non-AR tokens); position 0 is
                     marked too when it holds the filler, though nothing predicts it.
    """
    token_ids = torch.as_tensor(token_ids).flatten().unique()
    check_int("num_examples", num_examples, 0, "an integer >= 0")
    check_int("seq_len", seq_len, 4, "an integer >= 4")
    check_int("num_pairs", num_pairs, 1, "an integer >= 1 with 4*num_pairs <= seq_len")
    if 4 * num_pairs > seq_len:
        raise ValueError(f"num_pairs={num_pairs} is not allowed with seq_len={seq_len}: "
                         f"4*num_pairs must be <= seq_len (at most {seq_len // 4})")
    pool = token_ids[token_ids != filler_id].numpy()
    if len(pool) < 2 * num_pairs:
        raise ValueError(f"token_ids has {len(pool)} ids other than filler_id={filler_id}; "
                         f"num_pairs={num_pairs} needs at least {2 * num_pairs}")
    check_int("seed", seed, 0, "an integer >= 0")
    B, P, N = num_examples, num_pairs, seq_len
    rng = np.random.default_rng(seed)
    ids = pool[sample_distinct(rng, B, 2 * P, 0, len(pool))]                # (B, 2P)
    slots = np.sort(sample_distinct(rng, B, 2 * P, 0, N // 2), axis=1)       # (B, 2P)
    copies = np.argsort(rng.random((B, 2 * P)), axis=1) % P                  # each pair twice
    key_pos = 2 * slots
    inputs = np.full((B, N), filler_id, dtype=np.int64)
    np.put_along_axis(inputs, key_pos, np.take_along_axis(ids[:, :P], copies, 1), axis=1)
    np.put_along_axis(inputs, key_pos + 1, np.take_along_axis(ids[:, P:], copies, 1), axis=1)
    # the second copy of pair j is the later of its two slots
    seen_before = np.zeros((B, 2 * P), dtype=bool)
    first = np.full((B, P), -1)
    for s in range(2 * P):  # a loop over slots (≤ 2P), vectorized over examples
        j = copies[:, s]
        seen_before[:, s] = np.take_along_axis(first, j[:, None], 1)[:, 0] >= 0
        np.put_along_axis(first, j[:, None], s, axis=1)
    ar_mask = np.zeros((B, N), dtype=bool)
    np.put_along_axis(ar_mask, key_pos + 1, seen_before, axis=1)
    filler_mask = inputs == filler_id
    return torch.from_numpy(inputs), torch.from_numpy(ar_mask), torch.from_numpy(filler_mask)


@torch.no_grad()
def appendix_g(logits_fn, token_ids, filler_id, num_pairs=APPENDIX_G_PAIRS, num_samples=1000,
               seq_len=1024, batch_size=8, seed=0, device="cpu"):
    """Appendix G for any causal LM given as logits_fn(ids (B, N)) -> logits (B, N, V), its
    model on `device`: for each P, perplexity on the AR tokens (the value after a key's
    second occurrence) and on the filler tokens of bigram_recall_sequences(token_ids,
    num_samples, P, filler_id, seq_len), moved to `device`, token t predicted from the
    tokens before it. Returns one row per P."""
    check_positive("batch_size", batch_size)
    rows = []
    for P in tqdm(num_pairs, desc="appendix G", unit="P"):
        inputs, ar_mask, filler_mask = (t.to(device) for t in bigram_recall_sequences(
            token_ids, num_samples, P, filler_id, seq_len, seed))
        nll = {"ar": [], "filler": []}
        for i in range(0, num_samples, batch_size):
            x = inputs[i:i + batch_size]
            logits = logits_fn(x)[:, :-1].float()                             # predicts 1..N-1
            loss = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
            nll["ar"].append(loss[ar_mask[i:i + batch_size, 1:]])
            nll["filler"].append(loss[filler_mask[i:i + batch_size, 1:]])
        ppl = {k: math.exp(torch.cat(v).cpu().double().mean().item())    # mps has no float64
               for k, v in nll.items()}
        rows.append(dict(num_pairs=P, ppl_ar=ppl["ar"], ppl_filler=ppl["filler"],
                         ar_tokens=sum(len(v) for v in nll["ar"])))
    return rows


def hf_causal_lm(name_or_path, device="cpu"):
    """A Hugging Face causal LM from a local folder or a hub name, on `device`, as
    (logits_fn, token ids, filler id): the token ids are the vocabulary minus the special
    tokens the config names, the filler the smallest of them. Needs the optional package
    transformers."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ValueError(f"--hf needs the optional package {TRANSFORMERS.split('=')[0]}: pip "
                         f"install {TRANSFORMERS} (the version the tests ran with)") from None
    model = AutoModelForCausalLM.from_pretrained(name_or_path).to(device).eval()
    config = model.config
    special = {getattr(config, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    special = {i for s in special for i in (s if isinstance(s, list) else [s]) if i is not None}
    ids = torch.tensor([i for i in range(config.vocab_size) if i not in special])
    return (lambda x: model(input_ids=x).logits), ids, int(ids[0])


def plot_appendix_g(curves, path, title):
    """AR and filler perplexity against P, one pair of lines per model (appendix G's plot)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for label, rows in curves.items():
        P = [r["num_pairs"] for r in rows]
        ax.plot(P, [r["ppl_ar"] for r in rows], marker="o", color=model_color(label),
                label=f"{label}, AR")
        ax.plot(P, [r["ppl_filler"] for r in rows], marker="x", ls="--", color=model_color(label),
                label=f"{label}, filler")
    ax.set(xscale="log", yscale="log", xlabel="key-value pairs P", ylabel="perplexity", title=title)
    ax.set_xticks(P, [str(p) for p in P])
    ax.set_xticks([], minor=True)                      # no 3 x 10^0 between the P ticks
    ax.legend(fontsize=6)
    return save_figure(fig, path)
