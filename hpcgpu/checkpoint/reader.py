"""Reading and validating checkpoints: the master file, rank files, and verified pieces of arrays.

Nothing here unpickles or evaluates anything: attributes and datasets are read with h5py, JSON text
with ``json.loads``, and every dtype is checked to be a plain numeric one. Data goes from the rank
files (not through the Virtual Datasets, which would silently return fill values for a missing rank
file), in whole checksum tiles whose CRC32 is verified before a byte is used.

Every failure raises :class:`~hpcgpu.errors.CheckpointError` naming the file and the problem.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path

import numpy as np

from hpcgpu.checkpoint import identity, layout
from hpcgpu.checkpoint.integrity import find_bad_tiles
from hpcgpu.checkpoint.replicated import ReplicatedValueError, read_replicated
from hpcgpu.errors import CheckpointError


@dataclass
class CheckpointInfo:
    """What a checkpoint holds, read from its master file (the same object on every rank).

    Attributes
    ----------
    path : pathlib.Path
        The checkpoint directory (``.../ckpt_000000120``).
    step, n_ranks : int
        Step of the saved state; number of ranks that wrote it.
    app, created, hpcgpu_version, git_commit, layout : str
    metadata : dict
        The caller's ``metadata`` (JSON).
    index : dict
        Per field: global_shape, dtype, dims, periodic, starts and shapes of the writers' blocks;
        particles: per-rank counts and the arrays' dtypes and trailing shapes.
    run_id, config_fingerprint : str or None
        The run that wrote it and its configuration fingerprint (:mod:`hpcgpu.checkpoint.identity`);
        None for a checkpoint written before run ids existed (a *legacy* checkpoint).
    config_options : dict or None
        The fingerprinted options.
    """

    path: Path
    step: int
    app: str
    n_ranks: int
    layout: str
    created: str
    hpcgpu_version: str
    git_commit: str
    metadata: dict = dataclass_field(default_factory=dict)
    index: dict = dataclass_field(default_factory=dict)
    run_id: str | None = None
    config_fingerprint: str | None = None
    config_options: dict | None = None

    @property
    def legacy(self) -> bool:
        """True for a checkpoint written before run ids existed."""
        return self.run_id is None

    @property
    def master_file(self) -> Path:
        return self.path / layout.MASTER_FILE

    @property
    def fields(self) -> dict:
        """``{name: (global_shape, dtype)}`` of the saved fields."""
        return {n: (tuple(e["global_shape"]), np.dtype(e["dtype"])) for n, e in self.index["fields"].items()}

    @property
    def n_particles(self) -> int:
        return int(sum(self.index["particles"]["counts"]))

    def __str__(self) -> str:
        run = "a legacy run" if self.run_id is None else f"run {self.run_id}"
        return (f"checkpoint {self.path} (app {self.app}, step {self.step}, {run}, written by {self.n_ranks} ranks "
                f"on {self.created})")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _open(path: Path):
    import h5py

    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file is missing; the checkpoint is incomplete") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read as HDF5 (truncated or corrupt file?): {exc}") from None


def _attribute(handle, path: Path, name: str):
    if name not in handle.attrs:
        raise CheckpointError(f"{path}: attribute {name!r} is missing; not an hpcgpu checkpoint or a damaged one")
    return handle.attrs[name]


def read_master(directory, expected_app: str | None = None) -> CheckpointInfo:
    """Open and validate the master file of the checkpoint ``directory`` (structure only, no data).

    Raises
    ------
    CheckpointError
        Missing or unreadable file, wrong format or version, another app's checkpoint, a step that
        does not match the directory name, or an inconsistent index.
    """
    directory = Path(directory)
    path = directory / layout.MASTER_FILE
    with _open(path) as handle:
        try:
            return _read_master(handle, directory, path, expected_app)
        except CheckpointError:
            raise
        except (KeyError, ValueError, TypeError, OSError) as exc:
            raise CheckpointError(f"{path}: unexpected structure ({type(exc).__name__}: {exc})") from None


def _read_master(handle, directory: Path, path: Path, expected_app: str | None) -> CheckpointInfo:
    import h5py

    found_format = _text(_attribute(handle, path, "format"))
    if found_format != layout.FORMAT:
        raise CheckpointError(f"{path}: format is {found_format!r}, expected {layout.FORMAT!r}")
    version = int(_attribute(handle, path, "format_version"))
    if version > layout.FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {version} is newer than this hpcgpu reads "
                              f"({layout.FORMAT_VERSION}); upgrade hpcgpu")
    app = _text(_attribute(handle, path, "app"))
    if expected_app is not None and app != expected_app:
        raise CheckpointError(f"{path}: written by {app!r}, expected a checkpoint of {expected_app!r}; "
                              "point --checkpoint-dir / --restart at this app's checkpoints")
    step = int(_attribute(handle, path, "step"))
    named_step = layout.step_of(directory.name)
    if named_step is not None and named_step != step:
        raise CheckpointError(f"{path}: holds step {step} but its directory is named for step {named_step}")
    n_ranks = int(_attribute(handle, path, "n_ranks"))
    storage = _text(_attribute(handle, path, "layout"))
    if storage not in (layout.LAYOUT_PER_RANK, layout.LAYOUT_SINGLE_FILE) or n_ranks < 1:
        raise CheckpointError(f"{path}: layout {storage!r} with n_ranks={n_ranks} is not valid")
    index = {"fields": {}, "particles": {"counts": [], "arrays": {}}}
    for name, group in handle.get("index/fields", {}).items():
        starts, shapes = group["start"][()], group["shape"][()]
        global_shape = [int(n) for n in group.attrs["global_shape"]]
        ndim = len(global_shape)
        if starts.shape != (n_ranks, ndim) or shapes.shape != (n_ranks, ndim):
            raise CheckpointError(f"{path}: index of field {name!r} has {starts.shape} block starts for "
                                  f"{n_ranks} ranks and {ndim} axes")
        inside = np.all(starts >= 0) and np.all(shapes >= 0) and np.all(starts + shapes <= np.asarray(global_shape))
        if not inside or int(np.prod(shapes, axis=1).sum()) != math.prod(global_shape):
            raise CheckpointError(f"{path}: the blocks of field {name!r} do not tile its global shape {global_shape}")
        dtype = layout.parse_dtype(group.attrs["dtype"])
        dataset = handle.get(f"fields/{name}")
        if not isinstance(dataset, h5py.Dataset) or dataset.shape != tuple(global_shape) or dataset.dtype != dtype:
            found = None if dataset is None else (getattr(dataset, "shape", None), getattr(dataset, "dtype", None))
            raise CheckpointError(f"{path}: dataset fields/{name} should have shape {tuple(global_shape)} and "
                                  f"dtype {dtype}, found {found}")
        index["fields"][name] = {
            "global_shape": global_shape, "dtype": dtype.str,
            "dims": [int(d) for d in group.attrs["dims"]], "periodic": [bool(p) for p in group.attrs["periodic"]],
            "starts": starts.astype(int).tolist(), "shapes": shapes.astype(int).tolist()}
    counts = handle["index/particles/count"][()]
    arrays = json.loads(_text(handle["index/particles"].attrs["arrays"]))
    if arrays and (counts.shape != (n_ranks,) or np.any(counts < 0)):
        raise CheckpointError(f"{path}: particle counts have shape {counts.shape}, expected ({n_ranks},)")
    for name, entry in arrays.items():
        dtype = layout.parse_dtype(entry["dtype"])
        index["particles"]["arrays"][name] = {"dtype": dtype.str, "trailing": [int(n) for n in entry["trailing"]]}
    index["particles"]["counts"] = counts.astype(int).tolist() if arrays else []
    return CheckpointInfo(
        path=directory, step=step, app=app, n_ranks=n_ranks, layout=storage,
        created=_text(handle.attrs.get("created", "")), hpcgpu_version=_text(handle.attrs.get("hpcgpu_version", "")),
        git_commit=_text(handle.attrs.get("git_commit", "")),
        metadata=json.loads(_text(handle.attrs.get("metadata", "{}"))), index=index,
        run_id=_optional_text(handle, identity.RUN_ID_ATTRIBUTE),
        config_fingerprint=_optional_text(handle, identity.FINGERPRINT_ATTRIBUTE),
        config_options=_optional_json(handle, identity.OPTIONS_ATTRIBUTE))


def _optional_text(handle, name: str) -> str | None:
    return _text(handle.attrs[name]) if name in handle.attrs else None


def _optional_json(handle, name: str) -> dict | None:
    return json.loads(_text(handle.attrs[name])) if name in handle.attrs else None


def read_replicated_state(info: CheckpointInfo) -> dict:
    """The replicated state of a checkpoint (every value's CRC32 verified)."""
    with _open(info.master_file) as handle:
        if "replicated" not in handle:
            raise CheckpointError(f"{info.master_file}: group 'replicated' is missing")
        try:
            return read_replicated(handle["replicated"], "replicated")
        except ReplicatedValueError as exc:
            raise CheckpointError(f"{info.master_file}: {exc}") from None


@dataclass
class _Source:
    """Where the block written by one rank lives."""

    file: Path
    dataset: str
    offset: tuple          # position of the block inside ``dataset``
    shape: tuple           # the block's shape
    checksums: str         # dataset of the block's CRC32 per tile (attribute tile_shape)


class BlockReader:
    """Reads verified pieces of the blocks that the writing ranks stored; keeps files open until closed."""

    def __init__(self, info: CheckpointInfo):
        self.info = info
        self._handles = {}

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self, path: Path, writer_rank: int | None):
        if path not in self._handles:
            handle = _open(path)
            self._handles[path] = handle
            if writer_rank is not None:
                self._check_rank_file(handle, path, writer_rank)
        return self._handles[path]

    def _check_rank_file(self, handle, path: Path, writer_rank: int) -> None:
        expected = {"format": layout.FORMAT, "app": self.info.app, "step": self.info.step,
                    "rank": writer_rank, "n_ranks": self.info.n_ranks}
        for key, value in expected.items():
            found = handle.attrs.get(key)
            found = _text(found) if isinstance(value, str) else (None if found is None else int(found))
            if found != value:
                raise CheckpointError(f"{path}: attribute {key} is {found!r}, expected {value!r} "
                                      f"(a rank file of another checkpoint or another run?)")

    def source(self, kind: str, name: str, writer_rank: int) -> _Source:
        """Location of writer rank ``writer_rank``'s block of ``fields``/``particles`` array ``name``."""
        if kind == "fields":
            entry = self.info.index["fields"][name]
            start, shape = tuple(entry["starts"][writer_rank]), tuple(entry["shapes"][writer_rank])
        else:
            counts = self.info.index["particles"]["counts"]
            trailing = tuple(self.info.index["particles"]["arrays"][name]["trailing"])
            start = (int(sum(counts[:writer_rank])),) + (0,) * len(trailing)
            shape = (counts[writer_rank],) + trailing
        if self.info.layout == layout.LAYOUT_SINGLE_FILE:
            return _Source(self.info.master_file, f"{kind}/{name}", start, shape,
                           f"checksums/{kind}/{name}/{layout.rank_file_name(writer_rank)[:-3]}")
        return _Source(self.info.path / layout.rank_file_name(writer_rank), f"{kind}/{name}", (0,) * len(shape),
                       shape, f"checksums/{kind}/{name}")

    def read(self, kind: str, name: str, writer_rank: int, lower, upper) -> np.ndarray:
        """The verified block-local box ``[lower, upper)`` of writer ``writer_rank``'s block.

        Reads the whole checksum tiles covering the box and checks each one's CRC32.
        """
        import h5py

        source = self.source(kind, name, writer_rank)
        per_rank = self.info.layout == layout.LAYOUT_PER_RANK
        handle = self._handle(source.file, writer_rank if per_rank else None)
        try:
            dataset, checksums = handle.get(source.dataset), handle.get(source.checksums)
            if not isinstance(dataset, h5py.Dataset) or not isinstance(checksums, h5py.Dataset):
                raise CheckpointError(f"{source.file}: dataset {source.dataset} or its checksums "
                                      f"{source.checksums} is missing")
            expected_dtype = np.dtype((self.info.index[kind] if kind == "fields" else
                                       self.info.index["particles"]["arrays"])[name]["dtype"])
            if dataset.dtype != expected_dtype or (per_rank and dataset.shape != source.shape):
                raise CheckpointError(f"{source.file}: dataset {source.dataset} has shape {dataset.shape} and dtype "
                                      f"{dataset.dtype}, expected {source.shape} and {expected_dtype}")
            tile = tuple(int(t) for t in checksums.attrs["tile_shape"])
            grid = layout.tile_grid(source.shape, tile)
            if len(tile) != len(source.shape) or min(tile, default=1) < 1 or checksums.shape != grid:
                raise CheckpointError(f"{source.file}: checksums {source.checksums} have shape {checksums.shape} "
                                      f"for tiles {tile}, expected {grid}")
            first, stop = layout.covering_tiles(lower, upper, tile)
            box_lower = tuple(f * t for f, t in zip(first, tile))
            box_upper = tuple(min(s * t, n) for s, t, n in zip(stop, tile, source.shape))
            region = dataset[tuple(slice(o + a, o + b) for o, a, b in zip(source.offset, box_lower, box_upper))]
            crcs = checksums[tuple(slice(f, s) for f, s in zip(first, stop))]
        except CheckpointError:
            raise
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{source.file}: cannot read {source.dataset} ({type(exc).__name__}: {exc})") from None
        full_crcs = np.zeros(grid, dtype=np.uint32)
        full_crcs[tuple(slice(f, s) for f, s in zip(first, stop))] = crcs
        bad = find_bad_tiles(region, first, tile, source.shape, full_crcs)
        if bad:
            raise CheckpointError(
                f"{source.file}: checksum mismatch in {source.dataset}, tile(s) {bad[:4]}"
                f"{' ...' if len(bad) > 4 else ''} of shape {tile}; the file is corrupt. Restart from an older "
                "checkpoint (--restart latest falls back automatically).")
        return region[tuple(slice(a - b, c - b) for a, c, b in zip(lower, upper, box_lower))]
