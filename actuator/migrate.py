"""Apply the Alembic migrations shipped in ``actuator.migrations`` to a database URL."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

__all__ = ["alembic_config", "upgrade"]


def alembic_config(url: str) -> Config:
    from actuator import migrations  # type: ignore[attr-defined]  # migrations/, installed as actuator.migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # configparser treats % as interpolation: escape it (passwords in URLs may contain %).
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema at ``url`` to ``revision`` (idempotent)."""
    command.upgrade(alembic_config(url), revision)
