"""Records → batches → spool → sender: the one path every record takes to the server.

`add` only appends to an in-memory buffer under a lock, so producers (a training step, a
collect tick) never wait on the disk or the network. `flush` turns the buffer into batches
with fresh batch_ids and spools them (fsync); it runs on the caller's thread (the node
agent, once per tick) or on a background flusher (the training reporter). Records still in
the buffer when the process is killed are lost; everything flushed is not.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opsboard_agent.records import EncodedSamples, Event, Sample, Step, sample
from opsboard_agent.sender import Sender
from opsboard_agent.spool import Spool

log = logging.getLogger(__name__)

MAX_RECORDS = 5000  # per batch; the server's limit is 20,000 and 8 MiB


class Shipper:
    """Builds contract batches for one node (and, for a training job, one run)."""

    def __init__(
        self,
        *,
        spool: Spool,
        sender: Sender | None,
        node: str,
        run: str | None = None,
        node_info: dict[str, Any] | None = None,
        max_records: int = MAX_RECORDS,
    ) -> None:
        self.spool, self.sender = spool, sender
        self.node, self.run, self.node_info = node, run, node_info
        self.max_records = max_records
        # Unique per process start: batch_ids never repeat across restarts, even when the
        # spool was emptied in between (a repeated id would be dropped as a duplicate).
        self.instance = f"{int(time.time())}-{secrets.token_hex(3)}"
        self._count = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._samples: list[Sample] = []
        self._steps: list[Step] = []
        self._events: list[Event] = []
        self._encoded: list[EncodedSamples] = []
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()

    def add(
        self,
        samples: Iterable[Sample] = (),
        steps: Iterable[Step] = (),
        events: Iterable[Event] = (),
        encoded: Iterable[EncodedSamples] = (),
    ) -> None:
        with self._lock:
            self._samples.extend(samples)
            self._steps.extend(steps)
            self._events.extend(events)
            self._encoded.extend(encoded)

    def pending(self) -> int:
        with self._lock:
            encoded = sum(chunk.count for chunk in self._encoded)
            return len(self._samples) + len(self._steps) + len(self._events) + encoded

    def flush(self) -> list[str]:
        """Spool everything buffered; returns the new batch_ids (none when empty). The
        agent's own counters ride along with any batch that carries data."""
        with self._flush_lock:
            with self._lock:
                samples, self._samples = self._samples, []
                steps, self._steps = self._steps, []
                events, self._events = self._events, []
                encoded, self._encoded = self._encoded, []
            if not (samples or steps or events or encoded):
                return []
            samples.extend(self._self_metrics(time.time()))
            if encoded:
                # One batch a tick: the few dict samples join the encoded ones.
                text = json.dumps(samples, separators=(",", ":"), allow_nan=False)[1:-1]
                encoded.insert(0, EncodedSamples(text, len(samples)))
                samples = []
            ids = []
            records = (
                [("samples", r) for r in samples]
                + [("steps", r) for r in steps]
                + [("events", r) for r in events]
            )
            extra: Sequence[tuple[str, Mapping[str, Any]]] = []
            if encoded and len(records) < self.max_records - encoded[0].count:
                extra, records = records, []  # this tick's events ride with its samples
            for start in range(0, len(records), self.max_records):
                ids.append(self._spool_batch(records[start : start + self.max_records]))
            # Encoded chunks (a scrape target's tick each) go whole, as many to a batch as fit.
            while encoded:
                size, count = 1, encoded[0].count
                while size < len(encoded) and count + encoded[size].count <= self.max_records:
                    count += encoded[size].count
                    size += 1
                ids.append(self._spool_encoded(encoded[:size], extra))
                encoded, extra = encoded[size:], []
            if self.sender is not None:
                self.sender.notify()
            return ids

    def _new_batch(self, records: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
        """A batch with a fresh id, this node's identity and `records` (steps, events)."""
        self._count += 1
        batch_id = f"{self.node[:96]}/{self.instance}/{self._count}"
        batch: dict[str, Any] = {"batch_id": batch_id, "node": self.node}
        if self.node_info:
            batch["node_info"] = self.node_info
        for key, record in records:
            batch.setdefault(key, []).append(record)
        if self.run is not None and (batch.get("steps") or batch.get("events")):
            batch["run"] = self.run
        return batch

    def _spool_batch(self, records: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        batch = self._new_batch(records)
        body = json.dumps(batch, separators=(",", ":"), allow_nan=False).encode()
        self.spool.put(batch["batch_id"], body)
        return str(batch["batch_id"])

    def _spool_encoded(
        self, chunks: Sequence[EncodedSamples], records: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> str:
        """A batch of samples that are already JSON (spliced in, not decoded again), with
        `records` (steps, events) as in `_spool_batch`."""
        batch = self._new_batch(records)
        head = json.dumps(batch, separators=(",", ":"), allow_nan=False)
        samples = ",".join(chunk.text for chunk in chunks)
        self.spool.put(batch["batch_id"], f'{head[:-1]},"samples":[{samples}]}}'.encode())
        return str(batch["batch_id"])

    def _self_metrics(self, now: float) -> list[Sample]:
        values = {"agent.spool_dropped_batches": self.spool.dropped}
        if self.sender is not None:
            values["agent.rejected_batches"] = self.sender.stats.rejected
        return [s for metric, value in values.items() if (s := sample(now, metric, value))]

    def start(self, flush_interval: float | None = None) -> Shipper:
        """Start the sender, and a background flusher when `flush_interval` is given."""
        if self.sender is not None:
            self.sender.start()
        if flush_interval:
            self._flusher = threading.Thread(
                target=self._flush_loop,
                args=(flush_interval,),
                name="opsboard-flusher",
                daemon=True,
            )
            self._flusher.start()
        return self

    def _flush_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.flush()
            except Exception:  # a full disk must not kill the training job's reporter
                log.exception("flushing records to the spool failed")

    def close(self, drain_timeout: float = 5.0) -> None:
        """Flush what is buffered, deliver for up to `drain_timeout` s, release the spool."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        try:
            self.flush()
        except OSError:
            log.exception("final flush to the spool failed")
        if self.sender is not None:
            self.sender.stop(drain_timeout)
        self.spool.close()
