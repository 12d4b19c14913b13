"""The job's transport is chosen once (flag > HPCGPU_TRANSPORT > automatic) and read by halos, particle
ghosts and device collectives; a bad name is one error, raised alike on every rank before any data moves."""

import sys
import textwrap

import pytest

from hpcgpu.errors import BackendError, ConfigurationError
from hpcgpu.jobs.launch import run_mpi
from hpcgpu.transport import selection


def fresh(comm):
    """A new Communicator on the same ranks: a job that has chosen nothing yet (collective)."""
    import hpcgpu

    return hpcgpu.Communicator(comm.mpi)


class _Architecture:
    def __init__(self, is_gpu):
        self.is_gpu = is_gpu
        self.name = "gpu" if is_gpu else "cpu"
        self.device_id = 0 if is_gpu else None


def test_requested_name_precedence_flag_then_environment_then_automatic(monkeypatch):
    monkeypatch.delenv("HPCGPU_TRANSPORT", raising=False)
    assert selection.requested_transport(None) == (None, "automatic")
    monkeypatch.setenv("HPCGPU_TRANSPORT", "mpi-staged")
    assert selection.requested_transport(None) == ("mpi-staged", "environment")
    assert selection.requested_transport("nccl") == ("nccl", "flag")


def test_names_are_checked_against_the_architecture(monkeypatch):
    monkeypatch.delenv("HPCGPU_TRANSPORT", raising=False)
    with pytest.raises(BackendError, match=r"unknown transport 'tcp' \(--transport\); expected one of mpi, nccl"):
        selection.check_transport_name("tcp", is_gpu=True, source="flag")
    with pytest.raises(BackendError, match=r"transport 'nccl' \(HPCGPU_TRANSPORT\) moves GPU arrays.*use 'mpi'"):
        selection.check_transport_name("nccl", is_gpu=False, source="environment")
    with pytest.raises(BackendError, match="moves host arrays; on a GPU use 'nccl', 'mpi-cuda' or 'mpi-staged'"):
        selection.check_transport_name("mpi", is_gpu=True)
    for name in ("nccl", "mpi-cuda", "mpi-staged"):
        selection.check_transport_name(name, is_gpu=True)
    selection.check_transport_name("mpi", is_gpu=False)


def test_automatic_choice_on_gpus_is_nccl_then_cuda_aware_mpi_then_staged(monkeypatch):
    from hpcgpu.transport import mpi_device

    assert selection.automatic_transport(is_gpu=False) == "mpi"
    monkeypatch.setattr(selection, "nccl_available", lambda: True)
    assert selection.automatic_transport(is_gpu=True) == "nccl"
    monkeypatch.setattr(selection, "nccl_available", lambda: False)
    monkeypatch.setenv("HPCGPU_CUDA_AWARE_MPI", "1")
    assert mpi_device.mpi_is_cuda_aware()
    assert selection.automatic_transport(is_gpu=True) == "mpi-cuda"
    monkeypatch.setenv("HPCGPU_CUDA_AWARE_MPI", "0")
    assert selection.automatic_transport(is_gpu=True) == "mpi-staged"


@pytest.mark.mpi(ranks=[1, 2])
def test_selection_precedence_and_one_choice_per_job(comm, monkeypatch):
    import hpcgpu
    from hpcgpu.transport import default_transport, select_transport, transport_choice, transport_name

    cpu = hpcgpu.arch.auto(comm, backend="numpy")
    monkeypatch.delenv("HPCGPU_TRANSPORT", raising=False)
    job = fresh(comm)
    assert transport_name(job, cpu) == "mpi" and transport_choice(job, cpu).source == "automatic"   # nothing chosen yet
    assert select_transport(job, cpu) == "mpi"
    assert job.job_transport.choices["cpu"] == selection.TransportChoice("mpi", "automatic")
    # The halo exchange reads the stored choice, and builds its transport once.
    transport = default_transport(job, cpu)
    assert transport.name == "mpi" and default_transport(job, cpu) is transport
    assert job.job_transport.halo_transports == {("cpu", None): transport}
    # Once chosen, the environment is not read again, and another explicit request is refused.
    monkeypatch.setenv("HPCGPU_TRANSPORT", "tcp")
    assert select_transport(job, cpu) == "mpi" and transport_name(job, cpu) == "mpi"
    with pytest.raises(ConfigurationError, match="already uses 'mpi'") as refused:
        select_transport(job, cpu, requested="nccl")
    assert refused.value.replicated
    # The flag beats the environment variable (which would be an error here).
    monkeypatch.setenv("HPCGPU_TRANSPORT", "nccl")
    flagged = fresh(comm)
    assert select_transport(flagged, cpu, requested="mpi") == "mpi"
    assert flagged.job_transport.choices["cpu"].source == "flag" and flagged.job_transport.requested == "mpi"
    # The environment variable beats the automatic choice.
    monkeypatch.setenv("HPCGPU_TRANSPORT", "mpi")
    from_environment = fresh(comm)
    select_transport(from_environment, cpu)
    assert from_environment.job_transport.choices["cpu"].describe() == "mpi (environment)"


@pytest.mark.mpi(ranks=[1, 2])
def test_device_collectives_and_particle_ghosts_read_the_same_choice(comm, monkeypatch):
    from hpcgpu.transport import collectives
    from hpcgpu.transport.device_collectives import MpiDeviceCollectives

    monkeypatch.setenv("HPCGPU_TRANSPORT", "mpi-staged")
    staged = fresh(comm)
    movers = collectives(staged, on_device=True)
    assert isinstance(movers, MpiDeviceCollectives) and movers.name == "mpi-staged"   # no CuPy needed to build it
    assert collectives(staged, on_device=True) is movers is staged.job_transport.collectives["device"]
    assert selection.select_transport_for(staged, is_gpu=True) == "mpi-staged"
    assert staged.job_transport.choices["gpu"] == selection.TransportChoice("mpi-staged", "environment")
    monkeypatch.setenv("HPCGPU_TRANSPORT", "nccl")
    nccl_job = fresh(comm)
    assert selection.select_transport_for(nccl_job, is_gpu=True) == "nccl"
    assert selection.transport_name(nccl_job, _Architecture(is_gpu=True)) == "nccl"
    monkeypatch.setenv("HPCGPU_TRANSPORT", "mpi")   # host arrays only: wrong for device arrays
    with pytest.raises(BackendError, match="moves host arrays") as wrong:
        collectives(fresh(comm), on_device=True)   # what particle ghosts and migration call
    assert wrong.value.replicated


@pytest.mark.mpi(ranks=[2])
def test_an_invalid_name_is_the_same_error_on_every_rank(comm, monkeypatch):
    import hpcgpu

    cpu = hpcgpu.arch.auto(comm, backend="numpy")
    monkeypatch.setenv("HPCGPU_TRANSPORT", "infiniband")
    grid = hpcgpu.Decomposition(comm, (8, 6), periodic=(True, True))
    field = hpcgpu.Field(grid, cpu, halo_width=1)
    with pytest.raises(BackendError, match=r"unknown transport 'infiniband' \(HPCGPU_TRANSPORT\)") as error:
        field.exchange_halos()
    assert error.value.replicated
    assert len(set(comm.mpi.allgather(str(error.value)))) == 1
    # Ranks that ask for different transports: one ConfigurationError, on every rank.
    if comm.rank == 0:
        monkeypatch.setenv("HPCGPU_TRANSPORT", "mpi")
    else:
        monkeypatch.delenv("HPCGPU_TRANSPORT")
    with pytest.raises(ConfigurationError, match=r"requested different transports \(\(automatic\), mpi\)"):
        hpcgpu.transport.select_transport(fresh(comm), cpu)


def test_a_job_with_an_invalid_transport_prints_one_message_and_exits_2(tmp_path):
    script = tmp_path / "bad_transport.py"
    script.write_text(textwrap.dedent(
        """
        import hpcgpu

        comm = hpcgpu.Communicator()
        with hpcgpu.abort_on_error(comm):
            arch = hpcgpu.arch.auto(comm, backend="numpy")
            grid = hpcgpu.Decomposition(comm, (8, 6), periodic=(True, True))
            hpcgpu.Field(grid, arch, halo_width=1).exchange_halos()
        """))
    result = run_mpi(2, [sys.executable, str(script)], timeout=90, env={"HPCGPU_TRANSPORT": "infiniband"})
    assert result.returncode == 2, result.output
    assert result.output.count("unknown transport 'infiniband' (HPCGPU_TRANSPORT)") == 1, result.output


@pytest.mark.parametrize("app, args", [("stencil", ["--steps", "4", "--no-plot"]), ("md", ["--steps", "4"])])
def test_the_transport_flag_is_chosen_once_and_named_in_header_and_summary(tmp_path, app, args):
    """``--transport`` reaches the job's one choice: the header and the summary name it and its source."""
    summary = tmp_path / "summary.json"
    command = [sys.executable, "-m", f"apps.{app}", *args, "--backend", "numpy", "--transport", "mpi",
               "--output", str(tmp_path / "out"), "--summary", str(summary)]
    result = run_mpi(2, command, timeout=180)
    assert result.returncode == 0, result.output
    assert result.output.count("transport: mpi (flag)") == 1, result.output
    import json

    recorded = json.loads(summary.read_text())
    assert (recorded["transport"], recorded["transport_source"]) == ("mpi", "flag")


def test_a_transport_flag_that_does_not_fit_the_cpu_is_one_message_and_exit_2(tmp_path):
    command = [sys.executable, "-m", "apps.stencil", "--steps", "2", "--backend", "numpy", "--no-plot",
               "--transport", "nccl", "--output", str(tmp_path / "out")]
    result = run_mpi(2, command, timeout=120)
    assert result.returncode == 2, result.output
    assert result.output.count("transport 'nccl' (--transport) moves GPU arrays, but the architecture is the CPU") == 1, \
        result.output
