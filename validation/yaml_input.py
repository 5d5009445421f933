"""Reading a user's YAML file safely: one bounded document, duplicate keys refused, hidden
characters refused, every error an InputError naming the file, the field and the fix.

Shared by the release spec and kustomizations (workflows/spec/release.py, workflows/render/manifest.py) and by
`pdops diff`'s known-divergences file (validation/diff/known.py): it lives here, in the lower
layer, because validation/ imports nothing of workflows/.
"""
from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import Any

import yaml

from validation.errors import InputError

MAX_SPEC_BYTES = 256 * 1024
# What one YAML document may expand to (aliases count each time they are used) and how deep it may
# nest: far above any real spec or kustomization, far below what exhausts the parser or the dumper.
MAX_YAML_NODES = 20_000
MAX_YAML_DEPTH = 32


def field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic/YAML location as the field path a person reads: `prefill.engine[0].x`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently: a second
    `prefill:` block would replace the first without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: SafeLoader itself rejects it below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                        f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # an int past 4300 digits, a 30th of February...
            kind = node.tag.rpartition(":")[2]
            raise yaml.constructor.ConstructorError(None, None, f"cannot read this {kind}: {str(exc).split(';')[0]}",
                                                    node.start_mark) from None


def _bad_char(text: str) -> str | None:
    """The first control, invisible-format (bidi override, zero-width) or surrogate character."""
    for c in text:
        if unicodedata.category(c) in ("Cc", "Cf", "Cs") and c not in "\t\n\r":
            return f"U+{ord(c):04X}" + (f" ({unicodedata.name(c)})" if unicodedata.name(c, "") else "")
    return None


def _check_tree(doc: Any, file: str | os.PathLike[str]) -> None:
    """Bound size, depth (aliases included) and numbers; refuse hidden characters; name the field."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    nodes = 0
    while stack:
        loc, value = stack.pop()
        nodes += 1
        if nodes > MAX_YAML_NODES:
            raise InputError(file, "", f"expands to more than {MAX_YAML_NODES} values (YAML aliases count each use)",
                             "write the values out; a release spec or kustomization is a short file")
        if len(loc) > MAX_YAML_DEPTH:
            raise InputError(file, field_path(loc[:MAX_YAML_DEPTH]), f"nested deeper than {MAX_YAML_DEPTH} levels")
        if isinstance(value, dict):
            stack += [(loc + (k,), v) for k, v in value.items()]
            texts, what = [k for k in value if isinstance(k, str)], "a key"
        elif isinstance(value, list):
            stack += [(loc + (i,), v) for i, v in enumerate(value)]
            texts, what = [], ""
        else:
            texts, what = [value] if isinstance(value, str) else [], "the value"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) < 2**63:
            raise InputError(file, field_path(loc), "number is infinite, not a number, or beyond 64 bits",
                             "use a finite number within ±9.2e18")
        bad = next((b for b in map(_bad_char, texts) if b), None)
        if bad:
            raise InputError(file, field_path(loc), f"{what} contains {bad}, a control or invisible character",
                             "retype it in plain text (hidden characters make what you read differ from what runs)")


def parse_yaml(text: str, file: str | os.PathLike[str]) -> list[Any]:
    """The documents of a YAML text, each bounded by _check_tree; errors name the file and position."""
    try:
        docs = list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(file, where, f"invalid YAML: {problem}", "fix the YAML syntax at that position") from None
    except RecursionError:
        raise InputError(file, "", f"invalid YAML: nested deeper than {MAX_YAML_DEPTH} levels") from None
    for doc in docs:
        _check_tree(doc, file)
    return docs


def read_text_input(path: Path, max_bytes: int, kind: str, missing_fix: str, too_big_fix: str) -> str:
    """A user's text file (`kind`: "a YAML file", "a JSONL file"), size-bounded and UTF-8, with errors
    that name the file and the fix."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, "", "file not found", missing_fix) from None
    except IsADirectoryError:
        raise InputError(path, "", f"is a directory, expected {kind}") from None
    except OSError as exc:
        raise InputError(path, "", f"cannot read: {exc.strerror}") from None
    if len(raw) > max_bytes:
        raise InputError(path, "", f"file is {len(raw)} bytes, the limit is {max_bytes}", too_big_fix)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, "", f"not UTF-8 text (byte {exc.start})", "save the file as UTF-8") from None


def read_yaml_file(path: Path, max_bytes: int = MAX_SPEC_BYTES) -> Any:
    """YAML from a user file, with errors that say where; one document only, size-bounded."""
    text = read_text_input(path, max_bytes, "a YAML file", "create it or pass the right path",
                           "a release spec is a short file; move data elsewhere")
    docs = parse_yaml(text, path)
    if len(docs) != 1:
        raise InputError(path, "", f"expected exactly one YAML document, found {len(docs)}")
    return docs[0]
