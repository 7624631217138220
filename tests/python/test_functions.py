"""Copying state between ranks (parameters, optimizer state, Python objects) and Compression."""
import pytest
import torch

import hvd.torch as hvd
from helpers import base, ranks_sum


def rank():
    return hvd.rank()


def size():
    return hvd.size()


def make_model(r):
    """A model whose every parameter and buffer tells rank r's apart from the others'."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 2))
    with torch.no_grad():
        for i, t in enumerate(model.state_dict().values()):
            t.copy_((base(t.shape, torch.int64) + 100 * r + 10 * i).to(t.dtype))
    return model


def assert_same_state(model, expected):
    for (name, t), (_, e) in zip(model.state_dict().items(), expected.state_dict().items()):
        assert t.dtype == e.dtype and torch.equal(t, e), name


@pytest.mark.parametrize("form", ["state_dict", "named_parameters", "parameters"])
def test_broadcast_parameters_from_each_root(form):
    for root in range(size()):
        model = make_model(rank())
        params = {"state_dict": model.state_dict(),
                  "named_parameters": model.named_parameters(),
                  "parameters": model.parameters()}[form]
        hvd.broadcast_parameters(params, root_rank=root)
        expected = make_model(root)
        if form == "state_dict":  # buffers too (num_batches_tracked is an int64)
            assert_same_state(model, expected)
        else:
            for (name, p), e in zip(model.named_parameters(), expected.parameters()):
                assert torch.equal(p, e), (root, name)
            mine = make_model(rank()).state_dict()["1.running_mean"]
            assert torch.equal(model.state_dict()["1.running_mean"], mine), "buffers stay"


def train_once(model, opt, r):
    opt.zero_grad()
    model(base([4, 3]) * (r + 1)).sum().backward()
    opt.step()


def assert_same_optimizer_state(opt, expected):
    mine, theirs = opt.state_dict(), expected.state_dict()
    assert mine["param_groups"] == theirs["param_groups"]
    assert mine["state"].keys() == theirs["state"].keys()
    assert len(mine["state"]) > 0
    for key, state in theirs["state"].items():
        assert state.keys() == mine["state"][key].keys(), key
        for name, value in state.items():
            got = mine["state"][key][name]
            assert type(got) == type(value), (key, name)
            if isinstance(value, torch.Tensor):
                assert got.dtype == value.dtype and torch.equal(got, value), (key, name)
            else:
                assert got == value, (key, name)


OPTIMIZERS = {
    "SGD": lambda params, r: torch.optim.SGD(params, lr=0.1 * (r + 1), momentum=0.5 + 0.1 * r,
                                             nesterov=r == 0),
    "Adam": lambda params, r: torch.optim.Adam(params, lr=0.01 * (r + 1),
                                               betas=(0.8, 0.9 + 0.01 * r), amsgrad=r == 0)}


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_broadcast_optimizer_state_that_only_the_root_has_made(kind):
    make_opt = OPTIMIZERS[kind]
    for root in range(size()):
        model = make_model(root)
        opt = make_opt(model.parameters(), rank())
        if rank() == root:  # only the root has stepped: only it has momentum buffers
            train_once(model, opt, root)
            for group in opt.param_groups:
                group["lr"] = 0.125
        hvd.broadcast_parameters(model.state_dict(), root_rank=root)
        hvd.broadcast_optimizer_state(opt, root_rank=root)
        # What the root's optimizer holds, made here alone.
        alone = make_model(root)
        expected = make_opt(alone.parameters(), root)
        train_once(alone, expected, root)
        for group in expected.param_groups:
            group["lr"] = 0.125
        assert_same_optimizer_state(opt, expected)
        assert_same_state(model, alone)
        # Every rank steps on from there alike.
        train_once(model, opt, 0)
        assert hvd.allgather_object([p.tolist() for p in model.parameters()]) == \
            [[p.tolist() for p in model.parameters()]] * size()


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_broadcast_optimizer_state_of_a_distributed_optimizer(kind):
    # Every rank has stepped, with its own options: the root's state and options win.
    model = make_model(0)
    opt = hvd.DistributedOptimizer(OPTIMIZERS[kind](model.parameters(), rank()),
                                   named_parameters=model.named_parameters())
    train_once(model, opt, rank())
    root = size() - 1
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    state = opt.state_dict()
    theirs = hvd.broadcast_object(state, root_rank=root)
    assert state["param_groups"] == theirs["param_groups"]
    assert state["param_groups"][0]["lr"] == OPTIMIZERS[kind]([torch.ones(1)], root) \
        .param_groups[0]["lr"]
    for key, values in theirs["state"].items():
        for name, value in values.items():
            got = state["state"][key][name]
            assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value
    train_once(model, opt, 0)  # the options work on every rank


def test_broadcast_optimizer_state_of_an_optimizer_without_state():
    model = make_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5 if rank() == 0 else 0.25, momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.state_dict()["state"] == {}
    assert [g["lr"] for g in opt.param_groups] == [0.5]


def test_broadcast_object_from_each_root():
    for root in range(size()):
        obj = {"rank": rank(), "list": list(range(rank() + 3)), 0: (rank(), "x" * rank()),
               "tensor": torch.full((2,), float(rank()))}
        got = hvd.broadcast_object(obj, root_rank=root)
        assert got["rank"] == root and got["list"] == list(range(root + 3))
        assert got[0] == (root, "x" * root) and torch.equal(got["tensor"],
                                                             torch.full((2,), float(root)))
    assert hvd.broadcast_object(None if rank() else "only root's") == "only root's"


def test_allgather_object():
    objs = hvd.allgather_object({"rank": rank(), "payload": "y" * (1000 * rank())})
    assert objs == [{"rank": r, "payload": "y" * (1000 * r)} for r in range(size())]
    assert hvd.allgather_object(rank() * 10, name="ints") == [r * 10 for r in range(size())]


def test_objects_on_a_process_set():
    tail = hvd.add_process_set(list(range(1, size()))) if size() > 1 else hvd.global_process_set
    try:
        if tail.included():
            first = tail.ranks[0] if tail.ranks else 0
            assert hvd.broadcast_object(rank(), root_rank=first, process_set=tail) == first
            assert hvd.allgather_object(rank(), process_set=tail) == \
                (tail.ranks if size() > 1 else [0])
    finally:
        if size() > 1:
            hvd.remove_process_set(tail)


def test_compression_fp16():
    x = torch.tensor([1.0, 2049.0, -3.5], dtype=torch.float64)
    compressed, ctx = hvd.Compression.fp16.compress(x)
    assert compressed.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(compressed, ctx)
    assert back.dtype == torch.float64 and back.tolist() == [1.0, 2048.0, -3.5]
    ints = torch.tensor([2049], dtype=torch.int32)
    compressed, ctx = hvd.Compression.fp16.compress(ints)
    assert compressed is ints
    assert hvd.Compression.fp16.decompress(compressed, ctx) is ints
    compressed, ctx = hvd.Compression.none.compress(x)
    assert compressed is x and hvd.Compression.none.decompress(compressed, ctx) is x
    # Through the allreduce: 2049 travels as float16's 2048.
    got = hvd.allreduce(torch.tensor([2049.0, rank() + 1.0]), op=hvd.Sum,
                        compression=hvd.Compression.fp16)
    assert got.dtype == torch.float32
    assert got.tolist() == [2048.0 * size(), float(ranks_sum())]
    got = hvd.reducescatter(torch.full((size(), 2), 2049.0), op=hvd.Sum,
                            compression=hvd.Compression.fp16)
    assert got.dtype == torch.float32 and got.tolist() == [[2048.0 * size()] * 2]
    got = hvd.grouped_allreduce([torch.tensor([2049.0])], op=hvd.Sum,
                                compression=hvd.Compression.fp16)
    assert got[0].dtype == torch.float32 and got[0].tolist() == [2048.0 * size()]
