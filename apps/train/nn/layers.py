"""Layers with hand-written backward passes over flat parameter buffers.

Contract of every layer
-----------------------
``param_specs()``
    The parameter tensors it needs (:class:`apps.train.nn.params.ParamSpec`).
``bind(param_views, grad_views)``
    Receives views into the model's flat parameter and gradient buffers (see
    :mod:`apps.train.nn.params`); the layer never allocates parameters itself.
``forward(x, ctx)``
    Returns the output and saves what backward needs on ``self``.
``backward(grad_out)``
    ADDS the parameter gradients into the bound gradient views (so micro-batches
    accumulate; the trainer zeroes the flat gradient buffer once per step) and
    returns the gradient with respect to the input.
``release()``
    Drops the saved tensors (used by activation recomputation).

All layers work on NumPy and CuPy arrays alike through ``xp = array_module(x)``.
Batch is always the leading axis. float16 and bfloat16 (CPU) inputs are supported;
reductions whose accuracy matters (LayerNorm statistics; bfloat16 bias gradients) run
in float32.
"""

import functools
from dataclasses import dataclass

import numpy as np

from apps.train.kernels.backend import array_module, is_bfloat16, is_cupy
from apps.train.kernels.buffers import add_bias_bfloat16, positive_bfloat16
from apps.train.kernels.gelu import gelu_backward, gelu_forward
from apps.train.kernels.gemm import gemm
from apps.train.kernels.layernorm import layer_norm_backward, layer_norm_forward
from .params import ParamSpec

_GEMM_DTYPES = (np.float16, np.float32, np.float64)


def _gemm_ready(x, weight):
    """True when the Linear products can go through :func:`apps.train.kernels.gemm.gemm`."""
    return (x.dtype == weight.dtype and (x.dtype in _GEMM_DTYPES or is_bfloat16(x.dtype))
            and x.ndim >= 1)


@functools.lru_cache(maxsize=8)
def _ones_row_cached(n, dtype_name, device_id):
    import cupy

    if dtype_name == "uint16":      # bfloat16 bit patterns: 1.0 is 0x3f80
        return cupy.full((1, n), 0x3F80, dtype=cupy.uint16)
    return cupy.ones((1, n), dtype=dtype_name)


def _ones_row(n, dtype):
    """A cached CuPy ``ones((1, n))`` (the bias-gradient GEMV operand)."""
    import cupy

    return _ones_row_cached(int(n), np.dtype(dtype).name, cupy.cuda.Device().id)


@dataclass
class ForwardContext:
    """Per-call information that layers may need.

    Attributes
    ----------
    training : bool
        Training mode (dropout active) or evaluation mode.
    seed : int
        Run seed feeding the dropout hash.
    step : int
        Optimiser step; all micro-batches of one step share it.
    sample_index : ndarray of int64, shape (batch,), optional
        GLOBAL index of each sample of this (micro-)batch, e.g. its position in
        the global batch. Dropout masks are a function of it, so a sample gets
        the same mask whichever rank or micro-batch processes it. Required when
        training with dropout.
    """

    training: bool = False
    seed: int = 0
    step: int = 0
    sample_index: object = None


class Layer:
    """Base class: a parameter-free layer with no children.

    Attributes
    ----------
    name : str
        Qualified name assigned by the enclosing model (used in the layout).
    params, grads : dict of str -> ndarray
        Views into the flat buffers, set by :meth:`bind`.
    param_range : tuple of int
        ``(lo, hi)`` slice of the flat buffers owned by this layer (and its
        children), set by the model when it builds the layout.
    """

    def __init__(self):
        self.name = type(self).__name__
        self.params = {}
        self.grads = {}
        self.param_range = (0, 0)

    # -- structure ---------------------------------------------------------
    def param_specs(self):
        return []

    def leaves(self):
        """Leaf layers in forward order (a plain layer is its own leaf)."""
        return [self]

    def assign_names(self, prefix):
        self.name = f"{prefix}{type(self).__name__}"

    @property
    def n_params(self):
        return self.param_range[1] - self.param_range[0]

    def bind(self, param_views, grad_views):
        self.params = param_views.get(self.name, {})
        self.grads = grad_views.get(self.name, {})

    # -- computation -------------------------------------------------------
    def forward(self, x, ctx):
        raise NotImplementedError

    def backward(self, grad_out):
        raise NotImplementedError

    def saved_state(self):
        """The values this layer keeps from forward for backward: its ``_saved*`` attributes, by name."""
        return {key: value for key, value in vars(self).items() if key.startswith("_saved")}

    def release(self):
        """Forget saved activations (they are recomputed when needed)."""
        for key in self.saved_state():
            setattr(self, key, None)

    def __repr__(self):
        return f"{type(self).__name__}()"


class Linear(Layer):
    """Affine map ``y = x @ weight.T + bias`` on the last axis.

    Parameters: ``weight`` (out_features, in_features), ``bias`` (out_features),
    both initialised ``U(-1/sqrt(in_features), 1/sqrt(in_features))`` (PyTorch's
    default). Input shape (..., in_features), output (..., out_features).

    ``defer_bias`` (set by :class:`apps.train.nn.sequential.Sequential` when the next
    layer is a :class:`LayerNorm` or :class:`GELU`): forward returns ``x @ weight.T``
    and leaves the bias in ``deferred_bias`` for the next layer's kernel to add on
    the fly -- one pass over the output less. The gradients are unchanged (the
    gradient with respect to ``y`` and to ``y - bias`` is the same).
    """

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.use_bias = bool(bias)
        self.defer_bias = False
        self.deferred_bias = None

    def param_specs(self):
        specs = [ParamSpec("weight", (self.out_features, self.in_features),
                           "uniform_fan_in", self.in_features)]
        if self.use_bias:
            specs.append(ParamSpec("bias", (self.out_features,), "uniform_fan_in",
                                   self.in_features))
        return specs

    def forward(self, x, ctx):
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"{self.name}: expected input with last axis {self.in_features}, "
                f"found shape {tuple(x.shape)}"
            )
        self._saved_input = x
        weight = self.params["weight"]
        if not _gemm_ready(x, weight):
            y = x @ weight.T
        else:
            x_2d = x.reshape(-1, self.in_features)
            y = array_module(x).empty((x_2d.shape[0], self.out_features), dtype=x.dtype)
            gemm(x_2d, weight, y, transpose_b=True)
            y = y.reshape(tuple(x.shape[:-1]) + (self.out_features,))
        y = self.reduce_output(y)
        self.deferred_bias = None
        if self.use_bias:
            bias = self.params["bias"]
            if self.defer_bias and y.dtype == bias.dtype:
                self.deferred_bias = bias
            elif is_gpu_bfloat16(y):
                add_bias_bfloat16(y, bias)
            else:
                y += bias
        return y

    def reduce_output(self, y):
        """Hook between the product ``x @ weight.T`` and the bias; returns ``y`` unchanged.

        A row-parallel subclass (:mod:`apps.train.parallel.tensor_parallel`) sums the partial
        products of its ranks here, so the bias is added once, after the sum.
        """
        return y

    def backward(self, grad_out, need_input_grad=True):
        """See :class:`Layer`; ``need_input_grad=False`` skips (and returns None for)
        the input gradient -- the model's first layer, whose input is the data."""
        x = self._saved_input
        weight = self.params["weight"]
        grad_2d = grad_out.reshape(-1, self.out_features)
        x_2d = x.reshape(-1, self.in_features)
        fast = _gemm_ready(x, weight) and grad_out.dtype == x.dtype
        if fast:
            # one GEMM with beta = 1 straight into the flat gradient buffer's view
            gemm(grad_2d, x_2d, self.grads["weight"], transpose_a=True, accumulate=True)
        else:
            self.grads["weight"] += grad_2d.T @ x_2d
        if self.use_bias:
            if fast and is_cupy(grad_2d):
                # column sums as ones(1, batch) @ grad: a coalesced GEMV, accumulated in place
                # (a CuPy sum over axis 0 reads the batch with a stride of out_features)
                gemm(_ones_row(grad_2d.shape[0], grad_2d.dtype), grad_2d,
                     self.grads["bias"].reshape(1, self.out_features), accumulate=True)
            elif is_bfloat16(grad_2d.dtype):
                # column sums in float32, one rounding (a bfloat16 running sum would lose the batch)
                bias_grad = self.grads["bias"]
                bias_grad[...] = bias_grad.astype(np.float32) + grad_2d.astype(np.float32).sum(axis=0)
            else:
                self.grads["bias"] += grad_2d.sum(axis=0)
        if not need_input_grad:
            return None
        if not fast:
            return (grad_2d @ weight).reshape(x.shape)
        grad_input = array_module(x).empty((grad_2d.shape[0], self.in_features), dtype=x.dtype)
        gemm(grad_2d, weight, grad_input)
        return grad_input.reshape(x.shape)

    def __repr__(self):
        return f"Linear({self.in_features}, {self.out_features})"


def is_gpu_bfloat16(array):
    """True for a CuPy array of bfloat16 bit patterns (uint16): integer arithmetic would be wrong."""
    return is_cupy(array) and array.dtype.name == "uint16"


class ReLU(Layer):
    """``y = max(x, 0)``; the gradient at exactly 0 is taken as 0."""

    def forward(self, x, ctx):
        xp = array_module(x)
        self._saved_positive = positive_bfloat16(x) if is_gpu_bfloat16(x) else x > 0
        return xp.where(self._saved_positive, x, xp.zeros((), dtype=x.dtype))

    def backward(self, grad_out):
        xp = array_module(grad_out)
        return xp.where(self._saved_positive, grad_out, xp.zeros((), dtype=grad_out.dtype))


class GELU(Layer):
    """Gaussian error linear unit, tanh approximation (Hendrycks & Gimpel 2016)::

        gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))

    This is PyTorch's ``GELU(approximate="tanh")`` and the GPT-2 formula; it
    differs from the exact erf form by < 1e-3 and needs no erf on either backend.

    When a :class:`LayerNorm` right before it applies the activation itself
    (``fused_into``, set by :class:`apps.train.nn.sequential.Sequential`), this layer
    passes values and gradients through unchanged.
    """

    def __init__(self):
        super().__init__()
        self.bias_source = None   # a Linear whose deferred bias this layer adds
        self.fused_into = None    # a LayerNorm that computes this activation

    def forward(self, x, ctx):
        if self.fused_into is not None:
            return x
        self._saved_input = x
        self._saved_input_bias = _input_bias(self.bias_source)
        return gelu_forward(x, self._saved_input_bias)

    def backward(self, grad_out):
        if self.fused_into is not None:
            return grad_out
        return gelu_backward(self._saved_input, grad_out, self._saved_input_bias)


class LayerNorm(Layer):
    """Normalise the last axis to zero mean / unit variance, then scale and shift.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the biased variance,
    ``weight`` initialised to 1 and ``bias`` to 0 (Ba, Kiros & Hinton 2016).
    Statistics are computed in float32 when the input is float16 or bfloat16.

    ``activation`` (``"gelu"``, set by :class:`apps.train.nn.sequential.Sequential`
    when a :class:`GELU` follows): the layer returns ``gelu(y)`` from the same
    kernel and the GELU layer passes through -- one write and one read of the
    activations less in each direction.
    """

    def __init__(self, normalized_size, eps=1e-5):
        super().__init__()
        self.normalized_size = int(normalized_size)
        self.eps = float(eps)
        self.bias_source = None   # a Linear whose deferred bias this layer adds
        self.activation = None    # "gelu": the following GELU is computed here

    def param_specs(self):
        return [ParamSpec("weight", (self.normalized_size,), "ones"),
                ParamSpec("bias", (self.normalized_size,), "zeros")]

    def forward(self, x, ctx):
        if x.shape[-1] != self.normalized_size:
            raise ValueError(
                f"{self.name}: expected input with last axis {self.normalized_size}, "
                f"found shape {tuple(x.shape)}"
            )
        input_bias = _input_bias(self.bias_source)
        y, mean, inverse_std = layer_norm_forward(x, self.params["weight"], self.params["bias"],
                                                  self.eps, input_bias, self.activation)
        self._saved_input = x
        self._saved_input_bias = input_bias
        self._saved_mean = mean
        self._saved_inverse_std = inverse_std
        return y

    def backward(self, grad_out):
        return layer_norm_backward(grad_out, self._saved_input, self._saved_mean,
                                   self._saved_inverse_std, self.params["weight"],
                                   self.grads["weight"], self.grads["bias"],
                                   self._saved_input_bias, self.params["bias"], self.activation)


def _input_bias(bias_source):
    """The bias a preceding Linear left to this layer in its last forward (or None)."""
    return None if bias_source is None else bias_source.deferred_bias


#: Layers whose kernels add a preceding Linear's bias on the fly.
BIAS_FOLDING_LAYERS = (LayerNorm, GELU)


class Flatten(Layer):
    """``(batch, d1, d2, ...) -> (batch, d1 * d2 * ...)``."""

    def forward(self, x, ctx):
        self._saved_shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, grad_out):
        return grad_out.reshape(self._saved_shape)


class Reshape(Layer):
    """``(batch, ...) -> (batch, *shape)``, e.g. ``Reshape((1, 40))`` before Conv1d."""

    def __init__(self, shape):
        super().__init__()
        self.shape = tuple(int(s) for s in shape)

    def forward(self, x, ctx):
        self._saved_shape = x.shape
        return x.reshape((x.shape[0],) + self.shape)

    def backward(self, grad_out):
        return grad_out.reshape(self._saved_shape)

    def __repr__(self):
        return f"Reshape({self.shape})"
