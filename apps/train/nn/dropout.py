"""Inverted dropout with a mask that does not depend on the decomposition (a layer of :mod:`apps.train.nn.layers`)."""

import numpy as np

from apps.train.kernels.backend import array_module
from apps.train.kernels.buffers import scale_bfloat16
from .layers import Layer, is_gpu_bfloat16
from apps.train.kernels.random_mask import keep_mask


class Dropout(Layer):
    """Inverted dropout with a decomposition-independent mask.

    In training, each element is kept with probability ``1 - p`` and scaled by
    ``1 / (1 - p)``; in evaluation the layer is the identity. The keep-mask is
    a counter-based hash of ``(ctx.seed, ctx.step, stream, global sample index,
    element index)`` (see :mod:`apps.train.kernels.random_mask`), so it does not depend
    on which rank or micro-batch processes a sample, and recomputation
    reproduces it exactly.

    Parameters
    ----------
    p : float
        Drop probability, ``0 <= p < 1``.
    stream : int, optional
        Distinguishes dropout layers; the model numbers them in forward order
        when left as None.
    """

    def __init__(self, p, stream=None):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: expected 0 <= p < 1, found p={p}")
        self.p = float(p)
        self.stream = stream
        self._identity = True

    def forward(self, x, ctx):
        self._saved_mask = None
        self._identity = not ctx.training or self.p == 0.0
        if self._identity:
            return x
        if ctx.sample_index is None:
            raise ValueError(
                f"{self.name}: training with dropout needs ctx.sample_index (the global "
                "index of every sample in the batch); set it in the ForwardContext"
            )
        xp = array_module(x)
        sample_index = xp.asarray(ctx.sample_index)
        if sample_index.shape != (x.shape[0],):
            raise ValueError(
                f"{self.name}: ctx.sample_index has shape {tuple(sample_index.shape)}, "
                f"expected ({x.shape[0]},) to match the batch"
            )
        n_elements = int(np.prod(x.shape[1:], dtype=np.int64))
        mask = keep_mask(sample_index, n_elements, ctx.seed, ctx.step, self.stream or 0,
                         1.0 - self.p).reshape(x.shape)
        self._saved_mask = mask
        return xp.where(mask, self._scaled(x), xp.zeros((), dtype=x.dtype))

    def _scaled(self, values):
        """``values / (1 - p)``, the factor rounded to the values' dtype."""
        if is_gpu_bfloat16(values):
            return scale_bfloat16(values, 1.0 / (1.0 - self.p))
        return values * array_module(values).asarray(1.0 / (1.0 - self.p), dtype=values.dtype)

    def backward(self, grad_out):
        if self._identity:
            return grad_out
        if self._saved_mask is None:
            raise RuntimeError(f"{self.name}: backward called without a preceding forward")
        xp = array_module(grad_out)
        return xp.where(self._saved_mask, self._scaled(grad_out), xp.zeros((), dtype=grad_out.dtype))

    def __repr__(self):
        return f"Dropout(p={self.p})"
