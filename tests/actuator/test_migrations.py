"""Alembic: upgrade head on empty SQLite and Postgres databases, and the models match it."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from actuator.migrate import alembic_config, upgrade
from actuator.models import Base


def test_upgrade_head_and_models_match(database_url):
    upgrade(database_url)
    upgrade(database_url)  # idempotent: a restart applies nothing twice
    engine = create_engine(database_url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert {"policies", "runs", "observations", "decisions", "events", "alembic_version"} <= tables
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            head = ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()
            assert ctx.get_current_revision() == head
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == [], f"models differ from migrations; add a revision: {diff}"
    finally:
        engine.dispose()


def test_single_linear_history():
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1


def test_0005_policy_catalogue_down_and_up(database_url):
    """0005 adds policies.catalogue (the entries a registration declared); down drops it and keeps
    the policies, up brings it back empty (NULL: a version that needs none)."""
    from alembic import command
    from sqlalchemy import text

    upgrade(database_url)
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO policies (name, version, document, catalogue, archived, created_at) "
                              "VALUES ('p', 1, '{\"name\": \"p\"}', '{\"knobs\": []}', false, CURRENT_TIMESTAMP)"))
        command.downgrade(alembic_config(database_url), "0004")
        assert "catalogue" not in {c["name"] for c in inspect(engine).get_columns("policies")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name, version FROM policies")).all() == [("p", 1)]
        upgrade(database_url)
        assert "catalogue" in {c["name"] for c in inspect(engine).get_columns("policies")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name, catalogue FROM policies")).all() == [("p", None)]
    finally:
        engine.dispose()
