"""``hpcgpu check``: is every node of this job fit to run it? Run on every rank at once, in seconds.

Under ``srun`` / ``mpiexec`` each rank checks its own GPU through NVML (:mod:`~hpcgpu.health.readings`:
ECC, row remapping, XID, temperature, clocks and throttling, power cap, PCIe, NVLink), probes its device
bandwidth, and the ranks together measure the job transport's links and allreduce, compare their
software versions and clocks, the free space where checkpoints go, and whether a container hides the
node's GPUs, InfiniBand devices or CPUs (:mod:`hpcgpu.runtime.container`). Rank 0 prints a table per node
and one verdict line, writes ``--json FILE`` and ``--exclude-file FILE`` (the nodes a follow-up job
should avoid), and every rank exits with the verdict's code:

====  =================================================================
0     healthy
2     usage error (bad flag)
3     warnings only (the job can run; look at the report)
4     at least one check failed (``exclude_nodes`` in the JSON says where)
====  =================================================================

Without a GPU (or without NVML) the GPU checks are skipped with the reason and the rest runs.
"""

from __future__ import annotations

import argparse

from hpcgpu.health.findings import SKIP, Finding
from hpcgpu.health.thresholds import Thresholds, parse_size

EPILOG = """\
exit codes: 0 healthy, 2 usage, 3 warnings only, 4 a check failed (see docs/health.md)
examples:
  srun python -m hpcgpu check                                  every rank, every check
  srun python -m hpcgpu check --checkpoint-dir /scratch/run7 --need 40G --json check.json
  mpiexec -n 4 python -m hpcgpu check --min-link-gbps 20       fail a job whose links are slow
"""


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``hpcgpu check`` (defaults: :class:`~hpcgpu.health.thresholds.Thresholds`)."""
    defaults = Thresholds()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--backend", choices=("auto", "cupy", "numpy"), default="auto",
                        help="backend whose transport is measured (default: auto, as the apps choose)")
    parser.add_argument("--json", metavar="FILE", help="write the full report (every finding, verdict) as JSON")
    parser.add_argument("--exclude-file", metavar="FILE",
                        help="write the nodes to exclude, comma-separated (empty when none), for sbatch --exclude")
    parser.add_argument("--checkpoint-dir", metavar="DIR", default=".",
                        help="where the job's checkpoints go: free space and writability are checked there [.]")
    parser.add_argument("--need", metavar="SIZE", type=_size, default=0, dest="free_space_bytes",
                        help="bytes that must be free there, e.g. 40G (a checkpoint's size x (--keep + 1)) [0]")
    parser.add_argument("--message-size", metavar="SIZE", type=_size, default=None,
                        help="bytes per link / allreduce message [64M on GPUs, 4M on CPUs]")
    parser.add_argument("--probe-size", metavar="SIZE", type=_size, default=1 << 30,
                        help="bytes of the device copy probe [1Gi]")
    parser.add_argument("--no-probes", action="store_true", help="skip the bandwidth probes (device, links, allreduce)")
    parser.add_argument("--expected-device-bandwidth", metavar="TB/S", type=_positive, default=None,
                        help="the device copy's ceiling in TB/s, read+write [from NVML: memory clock x bus width x 2]")
    limits = parser.add_argument_group("thresholds (docs/health.md)")
    limits.add_argument("--temperature-warn", dest="temperature_warn_c", type=float, default=defaults.temperature_warn_c,
                        metavar="C", help=f"warn at this GPU temperature [{defaults.temperature_warn_c:g}]")
    limits.add_argument("--temperature-fail-margin", dest="temperature_fail_margin_c", type=float,
                        default=defaults.temperature_fail_margin_c, metavar="C",
                        help=f"fail this close to the slowdown temperature [{defaults.temperature_fail_margin_c:g}]")
    limits.add_argument("--power-cap-fraction", type=float, default=defaults.power_cap_fraction, metavar="F",
                        help=f"warn below this share of the default power limit [{defaults.power_cap_fraction:g}]")
    limits.add_argument("--device-bandwidth-warn", type=float, default=defaults.device_bandwidth_warn, metavar="F",
                        help=f"warn below this share of peak memory bandwidth [{defaults.device_bandwidth_warn:g}]")
    limits.add_argument("--device-bandwidth-fail", type=float, default=defaults.device_bandwidth_fail, metavar="F",
                        help=f"fail below this share [{defaults.device_bandwidth_fail:g}]")
    limits.add_argument("--link-warn-fraction", type=float, default=defaults.link_warn_fraction, metavar="F",
                        help=f"warn when a pair is below this share of the median pair [{defaults.link_warn_fraction:g}]")
    limits.add_argument("--min-link-gbps", type=_positive, default=None, metavar="GB/S",
                        help="fail when a neighbour pair is below this, each way [off]")
    limits.add_argument("--min-allreduce-gbps", type=_positive, default=None, metavar="GB/S",
                        help="fail when the allreduce bus bandwidth is below this [off]")
    limits.add_argument("--clock-skew-warn", dest="clock_skew_warn_s", type=_positive, default=defaults.clock_skew_warn_s,
                        metavar="S", help=f"warn when a node's clock is off by more [{defaults.clock_skew_warn_s:g} s]")
    limits.add_argument("--clock-skew-fail", dest="clock_skew_fail_s", type=_positive, default=defaults.clock_skew_fail_s,
                        metavar="S", help=f"fail when off by more [{defaults.clock_skew_fail_s:g} s]")


def _first_clause(text: str | None) -> str:
    """The start of a long reason, up to its first ``;`` (the rest is in ``hpcgpu info``)."""
    return (text or "").split(";")[0].split(" (")[0].strip()


def _gpu_findings(comm, arch, source, options, thresholds: Thresholds) -> list[Finding]:
    """This rank's GPU findings (and, on a node's first rank, the GPU count)."""
    from hpcgpu.health import gpu_checks, probes
    from hpcgpu.health.readings import kernel_log_xids, normalise_bus_id

    host = comm.hostname
    found = []
    bus_id = None
    if arch.is_gpu:
        bus_id = normalise_bus_id(arch.identity.pci_bus_id)
    elif source.available:
        bus_ids = source.bus_ids()
        bus_id = bus_ids[comm.local_rank] if comm.local_rank < len(bus_ids) else None
    if comm.local_rank == 0:
        requested, variable = gpu_checks.requested_gpus()
        if arch.is_gpu:
            import cupy

            visible, how = int(cupy.cuda.runtime.getDeviceCount()), "CuPy"
        elif source.available:
            visible, how = source.device_count(), "NVML"
        else:
            visible, how = None, f"{_first_clause(arch.reason)}; {_first_clause(source.reason)}"
        found.append(gpu_checks.gpu_count_finding(visible, how, requested, variable, comm.local_size, host))
    if bus_id is None:
        why = "more ranks than GPUs on this node" if source.available else \
            f"{_first_clause(arch.reason)}; {_first_clause(source.reason)}"
        found.append(Finding("gpu checks", SKIP, f"no GPU for this rank: {why}", host, comm.rank, scope="gpu"))
        return found
    reading = {}
    if source.available:
        reading = source.read(bus_id)
        events, note = source.xid_events() if hasattr(source, "xid_events") else kernel_log_xids()
        xids = None if events is None else events.get(bus_id, [])
        found += gpu_checks.judge_gpu(reading, thresholds, host, comm.rank, bus_id, xids, note)
    else:
        found.append(Finding("nvml", SKIP, source.reason, host, comm.rank, bus_id, scope="gpu"))
    measured, note = None, "--no-probes" if options.no_probes else "the CPU backend is in use (no CuPy device)"
    if arch.is_gpu and not options.no_probes:
        measured = probes.device_copy_bandwidth(options.probe_size)
    expected = options.expected_device_bandwidth * 1e12 if options.expected_device_bandwidth else None
    found.append(gpu_checks.judge_device_bandwidth(measured, reading, thresholds, host, comm.rank, bus_id, note,
                                                   expected))
    return found


def collect(comm, options, gpu_source=None) -> dict:
    """Collective: run every check on every rank; returns the report (:func:`report.build_report`) on
    every rank.

    Parameters
    ----------
    gpu_source : object, optional
        The GPU readings (default :class:`~hpcgpu.health.readings.NvmlSource` over pynvml); tests pass
        an ``NvmlSource`` over a fake NVML module.
    """
    import hpcgpu
    from hpcgpu.health import job_checks, probes
    from hpcgpu.health.readings import NvmlSource
    from hpcgpu.health.report import build_report
    from hpcgpu.runtime import container
    from hpcgpu.transport.selection import select_transport

    thresholds = Thresholds.from_options(options)
    arch = hpcgpu.arch.auto(comm, backend=options.backend, allow_sharing=True)
    source = gpu_source if gpu_source is not None else NvmlSource()
    hosts = comm.mpi.allgather(comm.hostname)
    found = _gpu_findings(comm, arch, source, options, thresholds)
    transport = select_transport(comm, arch)
    job_found = []
    if options.no_probes:
        job_found.append(Finding("link bandwidth", SKIP, "--no-probes", scope="job"))
    elif comm.size > 1:
        n_bytes = options.message_size or ((64 << 20) if arch.is_gpu else (4 << 20))
        buffers = probes.transport_buffers(comm, transport, n_bytes)
        pairs = probes.link_bandwidths(comm, buffers, n_bytes)
        job_found += job_checks.judge_links(pairs, hosts, transport, thresholds)
        job_found.append(job_checks.judge_allreduce(probes.allreduce_bandwidth(comm, buffers, n_bytes), n_bytes,
                                                    transport, thresholds))
    else:
        job_found.append(Finding("link bandwidth", SKIP, "one rank: no links to measure", scope="job"))
    versions = comm.mpi.allgather(job_checks.local_versions())
    job_found += job_checks.judge_versions(versions, hosts)
    job_found += job_checks.judge_clock_offsets(job_checks.clock_offsets(comm), thresholds)
    if comm.local_rank == 0:
        found.append(job_checks.judge_container(container.inspect().as_dict(), comm.hostname))
        found.append(job_checks.judge_free_space(job_checks.free_space(options.checkpoint_dir), thresholds,
                                                 comm.hostname))
    everyone = [f for rank_found in comm.mpi.allgather(found) for f in rank_found]
    context = {"backend": arch.name, "backend_reason": arch.reason, "transport": transport,
               "thresholds": thresholds.as_dict(), "versions": versions[0]}
    return build_report(everyone + job_found, hosts, context)


def main(options, gpu_source=None) -> int:
    """Run the check (collective); rank 0 prints and writes the files; returns the verdict's exit code."""
    import hpcgpu
    from hpcgpu.health.report import format_report, write_json

    comm = hpcgpu.Communicator()
    with hpcgpu.abort_on_error(comm):
        report = collect(comm, options, gpu_source)
        if comm.rank == 0:
            print(format_report(report), flush=True)
            if options.json:
                write_json(options.json, report)
            if options.exclude_file:
                with open(options.exclude_file, "w") as handle:
                    handle.write(",".join(report["exclude_nodes"]) + "\n")
        comm.barrier()   # files written before any rank exits (a job script reads them next)
    return report["exit_code"]
