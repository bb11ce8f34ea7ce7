"""The history writer: the hot path hands rows to a bounded queue; a thread inserts them in batches.

The database may go away at any time. A batch the database cannot take goes at once to an
append-only spill file (so a crash of this process cannot lose it), and so do the rows after it
until the spill has been replayed, with exponential back-off, when the database answers again,
and on the next start; rows keep their order. A row the database refuses for
good (a constraint, a bad value) is isolated by bisecting its batch and kept in a dead-letter
file with the reason, so one bad row never blocks the rest and nothing is silently dropped.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from steersman.storage.bulk import BulkInsert
from steersman.storage.models import TABLES
from steersman.storage.spill import SpillDir, dumps

log = logging.getLogger(__name__)

Row = tuple[str, dict[str, Any]]
_TRANSIENT = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)
_DRIVER_TRANSIENT = {"OperationalError", "InterfaceError"}


def is_transient(exc: BaseException) -> bool:
    """Errors that mean 'the database is not there right now', not 'this row is wrong'.

    Both SQLAlchemy's wrappers and bare driver errors count: PEP 249 names the classes
    (OperationalError, InterfaceError) the same in sqlite3 and psycopg.
    """
    if isinstance(exc, _TRANSIENT):
        return True
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated
    return any(cls.__name__ in _DRIVER_TRANSIENT for cls in type(exc).__mro__)


@dataclass
class WriterStats:
    submitted: int = 0
    written: int = 0
    spilled: int = 0
    replayed: int = 0
    rejected: int = 0
    lost: int = 0
    retries: int = 0
    batches: int = 0


class HistoryWriter:
    """Batched, non-blocking, outage-proof writer of history rows.

    ``submit`` never blocks on the database and never raises. ``flush`` waits until every row
    submitted so far is in the database. ``close`` flushes, and spills what the database still
    cannot take when its deadline passes.
    """

    def __init__(
        self,
        engine: Engine,
        spill_dir: Path,
        *,
        batch_size: int = 500,
        flush_interval_s: float = 0.2,
        queue_size: int = 20_000,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.spill = SpillDir(spill_dir)
        self.dead_letter = spill_dir / "rejected.jsonl"
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.stats = WriterStats()
        self._clock = clock
        self._queue: queue.Queue[Row] = queue.Queue(maxsize=queue_size)
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._outstanding = 0  # rows taken into the queue and not yet written, refused or spilled
        self._replay_delay = retry_initial_s
        self._next_replay = 0.0
        self._stopping = False
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None
        self._insert = BulkInsert(engine)

    # -- the hot path -------------------------------------------------------------------------

    def submit(self, table: str, row: dict[str, Any]) -> None:
        """Hand a row over. Never blocks on the database, never raises."""
        with self._idle:
            self.stats.submitted += 1
            try:
                self._queue.put_nowait((table, row))
                self._outstanding += 1
                return
            except queue.Full:
                pass
        self._spill([(table, row)])

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> HistoryWriter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
            self._thread.start()
        return self

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted, spilled rows included, is in the database."""
        end = None if timeout is None else self._clock() + timeout
        with self._idle:
            while not self._is_idle():
                self._wake.set()
                left = None if end is None else end - self._clock()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(0.05 if left is None else min(left, 0.05))
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued; after ``timeout`` spill whatever the database did not take."""
        self._deadline = self._clock() + timeout
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        else:
            self._drain_to_spill()
        self.spill.close()

    def __enter__(self) -> HistoryWriter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the writer thread --------------------------------------------------------------------

    def _is_idle(self) -> bool:
        return self._outstanding == 0 and not self.spill.has_rows()

    def _settle(self, count: int) -> None:
        with self._idle:
            self._outstanding -= count
            self._idle.notify_all()

    def _run(self) -> None:
        self._replay()
        while True:
            batch = self._take_batch()
            if batch:
                if self.spill.has_rows():
                    # An outage, or its backlog, is in progress: rows join the spill, in order.
                    self._spill(batch)
                else:
                    self._write_or_spill(batch)
                self._settle(len(batch))
            if self.spill.has_rows() and self._clock() >= self._next_replay:
                self._replay()
            with self._idle:
                self._idle.notify_all()
            if self._stopping and self._queue.empty():
                break
        self._drain_to_spill()

    def _take_batch(self) -> list[Row]:
        try:
            first = self._queue.get(timeout=self.flush_interval_s)
        except queue.Empty:
            return []
        batch = [first]
        until = self._clock() + self.flush_interval_s
        while len(batch) < self.batch_size:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                if self._stopping or self._wake.is_set() or self._clock() >= until:
                    break
                self._wake.wait(min(0.01, max(0.0, until - self._clock())))
        self._wake.clear()
        return batch

    def _past_deadline(self) -> bool:
        return self._stopping and self._clock() >= self._deadline

    def _write_or_spill(self, batch: list[Row]) -> None:
        """Write a batch; if the database is not there, spill it at once. Rows that wait for a
        database wait on disk, where a crash of this process cannot take them; the replay
        retries with back-off."""
        try:
            self._write(batch)
        except Exception as exc:
            if not is_transient(exc):
                self._isolate(batch, exc)
                return
            self.stats.retries += 1
            log.warning("history database unavailable, spilling %d row(s): %s", len(batch), exc)
            self._spill(batch)
            self._next_replay = self._clock() + self._replay_delay
            return
        self.stats.written += len(batch)

    def _write(self, batch: Iterable[Row]) -> None:
        groups: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}
        for table, row in batch:
            groups.setdefault((table, tuple(row)), []).append(row)
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            for (table, keys), rows in groups.items():
                target = TABLES[table]
                if unknown := set(keys) - set(target.columns.keys()):
                    raise ValueError(f"{table} has no column(s) {', '.join(sorted(unknown))}")
                self._insert.run(cursor, target, keys, rows)
            cursor.close()
            raw.commit()
        except BaseException:
            try:
                raw.rollback()
            except Exception:
                raw.invalidate()  # the connection died with the database; never reuse it
            raise
        finally:
            raw.close()
        self.stats.batches += 1

    def _isolate(self, batch: list[Row], exc: BaseException) -> None:
        """Bisect a refused batch down to the rows the database refuses, and keep those aside."""
        if len(batch) == 1:
            self._reject(batch[0], exc)
            return
        mid = len(batch) // 2
        for half in (batch[:mid], batch[mid:]):
            try:
                self._write(half)
                self.stats.written += len(half)
            except Exception as inner:
                if is_transient(inner):
                    self._write_or_spill(half)
                else:
                    self._isolate(half, inner)

    def _reject(self, item: Row, exc: BaseException) -> None:
        table, row = item
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:500]
        log.error("history row refused by the database (kept in %s): %s", self.dead_letter, reason)
        self.stats.rejected += 1
        try:
            self.dead_letter.parent.mkdir(parents=True, exist_ok=True)
            with open(self.dead_letter, "a", encoding="utf-8") as fh:
                record = json.loads(dumps(table, row))
                fh.write(json.dumps({**record, "reason": reason}) + "\n")
        except (OSError, ValueError):
            self.stats.lost += 1
            log.exception("could not keep a refused history row")

    def _drain_queue(self) -> list[Row]:
        rows: list[Row] = []
        while True:
            try:
                rows.append(self._queue.get_nowait())
            except queue.Empty:
                return rows

    def _drain_to_spill(self) -> None:
        rest = self._drain_queue()
        if rest:
            self._spill(rest)
            self._settle(len(rest))

    def _spill(self, rows: list[Row]) -> None:
        for table, row in rows:
            try:
                self.spill.append(table, row)
                self.stats.spilled += 1
            except OSError:
                self.stats.lost += 1
                log.exception("could not spill a history row")

    def _replay(self) -> None:
        """Insert spilled rows in order; stop at the first outage and resume from there later."""
        if self._past_deadline():
            return
        self.spill.freeze()
        for file in self.spill.pending():
            batch: list[Row] = []
            end = 0
            for line in SpillDir.read(file):
                if line.table is None or line.row is None:
                    self._reject(
                        ("?", {"raw": line.raw}), ValueError(f"unreadable line {line.line_no}")
                    )
                    continue
                batch.append((line.table, line.row))
                end = line.end_offset
                if len(batch) >= self.batch_size:
                    if not self._replay_batch(file, batch, end):
                        return
                    batch = []
            if batch and not self._replay_batch(file, batch, end):
                return
            SpillDir.done(file)

    def _replay_batch(self, file: Path, batch: list[Row], end: int) -> bool:
        try:
            self._write(batch)
        except Exception as exc:
            if is_transient(exc):
                self.stats.retries += 1
                self._next_replay = self._clock() + self._replay_delay
                self._replay_delay = min(self._replay_delay * 2, self.retry_max_s)
                return False
            self._isolate(batch, exc)
        else:
            self.stats.replayed += len(batch)
            self._replay_delay = self.retry_initial_s
        SpillDir.mark(file, end)
        return True
