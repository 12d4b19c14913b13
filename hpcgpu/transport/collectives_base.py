"""What every collectives class shares: its communicator, the reduction operators, the buffer check.

The three classes (:class:`~hpcgpu.transport.host_collectives.HostCollectives`,
:class:`~hpcgpu.transport.nccl_collectives.NcclCollectives`,
:class:`~hpcgpu.transport.device_collectives.MpiDeviceCollectives`) take the same arguments and refuse
the same mistakes with the same errors, whatever the transport. Pure Python, no MPI or CUDA import.
"""

from __future__ import annotations

from hpcgpu.errors import BackendError, ConfigurationError

#: The reduction operators every transport offers.
OPERATORS = ("sum", "max", "min")


def check_operator(op: str) -> None:
    """Raise ConfigurationError unless ``op`` is one of :data:`OPERATORS`."""
    if op not in OPERATORS:
        raise ConfigurationError(f"reduction operator must be one of {', '.join(OPERATORS)}, got {op!r}")


def require_contiguous(array, what: str):
    """``array`` itself if it is C-contiguous (NumPy or CuPy); else BackendError naming ``what``."""
    if not array.flags.c_contiguous:
        raise BackendError(f"{what} needs a C-contiguous array, found shape {tuple(array.shape)} with strides "
                           f"{tuple(array.strides)}; pass a contiguous array or copy it first")
    return array


class CommunicatorCollectives:
    """Base of the collectives classes: the communicator and its size and rank.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    """

    def __init__(self, comm):
        self.comm = comm

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def rank(self) -> int:
        return self.comm.rank
