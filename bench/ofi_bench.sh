#!/usr/bin/env bash
# The libfabric backend's goals as one command (docs/performance.md, "libfabric"): K runs of each,
# taking turns, and the median of each ratio (every ratio comes from one job).
#
#   bench/ofi_bench.sh [--runs K] [--bin DIR] [--out DIR] [--no-hosts]
#
#   1. 2 ranks on shm, 64 MiB float32 allreduce: ofi's busbw over hvd's mpi backend's (the
#      --compare column), over MPI_Allreduce called directly, and over the memcpy bandwidth that
#      hvd-bench measured in the same job (one thread alone, and each rank's with both ranks
#      copying at once: they share the memory); out of place and in place. Then the same job with
#      the buffers and the memcpy on huge pages (--huge-pages; the keys end in _huge), the two
#      jobs taking turns at going first.
#   2. 2 ranks, 8 B allreduce, OSU-style: ofi's p50 over MPI_Allreduce's p50 (lower is better);
#      each rank bound to a core (--bind-to core, as mpirun binds 2 ranks by default), 100000
#      calls: unbound, the kernel sometimes puts both ranks on one vCPU for a while. Then
#      hvd-ofi-floor: the same exchange on libfabric alone, hvd's ofi and MPI_Allreduce, call by
#      call: libfabric alone over MPI_Allreduce (the floor libfabric's provider sets), ofi
#      through hvd over libfabric alone (what hvd adds), and ofi over MPI_Allreduce in that loop.
#   3. 3 network-namespace hosts on tcp;ofi_rxm, links not capped, 1-64 MiB: ofi's busbw over
#      Gloo's: per run the smallest and the median ratio over the sizes, in and out of place;
#      over the runs, each size's median ratio, and the smallest of those. Needs root;
#      --no-hosts leaves it out.
# Each job's JSON is kept in --out (default: a temporary directory, printed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/bin
runs=3
out=""
hosts=1
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-hosts) hosts=0; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ofi_bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out=$(mktemp -d /tmp/ofi-bench.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "# ofi_bench: $runs runs of each goal; JSON in $out"

median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ratios=$out/ratios.txt
: > "$ratios"
: > "$out/hosts3-rows.txt"

for i in $(seq 1 "$runs"); do
  # The two page sizes take turns at going first.
  order="4k huge"
  [ $((i % 2)) = 0 ] && order="huge 4k"
  for pages in $order; do
    flag=() suffix=""
    [ "$pages" = huge ] && flag=(--huge-pages) suffix=_huge
    "$bin/hvdrun" --mpi -np 2 "$bin/hvd-bench" --backend ofi,mpi --compare mpi --baseline \
      -b 64M -e 64M "${flag[@]}" -J "$out/shm64M-$pages-$i.json" > "$out/shm64M-$pages-$i.txt"
    jq -r --arg s "$suffix" '(.limits.memcpy_GBps) as $m | (.limits.memcpy_all_ranks_GBps) as $a
           | ([.results[] | select(.backend == "mpi")][0]) as $mpi
           | .results[] | select(.backend == "ofi")
           | "vs_mpi_backend_oop\($s) \(.compare.ratio_out_of_place)\nvs_mpi_backend_ip\($s) \(.compare.ratio_in_place)\nvs_MPI_Allreduce_oop\($s) \(.out_of_place.bus_bw / $mpi.direct.out_of_place.bus_bw)\nvs_MPI_Allreduce_ip\($s) \(.in_place.bus_bw / $mpi.direct.in_place.bus_bw)\nvs_memcpy_oop\($s) \(.out_of_place.bus_bw / $m)\nvs_memcpy_ip\($s) \(.in_place.bus_bw / $m)\(if $a == null then "" else "\nvs_memcpy_all_ranks_oop\($s) \(.out_of_place.bus_bw / $a)\nvs_memcpy_all_ranks_ip\($s) \(.in_place.bus_bw / $a)" end)"' \
      "$out/shm64M-$pages-$i.json" >> "$ratios"
  done

  "$bin/hvdrun" --mpi -np 2 --mpi-args "--bind-to core" "$bin/hvd-bench" --backend ofi,mpi \
    --baseline --latency -b 8 -e 8 -n 100000 -w 1000 -J "$out/lat8-$i.json" > "$out/lat8-$i.txt"
  jq -r '([.results[] | select(.backend == "mpi")][0].direct.latency_us.p50) as $d
         | .results[] | select(.backend == "ofi") | "p50_over_MPI_Allreduce \(.latency_us.p50 / $d)"' \
    "$out/lat8-$i.json" >> "$ratios"
  "$bin/hvdrun" --mpi -np 2 --mpi-args "--bind-to core" "$bin/hvd-ofi-floor" -b 8 -n 100000 \
    -w 1000 | sed 's/^\[[0-9,]*\]<stdout>://' > "$out/floor8-$i.txt"
  awk '$1 == "exchange_over_MPI_Allreduce" {print "libfabric_alone_over_MPI_Allreduce", $2}
       $1 == "hvd_ofi_over_exchange" {print "hvd_ofi_over_libfabric_alone", $2}
       $1 == "hvd_ofi_over_MPI_Allreduce" {print "same_loop_ofi_over_MPI_Allreduce", $2}' \
    "$out/floor8-$i.txt" >> "$ratios"

  if [ "$hosts" = 1 ]; then
    "$root/bench/netns_bench.sh" --bin "$bin" --hosts 3 -- --backend ofi,gloo --compare gloo \
      -b 1M -e 64M -f 4 -J "$out/hosts3-$i.json" > "$out/hosts3-$i.txt"
    jq -r '[.results[] | select(.backend == "ofi") | .compare.ratio_out_of_place, .compare.ratio_in_place]
           | "three_hosts_min_vs_gloo \(min)\nthree_hosts_median_vs_gloo \(sort | (.[3] + .[4]) / 2)"' \
      "$out/hosts3-$i.json" >> "$ratios"
    jq -r '.results[] | select(.backend == "ofi") | .size as $size
           | (.compare.ratio_out_of_place // empty | "row \($size)_oop \(.)"),
             (.compare.ratio_in_place // empty | "row \($size)_ip \(.)")' \
      "$out/hosts3-$i.json" >> "$out/hosts3-rows.txt"
  fi
done

echo "# goal                                       median   (runs)"
if [ -s "$out/hosts3-rows.txt" ]; then
  # Each size's median over the runs; the smallest of them.
  for row in $(awk '{print $2}' "$out/hosts3-rows.txt" | sort -u); do
    awk -v r="$row" '$2 == r {print $3}' "$out/hosts3-rows.txt" | median
  done | sort -g | head -1 | sed 's/^/three_hosts_smallest_row_median /' >> "$ratios"
fi

for key in vs_mpi_backend_oop vs_mpi_backend_ip vs_MPI_Allreduce_oop vs_MPI_Allreduce_ip \
           vs_memcpy_oop vs_memcpy_ip vs_memcpy_all_ranks_oop vs_memcpy_all_ranks_ip \
           vs_mpi_backend_oop_huge vs_mpi_backend_ip_huge vs_MPI_Allreduce_oop_huge \
           vs_MPI_Allreduce_ip_huge vs_memcpy_oop_huge vs_memcpy_ip_huge \
           vs_memcpy_all_ranks_oop_huge vs_memcpy_all_ranks_ip_huge \
           p50_over_MPI_Allreduce libfabric_alone_over_MPI_Allreduce \
           hvd_ofi_over_libfabric_alone same_loop_ofi_over_MPI_Allreduce three_hosts_min_vs_gloo \
           three_hosts_median_vs_gloo three_hosts_smallest_row_median; do
  values=$(awk -v k="$key" '$1 == k {printf "%.3f\n", $2}' "$ratios")
  [ -n "$values" ] || continue
  printf "%-44s %6s   (%s)\n" "$key" "$(echo "$values" | median)" "$(echo "$values" | tr '\n' ' ' | sed 's/ $//')"
done
