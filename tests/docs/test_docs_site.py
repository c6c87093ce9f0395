"""The docs site: `mkdocs build --strict` (what `make docs` runs) builds it from a clean state,
offline (no page loads a font, script or stylesheet from the network), a broken internal link
fails the build, and the generated reference pages come from the code: every field of the policy
schema is on its page, and a field added to a model appears without editing Markdown."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_reference  # noqa: E402

MKDOCS = Path(sys.executable).parent / "mkdocs"
# What a page must not load: fonts, scripts or stylesheets from another host.
REMOTE_HOSTS = re.compile(r"fonts\.googleapis|fonts\.gstatic|unpkg\.com|jsdelivr|cdnjs|\bcdn\.", re.I)
REMOTE_LOAD = re.compile(r"<(?:script|img|iframe)[^>]*\bsrc=\"(?:https?:)?//|<link[^>]*\bhref=\"(?:https?:)?//", re.I)


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)], cwd=root, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT, out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def remote_loads(site: Path) -> list[str]:
    found = []
    for page in site.rglob("*.html"):
        text = page.read_text()
        found += [f"{page.relative_to(site)}: {m.group(0)}" for m in REMOTE_LOAD.finditer(text)]
        found += [f"{page.relative_to(site)}: {m.group(0)}" for m in REMOTE_HOSTS.finditer(text)]
    for sheet in site.rglob("*.css"):
        found += [f"{sheet.relative_to(site)}: {m}" for m in re.findall(r"(?:url\(|@import)\s*[\"']?https?://[^)\"']+",
                                                                           sheet.read_text())]
    return found


def test_the_site_builds_offline(site):
    assert (site / "index.html").is_file()
    for page in ("reference/policy.html", "reference/rest.html", "reference/cli.html", "reference/metrics.html",
                 "tutorial/first-controlled-run.html", "how-to/trl-scripts.html"):
        assert (site / page).is_file(), page
    assert not remote_loads(site)
    # the README's TRL section is included in its how-to page, not copied
    text = html.unescape(re.sub(r"<[^>]+>", "", (site / "how-to/trl-scripts.html").read_text()))  # highlighted code
    assert 'ActuatorCallback("preset:rl-kl").attach(trainer)  # grpo.py, rloo.py' in text


def test_the_offline_check_sees_a_cdn_font_and_script(tmp_path):
    (tmp_path / "a.html").write_text('<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">')
    (tmp_path / "b.html").write_text('<script src="https://unpkg.com/iframe-worker/shim"></script>')
    (tmp_path / "c.css").write_text("@font-face{src:url(https://example.org/f.woff2)}")
    assert len({f.split(":")[0] for f in remote_loads(tmp_path)}) == 3


def test_a_broken_internal_link_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    for name in ("mkdocs.yml", "README.md"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    page = copy / "docs" / "how-to" / "compress.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0 and "no-such-page.md" in done.stderr, done.stderr[-2000:]


def field_names(schema: dict) -> set[tuple[str, str]]:
    models = {schema.get("title", "Document"): schema, **schema.get("$defs", {})}
    return {(name, field) for name, model in models.items() for field in model.get("properties", {})}


def test_the_policy_page_has_every_field_of_the_schema(site):
    from actuator.policy import PolicyDocument

    page = docs_reference.policy_markdown()
    for model, field in field_names(PolicyDocument.model_json_schema()):
        section = page[page.index(f"### {model}\n"):]
        section = section[:section.find("\n### ", 1) if "\n### " in section[1:] else None]
        assert f"| `{field}` |" in section, (model, field)
    assert "ControllerSpec" in (site / "reference" / "policy.html").read_text()


def test_a_new_field_appears_on_the_generated_page_without_editing_markdown():
    class Inner(BaseModel):
        gain: float = Field(1.0, gt=0, description="How hard it pushes.")

    class Doc(BaseModel):
        name: str
        inner: Inner

    before = docs_reference.schema_markdown("Policy", Doc.model_json_schema())

    class Doc2(Doc):
        brand_new: int = Field(3, le=7, description="A field added to the model.")

    after = docs_reference.schema_markdown("Policy", Doc2.model_json_schema())
    assert "brand_new" not in before
    assert "| `brand_new` | integer | `3` | ≤ `7` | A field added to the model. |" in after
    assert "| `gain` | number | `1.0` | > `0` | How hard it pushes. |" in after


def test_the_cli_and_rest_pages_name_every_command_and_operation():
    import typer

    from actuator.cli import app

    cli = docs_reference.cli_markdown()
    root = typer.main.get_command(app)
    for name in root.commands:
        assert f"## `actuator {name}`" in cli, name
    assert "## `actuator policy tune`" in cli and "`--aggressiveness`" in cli
    document = {"info": {"title": "T", "version": "1"}, "paths": {"/v1/x/{id}": {"get": {
        "summary": "Read an x", "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/X"}}}}}}}},
        "components": {"schemas": {"X": {"properties": {"a": {"type": "integer"}}, "required": ["a"]}}}}
    page = docs_reference.openapi_markdown(document)
    assert "### `GET /v1/x/{id}`" in page and "| `id` | path | string | yes |" in page
    assert "| 200 | application/json | [X](#x) |" in page and "| `a` | integer | required |" in page


def test_the_event_kinds_page_has_every_kind_of_the_union_with_its_fields(site):
    from typing import get_args

    from actuator.schemas import Event

    page = docs_reference.events_markdown()
    members = get_args(get_args(Event)[0])
    assert len(members) >= 15
    for model in members:
        kind = model.model_fields["kind"].default
        section = page[page.index(f"### `{kind}` ({model.__name__})\n"):]
        section = section[:section.find("\n### ", 1) if "\n### " in section[1:] else None]
        for name, info in model.model_fields.items():
            field = info.serialization_alias or info.alias or name
            assert f"| `{field}` |" in section, (kind, field)
    assert (site / "reference" / "event-kinds.html").is_file()
