"""mkdocs hooks: the reference pages generated from the code they describe.

A page asks for a generated block with an HTML comment on a line of its own, e.g.
``<!-- generated: cli -->``; :func:`on_page_markdown` replaces it. Every block is built
from one definition in the package (the argparse parser, the served OpenAPI document,
the job-spec schema, the launch contract's constants), so the reference cannot drift
from the code. ``tests/docs/test_site.py`` builds the site with these hooks.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    return (str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\n", " ").strip())


def _code(text: object) -> str:
    """Text safe inside a code span in a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


# --- the command line -------------------------------------------------------------------

def _subcommands(parser: argparse.ArgumentParser
                 ) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name, "")


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
            name = ", ".join(action.option_strings) + (f" {metavar}" if metavar else "")
        else:
            name = formatter._metavar_formatter(action, action.dest)(1)[0]
        help_text = formatter._expand_help(action) if action.help else ""
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS, [], "") or action.nargs == 0 \
            else f"`{default}`"
        rows.append(f"| `{_code(name)}` | {_cell(help_text)} | {shown} |")
    return rows


def _command_section(prog: str, parser: argparse.ArgumentParser, summary: str,
                     level: int) -> list[str]:
    lines = [f"{'#' * level} `{prog}`", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    if parser.description and parser.description != summary:
        lines += [parser.description.strip(), ""]
    rows = _option_rows(parser)
    if rows:
        lines += ["| argument | what it does | default |", "|---|---|---|", *rows, ""]
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```", ""]
    for name, sub, help_text in _subcommands(parser):
        lines += _command_section(f"{prog} {name}", sub, help_text, min(level + 1, 4))
    return lines


def cli_markdown() -> str:
    """Every ``pollux`` command with its usage and arguments, from the parser itself."""
    import os

    from pollux.cli.main import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "82"  # usage lines that fit the page, whatever the terminal
    try:
        parser = build_parser()
        lines = ["```text", parser.format_usage().strip(), "```", "",
                 "| argument | what it does | default |", "|---|---|---|",
                 *_option_rows(parser), ""]
        for name, sub, help_text in _subcommands(parser):
            lines += _command_section(f"pollux {name}", sub, help_text, 2)
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(lines)


# --- the REST API -----------------------------------------------------------------------

def openapi_document() -> dict[str, Any]:
    """The OpenAPI document a server serves at ``/openapi.json`` (fake backend, no HTTP)."""
    from pollux.backends.fake import FakeBackend
    from pollux.policies import NodeInfo
    from pollux.service.config import PolicyConfig, ServerConfig
    from pollux.service.http.api import create_app
    from pollux.service.http.auth import ApiAuth
    from pollux.service.server import build_service

    with tempfile.TemporaryDirectory() as tmp:
        backend = FakeBackend([NodeInfo("node-0", {"gpu": 1.0, "cpu": 1.0, "memory": 1e9})])
        config = ServerConfig(data_dir=Path(tmp) / "data", policy=PolicyConfig("fifo"))
        service = build_service(config,
                                "http://127.0.0.1:1/api/jobs/{job_id}/hints", backend)
        try:
            app = create_app(service, ApiAuth("docs", frozenset({"localhost"})))
            return json.loads(json.dumps(app.openapi()))
        finally:
            service.store.close()


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    if schema.get("type") == "array" and "items" in schema:
        return f"list of {_schema_name(schema['items'])}"
    return str(schema.get("type", "object"))


def rest_markdown() -> str:
    """Every route of the served OpenAPI document: method, path, what it does, body and
    answers."""
    document = openapi_document()
    lines = [f"`{document['info']['title']}` {document['info']['version']}: "
             f"{document['info'].get('description', '')}", ""]
    for path, operations in sorted(document["paths"].items()):
        for method, operation in operations.items():
            lines += [f"### `{method.upper()} {path}`", ""]
            text = operation.get("description") or operation.get("summary") or ""
            if text:
                lines += [text.strip(), ""]
            params = operation.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | required |", "|---|---|---|---|"]
                for param in params:
                    lines.append(f"| `{param['name']}` | {param['in']} | "
                                 f"{_schema_name(param.get('schema', {}))} | "
                                 f"{'yes' if param.get('required') else 'no'} |")
                lines.append("")
            body = operation.get("requestBody", {}).get("content", {})
            for content_type, content in body.items():
                lines += [f"Body (`{content_type}`): {_schema_name(content.get('schema', {}))}"
                          f" (see [the job spec](job-spec.md) for `JobSpec`).", ""]
            answers = ", ".join(f"{code} {_cell(answer.get('description', ''))}"
                                for code, answer in operation.get("responses", {}).items())
            if answers:
                lines += [f"Answers: {answers}.", ""]
    return "\n".join(lines)


# --- the job spec -----------------------------------------------------------------------

def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _type_of(schema: dict[str, Any]) -> str:
    """A field's JSON forms in words (null, an optional field's default, left out)."""
    if "oneOf" in schema:
        return " or ".join(_type_of(option) for option in schema["oneOf"]
                           if option.get("type") != "null")
    if "enum" in schema:
        return " / ".join(f"`{value}`" for value in schema["enum"] if value is not None)
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(k for k in kind if k != "null")
    if kind == "array":
        return f"list of {_type_of(schema.get('items', {}))}"
    low, high = schema.get("minimum"), schema.get("maximum")
    pattern = schema.get("pattern", "").replace(r"(?![\s\S])", "$")
    bounds = [f"{_number(low)} to {_number(high)}" if low is not None and high is not None
              else f">= {_number(low)}" if low is not None else "",
              f"pattern `{pattern}`" if pattern and len(pattern) <= 40 else ""]
    return " ".join([kind, *[b for b in bounds if b]])


def job_spec_markdown() -> str:
    """The fields of a job spec, from the schema ``POST /api/jobs`` serves."""
    from pollux.service.http.openapi import JOB_SPEC_SCHEMA

    required = set(JOB_SPEC_SCHEMA["required"])
    lines = ["| field | type | default | what it is |", "|---|---|---|---|"]

    def rows(properties: dict[str, Any], prefix: str) -> None:
        for name, schema in properties.items():
            default = ("required" if prefix == "" and name in required
                       else f"`{json.dumps(schema['default'])}`" if "default" in schema else "")
            lines.append(f"| `{prefix}{name}` | {_cell(_type_of(schema))} | {default} | "
                         f"{_cell(schema.get('description', ''))} |")
            if "properties" in schema:
                rows(schema["properties"], f"{prefix}{name}.")

    rows(JOB_SPEC_SCHEMA["properties"], "")
    return "\n".join(lines)


# --- constants with their docstrings (the launch contract, exit codes) ------------------

def module_constants(path: Path) -> list[tuple[str, object, str]]:
    """(name, value, docstring) of every upper-case constant assigned a literal in the
    module at ``path``, with the string literal that follows it (its attribute docstring)."""
    body = ast.parse(path.read_text()).body
    found = []
    for index, node in enumerate(body):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)):
            continue
        name = node.targets[0].id
        if not name.isupper():
            continue
        following = body[index + 1] if index + 1 < len(body) else None
        doc = (following.value.value if isinstance(following, ast.Expr)
               and isinstance(following.value, ast.Constant)
               and isinstance(following.value.value, str) else "")
        found.append((name, node.value.value, " ".join(doc.split())))
    return found


def launch_env_markdown() -> str:
    """The environment variables of the launch contract (``pollux.jobenv``)."""
    rows = [(value, doc) for _, value, doc in module_constants(ROOT / "src/pollux/jobenv.py")
            if isinstance(value, str) and value.startswith("POLLUX_")]
    lines = ["| variable | what it holds |", "|---|---|"]
    lines += [f"| `{value}` | {_cell(doc) or '(see the name)'} |" for value, doc in rows]
    return "\n".join(lines)


def exit_codes_markdown() -> str:
    """The exit codes of a replica (``pollux.jobenv``) and of the CLI (``pollux.cli.main``)."""
    lines = ["| code | who | meaning |", "|---|---|---|", "| 0 | CLI, replica | success |"]
    for path, who in (("src/pollux/cli/main.py", "CLI"), ("src/pollux/jobenv.py", "replica")):
        for name, value, doc in module_constants(ROOT / path):
            if isinstance(value, int) and (name.startswith("EXIT_")
                                           or name.endswith("_EXIT_CODE")):
                meaning = doc or name.lower().replace("_", " ")
                lines.append(f"| {value} | {who} (`{name}`) | {_cell(meaning)} |")
    return "\n".join(lines)


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_markdown,
    "rest": rest_markdown,
    "job-spec": job_spec_markdown,
    "launch-env": launch_env_markdown,
    "exit-codes": exit_codes_markdown,
}


def expand(markdown: str) -> str:
    """``markdown`` with every ``<!-- generated: NAME -->`` line replaced by its block."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated block {name!r}; choose from: "
                             f"{', '.join(sorted(GENERATORS))}")
        return GENERATORS[name]()
    return MARKER.sub(replace, markdown)


FIGURES: dict[str, str] = {
    "research/results/pollux_best.png": "bench/results/pollux_best.png",
}
"""Site path -> plot a bench script wrote under bench/results/ (served from there)."""


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for site_path, source in FIGURES.items():
        files.append(File.generated(config, site_path, abs_src_path=str(ROOT / source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown)
