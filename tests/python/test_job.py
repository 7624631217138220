"""The job around the collectives: its layout, init and shutdown, barriers, process sets and
Ctrl-C."""
import os
import signal
import threading
import time

import pytest
import torch

import hvd.torch as hvd
from helpers import env_int, expect_same_error, multi_rank, ranks_sum, same_on_every_rank


def test_rank_and_size_are_the_launchers():
    assert hvd.is_initialized()
    assert hvd.rank() == env_int("HVD_RANK", "OMPI_COMM_WORLD_RANK")
    assert hvd.size() == env_int("HVD_SIZE", "OMPI_COMM_WORLD_SIZE")
    assert hvd.local_rank() == env_int("HVD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
    assert hvd.local_size() == env_int("HVD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")
    # One host: each rank's cross communicator (the ranks with its local rank) is itself.
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    assert hvd.is_homogeneous()
    assert hvd.backend() == os.environ.get("HVD_BACKEND", "gloo")
    assert hvd.gloo_enabled() == (hvd.backend() == "gloo")
    assert hvd.mpi_enabled() == (hvd.backend() == "mpi")
    # The build made the plugin the job runs on.
    assert {"gloo": hvd.gloo_built, "mpi": hvd.mpi_built, "ofi": hvd.ofi_built,
            "nccl": hvd.nccl_built}[hvd.backend()]()
    assert same_on_every_rank(hvd.size()) == hvd.size()
    assert sorted(hvd.allgather_object(hvd.rank())) == list(range(hvd.size()))


def test_init_again_after_shutdown():
    before = (hvd.rank(), hvd.size(), hvd.local_rank())
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.rank()
    hvd.shutdown()  # twice is harmless
    hvd.init()
    hvd.init()  # and so is init on an initialized job
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size(), hvd.local_rank()) == before
    # Unnamed operations are numbered afresh on every rank alike.
    assert torch.equal(hvd.allreduce(torch.full((3,), hvd.rank() + 1.0), op=hvd.Sum),
                       torch.full((3,), float(ranks_sum())))


@multi_rank("a rank to wait for")
def test_barrier_waits_for_every_rank():
    late = hvd.size() - 1
    hvd.barrier()
    started = time.monotonic()
    if hvd.rank() == late:
        time.sleep(0.6)
    hvd.barrier()
    waited = time.monotonic() - started
    if hvd.rank() != late:  # the ranks left the first barrier within a fraction of that
        assert waited > 0.3, waited
    hvd.barrier(process_set=hvd.global_process_set)


def test_barrier_with_operations_in_flight():
    handles = [hvd.broadcast_async(torch.eye(3) * (hvd.rank() + 1), root_rank=0),
               hvd.allgather_async(torch.eye(2)),
               hvd.allreduce_async(torch.eye(4), op=hvd.Sum)]
    hvd.barrier()
    assert torch.equal(hvd.synchronize(handles[2]), torch.eye(4) * hvd.size())
    assert torch.equal(hvd.synchronize(handles[1]), torch.eye(2).repeat(hvd.size(), 1))
    assert torch.equal(hvd.synchronize(handles[0]), torch.eye(3))


# ---- process sets -------------------------------------------------------------------------------

def test_process_sets():
    n, me = hvd.size(), hvd.rank()
    evens = hvd.add_process_set([r for r in range(n) if r % 2 == 0])
    tail = hvd.add_process_set(hvd.ProcessSet(range(1, n))) if n > 1 else None
    try:
        assert evens.process_set_id is not None and evens.size() == (n + 1) // 2
        assert evens.ranks == list(range(0, n, 2))
        if me % 2 == 0:
            assert evens.included() and evens.rank() == me // 2
            got = hvd.allreduce(torch.full((3,), me + 1.0), op=hvd.Sum, process_set=evens)
            assert torch.equal(got, torch.full((3,), float(sum(r + 1 for r in range(0, n, 2)))))
            assert torch.equal(hvd.allgather(torch.tensor([me]), process_set=evens),
                               torch.arange(0, n, 2))
            hvd.barrier(process_set=evens)
        else:
            assert not evens.included() and evens.rank() == -1
            for op in [lambda: hvd.allreduce(torch.ones(1), process_set=evens),
                       lambda: hvd.allgather(torch.ones(1), process_set=evens),
                       lambda: hvd.broadcast(torch.ones(1), 0, process_set=evens),
                       lambda: hvd.barrier(process_set=evens)]:
                with pytest.raises(ValueError, match="not a member"):
                    op()
        if tail is not None and me > 0:
            # Roots are ranks of the job, not of the set: rank r is the set's rank r - 1.
            assert tail.rank() == me - 1
            for root in range(1, n):
                x = torch.full((2,), me * 10.0)
                assert torch.equal(hvd.broadcast(x, root, process_set=tail),
                                   torch.full((2,), root * 10.0)), root
                hvd.broadcast_(x, root, process_set=tail)
                assert torch.equal(x, torch.full((2,), root * 10.0)), root
            with pytest.raises(ValueError, match="not a member"):
                hvd.broadcast(torch.ones(1), 0, process_set=tail)
            got = hvd.alltoall(torch.full((n - 1,), float(me)), process_set=tail)
            assert torch.equal(got, torch.arange(1.0, n))
            got = hvd.reducescatter(torch.full((n - 1, 2), float(me)), op=hvd.Sum,
                                    process_set=tail)
            assert torch.equal(got, torch.full((1, 2), float(ranks_sum() - n)))
    finally:
        if tail is not None:
            assert hvd.remove_process_set(tail)
        assert hvd.remove_process_set(evens)
    assert evens.process_set_id is None and evens.size() is None
    with pytest.raises(ValueError, match="has not been added"):
        hvd.allreduce(torch.ones(1), process_set=evens)
    assert not hvd.remove_process_set(evens)
    assert not hvd.remove_process_set(hvd.global_process_set)
    # The world goes on, and a set with the same ranks can be made again.
    again = hvd.add_process_set(list(range(0, n, 2)))
    try:
        if again.included():
            assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=again),
                               torch.full((1,), float(again.size())))
    finally:
        hvd.remove_process_set(again)


@multi_rank("a set of two ranks")
def test_process_set_errors_are_the_sets_own():
    pair = hvd.add_process_set([0, 1])
    try:
        if pair.included():
            r = pair.rank()
            expect_same_error(lambda: hvd.allreduce(torch.ones(4 + r), process_set=pair,
                                                    name="e.set"), "'e.set'", process_set=pair)
    finally:
        hvd.remove_process_set(pair)


def test_process_sets_given_to_init():
    n = hvd.size()
    hvd.shutdown()
    first = hvd.ProcessSet([0])
    # A rank list given in any order (not at one rank: the same ranks as `first`).
    sets = [first] + ([list(reversed(range(n)))] if n > 1 else [])
    hvd.init(process_sets=sets)
    try:
        assert first.process_set_id is not None and first.size() == 1
        assert first.included() == (hvd.rank() == 0)
        if hvd.rank() == 0:
            assert torch.equal(hvd.allreduce(torch.full((1,), 5.0), op=hvd.Sum,
                                             process_set=first), torch.full((1,), 5.0))
        if n > 1:
            everyone = hvd.ProcessSet(range(n))
            assert everyone.process_set_id is None
            added = hvd.add_process_set([n - 1])
            assert added.process_set_id not in (0, first.process_set_id)
            assert torch.equal(hvd.allgather(torch.tensor([hvd.rank()]), process_set=added)
                               if added.included() else torch.tensor([n - 1]),
                               torch.tensor([n - 1]))
            hvd.remove_process_set(added)
        with pytest.raises(ValueError, match="exists already"):
            hvd.add_process_set([0])
    finally:
        hvd.shutdown()
        assert first.process_set_id is None  # shutdown forgets the sets
        hvd.init()


# ---- Ctrl-C -------------------------------------------------------------------------------------

@multi_rank("a rank that has not submitted yet")
def test_ctrl_c_interrupts_a_wait():
    # Each rank waits for a tensor no other rank has submitted yet; a SIGINT from a timer must
    # end the wait with KeyboardInterrupt. Once every rank has been interrupted (the barrier),
    # every rank submits the others' names, so all complete.
    me = hvd.rank()
    handle = hvd.allreduce_async(torch.ones(1), name="sigint.%d" % me, op=hvd.Sum)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        hvd.synchronize(handle)
    timer.join()
    hvd.barrier()
    others = [hvd.allreduce_async(torch.ones(1), name="sigint.%d" % r, op=hvd.Sum)
              for r in range(hvd.size()) if r != me]
    assert torch.equal(hvd.synchronize(handle), torch.full((1,), float(hvd.size())))
    for h in others:
        assert torch.equal(hvd.synchronize(h), torch.full((1,), float(hvd.size())))
