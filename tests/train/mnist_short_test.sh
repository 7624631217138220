#!/usr/bin/env bash
# A short hvd-mnist run at 2 ranks (1 epoch on a subset of the digits): the loss falls from the
# first progress line to the last, and validation accuracy passes a bar (--min-accuracy).
#   mnist_short_test.sh HVDRUN HVD_MNIST DATA_DIR
set -euo pipefail
hvdrun=$1 mnist=$2 data=$3
if [ ! -e "$data/train-images-idx3-ubyte" ] && [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: no MNIST files in $data (scripts/make-mnist.sh makes them)"
  exit 77
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$hvdrun" -np 2 --backend gloo --timeout 120 -- "$mnist" --data-dir "$data" --epochs 1 \
  --train-limit 4096 --log-interval 4 --threads 1 --seed 1 --min-accuracy 0.85 | tee "$out"
losses=$(sed -n 's/.*Batch\[.*loss=\([0-9.e+-]*\).*/\1/p' "$out")
first=$(echo "$losses" | head -1) last=$(echo "$losses" | tail -1)
[ -n "$first" ] || { echo "FAIL: no progress line with a loss"; exit 1; }
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.7 * f) }' ||
  { echo "FAIL: the loss did not fall: first $first, last $last"; exit 1; }
grep -q 'Epoch\[0\] Train-accuracy=.* Validation-accuracy=' "$out" ||
  { echo "FAIL: no epoch accuracy line"; exit 1; }
echo "PASS: loss $first -> $last"
