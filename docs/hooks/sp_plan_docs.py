"""mkdocs hooks: the reference pages generated from the code at build time, so they cannot drift from it.

A page asks for a generated part with an HTML comment on a line of its own:

    <!-- sp-plan:cli -->                                    the CLI, from the Typer app (Typer's own docs generator)
    <!-- sp-plan:schema sp_plan.planner.plan:Plan -->       a pydantic model's JSON schema as field tables
    <!-- sp-plan:openapi -->                                the service's endpoints, from its OpenAPI document

The raw documents (the OpenAPI JSON and each file format's JSON schema) are added to the site as files too.
"""
from __future__ import annotations

import importlib
import json
import html
import re
from typing import Any

MARKER = re.compile(r"^<!-- sp-plan:(\w+)(?: ([\w.:]+))? -->$", re.M)

#: the file formats whose JSON schemas are published beside the reference page
SCHEMAS = {
    "plan": "sp_plan.planner.plan:Plan",
    "cluster": "sp_plan.planner.cluster:Cluster",
    "cluster-node": "sp_plan.profiles.spec:NodeSpec",
    "model": "sp_plan.planner.model:ModelSpec",
    "workload": "sp_plan.planner.model:Workload",
    "profile": "sp_plan.planner.profile:Profile",
}


def load(spec: str) -> Any:
    """The object a ``module:name`` string names."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def typer_context(command):
    """A click context for Typer's docs generator, with the app's rich markup mode as `typer utils docs` sets it."""
    import typer  # noqa: PLC0415
    from typer.cli import MARKUP_MODE_KEY  # noqa: PLC0415

    from sp_plan.cli.app import app  # noqa: PLC0415

    ctx = typer.Context(command, info_name="sp-plan")
    ctx.obj = {MARKUP_MODE_KEY: getattr(app, "rich_markup_mode", None)}
    return ctx


def cli_markdown() -> str:
    """Every command, argument and option of `sp-plan`, as its --help shows them (Typer's Markdown generator)."""
    import typer.main  # noqa: PLC0415
    from typer.cli import get_docs_for_click  # noqa: PLC0415

    from sp_plan.cli.app import app  # noqa: PLC0415

    command = typer.main.get_command(app)
    md = get_docs_for_click(obj=command, ctx=typer_context(command), indent=1, name="sp-plan").strip() + "\n"
    return whole_summaries(EXAMPLE_LINE.sub(lambda m: f"```console\n$ {m.group(1)}\n```", md), command)


def whole_summaries(md: str, group) -> str:
    """The command lists with each command's whole first sentence, where click's short help cuts it at 45
    characters ("List the cluster and model presets:...")."""
    for name, sub in getattr(group, "commands", {}).items():
        first = html.escape((sub.help or "").strip().split("\n\n")[0].replace("\n", " "), quote=True)
        if first:
            md = re.sub(rf"^\* `{re.escape(name)}`: .*\.\.\.$", lambda m: f"* `{name}`: {first}", md, count=1, flags=re.M)
        md = whole_summaries(md, sub)
    return md


#: an example command in a command's epilog, as the help indents it (two spaces): a console block on the page
EXAMPLE_LINE = re.compile(r"^  ((?:sp-plan|torchrun|SP_PLAN_\w+=\S+ sp-plan|curl|python) .*)$", re.M)


def openapi_document() -> dict:
    """The OpenAPI document the service serves at /openapi.json (the app is built, not started)."""
    from sp_plan.service.app import create_app  # noqa: PLC0415

    return create_app().openapi()


# ---- JSON schema as Markdown tables


def anchor(prefix: str, name: str) -> str:
    """The heading id of a schema definition on its page."""
    return f"{prefix}-{name}".lower()


def type_of(prop: dict, prefix: str) -> str:
    """A JSON-schema property's type in a few words, definitions linked to their tables."""
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{anchor(prefix, name)})"
    if "enum" in prop:
        return ", ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in prop:
            return " or ".join(type_of(p, prefix) for p in prop[key])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {type_of(prop.get('items', {}), prefix)}"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map of {type_of(prop['additionalProperties'], prefix)}"
    return str(kind)


def cell(text: str) -> str:
    """Text made safe for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def bounds(prop: dict) -> str:
    """The numeric and length limits pydantic put in the schema, as a short phrase."""
    words = {"exclusiveMinimum": ">", "minimum": ">=", "exclusiveMaximum": "<", "maximum": "<=",
             "minLength": "length >=", "minItems": "items >=", "maxItems": "items <="}
    return ", ".join(f"{w} {prop[k]}" for k, w in words.items() if k in prop)


def fields_table(schema: dict, prefix: str) -> list[str]:
    """One row per property: name (bold when required), type, default, and what it means."""
    required = set(schema.get("required", ()))
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        label = f"**`{name}`**" if name in required else f"`{name}`"
        default = "required" if name in required else (f"`{json.dumps(prop['default'])}`" if "default" in prop else "")
        meaning = "; ".join(x for x in (prop.get("description", ""), bounds(prop)) if x)
        rows.append(f"| {label} | {cell(type_of(prop, prefix))} | {cell(default)} | {cell(meaning)} |")
    return rows


def schema_markdown(schema: dict, prefix: str, level: int = 3) -> str:
    """A model's schema: its own fields, then each definition it refers to under a heading of its own."""
    lines = []
    if schema.get("description"):
        lines += [cell(schema["description"]), ""]
    if "properties" in schema:  # a bare wrapper of definitions (the HTTP schemas) has no table of its own
        lines += fields_table(schema, prefix) + [""]
    for name, sub in schema.get("$defs", {}).items():
        lines += [f"{'#' * level} {name} {{ #{anchor(prefix, name)} }}", ""]
        if sub.get("description"):
            lines += [cell(sub["description"]), ""]
        if "properties" in sub:
            lines += fields_table(sub, prefix) + [""]
        else:
            lines += [f"Type: {cell(type_of(sub, prefix))}", ""]
    return "\n".join(lines)


def model_markdown(spec: str) -> str:
    """The field tables of the pydantic model ``module:Name``."""
    model = load(spec)
    return schema_markdown(model.model_json_schema(), prefix=model.__name__)


# ---- OpenAPI as Markdown


def operation_markdown(method: str, path: str, op: dict) -> list[str]:
    """One endpoint: its summary, parameters, request body and responses."""
    lines = [f"### `{method.upper()} {path}`", ""]
    if op.get("description"):
        lines += [op["description"].strip(), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required |", "|---|---|---|---|"]
        lines += [f"| `{p['name']}` | {p['in']} | {cell(type_of(p.get('schema', {}), 'http'))} | "
                  f"{'yes' if p.get('required') else 'no'} |" for p in params]
        lines.append("")
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body:
        lines += [f"Request body (JSON): {type_of(body, 'http')}", ""]
    responses = []
    for status, res in op.get("responses", {}).items():
        content = res.get("content", {})
        kinds = ", ".join(content) or "no body"
        schema = content.get("application/json", {}).get("schema")
        what = type_of(schema, "http") if schema else kinds
        responses.append(f"`{status}` {res.get('description', '')}: {what}")
    if responses:
        lines += ["Responses: " + "; ".join(responses) + ".", ""]
    return lines


def openapi_markdown() -> str:
    """Every endpoint of the service, then every schema its bodies use."""
    doc = openapi_document()
    lines = [f"{doc['info']['title']} {doc['info']['version']}: {doc['info'].get('summary', '')}", "",
             "## Endpoints", ""]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            lines += operation_markdown(method, path, op)
    lines += ["## Schemas", ""]
    schemas = doc.get("components", {}).get("schemas", {})
    lines += schema_markdown({"$defs": schemas}, prefix="http", level=3).splitlines()
    return "\n".join(lines) + "\n"


# ---- mkdocs hooks


def expand(match: re.Match) -> str:
    """The generated Markdown for one marker."""
    kind, arg = match.group(1), match.group(2)
    if kind == "cli":
        return cli_markdown()
    if kind == "schema" and arg:
        return model_markdown(arg)
    if kind == "openapi":
        return openapi_markdown()
    raise ValueError(f"unknown sp-plan docs marker {match.group(0)!r}")


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace each generated-part marker of a page with its Markdown."""
    return MARKER.sub(expand, markdown)


def on_files(files, config):
    """Publish the OpenAPI document and the file formats' JSON schemas beside the reference pages."""
    from mkdocs.structure.files import File  # noqa: PLC0415 (mkdocs only at build time: the tests import this module)

    files.append(File.generated(config, "reference/openapi.json",
                                content=json.dumps(openapi_document(), indent=2) + "\n"))
    for name, spec in SCHEMAS.items():
        schema = load(spec).model_json_schema()
        files.append(File.generated(config, f"reference/schemas/{name}.schema.json",
                                    content=json.dumps(schema, indent=2) + "\n"))
    return files
