"""Checkpoints of the learned state: corrector, latency models and controller, in one file (and
in the shared history, for replicas).

Written atomically (a temporary file, fsync, rename), so a crash mid-write leaves the previous
checkpoint intact. A checkpoint that cannot be read is reported and ignored: the daemon starts
fresh rather than not at all.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 2  # 2: the corrector holds a similar-prompt prior (a 1's has none)


@dataclass
class Checkpoint:
    saved_at: float  # wall-clock seconds
    corrector: Any
    latency: dict[str, Any]
    controller: Any
    model_version: str | None = None
    clock_offset: float = 0.0  # wall - monotonic of the process that saved it
    format: int = FORMAT


def dumps(checkpoint: Checkpoint) -> bytes:
    return pickle.dumps(checkpoint, protocol=pickle.HIGHEST_PROTOCOL)


def loads(state: bytes, source: str) -> Checkpoint | None:
    """A checkpoint from its bytes; None (said in the log) when it cannot be used."""
    try:
        checkpoint = pickle.loads(state)  # written by steersman: its own file, its own history
    except Exception as exc:
        log.warning("checkpoint %s unreadable, not used: %s", source, exc)
        return None
    if not isinstance(checkpoint, Checkpoint) or checkpoint.format != FORMAT:
        log.warning("checkpoint %s has an unknown format, not used", source)
        return None
    return checkpoint


def save(path: Path, checkpoint: Checkpoint) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(dumps(checkpoint))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load(path: Path) -> Checkpoint | None:
    """The checkpoint at ``path``; None when there is none or it cannot be used."""
    if not path.exists():
        return None
    checkpoint = loads(path.read_bytes(), str(path))
    if checkpoint is not None:
        log.info("checkpoint %s is %.0f s old", path, time.time() - checkpoint.saved_at)
    return checkpoint
