"""Replicas' checkpoints in the shared history: the newest of any replica, a few kept of each."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from steersman.storage.checkpoints import KEEP, latest_checkpoint, save_checkpoint
from steersman.storage.models import CheckpointRow

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_the_newest_of_any_replica_is_where_a_replica_starts(engine):
    assert latest_checkpoint(engine) is None
    for k in range(KEEP + 3):
        save_checkpoint(engine, "a", T0 + timedelta(seconds=k), f"a{k}".encode())
    save_checkpoint(engine, "b", T0 + timedelta(seconds=1.5), b"b0")
    saved, replica, state = latest_checkpoint(engine)
    assert (saved, replica, state) == (
        T0 + timedelta(seconds=KEEP + 2),
        "a",
        f"a{KEEP + 2}".encode(),
    )
    save_checkpoint(engine, "b", T0 + timedelta(seconds=60), b"b1")
    assert latest_checkpoint(engine)[1:] == ("b", b"b1")
    with engine.connect() as conn:
        per_replica = dict(
            conn.execute(
                select(CheckpointRow.replica, func.count()).group_by(CheckpointRow.replica)
            ).all()
        )
    assert per_replica == {"a": KEEP, "b": 2}
