"""The model registry: every trained length model as a row of ``model_versions``."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, insert, select

from steersman.storage.models import ModelVersionRow


def register_model_version(engine: Engine, row: dict[str, Any]) -> None:
    with engine.begin() as conn:
        conn.execute(insert(ModelVersionRow), [row])


def model_versions(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        result = conn.execute(select(ModelVersionRow.__table__).order_by(ModelVersionRow.id))
        return [dict(r._mapping) for r in result]
