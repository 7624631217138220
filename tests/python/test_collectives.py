"""hvd.torch's collectives: exact results for every dtype, op, shape and odd size, the in-place,
asynchronous and grouped forms, and the errors, the same on every rank."""
import itertools

import pytest
import torch

import hvd.torch as hvd
from helpers import (DTYPES, FLOATS, INTEGERS, base, expect_same_error, multi_rank,
                     ranks_sum)

OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def rank():
    return hvd.rank()


def size():
    return hvd.size()


# ---- allreduce ----------------------------------------------------------------------------------

def expected_allreduce(x, op):
    """What reducing (rank + 1) * x over the ranks gives, in float64 before truncation."""
    wide = x.to(torch.float64)
    n = size()
    return {
        hvd.Sum: wide * ranks_sum(),
        hvd.Average: wide * ranks_sum() / n,
        hvd.Min: wide,
        hvd.Max: wide * n,
        hvd.Product: wide ** n * float(torch.arange(1, n + 1).prod()),
    }[op]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_every_dtype_op_and_dims(dtype):
    for dims, op in itertools.product([1, 2, 3], OPS):
        shape = [2, 3, 4][:dims]
        x = base(shape, dtype, high=2 if op == hvd.Product else 4)
        mine = x * (rank() + 1)
        got = hvd.allreduce(mine, op=op)
        expected = expected_allreduce(x, op)
        if dtype in INTEGERS:
            expected = expected.trunc()  # Average divides as Horovod: truncating
        assert got.dtype == dtype and got.shape == x.shape, (op, dims)
        assert torch.equal(got.to(torch.float64), expected), (op, dims, got)
        assert torch.equal(mine, x * (rank() + 1)), "the input is left alone"


@pytest.mark.parametrize("count", [0, 1, 7, (1 << 20) + 3])
def test_allreduce_odd_sizes(count):
    pattern = torch.arange(count, dtype=torch.float32) % 1000
    got = hvd.allreduce(pattern * (rank() + 1), op=hvd.Sum, name="odd.%d" % count)
    assert got.shape == (count,)
    assert torch.equal(got, pattern * ranks_sum())


def test_scalars_and_empty_tensors():
    me, n = rank(), size()
    got = hvd.allreduce(torch.tensor(me + 1.0), op=hvd.Sum)
    assert got.shape == () and got.item() == ranks_sum()
    got = hvd.broadcast(torch.tensor(me + 1.0), n - 1)
    assert got.shape == () and got.item() == n
    assert hvd.allgather(torch.tensor(me + 1.0)).tolist() == [r + 1.0 for r in range(n)]
    assert hvd.allgather(torch.zeros(0, 3)).shape == (0, 3)
    got, received = hvd.alltoall(torch.zeros(0, 2), splits=[0] * n)
    assert got.shape == (0, 2) and received.dtype == torch.int32 and received.tolist() == [0] * n
    empty, full = hvd.grouped_allreduce([torch.zeros(0), torch.ones(2)], op=hvd.Sum)
    assert empty.shape == (0,) and full.tolist() == [float(n)] * 2
    # Horovod's deprecated average=.
    assert hvd.allreduce(torch.ones(2), average=False).tolist() == [float(n)] * 2
    assert hvd.allreduce(torch.full((2,), me + 1.0), average=True).tolist() == \
        [ranks_sum() / n] * 2
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


def test_allreduce_in_place_and_async():
    x = base([5, 4]) * (rank() + 1)
    out = hvd.allreduce_(x, op=hvd.Sum)
    assert out is x and torch.equal(x, base([5, 4]) * ranks_sum())
    y = base([9], torch.int16) * (rank() + 1)
    handle = hvd.allreduce_async_(y, op=hvd.Sum)
    assert hvd.synchronize(handle) is y
    assert torch.equal(y, base([9], torch.int16) * ranks_sum())
    z = base([6], torch.float64) * (rank() + 1)
    handle = hvd.allreduce_async(z, op=hvd.Max)
    result = hvd.synchronize(handle)
    assert result is not z and torch.equal(result, base([6], torch.float64) * size())
    assert torch.equal(z, base([6], torch.float64) * (rank() + 1))


def test_allreduce_of_a_non_contiguous_tensor_in_place():
    x = (base([4, 6]) * (rank() + 1)).t()
    assert not x.is_contiguous()
    hvd.allreduce_(x, op=hvd.Sum)
    assert torch.equal(x, base([4, 6]).t() * ranks_sum())


def test_asynchronous_allreduces_in_flight_together():
    tensors = [base([k + 1]) * (rank() + 1) for k in range(24)]
    # Submitted in a different order on each rank: their names match them up.
    order = list(range(len(tensors)))
    if rank() % 2:
        order.reverse()
    handles = {k: hvd.allreduce_async(tensors[k], name="fused.%d" % k, op=hvd.Sum) for k in order}
    for k in range(len(tensors)):
        assert torch.equal(hvd.synchronize(handles[k]), base([k + 1]) * ranks_sum()), k
    # Mixed kinds and dtypes in flight at once.
    a = hvd.allreduce_async(torch.full((3,), rank() + 1, dtype=torch.int64), op=hvd.Sum)
    b = hvd.allgather_async(torch.full((1, 2), rank(), dtype=torch.float16))
    c = hvd.broadcast_async(torch.full((2,), rank() + 1.0), size() - 1)
    assert torch.equal(hvd.synchronize(c), torch.full((2,), float(size())))
    assert torch.equal(hvd.synchronize(b), torch.arange(size(), dtype=torch.float16)
                       .repeat_interleave(2).reshape(size(), 2))
    assert torch.equal(hvd.synchronize(a), torch.full((3,), ranks_sum(), dtype=torch.int64))


def test_poll():
    # Rank 0 submits last, after a barrier: before it, nobody's operation can have completed.
    x = torch.full((2,), rank() + 1.0)
    if rank() != 0:
        handle = hvd.allreduce_async(x, name="polled", op=hvd.Sum)
        assert size() == 1 or not hvd.poll(handle)
    hvd.barrier()
    if rank() == 0:
        handle = hvd.allreduce_async(x, name="polled", op=hvd.Sum)
    while not hvd.poll(handle):
        pass
    assert hvd.poll(handle)
    assert torch.equal(hvd.synchronize(handle), torch.full((2,), float(ranks_sum())))


def test_prescale_and_postscale_of_floats():
    for dtype, op in itertools.product(FLOATS, [hvd.Sum, hvd.Average]):
        x = base([7], dtype) * (rank() + 1)
        got = hvd.allreduce(x, op=op, prescale_factor=0.5, postscale_factor=4.0)
        expected = base([7], torch.float64) * 2.0 * ranks_sum() / (size() if op == hvd.Average
                                                                   else 1)
        assert got.dtype == dtype and torch.equal(got.to(torch.float64), expected), (dtype, op)


def test_prescale_and_postscale_of_integers_scale_in_float64_and_truncate():
    for dtype in INTEGERS:
        x = torch.full((3,), 3, dtype=dtype)
        got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5)  # each rank sends int(1.5) = 1
        assert torch.equal(got, torch.full((3,), size(), dtype=dtype)), (dtype, got)
        got = hvd.allreduce(x, op=hvd.Sum, postscale_factor=0.5)  # int(3 n / 2)
        assert torch.equal(got, torch.full((3,), 3 * size() // 2, dtype=dtype)), (dtype, got)
        got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=1.5, postscale_factor=2.5)
        assert torch.equal(got, torch.full((3,), int(4 * size() * 2.5), dtype=dtype)), (dtype, got)
    # Towards zero, as C's cast: -1.5 is -1.
    got = hvd.allreduce(torch.tensor([-3], dtype=torch.int32), op=hvd.Sum, prescale_factor=0.5)
    assert got.tolist() == [-size()]
    # An Average is the sum scaled by postscale / size, truncated once (Horovod's
    # postscale_factor / size): at 2 ranks int(3 * 3 / 2) = 4, not int(3 / 2) * 3.
    for dtype in [torch.int32, torch.int64, torch.int16]:
        x = torch.full((size(),), rank() + 1, dtype=dtype)
        expected = int(ranks_sum() * 3.0 / size())
        got = hvd.allreduce(x, op=hvd.Average, postscale_factor=3.0)
        assert got.tolist() == [expected] * size(), (dtype, got)
        got = hvd.reducescatter(x, op=hvd.Average, postscale_factor=3.0)
        assert got.tolist() == [expected], (dtype, got)


def test_scales_of_a_group_that_mixes_integers_and_floats():
    # Each tensor is scaled by its own dtype's rule, in either order.
    for first in [torch.int32, torch.float32]:
        second = torch.float32 if first == torch.int32 else torch.int64
        for op in [hvd.Sum, hvd.Average]:
            got = hvd.grouped_allreduce([torch.full((2,), 3, dtype=first),
                                         torch.full((3,), 3, dtype=second)],
                                        op=op, prescale_factor=0.5, postscale_factor=3.0)
            n = size()
            for g, dtype in zip(got, [first, second]):
                # Integers: int(1.5) = 1 sent by each rank; floats: 1.5.
                each = 1 if dtype in INTEGERS else 1.5
                expected = each * n * 3.0 / (n if op == hvd.Average else 1)
                if dtype in INTEGERS:
                    expected = int(expected)
                assert g.dtype == dtype and g.tolist() == [expected] * g.numel(), (first, op, g)
    got = hvd.grouped_reducescatter([torch.full((size(),), 3, dtype=torch.int32),
                                     torch.full((size(),), 3.0)], op=hvd.Sum,
                                    prescale_factor=0.5)
    assert got[0].tolist() == [size()] and got[1].tolist() == [1.5 * size()]


def test_average_of_integers_truncates():
    x = torch.tensor([rank() + 1, 2 * rank() + 1, 7, -(rank() + 1)], dtype=torch.int32)
    got = hvd.allreduce(x)  # Average by default
    n = size()
    total = [ranks_sum(), n * n, 7 * n, -ranks_sum()]
    assert got.tolist() == [int(t / n) for t in total], got


def test_grouped_allreduce_plain_in_place_and_async():
    shapes = [[3], [2, 5], [1, 2, 2]]
    dtypes = [torch.float32, torch.int64, torch.bfloat16]
    tensors = [base(s, d) * (rank() + 1) for s, d in zip(shapes, dtypes)]
    got = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for g, s, d in zip(got, shapes, dtypes):
        assert g.dtype == d and torch.equal(g, base(s, d) * ranks_sum()), (s, d)
    assert torch.equal(tensors[0], base([3]) * (rank() + 1)), "the input is left alone"
    outputs = hvd.grouped_allreduce_(tensors, op=hvd.Max)
    assert all(o is t for o, t in zip(outputs, tensors))
    for t, s, d in zip(tensors, shapes, dtypes):
        assert torch.equal(t, base(s, d) * size()), (s, d)
    handle = hvd.grouped_allreduce_async([torch.full((2,), rank() + 1.0),
                                          torch.full((4,), rank() + 1, dtype=torch.int32)])
    a, b = hvd.synchronize(handle)
    assert torch.equal(a, torch.full((2,), ranks_sum() / size()))
    assert torch.equal(b, torch.full((4,), ranks_sum() // size(), dtype=torch.int32))
    c = torch.full((3,), rank() + 1.0)
    handle = hvd.grouped_allreduce_async_([c], op=hvd.Min)
    (out,) = hvd.synchronize(handle)
    assert out is c and torch.equal(c, torch.ones(3))


# ---- allgather ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allgather_of_different_first_dimensions(dtype):
    for dims in [1, 2, 3]:
        def rows(r):  # at 3 dimensions, rank 0 has no rows at all
            return r + 1 if dims != 3 else r

        def part(r):
            return (base([rows(r)] + [2] * (dims - 1), torch.int64) + 10 * r).to(dtype)
        got = hvd.allgather(part(rank()))
        expected = torch.cat([part(r) for r in range(size())])
        assert got.dtype == dtype and got.shape == expected.shape, dims
        assert torch.equal(got, expected), (dims, got)


def test_grouped_allgather():
    handle = hvd.grouped_allgather_async([torch.full((rank() + 1,), rank()),
                                          torch.full((1, 2), rank() + 0.5)])
    first, second = hvd.synchronize(handle)
    assert torch.equal(first, torch.cat([torch.full((r + 1,), r) for r in range(size())]))
    assert torch.equal(second, torch.cat([torch.full((1, 2), r + 0.5) for r in range(size())]))
    got = hvd.grouped_allgather([torch.full((2, 2), rank(), dtype=torch.int8),
                                 torch.full((rank(),), rank() * 1.0)])
    assert torch.equal(got[0], torch.cat([torch.full((2, 2), r, dtype=torch.int8)
                                          for r in range(size())]))
    assert torch.equal(got[1], torch.cat([torch.full((r,), r * 1.0) for r in range(size())]))


# ---- broadcast ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast_from_each_root(dtype):
    for root, dims in itertools.product(range(size()), [1, 2, 3]):
        shape = [3, 2, 2][:dims]

        def mine(r):
            return (base(shape, torch.int64) + 10 * r).to(dtype)
        x = mine(rank())
        got = hvd.broadcast(x, root)
        assert torch.equal(got, mine(root)), (root, dims)
        assert torch.equal(x, mine(rank())), "the input is left alone"
        out = hvd.broadcast_(x, root)
        assert out is x and torch.equal(x, mine(root)), (root, dims)
        x = mine(rank())
        assert hvd.synchronize(hvd.broadcast_async_(x, root)) is x
        assert torch.equal(x, mine(root))
        assert torch.equal(hvd.synchronize(hvd.broadcast_async(mine(rank()), root)), mine(root))


# ---- alltoall -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int16, torch.float32, torch.bfloat16, torch.int64],
                         ids=str)
def test_alltoall_even_and_with_splits(dtype):
    n = size()
    # Even: rank r sends one row [r * 100 + d] * 3 to each rank d.
    x = torch.tensor([[rank() * 100 + d] * 3 for d in range(n)], dtype=dtype)
    got = hvd.alltoall(x)
    assert isinstance(got, torch.Tensor)
    assert torch.equal(got, torch.tensor([[s * 100 + rank()] * 3 for s in range(n)], dtype=dtype))
    # Uneven: rank r sends d + r + 1 rows to rank d (rows numbered so their order shows).
    splits = [d + rank() + 1 for d in range(n)]

    def block(src, dst):
        rows = src + dst + 1
        return (torch.arange(rows).reshape(rows, 1) + src * 100 + dst * 10).repeat(1, 2).to(dtype)
    x = torch.cat([block(rank(), d) for d in range(n)])
    got, received = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))
    assert received.tolist() == [rank() + s + 1 for s in range(n)]
    assert got.dtype == dtype and torch.equal(got, torch.cat([block(s, rank()) for s in range(n)]))
    # Splits as a list; a rank that sends nothing to some ranks.
    splits = [0] * n
    splits[rank()] = 2
    got, received = hvd.alltoall(torch.full((2, 1), rank(), dtype=dtype), splits=splits)
    assert received.tolist() == [2 if s == rank() else 0 for s in range(n)]
    assert torch.equal(got, torch.full((2, 1), rank(), dtype=dtype))


def test_alltoall_async():
    n = size()
    handle = hvd.alltoall_async(torch.arange(n) + 10 * rank(), splits=[1] * n)
    got, received = hvd.synchronize(handle)
    assert got.tolist() == [10 * s + rank() for s in range(n)]
    assert received.tolist() == [1] * n


# ---- reducescatter ------------------------------------------------------------------------------

def scattered_rows(rows, r):
    """Rank r's (first row, row count) of a first dimension of `rows`: Horovod splits it as
    evenly as it goes, the first ranks getting one row more."""
    n = size()
    counts = [rows // n + (q < rows % n) for q in range(n)]
    return sum(counts[:r]), counts[r]


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["Sum", "Average"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.float32, torch.float64],
                         ids=str)
def test_reducescatter_gives_the_first_ranks_one_row_more(op, dtype):
    n = size()
    for rows, dims in [(2 * n + 1, 2), (n, 1), (3 * n, 3), (n + n // 2, 2), (n - 1, 2)]:
        shape = [rows] + [3, 2][:dims - 1]
        x = base(shape, torch.int64, high=8)
        got = hvd.reducescatter((x * (rank() + 1)).to(dtype), op=op)
        start, count = scattered_rows(rows, rank())
        full = x * ranks_sum()
        expected = full.to(torch.float64) / n if op == hvd.Average else full.to(torch.float64)
        if dtype in INTEGERS:
            expected = expected.trunc()
        assert got.dtype == dtype and got.shape == tuple([count] + shape[1:]), (rows, dims)
        assert torch.equal(got.to(torch.float64), expected[start:start + count]), (rows, dims)


def test_reducescatter_scales_and_async():
    n = size()
    x = base([2 * n, 2]) * (rank() + 1)
    got = hvd.synchronize(hvd.reducescatter_async(x, op=hvd.Sum, prescale_factor=0.5,
                                                  postscale_factor=4.0))
    assert torch.equal(got, (base([2 * n, 2]) * 2.0 * ranks_sum())[2 * rank():2 * rank() + 2])
    got = hvd.reducescatter(torch.full((n,), 3, dtype=torch.int64), op=hvd.Sum,
                            prescale_factor=0.5)
    assert got.tolist() == [n]


def test_grouped_reducescatter():
    n = size()
    got = hvd.grouped_reducescatter([torch.ones(n, 2) * (rank() + 1),
                                     torch.ones(2 * n + 1, dtype=torch.int32)], op=hvd.Sum)
    assert torch.equal(got[0], torch.full((1, 2), float(ranks_sum())))
    assert torch.equal(got[1], torch.full((scattered_rows(2 * n + 1, rank())[1],), n,
                                          dtype=torch.int32))
    handle = hvd.grouped_reducescatter_async([torch.ones(n) * (rank() + 1)])
    (avg,) = hvd.synchronize(handle)
    assert torch.equal(avg, torch.full((1,), ranks_sum() / n))


# ---- errors -------------------------------------------------------------------------------------

@multi_rank("ranks that disagree")
def test_mismatched_shapes_fail_with_one_message():
    r = rank()
    expect_same_error(lambda: hvd.allreduce(torch.ones([17 + r] * 3), name="e.shape"),
                      "Mismatched ALLREDUCE tensor shapes", "'e.shape'", "[17, 17, 17]",
                      "[18, 18, 18]")
    # The same number of elements in a different shape.
    shape = [17, 23 * 57] if r == 0 else [17, 23, 57]
    expect_same_error(lambda: hvd.allreduce(torch.ones(shape), name="e.dims"),
                      "Mismatched ALLREDUCE tensor shapes")
    expect_same_error(lambda: hvd.allgather(torch.ones(2, 3 + r), name="e.gather"),
                      "Mismatched ALLGATHER tensor shapes")
    expect_same_error(lambda: hvd.broadcast(torch.ones(2 + r), 0, name="e.bshape"),
                      "Mismatched BROADCAST tensor shapes")
    expect_same_error(lambda: hvd.alltoall(torch.ones([2 * size(), 10 * (r + 1)]),
                                           name="e.a2a"), "Mismatched ALLTOALL tensor shapes")
    expect_same_error(lambda: hvd.reducescatter(torch.ones(size(), 1 + r), name="e.rs"),
                      "Mismatched REDUCESCATTER tensor shapes")
    # The job goes on.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(size())))


@multi_rank("ranks that disagree")
def test_mismatched_dtypes_roots_and_ops_fail_with_one_message():
    r = rank()
    dtype = torch.float32 if r == 0 else torch.int32
    expect_same_error(lambda: hvd.allreduce(torch.ones(3, dtype=dtype), name="e.dtype"),
                      "Mismatched ALLREDUCE data types", "'e.dtype'")
    expect_same_error(lambda: hvd.allgather(torch.ones(3, dtype=dtype), name="e.gdtype"),
                      "Mismatched ALLGATHER data types")
    expect_same_error(lambda: hvd.broadcast(torch.ones(3), r, name="e.root"),
                      "Mismatched BROADCAST root ranks for tensor 'e.root'")
    op = hvd.Sum if r == 0 else hvd.Max
    expect_same_error(lambda: hvd.allreduce(torch.ones(3), op=op, name="e.op"),
                      "Mismatched ALLREDUCE reduce ops for tensor 'e.op'")
    expect_same_error(lambda: hvd.allreduce(torch.ones(3), prescale_factor=1.0 + r,
                                            name="e.scale"),
                      "Mismatched ALLREDUCE prescale factors for tensor 'e.scale'")
    # An allreduce and an allgather under one name.
    expect_same_error(lambda: (hvd.allreduce if r == 0 else hvd.allgather)(torch.ones(3),
                                                                           name="e.kind"),
                      "Mismatched collective operations for tensor 'e.kind'")
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(size())))


@multi_rank("ranks that disagree")
def test_a_group_one_of_whose_tensors_fails():
    # The group's other tensors still run (hvd fails each tensor alone); synchronize raises once
    # they are all done, never freeing an output hvd still writes into (which crashed).
    r = rank()
    for bad in [0, 1]:
        for size in [4, 1 << 16]:
            tensors = [torch.full((size,), r + 1.0) for _ in range(2)]
            tensors[bad] = torch.ones(3 + r)
            expect_same_error(lambda: hvd.grouped_allreduce(tensors, op=hvd.Sum),
                              "Mismatched ALLREDUCE tensor shapes")
            assert torch.equal(hvd.allreduce(torch.full((size,), r + 1.0), op=hvd.Sum),
                               torch.full((size,), float(ranks_sum())))


def test_arguments_a_rank_can_refuse_alone_are_value_errors():
    # As Horovod's: refused at submission on every rank, before any rank waits for the others.
    n = size()
    with pytest.raises(ValueError, match="root %d" % n):
        hvd.broadcast(torch.ones(2), n, name="e.range")
    with pytest.raises(ValueError, match="'e.splits'"):
        hvd.alltoall(torch.ones(n - 1), torch.ones(n, dtype=torch.int32), name="e.splits")
    if n > 1:
        with pytest.raises(ValueError, match="'e.even'"):
            hvd.alltoall(torch.ones(n + 1), name="e.even")
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))


def test_a_duplicate_name_in_flight_is_refused():
    # As Horovod's test: rank 0 first, then (after a barrier that waits while its operation is
    # in flight) the others. A ValueError, as Horovod's.
    x = torch.full((17, 3), rank() + 1.0)
    handle = None
    for turn in [0, 1]:
        if (rank() == 0) == (turn == 0):
            handle = hvd.allreduce_async(x, name="duplicate_name", op=hvd.Sum)
            with pytest.raises(ValueError, match="'duplicate_name'"):
                hvd.allreduce_async(x, name="duplicate_name", op=hvd.Sum)
            with pytest.raises(ValueError, match="'duplicate_name'"):
                hvd.allgather_async(x, name="duplicate_name")
        hvd.barrier()
    assert torch.equal(hvd.synchronize(handle), torch.full((17, 3), float(ranks_sum())))


def test_bad_arguments_are_value_errors():
    for dtype in [torch.bool, torch.complex64]:
        with pytest.raises(ValueError, match="not supported"):
            hvd.allreduce(torch.ones(3, dtype=dtype))
        with pytest.raises(ValueError, match="not supported"):
            hvd.allgather(torch.ones(3, dtype=dtype))
        with pytest.raises(ValueError, match="not supported"):
            hvd.broadcast(torch.ones(3, dtype=dtype), 0)
    with pytest.raises(ValueError, match="was not returned"):
        hvd.synchronize(123456789)
    with pytest.raises(ValueError, match="was not returned"):
        hvd.poll(123456789)
    handle = hvd.allreduce_async(torch.ones(1))
    hvd.synchronize(handle)
    with pytest.raises(ValueError, match="synchronized already"):
        hvd.synchronize(handle)
    with pytest.raises(ValueError):
        hvd.reducescatter(torch.tensor(1.0))
    with pytest.raises(ValueError, match="integers"):
        hvd.alltoall(torch.ones(size()), splits=torch.ones(size()))
    with pytest.raises(ValueError, match="op"):
        hvd.allreduce(torch.ones(1), op=17)
    with pytest.raises(NotImplementedError):
        hvd.allreduce(torch.ones(1), op=hvd.Adasum)
    # None of them reached the other ranks: the job goes on.
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(size())))
