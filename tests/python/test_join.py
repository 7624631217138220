"""hvd.torch.join(): a rank whose data ran out serves the others' allreduces with zeros until
every rank has joined; other collectives meanwhile fail on every rank that submitted them."""
import pytest
import torch

import hvd.torch as hvd
from helpers import base, multi_rank, ranks_sum, same_on_every_rank


def test_join_serves_the_others_allreduces_with_zeros():
    n = hvd.size()
    rank = hvd.rank()
    for first in range(n):
        for cached in (False, True):
            a = base([5], torch.float32) * (rank + 1)
            b = base([17], torch.int32) * (rank + 1)
            if cached:  # the names enter the response cache on every rank first
                hvd.synchronize(hvd.allreduce_async(a, name="join.a", op=hvd.Sum))
                hvd.synchronize(hvd.allreduce_async(b, name="join.b"))
            if rank == first:
                last = hvd.join()
            else:
                ha = hvd.allreduce_async(a, name="join.a", op=hvd.Sum)
                hb = hvd.allreduce_async(b, name="join.b")
                got_a, got_b = hvd.synchronize(ha), hvd.synchronize(hb)
                others = ranks_sum() - (first + 1)  # the joined rank's part is zeros
                assert torch.equal(got_a, base([5], torch.float32) * others)
                # An Average still divides by every rank, the joined one too (Horovod's rule).
                assert torch.equal(got_b, (base([17], torch.int64) * others // n).to(torch.int32))
                last = hvd.join()
            assert last == same_on_every_rank(last)
            if n > 1:
                assert last != first, "the first rank to join is not the last"
            else:
                assert last == 0


@multi_rank("a rank that joins and others that do not")
def test_other_collectives_fail_on_every_rank_while_a_rank_has_joined():
    message = None
    if hvd.rank() == 0:
        hvd.join()
    else:
        with pytest.raises(hvd.HorovodInternalError) as caught:
            hvd.allgather(torch.ones(2), name="join.gather")
        message = str(caught.value)
        hvd.join()
    messages = hvd.allgather_object(message)
    assert messages[0] is None
    assert messages[1:] == [messages[1]] * (hvd.size() - 1)
    assert "ALLGATHER 'join.gather' cannot run while rank(s) 0 have joined" in messages[1]
    # The job goes on.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum),
                       torch.full((2,), float(hvd.size())))


@multi_rank("a rank that joins and others that do not")
def test_unnamed_calls_agree_after_a_call_only_some_ranks_made():
    # The unnamed allgather counts on the ranks that submitted it only (Horovod's
    # test_horovod_join_allgather): the object functions that follow are named by themselves,
    # and join() starts every rank's count afresh.
    for first in range(hvd.size()):
        if hvd.rank() == first:
            hvd.join()
        else:
            with pytest.raises(hvd.HorovodInternalError):
                hvd.allgather(torch.ones(2))
            hvd.join()
        assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
        assert hvd.broadcast_object("from 1" if hvd.rank() == 1 else None,
                                    root_rank=1) == "from 1"
    assert torch.equal(hvd.allgather(torch.full((1,), float(hvd.rank()))),
                       torch.arange(hvd.size(), dtype=torch.float32))
