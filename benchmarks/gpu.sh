#!/bin/sh
# Every GPU comparison of issue 42 (benchmarks/gpu.py says what each is), on one H100 or H200,
# within about 8 minutes of GPU time. First, here: python benchmarks/gpu_data.py (fills .gpu/).
# On the device machine (python3 there holds torch, transformers, sentence-transformers):
#   sh benchmarks/gpu.sh                       # writes $OUT (or benchmarks/results)/gpu.{json,md}
#   sh benchmarks/gpu.sh --sections pretrain   # a part
set -e
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv || true
exec python3 benchmarks/gpu.py --out "${OUT:-benchmarks/results}" "$@"
