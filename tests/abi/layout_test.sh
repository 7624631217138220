#!/usr/bin/env bash
# The ABI 1.0 layout as the frozen headers have it ($1) and as today's headers keep it ($2) must
# be identical (tests/abi/layout.c says what is compared).
set -euo pipefail
frozen=$("$1")
now=$("$2")
if ! diff <(echo "$frozen") <(echo "$now"); then
  echo "FAIL: today's headers changed the layout of ABI 1.0 (< frozen 1.0, > today)" >&2
  exit 1
fi
echo "ABI 1.0 layout unchanged: $(echo "$now" | grep -c 'offset') fields, $(echo "$now" | grep -c ' = ') values"
