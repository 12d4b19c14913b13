"""Runtime: the MPI communicator, GPU selection, CPU affinity and job-wide abort on error."""
