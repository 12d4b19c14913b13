"""MNIST-1D generation, HDF5 storage, rank-independent shuffling and sharding."""

import json
import socket

import h5py
import numpy as np
import pytest

from apps.train.data.dataset import (Dataset, epoch_permutation, generate_mnist1d, global_batches,
                             load_dataset, load_mnist1d, mnist1d_path, save_dataset, shard,
                             shard_bounds)


@pytest.fixture(scope="module")
def mnist1d():
    pytest.importorskip("mnist1d")
    return generate_mnist1d()


def test_mnist1d_generation_is_offline_and_standard(monkeypatch):
    pytest.importorskip("mnist1d")

    def no_network(*args, **kwargs):
        raise AssertionError("MNIST-1D generation tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    state = np.random.get_state()[1].copy()
    dataset = generate_mnist1d()
    assert np.array_equal(np.random.get_state()[1], state)      # global RNG restored
    assert dataset.x.shape == (4000, 40) and dataset.x_test.shape == (1000, 40)
    assert dataset.y.shape == (4000,) and dataset.y_test.shape == (1000,)
    assert set(np.unique(dataset.y)) == set(range(10))
    # standardised by the generator: mean 0, std 1 over train + test
    both = np.concatenate([dataset.x, dataset.x_test])
    assert abs(both.mean()) < 1e-5 and abs(both.std() - 1) < 1e-5
    assert json.loads(dataset.attrs["settings"])["seed"] == 42


def test_mnist1d_generation_is_reproducible(mnist1d):
    again = generate_mnist1d()
    assert np.array_equal(again.x, mnist1d.x) and np.array_equal(again.y_test, mnist1d.y_test)


def test_hdf5_round_trip_and_cache(tmp_path, mnist1d):
    path = tmp_path / "data.h5"
    save_dataset(path, mnist1d)
    loaded = load_dataset(path)
    for name in ("x", "y", "x_test", "y_test"):
        assert np.array_equal(getattr(loaded, name), getattr(mnist1d, name))
    assert loaded.attrs["settings"] == mnist1d.attrs["settings"]
    assert loaded.n_classes == 10
    # load_mnist1d generates once into the cache dir, then reads the file
    cached = load_mnist1d(tmp_path / "cache")
    assert np.array_equal(cached.x, mnist1d.x)
    with h5py.File(mnist1d_path(tmp_path / "cache"), "r") as handle:
        assert sorted(handle.keys()) == ["x", "x_test", "y", "y_test"]


def test_user_file_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset(tmp_path / "missing.h5")
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as handle:
        handle["x"] = np.zeros((3, 2))
        handle["y"] = np.zeros(3, dtype=np.int64)
    with pytest.raises(ValueError, match="missing"):
        load_dataset(path)
    good = Dataset(np.zeros((3, 2)), np.zeros(2, np.int64), np.zeros((1, 2)), np.zeros(1, np.int64))
    save_dataset(path, good)
    with pytest.raises(ValueError, match="must match"):
        load_dataset(path)


def test_shuffle_is_independent_of_rank_count():
    """Concatenating every rank's shard in rank order gives the same global batches."""
    batches = global_batches(103, 10, seed=5, epoch=2)
    assert len(batches) == 10                                   # incomplete batch dropped
    for n_ranks in (1, 2, 3, 4, 7):
        for batch in batches:
            pieces = [shard(batch, rank, n_ranks) for rank in range(n_ranks)]
            assert np.array_equal(np.concatenate(pieces), batch)
    assert np.array_equal(epoch_permutation(103, 5, 2), epoch_permutation(103, 5, 2))
    assert not np.array_equal(epoch_permutation(103, 5, 2), epoch_permutation(103, 5, 3))
    assert np.array_equal(np.sort(epoch_permutation(103, 5, 2)), np.arange(103))


def test_shard_bounds_give_remainder_to_first_ranks():
    assert [shard_bounds(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(ValueError, match="rank"):
        shard_bounds(10, 4, 4)
