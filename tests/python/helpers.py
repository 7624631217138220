"""What the collective tests share: expected values computed from rank and size, and checks
that every rank agrees."""
import os

import pytest
import torch

import hvd.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
INTEGERS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def base(shape, dtype=torch.float32, high=4):
    """Integer values 1..high, the same on every rank: every sum and product of them is exact."""
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.int64) % high + 1).reshape(shape).to(dtype)


def ranks_sum():
    """The sum of rank + 1 over the ranks: what a Sum of (rank + 1) * x gives, over x."""
    n = hvd.size()
    return n * (n + 1) // 2


def multi_rank(why):
    """Skips a test that only makes sense with more than one rank, saying why."""
    return pytest.mark.skipif(hvd.size() < 2, reason="needs 2 ranks or more: " + why)


def same_on_every_rank(value, process_set=hvd.global_process_set):
    """Asserts that every rank (of the process set) holds an equal `value` and returns it."""
    values = hvd.allgather_object(value, process_set=process_set)
    assert len(values) == process_set.size() and values == [values[0]] * len(values), values
    return values[0]


def expect_same_error(fn, *needles, process_set=hvd.global_process_set):
    """fn() fails with HorovodInternalError on every rank, with the same message everywhere,
    which holds each of needles; returns the message."""
    with pytest.raises(hvd.HorovodInternalError) as caught:
        fn()
    assert isinstance(caught.value, RuntimeError)
    message = same_on_every_rank(str(caught.value), process_set)
    for needle in needles:
        assert needle in message, message
    return message


def env_int(*names):
    """The first of the variables that is set, as an int (None if none is)."""
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return None
