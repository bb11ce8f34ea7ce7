"""Append-only spill files: rows the database could not take yet, replayed in order later."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ACTIVE = "spill.jsonl"
REPLAY_GLOB = "spill-*.replay.jsonl"


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"$dt": value.isoformat()}
    return str(value)


def _decode(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and "$dt" in obj:
        return datetime.fromisoformat(obj["$dt"])
    return obj


def dumps(table: str, row: dict[str, Any]) -> str:
    """One spill line. Datetimes round-trip; anything else JSON cannot hold becomes its str()."""
    return json.dumps({"table": table, "row": row}, default=_encode, allow_nan=True)


def loads(line: str) -> tuple[str, dict[str, Any]]:
    record = json.loads(line, object_hook=_decode)
    return record["table"], record["row"]


@dataclass(frozen=True)
class SpilledLine:
    table: str | None
    row: dict[str, Any] | None
    end_offset: int
    line_no: int
    raw: str


class SpillDir:
    """The spill directory: one active file appended to, and frozen files waiting for replay.

    Appends are thread-safe. ``freeze()`` renames the active file so that replay reads a file
    nobody writes to; progress through a frozen file is kept in a ``.offset`` sidecar, so a
    replay cut short by an outage or a crash resumes where it stopped.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fh: Any = None

    def append(self, table: str, row: dict[str, Any]) -> None:
        line = dumps(table, row) + "\n"
        with self._lock:
            if self._fh is None:
                self.path.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path / ACTIVE, "a", encoding="utf-8")  # noqa: SIM115
            self._fh.write(line)
            self._fh.flush()

    def freeze(self) -> None:
        """Close the active file and queue it for replay; later appends start a new one."""
        with self._lock:
            self._close_locked()
            active = self.path / ACTIVE
            if active.exists() and active.stat().st_size > 0:
                active.rename(self.path / f"spill-{time.time_ns()}.replay.jsonl")

    def pending(self) -> list[Path]:
        """Frozen files waiting for replay, oldest first."""
        if not self.path.exists():
            return []
        return sorted(self.path.glob(REPLAY_GLOB))

    def has_rows(self) -> bool:
        active = self.path / ACTIVE
        return bool(self.pending()) or (active.exists() and active.stat().st_size > 0)

    @staticmethod
    def read(file: Path) -> Iterator[SpilledLine]:
        """Lines not yet replayed. A line that does not parse comes back with table None."""
        start = _read_offset(file)
        with open(file, "rb") as fh:
            fh.seek(start)
            offset = start
            for line_no, raw in enumerate(fh, start=1):
                offset += len(raw)
                text = raw.decode("utf-8", errors="replace").strip()
                if not text:
                    continue
                try:
                    table, row = loads(text)
                except (ValueError, KeyError, TypeError):
                    yield SpilledLine(None, None, offset, line_no, text)
                    continue
                yield SpilledLine(table, row, offset, line_no, text)

    @staticmethod
    def mark(file: Path, offset: int) -> None:
        sidecar = file.with_suffix(".offset")
        tmp = sidecar.with_suffix(".offset.tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, sidecar)

    @staticmethod
    def done(file: Path) -> None:
        file.unlink(missing_ok=True)
        file.with_suffix(".offset").unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None


def _read_offset(file: Path) -> int:
    sidecar = file.with_suffix(".offset")
    try:
        return int(sidecar.read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0
