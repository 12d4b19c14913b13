"""Architectures: where arrays live and kernels run.

An architecture is a value passed to every constructor (as in Oceananigans' ``CPU()`` / ``GPU()``):

- :class:`CPU` — NumPy arrays, Numba kernels; ``synchronize()`` is a no-op.
- :class:`GPU` — CuPy arrays on one device, a compute stream (made current) and a high-priority
  communication stream for halo exchange.

:func:`auto` picks one for the whole job (every rank agrees) and records why in ``arch.reason``.
"""

from __future__ import annotations

import os

import numpy as np

from hpcgpu.errors import BackendError, ConfigurationError
from hpcgpu.runtime.affinity import bind_near_gpu
from hpcgpu.runtime.device import gpu_identity, probe_cupy, select_device
from hpcgpu.runtime.streams import on_stream  # noqa: F401 - public here

BACKENDS = ("auto", "cupy", "numpy")


def is_device_array(array) -> bool:
    """True for a CuPy array (or any object of a ``cupy`` module), checked without importing CuPy.

    The one test of "is this on the GPU?" for code that gets an array rather than an architecture;
    with an architecture at hand, ``arch.is_gpu`` says the same.
    """
    return type(array).__module__.startswith("cupy")


def array_module(array):
    """``cupy`` for a CuPy array, ``numpy`` for anything else (CuPy imported only when needed)."""
    if is_device_array(array):
        import cupy

        return cupy
    return np


class CPU:
    """Host architecture: NumPy arrays, Numba CPU kernels."""

    name = "cpu"
    is_gpu = False
    binding = "not bound (launcher's binding kept)"
    device_id = None
    compute_stream = None
    comm_stream = None

    def __init__(self, reason: str = "requested"):
        self.xp = np
        self.reason = reason

    def synchronize(self) -> None:
        """Nothing to wait for on the host."""

    def to_host(self, array) -> np.ndarray:
        return np.asarray(array)

    def from_host(self, array) -> np.ndarray:
        return np.asarray(array)

    def zeros(self, shape, dtype="float64") -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def empty(self, shape, dtype="float64") -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def describe(self) -> str:
        return "CPU (NumPy + Numba)"

    def __repr__(self) -> str:
        return f"CPU(reason={self.reason!r})"


class GPU:
    """One CUDA device through CuPy.

    Parameters
    ----------
    device_id : int
        Index among the visible devices of this process.
    reason : str
        Why this device and backend were chosen (printed by rank 0).

    Notes
    -----
    The compute stream is made CuPy's current stream, so every CuPy operation of the program runs on
    it. The communication stream has the highest priority the device offers, so halo packing and NCCL
    transfers overtake bulk interior kernels.
    """

    name = "gpu"
    is_gpu = True
    binding = "not bound (launcher's binding kept)"

    def __init__(self, device_id: int = 0, reason: str = "requested"):
        import cupy

        self.xp = cupy
        self.device_id = device_id
        self.reason = reason
        self.device = cupy.cuda.Device(device_id)
        self.device.use()
        # CUDA clamps a priority outside the device's range to the nearest valid one, so a very
        # negative value gives the highest priority the device offers (-5 on Hopper; 0 is the lowest).
        # HPCGPU_COMM_STREAM_PRIORITY (for measurements): high (default) = communication above compute,
        # normal = both at the default priority, low = compute above communication.
        priority = os.environ.get("HPCGPU_COMM_STREAM_PRIORITY", "high")
        self.compute_stream = cupy.cuda.Stream(non_blocking=True, priority=-100 if priority == "low" else 0)
        self.comm_stream = cupy.cuda.Stream(non_blocking=True, priority=-100 if priority == "high" else 0)
        # Push the compute stream on CuPy's stack of current streams instead of ``Stream.use()``:
        # CuPy's own ``with stream:`` blocks (``ndarray.get(stream=...)`` is one) pop back to the top
        # of that stack on exit. After a bare ``use()`` the top is the legacy null stream, so the
        # first such call silently moved every later kernel off the compute stream, out of the
        # event ordering with the communication stream and out of CUDA graph captures.
        self.compute_stream.__enter__()
        self.identity = gpu_identity(device_id)

    def synchronize(self) -> None:
        """Wait for all work on this device (both streams)."""
        self.device.synchronize()

    def on_stream(self, stream):
        """Make ``stream`` CuPy's current stream inside the block (see :func:`on_stream`)."""
        return on_stream(stream)

    def check_compute_stream(self, what: str) -> None:
        """Raise :class:`BackendError` unless the compute stream is CuPy's current stream; returns None.

        Kernels go to CuPy's current stream, while halo exchanges and graph captures order themselves
        after the compute stream: work on any other stream would race with them (silently wrong
        results) or escape the capture. ``what`` names the operation that needs the guarantee.
        """
        import cupy

        current = cupy.cuda.get_current_stream()
        if current.ptr != self.compute_stream.ptr:
            raise BackendError(
                f"{what} needs the compute stream ({self.compute_stream.ptr:#x}) to be CuPy's current stream, "
                f"but the current stream is {current.ptr:#x}. Something made another stream current and did not "
                "restore it: switch streams with hpcgpu.arch.on_stream(stream), not Stream.use() or "
                "`with stream:` around code that stays on it."
            )

    def to_host(self, array) -> np.ndarray:
        """Copy to a NumPy array after all work queued on the compute stream."""
        import cupy

        if not isinstance(array, cupy.ndarray):
            return np.asarray(array)
        host = array.get(stream=self.compute_stream)
        self.compute_stream.synchronize()
        return host

    def from_host(self, array):
        import cupy

        return cupy.asarray(array)

    def zeros(self, shape, dtype="float64"):
        return self.xp.zeros(shape, dtype=dtype)

    def empty(self, shape, dtype="float64"):
        return self.xp.empty(shape, dtype=dtype)

    def describe(self) -> str:
        ident = self.identity
        return f"GPU {self.device_id} ({ident.name}, {ident.pci_bus_id})"

    def __repr__(self) -> str:
        return f"GPU(device_id={self.device_id}, reason={self.reason!r})"


def cpu_threads_per_rank(comm) -> int:
    """CPU threads each rank may use: its allowed CPUs shared evenly by the ranks of its node."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, comm.local_size))


def _cpu(comm, reason: str) -> CPU:
    """The CPU architecture, with Numba's thread count set so the ranks of a node do not oversubscribe.

    Numba's parallel loops synchronise their threads at every kernel; with more threads than cores
    (several ranks each starting one thread per core) those barriers make kernels 10-100x slower.
    ``NUMBA_NUM_THREADS`` set by the user wins.
    """
    threads = cpu_threads_per_rank(comm)
    if "NUMBA_NUM_THREADS" not in os.environ:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        reason += f"; {threads} Numba thread(s) per rank"
    return CPU(reason=reason)


def auto(comm, backend: str = "auto", allow_sharing: bool = False, bind_cpus: bool = False):
    """Collective: choose the architecture for every rank of ``comm``.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    backend : {"auto", "cupy", "numpy"}
        ``auto`` takes the GPU when CuPy and a device are usable on *every* rank, else the CPU;
        ``cupy`` requires a GPU (error on every rank if any rank lacks one); ``numpy`` forces the CPU.
    allow_sharing : bool
        Let several ranks of a node use one GPU (normally an error).
    bind_cpus : bool
        Bind each rank to its share of the CPUs near its GPU (NVML); the outcome is in ``arch.binding``.

    Returns
    -------
    CPU or GPU
        With ``reason`` set to one line explaining the choice.
    """
    if backend not in BACKENDS:
        raise ConfigurationError(f"--backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "numpy":
        return _cpu(comm, "--backend numpy was requested")

    usable, why = probe_cupy()
    flags = comm.mpi.allgather(why if not usable else None)
    failing = [(rank, text) for rank, text in enumerate(flags) if text is not None]
    if failing:
        first_rank, first_why = failing[0]
        detail = f"rank {first_rank}: {first_why}" + (f" (and {len(failing) - 1} more)" if len(failing) > 1 else "")
        if backend == "cupy":
            raise BackendError(
                f"--backend cupy needs a usable GPU on every rank, but {detail}. "
                "Install the CUDA extra (pip install 'hpcgpu[cuda12]' or 'hpcgpu[cuda13]') on a GPU "
                "node, or run with --backend numpy."
            )
        return _cpu(comm, f"no usable GPU ({detail}); using NumPy + Numba")
    device_id, how = select_device(comm, allow_sharing=allow_sharing)
    gpu = GPU(device_id, reason=f"{why}; {how}")
    if bind_cpus:
        _, gpu.binding = bind_near_gpu(comm, gpu.identity.pci_bus_id)
    return gpu
