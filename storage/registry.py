"""The model registry: every trained length model as a row of ``model_versions``."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, insert, select, update

from steersman.storage.models import ModelVersionRow


def new_version(created: datetime, kind: str = "roberta") -> str:
    """A unique, time-ordered version name, e.g. roberta-20261130-031500-1a2b3c4d."""
    return f"{kind}-{created:%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:8]}"


def register_model_version(engine: Engine, row: dict[str, Any]) -> None:
    with engine.begin() as conn:
        conn.execute(insert(ModelVersionRow), [row])


def model_versions(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        result = conn.execute(select(ModelVersionRow.__table__).order_by(ModelVersionRow.id))
        return [dict(r._mapping) for r in result]


def set_status(engine: Engine, version: str, status: str, promoted_at: Any = None) -> None:
    """Mark a version promoted, rejected or retired."""
    values: dict[str, Any] = {"status": status}
    if promoted_at is not None:
        values["promoted_at"] = promoted_at
    with engine.begin() as conn:
        conn.execute(
            update(ModelVersionRow).where(ModelVersionRow.version == version).values(**values)
        )
