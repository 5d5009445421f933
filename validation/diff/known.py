"""Known divergences: a YAML file of accepted P/D differences, each with its reason and a link.

    divergences:
      - case: chat_min_tokens
        match: "status 400"            # optional: only this divergence of the case is known
        reason: Ray's prefill leg forces max_tokens=1 but keeps min_tokens
        link: https://github.com/ray-project/ray/blob/ray-2.60.0/python/ray/llm/...
        versions: Ray 2.60.0, vLLM 0.32.0

A listed divergence is reported as `known` and does not block; any other blocks. An entry whose
case ran and agreed is reported as no longer reproducing, so it can be removed.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from validation.diff.models import CaseResult, KnownDivergence
from validation.errors import InputError
from validation.yaml_input import read_yaml_file  # bounded, duplicate-key-refusing YAML reader


class KnownFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    divergences: list[KnownDivergence] = []


def load(path: str | Path) -> list[KnownDivergence]:
    data = read_yaml_file(Path(path))
    if data is None:
        return []
    if not isinstance(data, dict):
        raise InputError(path, "", f"expected a mapping with `divergences:`, got {type(data).__name__}",
                         "start the file with `divergences:` and a list of {case, reason, link}")
    try:
        entries = KnownFile.model_validate(data).divergences
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise InputError(path, field, err["msg"], "each entry needs case, reason and link "
                         "(optional match, versions); see validation/diff/known.py") from None
    seen: set[tuple[str, str | None]] = set()
    for i, e in enumerate(entries):
        if (e.case, e.match) in seen:
            raise InputError(path, f"divergences.{i}", f"{e.case!r} is listed twice", "keep one entry")
        seen.add((e.case, e.match))
    return entries


def apply(results: list[CaseResult], known: list[KnownDivergence]) -> tuple[list[str], list[str]]:
    """Mark listed divergences `known` (in place). Returns (entries that no longer reproduce,
    entries naming no case that ran)."""
    ran = {r.name: r for r in results}
    for r in results:
        if r.outcome != "differs":
            continue
        entry = next((k for k in known if k.case == r.name and (k.match is None or k.match in r.detail)), None)
        if entry is not None:
            r.outcome, r.known = "known", entry
    gone = [k.case for k in known if k.case in ran and ran[k.case].outcome == "same"]
    unused = [k.case for k in known if k.case not in ran]
    return gone, unused
