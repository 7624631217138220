"""Horovod's collective operations on torch tensors, over libhvd (hvd.torch re-exports them).

Every operation is submitted by name to hvd's fusion scheduler and returns a handle; poll()
tells whether it is done and synchronize() waits for it and returns its result. The blocking
forms (allreduce, allgather, ...) are the asynchronous ones followed by synchronize(), wrapped
in autograd functions so that gradients flow through them as in Horovod.
"""
import atexit
import os

import torch

from hvd.build_info import BACKENDS as _BUILT_BACKENDS
from hvd.build_info import CUDA as _CUDA_BUILT
from hvd.build_info import NCCL_VERSION as _NCCL_VERSION
from hvd.torch import _ops
from hvd.torch.compression import Compression

HorovodInternalError = _ops.HorovodInternalError

# Reduction ops, as Horovod names them (Adasum is Horovod's own algorithm; hvd has none).
Sum = _ops.SUM
Average = _ops.AVERAGE
Min = _ops.MIN
Max = _ops.MAX
Product = _ops.PRODUCT
Adasum = -1

_Kind = _ops.Kind


class ProcessSet:
    """A set of ranks that run collectives together (Horovod's process set).

    Make one from a list of ranks of the job and pass it to init(process_sets=[...]) or
    add_process_set(); then pass it as process_set= to any operation. Every rank makes the same
    sets in the same order, members or not. Roots (broadcast's root_rank) stay ranks of the job.
    """

    process_set_id = None

    def __init__(self, ranks):
        try:
            ranks = sorted(ranks)
        except TypeError:
            raise ValueError("ProcessSet takes a list of ranks (hvd has no mpi4py communicators)")
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet takes a list of integer ranks, not %r" % (ranks,))
        self.ranks = ranks

    def size(self):
        """The number of ranks in the set, None before it was added."""
        if self.process_set_id is None:
            return None
        return _ops.size(self.process_set_id)

    def rank(self):
        """This rank's rank within the set (-1 where it is not a member), None before it was added."""
        if self.process_set_id is None:
            return None
        return _ops.rank(self.process_set_id)

    def included(self):
        """Whether this rank is a member of the set."""
        return _ops.rank(0) in self.ranks

    def _job_rank_to_set_rank(self, job_rank):
        if self.process_set_id == 0:
            return job_rank
        try:
            return self.ranks.index(job_rank)
        except ValueError:
            raise ValueError("root rank %d is not a member of %s" % (job_rank, self))

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id \
            and self.ranks == other.ranks

    def __hash__(self):
        return hash((self.process_set_id, tuple(self.ranks or ())))

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
_added_sets = []  # the ProcessSet objects added since init, so shutdown can invalidate them


def _set_id(process_set):
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id is None:
        raise ValueError("%s has not been added (init(process_sets=...) or add_process_set())"
                         % (process_set,))
    return process_set.process_set_id


# ---- Lifecycle and the job's layout -----------------------------------------------------------

def init(comm=None, process_sets=None, backend=None, timeout=None):
    """Joins the job's other ranks over the backend HVD_BACKEND names (default gloo).

    Collective. `process_sets` are ProcessSet objects (or rank lists) made on every rank alike.
    hvd's own arguments: `backend` overrides HVD_BACKEND (a name or a plugin path), `timeout`
    (seconds) HVD_TIMEOUT. Horovod's `comm` (an mpi4py communicator or a list of ranks) is not
    supported: start the job with the ranks you want, or use a process set.
    """
    if comm is not None:
        raise ValueError("hvd.torch.init(comm=...) is not supported: hvd takes the job's ranks "
                         "from its launcher; use process sets for subsets")
    if _ops.is_initialized():
        return
    sets = [p if isinstance(p, ProcessSet) else ProcessSet(p) for p in (process_sets or [])]
    _ops.init(backend or "", float(timeout or 0), [p.ranks for p in sets])
    global_process_set.ranks = list(range(_ops.size(0)))
    for i, p in enumerate(sets):
        p.process_set_id = i + 1
    _added_sets[:] = sets
    _handles.clear()


def shutdown():
    """Releases the communicators; init() may be called again afterwards."""
    for p in _added_sets:
        p.process_set_id = None
    _added_sets.clear()
    _handles.clear()
    _ops.shutdown()


def _shutdown_at_exit():
    # A communicator that broke raised its error where it broke; at exit, release it quietly.
    try:
        if _ops.is_initialized():
            _ops.shutdown()
    except Exception:  # noqa: BLE001
        pass


atexit.register(_shutdown_at_exit)


def is_initialized():
    return _ops.is_initialized()


def size():
    """The number of ranks in the job."""
    return _ops.size(0)


def rank():
    """This rank, from 0 to size() - 1."""
    return _ops.rank(0)


def local_size():
    """The number of ranks on this rank's host."""
    return _ops.local_size()


def local_rank():
    """This rank's rank among those on its host (pin your GPU with it)."""
    return _ops.local_rank()


def cross_size():
    """The number of ranks with this rank's local rank: the hosts, in a homogeneous job."""
    return _ops.cross_size()


def cross_rank():
    """This rank's rank among those with its local rank: its host's, in a homogeneous job."""
    return _ops.cross_rank()


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    return _ops.is_homogeneous()


def backend():
    """The name of the backend this job runs on (gloo, mpi, ofi, nccl, or a plugin's)."""
    return _ops.backend()


def mpi_threads_supported():
    """Whether MPI may be called from several threads: hvd's mpi backend asks for
    MPI_THREAD_MULTIPLE, and only the scheduler's thread calls it."""
    return backend() == "mpi"


def mpi_enabled():
    return _ops.is_initialized() and backend() == "mpi"


def gloo_enabled():
    return _ops.is_initialized() and backend() == "gloo"


def mpi_built():
    return "mpi" in _BUILT_BACKENDS


def gloo_built():
    return "gloo" in _BUILT_BACKENDS


def nccl_built():
    """The version code of the NCCL hvd's nccl backend was built with (22809 for 2.28.9), as
    Horovod; 0 where it was not built."""
    return _NCCL_VERSION


def ofi_built():
    return "ofi" in _BUILT_BACKENDS


def cuda_built():
    return bool(_CUDA_BUILT)


def ddl_built():
    return False


def ccl_built():
    return False


def rocm_built():
    return False


def add_process_set(process_set):
    """Adds a process set (a ProcessSet or a list of ranks) and returns it. Collective: every
    rank of the job adds the same sets in the same order."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    process_set.process_set_id = _ops.add_process_set(process_set.ranks)
    _added_sets.append(process_set)
    return process_set


def remove_process_set(process_set):
    """Removes a process set added before; collective like adding it. Returns whether it was."""
    if process_set.process_set_id in (None, 0):
        return False
    _ops.remove_process_set(process_set.process_set_id)
    process_set.process_set_id = None
    if process_set in _added_sets:
        _added_sets.remove(process_set)
    return True


# ---- Handles ------------------------------------------------------------------------------------

# handle -> how synchronize() turns the operation's outputs into its result
_handles = {}


def _stream_of(tensor):
    if tensor.is_cuda:
        return torch.cuda.current_stream(tensor.device).cuda_stream
    return 0


def _name(name):
    if name is None:
        return ""
    if not isinstance(name, str):
        raise ValueError("a tensor's name is a str, not %r" % (name,))
    if not name:
        raise ValueError("a tensor's name must not be empty (None makes one up)")
    return name


def _submit(kind, tensors, outputs, name, op, root, prescale, postscale, splits, process_set,
            result):
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise ValueError("hvd.torch operations take torch tensors, not %s" % type(t).__name__)
    handle = _ops.submit(kind, tensors, outputs, _name(name), op, root, float(prescale),
                         float(postscale), splits, _set_id(process_set), _stream_of(tensors[0]))
    _handles[handle] = result
    return handle


def _op(op, average, default=Average):
    if op is not None and average is not None:
        raise ValueError("pass op= or average=, not both (average= is Horovod's deprecated form)")
    if op is None:
        op = default if average is None else (Average if average else Sum)
    if op == Adasum:
        raise NotImplementedError("hvd has no Adasum; use Average or Sum")
    if op not in (Sum, Average, Min, Max, Product):
        raise ValueError("unknown reduction op %r" % (op,))
    return op


def poll(handle):
    """Whether the operation is done (synchronize() then returns without waiting)."""
    if handle not in _handles:
        raise ValueError("handle %r was not returned by an hvd.torch operation, or was "
                         "synchronized already" % (handle,))
    return _ops.poll(handle)


def synchronize(handle):
    """Waits for the operation and returns its result. A failure raises HorovodInternalError
    with hvd's message, the same on every rank for ranks that disagree; Ctrl-C raises
    KeyboardInterrupt."""
    if handle not in _handles:
        raise ValueError("handle %r was not returned by an hvd.torch operation, or was "
                         "synchronized already" % (handle,))
    result = _handles[handle]
    try:
        outputs, received_splits = _ops.wait(handle)
    except KeyboardInterrupt:
        raise
    except BaseException:
        _handles.pop(handle, None)
        raise
    del _handles[handle]
    return result(outputs, received_splits)


def _one(outputs, _):
    return outputs[0]


def _all(outputs, _):
    return outputs


def _with_splits(outputs, received_splits):
    return outputs[0], received_splits[0]


# ---- allreduce ----------------------------------------------------------------------------------

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    return _submit(_Kind.allreduce, [tensor], [output], name, op, 0, prescale_factor,
                   postscale_factor, [], process_set, _one)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over the ranks into a new tensor; returns a handle."""
    op = _op(op, average)
    return _allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over the ranks in place; returns a handle."""
    op = _op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` over the ranks in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op = op
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return synchronize(_allreduce_async(tensor, None, name, op, prescale_factor,
                                            postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.scales[0],
                         postscale_factor=ctx.scales[1], process_set=ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns `tensor` reduced over the ranks (Average by default); differentiable."""
    op = _op(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(reduced, ctx)


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped operations need at least one tensor")
    return _submit(_Kind.allreduce, tensors, outputs, name, op, 0, prescale_factor,
                   postscale_factor, [], process_set, _all)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors as one group (they complete together)."""
    op = _op(op, average)
    return _grouped_allreduce_async(tensors, [], name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    op = _op(op, average)
    tensors = list(tensors)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op = op
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return tuple(synchronize(_grouped_allreduce_async(tensors, [], name, op, prescale_factor,
                                                          postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce(list(grads), op=ctx.op, prescale_factor=ctx.scales[0],
                                    postscale_factor=ctx.scales[1], process_set=ctx.process_set)
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns each tensor reduced over the ranks, as one group; differentiable."""
    op = _op(op, average)
    compressed = [compression.compress(t) for t in tensors]
    if not compressed:
        raise ValueError("grouped operations need at least one tensor")
    reduced = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                      *[c for c, _ in compressed])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


# ---- allgather ----------------------------------------------------------------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's `tensor` along the first dimension, in rank order (the
    ranks may differ in it); returns a handle."""
    return _submit(_Kind.allgather, [tensor], [], name, 0, 0, 1.0, 1.0, [], process_set, _one)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ctx.process_set)
        offset = int(rows[:ctx.process_set.rank()].sum())
        return grad.narrow(0, offset, ctx.rows), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's `tensor` concatenated along the first dimension; differentiable."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped operations need at least one tensor")
    return _submit(_Kind.allgather, tensors, [], name, 0, 0, 1.0, 1.0, [], process_set, _all)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(tensors, name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce(list(grads), op=Average, process_set=ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ctx.process_set)
        offsets = rows[:ctx.process_set.rank()].sum(0)
        return (None, None, *[g.narrow(0, int(o), n)
                              for g, o, n in zip(reduced, offsets, ctx.rows)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts reducing a sparse COO tensor as Horovod does: every rank's indices and values are
    gathered (an allgather each). Returns a function that waits and returns the sparse sum (or,
    with op=Average, the average) over the ranks, uncoalesced: an index several ranks hold
    appears once per rank."""
    op = _op(op, None)
    if op not in (Sum, Average):
        raise ValueError("a sparse allreduce sums or averages")
    indices = allgather_async(tensor._indices().transpose(0, 1).contiguous(),
                              name=None if name is None else name + ".indices",
                              process_set=process_set)
    values = allgather_async(tensor._values(), name=None if name is None else name + ".values",
                             process_set=process_set)

    def result():
        gathered_values = synchronize(values)
        gathered_indices = synchronize(indices)
        if op == Average:
            gathered_values = gathered_values / process_set.size()
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values,
                                       tensor.size())

    return result


# ---- broadcast ----------------------------------------------------------------------------------

def _broadcast_async(tensor, output, root_rank, name, process_set):
    root = process_set._job_rank_to_set_rank(root_rank) if process_set.process_set_id else root_rank
    return _submit(_Kind.broadcast, [tensor], [output], name, 0, root, 1.0, 1.0, [], process_set,
                   _one)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying root_rank's `tensor` (a rank of the job) into a new tensor on every rank."""
    return _broadcast_async(tensor, None, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying root_rank's `tensor` into `tensor` on every rank."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` on every rank; differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


# ---- alltoall -----------------------------------------------------------------------------------

def _splits(splits):
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64):
            raise ValueError("alltoall's splits are integers, not %s" % splits.dtype)
        splits = splits.tolist()
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending splits[d] rows of `tensor` (the first dimension, divided evenly when splits
    is None) to each rank d; synchronize() returns (received tensor, rows from each rank)."""
    return _submit(_Kind.alltoall, [tensor], [], name, 0, 0, 1.0, 1.0, _splits(splits),
                   process_set, _with_splits)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set = process_set
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _):
        grad, _ = alltoall(grad_output, splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[d] rows of `tensor` to each rank d and returns what the ranks sent this one,
    in rank order; with splits given, also the rows received from each rank. Differentiable."""
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# ---- reducescatter ------------------------------------------------------------------------------

def _reducescatter_async(tensors, name, op, process_set, prescale_factor, postscale_factor,
                         result):
    for t in tensors:
        if t.dim() == 0:
            raise ValueError("reducescatter needs tensors of at least one dimension")
    return _submit(_Kind.reducescatter, list(tensors), [], name, op, 0, prescale_factor,
                   postscale_factor, [], process_set, result)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing `tensor` over the ranks and keeping this rank's rows of the result (the
    first dimension split as evenly as it goes, the first ranks one row more)."""
    return _reducescatter_async([tensor], name, _op(op, None), process_set, prescale_factor,
                                postscale_factor, _one)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op = op
        ctx.scale = prescale_factor * postscale_factor
        ctx.process_set = process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.op == Sum:
            grad_output = grad_output * ctx.process_set.size()
        if ctx.scale != 1.0:
            grad_output = grad_output * ctx.scale
        return allgather(grad_output, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Returns this rank's rows of `tensor` reduced over the ranks; differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, _op(op, None), process_set, prescale_factor,
                                   postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped operations need at least one tensor")
    return _reducescatter_async(tensors, name, _op(op, None), process_set, prescale_factor,
                                postscale_factor, _all)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op = op
        ctx.scale = prescale_factor * postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(
            tensors, name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        factor = (ctx.process_set.size() if ctx.op == Sum else 1) * ctx.scale
        grads = [g * factor if factor != 1 else g for g in grads]
        return (None, None, None, None, None, *grouped_allgather(grads, process_set=ctx.process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    compressed = [compression.compress(t) for t in tensors]
    if not compressed:
        raise ValueError("grouped operations need at least one tensor")
    reduced = _GroupedReducescatter.apply(name, _op(op, None), process_set, prescale_factor,
                                          postscale_factor, *[c for c, _ in compressed])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


# ---- synchronization ----------------------------------------------------------------------------

def barrier(process_set=global_process_set):
    """Returns once every rank of the process set has called it."""
    _ops.barrier(_set_id(process_set))


def join(device=-1):
    """Tells the other ranks that this one ran out of data: until every rank has joined, it
    takes part in their allreduces with zeros (an Average still divides by size()), so ranks
    with fewer batches need not stop the job. Returns the rank that joined last, the same on
    every rank. Any other collective submitted meanwhile fails on every rank. `device` is
    Horovod's (where its zeros live); hvd serves host-memory allreduces only.
    """
    return _ops.join()
