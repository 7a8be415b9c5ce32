"""A stored batch body as the worker reads it: decoded once by msgspec into structs.

The body was validated in full when it was accepted (apps.ingest.validation), so this
decoder checks only the shape the worker relies on, and ignores fields it does not store
(a newer agent's extras). Samples become small structs, not dicts: decoding 1,000 of them
costs about half of what `orjson.loads` into dicts did, and the samples are read by
attribute into columns (apps.telemetry.columns). Steps, events and node info stay plain
dicts, as their services take them. A body this cannot decode fails the batch for a
permanent reason: it is quarantined with the decoder's message.
"""

from __future__ import annotations

from typing import Any

import msgspec

from apps.telemetry.columns import Sample


class StoredBatch(msgspec.Struct, gc=False):
    node: str
    run: str | None = None
    node_info: dict[str, Any] | None = None
    samples: list[Sample] = []
    steps: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []


_DECODER = msgspec.json.Decoder(StoredBatch)


def stored_batch_decode(body: bytes) -> StoredBatch:
    """The stored JSON body as a StoredBatch; raises msgspec.ValidationError or DecodeError
    (ValueErrors) for one that is not a batch."""
    return _DECODER.decode(body)


def stored_batch_from(body: dict[str, Any]) -> StoredBatch:
    """The same from a body already parsed into Python objects."""
    return msgspec.convert(body, StoredBatch)
