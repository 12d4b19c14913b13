"""Data: MNIST-1D generated offline, HDF5 storage, rank-independent batching.

MNIST-1D (Greydanus 2020) is generated, never downloaded: :func:`generate_mnist1d`
calls the ``mnist1d`` package's generator ``make_dataset`` with its standard
settings (5,000 samples, 80/20 split -> 4,000 train / 1,000 test, length 40,
seed 42). The package's ``get_dataset`` would try to download a pickle first; we
do not call it. The result is stored once as HDF5 (datasets ``x``, ``y``,
``x_test``, ``y_test``; attributes record the generation settings) in a cache
directory, and users may pass their own file of the same form.

Batching for data parallelism
-----------------------------
Every rank computes the same global permutation of the training set for an epoch
from ``(seed, epoch)`` alone -- it does not depend on the number of ranks -- and
cuts it into global batches. Each rank then takes a contiguous slice of every
global batch with :func:`shard` (the first ``B % n_ranks`` ranks get one extra
sample, as in the core Decomposition). Concatenating the shards in rank order
gives back the global batch, so N ranks see exactly the samples of the 1-rank run.
"""

import json
import os
import random
from dataclasses import dataclass, field

import h5py
import numpy as np

#: Standard generation settings of MNIST-1D (``mnist1d.data.get_dataset_args``).
MNIST1D_STANDARD_SETTINGS = {
    "num_samples": 5000, "train_split": 0.8, "template_len": 12, "padding": [36, 60],
    "scale_coeff": 0.4, "max_translation": 48, "corr_noise_scale": 0.25,
    "iid_noise_scale": 2e-2, "shear_scale": 0.75, "shuffle_seq": False,
    "final_seq_length": 40, "seed": 42,
}

REQUIRED_DATASETS = ("x", "y", "x_test", "y_test")


@dataclass
class Dataset:
    """An in-memory classification data set.

    Attributes
    ----------
    x : ndarray of float32, shape (n_train, n_features)
    y : ndarray of int64, shape (n_train,)
    x_test : ndarray of float32, shape (n_test, n_features)
    y_test : ndarray of int64, shape (n_test,)
    attrs : dict
        Provenance (generation settings, source file).
    """

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    attrs: dict = field(default_factory=dict)

    @property
    def n_classes(self):
        return int(max(self.y.max(), self.y_test.max())) + 1


def generate_mnist1d(settings=None):
    """Generate MNIST-1D with the ``mnist1d`` package's generator (no network).

    Parameters
    ----------
    settings : dict, optional
        Overrides of :data:`MNIST1D_STANDARD_SETTINGS`.

    Returns
    -------
    Dataset
        ``x`` float32 (n_train, 40), labels int64; ``attrs`` holds the settings.
    """
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as error:
        raise ImportError(
            "generating MNIST-1D needs the 'mnist1d' package: pip install mnist1d "
            "(or pass --data FILE.h5 with your own data)"
        ) from error
    arguments = get_dataset_args()
    chosen = dict(MNIST1D_STANDARD_SETTINGS)
    chosen.update(settings or {})
    for key, value in chosen.items():
        setattr(arguments, key, value)
    # make_dataset seeds the GLOBAL NumPy/random generators; restore them after
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        raw = make_dataset(arguments)
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    attrs = {"source": "mnist1d.make_dataset", "settings": json.dumps(chosen, sort_keys=True)}
    return Dataset(
        x=raw["x"].astype(np.float32), y=raw["y"].astype(np.int64),
        x_test=raw["x_test"].astype(np.float32), y_test=raw["y_test"].astype(np.int64),
        attrs=attrs,
    )


def save_dataset(path, dataset):
    """Write a :class:`Dataset` to HDF5 atomically (temporary file + rename)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp{os.getpid()}"
    with h5py.File(temporary, "w") as handle:
        for name in REQUIRED_DATASETS:
            handle.create_dataset(name, data=getattr(dataset, name))
        for key, value in dataset.attrs.items():
            handle.attrs[key] = value
    os.replace(temporary, path)


def load_dataset(path):
    """Read a data set from HDF5 (``x``, ``y``, ``x_test``, ``y_test``).

    ``x``/``x_test`` are (n_samples, ...) float arrays, ``y``/``y_test`` integer
    class labels. Raises ``FileNotFoundError``/``ValueError`` with the fix when the
    file is missing or malformed.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"data file {path!r} does not exist; pass an HDF5 file with datasets "
            f"{', '.join(REQUIRED_DATASETS)} or omit --data to use MNIST-1D"
        )
    with h5py.File(path, "r") as handle:
        missing = [name for name in REQUIRED_DATASETS if name not in handle]
        if missing:
            raise ValueError(
                f"data file {path!r}: expected datasets {list(REQUIRED_DATASETS)}, missing "
                f"{missing}; found {sorted(handle.keys())}"
            )
        arrays = {name: handle[name][...] for name in REQUIRED_DATASETS}
        attrs = {key: (value.decode() if isinstance(value, bytes) else value)
                 for key, value in handle.attrs.items()}
    for features, labels in (("x", "y"), ("x_test", "y_test")):
        if arrays[features].shape[0] != arrays[labels].shape[0]:
            raise ValueError(
                f"data file {path!r}: {features} has {arrays[features].shape[0]} samples but "
                f"{labels} has {arrays[labels].shape[0]}; they must match"
            )
        if arrays[labels].dtype.kind not in "iu" or arrays[labels].ndim != 1:
            raise ValueError(
                f"data file {path!r}: {labels} must be a 1-D integer array of class labels, "
                f"found {arrays[labels].dtype} with shape {arrays[labels].shape}"
            )
    attrs["path"] = path
    return Dataset(
        x=arrays["x"].astype(np.float32), y=arrays["y"].astype(np.int64),
        x_test=arrays["x_test"].astype(np.float32), y_test=arrays["y_test"].astype(np.int64),
        attrs=attrs,
    )


#: The 8 bytes every HDF5 file holds at offset 0 (or 512, 1024, 2048 ... after a user block).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def data_file_problem(path):
    """What is wrong with ``path`` as a ``--data`` file, or None if it looks like an HDF5 file.

    Checks existence, that it is a regular file and the HDF5 signature (so a text or NumPy file gets
    a message naming it, instead of h5py's "file signature not found"). The datasets are checked
    when the file is opened.
    """
    path = os.fspath(path)
    expected = ("expected an HDF5 file with datasets x (n, features) float and y (n,) integer labels "
                "(optional x_test, y_test), e.g. written with h5py or apps.train.data.dataset.save_dataset")
    if not os.path.exists(path):
        return f"--data {path}: file not found; {expected}, or omit --data for MNIST-1D"
    if not os.path.isfile(path):
        return f"--data {path}: is a directory, not a file; {expected}"
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            offset = 0
            while offset + len(HDF5_SIGNATURE) <= size:
                handle.seek(offset)
                if handle.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
                    return None
                offset = 512 if offset == 0 else 2 * offset
    except OSError as exc:
        return f"--data {path}: cannot be read ({exc.strerror or exc}); {expected}"
    kind = "a NumPy .npy/.npz file" if path.endswith((".npy", ".npz")) else "an HDF5 file"
    kind = "a text file" if _looks_like_text(path) else kind
    what = f"is {kind}" if kind != "an HDF5 file" else "is not an HDF5 file (no HDF5 signature)"
    return f"--data {path}: {what}; {expected}"


def _looks_like_text(path) -> bool:
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in head


def default_cache_dir():
    """``$HPCGPU_CACHE_DIR`` or ``~/.cache/hpcgpu``."""
    return os.environ.get("HPCGPU_CACHE_DIR",
                          os.path.join(os.path.expanduser("~"), ".cache", "hpcgpu"))


def mnist1d_path(cache_dir=None):
    """Path of the cached standard MNIST-1D file."""
    seed = MNIST1D_STANDARD_SETTINGS["seed"]
    count = MNIST1D_STANDARD_SETTINGS["num_samples"]
    return os.path.join(cache_dir or default_cache_dir(), f"mnist1d_n{count}_seed{seed}.h5")


def load_mnist1d(cache_dir=None):
    """Load the standard MNIST-1D, generating and caching it on first use.

    Multi-rank jobs should call this on rank 0 first, then barrier, then on the
    other ranks (the write is atomic, so a concurrent reader never sees half a
    file, but generating it on every rank is wasted work).
    """
    path = mnist1d_path(cache_dir)
    if not os.path.exists(path):
        save_dataset(path, generate_mnist1d())
    return load_dataset(path)


# ---------------------------------------------------------------- batching --

def epoch_permutation(n_samples, seed, epoch):
    """Permutation of ``range(n_samples)`` for one epoch; depends only on (seed, epoch)."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(int(n_samples))


def global_batches(n_samples, global_batch_size, seed, epoch, drop_last=True):
    """The global batches of one epoch as a list of index arrays (int64).

    With ``drop_last`` the final incomplete batch is dropped, so every step has
    exactly ``global_batch_size`` samples.
    """
    if global_batch_size < 1 or global_batch_size > n_samples:
        raise ValueError(
            f"global batch size: expected 1 <= B <= {n_samples} (training samples), "
            f"found {global_batch_size}"
        )
    order = epoch_permutation(n_samples, seed, epoch)
    stop = (n_samples // global_batch_size) * global_batch_size if drop_last else n_samples
    return [order[start:start + global_batch_size]
            for start in range(0, stop, global_batch_size)]


def shard_bounds(n_items, rank, n_ranks):
    """``(lo, hi)`` of rank's contiguous share of ``n_items``; remainder to the first ranks."""
    if not 0 <= rank < n_ranks:
        raise ValueError(f"shard: expected 0 <= rank < n_ranks, found rank={rank}, n_ranks={n_ranks}")
    base, extra = divmod(int(n_items), int(n_ranks))
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def shard(global_batch_indices, rank, n_ranks):
    """This rank's contiguous slice of a global batch (a view, no copy).

    The global position of the slice's first sample is ``shard_bounds(...)[0]``;
    pass ``arange(lo, hi)`` as the dropout ``sample_index``.
    """
    lo, hi = shard_bounds(len(global_batch_indices), rank, n_ranks)
    return global_batch_indices[lo:hi]
