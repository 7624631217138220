"""SyncBatchNorm: batch normalization with statistics over the whole batch, every rank's part."""
import torch

from hvd.torch.mpi_ops import Sum, allreduce, global_process_set


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """torch.nn.BatchNorm*d whose training-mode mean and variance are those of the batch all
    ranks hold together (Horovod's SyncBatchNorm, on CPU and CUDA tensors alike).

    The statistics are two differentiable allreduces of C and C + 1 elements per call (the sums
    that give the mean, then the centred squares that give the variance), so autograd carries
    the gradient through the other ranks' parts; evaluation mode and one rank use the running
    statistics or the local batch as torch does.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("SyncBatchNorm expects at least 2D input (got %dD)" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        # Without running statistics, evaluation normalizes by the batch's, every rank's (as
        # Horovod).
        if (not self.training and self.track_running_stats) or self.process_set.size() == 1:
            return super().forward(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)

        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        # Half precision is normalized in float32, as torch does; float64 keeps its precision.
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        local = torch.cat([torch.tensor([x.numel() // x.shape[1]], dtype=x.dtype,
                                        device=x.device), x.sum(dims)])
        total = allreduce(local, op=Sum, process_set=self.process_set)
        count, mean = total[0], total[1:] / total[0]
        centred = x - mean.view(shape)
        var = allreduce((centred * centred).sum(dims), op=Sum, process_set=self.process_set) / count
        if self.training and self.track_running_stats:
            with torch.no_grad():
                unbiased = var * count / (count - 1).clamp(min=1)
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)
