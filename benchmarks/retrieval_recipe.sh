#!/bin/bash
# Issue 25's recipe end to end, every setting chosen on a dev split of the train half (SQuAD dev
# articles 1-20 train, 21-24 dev; the evaluation half, 25-48, only scored at the end):
#   1. hard negatives from an index of the train half's paragraphs (zero-shot MiniLM + BM25):
#      3 by BM25 for the bi-encoder, 7 by hybrid search for the cross-encoder
#   2. bi-encoder settings compared on the split, the best retrained on all 24 articles
#   3. cross-encoder settings compared on the split (best epoch by dev), the best kept
#   4. the bi-encoder distilled from that cross-encoder: the hybrid rows scored by it (mine
#      --teacher), --teacher-weight 1, batch 64, lr 5e-5, 1 epoch, seeds 0-3 on all 24 articles,
#      averaged with MiniLM at 0.15 (bertforge merge; weight, settings and mix chosen on the dev
#      split in the sessions of 2026-11-26: 79.7 MRR@10 on the evaluation half, H100)
#   5. benchmarks/retrieval.py --add: each bi-encoder alone and fused with BM25 (RRF, z-score);
#      with the merged one, the best first stage's top 50 reranked for --rerank-queries
#      evaluation questions; then the merged one read as `bertforge index --window 32` reads
#      the paragraphs (32 pieces chosen on the dev split; 85.9 on the evaluation half)
# Meant for a GPU (on the H200 of 2026-11-26 steps 1-3 and 5 took about 5 minutes; step 4 adds
# about 3); on a CPU each training run takes 30-90 minutes per thread. Writes into WORK; results
# in WORK/retrieval.{json,md}.
#
#   bash benchmarks/retrieval_recipe.sh MINILM_DIR WORK [SQUAD_DIR] [RERANK_QUERIES]
#   EXTRA="--max-train-rows 48 --max-seq-length 48" bash ...   # a smoke run of the commands
set -euo pipefail
M=$1 W=$2 DATA=${3:-$(dirname "$0")/../../shared/data/squad} Q=${4:-4874}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$W" && cd "$W"
python "$HERE/retrieval.py" --data "$DATA" --write-train .
bertforge index "$M" train_paragraphs.jsonl --out idx-train
bertforge mine idx-train squad_train_pairs.jsonl --out bi.jsonl --mode bm25 --negatives 3 --depth 30
# --fusion rrf: hybrid's default when these rows were measured (z-scores since)
bertforge mine idx-train squad_train_pairs.jsonl --out ce.jsonl --mode hybrid --fusion rrf \
    --negatives 7 --depth 30
python - "$HERE" "$DATA" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from retrieval import squad_retrieval
squad = Path(sys.argv[2]) / "dev-v1.1.json"
data = json.loads(squad.read_text())["data"]
tune = sum(len(p["qas"]) for a in data[:20] for p in a["paragraphs"])  # articles 1-20
questions = len(squad_retrieval(squad)[1]["train"])
for name in ("bi", "ce"):
    rows = Path(f"{name}.jsonl").read_text().splitlines(keepends=True)
    assert len(rows) == questions, f"{name}.jsonl: a question without its negatives"
    dev = rows[tune:]
    if name == "bi":  # scored as (query, positive) pairs against the dev passages
        pairs = [json.loads(r) for r in dev]
        dev = [json.dumps({"query": r["query"], "positive": r["positive"]}) + "\n" for r in pairs]
    Path(f"{name}_tune.jsonl").write_text("".join(rows[:tune]))
    Path(f"{name}_dev.jsonl").write_text("".join(dev))
EOF
common=(--max-seq-length 256 --no-progress ${EXTRA:-})
for c in "128 1e-4 2" "256 2e-4 3" "32 5e-5 1" "64 5e-5 2"; do  # batch lr epochs
    set -- $c
    bertforge finetune --task retrieval --model "$M" --train bi_tune.jsonl --dev bi_dev.jsonl \
        --out "bi_b$1_lr$2" --batch-size $1 --lr $2 --epochs $3 "${common[@]}"
done
for c in "listwise 5e-5" "listwise 1e-4" "pointwise 5e-5"; do  # loss lr
    set -- $c
    bertforge finetune --task rerank --model "$M" --train ce_tune.jsonl --dev ce_dev.jsonl \
        --out "ce_$1_lr$2" --rerank-loss $1 --batch-size 16 --lr $2 --epochs 3 "${common[@]}"
done
best() {  # the run directory of $1* with the best dev MRR@10, then its batch, lr and best epoch
    python - "$1" <<'EOF'
import json, sys
from pathlib import Path
runs = [
    (json.loads((p / "eval_results.json").read_text()), p)
    for p in Path(".").glob(sys.argv[1] + "*")
    if (p / "eval_results.json").is_file()
]
r, p = max(runs, key=lambda t: t[0]["mrr@10"])
s = json.loads((p / "run.json").read_text())["settings"]
print(p, s["batch_size"], s["lr"], round(r["epoch"]))
EOF
}
read -r _ BS LR EP < <(best bi_b)
bertforge finetune --task retrieval --model "$M" --train bi.jsonl --out bi-final \
    --batch-size "$BS" --lr "$LR" --epochs "$EP" "${common[@]}"
read -r CE _ < <(best ce_)
bertforge mine idx-train squad_train_pairs.jsonl --out bt.jsonl --mode hybrid --fusion rrf \
    --negatives 7 --depth 30 --teacher "$CE"
for seed in 0 1 2 3; do
    bertforge finetune --task retrieval --model "$M" --train bt.jsonl --out "bt_s$seed" \
        --teacher-weight 1 --batch-size 64 --lr 5e-5 --epochs 1 --seed $seed "${common[@]}"
done
bertforge merge bt_s0 bt_s1 bt_s2 bt_s3 "$M" --weights 0.2125,0.2125,0.2125,0.2125,0.15 \
    --out bt-soup
cp "$HERE/results/retrieval.json" retrieval.json
python "$HERE/retrieval.py" --data "$DATA" --model "$M" --add "recipe bi-encoder=bi-final" \
    --out retrieval
python "$HERE/retrieval.py" --data "$DATA" --model "$M" \
    --add "recipe bi-encoder, distilled, 4 seeds + MiniLM merged=bt-soup" \
    --cross-encoder "$CE" --rerank-depth 50 --rerank-queries "$Q" --out retrieval
python "$HERE/retrieval.py" --data "$DATA" --model "$M" --windows 32 \
    --add "recipe soup, read in windows of 32 pieces=bt-soup" --out retrieval
