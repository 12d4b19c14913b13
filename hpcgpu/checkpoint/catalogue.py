"""Which checkpoints a directory holds, who wrote them, and which one a restart should use.

Not a public class: :class:`hpcgpu.checkpoint.manager.CheckpointManager` owns one and delegates
``checkpoints``, ``owners``, ``find`` and the choice of ``load`` to it. Every method that reads the
directory is collective except :meth:`checkpoints`: rank 0 reads, the answer is broadcast, so every
rank decides the same.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from hpcgpu.checkpoint import identity, layout
from hpcgpu.checkpoint.filesystem import recover_replaced
from hpcgpu.checkpoint.reader import BlockReader, CheckpointInfo, read_master
from hpcgpu.checkpoint.restore import agreed_error
from hpcgpu.errors import CheckpointError


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (invalid) and an older one is used instead."""


class CheckpointCatalogue:
    """The checkpoints of one directory as seen by one run.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    directory : Path
    app : str
        Only checkpoints of this app are accepted.
    config : dict
        The run's canonical options (see :func:`identity.canonical_options`).
    config_fingerprint : str
        Their fingerprint; ``"latest"`` considers only checkpoints with the same one (or legacy ones).

    Attributes
    ----------
    incompatible : list of identity.CheckpointOwner
        The checkpoints the last ``"latest"`` search skipped for their configuration (for messages).
    """

    def __init__(self, comm, directory: Path, app: str, config: dict, config_fingerprint: str, resolve_fn=None):
        self.comm, self.directory, self.app = comm, directory, app
        self.config, self.config_fingerprint = config, config_fingerprint
        self.resolve_fn = resolve_fn or (lambda options: options)
        self.incompatible = []

    def _resolved(self, options: dict | None) -> dict | None:
        """A checkpoint's recorded options as this run resolves them (canonical JSON values)."""
        return None if options is None else identity.canonical_options(self.resolve_fn(options))

    def compatible(self, owner) -> bool:
        """May this run continue ``owner`` (same fingerprint, equal resolved options, or legacy)?"""
        return owner.compatible_with(self.config_fingerprint) or self._resolved(owner.config_options) == self.config

    def checkpoints(self) -> list[Path]:
        """Complete checkpoint directories (names only; not validated), oldest first. Not collective."""
        if not self.directory.is_dir():
            return []
        found = [(layout.step_of(p.name), p) for p in self.directory.iterdir() if p.is_dir()]
        return [p for step, p in sorted((s, p) for s, p in found if s is not None)]

    def owners(self) -> list[identity.CheckpointOwner]:
        """Collective: who wrote each complete checkpoint (rank 0 reads the masters' attributes), oldest
        step first, the same list on every rank."""
        owners = None
        if self.comm.rank == 0:
            recover_replaced(self.directory)  # a replacement interrupted by a crash
            owners = [identity.read_owner(path) for path in self.checkpoints()]
        return self.comm.broadcast(owners, root=0)

    def candidates(self, which) -> list[Path]:
        self.incompatible = []
        if isinstance(which, CheckpointInfo):
            return [which.path]
        if str(which) == "latest":
            return self.latest_candidates()
        path = Path(which)
        if path.name == layout.MASTER_FILE:
            path = path.parent
        if not path.is_absolute() and not path.exists() and (self.directory / path).exists():
            path = self.directory / path
        return [path]

    def latest_candidates(self) -> list[Path]:
        """Compatible checkpoints, the newest run first (by the time its newest checkpoint was written),
        each run's newest step first; unreadable ones are tried in step order with the newest run's
        (so they are skipped with a warning where they would have been chosen)."""
        owners = self.owners()
        unreadable = [o for o in owners if o.problem is not None]
        readable = [o for o in owners if o.problem is None]
        compatible = [o for o in readable if self.compatible(o)]
        self.incompatible = [o for o in readable if not self.compatible(o)]
        newest = {}
        for owner in compatible:
            newest[owner.run_id] = max(newest.get(owner.run_id, owner.created_time()), owner.created_time())
        order = {run: i for i, run in enumerate(sorted(newest, key=lambda run: newest[run], reverse=True))}
        ordered = sorted(compatible, key=lambda o: (order[o.run_id], -o.step))
        first_run = [o for o in ordered if order[o.run_id] == 0]
        ordered = sorted(first_run + unreadable, key=lambda o: -o.step) + ordered[len(first_run):]
        if not ordered and self.incompatible:
            raise agreed_error(f"no checkpoint in {self.directory} matches this run's configuration; found "
                               f"{identity.summarize(self.incompatible)}.\n" + self.differences_text()
                               + "\nRestart with the options of the run to continue, name one checkpoint "
                               "explicitly to restart from it anyway, or start a new run in another "
                               "checkpoint directory")
        return [o.path for o in ordered]

    def differences_text(self) -> str:
        lines, seen = [], set()
        for owner in self.incompatible:
            if owner.run_id in seen:
                continue
            seen.add(owner.run_id)
            lines.append(f"{owner.run_label} differs from this run in:")
            lines += [f"    {line}" for line in identity.differences(self._resolved(owner.config_options), self.config)]
        return "\n".join(f"  {line}" for line in lines)

    def describe_choice(self, info: CheckpointInfo, which, run_id: str) -> str | None:
        """What :attr:`restart_note` says about the checkpoint just loaded (None: nothing noteworthy)."""
        notes = []
        if info.legacy:
            notes.append(f"{info.path.name} was written before run ids existed (a legacy checkpoint); this run "
                         f"continues it as run {run_id}, and leaves the legacy checkpoints in place")
        elif info.config_fingerprint not in (None, self.config_fingerprint) \
                and self._resolved(info.config_options) != self.config:
            notes.append(f"{info.path.name} was written with other options: "
                         + "; ".join(identity.differences(self._resolved(info.config_options), self.config)))
        if str(which) == "latest":
            others = [o for o in self.owners() if o.problem is not None or o.run_id != info.run_id]
            if others:
                notes.append(f"{self.directory} holds checkpoints of several runs; chose the newest compatible "
                             f"one ({'legacy run' if info.legacy else 'run ' + str(info.run_id)}, step {info.step}); "
                             f"also there: {identity.summarize(others)}")
        return "; ".join(notes) or None

    def inspect(self, path: Path) -> CheckpointInfo:
        """Collective: read the master on rank 0; every rank checks a share of the rank files."""
        result = None
        if self.comm.rank == 0:
            try:
                result = read_master(path, expected_app=self.app)
            except CheckpointError as exc:
                result = str(exc)
        result = self.comm.broadcast(result, root=0)
        if isinstance(result, str):
            raise agreed_error(result)
        info = result
        problem = None
        if info.layout == layout.LAYOUT_PER_RANK:
            try:
                with BlockReader(info) as reader:
                    for writer_rank in range(self.comm.rank, info.n_ranks, self.comm.size):
                        reader._handle(info.path / layout.rank_file_name(writer_rank), writer_rank)
            except CheckpointError as exc:
                problem = str(exc)
        self.comm.check(problem is None, problem or "", error=CheckpointError)
        return info

    def first_valid(self, which, action):
        candidates = self.candidates(which)
        rejected = []
        for path in candidates:
            try:
                return action(self.inspect(path))
            except CheckpointError as exc:
                if str(which) != "latest":
                    raise
                rejected.append(f"{path.name}: {exc}")
                if self.comm.rank == 0:
                    warnings.warn(f"skipping checkpoint {path}: {exc}", CheckpointWarning, stacklevel=3)
        if not candidates:
            raise agreed_error(f"no checkpoint found in {self.directory} (expected ckpt_NNNNNNNNN directories); "
                               "run without --restart to start from the beginning")
        incompatible = ""
        if self.incompatible:
            incompatible = (f"\nskipped, other configuration: {identity.summarize(self.incompatible)}\n"
                            + self.differences_text())
        raise agreed_error(f"no valid checkpoint in {self.directory}:\n  " + "\n  ".join(rejected) + incompatible)
