"""Precision policies: plain fp32/fp64, fp16 mixed precision with loss scaling, bf16 mixed precision.

Mixed precision (Micikevicius et al. 2018)
------------------------------------------
* fp32 *master* weights (``master_params``) are what the optimiser updates and what
  checkpoints store;
* the model runs on an fp16 *compute copy* (``compute_params``), refreshed from the
  masters after every applied step with one cast into the same buffer (the layers'
  views stay valid);
* the loss gradient is multiplied by ``loss_scale`` so small fp16 gradients do not
  flush to zero; backward writes fp16 gradients into ``compute_grads`` (which is
  what a data-parallel allreduce would sum -- half the bytes of fp32);
* :meth:`MixedPrecision.grads_to_master` casts them to fp32 and divides by the
  scale into ``master_grads``;
* :class:`DynamicLossScaler` halves the scale and SKIPS the step when any gradient
  is inf/nan, and doubles it after ``growth_interval`` consecutive good steps.

bf16 mixed precision (:class:`BFloat16Precision`)
-------------------------------------------------
The same fp32 masters and compute copy, in bfloat16 (8 exponent bits like
float32, 7 mantissa bits): its range is float32's, so small gradients do not
flush to zero and there is NO loss scaling (``loss_scale`` is 1, no step is
skipped; a non-finite value is a divergence, caught by the run's NaN check as
in fp32). Gradients are bfloat16 in ``compute_grads``; a data-parallel allreduce
sums them in float32 (MPI has no bfloat16: they travel as float32 copies and
the sum is rounded to bfloat16 once; ZeRO-1's reduce-scatter likewise);
:meth:`BFloat16Precision.grads_to_master` casts them to the fp32 ``master_grads``
that the optimiser reads. The split model (:mod:`apps.train.parallel.trainer`)
uses the same policy; its tensor allreduces and pipeline messages carry bfloat16
activations. The bfloat16
arrays are NumPy arrays of ``ml_dtypes.bfloat16`` on the CPU and, as CuPy has no
bfloat16 dtype, ``uint16`` CuPy arrays of bit patterns on the GPU (the kernels
convert them, see :mod:`apps.train.kernels.cuda_source`).

All policies expose the same attributes, so the trainer does not branch on
precision. The inf/nan test is split the same way as gradient clipping: the
caller computes a local flag/sum, may reduce it over ranks, then calls
:meth:`update_scale`.
"""

import numpy as np

from apps.train.kernels.backend import array_module, bfloat16_dtype, is_cupy
from apps.train.kernels.cuda_source import BFLOAT16_BITS
from apps.train.kernels.buffers import round_to_bfloat16, scaled_copy

#: The names :func:`make_precision` accepts (``--precision``).
PRECISIONS = ("fp32", "fp16", "bf16", "fp64")


def bfloat16_bits(values):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even, by integer arithmetic.

    The formula of the GPU conversion (``store_math`` for bfloat16 storage): add
    ``0x7FFF`` plus the lowest kept bit to the float32 pattern and keep the upper 16
    bits -- ties go to the even pattern, values past the largest bfloat16 round to
    inf, subnormals round like normal numbers (no flush to zero). NaN becomes the
    quiet NaN ``0x7FC0`` with its sign (what ``ml_dtypes`` gives).

    Parameters
    ----------
    values : ndarray of float32 (NumPy or CuPy)

    Returns
    -------
    ndarray of uint16, shape of ``values``
    """
    xp = array_module(values)
    bits = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    rounded = (bits + (xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1)))) >> 16
    quiet_nan = ((bits >> 16) & xp.uint32(0x8000)) | xp.uint32(0x7FC0)
    return xp.where(xp.isnan(values), quiet_nan, rounded).astype(xp.uint16)


def bfloat16_bits_to_float32(bits):
    """bfloat16 bit patterns (uint16) -> float32, exact: the pattern is the upper half of a float32."""
    xp = array_module(bits)
    return (xp.asarray(bits, dtype=xp.uint16).astype(xp.uint32) << 16).view(xp.float32)


class DynamicLossScaler:
    """Loss scale that backs off on overflow and grows after a run of good steps.

    Parameters
    ----------
    init_scale : float
        Initial scale (default 2**16, as PyTorch's GradScaler).
    growth_factor, backoff_factor : float
        Multiply the scale by these after ``growth_interval`` good steps / on a
        non-finite gradient.
    growth_interval : int
        Number of consecutive applied steps before the scale grows.
    min_scale, max_scale : float
        Bounds of the scale.
    """

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, min_scale=1.0, max_scale=2.0**24):
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1
                and growth_interval >= 1 and 0 < min_scale <= init_scale <= max_scale):
            raise ValueError(
                "DynamicLossScaler: expected init_scale in [min_scale, max_scale], "
                "growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1; found "
                f"init_scale={init_scale}, growth_factor={growth_factor}, "
                f"backoff_factor={backoff_factor}, growth_interval={growth_interval}, "
                f"min_scale={min_scale}, max_scale={max_scale}"
            )
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)
        self.good_steps = 0
        self.skipped_steps = 0

    def update(self, found_nonfinite):
        """Record one step's outcome; return True when the step must be APPLIED.

        ``found_nonfinite`` must be the same on every rank (reduce it first).
        """
        if found_nonfinite:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            self.skipped_steps += 1
            return False
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, self.max_scale)
            self.good_steps = 0
        return True

    def state_dict(self):
        """Checkpointable state as plain NumPy scalars."""
        return {"scale": np.float64(self.scale), "good_steps": np.int64(self.good_steps),
                "skipped_steps": np.int64(self.skipped_steps)}

    def load_state_dict(self, state):
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state["skipped_steps"])


class FullPrecision:
    """Train directly in the master dtype (float32 or float64): no copies, scale 1.

    Attributes
    ----------
    master_params, compute_params : ndarray, shape (n_params,)
        The same buffer.
    master_grads, compute_grads : ndarray, shape (n_params,)
        The same buffer.
    """

    name = "full"
    loss_scale = 1.0

    def __init__(self, master_params):
        xp = array_module(master_params)
        self.master_params = master_params
        self.compute_params = master_params
        self.master_grads = xp.zeros_like(master_params)
        self.compute_grads = self.master_grads

    def grads_to_master(self, lo=0, hi=None):
        """Nothing to convert; returns None."""

    def update_scale(self, found_nonfinite):
        """Always apply the step (no loss scaling in full precision)."""
        return True

    def refresh_compute_params(self):
        """Nothing to refresh; returns None."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class MixedPrecision:
    """fp32 master weights, fp16 compute copies and dynamic loss scaling.

    Parameters
    ----------
    master_params : ndarray of float32, shape (n_params,)
    compute_dtype : str
        ``"float16"``.
    scaler : DynamicLossScaler, optional
    """

    name = "mixed"

    def __init__(self, master_params, compute_dtype="float16", scaler=None):
        xp = array_module(master_params)
        if master_params.dtype != xp.float32:
            raise TypeError(
                f"MixedPrecision: master weights must be float32, found {master_params.dtype}"
            )
        self.master_params = master_params
        self.compute_params = master_params.astype(compute_dtype)
        self.compute_grads = xp.zeros_like(self.compute_params)
        self.scaler = scaler if scaler is not None else DynamicLossScaler()
        self._master_grads = None

    @property
    def master_grads(self):
        """float32 gradients, allocated on first use: the fused optimiser step
        (:meth:`apps.train.training.optim.AdamW.step_mixed`) unscales on the fly and never
        needs this buffer (n_params x 4 bytes: 572 MB for a 143M model)."""
        if self._master_grads is None:
            self._master_grads = array_module(self.master_params).zeros_like(self.master_params)
        return self._master_grads

    @property
    def loss_scale(self):
        return self.scaler.scale

    def grads_to_master(self, lo=0, hi=None):
        """``master_grads = float32(compute_grads) / loss_scale`` on ``[lo, hi)``; returns None.

        The range defaults to the whole buffer; ZeRO-1 converts only the shard
        this rank owns. inf/nan survive the conversion, so the caller detects
        overflow on the master gradients (e.g. through their sum of squares).
        """
        # one pass (GPU: one fused kernel) instead of a cast pass and a multiply pass
        scaled_copy(self.compute_grads[lo:hi], self.master_grads[lo:hi], 1.0 / self.scaler.scale)

    def update_scale(self, found_nonfinite):
        """Back off and skip on overflow, else count a good step (see the scaler)."""
        return self.scaler.update(found_nonfinite)

    def refresh_compute_params(self):
        """Cast the masters into the existing compute buffer (views stay valid)."""
        self.compute_params[...] = self.master_params

    def state_dict(self):
        return {f"loss_scaler/{key}": value for key, value in self.scaler.state_dict().items()}

    def load_state_dict(self, state):
        prefix = "loss_scaler/"
        self.scaler.load_state_dict(
            {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)})


class BFloat16Precision:
    """fp32 master weights and a bfloat16 compute copy, without loss scaling.

    Parameters
    ----------
    master_params : ndarray of float32, shape (n_params,)

    Attributes
    ----------
    compute_params, compute_grads : ndarray of bfloat16, shape (n_params,)
        What the layers read and where backward writes: ``ml_dtypes.bfloat16`` NumPy
        arrays on the CPU, ``uint16`` CuPy arrays of bit patterns on the GPU.
    master_grads : ndarray of float32, shape (n_params,)
        ``float32(compute_grads)``, filled by :meth:`grads_to_master`.
    """

    name = "bf16"
    loss_scale = 1.0

    def __init__(self, master_params):
        xp = array_module(master_params)
        if master_params.dtype != xp.float32:
            raise TypeError(
                f"BFloat16Precision: master weights must be float32, found {master_params.dtype}"
            )
        self.master_params = master_params
        self.compute_params = xp.empty(master_params.shape, dtype=compute_dtype("bf16", xp))
        round_to_bfloat16(master_params, self.compute_params)
        self.compute_grads = xp.zeros_like(self.compute_params)   # all-zero bits: +0.0
        self.master_grads = xp.zeros_like(master_params)

    def grads_to_master(self, lo=0, hi=None):
        """``master_grads = float32(compute_grads)`` on ``[lo, hi)`` (exact); returns None."""
        scaled_copy(self.compute_grads[lo:hi], self.master_grads[lo:hi], 1.0)

    def update_scale(self, found_nonfinite):
        """Always apply the step (no loss scaling: bfloat16 has float32's range)."""
        return True

    def refresh_compute_params(self):
        """Round the masters to nearest even bfloat16 into the compute buffer (views stay valid)."""
        round_to_bfloat16(self.master_params, self.compute_params)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def compute_dtype(name, xp=np):
    """The dtype of the compute copy of precision ``name`` on the backend ``xp``.

    bf16: ``ml_dtypes.bfloat16`` with NumPy, ``uint16`` (bit patterns) with CuPy.
    """
    if name == "bf16":
        return bfloat16_dtype() if xp is np else np.dtype(BFLOAT16_BITS)
    return np.dtype({"fp32": "float32", "fp16": "float16", "fp64": "float64"}[name])


def to_compute(x, dtype):
    """``x`` (float data, e.g. a batch) in the compute dtype ``dtype``; no copy when it already is.

    A plain ``astype`` except for bfloat16 bit patterns on the GPU, which are the rounded
    float32 values (an integer cast would truncate).
    """
    if is_cupy(x) and np.dtype(dtype).name == BFLOAT16_BITS:
        if x.dtype.name == BFLOAT16_BITS:
            return x
        target = array_module(x).empty(x.shape, dtype=dtype)
        round_to_bfloat16(array_module(x).ascontiguousarray(x, dtype=np.float32), target)
        return target
    return x.astype(dtype, copy=False)


def make_precision(name, master_params, init_loss_scale=2.0**16, growth_interval=2000):
    """Precision policy by name: ``"fp32"``/``"fp64"`` (full), ``"fp16"`` (mixed, loss scaling)
    or ``"bf16"`` (mixed, no loss scaling)."""
    if name in ("fp32", "fp64"):
        return FullPrecision(master_params)
    if name == "fp16":
        return MixedPrecision(master_params, "float16",
                              DynamicLossScaler(init_scale=init_loss_scale,
                                                growth_interval=growth_interval))
    if name == "bf16":
        return BFloat16Precision(master_params)
    raise ValueError(f"precision: expected one of {PRECISIONS}, found {name!r}")
