"""The data x tensor x pipeline grid of ranks and its sub-communicators.

``n_ranks = D * T * P`` ranks are arranged with the TENSOR axis fastest, then data, then pipeline::

    world rank = tensor_rank + T * (data_rank + D * pipeline_rank)

so the T ranks of a tensor group are consecutive world ranks -- with ranks placed node by node (as
``mpirun``/``srun`` do by default) and T dividing the ranks per node, a tensor group lies inside one
node, where its two allreduces per block and direction run over NVLink. The pipeline axis is the
slowest: its point-to-point traffic (one activation per micro-batch and stage boundary) is the
lightest, so it may cross nodes.

Sub-communicators (each an :class:`hpcgpu.Communicator`, built with ``comm.mpi.Split``):

==============  ===============================  ==================================================
``tensor``      same data and pipeline index     the allreduces inside tensor-parallel layers
``data``        same tensor and pipeline index   the gradient allreduce (:class:`DataParallel`)
``pipeline``    same data and tensor index       activations and gradients between stages
``model``       same data index (T x P ranks)    the gradient norm over all parameter shards
==============  ===============================  ==================================================
"""

from dataclasses import dataclass

from hpcgpu.errors import ConfigurationError

from .tensor_parallel import TensorGroup


def check_grid(n_ranks, data_size, tensor_size, pipeline_size):
    """Raise ConfigurationError unless ``data_size * tensor_size * pipeline_size == n_ranks``.

    Reads only replicated values, so every rank raises the same message before any collective.
    """
    sizes = {"data": data_size, "tensor": tensor_size, "pipeline": pipeline_size}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(
                f"parallel grid: the {name} size must be a positive integer, found {value!r}")
    if data_size * tensor_size * pipeline_size != n_ranks:
        raise ConfigurationError(
            f"parallel grid: D x T x P = {data_size} x {tensor_size} x {pipeline_size} = "
            f"{data_size * tensor_size * pipeline_size} ranks, but the job has {n_ranks}; choose "
            f"sizes whose product is {n_ranks} (e.g. --tensor-parallel T --pipeline-parallel P with "
            f"T * P dividing {n_ranks}; the data size is the rest)")


def grid_coordinates(rank, data_size, tensor_size, pipeline_size):
    """``(data_rank, tensor_rank, pipeline_rank)`` of world ``rank`` (tensor axis fastest)."""
    tensor_rank = rank % tensor_size
    data_rank = (rank // tensor_size) % data_size
    pipeline_rank = rank // (tensor_size * data_size)
    return data_rank, tensor_rank, pipeline_rank


@dataclass
class ParallelGrid:
    """This rank's place in the grid and the communicators along each axis.

    Attributes
    ----------
    world : hpcgpu.Communicator
    data, tensor, pipeline, model : hpcgpu.Communicator
        Sub-communicators (see the module docstring); ``X.rank`` is the coordinate along X.
    data_size, tensor_size, pipeline_size : int
        D, T, P.
    data_rank, tensor_rank, pipeline_rank : int
    tensor_inside_node : bool
        True when every tensor group's ranks share a node.
    """

    world: object
    data: object
    tensor: object
    pipeline: object
    model: object
    data_size: int
    tensor_size: int
    pipeline_size: int
    data_rank: int
    tensor_rank: int
    pipeline_rank: int
    tensor_inside_node: bool

    def tensor_group(self, collectives=None):
        """The :class:`TensorGroup` of this rank; ``collectives`` defaults to ``self.tensor``
        (MPI). On GPUs pass the tensor communicator's device collectives."""
        return TensorGroup(self.tensor_rank, self.tensor_size,
                           self.tensor if collectives is None else collectives)

    @property
    def is_first_stage(self):
        return self.pipeline_rank == 0

    @property
    def is_last_stage(self):
        return self.pipeline_rank == self.pipeline_size - 1

    def describe(self):
        """One line, e.g. ``grid D x T x P = 1 x 2 x 1; tensor axis inside a node``."""
        where = ("tensor axis inside a node" if self.tensor_inside_node
                 else "tensor axis SPANS nodes (slow: make T divide the ranks per node)")
        return (f"grid D x T x P = {self.data_size} x {self.tensor_size} x {self.pipeline_size}; "
                f"{where}")


def make_grid(comm, data_size=None, tensor_size=1, pipeline_size=1):
    """Collective: split ``comm`` into the D x T x P grid.

    Parameters
    ----------
    comm : hpcgpu.Communicator
        All ranks of the job (or a sub-communicator).
    data_size : int, optional
        D; default ``comm.size // (tensor_size * pipeline_size)``.
    tensor_size, pipeline_size : int
        T and P.

    Returns
    -------
    ParallelGrid

    Raises
    ------
    ConfigurationError
        On every rank alike, before any collective, when ``D * T * P != comm.size``.
    """
    if data_size is None and isinstance(tensor_size, int) and isinstance(pipeline_size, int) \
            and tensor_size > 0 and pipeline_size > 0:
        data_size = max(1, comm.size // (tensor_size * pipeline_size))
    check_grid(comm.size, data_size, tensor_size, pipeline_size)
    data_rank, tensor_rank, pipeline_rank = grid_coordinates(comm.rank, data_size, tensor_size,
                                                             pipeline_size)
    tensor = comm.split(data_rank + data_size * pipeline_rank, key=tensor_rank)
    data = comm.split(tensor_rank + tensor_size * pipeline_rank, key=data_rank)
    pipeline = comm.split(tensor_rank + tensor_size * data_rank, key=pipeline_rank)
    model = comm.split(data_rank, key=tensor_rank + tensor_size * pipeline_rank)
    # one node per tensor group, on every group: max over the world of (distinct nodes - 1) == 0
    nodes_in_group = len(set(tensor.mpi.allgather(comm.node_index)))
    tensor_inside_node = comm.allreduce(nodes_in_group, op="max") == 1
    return ParallelGrid(world=comm, data=data, tensor=tensor, pipeline=pipeline, model=model,
                        data_size=data_size, tensor_size=tensor_size, pipeline_size=pipeline_size,
                        data_rank=data_rank, tensor_rank=tensor_rank, pipeline_rank=pipeline_rank,
                        tensor_inside_node=tensor_inside_node)
