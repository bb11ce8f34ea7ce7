"""Learned state shared through the history: each replica's latest checkpoint, as bytes."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine, delete, insert, select

from steersman.storage.models import CheckpointRow

KEEP = 3  # per replica: the newest few, so a half-written one never leaves none


def save_checkpoint(engine: Engine, replica: str, saved_at: datetime, state: bytes) -> None:
    """Store ``state`` as ``replica``'s newest checkpoint; older ones beyond ``KEEP`` go."""
    with engine.begin() as conn:
        row = {"saved_at": saved_at, "replica": replica, "state": state}
        conn.execute(insert(CheckpointRow), [row])
        kept = select(CheckpointRow.id).where(CheckpointRow.replica == replica)
        kept = kept.order_by(CheckpointRow.id.desc()).limit(KEEP)
        ids = [row.id for row in conn.execute(kept)]
        conn.execute(
            delete(CheckpointRow).where(
                CheckpointRow.replica == replica, CheckpointRow.id.not_in(ids)
            )
        )


def latest_checkpoint(engine: Engine) -> tuple[datetime, str, bytes] | None:
    """The newest checkpoint any replica saved: when, which replica, the bytes."""
    t = CheckpointRow
    query = select(t.saved_at, t.replica, t.state).order_by(t.saved_at.desc(), t.id.desc())
    with engine.connect() as conn:
        row = conn.execute(query.limit(1)).first()
    if row is None:
        return None
    saved = row.saved_at if row.saved_at.tzinfo else row.saved_at.replace(tzinfo=UTC)  # SQLite
    return saved, row.replica, bytes(row.state)
