"""Global sums that do not depend on the decomposition: exact (correctly rounded) float64 reductions.

A thermo quantity such as ``E_pair = sum_i e_i`` summed naively depends on the order of the terms: on
how atoms are spread over ranks and ordered inside a rank. To make 1, 2, ... N ranks print the same
numbers, each rank turns its values into their exact sum (:func:`hpcgpu.reductions.exact_sum`: Shewchuk's
non-overlapping partials, as in Python's ``math.fsum``, held as one integer), the ranks allgather those,
and every rank rounds their exact total once (:func:`hpcgpu.reductions.rounded_total`). The result is the
correctly rounded value of the exact sum of all per-atom terms: independent of the order of atoms and of
the number of ranks. What remains decomposition-dependent is only the per-atom terms themselves (the
force on an atom is summed over its neighbours in an order that depends on the local cell binning),
which differ in the last bits.

Cost: O(n_local) on the host (Numba, :func:`hpcgpu.reductions.exact_sum`) plus one small allgather,
paid on thermo steps only.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.reductions import exact_sum, rounded_total


def global_sums(comm, columns) -> list[float]:
    """Collective: the correctly rounded global sum of each 1-D array (or float) of ``columns``.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    columns : sequence of numpy arrays (this rank's terms) or floats (this rank's total)

    Returns
    -------
    list of float, the same on every rank and for every decomposition of the same terms.
    """
    local = [exact_sum(np.atleast_1d(np.asarray(column, dtype=np.float64))) for column in columns]
    everyone = comm.mpi.allgather(local)
    return [rounded_total([rank_sums[k] for rank_sums in everyone]) for k in range(len(columns))]
