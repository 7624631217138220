#!/usr/bin/env bash
# The ofi backend's ring segments: 256 KiB on shm, 4 MiB over a network provider (tcp;ofi_rxm),
# HVD_OFI_SEGMENT_BYTES over either; what rank 0's init log says, from a 2-rank job that passes.
#
#   ofi_tuning_test.sh HVDRUN HELLO_ALLREDUCE
set -euo pipefail
hvdrun=$1 hello=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

segments_of() {  # the job's init line, after checking that the job passed
  local log
  log=$(env -u HVD_OFI_PROVIDER -u HVD_OFI_SEGMENT_BYTES HVD_LOG_LEVEL=info "$@" \
    "$hvdrun" -np 2 --backend ofi --timeout 60 -- "$hello" 2>&1) ||
    { echo "$log" >&2; fail "the job failed ($*)"; }
  echo "$log" | grep -o "ofi: provider .*" | head -1 || true
}

line=$(segments_of)
[[ "$line" == "ofi: provider shm "*"ring segments of 262144 B" ]] || fail "shm: '$line'"
line=$(segments_of "HVD_OFI_PROVIDER=tcp;ofi_rxm")
[[ "$line" == "ofi: provider tcp;ofi_rxm "*"ring segments of 4194304 B" ]] || fail "tcp: '$line'"
line=$(segments_of "HVD_OFI_PROVIDER=tcp;ofi_rxm" HVD_OFI_SEGMENT_BYTES=65536)
[[ "$line" == *"ring segments of 65536 B" ]] || fail "HVD_OFI_SEGMENT_BYTES on tcp: '$line'"
line=$(segments_of HVD_OFI_SEGMENT_BYTES=1048576)
[[ "$line" == *"ring segments of 1048576 B" ]] || fail "HVD_OFI_SEGMENT_BYTES on shm: '$line'"
echo "PASS: shm 256 KiB, tcp;ofi_rxm 4 MiB, HVD_OFI_SEGMENT_BYTES over both"
