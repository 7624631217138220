#!/usr/bin/env python3
"""The baseline of bench/python_train_bench.sh: examples/python/mnist.py's model, data, sharding,
training loop and logs, with PyTorch's own DistributedDataParallel over torch.distributed's gloo
backend in place of hvd.torch (or, with --plain, one process and no distribution at all).

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 build/bin/hvdrun -np 2 /usr/bin/python3 \\
        bench/python/mnist_ddp.py --epochs 3
    /usr/bin/python3 bench/python/mnist_ddp.py --plain --epochs 3

The rank and world size come from hvdrun's HVD_RANK and HVD_SIZE (1 process when unset); the
rendezvous is torch.distributed's env:// (MASTER_ADDR, MASTER_PORT). hvd is imported with the
example (PYTHONPATH=build/python), never initialized.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "python"))
import mnist  # noqa: E402  (examples/python/mnist.py)


def main(argv=None):
    parser = mnist.make_parser("examples/python/mnist.py with PyTorch DDP over gloo instead of "
                               "hvd.torch (the baseline of bench/python_train_bench.sh).",
                               "mnist_ddp.py")
    parser.add_argument("--plain", action="store_true", default=False,
                        help="one process, plain PyTorch: no torch.distributed, no DDP")
    args = parser.parse_args(argv)
    mnist.check_args(parser, args)

    rank = int(os.environ.get("HVD_RANK", "0"))
    size = int(os.environ.get("HVD_SIZE", "1"))
    if args.plain and size != 1:
        parser.error("--plain runs one process (HVD_SIZE is %d)" % size)
    if not args.plain:
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            os.environ.setdefault(var, "127.0.0.1" if var == "MASTER_ADDR" else "29500")
        dist.init_process_group("gloo", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=120))
    log = mnist.Log("mnist_ddp.py", rank)
    torch.manual_seed(args.seed)
    mnist.set_threads(args.threads)

    data, error = mnist.setup_data(args, size)
    if args.plain:
        ok = error is None
        if error:
            log.error(error)
    else:
        failed = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
        dist.all_gather(failed, torch.tensor([int(error is not None)]))
        ok = mnist.report_setup([int(f) for f in failed], error, rank, log)
    if not ok:
        return 1
    train, validation = data

    net = mnist.Net()
    model = net if args.plain else DistributedDataParallel(net)  # broadcasts rank 0's weights
    optimizer = optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)

    log.info("world size %d, backend %s, device cpu, %d threads per rank"
             % (size, "none (plain PyTorch)" if args.plain else "torch.distributed gloo, DDP",
                args.threads))
    log.info("data %s: %d training, %d validation samples"
             % (args.data_dir, len(train[1]), len(validation[1])))
    log.info("model %d parameters; seed %d" % (sum(p.numel() for p in net.parameters()),
                                               args.seed))

    def metric_average(value, name):
        if args.plain:
            return value
        t = torch.tensor(value, dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / size

    accuracy = mnist.train_epochs(args, model, optimizer, train, validation, rank, size, log,
                                  metric_average)
    status = mnist.finish(args, accuracy, log)
    if args.plain:
        return status
    # torch 1.13 can deadlock tearing DDP down (its ProcessGroupGloo destructor joins a worker
    # thread that waits for the GIL the destructor holds, pytorch/pytorch#56297): it hung here
    # after training, in destroy_process_group() or at exit. The ranks meet, then leave without
    # destructors.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
