"""Gradients through hvd.torch's collectives, with Horovod's semantics (horovod/torch/mpi_ops.py's
backward functions): each rank back-propagates its own gradient, (rank + 1) times a pattern, so
that the expected values show which ranks' gradients arrived where."""
import pytest
import torch

import hvd.torch as hvd
from helpers import base, multi_rank, ranks_sum

FLOATS = [torch.float32, torch.float64]


def rank():
    return hvd.rank()


def size():
    return hvd.size()


def leaf(shape, dtype, scale=1.0):
    return (base(shape, dtype) * scale).requires_grad_()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_allreduce_grad_is_the_allreduce_of_the_gradients(dtype):
    for op, pre, post in [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 2.0, 0.5),
                          (hvd.Average, 4.0, 3.0)]:
        for dims in [1, 2, 3]:
            shape = [3, 2, 2][:dims]
            x = leaf(shape, dtype, rank() + 1)
            y = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
            y.backward(base(shape, dtype) * (rank() + 1))
            # Horovod: the gradient is reduced as the tensor was, with its op and scales.
            expected = base(shape, torch.float64) * ranks_sum() * pre * post
            if op == hvd.Average:
                expected = expected / size()
            assert x.grad.dtype == dtype
            assert torch.equal(x.grad.to(torch.float64), expected), (op, pre, post, dims)


def test_grouped_allreduce_grad():
    xs = [leaf([3], torch.float32), leaf([2, 2], torch.float64)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    torch.autograd.backward(ys, [base([3]) * (rank() + 1),
                                 base([2, 2], torch.float64) * 2 * (rank() + 1)])
    assert torch.equal(xs[0].grad, base([3]) * ranks_sum())
    assert torch.equal(xs[1].grad, base([2, 2], torch.float64) * 2 * ranks_sum())
    xs = [leaf([4], torch.float32)]
    (y,) = hvd.grouped_allreduce(xs, op=hvd.Average)
    y.backward(torch.full((4,), 2.0 * (rank() + 1)))
    assert torch.equal(xs[0].grad, torch.full((4,), 2.0 * ranks_sum() / size()))


def gathered_grad(rows_of):
    """The gradient each rank back-propagates through an allgather of rows_of(r) rows from every
    rank r: row i of rank q's is (q + 1) * (i + 1), two columns."""
    total = sum(rows_of(r) for r in range(size()))
    return (torch.arange(1.0, total + 1) * (rank() + 1)).reshape(total, 1).repeat(1, 2)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_allgather_grad_is_my_rows_of_the_average_gradient(dtype):
    for rows_of in [lambda r: r + 1, lambda r: 2]:
        x = leaf([rows_of(rank()), 2], dtype)
        y = hvd.allgather(x)
        y.backward(gathered_grad(rows_of).to(dtype))
        # Horovod: the average of every rank's gradient, narrowed to this rank's rows.
        start = sum(rows_of(r) for r in range(rank()))
        rows = torch.arange(start + 1.0, start + rows_of(rank()) + 1, dtype=torch.float64)
        expected = (rows * ranks_sum() / size()).reshape(-1, 1).repeat(1, 2)
        assert torch.equal(x.grad.to(torch.float64), expected), x.grad


def test_grouped_allgather_grad():
    xs = [leaf([rank() + 1, 2], torch.float32), leaf([1], torch.float64)]
    ys = hvd.grouped_allgather(xs)
    torch.autograd.backward(ys, [gathered_grad(lambda r: r + 1),
                                 torch.arange(1.0, size() + 1, dtype=torch.float64)
                                 * (rank() + 1)])
    start = rank() * (rank() + 1) // 2
    rows = torch.arange(start + 1.0, start + rank() + 2)
    assert torch.equal(xs[0].grad, (rows * ranks_sum() / size()).reshape(-1, 1).repeat(1, 2))
    assert torch.equal(xs[1].grad, torch.tensor([(rank() + 1.0) * ranks_sum() / size()],
                                                dtype=torch.float64))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_broadcast_grad_reaches_the_root_only(dtype):
    for root in range(size()):
        x = leaf([2, 3], dtype, rank() + 1)
        y = hvd.broadcast(x, root)
        assert torch.equal(y, base([2, 3], dtype) * (root + 1))
        y.backward(base([2, 3], dtype) * (rank() + 1))
        # Horovod: the average of the gradients on the root, zeros elsewhere.
        expected = base([2, 3], torch.float64) * ranks_sum() / size() if rank() == root \
            else torch.zeros(2, 3, dtype=torch.float64)
        assert torch.equal(x.grad.to(torch.float64), expected), root


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_alltoall_grad_goes_back_where_the_rows_came_from(dtype):
    n = size()
    # Rank r sends r + d + 1 rows to rank d; row k of every tensor is numbered k + 1.
    sent = [rank() + d + 1 for d in range(n)]
    x = torch.arange(1.0, sum(sent) + 1, dtype=dtype).reshape(-1, 1).repeat(1, 2)
    x.requires_grad_()
    y, received = hvd.alltoall(x, splits=torch.tensor(sent, dtype=torch.int32))
    assert received.tolist() == [s + rank() + 1 for s in range(n)]
    # Each rank's gradient numbers its received rows 1000 * (rank + 1) + position.
    y.backward((torch.arange(y.shape[0], dtype=dtype) + 1000 * (rank() + 1))
               .reshape(-1, 1).repeat(1, 2))
    expected = []
    for d in range(n):  # the rows this rank sent d sit after those of the ranks before it
        offset = sum(s + d + 1 for s in range(rank()))
        expected += [1000 * (d + 1) + offset + k for k in range(rank() + d + 1)]
    expected = torch.tensor(expected, dtype=torch.float64).reshape(-1, 1).repeat(1, 2)
    assert torch.equal(x.grad.to(torch.float64), expected), x.grad
    # Even splits: the output alone.
    x = torch.arange(1.0, n + 1, dtype=dtype).requires_grad_()
    y = hvd.alltoall(x)
    y.backward(torch.arange(n, dtype=dtype) + 10 * rank())
    assert torch.equal(x.grad, (torch.arange(n, dtype=dtype) * 10 + rank()))


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["Sum", "Average"])
def test_reducescatter_grad_is_the_allgather_of_the_gradients(op):
    n = size()
    rows = 2 * n + 1  # the first ranks hold one row more
    for pre, post in [(1.0, 1.0), (2.0, 0.5), (3.0, 1.0)]:
        x = leaf([rows, 2], torch.float64, rank() + 1)
        y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)

        def grad_of(r):  # rank r's gradient for its rows
            mine = rows // n + (r < rows % n)
            return torch.full((mine, 2), 10.0 * (r + 1), dtype=torch.float64)
        y.backward(grad_of(rank()))
        # Horovod: every rank's gradient gathered, times size() for Sum, times the scales.
        expected = torch.cat([grad_of(r) for r in range(n)]) * pre * post
        if op == hvd.Sum:
            expected = expected * n
        assert torch.equal(x.grad, expected), (pre, post, x.grad)


def test_grouped_reducescatter_grad():
    n = size()
    xs = [leaf([n, 2], torch.float32), leaf([2 * n], torch.float64)]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    torch.autograd.backward(ys, [torch.full((1, 2), rank() + 1.0),
                                 torch.full((2,), rank() + 1.0, dtype=torch.float64)])
    assert torch.equal(xs[0].grad, torch.arange(1.0, n + 1).repeat_interleave(2).reshape(n, 2)
                       * n)
    assert torch.equal(xs[1].grad, torch.arange(1.0, n + 1, dtype=torch.float64)
                       .repeat_interleave(2) * n)


def test_allreduce_grad_through_a_computation():
    # d/dw of sum(allreduce(w * a)) with a rank's own a: the allreduce's gradient flows into w.
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    a = torch.tensor([rank() + 1.0, 2.0])
    loss = (hvd.allreduce(w * a, op=hvd.Sum) * torch.tensor([1.0, 3.0])).sum()
    loss.backward()
    # Every rank's d loss / d y is [1, 3]; summed over n ranks, times a.
    assert torch.equal(w.grad, torch.tensor([size() * (rank() + 1.0), size() * 6.0]))


@multi_rank("a process set smaller than the job")
def test_grads_on_process_sets():
    evens = hvd.add_process_set([r for r in range(size()) if r % 2 == 0])
    odds = hvd.add_process_set([r for r in range(size()) if r % 2 == 1])
    try:
        mine = evens if evens.included() else odds
        members, me = mine.ranks, mine.rank()
        member_sum = sum(r + 1 for r in members)
        k = len(members)
        # allreduce: the set's gradients summed.
        x = leaf([3], torch.float64)
        hvd.allreduce(x, op=hvd.Sum, process_set=mine).backward(
            torch.full((3,), rank() + 1.0, dtype=torch.float64))
        assert x.grad.tolist() == [float(member_sum)] * 3
        # allgather: this rank's rows (by its rank in the set) of the set's average gradient.
        x = leaf([me + 1], torch.float64)
        y = hvd.allgather(x, process_set=mine)
        assert y.shape[0] == k * (k + 1) // 2
        y.backward(torch.arange(1.0, y.shape[0] + 1, dtype=torch.float64) * (rank() + 1))
        start = me * (me + 1) // 2
        assert x.grad.tolist() == [(start + i + 1.0) * member_sum / k for i in range(me + 1)]
        # broadcast: the root is a rank of the job; the others get zeros.
        root = members[-1]
        x = leaf([2], torch.float64)
        hvd.broadcast(x, root, process_set=mine).backward(
            torch.full((2,), rank() + 1.0, dtype=torch.float64))
        assert x.grad.tolist() == [member_sum / k if rank() == root else 0.0] * 2
        # reducescatter Sum: every member's gradient gathered, times the set's size.
        x = leaf([k, 2], torch.float64)
        hvd.reducescatter(x, op=hvd.Sum, process_set=mine).backward(
            torch.full((1, 2), rank() + 1.0, dtype=torch.float64))
        assert x.grad.tolist() == [[(r + 1.0) * k] * 2 for r in members]
    finally:
        hvd.remove_process_set(odds)
        hvd.remove_process_set(evens)
