"""Checkpoints of the learned state: corrector, latency models and controller, in one file.

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

FORMAT = 1


@dataclass
class Checkpoint:
    saved_at: float  # wall-clock seconds
    corrector: Any
    latency: dict[str, Any]
    controller: Any
    model_version: str | None = None
    clock_offset: float = 0.0  # wall - monotonic of the process that saved it
    format: int = FORMAT


def save(path: Path, checkpoint: Checkpoint) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(checkpoint, fh, protocol=pickle.HIGHEST_PROTOCOL)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load(path: Path) -> Checkpoint | None:
    """The checkpoint at ``path``; None when there is none or it cannot be used."""
    if not path.exists():
        return None
    try:
        with open(path, "rb") as fh:
            checkpoint = pickle.load(fh)  # our own file in our own data directory
    except Exception as exc:
        log.warning("checkpoint %s unreadable, starting fresh: %s", path, exc)
        return None
    if not isinstance(checkpoint, Checkpoint) or checkpoint.format != FORMAT:
        log.warning("checkpoint %s has an unknown format, starting fresh", path)
        return None
    log.info("restored checkpoint %s (%.0f s old)", path, time.time() - checkpoint.saved_at)
    return checkpoint
