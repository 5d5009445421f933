"""One error type for bad input, so every command can print file, field and fix and exit 2 (and one
for a missing package). Shared by validation/ and workflows/ (workflows/errors.py re-exports them)."""
from __future__ import annotations

import os


class InputError(Exception):
    """Bad user input: names the file, the field and what to do. The CLI exits 2 on it."""

    def __init__(self, file: str | os.PathLike[str], field: str, problem: str, fix: str = "") -> None:
        self.file, self.field, self.problem, self.fix = str(file), field, problem, fix
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"{where}: {self.problem}" + (f"\n  fix: {self.fix}" if self.fix else "")

    def to_dict(self) -> dict[str, str]:
        return {"file": self.file, "field": self.field, "problem": self.problem, "fix": self.fix}


class MissingDependency(Exception):
    """A package a command needs is not installed (the CLI names it and how to get it; exit 1)."""

    def __init__(self, package: str, needed_for: str, cause: BaseException | None = None) -> None:
        self.package, self.needed_for = package, needed_for
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        super().__init__(f"{package} is not installed; {needed_for} needs it{detail}\n"
                         "  fix: run `make setup` (scripts/setup.sh), or use the step image built from the Dockerfile")
