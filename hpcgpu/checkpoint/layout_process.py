"""A helper process that does the h5py work of asynchronous saves, off the stepping process's GIL.

h5py holds Python's GIL for every HDF5 call. The bulk bytes of a checkpoint already bypass it
(:mod:`~hpcgpu.checkpoint.bulk`), but laying out a rank file (attributes, contiguous datasets,
their offsets) and writing rank 0's master file (metadata, replicated state, index, Virtual
Datasets) still cost the writer thread ~5-7 ms of GIL per save, and every one of them is a
millisecond in which the stepping thread cannot launch a kernel. So each
:class:`~hpcgpu.checkpoint.CheckpointManager` with ``asynchronous=True`` keeps one small
*layout process*: the writer thread sends it a plain description (path, attributes, dataset names,
shapes, dtypes; for the master the index and the replicated state) and waits on the pipe
(``recv`` releases the GIL); the helper creates the file with the very functions of
:mod:`~hpcgpu.checkpoint.writer` and replies with the dataset offsets; the writer thread then
``pwrite``\\ s the bytes and CRCs as before. Files are byte-for-byte what the in-process path makes.

The helper is started with ``python -c`` over a socket pair (how :mod:`multiprocessing` starts its
own resource tracker), not forked and not through ``multiprocessing``'s spawn start method, which
would re-import the application's ``__main__`` (and with it mpi4py) in the child. It imports only
NumPy, h5py and the checkpoint writer, never MPI; it ignores SIGINT, SIGTERM and SIGUSR1 (they are
meant for the ranks, see :mod:`~hpcgpu.checkpoint.preemption`) and exits when the manager closes it
or when the pipe closes, which happens however the app ends (``kill -9`` and ``os._exit``
included).

Never hang, never lose a save: every wait on the helper has a timeout
(``$HPCGPU_CHECKPOINT_LAYOUT_TIMEOUT``, default 120 s); if the helper cannot start, dies or times
out, it is killed and the layout runs in-process from then on, with one
:class:`LayoutProcessWarning`. An error *inside* the helper (disk full, no permission) is raised in
the writer thread like any writer error. ``HPCGPU_CHECKPOINT_LAYOUT_PROCESS=0`` turns the helper off.
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
import warnings
import weakref
from pathlib import Path

from hpcgpu.checkpoint import filesystem, writer
from hpcgpu.checkpoint.filesystem import FAULT_VARIABLE, fault_point
from hpcgpu.checkpoint.writer import MasterContent
from hpcgpu.errors import CheckpointError

#: ``0`` (or ``false``, ``no``, ``off``) keeps the h5py layout of asynchronous saves in-process.
ENVIRONMENT_VARIABLE = "HPCGPU_CHECKPOINT_LAYOUT_PROCESS"
#: Seconds to wait for one reply of the helper before giving up on it.
TIMEOUT_VARIABLE = "HPCGPU_CHECKPOINT_LAYOUT_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 120.0
#: Seconds for the helper to start (import NumPy and h5py) and say it is ready.
START_TIMEOUT_SECONDS = 120.0
#: The helper's exit wait on close before it is killed.
CLOSE_TIMEOUT_SECONDS = 5.0

_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the ``hpcgpu`` package
_BOOT = ("import sys; sys.path.insert(0, {root!r}); "
         "from hpcgpu.checkpoint.layout_process import serve; serve(int(sys.argv[1]))")


class LayoutProcessWarning(RuntimeWarning):
    """The layout process is unavailable; asynchronous saves lay out their files in-process."""


class _Unavailable(Exception):
    """The helper cannot serve this request (the caller does the work in-process)."""


def enabled() -> bool:
    """Whether asynchronous saves use a layout process (``$HPCGPU_CHECKPOINT_LAYOUT_PROCESS``, default on)."""
    value = os.environ.get(ENVIRONMENT_VARIABLE, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


# ---------------------------------------------------------------------- messages
class _Channel:
    """Length-prefixed pickles over a socket, NumPy arrays out of band (no copy when sending).

    Every system call on the writer thread releases the GIL, and getting it back from a stepping
    thread that never lets go costs up to the switch interval (5 ms), so a small message goes in
    one ``send`` and is read by one ``recv``; the timeout is the socket's own (``SO_RCVTIMEO``),
    not a separate ``select``.
    """

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._pending = bytearray()

    def set_timeout(self, seconds: float | None) -> None:
        whole = int(seconds or 0)
        micro = int(((seconds or 0) - whole) * 1e6)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, micro))

    def send(self, message) -> None:
        buffers = []
        header = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        views = [buffer.raw() for buffer in buffers]
        frame = struct.pack("<QQ", len(header), len(views)) + header
        small = [frame] + [struct.pack("<Q", v.nbytes) + bytes(v) for v in views if v.nbytes <= 65536]
        if len(small) == 1 + len(views):
            self.sock.sendall(b"".join(small))
            return
        self.sock.sendall(frame)
        for view in views:
            self.sock.sendall(struct.pack("<Q", view.nbytes))
            self.sock.sendall(view)

    def receive(self):
        n_header, n_buffers = struct.unpack("<QQ", self._take(16))
        header = self._take(n_header)
        buffers = [self._take(struct.unpack("<Q", self._take(8))[0]) for _ in range(n_buffers)]
        return pickle.loads(header, buffers=buffers)

    def _take(self, n_bytes: int):
        if len(self._pending) >= n_bytes:
            data = bytes(self._pending[:n_bytes])
            del self._pending[:n_bytes]
            return data
        if n_bytes > 2**20:  # a large array: straight into its own buffer
            data = bytearray(n_bytes)
            view = memoryview(data)
            have = len(self._pending)
            view[:have] = self._pending
            self._pending.clear()
            while have < n_bytes:
                received = self.sock.recv_into(view[have:])
                if not received:
                    raise EOFError("the other side closed the pipe")
                have += received
            return data
        while len(self._pending) < n_bytes:
            chunk = self.sock.recv(max(65536, n_bytes - len(self._pending)))
            if not chunk:
                raise EOFError("the other side closed the pipe")
            self._pending += chunk
        return self._take(n_bytes)

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------------- the helper's side
def serve(descriptor: int) -> None:
    """The helper's main loop: answer requests on the socket ``descriptor`` until told to stop.

    A request is ``([(kind, arguments), ...], fault request)``; each part gets one reply, in order,
    as soon as it is done (the rank file's offsets before the master file is written).
    """
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(number, signal.SIG_IGN)
    channel = _Channel(socket.socket(fileno=descriptor))
    import h5py  # noqa: F401 - imported now, so that the first request is fast

    try:
        channel.send(("ready", os.getpid()))
        while True:
            request = channel.receive()
            if request is None:
                return
            parts, fault_request = request
            for kind, arguments in parts:
                channel.send(_handle(channel, kind, arguments, fault_request, writer, filesystem))
    except (EOFError, OSError):
        return  # the app is gone


def _handle(channel, kind, arguments, fault_request, writer, filesystem):
    def fault(name, rank):
        if filesystem.fault_requested(name, rank, fault_request):
            channel.send(("fault", name, rank))  # the app dies at the same point, then so do we
            os._exit(filesystem.FAULT_EXIT_CODE)

    try:
        if kind == "rank-file":
            return "ok", writer.lay_out_rank_file(**arguments)
        if kind == "master-file":
            writer.write_master_file(**arguments, fault=fault)
            return "ok", None
        if kind == "publish":
            filesystem.publish_checkpoint(**arguments)
            return "ok", None
        raise ValueError(f"unknown layout request {kind!r}")
    except writer.LayoutNeedsData:
        return "needs-data", None
    except Exception as exc:  # noqa: BLE001 - sent to the writer thread, which raises it
        return "error", _portable(exc), traceback.format_exc()


def _portable(exc: Exception) -> Exception:
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - an exception type that does not pickle
        return RuntimeError(f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------- the app's side
class LayoutProcess:
    """The app's handle on one layout process; used by one writer thread at a time.

    Every method returns a false value (None/False) when the caller must do the work in-process
    itself: the helper is unavailable (then given up for good, with one warning) or the request
    needs data the helper does not get. Errors raised by the work in the helper are raised here.

    Parameters
    ----------
    timeout : float, optional
        Seconds to wait for one reply (default ``$HPCGPU_CHECKPOINT_LAYOUT_TIMEOUT`` or 120).
    """

    def __init__(self, timeout: float | None = None):
        self.timeout = float(timeout or os.environ.get(TIMEOUT_VARIABLE) or DEFAULT_TIMEOUT_SECONDS)
        self.failure = None          # why the helper was given up (None while it is usable)
        self._process = None
        self._channel = None
        self._ready = False
        self._unread = 0             # replies still owed for the last request
        self._master = None          # a master-file request to send with the next rank-file request
        self._lock = threading.Lock()
        _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        """The helper's process id (None before it started or after it was closed or given up)."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Launch the helper without waiting for it (it imports h5py while the app goes on)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._process is not None or self.failure is not None:
            return
        try:
            ours, theirs = socket.socketpair()
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-c", _BOOT.format(root=str(_ROOT)), str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
            finally:
                theirs.close()
            self._channel = _Channel(ours)
        except Exception as exc:  # noqa: BLE001 - no helper: everything stays in-process
            self._give_up(f"could not be started ({type(exc).__name__}: {exc})")

    # ------------------------------------------------------------------ requests
    def queue_master_file(self, path, snapshot, index: dict, app: str, n_ranks: int, provenance: dict) -> None:
        """Have :func:`~hpcgpu.checkpoint.writer.write_master_file` run in the helper, sent with the
        next :meth:`lay_out_rank_file` (or by :meth:`master_file_written`); no data but the
        replicated state is sent."""
        content = MasterContent(step=int(snapshot.step), metadata=snapshot.metadata, replicated=snapshot.replicated,
                                units=snapshot.units)
        self._master = ("master-file", {"path": str(path), "snapshot": content, "index": index, "app": app,
                                        "n_ranks": n_ranks, "provenance": provenance})

    def lay_out_rank_file(self, path, attributes: dict, specs: list) -> list | None:
        """:func:`~hpcgpu.checkpoint.writer.lay_out_rank_file` in the helper (no array data is sent).

        Returns the placements, or None: lay the file out in-process.
        """
        parts = [("rank-file", {"path": str(path), "attributes": attributes, "specs": specs})]
        if self._master is not None:
            parts.append(self._master)
            self._master = None
        reply = self._request(parts)
        return None if reply is _Unavailable else reply

    def master_file_written(self) -> bool:
        """Wait for the master file queued by :meth:`queue_master_file`; False: write it in-process."""
        if self._master is not None:  # the rank file was laid out in-process: send it alone
            parts, self._master = [self._master], None
            return self._request(parts) is not _Unavailable
        if self._unread == 0:
            return False
        with self._lock:
            reply = self._next_reply("to write the master file")
        return self._outcome(reply) is not _Unavailable

    def publish_checkpoint(self, temporary, final, keep: int, run_id: str | None) -> bool:
        """:func:`~hpcgpu.checkpoint.filesystem.publish_checkpoint` in the helper; False: do it in-process."""
        reply = self._request([("publish", {"temporary": str(temporary), "final": str(final), "keep": keep,
                                            "run_id": run_id})])
        return reply is not _Unavailable

    def _request(self, parts: list):
        with self._lock:
            if self.failure is not None:
                return _Unavailable
            self._start()
            if self.failure is not None:
                return _Unavailable
            try:
                if not self._ready:
                    self._channel.set_timeout(START_TIMEOUT_SECONDS)
                    ready = self._channel.receive()
                    if ready[0] != "ready":
                        raise _Unavailable(f"sent {ready[0]!r} instead of 'ready'")
                    self._ready = True
                    self._channel.set_timeout(self.timeout)
                while self._unread:  # replies of an earlier request that failed half-way
                    self._unread -= 1
                    self._channel.receive()
            except (_Unavailable, OSError, EOFError, pickle.PickleError) as exc:
                self._give_up(f"failed to start ({type(exc).__name__}: {exc})")
                return _Unavailable
            try:
                self._channel.send((parts, os.environ.get(FAULT_VARIABLE)))
            except OSError as exc:
                self._give_up(f"cannot be reached ({type(exc).__name__}: {exc})")
                return _Unavailable
            except Exception:  # noqa: BLE001 - a value that does not pickle: this one is done in-process
                return _Unavailable
            self._unread = len(parts)
            reply = self._next_reply(f"to {parts[0][0]} {parts[0][1].get('path') or parts[0][1].get('final')}")
        return self._outcome(reply)

    def _next_reply(self, what: str):
        try:
            reply = self._channel.receive()
            self._unread -= 1
            return reply
        except (OSError, EOFError, pickle.PickleError) as exc:
            if isinstance(exc, BlockingIOError):
                exc = TimeoutError(f"no answer within {self.timeout:g} s {what} "
                                   f"(set ${TIMEOUT_VARIABLE} to wait longer)")
            self._give_up(f"failed ({type(exc).__name__}: {exc})")
            return None

    def _outcome(self, reply):
        if reply is None or reply[0] == "needs-data":
            return _Unavailable
        if reply[0] == "ok":
            return reply[1]
        if reply[0] == "fault":  # the helper stopped at an injected fault: so does this rank
            fault_point(reply[1], reply[2])
            raise CheckpointError(f"the layout process stopped at injected fault {reply[1]!r}")
        error, helper_traceback = reply[1], reply[2]
        error.add_note(f"(raised in the checkpoint layout process:\n{helper_traceback})")
        raise error

    # ------------------------------------------------------------------ ending
    def _give_up(self, reason: str) -> None:
        """Stop using the helper for good: kill it and warn once (the caller works in-process)."""
        self.failure = reason
        self._master, self._unread = None, 0
        self._stop(graceful=False)
        warnings.warn(f"checkpoint layout process {reason}; asynchronous checkpoints now lay out their HDF5 "
                      f"files in this process (correct, but stepping slows while a write is in flight). Set "
                      f"{ENVIRONMENT_VARIABLE}=0 to not use the helper.", LayoutProcessWarning, stacklevel=3)

    def _stop(self, graceful: bool) -> None:
        process, channel = self._process, self._channel
        self._process, self._channel, self._ready = None, None, False
        if process is not None and graceful and channel is not None:
            try:
                channel.send(None)
                process.wait(timeout=CLOSE_TIMEOUT_SECONDS)
            except Exception:  # noqa: BLE001 - it is killed below
                pass
        if process is not None and process.poll() is None:
            process.kill()
            try:
                process.wait(timeout=CLOSE_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        if channel is not None:
            channel.close()

    def close(self) -> None:
        """Stop the helper (it finishes the request in hand first; killed after 5 s)."""
        if self._lock.acquire(timeout=CLOSE_TIMEOUT_SECONDS):
            try:
                self._stop(graceful=True)
            finally:
                self._lock.release()
        elif self._process is not None:  # a writer thread is stuck in a request: end the helper
            self._process.kill()
        _LIVE.discard(self)


_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for helper in list(_LIVE):
        helper.close()
