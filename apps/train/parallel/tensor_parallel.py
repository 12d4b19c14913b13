"""Tensor (Megatron-style) parallelism of the MLP blocks over a group of T ranks.

A transformer-style MLP block ``h + W2 gelu(W1 layer_norm(h))`` is split over the T ranks of a
tensor group (Shoeybi et al. 2019, "Megatron-LM", section 3)::

      h (batch, width), replicated
      |  LayerNorm (replicated)
      |  ColumnParallelLinear  W1[rank rows]   (hidden/T, width)   no communication forward
      |  GELU on the local (batch, hidden/T) shard                  elementwise: no communication
      |  RowParallelLinear     W2[:, rank cols] (width, hidden/T)   ALLREDUCE of the output forward
      v  + bias (replicated, added once after the sum), [Dropout], + h

Backward mirrors it: the row-parallel layer needs no communication for its input gradient (each
rank's gradient slice is ``grad_out @ W2[:, rank cols]``); the column-parallel layer's input
gradient is a sum of the T partial products ``grad_local @ W1[rank rows]``: one ALLREDUCE. So a
block costs one allreduce of ``batch x width`` values forward and one backward; LayerNorm, GELU,
dropout and the residual stay replicated (they see the same values on every rank).

The allreduce goes through a :class:`TensorGroup`, which holds the rank, the size and the tensor
communicator's collectives (:func:`hpcgpu.transport.collectives`): MPI on NumPy buffers on the CPU
(:meth:`apps.train.parallel.grid.ParallelGrid.tensor_group`) and, on GPUs, the job's device transport
(NCCL on the current stream, the device arrays in place of host copies; MPI through the host when the
job's transport is not ``nccl``), set up by :func:`apps.train.parallel.grid.prepare_device_communication`.

bf16 (:func:`allreduce_bfloat16`): the activations and their gradients are bfloat16, and so is the
allreduce's result. MPI has no bfloat16 type, so on the CPU (and through MPI on GPUs) the T
partial products travel as float32 copies, are summed in float32 and rounded to bfloat16 once; NCCL
reduces bfloat16 itself (``element_type="bfloat16"``: ``ncclBfloat16``), two bytes a value on the
wire. For T = 2 both give ``round(a + b)``, bitwise the same; for T > 2 NCCL rounds its partial sums
on the way.

Initialisation: a shard is cut from the values the UNSPLIT layer would get for the same seed
(:meth:`ColumnParallelLinear.shard`, :meth:`RowParallelLinear.shard`, used by
:func:`apps.train.parallel.trainer.init_parallel_parameters`), so T = 1 and T = 2 train the same model.
"""

from dataclasses import dataclass, field

import numpy as np

from hpcgpu.errors import ConfigurationError

from apps.train.kernels.backend import array_module, is_bfloat16, is_cupy, to_float32
from apps.train.nn.dropout import Dropout
from apps.train.nn.layers import GELU, LayerNorm, Linear
from apps.train.nn.params import ParamSpec
from apps.train.training.precision import to_compute
from apps.train.nn.sequential import Residual


@dataclass
class TensorGroup:
    """The ranks that split one tensor-parallel layer, and how they sum arrays.

    Attributes
    ----------
    rank, size : int
        This rank's index in the group and the group size T.
    collectives : object
        The tensor sub-communicator's collectives (:func:`hpcgpu.transport.collectives`: MPI on the
        CPU, the job's device transport on GPUs), or anything with ``allreduce(array, op=...)``
        returning the sum over the group as a new array. Unused when ``size == 1``.
    n_allreduces, n_values_reduced, n_bytes_reduced : int
        Counters of the collectives issued (the tests check one per block and direction) and of
        the values and bytes passed to them (:mod:`apps.train.parallel.comm_volume`).
    """

    rank: int
    size: int
    collectives: object = None
    n_allreduces: int = field(default=0)
    n_values_reduced: int = field(default=0)
    n_bytes_reduced: int = field(default=0)

    def __post_init__(self):
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ConfigurationError(
                f"tensor group: expected size >= 1 and 0 <= rank < size, found rank {self.rank}, "
                f"size {self.size}")
        if self.size > 1 and not hasattr(self.collectives, "allreduce"):
            raise ConfigurationError(
                "tensor group: a group of more than one rank needs an object with "
                "allreduce(array, op=...) (the tensor communicator's hpcgpu.transport.collectives)")

    def allreduce_sum(self, array):
        """Sum of ``array`` over the group (a new array; ``array`` itself on one rank).

        Parameters
        ----------
        array : ndarray, same shape on every rank of the group
        """
        if self.size == 1:
            return array
        self.n_allreduces += 1
        self.n_values_reduced += int(array.size)
        self.n_bytes_reduced += int(array.nbytes)
        if is_bfloat16(array.dtype):
            return allreduce_bfloat16(self.collectives, array)
        return self.collectives.allreduce(array_module(array).ascontiguousarray(array), op="sum")


def allreduce_bfloat16(collectives, array):
    """Sum of the bfloat16 ``array`` over the group, as a new bfloat16 array of the same form.

    Parameters
    ----------
    collectives : object
        The group's collectives (see :class:`TensorGroup`).
    array : ndarray
        ``ml_dtypes.bfloat16`` (NumPy) or ``uint16`` bit patterns (CuPy), the same shape on every rank.

    Returns
    -------
    ndarray, shape and dtype of ``array``
        NCCL (``collectives.name == "nccl"``): its bfloat16 sum on the current stream. Otherwise (MPI,
        which has no bfloat16 type, on the host or through it on GPUs): the float32 sum of the
        widened values, rounded to nearest even bfloat16 once.
    """
    if is_cupy(array) and getattr(collectives, "name", None) == "nccl":
        send = array_module(array).ascontiguousarray(array)
        # the bit patterns are ncclBfloat16 values: NCCL adds them as bfloat16, rounding each sum
        return collectives.allreduce(send, op="sum", element_type="bfloat16")
    total = collectives.allreduce(to_float32(array), op="sum")
    if is_cupy(array):
        return to_compute(total, array.dtype)   # float32 -> bit patterns, rounded to nearest even
    return np.asarray(total, dtype=np.float32).astype(array.dtype)


def _shard_of(n_features, group, what):
    """``(lo, hi)`` of this rank's equal share of ``n_features`` (must divide evenly)."""
    if n_features % group.size:
        raise ConfigurationError(
            f"{what}: {n_features} features cannot be split evenly over {group.size} tensor-parallel "
            f"ranks; choose a width divisible by {group.size} or another --tensor-parallel")
    local = n_features // group.size
    return group.rank * local, (group.rank + 1) * local


class ColumnParallelLinear(Linear):
    """``y[:, shard] = x @ weight[shard].T + bias[shard]``: the output features split over the group.

    Holds ``weight`` (out_features/T, in_features) and ``bias`` (out_features/T): rows
    ``[rank * out/T, (rank + 1) * out/T)`` of the unsplit layer's. Input (batch, in_features),
    replicated; output (batch, out_features/T), this rank's columns. Forward needs no communication;
    backward sums the input gradient over the group (one allreduce of batch x in_features values).
    """

    sharded_params = ("weight", "bias")

    def __init__(self, in_features, out_features, group, bias=True):
        self.feature_lo, self.feature_hi = _shard_of(int(out_features), group, "ColumnParallelLinear")
        super().__init__(in_features, self.feature_hi - self.feature_lo, bias)
        self.full_out_features = int(out_features)
        self.group = group

    def shard(self, name, full):
        """This rank's part of the unsplit ``weight`` (out, in) or ``bias`` (out,) ``full``."""
        return full[self.feature_lo:self.feature_hi]

    def backward(self, grad_out, need_input_grad=True):
        """Local weight/bias gradients, then the input gradient summed over the group."""
        grad_input = super().backward(grad_out, need_input_grad)
        if grad_input is None:
            return None
        return self.group.allreduce_sum(grad_input)

    def __repr__(self):
        return (f"ColumnParallelLinear({self.in_features}, {self.full_out_features}, "
                f"shard {self.feature_lo}:{self.feature_hi})")


class RowParallelLinear(Linear):
    """``y = sum over ranks of x[:, shard] @ weight[:, shard].T, + bias``: input features split.

    Holds ``weight`` (out_features, in_features/T), columns ``[rank * in/T, (rank + 1) * in/T)``
    of the unsplit layer's, and the whole ``bias`` (out_features,), replicated (its gradient is
    the same on every rank). Input (batch, in_features/T), the shard a
    :class:`ColumnParallelLinear` produced; output (batch, out_features), replicated after one
    allreduce. Backward needs no communication.
    """

    sharded_params = ("weight",)

    def __init__(self, in_features, out_features, group, bias=True):
        self.feature_lo, self.feature_hi = _shard_of(int(in_features), group, "RowParallelLinear")
        super().__init__(self.feature_hi - self.feature_lo, out_features, bias)
        self.full_in_features = int(in_features)
        self.group = group

    def param_specs(self):
        # the fan-in of the unsplit layer, so a spec-based initialisation has the right bound
        return [ParamSpec(spec.name, spec.shape, spec.init, self.full_in_features)
                for spec in super().param_specs()]

    def shard(self, name, full):
        """This rank's columns of the unsplit ``weight`` (out, in); the whole ``bias``."""
        return full[:, self.feature_lo:self.feature_hi] if name == "weight" else full

    def reduce_output(self, y):
        """Sum the partial products over the group before the bias is added."""
        return self.group.allreduce_sum(y)

    def __repr__(self):
        return (f"RowParallelLinear({self.full_in_features}, {self.out_features}, "
                f"shard {self.feature_lo}:{self.feature_hi})")


@dataclass(frozen=True)
class MLPSpec:
    """A residual MLP classifier whose blocks can be split over tensor and pipeline ranks.

    ``Linear(n_inputs, width)``, then ``depth`` blocks
    ``h + [Dropout](Linear(hidden, width)(GELU(Linear(width, hidden)(LayerNorm(h)))))``, then
    ``LayerNorm(width)`` and ``Linear(width, n_classes)``. With tensor parallelism the two inner
    Linears of each block are column- and row-parallel; the first and last Linear stay replicated
    (they are small next to ``depth x 2 x width x hidden``).

    Attributes
    ----------
    n_inputs, n_classes, width, hidden, depth : int
        ``hidden`` (the block's inner width, 4 x width in GPT) must be divisible by T.
    dropout : float
        Drop probability after each block's second Linear (replicated region, so the mask is the
        same on every tensor rank); 0 leaves the layer out.
    """

    n_inputs: int
    n_classes: int
    width: int = 32
    hidden: int = 64
    depth: int = 2
    dropout: float = 0.0

    def validate(self, tensor_size=1):
        """Raise ConfigurationError (the same on every rank) for an impossible spec."""
        values = (self.n_inputs, self.n_classes, self.width, self.hidden)
        if min(values) < 1 or self.depth < 0 or not 0.0 <= self.dropout < 1.0:
            raise ConfigurationError(
                f"MLP spec: expected positive sizes, depth >= 0 and 0 <= dropout < 1, found {self}")
        if self.hidden % tensor_size:
            raise ConfigurationError(
                f"MLP spec: hidden={self.hidden} is not divisible by the tensor-parallel size "
                f"{tensor_size}; choose hidden as a multiple of {tensor_size}")


def mlp_block(spec, block_index, group=None):
    """One residual MLP block (a :class:`~apps.train.nn.sequential.Residual`).

    ``group=None`` builds the unsplit block (plain Linears); a :class:`TensorGroup` the split one.
    The dropout stream is fixed by ``block_index`` so that a pipeline stage holding only some
    blocks draws the same masks as the whole model.
    """
    if group is None:
        first, second = Linear(spec.width, spec.hidden), Linear(spec.hidden, spec.width)
    else:
        first = ColumnParallelLinear(spec.width, spec.hidden, group)
        second = RowParallelLinear(spec.hidden, spec.width, group)
    inner = [LayerNorm(spec.width), first, GELU(), second]
    if spec.dropout > 0.0:
        inner.append(Dropout(spec.dropout, stream=block_index + 1))
    return Residual(inner)


def mlp_layers(spec, group=None):
    """The top-level layers of :class:`MLPSpec` (the units a pipeline stage boundary may cut at).

    Returns
    -------
    list of Layer
        ``depth + 3`` layers: input Linear, the blocks, LayerNorm, output Linear.
    """
    spec.validate(1 if group is None else group.size)
    return ([Linear(spec.n_inputs, spec.width)]
            + [mlp_block(spec, index, group) for index in range(spec.depth)]
            + [LayerNorm(spec.width), Linear(spec.width, spec.n_classes)])
