"""Request bodies for glassbox's `POST /v1/classify`, one text per request, built once before a run.

The frames encoding is written out here rather than imported from `glassbox.service.wire`: the load generator is a
client and speaks the documented wire format (docs/api.md) the way any other client would; a test checks that
the server's own decoder reads what this writes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Protocol = Literal["json", "frames"]
PROTOCOLS: tuple[Protocol, ...] = ("json", "frames")

CLASSIFY_PATH = "/v1/classify"
JSON_CONTENT_TYPE = "application/json"
FRAMES_CONTENT_TYPE = "application/x-glassbox-frames"
_LENGTH = struct.Struct("<I")  # u32 little-endian text length
_USER_ID = struct.Struct("<Q")  # u64 little-endian user id


@dataclass(frozen=True, slots=True)
class Bodies:
    path: str
    content_type: str
    bodies: tuple[bytes, ...]

    def __getitem__(self, index: int) -> bytes:
        return self.bodies[index % len(self.bodies)]


def frame(text: str, user_id: int) -> bytes:
    data = text.encode("utf-8")
    return _LENGTH.pack(len(data)) + data + _USER_ID.pack(user_id)


def build_bodies(texts: Sequence[str], protocol: Protocol) -> Bodies:
    if not texts:
        raise ValueError("no texts to send")
    if protocol == "json":
        return Bodies(CLASSIFY_PATH, JSON_CONTENT_TYPE,
                      tuple(json.dumps({"text": text}, ensure_ascii=False).encode("utf-8") for text in texts))
    if protocol == "frames":
        # One frame per request; the user id only has to be unique within a body.
        return Bodies(CLASSIFY_PATH, FRAMES_CONTENT_TYPE, tuple(frame(text, i) for i, text in enumerate(texts)))
    raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
