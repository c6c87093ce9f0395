"""Alembic environment. Run through ``actuator.migrate.upgrade(url)`` (the service does this on
start-up) or ``alembic -x url=... upgrade head`` with the alembic.ini at the repo root."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

from actuator.models import Base

config = context.config
target_metadata = Base.metadata

# Postgres: several workers/replicas may start at once; one advisory lock serialises upgrades.
_ADVISORY_KEY = 0x4143_5455  # "ACTU"


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: pass -x url=... or set sqlalchemy.url")
    return url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    is_pg = connection.dialect.name == "postgresql"
    if is_pg:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _ADVISORY_KEY})
    try:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=not is_pg, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if is_pg:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _ADVISORY_KEY})
            connection.commit()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url())
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
