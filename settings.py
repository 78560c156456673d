"""Configuration from ``EXPORTS_`` environment variables, built in ``main()``, never at import time."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything a worker, the starter or the API needs to know about its surroundings.

    Each field reads ``EXPORTS_<NAME>``; the defaults are the demo's.
    """

    model_config = SettingsConfigDict(env_prefix="EXPORTS_", extra="ignore")

    database_url: str | None = Field(default=None, description="PostgreSQL URL of a login role")
    temporal_address: str = "localhost:7233"
    temporal_namespace: str = "default"
    task_queue: str = "exports"
    worker_id: str | None = None
    lease_seconds: float = 60.0
    renew_every_seconds: float = 20.0
    max_attempts: int = 3
    sweep_after_seconds: float = 30 * 60
    sweep_batch: int = 500
    recovery_every_seconds: float = 30.0
    sweep_every_seconds: float = 5 * 60.0
    work_dir: Path = Path("/tmp/fenced-exports")
    shutdown_grace_seconds: float = 15.0
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    temporal_ui_url: str = "http://localhost:8233"
