"""A finding: one thing wrong with a rendered release, with where it is and how to fix it."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    rule: str          # stable id, e.g. "kv-role", "schema"
    message: str       # what is wrong
    file: str          # the file a user edits to fix it (release.yaml, kustomization, or the manifest)
    field: str         # path inside the object/file, e.g. "RayService/pd-llm spec.rayClusterConfig.rayVersion"
    fix: str = ""      # what to do
    severity: Severity = "error"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    def render(self) -> str:
        text = f"{self.severity}[{self.rule}] {self.file}: {self.field}: {self.message}"
        return text + (f"\n    fix: {self.fix}" if self.fix else "")
