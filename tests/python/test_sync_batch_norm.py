"""SyncBatchNorm: its output, running statistics and gradients are those of torch.nn.BatchNorm*d
on the concatenation of every rank's batch, which each rank builds here from the allgathered
inputs."""
import pytest
import torch

import hvd.torch as hvd
from helpers import multi_rank

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def rank():
    return hvd.rank()


def size():
    return hvd.size()


def batch(r, shape, dtype):
    """Rank r's batch: integers that differ from rank to rank (and, at rank r, r + 2 rows)."""
    shape = [r + 2] + shape
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n) * (r + 3)) % 11 - 5 + r).reshape(shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape,momentum", [([3], 0.1), ([3, 5], None), ([2, 3, 2], 0.3)],
                         ids=["1d", "2d-cumulative", "3d"])
def test_sync_batch_norm_is_batch_norm_over_every_ranks_batch(shape, momentum, dtype):
    close = TOLERANCE[dtype]
    channels = shape[0]
    reference = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm1d,
                 3: torch.nn.BatchNorm2d}[len(shape)](channels, momentum=momentum).to(dtype)
    sync = hvd.SyncBatchNorm(channels, momentum=momentum).to(dtype)
    with torch.no_grad():
        for module in (reference, sync):
            module.weight.copy_(torch.arange(1.0, channels + 1))
            module.bias.copy_(torch.arange(channels) * 0.5)
    everyone = torch.cat([batch(r, shape, dtype) for r in range(size())])
    assert torch.equal(hvd.allgather(batch(rank(), shape, dtype)), everyone)
    start = sum(r + 2 for r in range(rank()))
    mine = slice(start, start + rank() + 2)
    # A loss weighing every output differently, so that gradients show where they came from.
    weights = torch.arange(everyone.numel(), dtype=dtype).reshape(everyone.shape) % 7 - 3

    for step in range(2):  # running statistics over two steps
        x = everyone[mine].clone().requires_grad_()
        out = sync(x)
        assert out.dtype == dtype
        full = everyone.clone().requires_grad_()
        expected = reference(full)
        assert torch.allclose(out, expected[mine], **close), step
        assert torch.allclose(sync.running_mean, reference.running_mean, **close), step
        assert torch.allclose(sync.running_var, reference.running_var, **close), step
        assert int(sync.num_batches_tracked) == step + 1

        (out * weights[mine]).sum().backward()
        (expected * weights).sum().backward()
        # The input's gradient is that of the loss of every rank together; the parameters'
        # are this rank's part of it (DistributedOptimizer would sum or average them).
        assert torch.allclose(x.grad, full.grad[mine], **close), step
        for got, want in [(sync.weight.grad, reference.weight.grad),
                          (sync.bias.grad, reference.bias.grad)]:
            assert torch.allclose(hvd.allreduce(got, op=hvd.Sum), want, **close), step
        for module in (sync, reference):
            module.zero_grad()

    # Evaluation: the running statistics, no communication.
    sync.eval()
    reference.eval()
    x = batch(rank(), shape, dtype)
    assert torch.allclose(sync(x), reference(x), **close)


@multi_rank("one rank uses torch's BatchNorm")
def test_sync_batch_norm_without_running_statistics_syncs_in_evaluation_too():
    # Horovod: without running statistics, evaluation normalizes by the batch's, every rank's.
    shape = [2, 3]
    sync = hvd.SyncBatchNorm(2, track_running_stats=False).double().eval()
    reference = torch.nn.BatchNorm1d(2, track_running_stats=False).double().eval()
    everyone = torch.cat([batch(r, shape, torch.float64) for r in range(size())])
    start = sum(r + 2 for r in range(rank()))
    expected = reference(everyone)[start:start + rank() + 2]
    assert torch.allclose(sync(batch(rank(), shape, torch.float64)), expected,
                          **TOLERANCE[torch.float64])


def test_sync_batch_norm_wants_two_dimensions():
    with pytest.raises(ValueError):
        hvd.SyncBatchNorm(3)(torch.ones(3))
