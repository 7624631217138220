#!/usr/bin/env python3
"""hvd.torch's cost per tensor from Python: K one-element float32 tensors submitted with
hvd.allreduce_async_ under fixed names (as a backward pass hands its gradients over), then
hvd.synchronize() on each, repeated; one rank.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [--tensors 1024] [--reps 30]

Prints, per tensor, the median over the repetitions (and their range) of
  - submit:  the allreduce_async_ calls alone;
  - step:    from the first submit to the last synchronize() returning;
for the public API (hvd.torch) and for the extension's own calls beneath it (hvd.torch._ops
submit and wait, without mpi_ops.py's Python), so the Python layer's share shows. Then, unless
--no-micro, the C++ scheduler's figures from build/bin/hvd-micro --benchmark_filter=async (4 KiB
tensors, submitted through hvd::Comm in C++).

Like hvd-micro it runs on the one-rank noop backend (build/bench/plugins/libhvd-backend-noop.so,
built with hvd-micro: a copy is all it does) with HVD_CYCLE_TIME=0 (the scheduler votes as soon
as work arrives), so that what is timed is hvd's own work; --backend gloo runs on a real backend.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

import hvd.torch as hvd
from hvd.torch import mpi_ops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOOP = os.path.join(REPO, "build", "bench", "plugins", "libhvd-backend-noop.so")
MICRO = os.path.join(REPO, "build", "bin", "hvd-micro")


def public_step(tensors, names):
    t0 = time.perf_counter()
    handles = [hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(tensors, names)]
    t1 = time.perf_counter()
    for h in handles:
        hvd.synchronize(h)
    return t1 - t0, time.perf_counter() - t0


def raw_step(tensors, names):
    ops, kind, op = mpi_ops._ops, mpi_ops._Kind.allreduce, hvd.Sum
    t0 = time.perf_counter()
    handles = [ops.submit(kind, [t], [t], n, op, 0, 1.0, 1.0, [], 0, 0)
               for t, n in zip(tensors, names)]
    t1 = time.perf_counter()
    for h in handles:
        ops.wait(h)
    return t1 - t0, time.perf_counter() - t0




def show(values):
    return "%.2f us (range %.2f-%.2f)" % (statistics.median(values), min(values), max(values))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tensors", type=int, default=1024, help="tensors per step (default 1024)")
    p.add_argument("--reps", type=int, default=100, help="timed steps (default 100)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--backend", default=None, help="hvd backend (default: the noop plugin if "
                   "built, else gloo)")
    p.add_argument("--no-micro", action="store_true", help="skip hvd-micro's C++ figures")
    args = p.parse_args()
    if args.tensors < 1 or args.reps < 1 or args.warmup < 0:
        p.error("--tensors and --reps are at least 1, --warmup at least 0")
    if int(os.environ.get("HVD_SIZE", "1")) != 1:
        p.error("runs on one rank")
    backend = args.backend or (NOOP if os.path.exists(NOOP) else "gloo")
    os.environ.setdefault("HVD_CYCLE_TIME", "0")
    hvd.init(backend=backend)
    torch.set_num_threads(1)

    tensors = [torch.ones(1, dtype=torch.float32) for _ in range(args.tensors)]
    names = ["grad.%d" % k for k in range(args.tensors)]
    print("python_overhead: %d one-element float32 tensors per step, %d steps after %d warmup; "
          "backend %s, HVD_CYCLE_TIME=%s; torch %s, Python %d.%d"
          % (args.tensors, args.reps, args.warmup, hvd.backend(), os.environ["HVD_CYCLE_TIME"],
             torch.__version__, *sys.version_info[:2]))
    # The two layers take turns step by step, which goes first flipping each time, so that the
    # machine's noise falls on both alike.
    results = {"public": ([], []), "raw": ([], [])}
    for _ in range(args.warmup):
        public_step(tensors, names)
        raw_step(tensors, names)
    layers = [("public", public_step), ("raw", raw_step)]
    for rep in range(args.reps):
        for label, step in layers if rep % 2 == 0 else layers[::-1]:
            s, w = step(tensors, names)
            results[label][0].append(1e6 * s / args.tensors)
            results[label][1].append(1e6 * w / args.tensors)
    for label, what in (("public", "hvd.allreduce_async_ + hvd.synchronize"),
                        ("raw", "hvd.torch._ops.submit + _ops.wait (no mpi_ops.py)")):
        submit, whole = results[label]
        print("%-52s per tensor: submit %s; submit to completion %s"
              % (what, show(submit), show(whole)))
    py_submit = statistics.median(results["public"][0]) - statistics.median(results["raw"][0])
    print("mpi_ops.py's own share of a submit: %.2f us per tensor (median difference)" % py_submit)
    print("goal: submit <= 5 us per tensor: %s"
          % ("met" if statistics.median(results["public"][0]) <= 5 else "NOT met"))
    hvd.shutdown()

    if not args.no_micro:
        if not os.access(MICRO, os.X_OK):
            print("hvd-micro: not built (%s)" % MICRO)
            return 0
        print("C++ scheduler (hvd-micro --benchmark_filter=async, 4 KiB tensors, noop backend):")
        out = subprocess.run([MICRO, "--benchmark_filter=async"], capture_output=True, text=True,
                             check=False)
        for line in out.stdout.splitlines():
            if line.startswith("BM_async"):
                print("  " + line)
        if out.returncode != 0:
            print("  hvd-micro exited %d: %s" % (out.returncode, out.stderr.strip()[-300:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
