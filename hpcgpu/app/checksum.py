"""A checksum of the global state that does not depend on the number of ranks.

Fields are gathered in global index order; particles are sorted by id before hashing. The digest
covers each array's name, dtype, shape and bytes, so runs on any decomposition can be compared
exactly (``sha256:...`` strings equal <=> states bitwise equal).
"""

from __future__ import annotations

import hashlib

import numpy as np


def hash_arrays(named_arrays) -> str:
    """SHA-256 of ``[(name, numpy array), ...]`` in the given order."""
    digest = hashlib.sha256()
    for name, array in named_arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return "sha256:" + digest.hexdigest()


def fields_checksum(comm, fields) -> str:
    """Collective: checksum of the owned cells of ``fields`` (gathered to rank 0), on every rank."""
    gathered = [(f.name, f.gather(root=0)) for f in fields]
    value = hash_arrays(gathered) if comm.rank == 0 else None
    return comm.broadcast(value, root=0)
