"""The durable on-disk spool: a batch is on disk before it is sent, and leaves only when the
server has it.

Layout: one file per batch, `<seq>.batch` (12-digit sequence number, oldest first), holding
the exact JSON body that will be POSTed, so a retry — even by the next process after a
crash — sends the same body with the same batch_id. A batch is written to a `.tmp-` file,
fsynced, renamed into place and the directory fsynced: a crash at any point leaves either
the whole batch or no batch visible, never half of one (stale `.tmp-` files are deleted on
open). A `lock` file (flock) keeps two processes from sharing a spool.

The spool is bounded by bytes: at the cap the oldest batches are dropped and counted in
`dropped` (newer telemetry is worth more than older when something must go), all but the
one being sent: a batch counted as dropped is never delivered.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".batch"
TMP_PREFIX = ".tmp-"
JOURNAL = "journal"


class SpoolLocked(RuntimeError):
    """Another live process holds this spool directory."""


@dataclass(frozen=True)
class Entry:
    seq: int
    batch_id: str
    body: bytes


class Spool:
    """A bounded FIFO of batches on disk; thread-safe (one producer, one sender).

    With `journal=True` every batch_id is also appended to `journal` once its batch is
    durable (an audit trail of what this spool ever held; tests compare it with what the
    server stored)."""

    def __init__(self, directory: str | Path, *, max_bytes: int, journal: bool = False) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped = 0
        self._sending: int | None = None  # the seq of the batch being sent (`sending`)
        self._lock = threading.Lock()
        self._lock_file = open(self.directory / "lock", "a")  # noqa: SIM115 - held open
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock_file.close()
            raise SpoolLocked(f"spool {self.directory} is in use by another process") from exc
        for stale in self.directory.glob(TMP_PREFIX + "*"):
            stale.unlink(missing_ok=True)  # a crash before rename: never became a batch
        self._entries: dict[int, int] = {}  # seq → size, insertion order = age
        for path in sorted(self.directory.glob("*" + SUFFIX)):
            if path.stem.isdigit():
                self._entries[int(path.stem)] = path.stat().st_size
        self._bytes = sum(self._entries.values())
        self._next = max(self._entries, default=0) + 1
        self._journal = self.directory / JOURNAL if journal else None
        if self._journal is not None:
            self._reconcile_journal()
        if self._entries:
            log.info(
                "spool %s: %d batches (%d bytes) left from before",
                self.directory,
                len(self._entries),
                self._bytes,
            )

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:012d}{SUFFIX}"

    def put(self, batch_id: str, body: bytes) -> int:
        """Store one batch durably; returns its sequence number. When the spool would go
        over `max_bytes`, the oldest batches are dropped first, but for the one being sent
        (a batch bigger than the whole cap is still kept, alone or beside that one)."""
        with self._lock:
            while self._bytes + len(body) > self.max_bytes:
                # never the batch on the wire: it may be delivered yet, and would then be
                # counted as dropped and stored both (the next oldest goes instead)
                oldest = next((seq for seq in self._entries if seq != self._sending), None)
                if oldest is None:
                    break
                self._discard(oldest)
                self.dropped += 1
                if _worth_logging(self.dropped):
                    log.warning(
                        "spool full (%d bytes): %d oldest batches dropped so far",
                        self.max_bytes,
                        self.dropped,
                    )
            seq = self._next
            self._next += 1
            tmp = self._write_tmp(seq, body)
            self._publish(tmp, self._path(seq))
            self._entries[seq] = len(body)
            self._bytes += len(body)
            if self._journal is not None:
                self._append_journal([batch_id])
        return seq

    def _write_tmp(self, seq: int, body: bytes) -> Path:
        tmp = self.directory / f"{TMP_PREFIX}{seq:012d}"
        with open(tmp, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def _publish(self, tmp: Path, final: Path) -> None:
        os.replace(tmp, final)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def oldest(self) -> Entry | None:
        """The oldest batch still spooled, or None. An unreadable file is dropped (and
        counted) rather than blocking everything behind it."""
        while True:
            with self._lock:
                if not self._entries:
                    return None
                seq = next(iter(self._entries))
                try:
                    body = self._path(seq).read_bytes()
                    batch_id = _batch_id(body)
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.error("spool: dropping unreadable batch %d: %s", seq, exc)
                    self._discard(seq)
                    self.dropped += 1
                    continue
                return Entry(seq, batch_id, body)

    @contextmanager
    def sending(self, seq: int) -> Iterator[None]:
        """While the batch `seq` is on the wire, the cap drops others, never it."""
        with self._lock:
            self._sending = seq
        try:
            yield
        finally:
            with self._lock:
                self._sending = None

    def remove(self, seq: int) -> None:
        """Forget a delivered (or rejected) batch. Removing one already dropped is a no-op.
        No directory fsync: a removal lost in a crash only resends the batch, which the
        server answers as a duplicate."""
        with self._lock:
            self._discard(seq)

    def _discard(self, seq: int) -> None:
        size = self._entries.pop(seq, None)
        if size is not None:
            self._bytes -= size
            self._path(seq).unlink(missing_ok=True)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def batch_ids(self) -> list[str]:
        """The batch_ids now spooled, oldest first (reads every file: for tests and tools)."""
        with self._lock:
            seqs = list(self._entries)
        ids = []
        for seq in seqs:
            try:
                ids.append(str(json.loads(self._path(seq).read_bytes())["batch_id"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # unreadable: oldest() drops it when its turn comes
        return ids

    def journal_ids(self) -> list[str]:
        if self._journal is None or not self._journal.exists():
            return []
        return self._journal.read_text().split()

    def _append_journal(self, batch_ids: list[str]) -> None:
        assert self._journal is not None
        with open(self._journal, "a") as handle:
            handle.write("".join(f"{batch_id}\n" for batch_id in batch_ids))
            handle.flush()
            os.fsync(handle.fileno())

    def _reconcile_journal(self) -> None:
        # A crash between a batch's rename and its journal line leaves a durable batch that
        # the journal does not name yet; it is still here (it cannot have been sent), so
        # add it now. Counted as a multiset: a batch_id may be spooled again (an agent that
        # restarts and rebuilds a batch), and each durable copy needs its own line.
        unjournaled = Counter(self.batch_ids()) - Counter(self.journal_ids())
        missing = list(unjournaled.elements())
        if missing:
            self._append_journal(missing)

    def close(self) -> None:
        """Release the directory lock; the spool is not used afterwards."""
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()


_BATCH_ID_HEAD = b'{"batch_id":"'


def _batch_id(body: bytes) -> str:
    """The batch_id of a spooled body. The shipper writes it first, so it is read from the
    head: decoding a node's 300 kB batch once a second only for its id cost more CPU than
    building it."""
    if body.startswith(_BATCH_ID_HEAD):
        text = body[:4096].decode("utf-8", "replace")
        try:
            # public in CPython's json.decoder, missing from typeshed
            return json.decoder.scanstring(text, len(_BATCH_ID_HEAD))[0]  # type: ignore[attr-defined]
        except ValueError:
            pass
    return str(json.loads(body)["batch_id"])


def _worth_logging(count: int) -> bool:
    """1, 10, 100, ... then every 10,000th: a long outage should not flood the log."""
    return count % 10_000 == 0 or (count < 10_000 and str(count).rstrip("0") == "1")
