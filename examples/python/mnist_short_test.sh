#!/usr/bin/env bash
# ctest python.mnist_short: examples/python/mnist.py (hvd.torch) at 2 ranks over Gloo on a few
# hundred digits, end to end: the loss falls and validation accuracy passes a bar, plain and with
# --fp16-allreduce --backward-passes-per-step 2; --min-accuracy above what it reaches exits 2.
#   mnist_short_test.sh HVDRUN PYTHON PACKAGE_DIR DATA_DIR      (exit 77: no data)
set -euo pipefail
hvdrun=$1 python=$2 package=$3 data=$4
script="$(cd "$(dirname "$0")" && pwd)/mnist.py"
if [ ! -e "$data/train-images-idx3-ubyte" ] && [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: no MNIST files in $data (scripts/make-mnist.sh makes them)"
  exit 77
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
export PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}"

# run MIN_ACCURACY [OPTIONS...]: 2 epochs of 24 steps of 32 digits per rank; the loss of the
# last progress line must be below 0.7x the first's.
run() {
  local bar=$1
  shift
  "$hvdrun" -np 2 --backend gloo --timeout 120 -- "$python" "$script" --data-dir "$data" \
    --train-limit 1536 --val-limit 500 --epochs 2 --batch-size 32 --log-interval 4 --seed 1 \
    --min-accuracy "$bar" "$@" | tee "$out"
  local losses first last
  losses=$(sed -n 's/^\[0\]<stdout>:Epoch\[.*Batch\[.*loss=\([0-9.e+-]*\).*/\1/p' "$out")
  first=$(echo "$losses" | head -1) last=$(echo "$losses" | tail -1)
  [ -n "$first" ] || { echo "FAIL: no progress line with a loss"; exit 1; }
  awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.7 * f) }' ||
    { echo "FAIL ($*): the loss did not fall: first $first, last $last"; exit 1; }
  grep -q '^\[0\]<stdout>:Epoch\[1\] Speed=[0-9.]* samples/s Time cost=' "$out" ||
    { echo "FAIL ($*): no speed line for epoch 1"; exit 1; }
  grep -q '^\[0\]<stdout>:mnist.py: trained 2 epochs in .* final validation accuracy' "$out" ||
    { echo "FAIL ($*): no final line"; exit 1; }
  echo "PASS ($*): loss $first -> $last"
}
run 0.8
run 0.6 --fp16-allreduce --backward-passes-per-step 2

status=0
"$hvdrun" -np 2 --backend gloo --timeout 120 -- "$python" "$script" --data-dir "$data" \
  --train-limit 256 --val-limit 100 --epochs 1 --min-accuracy 0.999 > "$out" 2>&1 || status=$?
[ "$status" = 2 ] ||
  { cat "$out"; echo "FAIL: --min-accuracy 0.999 exited $status, not 2"; exit 1; }
grep -q 'mnist.py: final validation accuracy .* is below --min-accuracy 0.999' "$out" ||
  { cat "$out"; echo "FAIL: --min-accuracy 0.999 gave no message"; exit 1; }
echo "PASS: --min-accuracy 0.999 exits 2"
