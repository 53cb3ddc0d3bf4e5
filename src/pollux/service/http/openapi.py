"""The API's own description: the JSON schema of a job spec (the request body of
``POST /api/jobs``) and ``/docs``, Swagger UI served from the package's ``static/``
folder so that it renders with no network (no CDN, no validator badge, no web fonts).

The schema documents; :meth:`JobSpec.from_dict` still validates (its errors name the
field and the fix). A test keeps the two in step.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

STATIC_PREFIX = "/static"
SWAGGER_UI_DIR = f"{STATIC_PREFIX}/swagger-ui"

_NON_NEGATIVE = {"type": "number", "minimum": 0}

JOB_SPEC_SCHEMA: dict[str, Any] = {
    "title": "JobSpec",
    "type": "object",
    "description": "A training job: the command each replica runs and how far it may "
                   "scale. Unknown fields are refused.",
    "required": ["name", "command", "working_dir"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
                 "description": "Human name; the job id is <name>-<sequence number>.",
                 "examples": ["digits"]},
        "command": {"description": "Command line each replica runs: a string split like a "
                                   "shell would, or an argv list (no shell).",
                    "oneOf": [{"type": "string", "minLength": 1},
                              {"type": "array", "items": {"type": "string"}, "minItems": 1}],
                    "examples": [["python", "train.py", "--epochs", "20"]]},
        "working_dir": {"type": "string", "description": "Absolute directory the "
                                                        "replicas start in.",
                        "examples": ["/home/me/project"]},
        "env": {"type": "object", "additionalProperties": {"type": ["string", "number"]},
                "description": "Extra environment variables; POLLUX_* names are "
                               "reserved."},
        "resources": {
            "type": "object", "additionalProperties": False,
            "description": "What each replica needs; gpu is the device slot (a GPU, or a "
                           "CPU slot on a backend without GPUs).",
            "properties": {
                "gpu": {**_NON_NEGATIVE, "default": 1},
                "cpu": {**_NON_NEGATIVE, "default": 1},
                "memory": {"description": "Bytes, or a size with a unit: '2GiB', '512M'.",
                           "oneOf": [_NON_NEGATIVE, {"type": "string"}], "default": 0},
            },
        },
        "min_replicas": {"type": "integer", "minimum": 0, "default": 1},
        "max_replicas": {"type": "integer", "minimum": 1, "default": 1,
                         "description": "At least min_replicas."},
        "preemptible": {"type": "boolean", "default": True,
                        "description": "False: once running, the job keeps its "
                                       "allocation until it ends."},
        "restart_delay_s": {**_NON_NEGATIVE, "default": 30,
                            "description": "Seconds a (re)start costs the job; the policy "
                                           "weighs rescales against it."},
        "max_failures": {"type": "integer", "minimum": 0, "default": 3,
                         "description": "Replica failures tolerated (each restarts the job "
                                        "from its checkpoint)."},
        "on_corrupt_checkpoint": {"type": "string", "enum": ["fail", "fresh"],
                                  "default": "fail",
                                  "description": "When every checkpoint is corrupt: fail at "
                                                 "once with the reason, or start over."},
    },
}

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
