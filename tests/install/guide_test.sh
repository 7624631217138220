#!/usr/bin/env bash
# The SDK as a third party gets it: install hvd into a fresh prefix, then run every `sh` block of
# docs/plugin-guide.md, in order, in an empty directory (so the guide's commands are the ones
# that work). Then what the guide does not show: the installed programs need no LD_LIBRARY_PATH,
# the C++ example builds with pkg-config too, and the examples build warning-free with clang.
#
#   guide_test.sh <hvd build dir> <hvd source dir>
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "guide test FAILED: $*" >&2; exit 1; }

export HVD_PREFIX="$work/prefix"
cmake --install "$build" --prefix "$HVD_PREFIX" >/dev/null
unset HVD_PLUGIN_PATH HVD_BACKEND LD_LIBRARY_PATH

for program in "$HVD_PREFIX"/bin/* "$HVD_PREFIX"/libexec/hvd/*; do
  [[ $(head -c 4 "$program" | tail -c 3) == ELF ]] || continue
  missing=$(ldd "$program" | grep "not found" || true)
  [ -z "$missing" ] || fail "$program: $missing"
done
echo "ok: every installed program finds its libraries"

# The guide's commands, as a user would paste them, in an empty home.
awk '/^```sh$/ {inside = 1; next} /^```$/ {inside = 0} inside' "$source/docs/plugin-guide.md" \
  > "$work/guide.sh"
[ -s "$work/guide.sh" ] || fail "no sh blocks in docs/plugin-guide.md"
mkdir "$work/home"
(cd "$work/home" && bash -euxo pipefail "$work/guide.sh") || fail "a command of the guide failed"
echo "ok: every command of docs/plugin-guide.md"

cd "$work/home/my-backend"
export PATH="$HVD_PREFIX/bin:$PATH" PKG_CONFIG_PATH="$HVD_PREFIX/lib/pkgconfig"
g++ -std=c++17 -O2 -fPIC -fvisibility=hidden $(pkg-config --cflags hvd-sdk) \
    -o pc/libhvd-backend-tcpring.so tcp_ring/tcp_ring_backend.cpp \
    $(pkg-config --variable=plugin_ldflags hvd-sdk)
exported=$(nm -D --defined-only pc/libhvd-backend-tcpring.so | awk '{print $3}')
[ "$exported" = "hvd_backend_entry_v1" ] || fail "pkg-config build exports: $exported"
out=$(hvdrun -np 2 --backend "$PWD/pc/libhvd-backend-tcpring.so" pc/app)
echo "$out"
grep -q "backend tcpring" <<<"$out" || fail "the app over the pkg-config build of tcpring"
echo "ok: the C++ example with pkg-config"

# The package's version is the backend ABI's, and its rule the ABI's promise.
mkdir version-rule
for request in "" 1.0 1.1 1.2 "1.0...2.0" 1.3 0.1 2.0 "1.0...<1.2"; do
  printf 'cmake_minimum_required(VERSION 3.22)\nproject(v LANGUAGES C)\nfind_package(hvd %s QUIET)\nmessage(STATUS "found=${hvd_FOUND}")\n' \
    "$request" > version-rule/CMakeLists.txt
  found=$(cmake -S version-rule -B version-rule/build -DCMAKE_PREFIX_PATH="$HVD_PREFIX" | sed -n 's/.*found=//p')
  rm -rf version-rule/build
  case "$request" in ""|1.0|1.1|1.2|1.0...2.0) want=1 ;; *) want=0 ;; esac
  [ "$found" = "$want" ] || fail "find_package(hvd $request) found=$found, not $want"
done
pkg-config --atleast-version=1.2 hvd-sdk || fail "hvd-sdk.pc is not at ABI 1.2"
echo "ok: find_package(hvd X.Y) follows the ABI's promise"

# hvd_add_backend fails the build of a plugin whose entry is not exported (no extern "C"), and
# says what to do.
mkdir no-extern-c
printf '#include "hvd/backend.h"\nHVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) { return nullptr; }\n' \
  > no-extern-c/p.cpp
printf 'cmake_minimum_required(VERSION 3.22)\nproject(p LANGUAGES CXX)\nfind_package(hvd 1.1 REQUIRED)\nhvd_add_backend(p SOURCES p.cpp)\n' \
  > no-extern-c/CMakeLists.txt
cmake -S no-extern-c -B no-extern-c/build -G Ninja -DCMAKE_PREFIX_PATH="$HVD_PREFIX" >/dev/null
if out=$(cmake --build no-extern-c/build 2>&1); then fail "a plugin without its entry built"; fi
grep -q 'does not export hvd_backend_entry_v1: define it as extern "C"' <<<"$out" ||
  fail "the entry check said: $out"
[ ! -e no-extern-c/build/libhvd-backend-p.so ] || fail "the plugin without its entry was left"
for doc in plugin-guide.md plugin-abi.md; do
  [ -s "$HVD_PREFIX/share/doc/hvd/$doc" ] || fail "$doc is not installed"
done
echo "ok: a plugin without its entry does not build; the guide and the ABI are installed"

for example in shm_c tcp_ring single_backend; do
  CC=clang CXX=clang++ cmake -S "$HVD_PREFIX/share/hvd/examples/$example" -B "clang-$example" \
      -G Ninja -DCMAKE_PREFIX_PATH="$HVD_PREFIX" -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" \
      -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" >/dev/null
  cmake --build "clang-$example" >/dev/null || fail "$example does not build with clang"
done
echo "ok: the examples build with clang, warnings as errors"
