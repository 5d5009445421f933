"""The team's own scenarios: JSONL files, one request body per line, run differentially.

    {"name": "invoice-json", "messages": [...], "response_format": {...}, "expect": {"status": 200,
     "output_schema": {"type": "object", "required": ["total"]}}}

`name` and `expect` are taken out; the rest is the exact body sent (the model is filled in when
absent). `messages` makes it a chat request, `prompt` a completions request. `expect` is checked
on the candidate's non-streamed answer on top of agreeing with the reference: `status`,
`body_schema` (JSON schema of the response body) and `output_schema` (JSON schema of each
choice's output parsed as JSON).
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from pydantic import ValidationError

from validation.diff.models import Answer, Case, Expect
from validation.errors import InputError
from validation.yaml_input import read_text_input

MAX_BYTES = 4 * 1024 * 1024
MAX_CASES = 1000


def load(path: str | Path) -> list[Case]:
    """Every line of a scenarios file as a Case; any bad line is bad input naming FILE and line."""
    path = Path(path)
    text = read_text_input(path, MAX_BYTES, "a JSONL file", "pass a JSONL file (one request body per line)",
                           "split it into files")
    cases: list[Case] = []
    names: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        case = _case(path, n, line, path.stem)
        if case.name in names:
            raise InputError(path, f"line {n}", f"scenario name {case.name!r} is used twice", "give each a unique name")
        names.add(case.name)
        cases.append(case)
    if not cases:
        raise InputError(path, "", "no scenarios in the file", "write one JSON request body per line")
    if len(cases) > MAX_CASES:
        raise InputError(path, "", f"{len(cases)} scenarios, the limit is {MAX_CASES}", "split the file")
    return cases


def _case(path: Path, n: int, line: str, stem: str) -> Case:
    where = f"line {n}"
    try:
        body = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise InputError(path, where, f"invalid JSON: {exc}", "one JSON object per line") from None
    if not isinstance(body, dict):
        raise InputError(path, where, f"expected a JSON object (a request body), got {type(body).__name__}")
    name = body.pop("name", f"{stem}:{n}")
    if not isinstance(name, str) or not name.strip():
        raise InputError(path, f"{where}: name", "must be a non-empty string")
    try:
        expect = Expect.model_validate(body.pop("expect")) if "expect" in body else None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(path, f"{where}: expect.{'.'.join(map(str, err['loc']))}", err["msg"],
                         "expect takes status, body_schema, output_schema") from None
    for key in ("body_schema", "output_schema"):
        schema = getattr(expect, key, None)
        if schema is not None:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise InputError(path, f"{where}: expect.{key}", f"not a valid JSON schema: {exc.message}") from None
    if ("messages" in body) == ("prompt" in body):
        raise InputError(path, where, "a body needs exactly one of `messages` (chat) or `prompt` (completions)")
    api = "chat" if "messages" in body else "completions"
    return Case(name=f"scenario:{name}", api=api, body=body, also_stream=not body.get("stream"),
                covers=[], expect=expect, source=f"{path}:{n}")


def check(expect: Expect, answer: Answer) -> list[str]:
    """What of `expect` the candidate's non-streamed answer does not meet."""
    out = []
    if expect.status is not None and answer.status != expect.status:
        out.append(f"expected status {expect.status}, candidate answered {answer.status or answer.transport_error}")
    if expect.body_schema is not None:
        validator = jsonschema.Draft202012Validator(expect.body_schema)
        err = jsonschema.exceptions.best_match(validator.iter_errors(answer.body))
        if err is not None:
            out.append(f"response body does not match body_schema at {err.json_path}: {err.message[:200]}")
    if expect.output_schema is not None:
        if not answer.choices:
            out.append("no choice to check output_schema against")
        for c in answer.choices or []:
            try:
                value = json.loads(c.text)
            except ValueError:
                out.append(f"choice {c.index}: output is not JSON: {c.text[:80]!r}")
                continue
            validator = jsonschema.Draft202012Validator(expect.output_schema)
            err = jsonschema.exceptions.best_match(validator.iter_errors(value))
            if err is not None:
                out.append(f"choice {c.index}: output does not match output_schema at {err.json_path}: "
                           f"{err.message[:200]}")
    return out
