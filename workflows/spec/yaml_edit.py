"""Edit one value of a committed YAML file in place, keeping its comments, layout and flow style:
the node's position comes from PyYAML's composer (start/end marks), and only those characters
change, so the change reads as a one-line diff a person can review (`pdops advise`)."""
from __future__ import annotations

from pathlib import Path

import yaml

from workflows.errors import InputError

Step = str | tuple[str, str]   # a mapping key, or (key, value): the sequence item whose `key` is `value`


def _compose(text: str, file: str) -> yaml.Node:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise InputError(file, "", f"invalid YAML: {exc}") from None
    if node is None:
        raise InputError(file, "", "empty YAML document")
    return node


def _child(node: yaml.Node, step: Step) -> yaml.Node | None:
    if isinstance(step, tuple):
        key, want = step
        if not isinstance(node, yaml.SequenceNode):
            return None
        for item in node.value:
            if isinstance(item, yaml.MappingNode) and any(
                    k.value == key and getattr(v, "value", None) == want for k, v in item.value):
                return item
        return None
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((v for k, v in node.value if k.value == step), None)


def find(text: str, path: list[Step], file: str = "") -> yaml.Node | None:
    node: yaml.Node | None = _compose(text, file)
    for step in path:
        node = _child(node, step) if node is not None else None
    return node


def set_value(text: str, path: list[Step], key: str, value: int, file: str) -> str:
    """`key: value` in the mapping at `path`: the existing scalar replaced, else the key added (in a
    flow mapping before its `}`, in a block mapping on a line of its own after its first key)."""
    mapping = find(text, path, file)
    where = ".".join(s if isinstance(s, str) else f"[{s[0]}={s[1]}]" for s in path)
    if not isinstance(mapping, yaml.MappingNode):
        raise InputError(file, where, "not a mapping where pdops advise expected one",
                         "make the change by hand, or restore the layout the overlays use")
    for k, v in mapping.value:
        if k.value == key:
            if not isinstance(v, yaml.ScalarNode):
                raise InputError(file, f"{where}.{key}", "expected a number")
            return text[:v.start_mark.index] + str(value) + text[v.end_mark.index:]
    if mapping.flow_style:
        end = text.rindex("}", mapping.start_mark.index, mapping.end_mark.index)
        sep = ", " if mapping.value else ""
        return text[:end].rstrip() + f"{sep}{key}: {value}" + text[end:]
    first_key, first_value = mapping.value[0]
    if first_value.end_mark.line != first_key.start_mark.line:
        raise InputError(file, where, f"cannot add {key} after a multi-line first entry",
                         f"add `{key}: {value}` by hand")
    eol = text.find("\n", first_value.end_mark.index)
    eol = len(text) if eol < 0 else eol
    return text[:eol] + "\n" + " " * first_key.start_mark.column + f"{key}: {value}" + text[eol:]


def append_top_level(text: str, block: str) -> str:
    return text + ("" if text.endswith("\n") or not text else "\n") + block


def read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(path, "", f"cannot read: {exc.strerror}") from None
