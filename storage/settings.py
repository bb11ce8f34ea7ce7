"""Settings of the storage layer, a branch of the one settings tree built at the entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# Resolved where the settings are built, before anything changes directory.
AbsolutePath = Annotated[Path, AfterValidator(lambda p: p.expanduser().absolute())]


class StorageSettings(BaseModel):
    """Where the SQL history lives and how the writer batches, retries and spills."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    url: str | None = Field(
        default=None,
        description=(
            "SQLAlchemy database URL. Empty means SQLite at <data_dir>/steersman.db. "
            "PostgreSQL: postgresql://user:password@host:5432/dbname (driver psycopg 3)."
        ),
    )
    sqlite_busy_timeout_ms: int = Field(
        default=5000, ge=0, description="How long SQLite waits on a locked database per attempt."
    )
    batch_size: int = Field(
        default=500,
        ge=1,
        le=100_000,
        description="Most rows the writer inserts in one transaction.",
    )
    flush_interval_s: float = Field(
        default=0.2, gt=0, le=60, description="Longest a submitted row waits before it is written."
    )
    queue_size: int = Field(
        default=20_000,
        ge=1,
        description="Rows held in memory for the writer; beyond this they spill to disk.",
    )
    retry_initial_s: float = Field(
        default=0.1, gt=0, description="First back-off after a failed write; doubles each retry."
    )
    retry_max_s: float = Field(
        default=5.0, gt=0, description="Longest back-off between retries of a failed write."
    )
    spill_dir: AbsolutePath | None = Field(
        default=None,
        description="Append-only spill files for rows the database could not take yet. "
        "Empty means <data_dir>/spill.",
    )
    store_prompts: bool = Field(
        default=True,
        description="Keep prompt text in the history (needed to retrain from it). "
        "false keeps only the prompt's sha256 and its features.",
    )
