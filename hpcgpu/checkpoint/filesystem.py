"""Durable file operations: fsync of files and directories, write-behind, atomic rename, removal,
fault injection.

A rename is atomic on POSIX file systems (local, NFS, Lustre, GPFS): a reader sees the old name or
the new one, never half a directory. It is *durable* only once the parent directory is fsync'd,
which is why :func:`rename_durably` does both.

*Write-behind* (:class:`WriteBehind`). A plain ``write`` only copies into the page cache; the disk
works during the final ``fsync``, after all the bytes are in memory. Writing a checkpoint that way
serialises the two, and it needs fresh page-cache pages for every byte of the file: on a virtual
machine whose free memory the host reclaims (free page reporting, ballooning) every fresh page is a
hypervisor fault, and a 512 MiB buffered write measured 0.36 GB/s instead of 2.2 GB/s. So each
written range is handed to the disk at once (``sync_file_range``), and once it is on the disk its
pages are dropped (``posix_fadvise(DONTNEED)``): the disk works while the next bytes are packed and
checksummed, the final ``fsync`` finds little left to do, and the file never holds more than
:data:`WRITE_BEHIND_BYTES` of the page cache, whose pages are reused while still warm. Durability
still comes from the final ``fsync`` alone.

*Replacing* a checkpoint of the same step (a run restarted from an older checkpoint saves that
step again) never removes first: the new directory and the old one swap names atomically
(``renameat2(RENAME_EXCHANGE)``, Linux >= 3.15 on local file systems), and only then is the old one,
now under the ``*.tmp`` name, removed. Where the exchange is not supported, the old directory is
renamed to ``ckpt_N.replaced`` and the new one to ``ckpt_N``; a crash between the two renames
leaves ``ckpt_N.replaced``, which :func:`recover_replaced` renames back (the next save or restart
does it), so a valid ``ckpt_N`` is never lost.

*Pruning* old checkpoints (:func:`publish_checkpoint`) considers only the checkpoints of the run
that saves (same run id, :mod:`hpcgpu.checkpoint.identity`); it unlinks gigabytes, which costs ~0.1 s per
512 MiB file on ext4; with ``defer_removal`` the old directories are renamed to ``*.removing.tmp``
at once (invisible to readers from then on) and their files deleted by a background thread, so a
synchronous save returns without waiting for the unlinks.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import shutil
import threading
from pathlib import Path

from hpcgpu.checkpoint import identity, layout
from hpcgpu.output.atomic import fsync_path

#: Environment variable for test-only fault injection: ``POINT`` or ``POINT:RANK`` (see :func:`fault_point`).
FAULT_VARIABLE = "HPCGPU_CHECKPOINT_FAULT"
#: Exit code of a process killed by an injected fault.
FAULT_EXIT_CODE = 86


def rename_durably(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target`` (a directory that must not exist yet) and fsync the parent."""
    os.rename(source, target)
    fsync_path(target.parent)


#: Suffix of a checkpoint moved aside while it is replaced without an atomic exchange.
REPLACED_SUFFIX = ".replaced"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2_function = None


def _renameat2():
    """libc's ``renameat2`` (glibc >= 2.28), or False where there is none."""
    global _renameat2_function
    if _renameat2_function is None:
        function = False
        try:
            function = ctypes.CDLL(None, use_errno=True).renameat2
            function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            function.restype = ctypes.c_int
        except (AttributeError, OSError):
            function = False
        _renameat2_function = function
    return _renameat2_function


def exchange_names(first: Path, second: Path) -> bool:
    """Atomically swap the names of two existing paths; False where the system cannot do it."""
    function = _renameat2()
    if not function:
        return False
    if function(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED or code == errno.EXDEV:
        return False
    raise OSError(code, os.strerror(code), str(second))


def replace_directory(source: Path, target: Path) -> None:
    """Put directory ``source`` at ``target`` durably; an existing ``target`` is replaced atomically.

    Never removes ``target`` before ``source`` has taken its place: at every moment ``target`` is
    the old directory or the new one (or, without an atomic exchange, the old one is at
    ``target.replaced`` for the instant between two renames; see :func:`recover_replaced`).
    """
    source, target = Path(source), Path(target)
    if not target.exists():
        rename_durably(source, target)
        return
    if exchange_names(source, target):
        fsync_path(target.parent)
        remove_tree(source)  # the old checkpoint, now under the temporary name
        return
    aside = target.with_name(target.name + REPLACED_SUFFIX)
    if aside.exists():
        shutil.rmtree(aside, ignore_errors=True)
    os.rename(target, aside)
    fault_point("mid-replace", 0)
    try:
        rename_durably(source, target)
    except OSError:
        os.rename(aside, target)  # put the old checkpoint back
        raise
    remove_tree(aside)


def recover_replaced(directory: Path) -> None:
    """Undo a replacement interrupted between its two renames: ``ckpt_N.replaced`` without ``ckpt_N``
    is renamed back; one whose replacement completed is removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    for aside in directory.glob(f"ckpt_*{REPLACED_SUFFIX}"):
        target = aside.with_name(aside.name[:-len(REPLACED_SUFFIX)])
        if target.exists():
            remove_tree(aside)
        else:
            rename_durably(aside, target)


def _doom(path: Path) -> Path:
    """Rename ``path`` to ``*.removing.tmp`` (unless it ends with ``.tmp`` already); return the new name."""
    if path.name.endswith(".tmp"):
        return path
    doomed = path.with_name(path.name + ".removing.tmp")
    if doomed.exists():
        shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    return doomed


def remove_tree(path: Path) -> None:
    """Remove a directory tree; first rename it to ``*.tmp`` so a half-removed tree never looks valid."""
    if not path.exists():
        return
    shutil.rmtree(_doom(path), ignore_errors=True)


#: Trees being deleted by background threads: path -> thread (see :func:`remove_tree_later`).
_removals: dict = {}
_removals_lock = threading.Lock()


def remove_tree_later(path: Path) -> None:
    """Like :func:`remove_tree`, but the files are deleted by a background thread.

    The rename to ``*.removing.tmp`` happens now, so the tree stops looking like a checkpoint at
    once. The thread is not a daemon: the interpreter waits for it at exit (a process killed before
    it ends leaves ``*.tmp`` debris, which the next :func:`publish_checkpoint` removes).
    """
    if not path.exists():
        return
    doomed = _doom(path)
    thread = threading.Thread(target=shutil.rmtree, args=(doomed,), kwargs={"ignore_errors": True},
                              name="checkpoint-prune")
    with _removals_lock:
        for finished in [p for p, t in _removals.items() if not t.is_alive()]:
            del _removals[finished]
        _removals[doomed] = thread
    thread.start()


def wait_for_removals() -> None:
    """Block until every tree handed to :func:`remove_tree_later` in this process is deleted."""
    with _removals_lock:
        threads = list(_removals.values())
        _removals.clear()
    for thread in threads:
        thread.join()


def _being_removed(path: Path) -> bool:
    """True if ``path`` was handed to a removal thread not yet reaped, alive or just finished.

    Asking whether the thread is still alive would race with it: a thread that ends between the
    caller's directory listing and this check would leave the caller removing the same tree.
    """
    with _removals_lock:
        return path in _removals


def fault_point(name: str, rank: int) -> None:
    """Test hook: end this process abruptly at the named point if ``$HPCGPU_CHECKPOINT_FAULT`` asks.

    ``HPCGPU_CHECKPOINT_FAULT=mid-rank-file:1`` kills rank 1 after it wrote part of its rank file;
    without ``:RANK`` every rank dies there. ``os._exit`` skips all cleanup, like a node failure or
    ``kill -9``. Points: ``mid-rank-file``, ``after-rank-file``, ``mid-master``, ``before-rename``.
    """
    if fault_requested(name, rank, os.environ.get(FAULT_VARIABLE)):
        os._exit(FAULT_EXIT_CODE)


def fault_requested(name: str, rank: int, request: str | None) -> bool:
    """True if ``request`` (a ``$HPCGPU_CHECKPOINT_FAULT`` value: ``POINT`` or ``POINT:RANK``) names
    this point on this rank. The layout process gets the request from the app with every job."""
    if not request:
        return False
    point, _, which = request.partition(":")
    return point == name and (not which or int(which) == rank)


def publish_checkpoint(temporary: Path, final: Path, keep: int, run_id: str | None,
                       defer_removal: bool = False) -> None:
    """Rank 0's commit: rename ``temporary`` to ``final`` durably, keep the newest ``keep`` checkpoints
    of run ``run_id`` and remove ``*.tmp`` debris of crashed saves.

    File-system work and the master files' identity attributes (no MPI), so the layout process can
    do it for asynchronous saves. Checkpoints of other runs (another run id, legacy or unreadable
    ones) are never pruned, and an existing ``final`` is replaced only if this run wrote it
    (:func:`replace_directory`: atomically, never removed first).
    With ``defer_removal`` the checkpoints beyond ``keep`` are renamed now and deleted by a
    background thread (:func:`remove_tree_later`); the new checkpoint is durable either way.

    Raises
    ------
    FileExistsError
        ``final`` holds a checkpoint of another run (the new one stays at ``temporary``).
    """
    temporary, final = Path(temporary), Path(final)
    directory = final.parent
    recover_replaced(directory)
    if final.exists():  # the same step saved again (a restart from an older checkpoint)
        owner = identity.read_owner(final)
        if owner.problem is not None or owner.run_id != run_id:
            raise FileExistsError(identity.refuse_overwrite_message(final, owner, str(run_id)))
    replace_directory(temporary, final)
    found = [(layout.step_of(p.name), p) for p in directory.iterdir() if p.is_dir()]
    complete = [p for step, p in sorted((s, p) for s, p in found if s is not None)]
    own = [p for p in complete if p == final or identity.owned_by(p, run_id)]
    for path in own[:-keep]:
        if path == final:  # a restart from an older checkpoint: never prune what was just written
            continue
        (remove_tree_later if defer_removal else remove_tree)(path)
    for path in directory.glob(f"ckpt_*{layout.TEMPORARY_SUFFIX}"):
        if not _being_removed(path):
            remove_tree(path)  # debris of crashed saves (nothing else is in flight now)


# ---------------------------------------------------------------------- write-behind
#: Bytes of one file that may be written but not yet on the disk (and held in the page cache).
WRITE_BEHIND_BYTES = 32 * 2**20
_SYNC_FILE_RANGE_WAIT_BEFORE, _SYNC_FILE_RANGE_WRITE, _SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4
#: errno values meaning "this file system or kernel cannot do it": write-behind is skipped.
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ESPIPE, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}
_sync_file_range_function = None


def _sync_file_range():
    """libc's ``sync_file_range`` (Linux), or False where there is none. ctypes releases the GIL."""
    global _sync_file_range_function
    if _sync_file_range_function is None:
        function = False
        try:
            function = ctypes.CDLL(None, use_errno=True).sync_file_range
            function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            function.restype = ctypes.c_int
        except (AttributeError, OSError):
            function = False
        _sync_file_range_function = function
    return _sync_file_range_function


class WriteBehind:
    """Send the written ranges of one open file to the disk early and drop their pages once written.

    Call :meth:`written` after each write (from the thread that writes; it may block until older
    ranges are on the disk), :meth:`finish` before the final ``fsync``, and :meth:`drop_cache`
    after it. Ranges are handed to the disk in batches of a quarter window; a file smaller than
    that costs no extra system call at all (each one is a GIL hand-over for a writer thread
    running beside a Python-bound stepping thread). Where ``sync_file_range`` does not exist or
    the file system refuses it, every method does nothing and the final ``fsync`` writes
    everything, as without write-behind.

    Parameters
    ----------
    descriptor : int
        File opened for writing.
    window_bytes : int, optional
        Written bytes allowed to be in flight (default :data:`WRITE_BEHIND_BYTES`; 0: off).
    """

    def __init__(self, descriptor: int, window_bytes: int | None = None):
        self.descriptor = descriptor
        self.window_bytes = WRITE_BEHIND_BYTES if window_bytes is None else window_bytes
        self._function = _sync_file_range() if self.window_bytes > 0 else False
        self._batch_bytes = max(1, self.window_bytes // 4)
        self._unsent = None                    # [start, stop) written but not yet handed to the disk
        self._in_flight = collections.deque()  # (offset, n_bytes) handed to the disk, oldest first
        self._in_flight_bytes = 0
        self._started = False

    @property
    def active(self) -> bool:
        return bool(self._function)

    def _call(self, offset: int, n_bytes: int, flags: int) -> None:
        if self._function and self._function(self.descriptor, offset, n_bytes, flags) != 0:
            code = ctypes.get_errno()
            if code in _UNSUPPORTED:
                self._function = False
                return
            # Never swallowed: once sync_file_range has reported a write error, a later fsync on this
            # descriptor may no longer report it (the kernel advances the file's error cursor).
            raise OSError(code, f"writing the checkpoint file failed: {os.strerror(code)}")

    def written(self, offset: int, n_bytes: int) -> None:
        """``[offset, offset + n_bytes)`` was just written: start the writeback of a full batch; wait
        for and drop the oldest ranges while more than the window is in flight."""
        if not self._function or n_bytes <= 0:
            return
        if self._unsent is not None and self._unsent[1] != offset:
            self._send()  # not contiguous with what came before
        self._unsent = (offset if self._unsent is None else self._unsent[0], offset + n_bytes)
        if self._unsent[1] - self._unsent[0] >= self._batch_bytes:
            self._send()
        while self._in_flight and self._in_flight_bytes > self.window_bytes:
            self._retire()

    def _send(self) -> None:
        start, stop = self._unsent
        self._unsent = None
        self._call(start, stop - start, _SYNC_FILE_RANGE_WRITE)
        self._in_flight.append((start, stop - start))
        self._in_flight_bytes += stop - start
        self._started = True

    def _retire(self) -> None:
        offset, n_bytes = self._in_flight.popleft()
        self._in_flight_bytes -= n_bytes
        self._call(offset, n_bytes, _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE
                   | _SYNC_FILE_RANGE_WAIT_AFTER)
        if self._function:
            _drop_cached(self.descriptor, offset, n_bytes)

    def finish(self) -> None:
        """Wait until the ranges handed to the disk are on it (the rest, less than a batch, is left
        to the final ``fsync``)."""
        while self._in_flight:
            self._retire()

    def drop_cache(self) -> None:
        """After the final ``fsync``: release the file's remaining clean pages (nothing reads them
        soon); only for files that were large enough to be written behind."""
        if self._started:
            _drop_cached(self.descriptor, 0, 0)


def _drop_cached(descriptor: int, offset: int, n_bytes: int) -> None:
    """Ask the kernel to drop clean cached pages of a range (0 bytes: to the end); a hint, errors ignored."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(descriptor, offset, n_bytes, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
