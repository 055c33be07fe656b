"""The rank <-> supervisor protocol: framed, versioned messages that carry their call id.

Each message is one ``Connection.send_bytes`` frame (length-prefixed by multiprocessing)
holding a pickled tuple ``(MAGIC, VERSION, kind, call_id, payload)``. The supervisor accepts a
reply only if it decodes to that shape, with this version, a known kind and the call id it is
waiting for. Anything else — a garbled frame, a reply to an older call, a foreign object —
is a protocol error, and the world that sent it is replaced: a rank that said something it
should not have cannot be trusted to answer the next check correctly.

Kinds: supervisor -> rank ``call`` (payload ``(fn, args, kwargs)``) and ``stop``;
rank -> supervisor ``ready`` (pid), ``failed`` (RankError, during start) and ``result``
(RankResult of ``call_id``).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

MAGIC = "ddp-conformance"
VERSION = 1
NO_CALL = -1  # the call id of messages that answer no call (ready, failed, stop)
KINDS = frozenset({"call", "stop", "ready", "failed", "result"})


class ProtocolError(Exception):
    """A frame that is not a well-formed message of this protocol version."""


@dataclass(frozen=True, slots=True)
class Message:
    kind: str
    call_id: int
    payload: Any = None


def encode(kind: str, call_id: int = NO_CALL, payload: Any = None) -> bytes:
    return pickle.dumps((MAGIC, VERSION, kind, call_id, payload))


def decode(frame: bytes) -> Message:
    """The message in ``frame``, or ProtocolError saying what is wrong with it."""
    try:
        data = pickle.loads(frame)
    except Exception as exc:  # any unpickling failure is a garbled frame
        raise ProtocolError(f"undecodable frame of {len(frame)} bytes ({type(exc).__name__}: {exc})") from None
    if not (isinstance(data, tuple) and len(data) == 5 and data[0] == MAGIC):
        raise ProtocolError(f"not a message of this protocol: {repr(data)[:120]}")
    _, version, kind, call_id, payload = data
    if version != VERSION:
        raise ProtocolError(f"protocol version {version!r}, expected {VERSION}")
    if kind not in KINDS or not isinstance(call_id, int):
        raise ProtocolError(f"unknown message kind {kind!r} or call id {call_id!r}")
    return Message(kind, call_id, payload)
