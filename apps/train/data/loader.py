"""Sharded, prefetching data loading: each rank reads only its share of every batch.

The global order of the training set is a seeded permutation per epoch
(:func:`apps.train.data.dataset.global_batches`, independent of the number of ranks); step
``s`` uses global batch ``s % batches_per_epoch`` of epoch ``s // batches_per_epoch``
and rank ``r`` reads the contiguous slice ``shard_bounds(B, r, n_ranks)`` of it. The
data position of a run is therefore just its step counter, which is what a
checkpoint stores.

A background thread prepares the next batches while the current step trains:

* it gathers this rank's rows from the source (an in-memory array, or an HDF5
  file read row-by-row on demand, so a rank never loads the whole data set) into
  one of ``prefetch + 1`` slots;
* on a GPU the slot's host buffers are pinned and the thread copies them to the
  device on its own stream (asynchronous H2D), recording a *ready* event that the
  compute stream waits for; a slot is refilled only after the compute stream has
  passed a *release* event recorded when the consumer moved on.

Arrays returned by :meth:`ShardedLoader.next` stay valid until the next call.
"""

import os
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from .dataset import global_batches, shard_bounds


class ArraySource:
    """Training samples held in memory.

    Parameters
    ----------
    x : ndarray, shape (n_samples, ...)
    y : ndarray of int, shape (n_samples,)
    """

    def __init__(self, x, y):
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x has {x.shape[0]} samples but y has {y.shape[0]}; they must match")
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self.y = np.ascontiguousarray(y, dtype=np.int64)
        self.n_samples = int(x.shape[0])
        self.sample_shape = tuple(x.shape[1:])

    def read_into(self, indices, x_out, y_out):
        """Copy rows ``indices`` into ``x_out``/``y_out`` (preallocated); returns None."""
        np.take(self.x, indices, axis=0, out=x_out)
        np.take(self.y, indices, axis=0, out=y_out)

    def close(self):
        pass


class HDF5Source:
    """Training samples read on demand from datasets ``x`` and ``y`` of an HDF5 file.

    Only the requested rows are read (sorted, as HDF5 point selections require,
    then put back in batch order). The file is opened by the thread that reads.
    """

    def __init__(self, path):
        import h5py

        self.path = os.fspath(path)
        with h5py.File(self.path, "r") as handle:
            self.n_samples = int(handle["x"].shape[0])
            self.sample_shape = tuple(handle["x"].shape[1:])
        self._handle = None

    def read_into(self, indices, x_out, y_out):
        import h5py

        if self._handle is None:
            self._handle = h5py.File(self.path, "r")
        order = np.argsort(indices, kind="stable")
        sorted_indices = np.asarray(indices)[order]
        x_out[order] = self._handle["x"][sorted_indices]
        y_out[order] = self._handle["y"][sorted_indices]

    def close(self):
        if self._handle is not None:
            self._handle.close()
            self._handle = None


@dataclass
class Batch:
    """This rank's share of one global batch.

    Attributes
    ----------
    step : int
        Optimiser step the batch belongs to.
    epoch, batch_in_epoch : int
        Its place in the global order.
    x : ndarray, shape (local_batch, ...)
        On the compute backend (valid until the next :meth:`ShardedLoader.next`).
    y : ndarray of int64, shape (local_batch,)
    sample_index : ndarray of int64, shape (local_batch,)
        Positions of the samples in the global batch (dropout masks depend on them).
    """

    step: int
    epoch: int
    batch_in_epoch: int
    x: object
    y: object
    sample_index: object


class _Slot:
    """Buffers of one prefetched batch (host, plus device copies and events on a GPU)."""

    def __init__(self, local_batch, sample_shape, arch):
        self.gpu = bool(arch is not None and arch.is_gpu)
        shape = (local_batch,) + tuple(sample_shape)
        if self.gpu:
            import cupy

            self.x_host = _pinned_empty(shape, np.float32)
            self.y_host = _pinned_empty((local_batch,), np.int64)
            self.x = cupy.empty(shape, dtype=np.float32)
            self.y = cupy.empty((local_batch,), dtype=np.int64)
            self.ready = cupy.cuda.Event(disable_timing=True)
            self.release = cupy.cuda.Event(disable_timing=True)
            self.ready.record(arch.compute_stream)
            self.release.record(arch.compute_stream)
        else:
            self.x_host = self.x = np.empty(shape, dtype=np.float32)
            self.y_host = self.y = np.empty((local_batch,), dtype=np.int64)
        self.step = None
        self.epoch = None
        self.batch_in_epoch = None


def _pinned_empty(shape, dtype):
    import cupy

    count = int(np.prod(shape, dtype=np.int64))
    memory = cupy.cuda.alloc_pinned_memory(max(1, count * np.dtype(dtype).itemsize))
    return np.frombuffer(memory, dtype=dtype, count=count).reshape(shape)


class ShardedLoader:
    """This rank's shards of the global batches, prefetched on a background thread.

    Parameters
    ----------
    source : ArraySource or HDF5Source
    global_batch_size : int
        Samples per optimiser step over all ranks (and micro-batches).
    seed : int
        Seed of the per-epoch shuffle.
    rank, n_ranks : int
    start_step : int
        First step to deliver (a restart continues from its checkpoint's step).
    arch : hpcgpu.arch.CPU or GPU, optional
        GPU: batches are copied to the device (pinned buffers, asynchronous H2D).
    prefetch : int
        Batches prepared ahead of the one in use.
    """

    def __init__(self, source, global_batch_size, seed, rank, n_ranks, start_step=0,
                 arch=None, prefetch=2):
        if not 1 <= global_batch_size <= source.n_samples:
            raise ValueError(f"global batch size: expected 1 <= B <= {source.n_samples} "
                             f"(training samples), found {global_batch_size}")
        self.source = source
        self.global_batch_size = int(global_batch_size)
        self.seed, self.rank, self.n_ranks = int(seed), int(rank), int(n_ranks)
        self.batches_per_epoch = source.n_samples // self.global_batch_size
        self.lo, self.hi = shard_bounds(self.global_batch_size, rank, n_ranks)
        self.local_batch = self.hi - self.lo
        self.arch = arch
        self.io_seconds = 0.0           # time next() waited for the background thread
        self._slots = [_Slot(self.local_batch, source.sample_shape, arch) for _ in range(prefetch + 1)]
        index = np.arange(self.lo, self.hi, dtype=np.int64)
        self.sample_index = arch.from_host(index) if arch is not None else index
        self._free = queue.Queue()
        self._ready = queue.Queue()
        for slot in self._slots:
            self._free.put(slot)
        self._current = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(int(start_step),),
                                        name=f"loader-rank{rank}", daemon=True)
        self._thread.start()

    def position(self, step):
        """``(epoch, batch_in_epoch)`` of global step ``step``."""
        return divmod(int(step), self.batches_per_epoch)

    # -- background thread --------------------------------------------------------
    def _produce(self, step):
        try:
            copy_stream = None
            if self.arch is not None and self.arch.is_gpu:
                import cupy

                cupy.cuda.Device(self.arch.device_id).use()
                copy_stream = cupy.cuda.Stream(non_blocking=True)
            cached_epoch, batches = None, None
            while not self._stop.is_set():
                slot = self._free.get()
                if slot is None:
                    return
                epoch, batch_in_epoch = self.position(step)
                if epoch != cached_epoch:
                    batches = global_batches(self.source.n_samples, self.global_batch_size,
                                             self.seed, epoch)
                    cached_epoch = epoch
                indices = batches[batch_in_epoch][self.lo:self.hi]
                if slot.gpu:
                    slot.ready.synchronize()   # the last H2D out of these pinned buffers is done
                self.source.read_into(indices, slot.x_host, slot.y_host)
                if slot.gpu:
                    # the device buffers may be overwritten once the compute stream released them
                    copy_stream.wait_event(slot.release)
                    slot.x.set(slot.x_host, stream=copy_stream)
                    slot.y.set(slot.y_host, stream=copy_stream)
                    slot.ready.record(copy_stream)
                slot.step, slot.epoch, slot.batch_in_epoch = step, epoch, batch_in_epoch
                self._ready.put(slot)
                step += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, never lost
            self._ready.put(exc)

    # -- consumer ------------------------------------------------------------------
    def next(self):
        """The next step's :class:`Batch` (blocks until it is prepared)."""
        self._release_current()
        started = time.perf_counter()
        slot = self._ready.get()
        self.io_seconds += time.perf_counter() - started
        if isinstance(slot, BaseException):
            raise slot
        if slot.gpu:
            self.arch.compute_stream.wait_event(slot.ready)
        self._current = slot
        return Batch(slot.step, slot.epoch, slot.batch_in_epoch, slot.x, slot.y, self.sample_index)

    def _release_current(self):
        if self._current is None:
            return
        if self._current.gpu:
            self._current.release.record(self.arch.compute_stream)
        self._free.put(self._current)
        self._current = None

    def close(self):
        """Stop the background thread and close the source; returns None."""
        self._stop.set()
        self._release_current()
        self._free.put(None)
        self._thread.join(timeout=10)
        self.source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class TrainingData:
    """What :func:`open_training_data` returns.

    Attributes
    ----------
    source : ArraySource or HDF5Source
    test : tuple (x_test, y_test) of host arrays, or None
    n_classes : int
    description : str
    """

    source: object
    test: object
    n_classes: int
    description: str


def open_training_data(path=None, cache_dir=None):
    """The training source and (optional) test set.

    Parameters
    ----------
    path : str, optional
        HDF5 file with datasets ``x`` (n, ...) float and ``y`` (n,) int, optionally
        ``x_test``/``y_test``. None: the standard MNIST-1D (generated offline and
        cached, see :func:`apps.train.data.dataset.load_mnist1d`).

    Returns
    -------
    TrainingData
    """
    if path is None:
        from .dataset import load_mnist1d

        dataset = load_mnist1d(cache_dir)
        return TrainingData(ArraySource(dataset.x, dataset.y), (dataset.x_test, dataset.y_test),
                            dataset.n_classes,
                            f"MNIST-1D ({dataset.x.shape[0]} train / {dataset.x_test.shape[0]} test, "
                            f"length {dataset.x.shape[1]})")
    import h5py

    with h5py.File(path, "r") as handle:
        missing = [name for name in ("x", "y") if name not in handle]
        if missing:
            raise ValueError(f"data file {path!r}: expected datasets 'x' and 'y', missing {missing}; "
                             f"found {sorted(handle.keys())}")
        if handle["x"].shape[0] != handle["y"].shape[0] or handle["y"].ndim != 1:
            raise ValueError(f"data file {path!r}: x has shape {handle['x'].shape} and y "
                             f"{handle['y'].shape}; expected x (n, ...) and y (n,) with the same n")
        if handle["y"].dtype.kind not in "iu":
            raise ValueError(f"data file {path!r}: y must hold integer class labels, "
                             f"found {handle['y'].dtype}")
        labels = handle["y"][...]   # labels only (small): the class count needs their maximum
        test = None
        if "x_test" in handle and "y_test" in handle:
            test = (handle["x_test"][...].astype(np.float32), handle["y_test"][...].astype(np.int64))
        n_train = handle["x"].shape[0]
    n_classes = int(max(labels.max(), test[1].max() if test else 0)) + 1
    smallest = min(labels.min(), test[1].min() if test else 0)
    if smallest < 0:
        raise ValueError(f"data file {path!r}: class labels must be >= 0, found {smallest}")
    text = f"{path} ({n_train} train" + (f" / {test[0].shape[0]} test)" if test else ", no test set)")
    return TrainingData(HDF5Source(path), test, n_classes, text)
