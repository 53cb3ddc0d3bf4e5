"""``/docs`` needs nothing from the network, and the JobSpec schema of ``POST /api/jobs``
says what :meth:`JobSpec.from_dict` accepts."""

from __future__ import annotations

import re
import warnings

import pytest

from pollux.job_spec import RESOURCE_FIELDS, SPEC_FIELDS, JobSpec
from pollux.service.http.openapi import JOB_SPEC_SCHEMA

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)


def test_docs_page_loads_only_assets_of_the_server(client):
    page = client.get("/docs")
    assert page.status_code == 200
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert urls and all(url.startswith("/static/") for url in urls), urls
    assert "validatorUrl" in page.text
    for url in urls:
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 100, url
    assert client.get("/redoc").status_code == 404  # ReDoc would load from a CDN


def test_submit_body_is_the_job_spec_schema(client):
    document = client.get("/openapi.json").json()
    body = document["paths"]["/api/jobs"]["post"]["requestBody"]
    assert body["required"] is True
    ref = body["content"]["application/json"]["schema"]["$ref"]
    assert document["components"]["schemas"][ref.rsplit("/", 1)[1]] == JOB_SPEC_SCHEMA


def test_schema_lists_exactly_the_spec_fields_and_defaults():
    properties = JOB_SPEC_SCHEMA["properties"]
    assert tuple(properties) == SPEC_FIELDS
    assert tuple(properties["resources"]["properties"]) == RESOURCE_FIELDS
    minimal = {name: {"name": "a", "command": "x", "working_dir": "/"}[name]
               for name in JOB_SPEC_SCHEMA["required"]}
    parsed = JobSpec.from_dict(minimal).to_dict()
    for name, schema in properties.items():
        if "default" in schema:
            assert parsed[name] == schema["default"], name
    for name, schema in properties["resources"]["properties"].items():
        assert parsed["resources"][name] == schema["default"], name


def test_the_schema_is_a_valid_json_schema_and_the_document_valid_openapi(client):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(JOB_SPEC_SCHEMA)
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(client.get("/openapi.json").json())
