#!/usr/bin/env python3
"""Training steps of examples/python/mnist.py three ways in one job, in alternating blocks, so
that this shared machine's slow spells fall on all three alike (hvd-mnist --compare-bare's
method, with PyTorch DDP beside it):

  bare  plain SGD on each rank's own batches: no gradient exchange at all
  hvd   hvd.torch's DistributedOptimizer (the backend hvdrun's --backend names)
  ddp   PyTorch DistributedDataParallel over torch.distributed's gloo backend

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 PYTHONPATH=build/python \\
        build/bin/hvdrun -np 2 --backend ofi /usr/bin/python3 bench/python/mnist_steps.py

Each kind has its own copy of the model (the same initial weights) and optimizer; all three
walk the same shard of the first epoch's shuffle. After --warmup steps of each, every round runs
a block of --block steps of each kind, the kinds' order rotating from round to round, each
block ended by a barrier (torch.distributed's, the same for all three) so that it times the
slowest rank. Rank 0 prints each kind's samples/s over all its blocks and, per pair of kinds,
the median and range of the per-round ratios, each kind's CPU time per step on rank 0 (its
training thread, and all its other threads together: the libraries' communication threads,
which on a machine whose cores the ranks' training threads fill take their time from training),
then one line for scripts:
  steps: size N backend B bare R hvd R ddp R hvd/bare M hvd/ddp M ddp/bare M
(R samples/s over all ranks; M the median per-round ratio of samples/s).
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "python"))
import mnist  # noqa: E402  (examples/python/mnist.py)

hvd = mnist.hvd

KINDS = ("bare", "hvd", "ddp")


def main(argv=None):
    parser = mnist.make_parser("examples/python/mnist.py's steps: bare, hvd.torch and DDP in "
                               "alternating blocks in one job.", "mnist_steps.py")
    parser.add_argument("--steps", type=int, default=150, help="timed steps of each kind "
                        "(default %(default)s)")
    parser.add_argument("--block", type=int, default=10, help="steps per block (default "
                        "%(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps of each kind "
                        "first (default %(default)s)")
    args = parser.parse_args(argv)
    mnist.check_args(parser, args)
    if args.steps < 1 or args.block < 1 or args.warmup < 0:
        parser.error("--steps and --block are at least 1, --warmup at least 0")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=size)
    log = mnist.Log("mnist_steps.py", rank)
    mnist.set_threads(args.threads)

    data, error = mnist.setup_data(args, size)
    failed = hvd.allgather(torch.tensor([int(error is not None)]), name="setup.failed")
    if not mnist.report_setup(failed.tolist(), error, rank, log):
        return 1
    (images, labels), _ = data
    shard, batches = mnist.epoch_shard(len(labels), size, rank, args.batch_size, args.seed, 0)

    models, optimizers = {}, {}
    for kind in KINDS:
        torch.manual_seed(args.seed)
        net = mnist.Net()
        lr = args.lr * size
        if kind == "bare":
            models[kind] = net
            optimizers[kind] = optim.SGD(net.parameters(), lr=lr, momentum=args.momentum)
        elif kind == "hvd":
            hvd.broadcast_parameters(net.state_dict(), root_rank=0)
            sgd = optim.SGD(net.parameters(), lr=lr, momentum=args.momentum)
            hvd.broadcast_optimizer_state(sgd, root_rank=0)
            models[kind] = net
            optimizers[kind] = hvd.DistributedOptimizer(sgd,
                                                        named_parameters=net.named_parameters())
        else:
            models[kind] = DistributedDataParallel(net)
            optimizers[kind] = optim.SGD(models[kind].parameters(), lr=lr,
                                         momentum=args.momentum)
    next_batch = dict.fromkeys(KINDS, 0)
    cpu = {k: [0.0, 0.0] for k in KINDS}  # seconds: the training thread's, the process's

    def run(kind, steps):
        model, optimizer = models[kind], optimizers[kind]
        thread_cpu, process_cpu = time.thread_time(), time.process_time()
        for _ in range(steps):
            b = next_batch[kind] % batches
            next_batch[kind] += 1
            index = shard[b * args.batch_size:(b + 1) * args.batch_size]
            optimizer.zero_grad()
            F.nll_loss(model(images.index_select(0, index)),
                       labels.index_select(0, index)).backward()
            optimizer.step()
        dist.barrier()
        cpu[kind][0] += time.thread_time() - thread_cpu
        cpu[kind][1] += time.process_time() - process_cpu

    log.info("world size %d, hvd backend %s, DDP over torch.distributed gloo, %d threads per "
             "rank; %d steps of each kind in blocks of %d after %d warmup steps of each; batch "
             "%d per rank" % (size, hvd.backend(), args.threads, args.steps, args.block,
                              args.warmup, args.batch_size))
    for kind in KINDS:
        run(kind, args.warmup)
        cpu[kind] = [0.0, 0.0]
    seconds = dict.fromkeys(KINDS, 0.0)
    rounds = []  # per round: kind -> samples/s
    done, r = 0, 0
    while done < args.steps:
        block = min(args.block, args.steps - done)
        order = KINDS[r % 3:] + KINDS[:r % 3]
        rates = {}
        for kind in order:
            t = time.perf_counter()
            run(kind, block)
            elapsed = time.perf_counter() - t
            seconds[kind] += elapsed
            rates[kind] = block * args.batch_size * size / elapsed
        rounds.append(rates)
        done += block
        r += 1
    rate = {k: args.steps * args.batch_size * size / seconds[k] for k in KINDS}

    def ratio(a, b):
        values = sorted(x[a] / x[b] for x in rounds)
        return statistics.median(values), values[0], values[-1]

    log.info("samples/s over all blocks: " + "  ".join("%s %.2f" % (k, rate[k]) for k in KINDS))
    pairs = (("hvd", "bare"), ("hvd", "ddp"), ("ddp", "bare"))
    for a, b in pairs:
        log.info("per round %s/%s: median %.4f (range %.4f-%.4f) over %d rounds"
                 % ((a, b) + ratio(a, b) + (len(rounds),)))
    per_step = {k: (cpu[k][0] * 1e3 / args.steps, (cpu[k][1] - cpu[k][0]) * 1e3 / args.steps)
                for k in KINDS}
    log.info("CPU ms per step on rank 0, training thread + other threads: "
             + "  ".join("%s %.2f + %.2f" % ((k,) + per_step[k]) for k in KINDS))
    log("steps: size %d backend %s " % (size, hvd.backend())
        + " ".join("%s %.2f" % (k, rate[k]) for k in KINDS) + " "
        + " ".join("%s/%s %.4f" % (a, b, ratio(a, b)[0]) for a, b in pairs))
    # As in mnist_ddp.py: leave without DDP's destructors (pytorch/pytorch#56297), hvd's too.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
