#!/usr/bin/env bash
# A release's layout as its frozen headers have it ($1) and as today's headers keep it ($2) must
# be identical (tests/abi/layout.c says what is compared); $3 names the release (default 1.0).
set -euo pipefail
frozen=$("$1")
now=$("$2")
release=${3:-1.0}
if ! diff <(echo "$frozen") <(echo "$now"); then
  echo "FAIL: today's headers changed the layout of ABI $release (< frozen $release, > today)" >&2
  exit 1
fi
echo "ABI $release layout unchanged: $(echo "$now" | grep -c 'offset') fields, $(echo "$now" | grep -c ' = ') values"
