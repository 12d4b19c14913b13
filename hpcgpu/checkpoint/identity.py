"""Which run wrote a checkpoint: a run id and a configuration fingerprint.

A checkpoint directory is not owned by anyone: two runs pointed at the same ``--checkpoint-dir``
would otherwise prune and overwrite each other's checkpoints, and ``--restart latest`` would pick
whichever has the highest step. So every checkpoint records

* ``run_id``: made once when a run starts (rank 0, broadcast) and *kept across restarts*: a run
  restarted from a checkpoint continues that checkpoint's run id. It reads like
  ``20261201T153002Z-3f9a1c0e``: the start time (UTC) and 32 random bits.
* ``config_fingerprint``: SHA-256 of the canonical JSON of the options that define the model and
  the layout of its state (the grid, the physics, the precision ...), and ``config_options``,
  those options themselves, so that a refusal can say which ones differ.

Both are root attributes of the master file. Checkpoints written before they existed have neither:
they belong to the *legacy* run (``run_id`` None), still restart, and are never pruned or
overwritten by a run that has an id.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from hpcgpu.checkpoint import layout

#: Root attributes of the master file that hold the identity (absent in legacy checkpoints).
RUN_ID_ATTRIBUTE = "run_id"
FINGERPRINT_ATTRIBUTE = "config_fingerprint"
OPTIONS_ATTRIBUTE = "config_options"


def new_run_id() -> str:
    """A fresh run id: start time (UTC, seconds) and 32 random bits, e.g. ``20261201T153002Z-3f9a1c0e``."""
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{started}-{secrets.token_hex(4)}"


def canonical_options(options: dict) -> dict:
    """``options`` as plain JSON values (tuples -> lists, paths -> strings), keys sorted."""
    return json.loads(json.dumps(options, sort_keys=True, default=str))


def fingerprint(options: dict) -> str:
    """``sha256:...`` of the canonical JSON of ``options`` (a dict of JSON-able option values)."""
    text = json.dumps(canonical_options(options), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def differences(saved: dict | None, current: dict) -> list[str]:
    """Human-readable differences between a checkpoint's options and this run's, one per option."""
    if saved is None:
        return ["(the checkpoint does not record its options)"]
    current = canonical_options(current)
    found = []
    for key in sorted(set(saved) | set(current)):
        missing = object()
        old, new = saved.get(key, missing), current.get(key, missing)
        if old != new:
            old_text = "not set" if old is missing else json.dumps(old)
            new_text = "not set" if new is missing else json.dumps(new)
            found.append(f"{key}: {old_text} in the checkpoint, {new_text} in this run")
    return found


@dataclass(frozen=True)
class CheckpointOwner:
    """Who wrote one complete checkpoint directory (read from its master file's attributes).

    Attributes
    ----------
    path : Path
    step : int
    run_id : str or None
        None for a legacy checkpoint (written before run ids) or an unreadable one (``problem`` set).
    config_fingerprint : str or None
    config_options : dict or None
    created : str
        UTC ISO 8601 time of writing ("" if unknown).
    problem : str or None
        Why the master file could not be read; such a checkpoint belongs to no known run.
    """

    path: Path
    step: int
    run_id: str | None
    config_fingerprint: str | None
    config_options: dict | None
    created: str
    problem: str | None = None

    @property
    def legacy(self) -> bool:
        return self.run_id is None and self.problem is None

    @property
    def run_label(self) -> str:
        if self.problem is not None:
            return "an unreadable checkpoint"
        return "legacy checkpoints (no run id)" if self.run_id is None else f"run {self.run_id}"

    def compatible_with(self, config_fingerprint: str) -> bool:
        """True if a run with ``config_fingerprint`` may restart from it (legacy: unknown, allowed)."""
        return self.config_fingerprint is None or self.config_fingerprint == config_fingerprint

    def created_time(self) -> datetime.datetime:
        try:
            value = datetime.datetime.fromisoformat(self.created)
        except ValueError:
            return datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
        return value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_owner(directory) -> CheckpointOwner:
    """The identity of checkpoint ``directory`` (attributes of its master file only; never raises)."""
    import h5py

    directory = Path(directory)
    step = layout.step_of(directory.name)
    step = -1 if step is None else step
    try:
        with h5py.File(directory / layout.MASTER_FILE, "r") as handle:
            attrs = handle.attrs
            run_id = _text(attrs[RUN_ID_ATTRIBUTE]) if RUN_ID_ATTRIBUTE in attrs else None
            config_fingerprint = _text(attrs[FINGERPRINT_ATTRIBUTE]) if FINGERPRINT_ATTRIBUTE in attrs else None
            options = json.loads(_text(attrs[OPTIONS_ATTRIBUTE])) if OPTIONS_ATTRIBUTE in attrs else None
            created = _text(attrs.get("created", ""))
    except (OSError, KeyError, ValueError, TypeError) as exc:
        return CheckpointOwner(directory, step, None, None, None, "", problem=f"{type(exc).__name__}: {exc}")
    return CheckpointOwner(directory, step, run_id, config_fingerprint, options, created)


def owned_by(directory, run_id: str | None) -> bool:
    """True if checkpoint ``directory`` was written by run ``run_id`` (never for an unreadable one)."""
    owner = read_owner(directory)
    return owner.problem is None and owner.run_id == run_id


def summarize(owners) -> str:
    """``run A (steps 10, 20); legacy checkpoints (no run id) (steps 5)``: who holds which steps."""
    groups: dict[str, list[int]] = {}
    for owner in owners:
        groups.setdefault(owner.run_label, []).append(owner.step)
    return "; ".join(f"{label} (step{'s' if len(steps) > 1 else ''} {', '.join(map(str, sorted(steps)))})"
                     for label, steps in groups.items())


def refuse_overwrite_message(final: Path, owner: CheckpointOwner, run_id: str) -> str:
    """Why a run does not save over checkpoint ``final`` (another run's, a legacy or unreadable one)."""
    if owner.problem is not None:
        holder = f"unreadable checkpoint ({owner.problem})"
    elif owner.run_id is None:
        holder = "checkpoint of a legacy run (written before run ids)"
    else:
        holder = f"checkpoint of run {owner.run_id}"
    return (f"{final} already holds a {holder}; this run ({run_id}) never "
            "overwrites or deletes another run's checkpoint. Use another checkpoint directory for this "
            "run, or move that checkpoint away")

