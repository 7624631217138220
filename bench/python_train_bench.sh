#!/usr/bin/env bash
# hvd.torch against PyTorch on examples/python/mnist.py's training: the same model, data, batch
# size, epochs and loop, one thread per rank (torch and OpenBLAS), all launched by hvdrun.
#
#   bench/python_train_bench.sh [--runs N] [--epochs E] [--python PY] [--steps S | --no-steps]
#       (default 3 runs of 3 epochs and 150 steps of each kind in one job; /usr/bin/python3;
#       needs build/python and the digits)
#
# Each run trains five jobs one after another, each pair of compared jobs side by side, and the
# order flips from run to run (P1 H1 D2 G2 O2, then H1 P1 O2 G2 D2, ...), so slow spells of this
# shared machine fall on both sides of a ratio alike:
#   P1  plain PyTorch, 1 process (bench/python/mnist_ddp.py --plain: no torch.distributed)
#   H1  hvd.torch, 1 rank (examples/python/mnist.py; at size 1 its DistributedOptimizer reduces
#       nothing, as Horovod's)
#   D2  PyTorch DDP over torch.distributed's gloo, 2 ranks (bench/python/mnist_ddp.py)
#   G2  hvd.torch over hvd's gloo backend, 2 ranks
#   O2  hvd.torch over hvd's ofi backend (libfabric shared memory), 2 ranks
# A job's speed is its samples over its training time in epochs 1..E-1 (epoch 0 warms up;
# evaluation is not timed). Each run prints its ratios; the summary gives each ratio's median and
# range over the runs, beside its goal.
#
# Then, unless --no-steps, each run also times the steps in one job (bench/python/mnist_steps.py:
# bare SGD, hvd.torch and DDP in alternating blocks of 10 steps in the same processes, as
# hvd-mnist --compare-bare does), at 1 rank and at 2 ranks with hvd on gloo and on ofi: jobs that
# minutes apart meet different loads on this shared machine compare better so.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3 epochs=3 python=/usr/bin/python3 steps=150
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=${2:?--runs needs a value}; shift 2 ;;
    --epochs) epochs=${2:?--epochs needs a value}; shift 2 ;;
    --python) python=${2:?--python needs a value}; shift 2 ;;
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --no-steps) steps=0; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
done
[[ $steps =~ ^[0-9]+$ ]] || { echo "--steps takes an integer, not '$steps'" >&2; exit 1; }
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "--runs takes a positive integer, not '$runs'" >&2; exit 1; }
[[ $epochs =~ ^[1-9][0-9]*$ && $epochs -ge 2 ]] ||
  { echo "--epochs takes an integer of at least 2 (epoch 0 is not timed), not '$epochs'" >&2; exit 1; }
hvdrun=build/bin/hvdrun
[ -x "$hvdrun" ] || { echo "build hvdrun first (cmake --build build)" >&2; exit 1; }
[ -e build/python/hvd/torch/__init__.py ] ||
  { echo "build hvd.torch first (cmake --build build --target hvd_python)" >&2; exit 1; }
[ -e build/data/mnist-digits/train-images-idx3-ubyte ] ||
  { echo "no digits in build/data/mnist-digits: run scripts/make-mnist.sh" >&2; exit 1; }
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--epochs "$epochs" --threads 1 --batch-size 64 --seed 42)

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# job NAME LOG: runs one of the five jobs, rank 0's lines kept in LOG
job() {
  local name=$1 log=$2
  local -a cmd
  case $name in
    P1) cmd=("$hvdrun" -np 1 --timeout 300 -- "$python" bench/python/mnist_ddp.py --plain) ;;
    H1) cmd=("$hvdrun" -np 1 --timeout 300 -- "$python" examples/python/mnist.py) ;;
    D2) cmd=(env MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)"
             "$hvdrun" -np 2 --timeout 300 -- "$python" bench/python/mnist_ddp.py) ;;
    G2) cmd=("$hvdrun" -np 2 --backend gloo --timeout 300 -- "$python" examples/python/mnist.py) ;;
    O2) cmd=("$hvdrun" -np 2 --backend ofi --timeout 300 -- "$python" examples/python/mnist.py) ;;
  esac
  echo "  + $name: ${cmd[*]} ${common[*]}" >&2
  # A job runs for well under a minute here: 15 minutes means it hangs.
  timeout -k 10 900 "${cmd[@]}" "${common[@]}" > "$work/out" 2>&1 ||
    { cat "$work/out" >&2; echo "FAILED: $name: ${cmd[*]} ${common[*]}" >&2; exit 1; }
  grep '^\[0\]<stdout>:' "$work/out" | sed 's/^\[0\]<stdout>://' > "$log"
}

# speed LOG: samples/s over epochs 1.. (samples = Speed x Time cost per epoch)
speed() {
  awk '/^Epoch\[[0-9]+\] Speed=/ {
         e = substr($1, 7) + 0; s = substr($2, 7) + 0; t = substr($5, 6) + 0
         if (e >= 1) { samples += s * t; seconds += t }
       }
       END { if (seconds > 0) printf "%.2f\n", samples / seconds; else print "nan" }' "$1"
}
# steps NP BACKEND: bench/python/mnist_steps.py in one job; prints its "steps:" line's fields (and
# its CPU time per step to stderr)
steps_job() {
  local np=$1 backend=$2
  local -a cmd=(env MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" "$hvdrun" -np "$np"
                --backend "$backend" --timeout 300 -- "$python" bench/python/mnist_steps.py
                --threads 1 --batch-size 64 --seed 42 --steps "$steps")
  echo "  + ${cmd[*]}" >&2
  timeout -k 10 900 "${cmd[@]}" > "$work/out" 2>&1 ||
    { cat "$work/out" >&2; echo "FAILED: ${cmd[*]}" >&2; exit 1; }
  sed -n 's/^\[0\]<stdout>:mnist_steps.py: \(CPU ms per step\)/    \1/p' "$work/out" >&2
  sed -n 's/^\[0\]<stdout>:steps: //p' "$work/out"
}
# field LINE NAME: the value after NAME in a "steps:" line
field() { awk -v k="$2" '{ for (i = 1; i < NF; i++) if ($i == k) print $(i + 1) }' <<< "$1"; }

accuracy() { sed -n 's/.*final validation accuracy \([0-9.]*\).*/\1/p' "$1"; }

echo "python_train_bench: $runs runs of 5 jobs, $epochs epochs each (epoch 0 untimed), batch 64 per" \
     "rank, 1 thread per rank; $("$python" -c 'import torch; print("torch", torch.__version__)'), $(nproc) cores"
: > "$work/ratios"
: > "$work/steps"
for ((r = 1; r <= runs; r++)); do
  if ((r % 2)); then order=(P1 H1 D2 G2 O2); else order=(H1 P1 O2 G2 D2); fi
  declare -A rate=() acc=()
  for name in "${order[@]}"; do
    job "$name" "$work/$name.log"
    rate[$name]=$(speed "$work/$name.log")
    acc[$name]=$(accuracy "$work/$name.log")
  done
  line=$(awk -v p1="${rate[P1]}" -v h1="${rate[H1]}" -v d2="${rate[D2]}" -v g2="${rate[G2]}" \
             -v o2="${rate[O2]}" 'BEGIN { printf "%.4f %.4f %.4f", h1 / p1, g2 / d2, o2 / d2 }')
  echo "$line ${rate[P1]} ${rate[H1]} ${rate[D2]} ${rate[G2]} ${rate[O2]}" >> "$work/ratios"
  read -r a b c <<< "$line"
  echo "run $r (${order[*]}): samples/s P1 ${rate[P1]}  H1 ${rate[H1]}  D2 ${rate[D2]}  G2 ${rate[G2]}  O2 ${rate[O2]}"
  echo "  hvd.torch 1 rank / plain PyTorch $a;  hvd.torch gloo / DDP gloo $b;  hvd.torch ofi / DDP gloo $c"
  echo "  final validation accuracy: P1 ${acc[P1]}  H1 ${acc[H1]}  D2 ${acc[D2]}  G2 ${acc[G2]}  O2 ${acc[O2]}"
  unset rate acc
  if ((steps > 0)); then
    if ((r % 2)); then backends=(gloo ofi); else backends=(ofi gloo); fi
    one=$(steps_job 1 gloo)
    declare -A two=()
    for b in "${backends[@]}"; do two[$b]=$(steps_job 2 "$b"); done
    echo "$(field "$one" hvd/bare) $(field "${two[gloo]}" hvd/ddp) $(field "${two[ofi]}" hvd/ddp)" \
         "$(field "${two[gloo]}" hvd/bare) $(field "${two[ofi]}" hvd/bare) $(field "${two[gloo]}" ddp/bare)" \
         "$(field "${two[ofi]}" ddp/bare)" >> "$work/steps"
    echo "  in one job, alternating blocks (median per-round ratios): 1 rank hvd/bare $(field "$one" hvd/bare);" \
         "2 ranks hvd gloo/DDP $(field "${two[gloo]}" hvd/ddp), hvd ofi/DDP $(field "${two[ofi]}" hvd/ddp);" \
         "hvd/bare gloo $(field "${two[gloo]}" hvd/bare), ofi $(field "${two[ofi]}" hvd/bare); DDP/bare" \
         "$(field "${two[gloo]}" ddp/bare), $(field "${two[ofi]}" ddp/bare)"
    unset two
  fi
done

# summary COL [FILE]: "median (min-max)" of that column of $work/ratios (or FILE)
summary() {
  sort -g -k"$1","$1" "${2:-$work/ratios}" | awk -v c="$1" -v whole="${2:+ratio}" '
    { v[NR] = $c }
    END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
          printf (c <= 3 || whole ? "%.3f (range %.3f-%.3f)" : "%.0f (range %.0f-%.0f)"), m, v[1], v[NR] }'
}
echo
echo "medians over $runs runs (samples/s, all ranks): P1 $(summary 4); H1 $(summary 5); D2 $(summary 6); G2 $(summary 7); O2 $(summary 8)"
echo "(a) 1 rank:  hvd.torch / plain PyTorch (1 process, no torch.distributed, same script loop):" \
     "$(summary 1)  goal >= 0.97"
echo "(b) 2 ranks: hvd.torch over gloo / PyTorch DDP over torch.distributed gloo (2 ranks):" \
     "$(summary 2)  goal >= 1.0"
echo "(c) 2 ranks: hvd.torch over ofi (shm) / PyTorch DDP over torch.distributed gloo (2 ranks):" \
     "$(summary 3)  goal >= 1.15"
if ((steps > 0)); then
  f=$work/steps
  echo
  echo "in one job, $steps steps of each kind in alternating blocks of 10 (medians over $runs runs of each run's median per-round ratio):"
  echo "(a) 1 rank:  hvd.torch / plain PyTorch SGD (bare, same process): $(summary 1 "$f")  goal >= 0.97"
  echo "(b) 2 ranks: hvd.torch over gloo / PyTorch DDP over torch.distributed gloo (same processes): $(summary 2 "$f")  goal >= 1.0"
  echo "(c) 2 ranks: hvd.torch over ofi (shm) / PyTorch DDP over torch.distributed gloo (same processes): $(summary 3 "$f")  goal >= 1.15"
  echo "    against bare SGD at 2 ranks (no exchange): hvd gloo $(summary 4 "$f"), hvd ofi $(summary 5 "$f"), DDP $(summary 6 "$f") (in the gloo jobs), $(summary 7 "$f") (in the ofi jobs)"
fi
