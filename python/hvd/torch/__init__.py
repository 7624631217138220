"""Horovod's PyTorch API over hvd: `import hvd.torch as hvd` where a script had
`import horovod.torch as hvd` (docs/python.md says what differs)."""
from hvd.torch.compression import Compression
from hvd.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                 broadcast_parameters)
from hvd.torch.mpi_ops import (Adasum, Average, HorovodInternalError, Max, Min, ProcessSet,
                               Product, Sum, add_process_set, allgather, allgather_async,
                               allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
                               alltoall_async, backend, barrier, broadcast, broadcast_,
                               broadcast_async, broadcast_async_, ccl_built, cross_rank,
                               cross_size, cuda_built, ddl_built, global_process_set,
                               gloo_built, gloo_enabled, grouped_allgather,
                               grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                               grouped_allreduce_async, grouped_allreduce_async_,
                               grouped_reducescatter, grouped_reducescatter_async, init,
                               is_homogeneous, is_initialized, join, local_rank, local_size,
                               mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                               ofi_built, poll, rank, reducescatter, reducescatter_async,
                               remove_process_set, rocm_built, shutdown, size,
                               sparse_allreduce_async, synchronize)
from hvd.torch.optimizer import DistributedOptimizer
from hvd.torch.sync_batch_norm import SyncBatchNorm
