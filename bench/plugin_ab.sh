#!/usr/bin/env bash
# What a change to a plugin costs: hvd-bench with the plugin from directory A, then from directory
# B (HVD_PLUGIN_PATH, searched first), K times taking turns in one session (A B, then B A, and so
# on), and per row the median time of each and B's over A's (above 1: B is slower). Taking turns
# spreads the machine's drift over both sides; the host, hvdrun and hvd-bench are the same build
# for both, and the script checks that each side loaded its own plugin file.
#
#   bench/plugin_ab.sh [options] A B [-- hvd-bench arguments]
#
#   --np N          ranks (default 2)
#   --runs K        runs of each (default 8)
#   --build DIR     where hvdrun and hvd-bench are (default build, or $HVD_BUILD)
#
# A and B are directories holding libhvd-backend-<name>.so, such as build/lib/hvd and the same
# folder of a build of an earlier commit (git worktree add ../before <commit>, then build it). The
# hvd-bench arguments default to: --backend ofi -C allreduce -b 8 -e 64M -f 4 -n 100 -c 0.
set -euo pipefail

np=2 runs=8 build=${HVD_BUILD:-build}
positional=()
value() { [ $# -ge 2 ] || { echo "plugin_ab.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case $1 in
    --np) value "$@"; np=$2; shift 2 ;;
    --runs) value "$@"; runs=$2; shift 2 ;;
    --build) value "$@"; build=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "plugin_ab.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
[ ${#positional[@]} -eq 2 ] || { echo "plugin_ab.sh: give two plugin directories (see --help)" >&2; exit 2; }
a=${positional[0]} b=${positional[1]}
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--backend ofi -C allreduce -b 8 -e 64M -f 4 -n 100 -c 0)
backend=${HVD_BACKEND:-gloo}
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --backend) backend=${args[i + 1]:-} ;;
    -J|--output_file) echo "plugin_ab.sh: the script writes the JSON itself; drop ${args[i]}" >&2; exit 2 ;;
  esac
done
case $backend in
  *,*|all|"") echo "plugin_ab.sh: give hvd-bench one --backend" >&2; exit 2 ;;
esac
plugin=libhvd-backend-$backend.so
for d in "$a" "$b"; do
  [ -f "$d/$plugin" ] || { echo "plugin_ab.sh: $d has no $plugin" >&2; exit 2; }
done
command -v jq >/dev/null || { echo "plugin_ab.sh: jq is missing" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for run in $(seq 1 "$runs"); do
  order="a b"
  [ $((run % 2)) -eq 0 ] && order="b a"
  for side in $order; do
    dir=$a
    [ "$side" = b ] && dir=$b
    HVD_PLUGIN_PATH=$dir HVD_LOG_LEVEL=info "$build/bin/hvdrun" -np "$np" "$build/bin/hvd-bench" \
      "${args[@]}" -J "$out/$side-$run.json" > "$out/$side-$run.txt" 2>&1 ||
      { echo "plugin_ab.sh: run $run of $side failed:" >&2; tail -20 "$out/$side-$run.txt" >&2; exit 1; }
    # The host logs the file it loaded: "... on backend NAME from PATH".
    loaded=$(grep -o "on backend $backend from [^ ]*" "$out/$side-$run.txt" | head -1 | sed 's/.* from //')
    if [ "$(realpath "$loaded" 2>/dev/null)" != "$(realpath "$dir/$plugin")" ]; then
      echo "plugin_ab.sh: side $side loaded '${loaded:-nothing}', not $dir/$plugin" >&2
      exit 1
    fi
  done
done

echo "# $runs runs each of: hvdrun -np $np hvd-bench ${args[*]}"
echo "# A: $a"
echo "# B: $b"
echo "# median time (us) per row; B/A above 1: B is slower"
for side in a b; do
  jq -s -c --arg side "$side" '[.[].results[] | {side: $side, backend, collective, type, size,
      oop: .out_of_place.time?, ip: .in_place.time?}]' "$out"/$side-*.json
done | jq -s -r '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
                     else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def fmt: if . == null then "n/a" else (. * 100 | round / 100 | tostring) end;
  def ratio(x; y): if x == null or y == null or x == 0 then "n/a"
                   else (y / x * 1000 | round / 1000 | tostring) end;
  add | group_by([.backend, .collective, .type, .size])[]
  | (map(select(.side == "a"))) as $a | (map(select(.side == "b"))) as $b
  | ($a | map(.oop | numbers) | median) as $ao | ($b | map(.oop | numbers) | median) as $bo
  | ($a | map(.ip | numbers) | median) as $ai | ($b | map(.ip | numbers) | median) as $bi
  | [.[0].backend, .[0].collective, .[0].type, (.[0].size | tostring),
     ($ao | fmt), ($bo | fmt), ratio($ao; $bo), ($ai | fmt), ($bi | fmt), ratio($ai; $bi)]
  | join(" ")' |
  sort -k1,1 -k2,2 -k3,3 -k4,4n |
  awk 'BEGIN { printf "%-8s %-10s %-8s %10s %9s %9s %7s %9s %9s %7s\n", "backend", "collective",
               "type", "size", "A oop", "B oop", "B/A", "A ip", "B ip", "B/A" }
       { printf "%-8s %-10s %-8s %10s %9s %9s %7s %9s %9s %7s\n", $1, $2, $3, $4, $5, $6, $7, $8,
         $9, $10 }'
