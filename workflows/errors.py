"""One error type for bad input, so every command can print file, field and fix and exit 2."""
from __future__ import annotations


class InputError(Exception):
    """Bad user input: names the file, the field and what to do. The CLI exits 2 on it."""

    def __init__(self, file: str, field: str, problem: str, fix: str = "") -> None:
        self.file, self.field, self.problem, self.fix = str(file), field, problem, fix
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"{where}: {self.problem}" + (f"\n  fix: {self.fix}" if self.fix else "")

    def to_dict(self) -> dict[str, str]:
        return {"file": self.file, "field": self.field, "problem": self.problem, "fix": self.fix}
