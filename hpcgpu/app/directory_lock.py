"""One writer per run directory: a job holds its output and checkpoint directories while it runs.

Two jobs writing one directory destroy each other's files (a Slurm job requeued while its first
instance still runs, a double submission). So the first job to start locks ``--output`` and the
checkpoint directory; a second job that asks for either is refused before it writes anything (one
line naming the holder, exit code 2), or, with ``--wait-for-lock[=SECONDS]``, waits until the holder
is gone. :func:`hold_run_directories` does this for every app (called by
:func:`hpcgpu.app.environment.prepare_output`); :func:`release_run_directories` ends it (called by
:func:`hpcgpu.app.main.run_app` on every way out, and at interpreter exit).

The lock is a file, ``DIR/.hpcgpu.lock``, holding its holder as JSON (host, process id and start
time, batch job id, since when). Why and how, in short (``docs/reliability.md`` argues it):

- **Taking it** -- the holder is written whole to a file of a unique name, then hard-linked to the lock
  name. ``link()`` fails when the name exists, atomically, on local file systems, on NFS (every
  version: the classic NFS-safe lock) and on Lustre; the link count of the unique file (2) decides,
  so a retransmitted NFS request that reports a spurious failure still counts. ``flock``/``fcntl``
  locks are not used: some mounts lack them or keep them per node.
- **Proving a holder dead** -- on the holder's own machine (same host name, boot id and PID
  namespace): no process with its pid and start time is left (kill -9, a crash). Elsewhere: its
  heartbeat stopped: rank 0 of the holder refreshes the lock file's modification time every
  :data:`HEARTBEAT_SECONDS`, and the lock is stale once that time is older than the holder's
  ``stale_seconds`` (:data:`STALE_SECONDS`), measured on the file system's clock (the modification time
  of a probe file created just then), so clock differences between nodes do not count.
- **Breaking a stale lock** -- one job at a time: the breaker first takes a second lock file,
  ``DIR/.hpcgpu.lock.break``, the same way (written whole, hard-linked), then reads the lock again and
  deletes it only if it still holds the content that was judged stale, and drops the break lock. So of
  several jobs that find the same dead holder, exactly one removes its lock and one (not necessarily the
  same) takes the directory; a lock taken in between is never touched. (Renaming the lock aside and
  putting back a live one, as an earlier design did, leaves a moment without a lock in which a third job
  can take the directory: two holders.) A break lock is held for milliseconds; one left by a breaker
  that died is stale as soon as its process is gone on its machine, or :data:`BREAK_STALE_SECONDS` old
  elsewhere. A lock whose content is not this job's is never deleted, on release either.
"""

from __future__ import annotations

import atexit
import datetime
import errno
import json
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcgpu.errors import DirectoryLockedError

#: The lock file's name inside a locked directory.
LOCK_NAME = ".hpcgpu.lock"
#: Seconds between two refreshes of the lock file's modification time by its holder.
HEARTBEAT_SECONDS = 30.0
#: A holder on another machine is dead once its heartbeat is older than this (seconds): ten missed
#: heartbeats, room for a rank 0 that holds Python's GIL for minutes (a long compilation, a large write).
STALE_SECONDS = 600.0
#: A break lock (held for milliseconds while a stale lock is removed) is stale after this many seconds.
BREAK_STALE_SECONDS = 60.0
#: Seconds to wait before looking again when another job is breaking the same stale lock.
BREAK_WAIT_SECONDS = 0.05
#: Seconds between two looks at a held lock while waiting for it (``--wait-for-lock``).
POLL_SECONDS = 1.0
#: Environment variables that name the batch job a process belongs to, with the scheduler's name.
JOB_VARIABLES = (("SLURM_JOB_ID", "Slurm job"), ("PBS_JOBID", "PBS job"), ("LSB_JOBID", "LSF job"),
                 ("FLUX_JOB_ID", "Flux job"))
#: errno values of a file system without hard links: the lock is then created with O_CREAT | O_EXCL.
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK}


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/PID/stat``); None: no such process
    (or a zombie) or no ``/proc``."""
    text = _read_text(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text.rsplit(")", 1)[1].split()   # after the command name, which may hold spaces
    return None if fields[0] == "Z" else fields[19]


def machine_identity() -> tuple[str, str | None, str | None]:
    """``(host name, boot id, PID namespace)`` of this process: equal for two processes exactly when
    the pid of one names a process the other can see."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = None
    return socket.gethostname(), _read_text("/proc/sys/kernel/random/boot_id"), namespace


def batch_job() -> str | None:
    """The batch job this process belongs to (``"Slurm job 4242"``, with ``(requeued 2x)`` after a
    Slurm requeue); None outside one."""
    job = next((f"{name} {os.environ[variable]}" for variable, name in JOB_VARIABLES
                if os.environ.get(variable)), None)
    if job and os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0"):
        job += f" (requeued {os.environ['SLURM_RESTART_COUNT']}x)"
    return job


def program_name() -> str:
    """The running program as a user starts it: ``apps.stencil`` or ``gray_scott.py``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return spec.name.removesuffix(".__main__")
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: what the lock file says, and what makes a dead holder provable.

    ``heartbeat_seconds`` and ``stale_seconds`` are the holder's own promise: it refreshes the lock
    file's modification time every ``heartbeat_seconds``, and may be taken for dead once that time is
    ``stale_seconds`` old.
    """

    host: str
    pid: int
    process_start: str | None
    boot_id: str | None
    pid_namespace: str | None
    job: str | None          # "Slurm job 4242" (None outside a batch job)
    program: str
    since: str               # ISO 8601, UTC
    token: str               # unique to this lock
    heartbeat_seconds: float
    stale_seconds: float

    @classmethod
    def this_process(cls, heartbeat_seconds: float = HEARTBEAT_SECONDS,
                     stale_seconds: float = STALE_SECONDS) -> "Holder":
        host, boot_id, namespace = machine_identity()
        since = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
        return cls(host=host, pid=os.getpid(), process_start=process_start(os.getpid()), boot_id=boot_id,
                   pid_namespace=namespace, job=batch_job(), program=program_name(), since=since,
                   token=uuid.uuid4().hex, heartbeat_seconds=float(heartbeat_seconds),
                   stale_seconds=float(stale_seconds))

    @classmethod
    def from_bytes(cls, content: bytes) -> "Holder | None":
        """The holder a lock file's ``content`` names; None when it is not a complete lock file."""
        try:
            record = json.loads(content.decode("utf-8"))
            return cls(**{name: record[name] for name in cls.__dataclass_fields__})
        except (ValueError, TypeError, KeyError, UnicodeDecodeError):
            return None

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1) + "\n").encode("utf-8")

    def describe(self) -> str:
        """``apps.stencil on host n01, pid 4242, Slurm job 77, since 2026-12-07 03:10:05 UTC``."""
        job = f", {self.job}" if self.job else ""
        return f"{self.program} on host {self.host}, pid {self.pid}{job}, since {self.since.replace('T', ' ')[:19]} UTC"

    def same_machine(self) -> bool:
        """True when this process can see the holder's process table (host, boot id, PID namespace)."""
        host, boot_id, namespace = machine_identity()
        return (self.host, self.boot_id, self.pid_namespace) == (host, boot_id, namespace) and boot_id is not None


def file_system_now(directory: Path) -> float:
    """The file system's current time at ``directory`` (s since the epoch): the modification time of
    a probe file created there now (an NFS server stamps it with its own clock). ``time.time()`` when
    no file can be created."""
    try:
        descriptor, probe = tempfile.mkstemp(prefix=f"{LOCK_NAME}.clock-", dir=directory)
    except OSError:
        return time.time()
    try:
        return os.fstat(descriptor).st_mtime
    finally:
        os.close(descriptor)
        try:
            os.unlink(probe)
        except OSError:
            pass


@dataclass(frozen=True)
class LockState:
    """What a look at a lock file found: ``content`` (None: no lock), its ``holder`` (None: not a
    complete lock file), whether that holder is ``alive``, and ``why`` it counts as dead."""

    content: bytes | None
    holder: Holder | None
    alive: bool
    why: str = ""


def inspect(path: Path) -> LockState:
    """Look at the lock file ``path``: is it there, whose is it, is its holder alive?

    A holder on this machine is alive while its process (pid and start time) exists; elsewhere while
    its heartbeat is younger than its ``stale_seconds``. A file that is not a complete lock (being
    written without hard links, or damaged) counts as alive until it is :data:`STALE_SECONDS` old.
    """
    try:
        with open(path, "rb") as handle:
            content = handle.read()
            modified = os.fstat(handle.fileno()).st_mtime
    except FileNotFoundError:
        return LockState(None, None, False)
    holder = Holder.from_bytes(content)
    if holder is not None and holder.same_machine():
        start = process_start(holder.pid)
        if start is None:
            return LockState(content, holder, False, f"process {holder.pid} no longer exists on {holder.host}")
        if holder.process_start is not None and start != holder.process_start:
            return LockState(content, holder, False, f"process {holder.pid} on {holder.host} is another "
                                                     "process now (it started later)")
        return LockState(content, holder, True)
    stale_seconds = holder.stale_seconds if holder is not None else STALE_SECONDS
    age = file_system_now(path.parent) - modified
    if age > stale_seconds:
        return LockState(content, holder, False, f"its heartbeat stopped {age:.0f} s ago (stale after "
                                                 f"{stale_seconds:.0f} s)")
    return LockState(content, holder, True)


def _remove_if_unchanged(path: Path, expected: bytes) -> bool:
    """Delete ``path`` if it holds ``expected``; True if it did. Only safe where nobody else may delete or
    replace ``path`` between the read and the unlink: the holder for its own lock, a breaker holding the
    break lock for a stale lock, or a stale break lock (whose content is unique to its dead breaker)."""
    try:
        with open(path, "rb") as handle:
            if handle.read() != expected:
                return False
        path.unlink()
        return True
    except FileNotFoundError:
        return False


class DirectoryLock:
    """The lock of one directory, taken and released by one process (rank 0 of a job).

    Parameters
    ----------
    directory : str or Path
        The directory to lock; created (with its parents) when it does not exist. Directories created
        here are removed again on :meth:`release` when they are empty by then, so a job that was
        refused, or wrote nothing, leaves no trace.
    heartbeat_seconds, stale_seconds : float
        The holder's promise (see :class:`Holder`): :data:`HEARTBEAT_SECONDS`, :data:`STALE_SECONDS`.
    """

    def __init__(self, directory, heartbeat_seconds: float = HEARTBEAT_SECONDS,
                 stale_seconds: float = STALE_SECONDS):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self.heartbeat_seconds = heartbeat_seconds
        self.stale_seconds = stale_seconds
        self.holder: Holder | None = None     # this process's holder record while the lock is held
        self.lost: str | None = None          # set by the heartbeat when the lock was taken from us
        self.notes: list[str] = []            # stale locks broken on the way (for the user)
        self._content: bytes | None = None
        self._created: list[Path] = []        # directories made here, deepest first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self._content is not None

    # ------------------------------------------------------------------ taking it
    def try_acquire(self) -> LockState | None:
        """Take the lock if it is free or its holder is dead; None on success, else the live holder's state.

        Raises OSError when the directory or the lock file cannot be created.
        """
        if self.held:
            return None
        self._make_directory()
        state = None
        for _ in range(16):   # free -> taken by another in between -> dead -> ...: look again, a few times
            holder = Holder.this_process(self.heartbeat_seconds, self.stale_seconds)
            try:
                created = self._create(holder)
            except FileNotFoundError:   # a refused job removed the directory it had made, just now
                self.directory.mkdir(parents=True, exist_ok=True)
                continue
            if created:
                self.holder, self._content = holder, holder.to_bytes()
                self._start_heartbeat()
                return None
            state = inspect(self.path)
            if state.content is None:
                continue           # released since the link failed
            if state.alive:
                return state
            self._break(state)
        return state

    def _make_directory(self) -> None:
        missing = []
        directory = self.directory
        while not directory.exists() and directory.parent != directory:
            missing.append(directory)
            directory = directory.parent
        self.directory.mkdir(parents=True, exist_ok=True)
        self._created = missing   # deepest first

    def _create(self, holder: Holder, path: Path | None = None) -> bool:
        """Create the lock file ``path`` (default: this directory's lock) holding ``holder``; False when it
        exists already."""
        path = self.path if path is None else path
        content = holder.to_bytes()
        unique = self.directory / f"{LOCK_NAME}.{holder.token}"
        with open(unique, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            try:
                os.link(unique, path)
            except FileExistsError:
                pass
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                return self._create_exclusive(path, content)
            # The link count decides, not link()'s answer: over NFS a retransmitted LINK can report
            # EEXIST for the link it made itself.
            return os.stat(unique).st_nlink == 2
        finally:
            unique.unlink(missing_ok=True)

    @staticmethod
    def _create_exclusive(path: Path, content: bytes) -> bool:
        """For file systems without hard links: ``O_CREAT | O_EXCL`` (atomic on local disks, NFSv3+, Lustre).
        A reader may see the file before it is complete; :func:`inspect` treats it as held."""
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def _break(self, state: LockState) -> None:
        """Remove the stale lock ``state`` saw, if it is still that lock, holding the break lock meanwhile
        (see the module docstring); returns None. When another job holds the break lock, only waits a
        moment (or clears a break lock whose breaker died), and the caller looks again."""
        breaker = Holder.this_process(self.heartbeat_seconds, BREAK_STALE_SECONDS)
        break_path = self.directory / f"{LOCK_NAME}.break"
        if not self._create(breaker, break_path):
            other = inspect(break_path)
            if other.content is not None and not other.alive:
                _remove_if_unchanged(break_path, other.content)
            else:
                time.sleep(BREAK_WAIT_SECONDS)
            return
        try:
            if _remove_if_unchanged(self.path, state.content):
                whose = state.holder.describe() if state.holder is not None else "an unreadable lock"
                self.notes.append(f"removed the stale lock {self.path} ({whose}): {state.why}")
        finally:
            _remove_if_unchanged(break_path, breaker.to_bytes())

    # ------------------------------------------------------------------ holding it
    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"hpcgpu-lock-heartbeat {self.directory}",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                with open(self.path, "rb") as handle:
                    found = handle.read()
            except FileNotFoundError:
                found = None
            except OSError:
                continue   # a passing NFS hiccup: try again at the next beat
            if found != self._content:
                self.lost = (f"the lock {self.path} was removed or taken by another job while this job held it "
                             "(a heartbeat missed for longer than its stale time, or the file was deleted by hand); "
                             "another job may now write to this directory")
                print(f"warning: {self.lost}", file=sys.stderr, flush=True)
                return
            try:
                os.utime(self.path)
            except OSError:
                pass

    # ------------------------------------------------------------------ giving it back
    def release(self) -> None:
        """Stop the heartbeat, delete the lock file if it is still this job's, and remove the directories
        made by :meth:`try_acquire` that are empty. Idempotent; never raises for a file-system error."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._content is not None:
            try:
                _remove_if_unchanged(self.path, self._content)
            except OSError:
                pass
            self._content = None
        for directory in self._created:
            try:
                directory.rmdir()   # only when empty
            except OSError:
                break
        self._created = []


# ---------------------------------------------------------------------------------- a job's locks
_HELD: dict[str, DirectoryLock] = {}   # this process's locks, by real path
_EXIT_HOOK = []


def refusal(flag: str, directory: Path, state: LockState, waited: float | None) -> str:
    """The one line that refuses a job: who holds ``directory`` and what to do (``waited``: seconds
    waited with ``--wait-for-lock``, None: refused at once)."""
    lock = Path(directory) / LOCK_NAME
    if state.holder is None:
        who = f"another job (its lock file {lock} is incomplete or unreadable)"
    else:
        who = state.holder.describe()
        this_job = batch_job()
        if this_job and state.holder.job and state.holder.job.split(" (")[0] == this_job.split(" (")[0]:
            who += " (an earlier instance of this same batch job)"
    if waited is None:
        found, fix = "is in use by another job", "add --wait-for-lock to wait until that job ends"
    else:
        found, fix = f"is still in use after waiting {waited:.0f} s (--wait-for-lock)", "wait longer"
    return (f"{flag} {directory} {found}: {who}; two jobs writing one directory destroy each other's files. "
            f"To run this job there, {fix}, or choose another {flag}; if that job is certainly gone, delete {lock}")


def _acquire_all(directories: dict, wait_seconds: float | None) -> tuple[str | None, list[str]]:
    """Rank 0: lock every directory of ``directories`` ({flag: path}) or none; the refusal (None: all
    held) and the notes to print."""
    wanted, seen = [], set()
    for flag, directory in directories.items():
        key = os.path.realpath(directory)
        if key not in seen:
            seen.add(key)
            wanted.append((flag, Path(directory), key))
    started = time.monotonic()
    announced = False
    notes = []
    while True:
        taken, blocked = [], None
        for flag, directory, key in wanted:
            if key in _HELD:
                continue
            lock = DirectoryLock(directory)
            state = lock.try_acquire()
            notes += lock.notes
            if state is not None:
                blocked = (flag, directory, state)
                lock.release()   # removes the directories it made
                break
            taken.append((key, lock))
        if blocked is None:
            for key, lock in taken:
                _HELD[key] = lock
            if taken and not _EXIT_HOOK:
                _EXIT_HOOK.append(atexit.register(release_run_directories))
            return None, notes
        for _, lock in reversed(taken):   # all or none: never sit on one directory while waiting for another
            lock.release()
        waited = time.monotonic() - started
        if wait_seconds is None:
            return refusal(*blocked, None), notes
        if waited >= wait_seconds:
            return refusal(*blocked, waited), notes
        if not announced:
            flag, directory, state = blocked
            who = state.holder.describe() if state.holder is not None else "another job"
            limit = "" if wait_seconds == float("inf") else f" (at most {wait_seconds:g} s)"
            print(f"waiting for {flag} {directory}, in use by {who}, to be released{limit} (--wait-for-lock)",
                  flush=True)
            announced = True
        time.sleep(min(POLL_SECONDS, max(0.0, wait_seconds - waited)))


def hold_run_directories(comm, directories: dict, wait_seconds: float | None = None) -> None:
    """Collective: lock ``directories`` (``{"--output": path, "--checkpoint-dir": path}``) for this job.

    Rank 0 takes every lock (or none) on behalf of all ranks and broadcasts the verdict, so every rank
    raises the same error before any other collective. The locks are held until
    :func:`release_run_directories`. Directories this process already holds are kept as they are.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    directories : dict of str -> path
        The flag that named each directory (for the message) and the directory; created if missing.
    wait_seconds : float or None
        None: refuse at once when another job holds one of them; a number (``inf``: no limit): wait
        that long for it to be released (or proven dead), polling every :data:`POLL_SECONDS`. Rank 0
        says once that it waits, and names any stale lock it removes, even under ``--quiet``: they
        explain a job that sits idle or takes over a directory.

    Raises
    ------
    DirectoryLockedError
        On every rank, when another live job holds one of the directories (exit code 2), or a lock
        cannot be created there.
    """
    problem, notes = None, []
    if comm.rank == 0:
        try:
            problem, notes = _acquire_all(directories, wait_seconds)
        except OSError as exc:
            problem = (f"cannot create the lock file of {', '.join(map(str, directories.values()))}: {exc}; "
                       "each of these directories must be writable by this job")
        for note in notes:
            print(f"note: {note}", flush=True)
    # The other ranks wait for rank 0 without spinning a CPU (a long --wait-for-lock): a non-blocking
    # barrier tested every 50 ms, then the verdict.
    request = comm.mpi.Ibarrier()
    while not request.Test():
        time.sleep(0.05)
    problem = comm.broadcast(problem)
    if problem is not None:
        raise DirectoryLockedError(problem)


def release_run_directories() -> None:
    """Release every lock this process holds (newest first); a no-op elsewhere. Idempotent."""
    while _HELD:
        _, lock = _HELD.popitem()
        lock.release()


def held_directories() -> list[Path]:
    """The directories this process holds locks on."""
    return [lock.directory for lock in _HELD.values()]


__all__ = ["DirectoryLock", "HEARTBEAT_SECONDS", "Holder", "LOCK_NAME", "LockState", "POLL_SECONDS",
           "STALE_SECONDS", "batch_job", "file_system_now", "held_directories", "hold_run_directories", "inspect",
           "release_run_directories"]
