#!/usr/bin/env bash
# Install hvd into a fresh prefix, build the SDK example out of tree against it with
# find_package(hvd), and check that the installed tree works without any variable set:
# the installed libhvd finds the installed gloo plugin, and the third-party plugin loads
# through HVD_PLUGIN_PATH. Also checks that every plugin exports its entry symbol only.
#
#   install_test.sh <hvd build dir> <hvd source dir>
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$source/sdk/examples/single_backend" -B "$work/example" -G Ninja \
      -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/example" >/dev/null

fail() { echo "install test FAILED: $*" >&2; exit 1; }

for plugin in "$work"/prefix/lib/hvd/libhvd-backend-*.so "$work/example/libhvd-backend-single.so"; do
  exported=$(nm -D --defined-only "$plugin" | awk '{print $3}')
  [ "$exported" = "hvd_backend_entry_v1" ] || fail "$plugin exports: $exported"
  echo "ok: $(basename "$plugin") exports hvd_backend_entry_v1 only"
done

env -u HVD_PLUGIN_PATH "$work/prefix/bin/hvd-info" | tee "$work/info.txt"
grep -q "^  gloo " "$work/info.txt" || fail "installed hvd-info does not list gloo"

out=$(env -u HVD_BACKEND -u HVD_PLUGIN_PATH "$work/prefix/bin/hvdrun" -np 2 "$work/example/single_app")
echo "$out"
grep -q "rank 1: backend gloo, allreduce = 3" <<<"$out" || fail "installed gloo job"

out=$(HVD_BACKEND=single HVD_PLUGIN_PATH="$work/example" "$work/example/single_app")
echo "$out"
grep -q "rank 0: backend single, allreduce = 1" <<<"$out" || fail "third-party plugin job"

out=$(HVD_BACKEND=single HVD_PLUGIN_PATH="$work/example" "$work/prefix/bin/hvdrun" -np 2 \
      "$work/example/single_app" 2>&1) && fail "a 2-rank job on 'single' should fail"
grep -q "the 'single' backend runs one-process jobs only" <<<"$out" || fail "init message: $out"
echo "ok: install tree, find_package(hvd), out-of-tree plugin"
