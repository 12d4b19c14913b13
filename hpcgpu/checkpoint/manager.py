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
import time
from pathlib import Path

import numpy as np

from hpcgpu.checkpoint import bulk, identity, layout
from hpcgpu.checkpoint import layout_process
from hpcgpu.checkpoint.background import BackgroundWriter, WriteJob
from hpcgpu.checkpoint.catalogue import CheckpointCatalogue, CheckpointWarning  # noqa: F401 - public here
from hpcgpu.checkpoint.filesystem import fault_point, publish_checkpoint, recover_replaced, remove_tree
from hpcgpu.checkpoint.reader import CheckpointInfo
from hpcgpu.checkpoint.restore import RestoredState, agreed_error, restore_state
from hpcgpu.checkpoint.space import space_problem
from hpcgpu.provenance import provenance as current_provenance
from hpcgpu.checkpoint.snapshot import PinnedPool, take_snapshot
from hpcgpu.checkpoint.writer import (build_index, describe, write_master_file, write_rank_file,
                                      write_single_file)
from hpcgpu.errors import CheckpointError, CheckpointStorageError, ConfigurationError
from hpcgpu.transport import collectives

STORAGES = ("auto", layout.LAYOUT_PER_RANK, layout.LAYOUT_SINGLE_FILE)


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
    resolve_fn : callable, optional
        ``resolve_fn(options) -> options``: a checkpoint's recorded options as this run resolves them
        (options it recorded unset get the value used then, as in ``config``), for the comparison with
        ``config``; default: as recorded.
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
                 config: dict | None = None, run_id: str | None = None, resolve_fn=None):
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
            provenance = current_provenance() if comm.rank == 0 else {}
        self.provenance = provenance
        self.config = identity.canonical_options(config or {})
        self.config_fingerprint = identity.fingerprint(self.config)
        if run_id is None:
            run_id = comm.broadcast(identity.new_run_id() if comm.rank == 0 else None, root=0)
        self.run_id = str(run_id)
        self.restart_note = None
        self.catalogue = CheckpointCatalogue(comm, self.directory, app, self.config, self.config_fingerprint,
                                             resolve_fn=resolve_fn)
        self._pool = PinnedPool() if asynchronous else None
        self._writer = BackgroundWriter() if asynchronous else None
        # The h5py layout of asynchronous saves runs in a helper process (off this process's GIL);
        # started now, so that it has imported h5py by the first save.
        self._layout_process = None
        if asynchronous and storage == layout.LAYOUT_PER_RANK and layout_process.enabled():
            self._layout_process = layout_process.LayoutProcess()
            self._layout_process.start()
        self._scratch = bulk.Scratch()  # pack buffers for strided arrays, reused between saves
        # Commits of background writes agree through non-blocking reductions on a private
        # communicator, so they never match the application's own collectives.
        self._commit_comm = comm.duplicate() if asynchronous else None
        self._pending = None
        self.last_save_seconds = 0.0      # time save() blocked the caller
        self.last_write_seconds = 0.0     # time the files took to write (background or not)
        self.last_write_cpu_seconds = 0.0  # CPU time of the thread that wrote them
        self.last_bytes = 0               # field and particle bytes this rank wrote last time

    # ------------------------------------------------------------------ saving
    def save(self, step: int, fields: dict | None = None, particles: dict | None = None,
             replicated: dict | None = None, metadata: dict | None = None,
             units: dict | None = None) -> CheckpointInfo | None:
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
        units : dict, optional
            ``{"particles": {name: unit}, "replicated": {key: unit}}``: unit strings written as the
            ``units`` attribute of those datasets in ``checkpoint.h5`` (fields carry theirs in
            ``Field.attributes``). Restarts do not read them.

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
                                     copy=self.asynchronous, pool=self._pool, units=units)
            description = describe(snapshot)
            description["n_bytes"] = int(snapshot.n_bytes)
        except Exception as exc:  # noqa: BLE001 - agreed below so every rank raises together
            snapshot, description = None, {"error": f"{type(exc).__name__}: {exc}"}
        description["problem"] = problem
        # This allgather is also the barrier that orders rank 0's mkdir before anyone's file.
        descriptions = self.comm.mpi.allgather(description)
        errors = [f"rank {r}: {d['error']}" for r, d in enumerate(descriptions) if "error" in d]
        if descriptions[0]["problem"] or errors:
            self._discard(temporary)
            raise agreed_error(f"checkpoint of step {step} not written: "
                               f"{descriptions[0]['problem'] or '; '.join(errors)}")
        index, problem = build_index(descriptions)
        if problem:
            self._discard(temporary)
            raise agreed_error(f"checkpoint of step {step} not written: {problem}")
        if self.comm.rank == 0:
            problem = space_problem(self.directory, sum(d.get("n_bytes", 0) for d in descriptions),
                                    len(descriptions) + 1)
        problem = self.comm.broadcast(problem, root=0)
        if problem:
            self._discard(temporary)
            raise storage_error(f"checkpoint of step {step} not written: {problem}; the previous checkpoint "
                                f"is intact")
        job = WriteJob(snapshot, index, temporary, final, self.run_id)
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

    def _master_attributes(self, job: WriteJob) -> dict:
        """Provenance and identity for the master file's root attributes."""
        return {**self.provenance, identity.RUN_ID_ATTRIBUTE: job.run_id,
                identity.FINGERPRINT_ATTRIBUTE: self.config_fingerprint,
                identity.OPTIONS_ATTRIBUTE: json.dumps(self.config, sort_keys=True)}

    def _write_files(self, job: WriteJob) -> None:
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

    def _publish(self, job: WriteJob) -> None:
        """Rank 0: make the written checkpoint visible (atomic rename) and remove old ones."""
        fault_point("before-rename", 0)
        helper = self._layout_process if self.asynchronous else None
        if helper is None or not helper.publish_checkpoint(job.temporary, job.final, self.keep, job.run_id):
            # A synchronous save returns once its checkpoint is durable; the old checkpoints it
            # replaces are renamed away now and unlinked in the background (~0.1 s per 512 MiB).
            publish_checkpoint(job.temporary, job.final, self.keep, job.run_id, defer_removal=not self.asynchronous)

    def _info_of(self, job: WriteJob) -> CheckpointInfo:
        return CheckpointInfo(path=job.final, step=int(layout.step_of(job.final.name)), app=self.app,
                              n_ranks=self.comm.size, layout=self.storage,
                              created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              hpcgpu_version=str(self.provenance.get("hpcgpu_version", "")),
                              git_commit=str(self.provenance.get("git_commit", "")), index=job.index,
                              run_id=job.run_id, config_fingerprint=self.config_fingerprint,
                              config_options=self.config)

    def _commit_blocking(self, job: WriteJob) -> CheckpointInfo:
        self.last_write_seconds = job.seconds
        self.last_write_cpu_seconds = job.cpu_seconds
        failures = self.comm.mpi.allgather((job.error, job.storage_failure))
        failed = [f"rank {r}: {e}" for r, (e, _) in enumerate(failures) if e]
        if failed:
            self._discard(job.temporary)
            error_type = storage_error if any(storage for _, storage in failures) else agreed_error
            raise error_type(f"checkpoint {job.final.name} in {self.directory} failed; the previous checkpoint "
                             "is intact. " + "; ".join(failed))
        problem = None
        if self.comm.rank == 0:
            try:
                self._publish(job)
            except OSError as exc:
                problem = f"cannot publish {job.temporary} as {job.final}: {exc}"
        problem = self.comm.broadcast(problem, root=0)
        if problem:
            raise agreed_error(problem)
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
            if not job.request.test():
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
            job.request.wait()
            job.verdict_known.set()
        if job.succeeded:
            job.done.wait()
        return self._finish_background(job, replicated=True)

    def _start_agreement(self, job: WriteJob) -> None:
        if job.request is None:
            job.verdict = np.array([0 if job.error else 1], dtype=np.int64)
            movers = collectives(self._commit_comm, on_device=False)
            job.request = movers.allreduce_start(job.verdict.copy(), job.verdict, op="min")

    def _finish_background(self, job: WriteJob, replicated: bool) -> CheckpointInfo:
        self._pending = None
        self.last_write_seconds = job.seconds
        self.last_write_cpu_seconds = job.cpu_seconds
        error_type = agreed_error if replicated else CheckpointError
        if not job.succeeded:
            self._discard(job.temporary)
            where = job.error or "the background write failed on another rank"
            text = (f"asynchronous checkpoint {job.final.name} in {self.directory} failed ({where}); the "
                    "previous checkpoint is intact")
            if job.storage_failure:
                error = CheckpointStorageError(text)
                error.replicated = replicated
                raise error
            raise error_type(text)
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
            self._commit_comm.free()
            self._commit_comm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()

    # ------------------------------------------------------------------ housekeeping
    def checkpoints(self) -> list[Path]:
        """Complete checkpoint directories (names only; not validated), oldest first. Not collective."""
        return self.catalogue.checkpoints()

    def owners(self) -> list[identity.CheckpointOwner]:
        """Collective: who wrote each complete checkpoint, oldest step first, the same list on every rank."""
        return self.catalogue.owners()

    def foreign_checkpoints(self) -> list[identity.CheckpointOwner]:
        """Collective: the checkpoints in the directory that this run did not write (another run id,
        legacy or unreadable ones)."""
        return [owner for owner in self.owners() if owner.problem is not None or owner.run_id != self.run_id]

    # ------------------------------------------------------------------ finding
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
        return self.catalogue.first_valid(which, lambda info: info)

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
        restored = self.catalogue.first_valid(
            which, lambda info: restore_state(self.comm, info, fields or {}, particles, particle_select_fn))
        # A restarted run continues the run of its checkpoint (a legacy one keeps this run's new id).
        if restored.info.run_id is not None:
            self.run_id = restored.info.run_id
        self.restart_note = self.catalogue.describe_choice(restored.info, which, self.run_id)
        return restored



def storage_error(message: str) -> CheckpointStorageError:
    """A :class:`CheckpointStorageError` (exit 74) that every rank raises with the same text (after an agreement)."""
    error = CheckpointStorageError(message)
    error.replicated = True
    return error
