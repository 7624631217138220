#!/usr/bin/env bash
# Hierarchical allreduce against the flat one (issue 18): 2 network-namespace hosts x 2 ranks
# (scripts/netns-hosts.sh), each host's link capped by tbf, hvd-bench float allreduce in three
# configurations launched one after another, taking turns, K runs each:
#   flat  HVD_HIERARCHICAL_ALLREDUCE=0
#   seq   HVD_HIERARCHICAL_ALLREDUCE=1 HVD_HIERARCHICAL_CHUNK_BYTES=0 (the phases one after another)
#   pipe  HVD_HIERARCHICAL_ALLREDUCE=1, pipelined in HVD_HIERARCHICAL_CHUNK_BYTES chunks (--chunk)
# and prints per size each configuration's median busbw over the runs and the ratios seq/flat and
# pipe/flat (issue 18: >= 1.25 and >= 1.4; 1.5 is the bound), for each backend.
#
#   bench/hierarchical_bench.sh [options] [-- hvd-bench arguments]
#   bench/hierarchical_bench.sh --backend gloo,mpi --runs 3
#   bench/hierarchical_bench.sh --backend gloo --chunk default,1M,16M -- -b 16M -e 64M -f 4
#   bench/hierarchical_bench.sh --phases --backend mpi [-- --bytes N --iters K]
#
#   --bin DIR        where hvdrun and hvd-bench are (default build/bin)
#   --backend LIST   gloo, mpi or gloo,mpi (default gloo,mpi)
#   --runs K         runs of each configuration (default 3)
#   --chunk LIST     pipelined chunk sizes (bytes, K/M suffixes), one pipe configuration each;
#                    "default" leaves HVD_HIERARCHICAL_CHUNK_BYTES unset (default: default)
#   --rate RATE      tbf cap on each host's link (default 1gbit; "" for none)
#   --tbf 'PARAMS'   the tbf's other parameters instead of scripts/netns-hosts.sh's
#                    ("burst 256kb latency 50ms"), e.g. 'burst 1mb latency 50ms'
#   --map-by WHAT    slot: ranks 0,1 on host a and 2,3 on host b, so the flat ring in rank
#                    order crosses between hosts twice (1.5 N out of each host); node: round
#                    robin, every hop crosses (default slot)
#   --env 'N=V ...'  more environment for every rank of every run (e.g. HVD_PLUGIN_PATH=DIR)
#   --mpi-args 'A'   more mpirun arguments
#   --out DIR        keep every run's JSON and text there (default: a temporary directory)
#   --report DIR     print the tables of the runs kept in DIR, run nothing
#   --phases         on the same hosts, run hvd-hierarchical-phases once per backend instead (the
#                    phases timed one by one; the arguments after -- are its own); --env
#                    HVD_HIERARCHICAL_ALLREDUCE=1 makes its world allreduce hierarchical
#
# hvd-bench arguments default to -b 64M -e 64M -n 5 -w 1; the script adds -C allreduce -d float
# -c 1 (every row checked on exact integer data, hvd's result and the direct one) and --baseline
# (the library's own flat allreduce timed call by call beside hvd's: "dir" below). Needs root.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/bin backends=gloo,mpi runs=3 rate=1gbit chunks=default map_by=slot out=""
extra_env="" tbf="" more_mpi_args="" report="" phases=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --backend) backends=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --chunk) chunks=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --tbf) tbf=$2; shift 2 ;;
    --map-by) map_by=$2; shift 2 ;;
    --env) extra_env=$2; shift 2 ;;
    --mpi-args) more_mpi_args=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --phases) phases=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "hierarchical_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v jq >/dev/null || { echo "hierarchical_bench.sh: jq is missing" >&2; exit 1; }

# The tables of the runs in $1: every backend-config-run.json there; the configurations in the
# order of $1/configs.
report() {
  local dir=$1 backend c files wrong
  local configs
  read -r -a configs <"$dir/configs"
  # Identical results: every row's hvd result and direct result checked, no wrong element anywhere.
  wrong=$(cat "$dir"/*-*-*.json | jq -s '[.[].results[] | (.out_of_place.nwrong, .in_place.nwrong,
            .direct.out_of_place.nwrong, .direct.in_place.nwrong) | select(. != null)] |
            if length == 0 then "unchecked" else add end')
  files=$(find "$dir" -name '*-*-*.json' | wc -l)
  echo "# $files runs, every row checked (hvd and direct, out of place and in place) on exact integer data: $wrong wrong elements"
  for backend in $(find "$dir" -name '*-*-*.json' -printf '%f\n' | cut -d- -f1 | sort -u); do
    for c in "${configs[@]}"; do
      for f in "$dir/$backend-$c"-*.json; do
        [ -e "$f" ] && jq --arg c "$c" '. + {config: $c}' "$f"
      done
    done >"$dir/$backend.all"
    echo "#"
    echo "# $backend: busbw (GB/s), each configuration's median over its runs; ratios = hierarchical / flat"
    echo "# (issue 18: seq/flat >= 1.25, pipe/flat >= 1.4; 1.5 is the bound). dir: the library's own flat"
    echo "# allreduce timed call by call beside hvd's in every run (median over all of them); X/dir: hvd-bench's"
    echo "# hvd/dir within each run of X (per-call medians, alternating), the median over X's runs"
    jq -n -r --slurpfile all "$dir/$backend.all" --arg configs "${configs[*]}" '
      def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
                         else (.[length / 2 - 1] + .[length / 2]) / 2 end;
      def f3: if . == null then "N/A" else . * 1000 | round / 1000 | tostring end;
      ($configs | split(" ")) as $cs |
      (["size(B)", "placement"] + $cs + ["dir"] + ($cs[1:] | map(. + "/" + $cs[0])) +
        ($cs[1:] | map(. + "/dir")) | join(" ")),
      ([$all[] | .results[] | .size] | unique[]) as $size |
      ("out_of_place", "in_place") as $p |
      ($cs | map(. as $c | [$all[] | select(.config == $c) | .results[] | select(.size == $size)
                            | .[$p].bus_bw // empty] | median)) as $bw |
      ([$all[] | .results[] | select(.size == $size) | .direct[$p].bus_bw // empty] | median) as $dir |
      ($cs[1:] | map(. as $c | [$all[] | select(.config == $c) | .results[] | select(.size == $size)
                                | .direct["ratio_" + $p] // empty] | median)) as $within |
      [($size | tostring), $p] + ($bw | map(f3)) + [$dir | f3] +
        ($bw[1:] | map(if . == null or $bw[0] == null then "N/A" else . / $bw[0] | f3 end)) +
        ($within | map(f3))
      | join(" ")' | awk '{ for (i = 1; i <= NF; i++) printf "%s%*s", (i > 1 ? "  " : ""), (i <= 2 ? -12 : 8), $i; print "" }'
    # The spread behind each median: every run's busbw, out of place.
    jq -n -r --slurpfile all "$dir/$backend.all" --arg configs "${configs[*]}" '
      ($configs | split(" "))[] as $c |
      ([$all[] | .results[] | .size] | unique[]) as $size |
      [$all[] | select(.config == $c) | .results[] | select(.size == $size) | .out_of_place.bus_bw
       | . * 1000 | round / 1000] |
      select(length > 0) | "# \($c) at \($size) B, out of place, run by run: \(map(tostring) | join(" "))"'
  done
  [ "$wrong" = 0 ] || { echo "hierarchical_bench.sh: wrong results ($wrong)" >&2; return 1; }
}
if [ -n "$report" ]; then
  report "$report"
  exit
fi

args=("$@")
if [ "$phases" = 1 ]; then
  program=hvd-hierarchical-phases
else
  program=hvd-bench
  [ ${#args[@]} -gt 0 ] || args=(-b 64M -e 64M -n 5 -w 1)
  args+=(-C allreduce -d float -c 1 --baseline)
fi
if [ ! -x "$bin/hvdrun" ] || [ ! -x "$bin/$program" ]; then
  echo "no hvdrun or $program in $bin (--bin)" >&2
  exit 1
fi
case $map_by in slot|node) ;; *) echo "--map-by: slot or node" >&2; exit 2 ;; esac

bytes() {  # 4M -> 4194304
  local v=$1
  case $v in
    *[kK]) echo $((${v%?} * 1024)) ;;
    *[mM]) echo $((${v%?} * 1048576)) ;;
    *[gG]) echo $((${v%?} * 1073741824)) ;;
    *) echo "$v" ;;
  esac
}
configs=(flat seq)
declare -A env_of=([flat]="HVD_HIERARCHICAL_ALLREDUCE=0"
                   [seq]="HVD_HIERARCHICAL_ALLREDUCE=1 HVD_HIERARCHICAL_CHUNK_BYTES=0")
for c in ${chunks//,/ }; do
  if [ "$c" = default ]; then
    configs+=(pipe)
    env_of[pipe]="HVD_HIERARCHICAL_ALLREDUCE=1"
  else
    configs+=("pipe$c")
    env_of["pipe$c"]="HVD_HIERARCHICAL_ALLREDUCE=1 HVD_HIERARCHICAL_CHUNK_BYTES=$(bytes "$c")"
  fi
done

# shellcheck source=../scripts/netns-hosts.sh
source "$root/scripts/netns-hosts.sh"
netns_hosts_up 2 "$rate" || { echo "SKIPPED: see above"; exit 77; }
if [ -n "$rate" ] && [ -n "$tbf" ]; then
  for h in a b; do
    ns=$(netns_host "$h")
    # shellcheck disable=SC2086
    ip netns exec "$ns" tc qdisc replace dev "v$ns" root tbf rate "$rate" $tbf
  done
fi
if [ -z "$out" ]; then
  out=$(mktemp -d)
  keep_out=0
else
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  keep_out=1
fi
trap 'netns_hosts_down; [ "$keep_out" = 1 ] || rm -rf "$out"' EXIT
echo "${configs[*]}" >"$out/configs"
# The hostfile gives each host 2 slots; netns-hosts.sh maps by node (one rank per host first).
mpi_args=$NETNS_MPI_ARGS
[ "$map_by" = node ] || mpi_args=${mpi_args/--map-by node/--map-by slot}
[[ $mpi_args == *"--map-by $map_by "* ]] || { echo "cannot map by $map_by: $mpi_args" >&2; exit 1; }
mpi_args="$mpi_args $more_mpi_args"
a=$(netns_host a)

echo "# 2 hosts (network namespaces) x 2 ranks on $NETNS_SUBNET.0/24, map-by $map_by"
[ -z "$rate" ] || echo "# each host's link: $(ip netns exec "$a" tc qdisc show dev "v$a")"
echo "# $(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $program ${args[*]}"
if [ "$phases" = 1 ]; then
  for backend in ${backends//,/ }; do
    x=""
    for e in $extra_env; do x="$x -x $e"; done
    echo "# $backend (load $(cut -d' ' -f1 /proc/loadavg))"
    ip netns exec "$a" "$bin/hvdrun" -np 4 --hostfile "$NETNS_HOSTFILE" --backend "$backend" \
      --mpi-args "$mpi_args $x" -- "$bin/$program" "${args[@]}" 2>&1 | sed 's/^\[1,0\]<stdout>://'
  done
  exit
fi
for c in "${configs[@]}"; do echo "# $c: ${env_of[$c]}"; done
[ -z "$extra_env" ] || echo "# every run: $extra_env"
for backend in ${backends//,/ }; do
  for i in $(seq 1 "$runs"); do
    # Taking turns: run i starts with configuration i - 1 (mod their number).
    n=${#configs[@]}
    for ((j = 0; j < n; j++)); do
      c=${configs[$(((i - 1 + j) % n))]}
      x="-x HVD_LOG_LEVEL=info"
      for e in ${env_of[$c]} $extra_env; do x="$x -x $e"; done
      echo "# $backend run $i: $c (load $(cut -d' ' -f1 /proc/loadavg))" >&2
      f=$out/$backend-$c-$i
      ip netns exec "$a" "$bin/hvdrun" -np 4 --hostfile "$NETNS_HOSTFILE" --backend "$backend" \
        --mpi-args "$mpi_args $x" -- "$bin/hvd-bench" "${args[@]}" -J "$f.json" >"$f.txt" 2>&1 || {
        cat "$f.txt" >&2
        echo "hierarchical_bench.sh: $backend run $i ($c) failed" >&2
        exit 1
      }
      # The hierarchical configurations must really run hierarchical on every rank.
      engaged=$(grep -c 'hierarchical allreduce: 2 ranks within each of 2 hosts' "$f.txt" || true)
      want=4
      [ "$c" != flat ] || want=0
      if [ "$engaged" -ne "$want" ]; then
        cat "$f.txt" >&2
        echo "hierarchical_bench.sh: $backend run $i ($c): $engaged ranks hierarchical, not $want" >&2
        exit 1
      fi
    done
  done
done
report "$out"
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$keep_out" = 0 ] || echo "# runs kept in $out"
