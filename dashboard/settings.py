"""Settings of the dashboard, a branch of the one settings tree built at the entry point."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DashboardSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address the dashboard binds.")
    port: int = Field(default=8501, ge=0, le=65535, description="Dashboard port.")
    refresh_s: float = Field(default=5.0, gt=0, description="Live refresh interval of the pages.")
