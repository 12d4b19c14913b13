"""The checkpoint service: save, find and load checkpoints of distributed state.

Every method is collective (all ranks call it with the same arguments, in the same order) except
:meth:`CheckpointManager.poll`. Failures are agreed across ranks before anyone raises, so an error
is raised identically on every rank and never leaves a rank waiting in a collective.

Atomicity: a checkpoint is written into ``ckpt_N.tmp/``; only when every rank's files are flushed
and fsync'd, and every rank says so, does rank 0 rename the directory to ``ckpt_N/`` (atomic) and
fsync the parent. A crash at any moment leaves either the complete new checkpoint or a ``*.tmp``
directory that :meth:`find` ignores, next to the intact older checkpoints.

Ownership: every checkpoint records the run that wrote it (a run id, kept across restarts) and a
fingerprint of the run's configuration (:mod:`hpcgpu.checkpoint.identity`). A manager prunes only
its own run's checkpoints, refuses to save over another run's, replaces its own atomically, and
``"latest"`` picks only checkpoints of a compatible configuration.
"""

from __future__ import annotations

import datetime
import json
import queue
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcgpu.checkpoint import bulk, identity, layout
from hpcgpu.checkpoint import layout_process
from hpcgpu.checkpoint.filesystem import fault_point, publish_checkpoint, recover_replaced, remove_tree
from hpcgpu.checkpoint.reader import BlockReader, CheckpointInfo, read_master, read_replicated_state
from hpcgpu.checkpoint.snapshot import PinnedPool, take_snapshot
from hpcgpu.checkpoint.writer import (build_index, describe, write_master_file, write_rank_file,
                                      write_single_file)
from hpcgpu.errors import CheckpointError, ConfigurationError

STORAGES = ("auto", layout.LAYOUT_PER_RANK, layout.LAYOUT_SINGLE_FILE)


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (invalid) and an older one is used instead."""


@dataclass
class RestoredState:
    """What :meth:`CheckpointManager.load` returns (the fields were filled in place).

    Attributes
    ----------
    info : CheckpointInfo
    step : int
    replicated : dict
        The replicated state as saved (see :mod:`hpcgpu.checkpoint.replicated` for types).
    particles : dict of name -> numpy.ndarray, or None
        This rank's particles, shape ``(n_local, ...)`` per array, host memory.
    particles_exact : bool
        True when every rank got back exactly the rows it wrote, in the same order (same rank count,
        selection accepted them all), as needed for a bitwise-identical continuation.
    """

    info: CheckpointInfo
    step: int
    replicated: dict
    particles: dict | None
    particles_exact: bool

    @property
    def metadata(self) -> dict:
        return self.info.metadata


def _replicated_error(message: str) -> CheckpointError:
    error = CheckpointError(message)
    error.replicated = True
    return error


class _WriteJob:
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
        self.publish_error = None
        self.request = None
        self.verdict = None
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.written, self.verdict_known, self.done = threading.Event(), threading.Event(), threading.Event()

    def run(self, write_fn) -> None:
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            write_fn(self)
        except BaseException as exc:  # noqa: BLE001 - reported through the agreement, never lost
            self.error = f"{type(exc).__name__}: {exc}"
            self.traceback = traceback.format_exc()
        self.seconds = time.perf_counter() - started
        # CPU time of the writing thread: an upper bound of the GIL it held (system calls included).
        self.cpu_seconds = time.thread_time() - cpu_started
        self.snapshot = None  # free host copies as soon as they are on disk

    @property
    def succeeded(self) -> bool:
        return self.verdict is not None and int(self.verdict[0]) == 1


class _BackgroundWriter:
    """One long-lived thread per manager that writes (and on rank 0 publishes) asynchronous saves.

    Long-lived rather than a thread per save: starting a thread makes ``save`` wait until the new
    thread has run, and that thread then competes for the GIL with the caller, which a persistent
    thread woken through a queue avoids.
    """

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        self._thread = None

    def submit(self, job: _WriteJob, write_fn, publish_fn) -> None:
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


class CheckpointManager:
    """Checkpoints of one run in one directory.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    directory : str or Path
        Where ``ckpt_NNNNNNNNN/`` directories go (created if needed). Must be visible to every rank.
    app : str
        Name stored in every checkpoint (``"apps.stencil"``); :meth:`load` refuses other apps' files.
    keep : int
        Keep the newest ``keep`` checkpoints, remove older ones after each successful save.
    asynchronous : bool
        :meth:`save` copies the state to host (pinned) buffers and returns; a background thread
        writes the files while stepping continues. At most one write is in flight: the next save
        waits for it. Call :meth:`poll` once per step to commit a finished write and to surface its
        errors, and :meth:`wait` before the end of the run.
    compression : None, "gzip" or "lzf"
        HDF5 compression of field and particle data (off by default: it costs write throughput
        and rarely pays for floating-point state).
    storage : {"auto", "per-rank-files", "single-file"}
        ``single-file`` needs h5py with MPI (parallel HDF5) and synchronous saves; ``auto`` picks it
        when available and ``per-rank-files`` otherwise.
    provenance : dict, optional
        ``hpcgpu_version`` and ``git_commit`` to record (default: this hpcgpu's).
    config : dict, optional
        The options that define the model and the layout of its state (JSON-able values; the
        same on every rank). Their fingerprint is stored in every checkpoint, and ``"latest"``
        restarts only from checkpoints with the same fingerprint (or legacy ones, which have none).
    run_id : str, optional
        This run's id (the same on every rank); by default rank 0 makes a new one and broadcasts it.
        :meth:`load` replaces it with the run id of the checkpoint it restarts from.

    Attributes
    ----------
    run_id : str
    config_fingerprint : str
    restart_note : str or None
        After :meth:`load`: which run was continued and what else the directory holds (several runs,
        incompatible ones, a legacy checkpoint), for the app to print.
    """

    def __init__(self, comm, directory, app: str, keep: int = 3, asynchronous: bool = False,
                 compression: str | None = None, storage: str = "auto", provenance: dict | None = None,
                 config: dict | None = None, run_id: str | None = None):
        import h5py

        if keep < 1:
            raise ConfigurationError(f"keep must be at least 1 (checkpoints to keep), got {keep}")
        if storage not in STORAGES:
            raise ConfigurationError(f"storage must be one of {STORAGES}, got {storage!r}")
        if compression not in (None, "gzip", "lzf"):
            raise ConfigurationError(f"compression must be None, 'gzip' or 'lzf', got {compression!r}")
        parallel_hdf5 = bool(h5py.get_config().mpi)
        if storage == "auto":
            storage = layout.LAYOUT_SINGLE_FILE if parallel_hdf5 and not asynchronous else layout.LAYOUT_PER_RANK
        if storage == layout.LAYOUT_SINGLE_FILE and (asynchronous or not parallel_hdf5):
            raise ConfigurationError("storage='single-file' needs h5py built with MPI (h5py.get_config().mpi) and "
                                     "synchronous saves; use storage='per-rank-files'")
        self.comm, self.directory, self.app = comm, Path(directory), app
        self.keep, self.asynchronous, self.compression, self.storage = keep, asynchronous, compression, storage
        if provenance is None:
            provenance = {}
            if comm.rank == 0:
                import hpcgpu
                from hpcgpu.app.environment import git_commit

                provenance = {"hpcgpu_version": hpcgpu.__version__, "git_commit": git_commit()}
        self.provenance = provenance
        self.config = identity.canonical_options(config or {})
        self.config_fingerprint = identity.fingerprint(self.config)
        if run_id is None:
            run_id = comm.broadcast(identity.new_run_id() if comm.rank == 0 else None, root=0)
        self.run_id = str(run_id)
        self.restart_note = None
        self._incompatible = []  # checkpoints "latest" skipped for their configuration (for messages)
        self._pool = PinnedPool() if asynchronous else None
        self._writer = _BackgroundWriter() if asynchronous else None
        # The h5py layout of asynchronous saves runs in a helper process (off this process's GIL);
        # started now, so that it has imported h5py by the first save.
        self._layout_process = None
        if asynchronous and storage == layout.LAYOUT_PER_RANK and layout_process.enabled():
            self._layout_process = layout_process.LayoutProcess()
            self._layout_process.start()
        self._scratch = bulk.Scratch()  # pack buffers for strided arrays, reused between saves
        # Commits of background writes agree through non-blocking reductions on a private
        # communicator, so they never match the application's own collectives.
        self._commit_comm = comm.mpi.Dup() if asynchronous else None
        self._pending = None
        self.last_save_seconds = 0.0      # time save() blocked the caller
        self.last_write_seconds = 0.0     # time the files took to write (background or not)
        self.last_write_cpu_seconds = 0.0  # CPU time of the thread that wrote them
        self.last_bytes = 0               # field and particle bytes this rank wrote last time

    # ------------------------------------------------------------------ saving
    def save(self, step: int, fields: dict | None = None, particles: dict | None = None,
             replicated: dict | None = None, metadata: dict | None = None) -> CheckpointInfo | None:
        """Collective: checkpoint the state of ``step``.

        Parameters
        ----------
        step : int
        fields : dict of name -> hpcgpu.Field
            Saved as global arrays (owned cells, no ghosts); each rank writes its own block.
        particles : dict of name -> array of shape (n_local, ...), optional
            Per-rank rows (NumPy or CuPy), the same count for every array on a rank; any count per rank.
        replicated : dict, optional
            State that is identical on every rank (checked: a difference raises CheckpointError).
        metadata : dict, optional
            JSON-able facts recorded with the checkpoint (configuration summary, decomposition, ...).

        Returns
        -------
        CheckpointInfo when the checkpoint is committed (synchronous saves); None for an
        asynchronous save still in flight.
        """
        started = time.perf_counter()
        if self._pending is not None:
            self.wait()
        final = self.directory / layout.directory_name(step)
        temporary = final.with_name(final.name + layout.TEMPORARY_SUFFIX)
        problem = None
        if self.comm.rank == 0:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                recover_replaced(self.directory)
                remove_tree(temporary)  # left over by a crash during an earlier attempt
                owner = identity.read_owner(final) if final.exists() else None
                if owner is not None and (owner.problem is not None or owner.run_id != self.run_id):
                    problem = identity.refuse_overwrite_message(final, owner, self.run_id)
                else:
                    temporary.mkdir()
            except OSError as exc:
                problem = f"cannot create {temporary}: {exc}"
        try:
            snapshot = take_snapshot(step, fields or {}, particles, replicated or {}, metadata or {},
                                     copy=self.asynchronous, pool=self._pool)
            description = describe(snapshot)
        except Exception as exc:  # noqa: BLE001 - agreed below so every rank raises together
            snapshot, description = None, {"error": f"{type(exc).__name__}: {exc}"}
        description["problem"] = problem
        # This allgather is also the barrier that orders rank 0's mkdir before anyone's file.
        descriptions = self.comm.mpi.allgather(description)
        errors = [f"rank {r}: {d['error']}" for r, d in enumerate(descriptions) if "error" in d]
        if descriptions[0]["problem"] or errors:
            self._discard(temporary)
            raise _replicated_error(f"checkpoint of step {step} not written: "
                                    f"{descriptions[0]['problem'] or '; '.join(errors)}")
        index, problem = build_index(descriptions)
        if problem:
            self._discard(temporary)
            raise _replicated_error(f"checkpoint of step {step} not written: {problem}")
        job = _WriteJob(snapshot, index, temporary, final, self.run_id)
        self.last_bytes = snapshot.n_bytes
        if self.asynchronous:
            self._writer.submit(job, self._write_files, self._publish if self.comm.rank == 0 else None)
            self._pending = job
            self.last_save_seconds = time.perf_counter() - started
            return None
        job.run(self._write_files)
        info = self._commit_blocking(job)
        self.last_save_seconds = time.perf_counter() - started
        return info

    def _master_attributes(self, job: _WriteJob) -> dict:
        """Provenance and identity for the master file's root attributes."""
        return {**self.provenance, identity.RUN_ID_ATTRIBUTE: job.run_id,
                identity.FINGERPRINT_ATTRIBUTE: self.config_fingerprint,
                identity.OPTIONS_ATTRIBUTE: json.dumps(self.config, sort_keys=True)}

    def _write_files(self, job: _WriteJob) -> None:
        rank, n_ranks = self.comm.rank, self.comm.size
        provenance = self._master_attributes(job)
        if self.storage == layout.LAYOUT_SINGLE_FILE:
            write_single_file(job.temporary / layout.MASTER_FILE, job.snapshot, job.index, self.comm, self.app,
                              provenance)
            return
        helper = self._layout_process if self.asynchronous else None
        master = job.temporary / layout.MASTER_FILE
        if helper is not None and rank == 0:
            # Sent with the rank file's layout request: the helper writes the master while this
            # thread pwrites the rank file's bytes.
            helper.queue_master_file(master, job.snapshot, job.index, self.app, n_ranks, provenance)
        write_rank_file(job.temporary / layout.rank_file_name(rank), job.snapshot, rank, n_ranks, self.app,
                        self.compression, scratch=self._scratch, layout_process=helper)
        if rank == 0 and (helper is None or not helper.master_file_written()):
            write_master_file(master, job.snapshot, job.index, self.app, n_ranks, provenance)

    def _discard(self, temporary: Path) -> None:
        if self.comm.rank == 0:
            remove_tree(temporary)

    def _publish(self, job: _WriteJob) -> None:
        """Rank 0: make the written checkpoint visible (atomic rename) and remove old ones."""
        fault_point("before-rename", 0)
        helper = self._layout_process if self.asynchronous else None
        if helper is None or not helper.publish_checkpoint(job.temporary, job.final, self.keep, job.run_id):
            # A synchronous save returns once its checkpoint is durable; the old checkpoints it
            # replaces are renamed away now and unlinked in the background (~0.1 s per 512 MiB).
            publish_checkpoint(job.temporary, job.final, self.keep, job.run_id, defer_removal=not self.asynchronous)

    def _info_of(self, job: _WriteJob) -> CheckpointInfo:
        return CheckpointInfo(path=job.final, step=int(layout.step_of(job.final.name)), app=self.app,
                              n_ranks=self.comm.size, layout=self.storage,
                              created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              hpcgpu_version=str(self.provenance.get("hpcgpu_version", "")),
                              git_commit=str(self.provenance.get("git_commit", "")), index=job.index,
                              run_id=job.run_id, config_fingerprint=self.config_fingerprint,
                              config_options=self.config)

    def _commit_blocking(self, job: _WriteJob) -> CheckpointInfo:
        self.last_write_seconds = job.seconds
        self.last_write_cpu_seconds = job.cpu_seconds
        failures = self.comm.mpi.allgather(job.error)
        failed = [f"rank {r}: {e}" for r, e in enumerate(failures) if e]
        if failed:
            self._discard(job.temporary)
            raise _replicated_error(f"checkpoint {job.final.name} failed; the previous checkpoint is intact. "
                                    + "; ".join(failed))
        problem = None
        if self.comm.rank == 0:
            try:
                self._publish(job)
            except OSError as exc:
                problem = f"cannot publish {job.temporary} as {job.final}: {exc}"
        problem = self.comm.broadcast(problem, root=0)
        if problem:
            raise _replicated_error(problem)
        return self._info_of(job)

    @property
    def in_flight(self) -> bool:
        """True while an asynchronous save is not yet committed (not collective)."""
        return self._pending is not None

    def poll(self) -> CheckpointInfo | None:
        """Not collective, cheap: commit a finished background write; call once per step.

        Returns the CheckpointInfo of a checkpoint committed now, else None. Once the ranks agree
        that every file is durable, rank 0's writer thread renames the directory and removes old
        checkpoints (a directory fsync and a tree removal stay off the stepping thread); a later
        ``poll`` returns the info.

        Raises
        ------
        CheckpointError
            If the background write failed on any rank. The ranks learn it at slightly different
            steps, so the error is not marked replicated: under ``hpcgpu.abort_on_error`` the job
            ends with MPI_Abort. The previous checkpoint stays intact.
        """
        job = self._pending
        if job is None or not job.written.is_set():
            return None
        if not job.verdict_known.is_set():
            self._start_agreement(job)
            if not job.request.Test():
                return None
            job.verdict_known.set()
            if not job.succeeded:
                return self._finish_background(job, replicated=False)
        if not job.done.is_set():
            return None
        return self._finish_background(job, replicated=False)

    def wait(self) -> CheckpointInfo | None:
        """Collective: block until the write in flight (if any) is committed; re-raise its errors.

        Returns the committed checkpoint's info, or None when nothing was in flight on this rank.
        """
        job = self._pending
        if job is None:
            return None
        job.written.wait()
        if not job.verdict_known.is_set():
            self._start_agreement(job)
            job.request.Wait()
            job.verdict_known.set()
        if job.succeeded:
            job.done.wait()
        return self._finish_background(job, replicated=True)

    def _start_agreement(self, job: _WriteJob) -> None:
        if job.request is None:
            job.verdict = np.array([0 if job.error else 1], dtype=np.int64)
            job.request = self._commit_comm.Iallreduce(job.verdict.copy(), job.verdict, op=_mpi_min())

    def _finish_background(self, job: _WriteJob, replicated: bool) -> CheckpointInfo:
        self._pending = None
        self.last_write_seconds = job.seconds
        self.last_write_cpu_seconds = job.cpu_seconds
        error_type = _replicated_error if replicated else CheckpointError
        if not job.succeeded:
            self._discard(job.temporary)
            where = job.error or "the background write failed on another rank"
            raise error_type(f"asynchronous checkpoint {job.final.name} failed ({where}); the previous "
                             "checkpoint is intact")
        if job.publish_error:
            raise CheckpointError(job.publish_error)
        return self._info_of(job)

    def close(self) -> None:
        """Collective: wait for a write in flight and release the private communicator."""
        self.wait()
        if self._writer is not None:
            self._writer.close()
        if self._layout_process is not None:
            self._layout_process.close()
            self._layout_process = None
        if self._commit_comm is not None:
            self._commit_comm.Free()
            self._commit_comm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()

    # ------------------------------------------------------------------ housekeeping
    def checkpoints(self) -> list[Path]:
        """Complete checkpoint directories (names only; not validated), oldest first. Not collective."""
        if not self.directory.is_dir():
            return []
        found = [(layout.step_of(p.name), p) for p in self.directory.iterdir() if p.is_dir()]
        return [p for step, p in sorted((s, p) for s, p in found if s is not None)]

    def owners(self) -> list[identity.CheckpointOwner]:
        """Collective: who wrote each complete checkpoint (rank 0 reads the masters' attributes), oldest
        step first, the same list on every rank."""
        owners = None
        if self.comm.rank == 0:
            recover_replaced(self.directory)  # a replacement interrupted by a crash
            owners = [identity.read_owner(path) for path in self.checkpoints()]
        return self.comm.broadcast(owners, root=0)

    def foreign_checkpoints(self) -> list[identity.CheckpointOwner]:
        """Collective: the checkpoints in the directory that this run did not write (another run id,
        legacy or unreadable ones)."""
        return [owner for owner in self.owners() if owner.problem is not None or owner.run_id != self.run_id]

    # ------------------------------------------------------------------ finding
    def _candidates(self, which) -> list[Path]:
        self._incompatible = []
        if isinstance(which, CheckpointInfo):
            return [which.path]
        if str(which) == "latest":
            return self._latest_candidates()
        path = Path(which)
        if path.name == layout.MASTER_FILE:
            path = path.parent
        if not path.is_absolute() and not path.exists() and (self.directory / path).exists():
            path = self.directory / path
        return [path]

    def _latest_candidates(self) -> list[Path]:
        """Compatible checkpoints, the newest run first (by the time its newest checkpoint was written),
        each run's newest step first; unreadable ones are tried in step order with the newest run's
        (so they are skipped with a warning where they would have been chosen)."""
        owners = self.owners()
        unreadable = [o for o in owners if o.problem is not None]
        readable = [o for o in owners if o.problem is None]
        compatible = [o for o in readable if o.compatible_with(self.config_fingerprint)]
        self._incompatible = [o for o in readable if not o.compatible_with(self.config_fingerprint)]
        newest = {}
        for owner in compatible:
            newest[owner.run_id] = max(newest.get(owner.run_id, owner.created_time()), owner.created_time())
        order = {run: i for i, run in enumerate(sorted(newest, key=lambda run: newest[run], reverse=True))}
        ordered = sorted(compatible, key=lambda o: (order[o.run_id], -o.step))
        first_run = [o for o in ordered if order[o.run_id] == 0]
        ordered = sorted(first_run + unreadable, key=lambda o: -o.step) + ordered[len(first_run):]
        if not ordered and self._incompatible:
            raise _replicated_error(f"no checkpoint in {self.directory} matches this run's configuration; found "
                                    f"{identity.summarize(self._incompatible)}.\n" + self._differences_text()
                                    + "\nRestart with the options of the run to continue, name one checkpoint "
                                    "explicitly to restart from it anyway, or start a new run in another "
                                    "checkpoint directory")
        return [o.path for o in ordered]

    def _differences_text(self) -> str:
        lines, seen = [], set()
        for owner in self._incompatible:
            if owner.run_id in seen:
                continue
            seen.add(owner.run_id)
            lines.append(f"{owner.run_label} differs from this run in:")
            lines += [f"    {line}" for line in identity.differences(owner.config_options, self.config)]
        return "\n".join(f"  {line}" for line in lines)

    def _describe_choice(self, info: CheckpointInfo, which) -> str | None:
        """What :attr:`restart_note` says about the checkpoint just loaded (None: nothing noteworthy)."""
        notes = []
        if info.legacy:
            notes.append(f"{info.path.name} was written before run ids existed (a legacy checkpoint); this run "
                         f"continues it as run {self.run_id}, and leaves the legacy checkpoints in place")
        elif info.config_fingerprint not in (None, self.config_fingerprint):
            notes.append(f"{info.path.name} was written with other options: "
                         + "; ".join(identity.differences(info.config_options, self.config)))
        if str(which) == "latest":
            others = [o for o in self.owners() if o.problem is not None or o.run_id != info.run_id]
            if others:
                notes.append(f"{self.directory} holds checkpoints of several runs; chose the newest compatible "
                             f"one ({'legacy run' if info.legacy else 'run ' + str(info.run_id)}, step {info.step}); "
                             f"also there: {identity.summarize(others)}")
        return "; ".join(notes) or None

    def _inspect(self, path: Path) -> CheckpointInfo:
        """Collective: read the master on rank 0; every rank checks a share of the rank files."""
        result = None
        if self.comm.rank == 0:
            try:
                result = read_master(path, expected_app=self.app)
            except CheckpointError as exc:
                result = str(exc)
        result = self.comm.broadcast(result, root=0)
        if isinstance(result, str):
            raise _replicated_error(result)
        info = result
        problem = None
        if info.layout == layout.LAYOUT_PER_RANK:
            try:
                with BlockReader(info) as reader:
                    for writer_rank in range(self.comm.rank, info.n_ranks, self.comm.size):
                        reader._handle(info.path / layout.rank_file_name(writer_rank), writer_rank)
            except CheckpointError as exc:
                problem = str(exc)
        self.comm.check(problem is None, problem or "", error=CheckpointError)
        return info

    def find(self, which="latest") -> CheckpointInfo:
        """Collective: the checkpoint to restart from, the same on every rank.

        ``which``: ``"latest"`` (the newest valid checkpoint; invalid newer ones are skipped with a
        :class:`CheckpointWarning`), a checkpoint directory, its ``checkpoint.h5``, or a
        :class:`CheckpointInfo`. Validates structure (master file, index, every rank file's
        identity), not data: checksums are verified by :meth:`load` on exactly the bytes it reads.

        Raises
        ------
        CheckpointError
            No valid checkpoint (the message lists what was found and why each was rejected).
        """
        return self._first_valid(which, lambda info: info)

    def _first_valid(self, which, action):
        candidates = self._candidates(which)
        rejected = []
        for path in candidates:
            try:
                return action(self._inspect(path))
            except CheckpointError as exc:
                if str(which) != "latest":
                    raise
                rejected.append(f"{path.name}: {exc}")
                if self.comm.rank == 0:
                    warnings.warn(f"skipping checkpoint {path}: {exc}", CheckpointWarning, stacklevel=3)
        if not candidates:
            raise _replicated_error(f"no checkpoint found in {self.directory} (expected ckpt_NNNNNNNNN directories); "
                                    "run without --restart to start from the beginning")
        incompatible = ""
        if self._incompatible:
            incompatible = (f"\nskipped, other configuration: {identity.summarize(self._incompatible)}\n"
                            + self._differences_text())
        raise _replicated_error(f"no valid checkpoint in {self.directory}:\n  " + "\n  ".join(rejected) + incompatible)

    # ------------------------------------------------------------------ loading
    def load(self, which="latest", fields: dict | None = None, particles: bool = False,
             particle_select_fn=None) -> RestoredState:
        """Collective: restore a checkpoint; fields are filled in place.

        Parameters
        ----------
        which : "latest", path or CheckpointInfo
            With ``"latest"``, only checkpoints of this manager's configuration fingerprint (or
            legacy ones) are candidates, the newest run's first; a checkpoint that fails to load
            (corrupt data found while reading) is skipped with a :class:`CheckpointWarning` and the
            next older one is tried. After the load, this manager continues the run id of the
            checkpoint (a legacy one keeps the new id) and :attr:`restart_note` says what was chosen.
        fields : dict of name -> hpcgpu.Field
            Each is filled (owned cells) from the saved global array of the same name, which must
            have the same global shape and dtype. Any rank count and decomposition: every rank reads
            just the tiles covering its own block. Fields are untouched if the load fails.
        particles : bool
            Also return this rank's particles.
        particle_select_fn : callable, optional
            ``fn({name: rows}) -> bool mask`` choosing the rows this rank owns (for example the
            particles whose position lies in its sub-box); it must choose each particle on exactly one
            rank (checked). Needed when the rank count changed; with an unchanged rank count each
            rank first tries its own saved rows (exact, same order) and keeps them if ``fn`` accepts
            all of them on every rank.
        """
        restored = self._first_valid(which, lambda info: self._load(info, fields or {}, particles, particle_select_fn))
        # A restarted run continues the run of its checkpoint (a legacy one keeps this run's new id).
        if restored.info.run_id is not None:
            self.run_id = restored.info.run_id
        self.restart_note = self._describe_choice(restored.info, which)
        return restored

    def _load(self, info: CheckpointInfo, fields: dict, want_particles: bool, select_fn) -> RestoredState:
        comm = self.comm
        for name, field in fields.items():
            if name not in info.index["fields"]:
                raise _replicated_error(f"{info.master_file}: has no field {name!r} (it holds "
                                        f"{sorted(info.index['fields'])}); expected a checkpoint of the same model")
            saved_shape, saved_dtype = info.fields[name]
            if saved_shape != tuple(field.decomposition.global_shape) or saved_dtype != np.dtype(field.dtype):
                raise _replicated_error(
                    f"{info.master_file}: field {name!r} is {saved_shape} {saved_dtype}, the run expects "
                    f"{tuple(field.decomposition.global_shape)} {np.dtype(field.dtype)}; restart with the grid and "
                    "precision of the checkpointed run")
        if want_particles and not info.index["particles"]["arrays"]:
            raise _replicated_error(f"{info.master_file}: holds no particles, but particles were requested")
        same_ranks = info.n_ranks == comm.size
        if want_particles and not same_ranks and select_fn is None:
            raise _replicated_error(f"{info.path} was written by {info.n_ranks} ranks and this run has {comm.size}: "
                                    "pass particle_select_fn so each rank can pick the particles it owns")
        blocks, own, all_selected, replicated, problem = {}, None, True, None, None
        reader = BlockReader(info)
        try:
            for name, field in fields.items():
                blocks[name] = _read_owned_block(reader, info, name, field.decomposition)
            if want_particles and same_ranks:
                own = _read_particle_rows(reader, info, comm.rank)
                if select_fn is not None:
                    all_selected = bool(np.all(_mask(select_fn, own)))
            if comm.rank == 0:
                replicated = read_replicated_state(info)
        except CheckpointError as exc:
            problem = str(exc)
        comm.check(problem is None, problem or "", error=CheckpointError)
        particles, exact = None, False
        if want_particles:
            exact = same_ranks and (select_fn is None or bool(comm.allreduce(int(all_selected), op="min")))
            if exact:
                particles = own
            else:
                try:
                    particles = _scan_particles(reader, info, select_fn)
                except CheckpointError as exc:
                    problem = str(exc)
                comm.check(problem is None, problem or "", error=CheckpointError)
            kept = comm.allreduce(int(next(iter(particles.values())).shape[0]), op="sum")
            if kept != info.n_particles:
                raise _replicated_error(f"the ranks kept {kept} of the {info.n_particles} particles of {info.path}; "
                                        "particle_select_fn must choose every particle on exactly one rank")
        reader.close()
        replicated = comm.broadcast(replicated, root=0)
        for name, field in fields.items():
            field.interior[...] = field.arch.from_host(blocks[name])
        return RestoredState(info=info, step=info.step, replicated=replicated, particles=particles,
                             particles_exact=exact)


def _mpi_min():
    from mpi4py import MPI

    return MPI.MIN


def _read_owned_block(reader: BlockReader, info: CheckpointInfo, name: str, grid) -> np.ndarray:
    """This rank's block of field ``name``, assembled from the saved blocks that overlap it."""
    entry = info.index["fields"][name]
    lower, upper = np.asarray(grid.local_start), np.asarray(grid.local_stop)
    block = np.empty(tuple(grid.local_shape), dtype=np.dtype(entry["dtype"]))
    covered = 0
    for writer_rank, (start, shape) in enumerate(zip(entry["starts"], entry["shapes"])):
        start = np.asarray(start)
        overlap_lower, overlap_upper = np.maximum(lower, start), np.minimum(upper, start + np.asarray(shape))
        if np.any(overlap_upper <= overlap_lower):
            continue
        piece = reader.read("fields", name, writer_rank, tuple(overlap_lower - start), tuple(overlap_upper - start))
        block[tuple(slice(a, b) for a, b in zip(overlap_lower - lower, overlap_upper - lower))] = piece
        covered += piece.size
    if covered != block.size:
        raise CheckpointError(f"{info.master_file}: the saved blocks of {name!r} cover {covered} of this rank's "
                              f"{block.size} cells; the index is inconsistent")
    return block


def _read_particle_rows(reader: BlockReader, info: CheckpointInfo, writer_rank: int, first: int = 0,
                        stop: int | None = None) -> dict:
    count = info.index["particles"]["counts"][writer_rank]
    stop = count if stop is None else stop
    rows = {}
    for name, entry in info.index["particles"]["arrays"].items():
        trailing = tuple(entry["trailing"])
        rows[name] = reader.read("particles", name, writer_rank, (first,) + (0,) * len(trailing), (stop,) + trailing)
    return rows


def _mask(select_fn, rows: dict) -> np.ndarray:
    n_rows = next(iter(rows.values())).shape[0]
    mask = np.asarray(select_fn(rows), dtype=bool)
    if mask.shape != (n_rows,):
        raise CheckpointError(f"particle_select_fn returned shape {mask.shape}, expected ({n_rows},)")
    return mask


def _scan_particles(reader: BlockReader, info: CheckpointInfo, select_fn) -> dict:
    """Every rank reads the whole particle table, window by window, and keeps what it selects.

    Simple and correct for any old/new rank counts; it reads the table once per rank, which is fine
    for the particle counts a restart meets in practice (10^8 particles x 4 ranks reads ~10 GB).
    """
    arrays = info.index["particles"]["arrays"]
    kept = {name: [] for name in arrays}
    row_bytes = max(np.dtype(e["dtype"]).itemsize * int(np.prod(e["trailing"], dtype=np.int64)) for e in arrays.values())
    window = max(1, layout.TILE_BYTES // row_bytes)
    for writer_rank, count in enumerate(info.index["particles"]["counts"]):
        for first in range(0, count, window):
            rows = _read_particle_rows(reader, info, writer_rank, first, min(count, first + window))
            mask = _mask(select_fn, rows)
            for name in arrays:
                kept[name].append(rows[name][mask])
    result = {}
    for name, entry in arrays.items():
        empty = np.empty((0,) + tuple(entry["trailing"]), dtype=np.dtype(entry["dtype"]))
        result[name] = np.concatenate([empty] + kept[name])
    return result
