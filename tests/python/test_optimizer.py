"""DistributedOptimizer: gradients averaged over the ranks while the backward pass runs.

The models are linear with integer weights and inputs, and rank r's loss is (r + 1) times the
same loss, so every rank's gradient is (r + 1) G for one G computed here without hvd, and their
average, G (n + 1) / 2, is exact."""
import copy
import warnings

import pytest
import torch

import hvd.torch as hvd
from helpers import base, multi_rank, ranks_sum

X = base([5, 3])
W = base([5, 2], high=3)


def rank():
    return hvd.rank()


def size():
    return hvd.size()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(3, 4)
        self.fc2 = torch.nn.Linear(4, 2)
        with torch.no_grad():
            for i, p in enumerate(self.parameters()):
                p.copy_(base(p.shape, high=3) - 2 + i)

    def forward(self, x):
        return self.fc2(self.fc1(x))


def loss_of(model, scale):
    return (model(X) * W).sum() * scale


def local_grads(model, scale=1.0):
    """The gradients of loss_of(model, scale) by torch alone, in parameter order."""
    alone = copy.deepcopy(model)
    loss_of(alone, scale).backward()
    return [p.grad.clone() for p in alone.parameters()]


def averaged(model, scale=1.0):
    """What averaging every rank's gradient of (rank + 1) * scale * loss gives."""
    return [g * ranks_sum() / size() for g in local_grads(model, scale)]


def assert_grads(model, expected):
    for (name, p), e in zip(model.named_parameters(), expected):
        assert p.grad is not None, name
        assert torch.equal(p.grad, e), (name, p.grad, e)


def sgd(model, lr=0.5, **kwargs):
    return torch.optim.SGD(model.parameters(), lr=lr, **kwargs)


def test_gradients_are_the_average_of_every_ranks():
    model = Net()
    before = [p.detach().clone() for p in model.parameters()]
    expected = averaged(model)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD)
    for _ in range(2):  # twice: the second step runs on the hooks' reset state
        opt.zero_grad()
        with torch.no_grad():
            for p, b in zip(model.parameters(), before):
                p.copy_(b)
        loss_of(model, rank() + 1).backward()
        opt.step()
        for p, b, g in zip(model.parameters(), before, expected):
            assert torch.equal(p.grad, g)
            assert torch.equal(p.detach(), b - 0.5 * g)


def test_without_named_parameters_and_with_two_parameter_groups():
    model = Net()
    expected = averaged(model)
    opt = torch.optim.SGD([{"params": model.fc1.parameters()},
                           {"params": model.fc2.parameters(), "lr": 0.25}], lr=0.5)
    opt = hvd.DistributedOptimizer(opt)
    loss_of(model, rank() + 1).backward()
    opt.synchronize()
    assert_grads(model, expected)


def test_op_sum_and_gradient_predivide_factor():
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   op=hvd.Sum)
    loss_of(model, rank() + 1).backward()
    opt.synchronize()
    assert_grads(model, [g * ranks_sum() for g in local_grads(model)])
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   gradient_predivide_factor=2.0)
    loss_of(model, rank() + 1).backward()
    opt.synchronize()
    assert_grads(model, averaged(model))  # divided by 2 before the sum, times 2 / n after
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd(Net()), op=hvd.Sum, gradient_predivide_factor=2.0)


def test_backward_passes_per_step():
    model = Net()
    # Two passes, the second with twice the loss: 3 (r + 1) G accumulated, then averaged once.
    expected = [g * 3 for g in averaged(model)]
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    for _ in range(2):
        opt.zero_grad()
        loss_of(model, rank() + 1).backward()
        loss_of(model, 2 * (rank() + 1)).backward()
        opt.synchronize()
        assert_grads(model, expected)
        with opt.skip_synchronize():
            opt.step()
        with torch.no_grad():  # back to where the expectation was computed
            for p, q in zip(model.parameters(), Net().parameters()):
                p.copy_(q)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd(Net()), backward_passes_per_step=0)


@multi_rank("one rank installs no hooks, as Horovod")
def test_more_backward_passes_than_declared_raise():
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    loss_of(model, rank() + 1).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        loss_of(model, rank() + 1).backward()
    opt.synchronize()


@pytest.mark.parametrize("groups", [2, "lists"])
def test_groups(groups):
    model = Net()
    expected = averaged(model)
    if groups == "lists":
        groups = [[model.fc1.weight, model.fc2.bias]]  # the other two alone
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   groups=groups)
    for _ in range(2):
        opt.zero_grad()
        loss_of(model, rank() + 1).backward()
        opt.synchronize()
        assert_grads(model, expected)
        with opt.skip_synchronize():
            opt.step()
        with torch.no_grad():
            for p, q in zip(model.parameters(), Net().parameters()):
                p.copy_(q)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd(model), groups=[[model.fc1.weight, model.fc1.weight]])


def test_fp16_compression():
    model = Net()
    expected = averaged(model)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    loss_of(model, rank() + 1).backward()
    opt.step()
    for p, g in zip(model.parameters(), expected):
        assert p.grad.dtype == torch.float32 and torch.equal(p.grad, g)


def lookups(r):  # Horovod's test_sparse_embeddings: rows that differ between ranks
    return torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]] if r % 2 == 0 else [[1, 3, 4], [4, 7, 9]])


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_are_reduced_and_stay_sparse(sparse_as_dense):
    # SparseAdam takes sparse gradients only: with sparse_as_dense too, the reduced gradient
    # goes back to the optimizer sparse, as Horovod's does.
    model = torch.nn.Embedding(10, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Sum,
                                   sparse_as_dense=sparse_as_dense)
    expected = torch.zeros(10, 3)
    for r in range(size()):
        for row in lookups(r).flatten().tolist():
            expected[row] += r + 1
    for _ in range(2):
        opt.zero_grad()
        (model(lookups(rank())).sum() * (rank() + 1)).backward()
        opt.synchronize()
        assert model.weight.grad.is_sparse
        assert torch.equal(model.weight.grad.to_dense(), expected)
        with opt.skip_synchronize():
            opt.step()


def test_synchronize_then_step_under_skip_synchronize():
    model = Net()
    before = [p.detach().clone() for p in model.parameters()]
    expected = averaged(model)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    loss_of(model, rank() + 1).backward()
    opt.synchronize()
    assert_grads(model, expected)
    # Change the averaged gradients differently on each rank: a step that reduced them again
    # would make the ranks agree.
    with torch.no_grad():
        for p in model.parameters():
            p.grad.mul_(rank() + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
    for p, b, g in zip(model.parameters(), before, expected):
        assert torch.equal(p.detach(), b - 0.5 * (rank() + 1) * g)


@multi_rank("one rank does not reduce, as Horovod's test")
def test_step_after_synchronize_warns():
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    expected = averaged(model)
    loss_of(model, rank() + 1).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()
    assert_grads(model, expected)


@multi_rank("one rank has nothing in flight")
def test_zero_grad_before_synchronize_raises():
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    loss_of(model, rank() + 1).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.synchronize()
    assert_grads(model, averaged(model))
    opt.zero_grad()
    # Halfway through backward_passes_per_step, as Horovod: the accumulated gradients would
    # be lost.
    opt.set_backward_passes_per_step(2)
    loss_of(model, rank() + 1).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.synchronize()


def test_named_parameters_must_be_unique_and_complete():
    model = Net()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(sgd(model), named_parameters=[("same", p) for _, p in named])
    with pytest.raises(ValueError, match="not"):
        hvd.DistributedOptimizer(sgd(model), named_parameters=named[:-1])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd(model), named_parameters=[p for _, p in named])


@multi_rank("one rank does not reduce")
def test_a_gradient_only_some_ranks_compute_is_averaged_with_zeros():
    # Rank 0's loss does not use fc2: it submits fc2's gradients as zeros in synchronize().
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    full = local_grads(model)
    head = copy.deepcopy(model)
    (head.fc1(X).sum() * 2).backward()
    if rank() == 0:
        (model.fc1(X).sum() * 2).backward()
    else:
        loss_of(model, rank() + 1).backward()
    opt.step()
    others = ranks_sum() - 1
    expected = [(h.grad * 1 + f * others) / size() for h, f in
                zip(head.fc1.parameters(), full[:2])] + [f * others / size() for f in full[2:]]
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, e, rtol=0, atol=1e-5), (p.grad, e)


def test_two_optimizers_over_parts_of_one_model():
    # Each is given the whole model's named_parameters, as Horovod allows: each reduces only
    # the gradients of its own parameters (a parameter reduced twice would be a duplicate name).
    model = Net()
    expected = averaged(model)
    named = list(model.named_parameters())
    first = hvd.DistributedOptimizer(sgd(model.fc1), named_parameters=named)
    second = hvd.DistributedOptimizer(sgd(model.fc2), named_parameters=named)
    loss_of(model, rank() + 1).backward()
    first.step()
    second.step()
    assert_grads(model, expected)


def test_parameters_whose_requires_grad_changes():
    # Horovod's test_dynamic_requires_grad: a generator and a discriminator trained in turns.
    gen, disc = torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)
    gen_opt = hvd.DistributedOptimizer(sgd(gen, lr=0.1), named_parameters=gen.named_parameters())
    disc_opt = hvd.DistributedOptimizer(sgd(disc, lr=0.1),
                                        named_parameters=disc.named_parameters())
    hvd.broadcast_parameters(gen.state_dict(), 0)
    hvd.broadcast_parameters(disc.state_dict(), 0)
    for train_gen in [True, False, True]:
        for p in gen.parameters():
            p.requires_grad_(train_gen)
        for p in disc.parameters():
            p.requires_grad_(not train_gen)
        gen_opt.zero_grad()
        disc_opt.zero_grad()
        disc(gen(X * (rank() + 1))).sum().backward()
        (gen_opt if train_gen else disc_opt).step()
        trained = gen if train_gen else disc
        for p in trained.parameters():
            # Averaged: the same on every rank.
            assert hvd.allgather_object(p.grad.tolist()) == [p.grad.tolist()] * size()


@multi_rank("a set smaller than the job")
def test_process_set():
    evens = hvd.add_process_set([r for r in range(size()) if r % 2 == 0])
    odds = hvd.add_process_set([r for r in range(size()) if r % 2 == 1])
    try:
        mine = evens if evens.included() else odds
        model = Net()
        opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                       process_set=mine)
        loss_of(model, rank() + 1).backward()
        opt.synchronize()
        scale = sum(r + 1 for r in mine.ranks) / mine.size()
        assert_grads(model, [g * scale for g in local_grads(model)])
    finally:
        hvd.remove_process_set(odds)
        hvd.remove_process_set(evens)
