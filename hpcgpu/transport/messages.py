"""Paired point-to-point messages: what each side lists, and how the lists are matched.

A message is a contiguous buffer and the rank it goes to (a send) or comes from (a receive). Every
transport matches the messages between two ranks in the order each side lists them, separately for
each direction: the k-th send from rank a to rank b meets the k-th receive on b from a. This is NCCL's
own rule for point-to-point calls in a group; the MPI transports get the same rule by tagging the k-th
message to (or from) a peer with ``tag + k`` (:func:`message_tags`). A program that lists its messages
in a fixed order of directions is therefore correct on every transport, even when one neighbour sits on
both sides of a periodic axis.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hpcgpu.errors import ConfigurationError

#: Tags ``tag + k`` must stay below this (MPI guarantees at least 32767).
MAX_TAG = 32767


@dataclass(frozen=True)
class Message:
    """One point-to-point message.

    Attributes
    ----------
    array : numpy.ndarray or cupy.ndarray
        C-contiguous buffer: read for a send, filled for a receive. Its size must equal the size of the
        matching buffer on the peer (an empty one is skipped on both sides alike).
    peer : int
        The rank in the collectives' communicator it goes to or comes from.
    """

    array: object
    peer: int


def resolve_messages(messages) -> list[Message]:
    """``messages`` (a sequence of :class:`Message` or ``(array, peer)`` pairs) as a list of Message."""
    return [m if isinstance(m, Message) else Message(m[0], int(m[1])) for m in messages]


def message_tags(messages: list[Message], tag: int = 0) -> list[int]:
    """The MPI tag of each message: ``tag + k`` for the k-th message to (or from) the same peer.

    Raises
    ------
    ConfigurationError
        When a tag would exceed :data:`MAX_TAG`.
    """
    seen: dict[int, int] = defaultdict(int)
    tags = []
    for message in messages:
        tags.append(tag + seen[message.peer])
        seen[message.peer] += 1
    if tags and max(tags) > MAX_TAG:
        raise ConfigurationError(f"message tag {max(tags)} exceeds {MAX_TAG}; use a smaller base tag or fewer "
                                 "messages per peer")
    return tags


def check_counts(operation: str, found: int, expected: int, found_name: str, expected_name: str) -> None:
    """Raise ConfigurationError unless two element counts of a collective's buffers agree."""
    if int(found) != int(expected):
        raise ConfigurationError(f"{operation}: {found_name} holds {int(found)} elements, expected {expected_name} = "
                                 f"{int(expected)}")
