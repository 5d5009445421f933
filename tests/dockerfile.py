"""The step image's Dockerfile as the tests read it: standard library only, so `python3 -m tests.step_venv`
can build the step venv with the machine's Python while scripts/setup.sh builds the project's .venv beside it
(.ci/run: the two pip installs each use about one core)."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

BASE_IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}  # python:3.11-slim


def dockerfile_image(dockerfile: Path) -> tuple[dict[str, str], list[str]]:
    """ENV and ENTRYPOINT of the step image, read from the Dockerfile so the two cannot drift; `$VAR`
    in an ENV value is the value so far (Docker's ENV substitution), starting from the base image's."""
    text = dockerfile.read_text().replace("\\\n", " ")
    env: dict[str, str] = dict(BASE_IMAGE_ENV)
    entrypoint: list[str] = []
    for line in text.splitlines():
        if line.startswith("ENV "):
            for item in shlex.split(line[4:]):
                key, _, value = item.partition("=")
                env[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)
        elif line.startswith("ENTRYPOINT "):
            entrypoint = json.loads(line[len("ENTRYPOINT "):])
    return env, entrypoint
