"""The data x tensor x pipeline grid of ranks and its sub-communicators.

``n_ranks = D * T * P`` ranks are arranged with the TENSOR axis fastest, then data, then pipeline::

    world rank = tensor_rank + T * (data_rank + D * pipeline_rank)

so the T ranks of a tensor group are consecutive world ranks -- with ranks placed node by node (as
``mpirun``/``srun`` do by default) and T dividing the ranks per node, a tensor group lies inside one
node, where its two allreduces per block and direction run over NVLink. The pipeline axis is the
slowest: its point-to-point traffic (one activation per micro-batch and stage boundary) is the
lightest, so it may cross nodes.

Sub-communicators (each an :class:`hpcgpu.Communicator`, built with :meth:`hpcgpu.Communicator.split`):

==============  ===============================  ==================================================
``tensor``      same data and pipeline index     the allreduces inside tensor-parallel layers
``data``        same tensor and pipeline index   the gradient allreduce (:class:`DataParallel`)
``pipeline``    same data and tensor index       activations and gradients between stages
``model``       same data index (T x P ranks)    the gradient norm over all parameter shards
==============  ===============================  ==================================================

Nodes: :func:`make_grid` reads every rank's node (:func:`hpcgpu.decomposition.comm.gather_node_of_rank`:
the shared-memory split, or ``HPCGPU_SIMULATE_NODES`` to pretend) and records, per axis, whether every
group along it lies inside one node; :meth:`ParallelGrid.describe` says so in the run header.

Every byte between the ranks of a group moves through that group's collectives
(:func:`hpcgpu.transport.collectives`). On GPUs, :func:`prepare_device_communication` (collective, the
same calls in the same order on every rank) gives every sub-communicator the job's transport and builds
the device collectives of the tensor and pipeline groups up front (with NCCL: their NCCL
communicators), instead of inside the first forward.
"""

from dataclasses import dataclass, field

from hpcgpu.decomposition.comm import gather_node_of_rank
from hpcgpu.errors import ConfigurationError
from hpcgpu.transport import collectives, select_transport, transport_choice

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
    node_of_rank : tuple of int
        The node of every world rank (real or simulated: see the module docstring); empty for a
        grid built without communicators.
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
    node_of_rank: tuple = field(default=())

    def tensor_group(self, tensor_collectives=None):
        """The :class:`TensorGroup` of this rank; ``tensor_collectives`` defaults to the tensor
        communicator's host collectives (MPI on NumPy arrays). On GPUs pass its device collectives
        (:func:`prepare_device_communication`)."""
        if tensor_collectives is None and self.tensor_size > 1:
            tensor_collectives = collectives(self.tensor, on_device=False)
        return TensorGroup(self.tensor_rank, self.tensor_size, tensor_collectives)

    @property
    def is_first_stage(self):
        return self.pipeline_rank == 0

    @property
    def is_last_stage(self):
        return self.pipeline_rank == self.pipeline_size - 1

    def axis_inside_node(self, axis):
        """True when every group along ``axis`` (``"data"``, ``"tensor"`` or ``"pipeline"``) lies
        inside one node (True for a grid without a node layout)."""
        if not self.node_of_rank:
            return axis != "tensor" or self.tensor_inside_node
        sizes = {"data": self.data_size, "tensor": self.tensor_size, "pipeline": self.pipeline_size}
        groups = {}
        for rank, node in enumerate(self.node_of_rank):
            coordinates = dict(zip(("data", "tensor", "pipeline"),
                                   grid_coordinates(rank, sizes["data"], sizes["tensor"],
                                                    sizes["pipeline"])))
            coordinates.pop(axis)
            groups.setdefault(tuple(coordinates.values()), set()).add(node)
        return all(len(nodes) == 1 for nodes in groups.values())

    def describe(self):
        """One line, e.g. ``grid D x T x P = 2 x 2 x 2 on 2 node(s): tensor axis inside a node;
        data axis inside a node; pipeline axis across nodes``."""
        n_nodes = len(set(self.node_of_rank)) if self.node_of_rank else 1
        parts = []
        for axis in ("tensor", "data", "pipeline"):
            size = getattr(self, f"{axis}_size")
            if size == 1:
                continue
            if self.axis_inside_node(axis):
                parts.append(f"{axis} axis inside a node")
            elif axis == "tensor":
                parts.append("tensor axis SPANS nodes (slow: make T divide the ranks per node)")
            else:
                parts.append(f"{axis} axis across nodes")
        where = "; ".join(parts) if parts else "one rank per model replica"
        return (f"grid D x T x P = {self.data_size} x {self.tensor_size} x {self.pipeline_size} on "
                f"{n_nodes} node(s): {where}")


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
    node_of_rank = tuple(gather_node_of_rank(comm))   # the same tuple on every rank
    grid = ParallelGrid(world=comm, data=data, tensor=tensor, pipeline=pipeline, model=model,
                        data_size=data_size, tensor_size=tensor_size, pipeline_size=pipeline_size,
                        data_rank=data_rank, tensor_rank=tensor_rank, pipeline_rank=pipeline_rank,
                        tensor_inside_node=True, node_of_rank=node_of_rank)
    grid.tensor_inside_node = grid.axis_inside_node("tensor")
    return grid


def prepare_device_communication(grid, arch, zero_stage=0):
    """Collective over the world on GPUs (nothing on CPUs): the job's transport on every
    sub-communicator and the device collectives (:func:`hpcgpu.transport.collectives`) of the
    tensor and pipeline groups (and, with ``zero_stage=1``, of the data group, whose reduce-scatter
    and all-gather :class:`~apps.train.parallel.zero.ZeroRedundancy` runs on them).

    Every rank makes the same calls in the same order (tensor, pipeline, data, model; then the
    collectives of tensor, then pipeline, then data under ZeRO-1), so each collective meets the same
    calls on the other members of its group: with NCCL, building a group's collectives creates its
    NCCL communicator collectively over the group, and a rank that created its pipeline communicator
    first could wait for a tensor peer that waits for it. Groups of one rank get none (they never
    communicate).

    Parameters
    ----------
    grid : ParallelGrid
    arch : hpcgpu.arch.CPU or GPU
    zero_stage : int
        1 when the data group reduce-scatters (ZeRO-1) instead of its bucket allreduce.

    Returns
    -------
    object or None
        The tensor group's device collectives (NCCL on the current stream, or MPI through the
        host or on device pointers) on GPUs with T > 1; None otherwise (on CPUs
        :meth:`ParallelGrid.tensor_group` takes the tensor communicator's host collectives).
    """
    if not arch.is_gpu:
        return None   # CPUs: MPI on every communicator, nothing to choose or create
    # the world's choice (the --transport flag, HPCGPU_TRANSPORT or automatic) for every group:
    # a sub-communicator would otherwise choose again, without the flag
    name = select_transport(grid.world, arch)
    for group in (grid.tensor, grid.pipeline, grid.data, grid.model):
        select_transport(group, arch, requested=name)
    # the data group last: without ZeRO its DataParallel builds its collectives on first use
    for group in (grid.tensor, grid.pipeline) + ((grid.data,) if zero_stage else ()):
        if group.size > 1:
            collectives(group, on_device=True)
    return collectives(grid.tensor, on_device=True) if grid.tensor_size > 1 else None


def transport_note(grid, arch):
    """How the tensor and pipeline groups move data: the job's transport, e.g. ``"nccl"``; local
    (for headers). ``mpi`` on CPUs; on GPUs ``nccl``, ``mpi-cuda`` (device pointers to a CUDA-aware
    MPI) or ``mpi-staged`` (copies through pinned host memory)."""
    return transport_choice(grid.world, arch).name
