"""The HTTP API's reference as one server-rendered HTML page, from its OpenAPI schema.

FastAPI's default /docs loads Swagger UI's script and styles from a CDN, so it is blank on a
machine without internet; this page needs nothing but the app itself: each endpoint with its
method, summary, parameters, request body fields and responses, and a link to the raw schema.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

_STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222;max-width:1100px}
.op{border:1px solid #ccd;border-radius:4px;margin:10px 0;padding:6px 10px}
.method{display:inline-block;min-width:56px;font-weight:bold;color:#fff;border-radius:3px;padding:1px 6px;
 margin-right:8px;text-align:center}
.get{background:#2a7ab0}.post{background:#2a9d5b}.delete{background:#b03a2a}.put,.patch{background:#b07a2a}
table{border-collapse:collapse;font-size:13px;margin:4px 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
code{background:#f3f3f3;padding:0 3px}.muted{color:#777}
"""


def _schema_name(schema: Mapping[str, Any]) -> str:
    """A short type name for a schema (a $ref's name, an array's item type, or the JSON type)."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " | ".join(_schema_name(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list[{_schema_name(schema.get('items', {}))}]"
    return str(schema.get("type", "any"))


def _fields_table(schema: Mapping[str, Any], components: Mapping[str, Any]) -> str:
    """The fields of a request body's model as a table (name, type, required, description)."""
    if "$ref" in schema:
        schema = components.get(schema["$ref"].rsplit("/", 1)[-1], {})
    props = schema.get("properties") or {}
    if not props:
        return f"<code>{html.escape(_schema_name(schema))}</code>"
    required = set(schema.get("required") or [])
    rows = "".join(f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(_schema_name(p))}</td>"
                   f"<td>{'yes' if name in required else ''}</td>"
                   f"<td>{html.escape(str(p.get('description', '')))}</td></tr>" for name, p in props.items())
    return f"<table><tr><th>field</th><th>type</th><th>required</th><th>meaning</th></tr>{rows}</table>"


def api_reference_html(openapi: Mapping[str, Any], base: str = "") -> str:
    """The whole reference page for an OpenAPI document; `base` is the prefix the app is mounted at."""
    esc = html.escape
    info = openapi.get("info", {})
    components = openapi.get("components", {}).get("schemas", {})
    parts = [f"<h1>{esc(str(info.get('title', 'API')))} <span class='muted'>v{esc(str(info.get('version', '')))}"
             f"</span></h1><p>Every endpoint below is served at <code>{esc(base or '/')}</code>. The raw schema: "
             f"<a href='{esc(base)}/openapi.json'>{esc(base)}/openapi.json</a>.</p>"]
    for path, methods in openapi.get("paths", {}).items():
        for method, op in methods.items():
            params = op.get("parameters") or []
            rows = "".join(f"<tr><td><code>{esc(p['name'])}</code></td><td>{esc(p.get('in', ''))}</td>"
                           f"<td>{esc(_schema_name(p.get('schema', {})))}</td>"
                           f"<td>{'yes' if p.get('required') else ''}</td></tr>" for p in params)
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            responses = ", ".join(f"{esc(code)} {esc(r.get('description', ''))}"
                                  for code, r in (op.get("responses") or {}).items())
            doc = op.get("description") or ""
            parts.append(
                f"<div class='op' id='{esc(method)}-{esc(path)}'><span class='method {esc(method)}'>"
                f"{esc(method.upper())}</span><code>{esc(base + path)}</code> {esc(op.get('summary', ''))}"
                + (f"<p>{esc(doc)}</p>" if doc else "")
                + (f"<p>Parameters</p><table><tr><th>name</th><th>in</th><th>type</th><th>required</th></tr>"
                   f"{rows}</table>" if rows else "")
                + (f"<p>Request body (JSON)</p>{_fields_table(body, components)}" if body else "")
                + f"<p class='muted'>Responses: {responses}</p></div>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(str(info.get('title', 'API')))} "
            f"reference</title><style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>")
