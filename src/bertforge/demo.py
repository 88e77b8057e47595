"""`bertforge demo`: the whole BERT life cycle in a few minutes, on text every Python has.

    1. corpus       the standard library's docstrings (no download)
    2. vocabulary   a WordPiece vocabulary trained on it          (= bertforge vocab train)
    3. shards       tokenized pre-training shards + a held-out part (= bertforge prepare)
    4. before       a random tiny BERT: its guesses and held-out masked-LM accuracy
    5. pre-train    masked LM on packed text, the small-budget recipe (= bertforge pretrain
                    --no-nsp --dropout 0), for --minutes of training (the steps that fit,
                    timed as they go: a busy machine takes fewer, never for less time) or
                    --steps; its guesses after, and on held-out sentences with a word
                    masked: is the word among its top 5? (= bertforge fill-mask)
    6. fine-tune    an acceptability task made from held-out text: a real sentence, or the
                    same words shuffled? (= bertforge finetune --task csv); held-out accuracy
    7. use it       classify new sentences                          (= bertforge classify)

Every step calls the same functions as the real commands; the outputs stay in --out. Ctrl-C
stops it where it is (a training step's checkpoint saved); the same command resumes it there,
and on a finished --out shows its results again.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .config import BertConfig
from .data.corpus import split_sentences
from .data.shards import prepare
from .data.stdlib_corpus import stdlib_documents
from .errors import ConfigError
from .fileio import write_text
from .heads import BertForMaskedLM
from .options import MAX_SEED
from .pipelines import Pipeline
from .tokenizer import Tokenizer, train_vocab

if TYPE_CHECKING:
    from .train.pretrain import PretrainConfig

# Pre-training's share of the demo: the rest (vocabulary, shards, fine-tuning, the guesses)
# takes under a minute on 2 CPU cores, so the whole demo ends within about 5 minutes; a faster
# machine pre-trains more steps in the same time (and learns more), a slower one fewer.
MINUTES = 4.3
EVAL_EVERY = 1000  # held-out evaluations while pre-training for --minutes (steps unknown)

PROBES = [
    "return the [MASK] of the list.",
    "if the file does not exist, an [MASK] is raised.",
    "this module provides functions for working with [MASK].",
]


def _say(step: str) -> None:
    print(f"\n== {step}", flush=True)


def _show_fill_mask(pipe: Pipeline) -> list[str]:
    tops = []
    for text, masks in zip(PROBES, pipe.fill_mask(PROBES, 5)):
        guesses = ", ".join(f"{c['token']} {c['score']:.2f}" for c in masks[0])
        print(f"  {text:<52} {guesses}")
        tops.append(masks[0][0]["token"])
    return tops


# The held-out probe: PROBE_SENTENCES sentences from documents pre-training never saw, each with
# one word masked that the corpus uses often (a word ranked below COMMON among its most frequent:
# "the", "is", "of" would make every guess the same) but not rarely (ranked above FREQUENT): a
# word the model had the chance to learn, in a context it never read.
PROBE_SENTENCES, COMMON, FREQUENT = 10, 40, 800


def word_ranks(documents: list[list[str]]) -> dict[str, int]:
    """Each lower-cased alphabetic word of the documents -> its frequency rank (0: the most
    frequent; ties in first-seen order)."""
    counts: dict[str, int] = {}
    for d in documents:
        for p in d:
            for w in p.lower().split():
                if w.isalpha():
                    counts[w] = counts.get(w, 0) + 1
    ranked = sorted(counts, key=lambda w: -counts[w])
    return {w: i for i, w in enumerate(ranked)}


def masked_sentences(
    sentences: list[str],
    tok: Any,
    rng: random.Random,
    ranks: dict[str, int] | None = None,
    limit: int | None = None,
) -> list[tuple[str, str]]:
    """Each sentence with one word masked: a random word that is one piece of the vocabulary
    (and, given the corpus's `ranks`, ranked from COMMON to FREQUENT); sentences without such
    a word are skipped; at most `limit` of them."""
    out = []
    for s in sentences:
        words = s.split()
        whole = [
            i
            for i, w in enumerate(words)
            if w.isalpha()
            and len(tok.tokenize(w)) == 1
            and (ranks is None or COMMON <= ranks.get(w.lower(), FREQUENT) < FREQUENT)
        ]
        if whole:
            i = rng.choice(whole)
            out.append((" ".join([*words[:i], "[MASK]", *words[i + 1 :]]), words[i].lower()))
        if limit is not None and len(out) == limit:
            break
    return out


def top5_hits(pipe: Pipeline, masked: list[tuple[str, str]], show: int = 4) -> tuple[int, int]:
    """(how many of the masked held-out sentences have their word among the model's top 5, how
    many distinct top guesses the model made over them); the first `show` shown."""
    guesses = pipe.fill_mask([t for t, _ in masked], 5)
    hits = [word in [c["token"] for c in g[0]] for (_, word), g in zip(masked, guesses)]
    for (text, word), g, hit in list(zip(masked, guesses, hits))[:show]:
        short = text if len(text) <= 60 else text[:57] + "..."
        print(
            f"  {'+' if hit else ' '} {short:<60} {word!r}: {', '.join(c['token'] for c in g[0])}"
        )
    return sum(hits), len({g[0][0]["token"] for g in guesses})


def acceptability_rows(sentences: list[str], rng: random.Random) -> list[tuple[str, str]]:
    """Each sentence once: as written ("real") or with its words shuffled ("shuffled")."""
    rows = []
    for s in sentences:
        words = s.split()
        if rng.random() < 0.5:
            rows.append((s, "real"))
            continue
        shuffled = words[:]
        while shuffled == words:
            rng.shuffle(shuffled)
        rows.append((" ".join(shuffled), "shuffled"))
    return rows


def _write_table(path: Path, rows: list[tuple[str, str]]) -> None:
    write_text(
        path, "sentence\tlabel\n" + "".join(f"{t.replace(chr(9), ' ')}\t{y}\n" for t, y in rows)
    )


def run_demo(
    out: Path,
    seed: int = 0,
    minutes: float = MINUTES,
    steps: int | None = None,
    # 4,000 pieces: a cheaper output layer and fewer classes; against 8,000, 6,784 steps in
    # 3.8 minutes instead of 4,956, held-out MLM accuracy 38.1% instead of 29.1% (15% masked)
    vocab_size: int = 4000,
    progress: bool = True,
    sentences: int = 4000,
    epochs: float = 3.0,
) -> dict[str, Any]:
    """Run the demo into `out`; returns its numbers (for tests, which make it small).
    Pre-training runs for `minutes`, or for a fixed number of `steps` when given.

    The steps of the module docstring, one function each; `rng` (drawing the held-out
    sentences, masking them, making the task's rows) is shared by them, in this order."""
    _check_options(seed, minutes, steps)
    t0 = time.time()
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    task_docs, corpus_docs, corpus = _corpus(out, seed)
    tok = _vocabulary(out, corpus, vocab_size, progress)
    _shards(out, corpus, tok, seed, progress)
    # Held-out sentences come from documents pre-training never saw.
    ranks = word_ranks(corpus_docs)
    masked = masked_sentences(_sentences_of(task_docs, 200, rng), tok, rng, ranks, PROBE_SENTENCES)
    recipe = _pretrain_recipe(out, seed, minutes, steps, progress)
    acc_before, before, top5_before = _before_pretraining(out, tok, recipe, masked, seed)
    summary = _pretrain(recipe, minutes, steps)
    if summary.get("interrupted"):
        return _interrupted(summary)
    acc_after, after, top5 = _after_pretraining(recipe, masked, acc_before, top5_before)
    best = _finetune(
        out, Path(recipe.out), task_docs, corpus_docs, rng, seed, sentences, epochs, progress
    )
    if best.get("interrupted"):
        return _interrupted(best)
    classifier, accuracy, dev_rows = best["classifier"], best["accuracy"], best["dev_rows"]
    _use(classifier, dev_rows)
    elapsed = time.time() - t0
    _say_next(out, classifier, elapsed)
    return {
        "before": before,
        "after": after,
        "accuracy": accuracy,
        "pretrain": summary,
        "mlm_acc": (acc_before, acc_after),
        "top5": (top5_before, top5),
        "seconds": elapsed,
    }


def _check_options(seed: int, minutes: float, steps: int | None) -> None:
    """The options checked before anything is written (the configs check them again, later)."""
    from .train.pretrain import MAX_MINUTES

    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"seed={seed} (--seed): must be >= 0 and <= {MAX_SEED}")
    if steps is None and not 0 < minutes <= MAX_MINUTES:
        raise ConfigError(f"minutes={minutes} (--minutes): must be > 0 and <= {MAX_MINUTES:g}")
    if steps is not None and steps < 1:
        raise ConfigError(f"steps={steps} (--steps): must be >= 1")


def _corpus(out: Path, seed: int) -> tuple[list[list[str]], list[list[str]], Path]:
    """1. The standard library's docstrings, shuffled: a tenth held out for the task's dev
    set, the rest written as the pre-training corpus. Returns both parts and the file."""
    _say("1. corpus: docstrings of the Python standard library (no download)")
    docs = list(stdlib_documents())
    random.Random(seed).shuffle(docs)
    n_task = max(1, len(docs) // 10)  # a tenth of the documents: held out for the task's dev set
    task_docs, corpus_docs = docs[:n_task], docs[n_task:]
    corpus = out / "stdlib_docstrings.txt"
    # Google's pre-training format: one paragraph per line, a blank line between documents;
    # written only when it changed: prepare knows its inputs by size and modification time, so
    # rewriting the same text would make a re-run's shards look stale
    text = "\n\n".join("\n".join(d) for d in corpus_docs) + "\n"
    if not corpus.is_file() or corpus.read_text(encoding="utf-8") != text:
        write_text(corpus, text)
    print(f"{len(corpus_docs):,} documents, {corpus.stat().st_size / 1e6:.1f} MB -> {corpus}")
    return task_docs, corpus_docs, corpus


def _vocabulary(out: Path, corpus: Path, vocab_size: int, progress: bool) -> Tokenizer:
    """2. A WordPiece vocabulary trained on the corpus, saved under out/vocab; an earlier run's,
    when out has one: the shards, the model and the run resumed or finished are of that one,
    and training again on the same corpus gave other pieces here (the trainer is not
    deterministic), which the shards refused."""
    _say(f"2. vocabulary: WordPiece, {vocab_size:,} tokens, uncased  (bertforge vocab train)")
    vocab_dir = out / "vocab"
    if (vocab_dir / "vocab.txt").is_file():
        tok = Tokenizer.from_pretrained(vocab_dir)
        if tok.vocab_size != vocab_size:
            raise ConfigError(
                f"{vocab_dir}: an earlier demo's vocabulary of {tok.vocab_size:,} tokens, not "
                f"{vocab_size:,}: choose a new --out or remove that directory"
            )
        print(f"{vocab_dir}: the vocabulary of an earlier run here")
    else:
        tok = train_vocab([corpus], vocab_size, show_progress=progress)
        tok.save_pretrained(vocab_dir)
    print(
        f"{tok.vocab_size:,} tokens -> {vocab_dir}; e.g. {tok.tokenize('unaffable subprocesses')}"
    )
    return tok


def _shards(out: Path, corpus: Path, tok: Tokenizer, seed: int, progress: bool) -> None:
    """3. Pre-training shards of the corpus under out/shards."""
    _say("3. pre-training shards  (bertforge prepare)")
    meta = prepare([corpus], tok, out / "shards", heldout=0.02, seed=seed, progress=progress)
    print(f"{meta['counts']['train']['tokens']:,} training tokens -> {out / 'shards'}")


def _sentences_of(documents: list[list[str]], limit: int, rng: random.Random) -> list[str]:
    """Up to `limit` of the documents' sentences of 6 to 30 words (more than two distinct),
    in an order drawn from `rng`."""
    found = [
        s
        for d in documents
        for p in d
        for s in split_sentences(p)
        if 6 <= len(s.split()) <= 30 and len(set(s.split())) > 2
    ]
    rng.shuffle(found)
    return found[:limit]


def _pretrain_recipe(
    out: Path, seed: int, minutes: float, steps: int | None, progress: bool
) -> PretrainConfig:
    """The small-budget pre-training recipe of step 5 (its held-out data serves step 4 too)."""
    from .train.pretrain import PretrainConfig

    budget = {"steps": steps} if steps else {"minutes": minutes}
    return PretrainConfig(
        data=str(out / "shards"),
        out=str(out / "pretrained"),
        model_size="tiny",
        **budget,
        batch_size=32,
        max_seq_length=64,
        nsp=False,
        dropout=0.0,
        # a quarter of the pieces masked, not BERT's 15%: more predictions to learn from per
        # step (Wettig et al. 2023, "Should you mask 15%?"). Held-out accuracy (scored at 15%)
        # after 3,000 steps here: 30.8% against 17.7%, where 15% had not yet left the unigram
        # plateau; 40% masked gave the same 31.0% at a dearer step
        masked_lm_prob=0.25,
        lr=1e-3,
        warmup_ratio=0.05,
        # the peak rate until the last fifth, then linear decay (warmup-stable-decay): 31.8%
        # held-out MLM accuracy after 6,400 steps here, where decay from the start stays near
        # the unigram plateau longer; lr 2e-3 did not leave it in 6,400 steps
        decay_ratio=0.2,
        # bf16 where the CPU has it (AVX-512 BF16, AMX): a tiny model's step with torch 2.13 on 2
        # such cores takes 44 ms against 60 in fp32, the same losses to 3 decimals; more steps
        # in the minutes, and the masked LM leaves its unigram plateau within them
        precision="auto",
        seed=seed,
        eval_every=max(1, steps // 4) if steps else EVAL_EVERY,
        eval_batches=10,
        save_every=0,  # at the end (and on Ctrl-C) only
        keep_checkpoints=1,
        progress=progress,
    )


def _before_pretraining(
    out: Path, tok: Tokenizer, recipe: PretrainConfig, masked: list[tuple[str, str]], seed: int
) -> tuple[float, list[str], tuple[int, int]]:
    """4. A random tiny BERT (saved as out/untrained): its held-out masked-LM accuracy, its
    top guesses for the probes, and its top-5 share on the masked held-out sentences."""
    from .train.pretrain import heldout_scores

    _say("4. before pre-training: a randomly initialised tiny BERT  (bertforge fill-mask)")
    torch.manual_seed(seed)
    untrained = out / "untrained"
    model = BertForMaskedLM(BertConfig.from_size("tiny", vocab_size=tok.vocab_size))
    model.save_pretrained(untrained)
    tok.save_pretrained(untrained)
    acc_before = heldout_scores(recipe, model)["mlm_acc"]
    print(f"held-out masked-LM accuracy {acc_before:.1%}; it guesses:")
    pipe = Pipeline(untrained, precision="fp32")  # one model for both
    before = _show_fill_mask(pipe)
    top5_before = top5_hits(pipe, masked, show=0)
    return acc_before, before, top5_before


def _pretrain(recipe: PretrainConfig, minutes: float, steps: int | None) -> dict[str, Any]:
    """5. Pre-training by the recipe (resumed where a Ctrl-C stopped it; nothing to do when it
    finished before); its summary."""
    from .train.pretrain import run as pretrain

    length = f"{steps} steps" if steps else f"{minutes:g} minutes"
    _say(
        f"5. pre-train: tiny BERT (2 layers, hidden 128), masked LM, {length}  (bertforge pretrain)"
    )
    return pretrain(recipe)


def _after_pretraining(
    recipe: PretrainConfig,
    masked: list[tuple[str, str]],
    acc_before: float,
    top5_before: tuple[int, int],
) -> tuple[float, list[str], tuple[int, int]]:
    """The pre-trained model (this run's or an earlier one's): its held-out masked-LM accuracy,
    the probes' top guesses, and the top-5 share on the masked held-out sentences."""
    from .train.pretrain import heldout_scores

    pipe = Pipeline(recipe.out, precision="fp32")  # its weights loaded once for all three
    acc_after = heldout_scores(recipe, pipe.model_for("fill-mask"))["mlm_acc"]
    print(f"held-out masked-LM accuracy {acc_before:.1%} -> {acc_after:.1%}; now it guesses:")
    after = _show_fill_mask(pipe)
    print(
        "held-out sentences, each with a word masked that the corpus uses often "
        "(+: the word is among the top 5 guesses):"
    )
    top5 = top5_hits(pipe, masked, show=len(masked))
    print(
        f"the masked word is among the top 5 in {top5[0]} of {len(masked)} held-out sentences, "
        f"with {top5[1]} different first guesses (before pre-training: {top5_before[0]} of "
        f"{len(masked)}, {top5_before[1]} different)"
    )
    return acc_after, after, top5


def _interrupted(result: dict[str, Any]) -> dict[str, Any]:
    """A step stopped by Ctrl-C (its checkpoint saved): the demo stops there too."""
    print("interrupted; run the same command to resume", flush=True)
    return {"interrupted": True, "step": result.get("step")}


def _finetune(
    out: Path,
    run_dir: Path,
    task_docs: list[list[str]],
    corpus_docs: list[list[str]],
    rng: random.Random,
    seed: int,
    sentences: int,
    epochs: float,
    progress: bool,
) -> dict[str, Any]:
    """6. The acceptability task (training rows from the corpus, dev rows from the held-out
    documents) under out/acceptability, fine-tuned from the pre-trained model into
    out/classifier. Returns that directory, its held-out accuracy and the dev rows
    ("classifier", "accuracy", "dev_rows"), or fine-tuning's {"interrupted": True, ...}."""
    from .train.finetune import FinetuneConfig
    from .train.finetune import run as finetune

    _say("6. fine-tune: real sentence or shuffled words?  (bertforge finetune --task csv)")

    train_sentences = _sentences_of(corpus_docs, sentences, rng)
    dev_sentences = _sentences_of(task_docs, max(50, sentences // 4), rng)
    data = out / "acceptability"
    data.mkdir(exist_ok=True)
    _write_table(data / "train.tsv", acceptability_rows(train_sentences, rng))
    dev_rows = acceptability_rows(dev_sentences, rng)
    _write_table(data / "dev.tsv", dev_rows)
    n_dev = len(dev_sentences)
    print(f"{len(train_sentences):,} training and {n_dev:,} held-out sentences -> {data}")
    classifier = out / "classifier"
    best: dict[str, Any] = finetune(
        FinetuneConfig(
            model=str(run_dir),
            task="csv",
            train=str(data / "train.tsv"),
            dev=str(data / "dev.tsv"),
            out=str(classifier),
            text_column="sentence",
            label_column="label",
            epochs=epochs,
            lr=5e-4,  # learns the task from a briefly pre-trained encoder too (2e-4: not always)
            batch_size=32,
            seed=seed,
            max_seq_length=64,
            progress=progress,
        )
    )
    if best.get("interrupted"):
        return best
    print(f"held-out accuracy {best['accuracy']:.1%} (chance 50%)")
    return {"classifier": classifier, "accuracy": best["accuracy"], "dev_rows": dev_rows}


def _use(classifier: Path, dev_rows: list[tuple[str, str]]) -> None:
    """7. The classifier on the first two real and two shuffled held-out rows, right or wrong."""
    _say("7. use it on held-out sentences  (bertforge classify)")
    shown = [r for r in dev_rows if r[1] == "real"][:2] + [
        r for r in dev_rows if r[1] == "shuffled"
    ][:2]
    texts = [t if len(t) <= 60 else t[:57] + "..." for t, _ in shown]
    for text, (_, gold), r in zip(
        texts, shown, Pipeline(classifier).classify([t for t, _ in shown])
    ):
        mark = "right" if r["label"] == gold else "wrong"
        print(f"  {text:<60} -> {r['label']:<8} ({r['score']:.2f}; {mark}, it is {gold})")


def _say_next(out: Path, classifier: Path, elapsed: float) -> None:
    """The end: the time taken, and the commands that do the same with real data."""
    print(f"\ndone in {elapsed:.0f} s; everything is in {out}. Go further with real data:")
    print(
        "  bertforge prepare wiki/*.txt --tokenizer DIR --out shards && "
        "bertforge pretrain --data shards --out run --model-size base"
    )
    print(
        "  bertforge finetune --model DIR --task mrpc --train MRPC/train.tsv "
        "--dev MRPC/dev.tsv --out mrpc-model"
    )
    print(f"  bertforge classify {classifier} my_sentences.txt")
    print(f"  bertforge embed MODEL texts.txt --out embeddings.npy;  bertforge info {classifier}")
