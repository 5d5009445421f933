"""`{{...}}` substitution as Argo Workflows v4.0.10 does it (util/template).

Argo marshals the object to JSON and runs valyala/fasttemplate over the text (template.go
`NewTemplate`, tags between `{{` and the next `}}`); each simple tag is looked up trimmed
(simple_template.go `simpleReplaceStrict`). Walking the Python object and replacing inside every
string (keys included) is the same thing: Argo JSON-escapes the value (strconv.Quote) and
unmarshals again. Rules emulated:
- a key present with a string value: replaced;
- a key present with no value (a skipped/omitted task's output with no default: scope.go
  `addSkippedParamToScope`): error "absent optional";
- a missing key: kept as `{{tag}}` when unresolved tags are allowed (`Replace(..., true)`), an error
  when not (`Replace(..., false)`, e.g. metric values), and an error for tags under a strict prefix
  (`ReplaceStrict(.., ["tasks", "steps"])`, dag.go `resolveDependencyReferences`) unless it is an
  `.outputs.artifacts.` reference, left for artifact resolution.
Expression tags (`{{=...}}`) and nested tags are not emulated: NotEmulated.
"""
from __future__ import annotations

import re
from typing import Any

from tests.argo.exprs import NotEmulated


class Unresolved(Exception):
    """template.IsMissingVariableErr: Argo requeues the node and waits for the variable to exist."""


class AbsentOptional(Exception):
    """A terminal substitution error (the node Errors)."""


Scope = dict[str, "str | None"]
_TAG = re.compile(r"\{\{(.*?)\}\}", re.S)


def replace_text(text: str, scope: Scope, *, allow_unresolved: bool = True,
                 strict: tuple[str, ...] = ()) -> str:
    def one(m: re.Match[str]) -> str:
        tag = m.group(1)
        key = tag.strip()
        if key.startswith("="):
            raise NotEmulated(f"expression tag {{{{{tag}}}}} (util/template/expression_template.go)")
        if "{{" in tag:
            raise NotEmulated(f"nested tag {{{{{tag}}}}}")
        if key in scope:
            value = scope[key]
            if value is None:
                raise AbsentOptional(f"unable to substitute {{{{{tag}}}}}: output is an absent optional "
                                     "(skipped/omitted node with no default)")
            return value
        if any(key == p or key.startswith(p + ".") for p in strict) and ".outputs.artifacts." not in key:
            raise Unresolved(f"failed to resolve {{{{{tag}}}}}")
        if not allow_unresolved:
            raise Unresolved(f"failed to resolve {{{{{tag}}}}}")
        return m.group(0)
    return _TAG.sub(one, text)


def replace(obj: Any, scope: Scope, *, allow_unresolved: bool = True, strict: tuple[str, ...] = ()) -> Any:
    """The same over a JSON-like object (what Argo does to a marshalled template or task)."""
    if isinstance(obj, str):
        return replace_text(obj, scope, allow_unresolved=allow_unresolved, strict=strict)
    if isinstance(obj, list):
        return [replace(v, scope, allow_unresolved=allow_unresolved, strict=strict) for v in obj]
    if isinstance(obj, dict):
        return {replace(k, scope, allow_unresolved=allow_unresolved, strict=strict):
                replace(v, scope, allow_unresolved=allow_unresolved, strict=strict) for k, v in obj.items()}
    return obj


def tags(obj: Any) -> list[str]:
    """Every `{{tag}}` (trimmed) in an object, for validation (validate.go `resolveAllVariables`)."""
    if isinstance(obj, str):
        return [m.group(1).strip() for m in _TAG.finditer(obj)]
    if isinstance(obj, list):
        return [t for v in obj for t in tags(v)]
    if isinstance(obj, dict):
        return [t for k, v in obj.items() for t in tags(k) + tags(v)]
    return []
