"""The Argo -> CLI contract: every `pdops` invocation in the committed Argo YAML parses with the
CLI's own parser (`workflows.cli.main.build_parser()`), with every enum value of every workflow parameter.

Container steps: `command` (or the image's ENTRYPOINT, read from the Dockerfile) + `args`. `sh -c`
steps: the script split into simple commands on `;`, `&&`, `||` and newlines, each `shlex`-split,
the container's env expanded ($PDOPS_ENVIRONMENT), `exec` dropped. `{{workflow.parameters.X}}` is
substituted with each value of X's enum (its default otherwise), `{{inputs.parameters.X}}` with a
value of the shape the DAG passes (a URL for *-url, text otherwise). This test needs no cluster: it
catches a flag the CLI does not have before any run. The execution tier (test_release.py) runs them.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import os
import re
import shlex

import pytest
import yaml

from tests.dockerfile import dockerfile_image
from tests.argo.spec import load_workflow_spec
from tests.argo.substitute import replace_text
from tests.conftest import ROOT
from workflows.cli.main import build_parser

ARGO = ROOT / "kustomize" / "argo"
FILES = ("pd-release.yaml", "pd-canary.yaml")
_, ENTRYPOINT = dockerfile_image(ROOT / "Dockerfile")
INPUT_SHAPES = {"base-url": "http://pd-llm-blue-serve-svc.llm-dev.svc.cluster.local:8000/v1",
                "metrics-url": "http://pd-llm-blue-head-svc.llm-dev.svc.cluster.local:8080/metrics"}


def _invocations():
    for file in FILES:
        spec = _spec(file)
        choices = [[(p.name, v) for v in (p.enum or [p.value])] for p in spec.arguments.parameters]
        for t in spec.templates:
            if t.container is None:
                continue
            for combo in itertools.product(*choices):
                scope = {f"workflow.parameters.{k}": v for k, v in combo}
                scope |= {f"inputs.parameters.{p.name}": INPUT_SHAPES.get(p.name, "text") for p in t.inputs.parameters}
                env = {e.name: replace_text(e.value or "", scope) for e in t.container.env}
                argv = [replace_text(a, scope) for a in (t.container.command or ENTRYPOINT) + t.container.args]
                for cmd in _commands(argv, env):
                    yield file, t.name, cmd


def _spec(file: str):
    return load_workflow_spec(next(d for d in yaml.safe_load_all((ARGO / file).read_text()) if d))


def _commands(argv: list[str], env: dict[str, str]) -> list[list[str]]:
    if argv[:2] != ["sh", "-c"]:
        return [argv[1:]] if argv[0] == "pdops" else []
    out = []
    for part in re.split(r";|&&|\|\||\n", argv[2]):
        lexer = shlex.shlex(part, posix=True, punctuation_chars="<>&")
        lexer.whitespace_split = True
        words, tokens = [], list(lexer)
        while tokens:  # redirections (`> FILE`, `2>&1`) are the shell's, not arguments
            w = tokens.pop(0)
            if w in (">", ">>", "<"):
                tokens.pop(0)
            elif re.fullmatch(r"\d?>&\d?|\d", w) and tokens[:1] and tokens[0] in (">", ">>", ">&"):
                tokens.pop(0), tokens.pop(0)
            elif not re.fullmatch(r"\d?>&\d", w):
                words.append(w.replace("$rc", "1"))
        with _env(env):
            words = [os.path.expandvars(w) for w in words]
        if words[:1] == ["exec"]:
            words = words[1:]
        if words[:1] == ["pdops"]:
            out.append(words[1:])
    return out


@contextlib.contextmanager
def _env(env: dict[str, str]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


INVOCATIONS = sorted({(f, t, tuple(c)) for f, t, c in _invocations()})
def _params():
    for f, t in sorted({(f, t) for f, t, _ in INVOCATIONS}):
        argvs = [list(c) for ff, tt, c in INVOCATIONS if (ff, tt) == (f, t)]
        yield pytest.param(f, t, argvs, id=f"{f}:{t}")


def test_every_step_calls_pdops():
    steps = {(f, t) for f, t, _ in INVOCATIONS}
    for file in FILES:
        spec = _spec(file)
        leaves = {t.name for t in spec.templates if t.container is not None}
        # the canary's alert step is a plain shell message; every other step is a pdops call
        assert leaves - {"alert"} <= {t for f, t in steps if f == file}, file


@pytest.mark.parametrize("file, template, argvs", list(_params()))
def test_invocations_parse_with_the_cli_parser(file, template, argvs):
    """Every distinct call of the step, over every combination of the workflow's enum parameters."""
    for argv in argvs:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                build_parser().parse_args(argv)
            except SystemExit as exc:
                pytest.fail(f"{file} template {template}: `pdops {' '.join(argv)}` exits {exc.code}: "
                            f"{err.getvalue().strip().splitlines()[-1]}")
