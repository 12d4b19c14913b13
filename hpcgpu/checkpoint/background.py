"""The background writer of asynchronous checkpoints: one job on its way to disk, one long-lived thread.

Used by :class:`hpcgpu.checkpoint.manager.CheckpointManager`; the agreement between ranks and the
commit stay in the manager.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
import traceback
from pathlib import Path

from hpcgpu.output.errors import failure_text, is_storage_failure, quiet_hdf5_teardown


class WriteJob:
    """One checkpoint on its way to disk (written inline or by the background writer).

    Background life cycle: the writer thread writes the files and sets ``written``; the stepping
    thread agrees with the other ranks (``poll``/``wait``), stores ``verdict`` and sets
    ``verdict_known``; on rank 0 the writer thread then publishes (rename, fsync, prune) and sets
    ``done`` (on other ranks ``done`` follows ``written`` at once).
    """

    def __init__(self, snapshot, index, temporary: Path, final: Path, run_id: str):
        self.snapshot, self.index, self.temporary, self.final = snapshot, index, temporary, final
        self.run_id = run_id  # the run that owns it (fixed when the save starts)
        self.error = None
        self.storage_failure = False   # the storage refused the write (full disk, I/O error): exit 74
        self.publish_error = None
        self.request = None
        self.verdict = None
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.written, self.verdict_known, self.done = threading.Event(), threading.Event(), threading.Event()

    def run(self, write_fn) -> None:
        started, cpu_started = time.perf_counter(), time.thread_time()
        with quiet_hdf5_teardown():
            try:
                write_fn(self)
            except BaseException as exc:  # noqa: BLE001 - reported through the agreement, never lost
                self.error = failure_text(exc)
                self.storage_failure = is_storage_failure(exc)
                self.traceback = traceback.format_exc()
            gc.collect()   # h5py objects of a failed write are freed here, under the quiet hook
        self.seconds = time.perf_counter() - started
        # CPU time of the writing thread: an upper bound of the GIL it held (system calls included).
        self.cpu_seconds = time.thread_time() - cpu_started
        self.snapshot = None  # free host copies as soon as they are on disk

    @property
    def succeeded(self) -> bool:
        return self.verdict is not None and int(self.verdict[0]) == 1


class BackgroundWriter:
    """One long-lived thread per manager that writes (and on rank 0 publishes) asynchronous saves.

    Long-lived rather than a thread per save: starting a thread makes ``save`` wait until the new
    thread has run, and that thread then competes for the GIL with the caller, which a persistent
    thread woken through a queue avoids.
    """

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        self._thread = None

    def submit(self, job: WriteJob, write_fn, publish_fn) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="checkpoint-writer", daemon=True)
            self._thread.start()
        self._jobs.put((job, write_fn, publish_fn))

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, write_fn, publish_fn = item
            try:
                job.run(write_fn)
                job.written.set()
                if publish_fn is not None:
                    job.verdict_known.wait()
                    if job.succeeded:
                        try:
                            publish_fn(job)
                        except OSError as exc:
                            job.publish_error = f"cannot publish {job.temporary} as {job.final}: {exc}"
            except BaseException as exc:  # noqa: BLE001 - never leave the stepping thread waiting
                job.publish_error = job.publish_error or f"{type(exc).__name__}: {exc}"
            finally:
                job.written.set()
                job.done.set()

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
