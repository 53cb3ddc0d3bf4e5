"""The API's own description: the JSON schema of a job spec (the request body of
``POST /api/jobs``) and ``/docs``, Swagger UI served from the package's ``static/``
folder so that it renders with no network (no CDN, no validator badge, no web fonts).

The schema is generated from the JobSpec definition (:func:`spec_schema`); it documents,
and :meth:`JobSpec.from_dict` validates (its errors name the field and the fix).
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, get_type_hints

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from pollux.job_spec import FieldRule, JobSpec

STATIC_PREFIX = "/static"
SWAGGER_UI_DIR = f"{STATIC_PREFIX}/swagger-ui"

JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def spec_schema(cls: type, description: str | None = None) -> dict[str, Any]:
    """The JSON schema of a spec dataclass (:class:`~pollux.job_spec.JobSpec`, and the
    classes of its fields) made from its one definition: each field's type, default and
    :class:`~pollux.job_spec.FieldRule` (bounds, choices, pattern, description). A field
    with a default may also be null (:meth:`JobSpec.from_dict` reads null as the
    default)."""
    types = get_type_hints(cls)
    properties: dict[str, Any] = {}
    required = []
    for item in fields(cls):
        rule: FieldRule = item.metadata["rule"]
        key = rule.key or item.name
        optional = item.default is not MISSING or item.default_factory is not MISSING
        if not optional:
            required.append(key)
        properties[key] = field_schema(types[item.name], rule, optional)
        if item.default is not MISSING:
            properties[key]["default"] = item.default
        if rule.examples:
            properties[key]["examples"] = list(rule.examples)
    schema: dict[str, Any] = {"type": "object"}
    if description is not None:
        schema["description"] = description
    if required:
        schema["required"] = required
    schema.update(additionalProperties=False, properties=properties)
    return schema


def field_schema(kind: Any, rule: FieldRule, optional: bool) -> dict[str, Any]:
    """One field's schema (see :func:`spec_schema`)."""
    if rule.json_form is not None:
        schema = dict(rule.json_form)
    elif isinstance(kind, type) and is_dataclass(kind):
        schema = spec_schema(kind, rule.description)
    else:
        schema = {"type": JSON_TYPES[kind]}
    bounds = {"minimum": rule.lowest, "maximum": rule.highest, "pattern": rule.pattern,
              "enum": list(rule.choices) or None}
    schema.update({name: value for name, value in bounds.items() if value is not None})
    if optional and "oneOf" in schema:
        schema["oneOf"] = [*schema["oneOf"], {"type": "null"}]
    elif optional:
        schema["type"] = [schema["type"], "null"]
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
    schema.setdefault("description", rule.description)
    return schema


JOB_SPEC_SCHEMA: dict[str, Any] = {
    "title": "JobSpec", **spec_schema(JobSpec, " ".join((inspect.getdoc(JobSpec) or "").split()))}
"""The request body of ``POST /api/jobs``; ``tests/service/test_openapi.py`` checks that
it accepts and refuses what :meth:`JobSpec.from_dict` does (and names what only the
latter can refuse: a command that does not split, sizes in bytes, field against field)."""

SUBMIT_OPENAPI: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/JobSpec"}}}},
}
"""``openapi_extra`` of ``POST /api/jobs``: its body is a JobSpec."""


def add_schemas(app: FastAPI) -> None:
    """Put JobSpec under components/schemas of the app's OpenAPI document."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            document.setdefault("components", {}).setdefault("schemas", {})[
                "JobSpec"] = JOB_SPEC_SCHEMA
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def add_offline_docs(app: FastAPI) -> None:
    """``GET /docs``: Swagger UI from the package (create the app with docs_url=None)."""

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API",
            swagger_js_url=f"{SWAGGER_UI_DIR}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER_UI_DIR}/swagger-ui.css",
            swagger_favicon_url=f"{STATIC_PREFIX}/favicon.svg",
            swagger_ui_parameters={"validatorUrl": None})
