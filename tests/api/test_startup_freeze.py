"""The service's start-up objects are frozen out of the collector's walk (api/app.py's lifespan):
a full collection then walks only what requests allocate. Unfrozen, one ingest answer in every few
hundred waited ~100 ms for the walk (benchmarks/load/gc_pause.py has the figures)."""

from __future__ import annotations

import gc

from fastapi.testclient import TestClient

from actuator.api.app import create_app
from actuator.config import Settings


def test_start_up_freezes_what_it_built_and_the_service_still_answers(tmp_path):
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}"))
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            frozen = gc.get_freeze_count()
            # the app, its store and the imported modules are among them: thousands of objects
            assert frozen > 10_000
            assert client.get("/healthz").status_code == 200
    finally:
        gc.unfreeze()


def test_an_embedded_service_freezes_nothing_of_the_training_process(tmp_path):
    from actuator.api.embedded import serve_in_thread

    gc.unfreeze()
    url = serve_in_thread(Settings(database_url=f"sqlite:///{tmp_path / 'e.db'}"))
    import httpx

    assert httpx.get(f"{url}/healthz").status_code == 200
    assert gc.get_freeze_count() == 0
