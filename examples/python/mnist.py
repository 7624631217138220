#!/usr/bin/env python3
"""Data-parallel MNIST with hvd.torch, Horovod's PyTorch API over hvd.

    scripts/make-mnist.sh
    PYTHONPATH=build/python build/bin/hvdrun -np 2 /usr/bin/python3 examples/python/mnist.py

The script has the shape of Horovod's examples/pytorch/pytorch_mnist.py: hvd.init(), one
thread per rank, the learning rate scaled by hvd.size(), rank 0's parameters and optimizer
state broadcast, the optimizer wrapped in hvd.DistributedOptimizer, metrics averaged with
hvd.allreduce. It trains hvd-mnist's network (train/mnist/main.cpp) on the same idx files with
the same defaults, and rank 0 logs in hvd-mnist's format.

The model, the data reader, the sharding and the training loop are plain PyTorch and NumPy;
importing this file runs nothing (hvd.torch is imported, not initialized), so
bench/python/mnist_ddp.py trains the same model on the same data with PyTorch's
DistributedDataParallel.
"""
import argparse
import ctypes
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import hvd.torch as hvd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DATA_DIR = os.path.join(REPO, "build", "data", "mnist-digits")
MEAN, STD = 0.1307, 0.3081   # the usual MNIST normalization: (x / 255 - MEAN) / STD
EVAL_BATCH = 250     # one thread evaluated the 1,996 digits in 0.47 s so, 1.9-2.4 s in batches of 1000


class DataError(Exception):
    """A missing or malformed idx file; the message names it."""


# ---- The network: hvd-mnist's (440,812 parameters) ---------------------------------------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, kernel_size=5)
        self.conv2 = nn.Conv2d(20, 50, kernel_size=5)
        self.fc1 = nn.Linear(800, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):                               # [n, 1, 28, 28]
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)      # [n, 20, 12, 12]
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)      # [n, 50, 4, 4]
        x = F.relu(self.fc1(x.flatten(1)))              # [n, 512]
        return F.log_softmax(self.fc2(x), dim=1)        # [n, 10]


# ---- Data: the standard idx files, plain or gzipped --------------------------------------------

def _read_idx(path, magic, dims):
    """The body of an idx file of unsigned bytes with `dims` dimensions, as a NumPy array."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:  # gzip raises these for corrupt or truncated streams
        raise DataError("%s: cannot read: %s" % (path, e)) from None
    header = 4 * (1 + dims)
    if len(raw) < header:
        raise DataError("%s: truncated: %d bytes, shorter than the %d-byte header of an idx file"
                        % (path, len(raw), header))
    words = struct.unpack(">%dI" % (1 + dims), raw[:header])
    if words[0] != magic:
        raise DataError("%s: not an idx file of %d dimension(s): magic number 0x%08x, expected "
                        "0x%08x" % (path, dims, words[0], magic))
    shape = words[1:]
    expected = int(np.prod(shape, dtype=np.int64))
    if shape[0] == 0:
        raise DataError("%s: holds no samples" % path)
    if len(raw) - header != expected:
        raise DataError("%s: its header announces %s (%d bytes) but %d bytes follow"
                        % (path, "x".join(map(str, shape)), expected, len(raw) - header))
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find(data_dir, name):
    for candidate in (name, name + ".gz"):
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return path
    raise DataError("'%s' has no %s (nor %s.gz): run scripts/make-mnist.sh (it writes "
                    "build/data/mnist-digits) or point --data-dir at MNIST or Fashion-MNIST idx "
                    "files" % (data_dir, name, name))


def load_split(data_dir, prefix, limit=0):
    """(images float32 [n, 1, 28, 28] normalized, labels int64 [n]) of `prefix` (train, t10k);
    limit > 0 keeps the first `limit` samples."""
    images_path = _find(data_dir, prefix + "-images-idx3-ubyte")
    labels_path = _find(data_dir, prefix + "-labels-idx1-ubyte")
    images = _read_idx(images_path, 0x803, 3)
    labels = _read_idx(labels_path, 0x801, 1)
    if images.shape[1:] != (28, 28):
        raise DataError("%s: images are %dx%d, expected 28x28" % ((images_path,) + images.shape[1:]))
    if len(images) != len(labels):
        raise DataError("%s holds %d images but %s holds %d labels"
                        % (images_path, len(images), labels_path, len(labels)))
    if labels.max() > 9:
        raise DataError("%s: label %d at index %d is not a class 0-9"
                        % (labels_path, labels.max(), int(labels.argmax())))
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0).sub_(MEAN).div_(STD)
    return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def load_mnist(data_dir, train_limit=0, val_limit=0):
    if not os.path.isdir(data_dir):
        raise DataError("data directory '%s' %s: run scripts/make-mnist.sh (it writes "
                        "build/data/mnist-digits) or point --data-dir at MNIST or Fashion-MNIST "
                        "idx files" % (data_dir, "is not a directory" if os.path.exists(data_dir)
                                       else "does not exist"))
    return load_split(data_dir, "train", train_limit), load_split(data_dir, "t10k", val_limit)


def epoch_shard(n, size, rank, batch, seed, epoch):
    """This rank's training indices for the epoch, and the steps every rank takes: one
    permutation seeded by (seed, epoch), the same on every rank; rank r takes the r-th of
    `size` equal contiguous slices of its first size * steps * batch entries (the remainder,
    fewer than size * batch samples, is dropped this epoch)."""
    steps = n // (size * batch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    length = steps * batch
    return torch.from_numpy(perm[rank * length:(rank + 1) * length]), steps


# ---- Threads, evaluation, logs -----------------------------------------------------------------

def set_threads(threads):
    """torch.set_num_threads sets OpenMP's threads, not OpenBLAS's: Debian's torch does its
    matrix products in OpenBLAS (libblas.so.3), whose own pool would take every core."""
    torch.set_num_threads(threads)
    with open("/proc/self/maps") as maps:
        libs = {line.split()[-1] for line in maps if "openblas" in line and ".so" in line}
    for lib in libs:
        try:
            ctypes.CDLL(lib).openblas_set_num_threads(threads)
        except (OSError, AttributeError):
            pass


def evaluate(model, images, labels):
    """The fraction of the set the model classifies right."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for begin in range(0, len(labels), EVAL_BATCH):
            out = model(images[begin:begin + EVAL_BATCH])
            correct += int(out.argmax(1).eq(labels[begin:begin + EVAL_BATCH]).sum())
    model.train()
    return correct / len(labels)


def make_parser(description, prog):
    """The options this script and bench/python/mnist_ddp.py share (hvd-mnist's defaults)."""
    p = argparse.ArgumentParser(description=description, prog=prog)
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                   help="MNIST/Fashion-MNIST idx files, plain or .gz (default %(default)s, "
                        "written by scripts/make-mnist.sh)")
    p.add_argument("--epochs", type=int, default=5, help="passes over the training set "
                   "(default %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch on each rank "
                   "(default %(default)s)")
    p.add_argument("--lr", type=float, default=0.025, help="learning rate per rank; SGD uses it "
                   "x the number of ranks (default %(default)s)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default %(default)s)")
    p.add_argument("--seed", type=int, default=42, help="seed of the initial weights and of the "
                   "epochs' shuffles (default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch (and OpenBLAS) threads per rank "
                   "(default %(default)s)")
    p.add_argument("--log-interval", type=int, default=0, help="rank 0 prints a progress line "
                   "every N steps (default 0: none)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training "
                   "samples (default: all)")
    p.add_argument("--val-limit", type=int, default=0, help="use only the first N validation "
                   "samples (default: all)")
    p.add_argument("--min-accuracy", type=float, default=None, help="exit 2 when the final "
                   "validation accuracy is below X (default: no check)")
    return p


def check_args(parser, args):
    for name in ("epochs", "batch_size", "threads"):
        if getattr(args, name) < 1:
            parser.error("--%s must be at least 1" % name.replace("_", "-"))
    for name in ("log_interval", "train_limit", "val_limit"):
        if getattr(args, name) < 0:
            parser.error("--%s must not be negative" % name.replace("_", "-"))
    if not args.lr > 0:
        parser.error("--lr must be above 0")


class Log:
    """Rank 0's lines, in hvd-mnist's format."""

    def __init__(self, prog, rank):
        self.prog, self.rank = prog, rank

    def __call__(self, line):
        if self.rank == 0:
            print(line, flush=True)

    def info(self, line):
        self(self.prog + ": " + line)

    def error(self, line):
        print(self.prog + ": " + line, file=sys.stderr, flush=True)


def train_epochs(args, model, optimizer, train, validation, rank, size, log, average,
                 passes=1):
    """Trains args.epochs epochs and returns the final validation accuracy. `average(value,
    name)` is the mean of a scalar over the ranks; `passes` backward passes of one batch each
    make an optimizer step (their losses divided by the passes, so the step follows their mean)."""
    images, labels = train
    start = time.perf_counter()
    validation_accuracy = 0.0
    for epoch in range(args.epochs):
        shard, steps = epoch_shard(len(labels), size, rank, args.batch_size, args.seed, epoch)
        shard = shard.to(labels.device)
        model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=labels.device)
        correct_sum = torch.zeros((), dtype=torch.int64, device=labels.device)
        interval_loss, interval_steps, interval_start = 0.0, 0, time.perf_counter()
        epoch_start = time.perf_counter()
        group = 1
        for i in range(steps):
            index = shard[i * args.batch_size:(i + 1) * args.batch_size]
            x, y = images.index_select(0, index), labels.index_select(0, index)
            if i % passes == 0:
                optimizer.zero_grad()
                group = min(passes, steps - i)   # the epoch's last step may cover fewer batches
            out = model(x)
            loss = F.nll_loss(out, y)
            (loss / group if group > 1 else loss).backward()
            if (i + 1) % passes == 0 or i + 1 == steps:
                optimizer.step()
            with torch.no_grad():
                loss_sum += loss.detach()
                correct_sum += out.argmax(1).eq(y).sum()
            if args.log_interval and rank == 0:
                interval_loss += float(loss)
                interval_steps += 1
                if (i + 1) % args.log_interval == 0:
                    rate = interval_steps * args.batch_size * size / (time.perf_counter()
                                                                      - interval_start)
                    log("Epoch[%d] Batch[%d/%d] loss=%.6f samples/s=%.2f"
                        % (epoch, i + 1, steps, interval_loss / interval_steps, rate))
                    interval_loss, interval_steps, interval_start = 0.0, 0, time.perf_counter()
        local_loss = float(loss_sum) / steps
        local_accuracy = int(correct_sum) / (steps * args.batch_size)
        seconds = time.perf_counter() - epoch_start
        log("Epoch[%d] Speed=%.2f samples/s Time cost=%.3f"
            % (epoch, steps * args.batch_size * size / seconds, seconds))
        local_validation = evaluate(model, *validation)
        train_accuracy = average(local_accuracy, "train.accuracy")
        train_loss = average(local_loss, "train.loss")
        validation_accuracy = average(local_validation, "validation.accuracy")
        log("Epoch[%d] Train-accuracy=%.6f Validation-accuracy=%.6f Train-loss=%.6f"
            % (epoch, train_accuracy, validation_accuracy, train_loss))
    log.info("trained %d epochs in %.3f s; final validation accuracy %.6f"
             % (args.epochs, time.perf_counter() - start, validation_accuracy))
    return validation_accuracy


def setup_data(args, size):
    """(the data, None), or (None, why not)."""
    try:
        train, validation = load_mnist(args.data_dir, args.train_limit, args.val_limit)
    except DataError as e:
        return None, str(e)
    if len(train[1]) < size * args.batch_size:
        return None, ("the training set has %d samples, fewer than one step of all ranks takes "
                      "(%d ranks x batch %d)" % (len(train[1]), size, args.batch_size))
    return (train, validation), None


def report_setup(failed, error, rank, log):
    """Whether every rank is ready, given `failed` (every rank's 0 or 1, in rank order); else
    says why: rank 0 for all of them when it failed too (the ranks read the same files), each
    failed rank for itself otherwise."""
    if not any(failed):
        return True
    if error and (rank == 0 or not failed[0]):
        log.error(error)
    if rank == 0 and not error:
        log.error("rank(s) %s could not start (see their messages)"
                  % ", ".join(str(r) for r, f in enumerate(failed) if f))
    return False


def finish(args, accuracy, log):
    """The exit status: 2 below --min-accuracy."""
    if args.min_accuracy is not None and accuracy < args.min_accuracy:
        if log.rank == 0:
            log.error("final validation accuracy %.6f is below --min-accuracy %g"
                      % (accuracy, args.min_accuracy))
        return 2
    return 0


# ---- Horovod-style training ----------------------------------------------------------------------

def main(argv=None):
    parser = make_parser("Data-parallel MNIST with hvd.torch (Horovod's PyTorch API over hvd).",
                         "mnist.py")
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--backward-passes-per-step", type=int, default=1,
                        help="batches per optimizer step, their gradients summed locally and "
                             "exchanged once (default %(default)s)")
    parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                        help="apply gradient predivide factor in optimizer (default %(default)s)")
    parser.add_argument("--use-sum", action="store_true", default=False,
                        help="sum the gradients over the ranks instead of averaging them (op=Sum; "
                             "the learning rate is then not scaled by the ranks)")
    parser.add_argument("--no-cuda", action="store_true", default=False,
                        help="train on the CPU even where torch sees a GPU")
    args = parser.parse_args(argv)
    check_args(parser, args)
    if args.backward_passes_per_step < 1:
        parser.error("--backward-passes-per-step must be at least 1")

    # Horovod: initialize library.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    log = Log("mnist.py", rank)
    torch.manual_seed(args.seed)

    # Horovod: pin the GPU to the local rank; limit the CPU threads each rank uses.
    cuda = not args.no_cuda and torch.cuda.is_available()
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count()) if cuda \
        else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    set_threads(args.threads)

    data, error = setup_data(args, size)
    # Every rank learns whether every rank could read its data, so none is left waiting.
    failed = hvd.allgather(torch.tensor([int(error is not None)]), name="setup.failed")
    if not report_setup(failed.tolist(), error, rank, log):
        return 1
    (train_x, train_y), (val_x, val_y) = data
    train = (train_x.to(device), train_y.to(device))
    validation = (val_x.to(device), val_y.to(device))

    model = Net().to(device)
    # Horovod: scale the learning rate by the number of ranks (not with op=Sum, which scales
    # the gradients by it already).
    lr_scaler = 1 if args.use_sum else size
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap the optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         backward_passes_per_step=args.backward_passes_per_step,
                                         op=hvd.Sum if args.use_sum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    log.info("world size %d, backend %s, device %s, %d threads per rank"
             % (size, hvd.backend(), device, args.threads))
    log.info("data %s: %d training, %d validation samples"
             % (args.data_dir, len(train_y), len(val_y)))
    log.info("model %d parameters; seed %d" % (sum(p.numel() for p in model.parameters()),
                                               args.seed))
    steps = len(train_y) // (size * args.batch_size)
    log.info("SGD lr %g (%g x %d), momentum %g; batch %d per rank%s%s; %d epochs of %d steps "
             "(%d samples dropped per epoch)"
             % (args.lr * lr_scaler, args.lr, lr_scaler, args.momentum, args.batch_size,
                ", %d backward passes per step" % args.backward_passes_per_step
                if args.backward_passes_per_step > 1 else "",
                ", fp16 gradients" if args.fp16_allreduce else "", args.epochs, steps,
                len(train_y) - steps * size * args.batch_size))

    # Horovod: average metric values across workers.
    def metric_average(value, name):
        return hvd.allreduce(torch.tensor(value, dtype=torch.float64), name=name).item()

    accuracy = train_epochs(args, model, optimizer, train, validation, rank, size, log,
                            metric_average, args.backward_passes_per_step)
    return finish(args, accuracy, log)


if __name__ == "__main__":
    sys.exit(main())
