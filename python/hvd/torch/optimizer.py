"""DistributedOptimizer: gradients averaged over the ranks while the backward pass runs."""
import contextlib
import warnings

import torch

from hvd.torch.compression import Compression
from hvd.torch.mpi_ops import (Adasum, Average, _grouped_allreduce_async, _op, allreduce_async_,
                               global_process_set, size, sparse_allreduce_async, synchronize)


class _DistributedOptimizer:
    """Mixed into the wrapped optimizer's class: see DistributedOptimizer."""

    def _hvd_setup(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor, groups, sparse_as_dense, process_set):
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is None:
            named = [("allreduce.noname.%d" % i, p) for i, p in enumerate(params)]
        else:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
                raise ValueError("named_parameters is a sequence of (name, parameter) pairs, as "
                                 "model.named_parameters() makes")
            names = [name for name, _ in named]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError("parameter names in named_parameters must be unique; "
                                 "duplicates: %s" % ", ".join(duplicates))
            named_ids = {id(p) for _, p in named}
            unnamed = [p for p in params if id(p) not in named_ids]
            if unnamed:
                raise ValueError("named_parameters was given, but %d of the optimizer's "
                                 "parameters are not in it (shapes %s)"
                                 % (len(unnamed), ", ".join(str(tuple(p.shape)) for p in unnamed)))
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step is at least 1")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        self._hvd_names = {}
        for name, p in named:
            self._hvd_names.setdefault(p, name)  # a tensor named twice (tied weights) once
        self._parameter_names = self._hvd_names  # Horovod's name for it, which scripts read
        # Only the wrapped optimizer's own parameters, as Horovod: named_parameters may name a
        # whole model of which another optimizer steps the rest (and reduces its gradients).
        own = [p for p in dict.fromkeys(params) if p.requires_grad]
        self._hvd_compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self._hvd_op = op
        # Average over the ranks split as Horovod does: x / f before the sum, x f / size after.
        self._hvd_scales = (1.0 / gradient_predivide_factor, gradient_predivide_factor)
        self._hvd_sparse_as_dense = sparse_as_dense
        self._hvd_process_set = process_set
        self._hvd_handles = {}   # parameter -> (handle, compression context), this step
        self._hvd_delay = {}     # parameter -> backward passes left before its allreduce
        self._hvd_hooks = []
        self._hvd_synchronized = False
        self._hvd_should_synchronize = True
        self._hvd_groups = self._hvd_make_groups(groups, own)
        self._hvd_group_ready = {}  # group index -> parameters of it whose gradient is ready
        # One rank has nothing to average with: no hooks, no allreduce (as Horovod).
        self._hvd_reduced = own
        if process_set.included() and process_set.size() > 1:
            self._hvd_register_hooks()
        else:
            self._hvd_reduced = []

    def _hvd_make_groups(self, groups, params):
        if groups is None:
            return {}
        if isinstance(groups, int):
            if groups <= 0:
                raise ValueError("groups is a positive number or a list of lists of parameters")
            # Horovod's split_list: consecutive parameters, the first groups one longer.
            size, extra = divmod(len(params), groups)
            lists = [params[i * size + min(i, extra):(i + 1) * size + min(i + 1, extra)]
                     for i in range(groups)]
        else:
            lists = [list(g) for g in groups]
            if any(not isinstance(p, torch.Tensor) for g in lists for p in g):
                raise ValueError("groups are lists of parameters (torch tensors)")
            own = set(params)
            lists = [[p for p in g if p in own] for g in lists]
        group_of = {}
        for index, members in enumerate(lists):
            for p in members:
                if p in group_of:
                    raise ValueError("a parameter appears in more than one group")
                group_of[p] = index
        self._hvd_group_members = lists
        return group_of

    def _hvd_register_hooks(self):
        for p in self._hvd_reduced:
            self._hvd_delay[p] = self.backward_passes_per_step
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch 2.1 and later
                self._hvd_hooks.append(p.register_post_accumulate_grad_hook(
                    lambda param: self._hvd_gradient_ready(param)))
            else:  # the gradient accumulator's own hook, which runs once .grad is summed
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                accumulator.register_hook(self._hvd_make_hook(p))
                self._hvd_hooks.append(accumulator)

    def _hvd_make_hook(self, p):
        def hook(*_):
            self._hvd_gradient_ready(p)
        return hook

    def _hvd_gradient_ready(self, p):
        if p in self._hvd_handles and self._hvd_handles[p][0] is not None:
            if self._hvd_delay[p] <= 0:
                raise AssertionError(
                    "gradients were computed more than backward_passes_per_step times before "
                    "step(); raise backward_passes_per_step to accumulate them locally")
        self._hvd_delay[p] -= 1
        if self._hvd_delay[p] > 0:
            self._hvd_handles[p] = (None, None)
            return
        if p in self._hvd_groups:
            index = self._hvd_groups[p]
            ready = self._hvd_group_ready.setdefault(index, [])
            ready.append(p)
            if len(ready) == len(self._hvd_group_members[index]):
                self._hvd_submit_group(index)
            else:
                self._hvd_handles[p] = (None, None)
            return
        self._hvd_handles[p] = self._hvd_submit(p)

    def _hvd_gradient(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse and self._hvd_sparse_as_dense:
            return p.grad.to_dense()  # reduced dense, handed back sparse (synchronize)
        return p.grad

    def _hvd_submit(self, p):
        gradient = self._hvd_gradient(p)
        if gradient.is_sparse:  # Horovod's way: every rank's indices and values, gathered
            result = sparse_allreduce_async(gradient, "allreduce." + self._hvd_names[p],
                                            self._hvd_op, self._hvd_process_set)
            return result, "sparse"
        compressed, ctx = self._hvd_compression.compress(gradient)
        handle = allreduce_async_(compressed, name="allreduce." + self._hvd_names[p],
                                  op=self._hvd_op, prescale_factor=self._hvd_scales[0],
                                  postscale_factor=self._hvd_scales[1],
                                  process_set=self._hvd_process_set)
        return handle, (compressed, ctx)

    def _hvd_submit_group(self, index):
        members = self._hvd_group_members[index]
        compressed = [self._hvd_compression.compress(self._hvd_gradient(p)) for p in members]
        tensors = [c for c, _ in compressed]
        handle = _grouped_allreduce_async(
            tensors, tensors, "allreduce.group." + self._hvd_names[members[0]], self._hvd_op,
            self._hvd_scales[0], self._hvd_scales[1], self._hvd_process_set)
        for i, p in enumerate(members):
            self._hvd_handles[p] = (handle, (i, compressed[i]))
        self._hvd_group_ready[index] = []

    def synchronize(self):
        """Waits until every gradient is averaged and left in its parameter's .grad. Gradients
        of parameters that got none this step are submitted now, as zeros, so no rank waits
        for a gradient another rank never makes. step() calls it; call it yourself to work on
        the averaged gradients (clip them) before step() under skip_synchronize()."""
        if not self._hvd_reduced:
            self._hvd_synchronized = True
            return
        for p in self._hvd_reduced:
            if p not in self._hvd_handles or self._hvd_handles[p][0] is None:
                if p in self._hvd_groups:
                    index = self._hvd_groups[p]
                    if p not in self._hvd_group_ready.get(index, []):
                        self._hvd_group_ready.setdefault(index, []).append(p)
                    if len(self._hvd_group_ready[index]) == len(self._hvd_group_members[index]):
                        self._hvd_submit_group(index)
                else:
                    self._hvd_handles[p] = self._hvd_submit(p)
        results = {}
        first_error = None
        for p in self._hvd_reduced:
            handle, ctx = self._hvd_handles[p]
            if ctx == "sparse":
                try:
                    p.grad = handle()
                except Exception as e:  # noqa: BLE001 (the rest are still waited for)
                    first_error = first_error or e
                self._hvd_delay[p] = self.backward_passes_per_step
                continue
            try:
                if handle not in results:
                    results[handle] = synchronize(handle)
            except Exception as e:  # wait for the rest before raising: hvd writes their buffers
                results[handle] = None
                first_error = first_error or e
                continue
            if results[handle] is None:
                continue
            if p in self._hvd_groups:
                i, (compressed, context) = ctx
                output = results[handle][i]
            else:
                compressed, context = ctx
                output = results[handle]
            reduced = self._hvd_compression.decompress(output, context)
            if p.grad.is_sparse:  # sparse_as_dense: the optimizer (SparseAdam) takes it sparse
                p.grad.zero_().add_(reduced.to_sparse())
            elif reduced.data_ptr() != p.grad.data_ptr():
                p.grad.copy_(reduced)
            self._hvd_delay[p] = self.backward_passes_per_step
        self._hvd_handles.clear()
        self._hvd_group_ready.clear()
        if first_error is not None:
            raise first_error
        self._hvd_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside it does not synchronize: call synchronize() yourself before it."""
        self._hvd_should_synchronize = False
        try:
            yield
        finally:
            self._hvd_should_synchronize = True

    def step(self, closure=None):
        if self._hvd_should_synchronize:
            if self._hvd_synchronized and self._hvd_reduced:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(): the gradients are reduced "
                              "again; step inside `with optimizer.skip_synchronize():`")
            self.synchronize()
        self._hvd_synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        # Also between the backward passes of one step (as Horovod): their sum would be lost.
        if self._hvd_handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(): the "
                                 "gradients are still being averaged")
        return super().zero_grad(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._hvd_delay:
            self._hvd_delay[p] = passes

    def load_state_dict(self, *args, **kwargs):
        self._hvd_handles.clear()
        self._hvd_group_ready.clear()
        self._hvd_synchronized = False
        for p in self._hvd_delay:
            self._hvd_delay[p] = self.backward_passes_per_step
        return super().load_state_dict(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps `optimizer` so that its step() uses gradients averaged over the ranks.

    Each gradient leaves for the allreduce as soon as autograd has accumulated it (after
    `backward_passes_per_step` backward passes), so communication overlaps the rest of the
    backward pass; step() waits for them, then steps. Returns an optimizer of the wrapped one's
    class over the same parameter groups (Horovod's design): use it in the wrapped one's place.

    named_parameters: model.named_parameters(), whose names name the allreduces (the same on
    every rank); compression: Compression.none or Compression.fp16; op: Average or Sum;
    gradient_predivide_factor f: each gradient is divided by f before the sum and multiplied by
    f / size after; groups: a number of groups, or lists of parameters, each reduced as one
    grouped allreduce (num_groups is Horovod's older spelling); process_set: the ranks to
    average over.
    """
    op = _op(op, None)
    if op == Adasum:
        raise NotImplementedError("hvd has no Adasum")
    if num_groups and groups is None:
        groups = num_groups
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    # The wrapped class's own constructor over the same parameter groups (whose options are its
    # arguments), as Horovod: whatever state it makes there (Adagrad's sums) is made. What the
    # wrapped optimizer holds already (a checkpoint loaded into it) is kept.
    distributed = cls(optimizer.param_groups)
    distributed.state.update(optimizer.state)
    for key, value in optimizer.__dict__.items():
        distributed.__dict__.setdefault(key, value)
    distributed._hvd_setup(named_parameters, compression, backward_passes_per_step, op,
                           gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return distributed
