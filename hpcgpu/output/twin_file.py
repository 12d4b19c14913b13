"""Crash-safe appends to files whose format rewrites its own metadata (HDF5, hence H5MD): twin copies.

An HDF5 library updates a file in place (chunk indexes, dataset shapes, the superblock), so a kill in
the middle of an append can leave the whole file unreadable, every earlier frame with it. A
:class:`TwinFile` never writes to the file readers open. It keeps a second, identical copy beside it
(``.NAME.twin``, same directory) and appends a record in this order::

    1. append to the twin and close it, fsync         PATH: records 0..n-1    twin: 0..n
    2. link PATH to .NAME.spare                       (the spare is PATH's inode, records 0..n-1)
    3. rename the twin to PATH (atomic)               PATH: 0..n              spare: 0..n-1
    4. append to the spare, fsync; rename it to the twin name                 twin: 0..n

At every instant ``PATH`` names a complete, closed file: before step 3 the previous one, after it the
new one. A kill can only damage the twin or the spare; :meth:`TwinFile.open` removes them and copies
``PATH`` again. The cost: every record is written twice and the file takes twice its size on disk
(the twin is a hidden file next to it). A reader that keeps the file open across appends keeps the
inode it opened, which step 4 then writes to: reopen the file to see new records.
"""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

from hpcgpu.output.atomic import fsync_path
from hpcgpu.output.errors import failure_errno, is_storage_failure, quiet_hdf5_teardown
from hpcgpu.runtime.fault_injection import maybe_fail


class TwinFile:
    """A file at ``path`` appended to through a twin copy (see the module docstring). Single writer.

    Parameters
    ----------
    path : str or Path
        The file readers open. It must exist: use :meth:`create` or :meth:`open`.
    durable : bool
        fsync the copies before each rename (default True): the file then survives a power loss or a
        node crash too, not only a killed process.
    """

    def __init__(self, path, durable: bool = True):
        self.path = Path(path)
        self.durable = durable
        self.twin = self.path.with_name(f".{self.path.name}.twin")
        self.spare = self.path.with_name(f".{self.path.name}.spare")

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, path, define_fn, durable: bool = True) -> "TwinFile":
        """Create ``path`` with ``define_fn(temporary_path)`` (which writes and closes a new file); never replaces one.

        The file appears complete or not at all: ``define_fn`` writes a temporary file, which is linked
        to ``path`` (``FileExistsError`` if ``path`` exists meanwhile).
        """
        twin_file = cls(path, durable)
        temporary = twin_file.path.with_name(f".{twin_file.path.name}.{os.getpid()}.new")
        try:
            temporary.unlink(missing_ok=True)
            define_fn(temporary)
            if durable:
                fsync_path(temporary)
            os.link(temporary, twin_file.path)
        finally:
            temporary.unlink(missing_ok=True)
        twin_file._make_twin()
        return twin_file

    @classmethod
    def open(cls, path, durable: bool = True) -> "TwinFile":
        """Continue ``path``: leftovers of an interrupted append are removed and the twin copied anew."""
        twin_file = cls(path, durable)
        if not twin_file.path.is_file():
            raise FileNotFoundError(f"{twin_file.path} does not exist")
        twin_file._make_twin()
        return twin_file

    def _make_twin(self) -> None:
        self.spare.unlink(missing_ok=True)
        copy = self.twin.with_name(self.twin.name + ".copy")
        shutil.copyfile(self.path, copy)
        if self.durable:
            fsync_path(copy)
        os.replace(copy, self.twin)

    # ------------------------------------------------------------------ changing the file
    def append(self, write_fn) -> None:
        """Apply ``write_fn(file_path)`` (open, write one record, close) to the file, crash-safely.

        ``write_fn`` is called twice, on the twin and then on the previous file's inode, and must make
        the same change both times.
        """
        self._apply(write_fn)

    def modify(self, change_fn) -> None:
        """Like :meth:`append`, for any change (a restart dropping the records after its step)."""
        self._apply(change_fn)

    def _apply(self, change_fn) -> None:
        maybe_fail("write", 0)   # the writer is rank 0
        self._change(change_fn, self.twin)         # 1. PATH untouched
        if self.durable:
            fsync_path(self.twin)
        self.spare.unlink(missing_ok=True)
        os.link(self.path, self.spare)             # 2. keep PATH's inode reachable
        os.replace(self.twin, self.path)           # 3. readers now see the new record
        if self.durable:
            fsync_path(self.path.parent)
        self._change(change_fn, self.spare)        # 4. the old inode catches up and becomes the twin
        if self.durable:
            fsync_path(self.spare)
        os.replace(self.spare, self.twin)

    @staticmethod
    def _change(change_fn, file_path: Path) -> None:
        """``change_fn(file_path)``; a storage failure (full disk) comes out as one OSError, h5py's echoes dropped."""
        try:
            with quiet_hdf5_teardown():
                try:
                    change_fn(file_path)
                finally:
                    gc.collect()   # the h5py objects of a failed write are freed here, quietly
        except OSError:
            raise
        except Exception as exc:
            if is_storage_failure(exc):
                number = failure_errno(exc)
                raise OSError(number, os.strerror(number), str(file_path)) from None
            raise

    def remove_twin(self) -> None:
        """Delete the twin (the file stays complete; :meth:`open` makes a new twin when writing resumes)."""
        self.twin.unlink(missing_ok=True)
        self.spare.unlink(missing_ok=True)
