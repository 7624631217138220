"""What goes on the wire for a gradient: as it is, or halved to float16 (Horovod's Compression)."""
import torch


class Compressor:
    """compress() returns the tensor to send and what decompress() needs to undo it."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes of float32; the sum is taken in
    float16) and returns them in their own dtype; other tensors go as they are."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx.is_floating_point else tensor


class Compression:
    """The compressors DistributedOptimizer and allreduce take (compression=...)."""

    none = NoneCompressor
    fp16 = FP16Compressor
