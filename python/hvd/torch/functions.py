"""Copying state between ranks: parameters, optimizer state and Python objects."""
import io

import torch

try:  # as Horovod: lambdas and local classes too, where cloudpickle is installed
    import cloudpickle as _pickle
except ImportError:
    import pickle as _pickle

from hvd.torch.mpi_ops import (allgather, broadcast_, broadcast_async_, global_process_set,
                               rank, synchronize)


def _named_tensors(params):
    if isinstance(params, dict):
        return sorted(params.items())
    named = []
    for item in params:
        named.append(item if isinstance(item, tuple) else (None, item))
    return named


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Copies root_rank's tensors into every rank's, in place.

    `params` is a model's state_dict(), named_parameters() or parameters(), or any dict or list
    of tensors (or of (name, tensor) pairs); every rank passes the same structure.
    """
    handles = []
    for name, tensor in _named_tensors(params):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError("broadcast_parameters takes tensors; %s is a %s"
                             % (name, type(tensor).__name__))
        handles.append(broadcast_async_(tensor.data, root_rank,
                                        None if name is None else "broadcast." + name,
                                        process_set=process_set))
    for handle in handles:
        synchronize(handle)


class _TensorSlot:
    """Stands for a tensor in a state_dict sent as an object: its shape and dtype."""

    def __init__(self, tensor):
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype


def _replace_tensors(value, tensors):
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _TensorSlot(value)
    if isinstance(value, dict):
        return {k: _replace_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_replace_tensors(v, tensors) for v in value)
    return value


def _fill_tensors(value, tensors, make):
    if isinstance(value, _TensorSlot):
        tensor = make(value)
        tensors.append(tensor)
        return tensor
    if isinstance(value, dict):
        return {k: _fill_tensors(v, tensors, make) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fill_tensors(v, tensors, make) for v in value)
    return value


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Copies root_rank's optimizer state (per-parameter state such as momentum buffers, and
    each parameter group's options such as the learning rate) to every rank.

    The state's layout goes as one object, then each tensor as a broadcast, so state that only
    root has made yet (momentum before the first step) arrives whole. Every rank's optimizer is
    of the same type over the same parameters. `model` is Horovod's argument, which hvd does not
    need.
    """
    is_root = rank() == root_rank
    tensors = []
    layout = _replace_tensors(optimizer.state_dict(), tensors) if is_root else None
    layout = broadcast_object(layout, root_rank, "broadcast_optimizer_state.layout", process_set)
    if not is_root:
        # State tensors are made on their parameter's device (load_state_dict moves them anyway).
        devices = [p.device for group in optimizer.param_groups for p in group["params"]]
        device = devices[0] if devices else torch.device("cpu")
        state = _fill_tensors(layout, tensors,
                              lambda s: torch.empty(s.shape, dtype=s.dtype, device=device))
    handles = [broadcast_async_(t, root_rank, "broadcast_optimizer_state.%d" % i,
                                process_set=process_set) for i, t in enumerate(tensors)]
    for handle in handles:
        synchronize(handle)
    if not is_root:
        optimizer.load_state_dict(state)


def _to_bytes(obj):
    buffer = io.BytesIO()
    _pickle.dump(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes(tensor):
    return _pickle.loads(tensor.numpy().tobytes())


def _suffixed(name, default, suffix):
    # Unnamed: one name per function, alike on every rank whatever each rank passes (Horovod
    # names them by the object's type, which differs where the other ranks pass None) and
    # whatever collectives some ranks ran alone before (a numbering would differ after those).
    return (default if name is None else name) + suffix


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` (anything picklable) on every rank."""
    length_name = _suffixed(name, "broadcast_object", ".length")
    bytes_name = _suffixed(name, "broadcast_object", ".bytes")
    if rank() == root_rank:
        payload = _to_bytes(obj)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
        broadcast_(length, root_rank, length_name, process_set=process_set)
        broadcast_(payload, root_rank, bytes_name, process_set=process_set)
        return obj
    length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, length_name, process_set=process_set)
    payload = torch.empty(int(length[0]), dtype=torch.uint8)
    broadcast_(payload, root_rank, bytes_name, process_set=process_set)
    return _from_bytes(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj` (anything picklable), in rank order."""
    payload = _to_bytes(obj)
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64),
                        name=_suffixed(name, "allgather_object", ".lengths"),
                        process_set=process_set)
    gathered = allgather(payload, name=_suffixed(name, "allgather_object", ".bytes"),
                         process_set=process_set)
    objects, offset = [], 0
    for length in lengths.tolist():
        objects.append(_from_bytes(gathered[offset:offset + length]))
        offset += length
    return objects
