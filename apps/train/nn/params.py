"""Flat parameter and gradient buffers with per-layer views.

Every trainable number of a model lives in ONE contiguous 1-D buffer, and every
gradient in a second buffer of the same length and layout. Layers never own
arrays: they receive *views* (``flat[offset:offset + size].reshape(shape)``) into
the two buffers. Consequences the data-parallel code relies on:

* an allreduce bucket is a contiguous slice ``grads[lo:hi]`` -- no packing copy;
* a ZeRO-1 optimiser shard is a contiguous slice ``params[lo:hi]``;
* the optimiser, gradient clipping, loss-scale checks and checkpoints all work on
  one array instead of a list of tensors.

Layout order (backward order)
-----------------------------
Parameters are laid out in the order in which their gradients become final during
the backward pass: the LAST layer of the network sits at offset 0, the first layer
at the end of the buffer. Backward therefore fills the gradient buffer from low to
high offsets, and the hook ``on_grads_ready(lo, hi)`` reports ranges that tile
``[0, n_params)`` in increasing order. A bucket ``[b_lo, b_hi)`` can be reduced as
soon as a reported ``hi`` reaches ``b_hi`` -- while backward continues with earlier
layers -- which is what overlaps communication with computation.

Initialisation
--------------
:func:`init_flat_parameters` draws each parameter tensor from its own NumPy
generator seeded by ``(seed, index of the tensor in the layout)`` on the host, in
float64, and casts at the end. Every rank computes the same full buffer, so the
initial model does not depend on the number of processes (nor on the compute
dtype beyond rounding).
"""

from dataclasses import dataclass

import numpy as np

#: Initialisers understood by :func:`init_flat_parameters`.
INITIALISERS = ("uniform_fan_in", "zeros", "ones")


@dataclass(frozen=True)
class ParamSpec:
    """What a layer declares about one of its parameter tensors.

    Attributes
    ----------
    name : str
        Name inside the layer (``"weight"``, ``"bias"``).
    shape : tuple of int
        Tensor shape.
    init : str
        One of :data:`INITIALISERS`. ``"uniform_fan_in"`` draws from
        ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, PyTorch's default for Linear and
        Conv1d weights and biases.
    fan_in : int
        Number of inputs feeding one output (used by ``"uniform_fan_in"``).
    """

    name: str
    shape: tuple
    init: str = "zeros"
    fan_in: int = 1


@dataclass(frozen=True)
class LayoutEntry:
    """One parameter tensor in the flat buffer.

    Attributes
    ----------
    layer : str
        Qualified layer name, e.g. ``"2.Residual/0.Linear"``.
    name : str
        Parameter name inside the layer.
    offset : int
        Index of the tensor's first element in the flat buffer.
    shape : tuple of int
        Tensor shape; the tensor occupies ``offset : offset + size``.
    init : str
        Initialiser (see :class:`ParamSpec`).
    fan_in : int
        Fan-in for the initialiser.
    """

    layer: str
    name: str
    offset: int
    shape: tuple
    init: str
    fan_in: int

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def stop(self):
        return self.offset + self.size


class ParamLayout:
    """Ordered list of (layer, name, offset, shape) entries of a flat buffer.

    Build it by calling :meth:`add_layer` for the layers in *backward* order (last
    layer first); :class:`apps.train.nn.sequential.Sequential` does this for you.

    Attributes
    ----------
    entries : list of LayoutEntry
        In buffer order, i.e. backward order.
    n_params : int
        Total number of elements.
    """

    def __init__(self):
        self.entries = []
        self.n_params = 0
        self._layer_ranges = {}

    def add_layer(self, layer_name, specs):
        """Append the parameters of one layer; return its range ``(lo, hi)``."""
        if layer_name in self._layer_ranges:
            raise ValueError(
                f"layer name {layer_name!r} appears twice in the layout; "
                "give every layer a unique name"
            )
        lo = self.n_params
        for spec in specs:
            if spec.init not in INITIALISERS:
                raise ValueError(
                    f"{layer_name}.{spec.name}: unknown initialiser {spec.init!r}; "
                    f"expected one of {INITIALISERS}"
                )
            entry = LayoutEntry(
                layer_name, spec.name, self.n_params, tuple(int(s) for s in spec.shape),
                spec.init, int(spec.fan_in),
            )
            self.entries.append(entry)
            self.n_params = entry.stop
        self._layer_ranges[layer_name] = (lo, self.n_params)
        return lo, self.n_params

    def layer_range(self, layer_name):
        """Return ``(lo, hi)``, the slice of the flat buffer owned by a layer."""
        return self._layer_ranges[layer_name]

    def views(self, flat):
        """Per-layer views into ``flat``: ``{layer: {name: view}}`` (no copies).

        Parameters
        ----------
        flat : ndarray, shape (n_params,)
            A NumPy or CuPy buffer laid out by this layout.
        """
        if flat.ndim != 1 or flat.shape[0] != self.n_params:
            raise ValueError(
                f"flat buffer: expected shape ({self.n_params},), found {tuple(flat.shape)}; "
                "allocate it with ParamLayout.n_params elements"
            )
        result = {}
        for entry in self.entries:
            view = flat[entry.offset:entry.stop].reshape(entry.shape)
            result.setdefault(entry.layer, {})[entry.name] = view
        return result

    def describe(self):
        """Human-readable table of the layout (one line per tensor)."""
        lines = [f"{'offset':>10} {'size':>10}  layer.name shape"]
        for entry in self.entries:
            lines.append(
                f"{entry.offset:>10} {entry.size:>10}  {entry.layer}.{entry.name} {entry.shape}"
            )
        lines.append(f"{'':>10} {self.n_params:>10}  total")
        return "\n".join(lines)

    def __repr__(self):
        return f"ParamLayout({len(self.entries)} tensors, {self.n_params} parameters)"


def init_flat_parameters(layout, seed, dtype="float32"):
    """Deterministic initial values for a whole flat parameter buffer.

    Parameters
    ----------
    layout : ParamLayout
    seed : int
        Model seed; the result depends only on ``seed`` and the layout.
    dtype : str or numpy dtype
        Dtype of the returned buffer.

    Returns
    -------
    numpy.ndarray, shape (layout.n_params,)
        Host buffer; move it to the device with ``xp.asarray``.
    """
    flat = np.zeros(layout.n_params, dtype=np.float64)
    for index, entry in enumerate(layout.entries):
        flat[entry.offset:entry.stop] = initial_tensor(entry, seed, index).reshape(-1)
    return flat.astype(dtype)


def initial_tensor(entry, seed, index):
    """Initial float64 values of one layout entry, the ``index``-th tensor of its layout.

    One generator per tensor, seeded by ``(seed, index)``: adding a layer elsewhere
    leaves the others alone, and a tensor-parallel shard can be cut from the values
    of the unsplit tensor (:mod:`apps.train.parallel.tensor_parallel`).

    Returns
    -------
    numpy.ndarray of float64, shape ``entry.shape``
    """
    values = np.zeros(entry.size, dtype=np.float64)
    if entry.init == "uniform_fan_in":
        rng = np.random.default_rng([int(seed), int(index)])
        bound = 1.0 / np.sqrt(max(entry.fan_in, 1))
        values[:] = rng.uniform(-bound, bound, size=entry.size)
    elif entry.init == "ones":
        values[:] = 1.0
    # "zeros": already zero
    return values.reshape(entry.shape)
