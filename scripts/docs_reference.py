"""The generated reference pages of the docs site, written from the live code at build time.

mkdocs loads this file as a hook (``hooks:`` in mkdocs.yml). Its ``on_files`` adds, as pages that
exist only in the built site (nothing is written into docs/):

- ``reference/policy.md``: every field of the policy document, from the pydantic JSON Schema of
  ``actuator.policy.PolicyDocument`` (a new field appears without editing Markdown);
- ``reference/rest.md``: the OpenAPI document of ``api.app.create_app`` rendered as tables;
- ``reference/cli.md``: every command of the ``actuator`` CLI, from its typer app;
- ``reference/metrics.md``: every Prometheus metric the service registers, with its type, labels
  and help, and the metrics module's own notes.

Each ``*_markdown`` function is plain (no mkdocs import) so tests call it directly.
``python scripts/docs_reference.py OUT_DIR`` writes the pages to a folder, to read them without a
build.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _cell(text: Any) -> str:
    """One Markdown table cell: no line breaks, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_of(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type_of(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type", "any")
    if kind == "array":
        if "prefixItems" in schema:
            return "[" + ", ".join(_type_of(s) for s in schema["prefixItems"]) + "]"
        return f"list of {_type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {_type_of(schema['additionalProperties'])}"
    return str(kind)


_LIMITS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"),
           ("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥"), ("maxItems", "items ≤"),
           ("pattern", "matches"))


def _limits(schema: dict[str, Any]) -> str:
    found = [f"{sign} `{schema[key]}`" for key, sign in _LIMITS if key in schema]
    for option in schema.get("anyOf", []):
        if option.get("type") != "null":
            found += [f"{sign} `{option[key]}`" for key, sign in _LIMITS if key in option]
    return ", ".join(found)


def _model_table(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [inspect.cleandoc(schema["description"]), ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | default | limits | description |", "|---|---|---|---|---|"]
    for field, spec in schema.get("properties", {}).items():
        default = "required" if field in required else f"`{json.dumps(spec.get('default'))}`" if "default" in spec else ""
        lines.append(f"| `{field}` | {_cell(_type_of(spec))} | {_cell(default)} | {_cell(_limits(spec))} "
                     f"| {_cell(spec.get('description', ''))} |")
    return lines + [""]


def schema_markdown(title: str, schema: dict[str, Any], intro: str = "") -> str:
    """A page with one table per object model of a JSON Schema: the root first, then its ``$defs``."""
    lines = [f"# {title}", ""]
    if intro:
        lines += [intro, ""]
    root_name = schema.get("title", "Document")
    lines += _model_table(root_name, schema)
    for name, sub in sorted(schema.get("$defs", {}).items()):
        if sub.get("type") == "object" or "properties" in sub:
            lines += _model_table(name, sub)
        else:
            lines += [f"### {name}", "", _cell(sub.get("description", "")), "", f"Type: {_cell(_type_of(sub))}", ""]
    return "\n".join(lines)


def policy_markdown() -> str:
    from actuator.policy import PolicyDocument, list_presets

    intro = ("Every field of a policy document (YAML or JSON), generated from the pydantic model "
             "`actuator.policy.PolicyDocument` when the site is built, so it cannot drift from the code. "
             "The same schema is served at `GET /v1/policies/schema` and printed by `actuator policy schema`. "
             "Unknown fields are refused. Shipped presets (`preset:NAME`): "
             + ", ".join(f"`{p}`" for p in list_presets()) + ". How controllers and guardrails behave is in "
             "[Policies](policies.md).")
    return schema_markdown("Policy language", PolicyDocument.model_json_schema(), intro)


def events_markdown() -> str:
    from actuator.schemas import EVENT

    schema = EVENT.json_schema()
    intro = ("Every kind of event the service stores, streams (`GET /v1/runs/{id}/stream`) and reports, one "
             "table per kind, generated from the union `actuator.schemas.Event` (discriminated on `kind`) when the "
             "site is built. How the stream numbers, resumes and reports gaps is in [Events](events.md).")
    lines = ["# Event kinds", "", intro, ""]
    for name, sub in sorted(schema.get("$defs", {}).items()):
        if "kind" in sub.get("properties", {}):
            kind = sub["properties"]["kind"].get("const") or sub["properties"]["kind"].get("default")
            lines += _model_table(f"`{kind}` ({name})", sub)
    for name, sub in sorted(schema.get("$defs", {}).items()):
        if "kind" not in sub.get("properties", {}) and (sub.get("type") == "object" or "properties" in sub):
            lines += _model_table(name, sub)
    return "\n".join(lines)


def _operation_lines(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        lines += [f"**{op['summary']}**", ""]
    if op.get("description"):
        lines += [op["description"].strip(), ""]
    auth = sorted({name for req in op.get("security", []) for name in req})
    lines += [f"Auth: {', '.join(f'`{a}`' for a in auth) if auth else 'none'}", ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            lines.append(f"| `{p['name']}` | {p['in']} | {_cell(_type_of(p.get('schema', {})))} | "
                         f"{'yes' if p.get('required') else 'no'} | {_cell(p.get('description', ''))} |")
        lines.append("")
    body = op.get("requestBody", {}).get("content", {})
    for ctype, content in body.items():
        lines += [f"Request body ({ctype}): {_type_of(content.get('schema', {}))}", ""]
    lines += ["| status | content | body |", "|---|---|---|"]
    for status, answer in op.get("responses", {}).items():
        contents = answer.get("content", {}) or {"": {}}
        for ctype, content in contents.items():
            lines.append(f"| {status} | {ctype or '—'} | {_cell(_type_of(content.get('schema', {})) or answer.get('description', ''))} |")
    return lines + [""]


def openapi_markdown(document: dict[str, Any]) -> str:
    """The OpenAPI document as a page: every operation, then every schema."""
    info = document.get("info", {})
    lines = ["# REST API", "",
             f"The OpenAPI document of the controller service ({info.get('title', '')} {info.get('version', '')}), "
             "rendered when the site is built. A running service serves it at `/openapi.json` and as "
             "interactive docs at `/docs`. Every error answer has the shape `ErrorPublic`; `AdminToken` and "
             "`AgentToken` are bearer tokens. Limits on every answer are in [Limits and guarantees](limits.md).", "",
             "## Operations", ""]
    for path, item in document.get("paths", {}).items():
        for method, op in item.items():
            if method in {"get", "put", "post", "delete", "patch", "head", "options"}:
                lines += _operation_lines(path, method, op)
    lines += ["## Schemas", ""]
    for name, schema in sorted(document.get("components", {}).get("schemas", {}).items()):
        if "properties" in schema:
            lines += _model_table(name, schema)
        else:
            lines += [f"### {name}", "", f"Type: {_cell(_type_of(schema))}", ""]
    return "\n".join(lines)


def rest_markdown() -> str:
    from actuator.config import Settings
    from actuator.api.app import create_app

    return openapi_markdown(create_app(Settings(database_url="sqlite:///:memory:")).openapi())


def _command_lines(command: Any, path: list[str]) -> list[str]:
    """One section per command, subcommands after their group (typer's own click, duck-typed)."""
    name = " ".join(path)
    lines = [f"## `{name}`", ""]
    if command.help:
        lines += [inspect.cleandoc(command.help), ""]
    ctx = command.context_class(command, info_name=name)
    lines += [f"Usage: `{name} {' '.join(command.collect_usage_pieces(ctx))}`", ""]
    params = [p for p in command.params if p.name != "help"]
    if params:
        lines += ["| argument / option | type | default | description |", "|---|---|---|---|"]
        for p in params:
            names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts]) if p.param_type_name == "option" else f"`{p.name.upper()}`"
            envvar = f" (env `{p.envvar}`)" if getattr(p, "envvar", None) else ""
            default = "" if p.default is None or callable(p.default) else f"`{p.default}`"
            kind = "flag" if getattr(p, "is_flag", False) else p.display_type(ctx)
            lines.append(f"| {names} | `{_cell(kind)}` | {_cell(default)} | {_cell((getattr(p, 'help', '') or '') + envvar)} |")
        lines.append("")
    if hasattr(command, "list_commands"):
        for sub_name in command.list_commands(ctx):
            lines += _command_lines(command.get_command(ctx, sub_name), [*path, sub_name])
    return lines


def cli_markdown() -> str:
    import typer

    from actuator.cli import app

    lines = ["# CLI", "", "Every command of `actuator`, generated from its typer app when the site is built. "
             "Errors go to stderr with exit code 1 (2 for usage). `--url` defaults to `$ACTUATOR_URL`, then "
             "`http://127.0.0.1:8000`. The service's settings are in [Limits and guarantees](limits.md).", ""]
    return "\n".join(lines + _command_lines(typer.main.get_command(app), ["actuator"]))


def metrics_markdown() -> str:
    from prometheus_client import CollectorRegistry

    import actuator.metrics as module

    registry = CollectorRegistry()
    module.Metrics(registry)
    labels = {getattr(c, "_name", ""): list(getattr(c, "_labelnames", ())) for c in registry._names_to_collectors.values()}
    lines = ["# Metrics", "", "Every Prometheus metric the controller service registers (`/metrics`), generated from "
             "`actuator.metrics` when the site is built. The dashboards that read them are in "
             "[Watch in Grafana](../how-to/grafana.md).", "", "| metric | type | labels | help |", "|---|---|---|---|"]
    for family in sorted(registry.collect(), key=lambda f: f.name):
        exposed = family.name + ("_total" if family.type == "counter" else "")  # what /metrics and PromQL name
        lines.append(f"| `{exposed}` | {family.type} | {_cell(', '.join(labels.get(family.name, [])) or '—')} "
                     f"| {_cell(family.documentation)} |")
    # the module docstring's prose (its tables are the ones above, read from the registry)
    notes = [para for para in inspect.cleandoc(module.__doc__ or "").split("\n\n")
             if "====" not in para and not para.rstrip().endswith(":")]
    return "\n".join([*lines, "", "## Notes from `actuator/metrics.py`", "", *(p.replace("``", "`") + "\n" for p in notes)])


PAGES = {"reference/policy.md": policy_markdown, "reference/rest.md": rest_markdown,
         "reference/cli.md": cli_markdown, "reference/metrics.md": metrics_markdown,
         "reference/event-kinds.md": events_markdown}


def on_files(files: Any, config: Any) -> Any:  # mkdocs hook
    from mkdocs.structure.files import File

    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/docs-reference")
    for uri, make in PAGES.items():
        (out / uri).parent.mkdir(parents=True, exist_ok=True)
        (out / uri).write_text(make())
        print(out / uri)
