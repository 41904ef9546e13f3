#!/usr/bin/env bash
# The same batch on one GPU and on two (mlx.launch --backend nccl -n 2, and two --shard processes),
# wall time of the whole command (start-up and model load included), outputs compared byte for byte.
# Run from the project root on a host with 2 NVIDIA GPUs and MLX's CUDA build; results go to $OUT.
set -uo pipefail
PY=${PY:-python3}
LAUNCH=${LAUNCH:-mlx.launch}
OUT=${OUT:-scaleout-results}; mkdir -p "$OUT"
WORK=$(mktemp -d)
$PY -m fixtures.checkpoints "$WORK/ck" --size full
$PY - "$WORK/batch" <<'PYEOF'
import os, sys
import numpy as np, soundfile as sf
from speechlens_cli.synthetic.speech import noisy_speech
folder = sys.argv[1]; os.makedirs(folder)
rng = np.random.default_rng(7)
total = 0.0
for i in range(24):
    rate = (16000, 44100, 48000)[i % 3]
    seconds = float(rng.uniform(10, 50))
    sf.write(f"{folder}/clip{i:02d}_{rate}.wav", noisy_speech(rate, seconds, seed=i), rate, subtype="PCM_16")
    total += seconds
print(f"24 files, {total:.1f} s of audio")
PYEOF
enhance=($PY -m speechlens_cli enhance "$WORK/batch")
timed() { # name, command...: wall seconds of the command into $OUT/times.txt
  local name=$1; shift; local t0 t1; t0=$(date +%s%N)
  "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.err"; local rc=$?; t1=$(date +%s%N)
  echo "$name rc=$rc wall=$(awk "BEGIN{print ($t1-$t0)/1e9}") s" | tee -a "$OUT/times.txt"
}
two_shards() { # output folder, GPU of shard 0, GPU of shard 1
  CUDA_VISIBLE_DEVICES=$2 "${enhance[@]}" "$1" --model "$WORK/ck" --json --shard 0/2 &
  CUDA_VISIBLE_DEVICES=$3 "${enhance[@]}" "$1" --model "$WORK/ck" --json --shard 1/2 &
  wait
}
for trial in 1 2 3; do
  rm -rf "$WORK"/o*
  timed one_gpu_t$trial env CUDA_VISIBLE_DEVICES=0 "${enhance[@]}" "$WORK/o1" --model "$WORK/ck" --json
  timed nccl2_t$trial $LAUNCH --backend nccl -n 2 -- "${enhance[@]}" "$WORK/o2" --model "$WORK/ck" --json
  timed shard2_t$trial two_shards "$WORK/o3" 0 1
  timed shard2_one_gpu_t$trial two_shards "$WORK/o4" 0 0
  for d in o2 o3 o4; do
    echo "$d vs one GPU: $(diff -rq "$WORK/o1" "$WORK/$d" > /dev/null && echo identical || echo DIFFERENT)," \
         "$(ls "$WORK/$d" | wc -l) files" | tee -a "$OUT/times.txt"
  done
done
rm -rf "$WORK"
