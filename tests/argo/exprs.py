"""The two expression languages Argo Workflows v4.0.10 evaluates, reduced to what the committed YAML
(and the tier's own tests) use. Anything outside the subset raises `NotEmulated`, so a new operator in
the YAML fails the tier instead of being evaluated wrongly.

1. `when` (DAG task) and metric `when`: Knetic/govaluate, after `{{...}}` substitution
   (workflow/controller/steps.go `shouldExecute`). Argo turns every VARIABLE token into a STRING
   token, so `Failed != Succeeded` compares the words; tokens with a '.' are ACCESSORs
   (govaluate parsing.go) and stay unresolvable; quoted strings that parse as a date become TIME
   tokens (`tryParseTime`). Emulated: true/false, numbers, quoted strings, bare words, ==, !=,
   <, >, <=, >= (numbers), &&, ||, !, parentheses.
2. `depends` and `retryStrategy.expression`: expr-lang/expr (`argoexpr.EvalBool`), over
   `TaskResults` structs (workflow/controller/dag.go `evaluateDependsLogic`, task names with '-'
   replaced by '_') or the retry scope of strings (operator.go `buildRetryStrategyLocalScope`:
   `retries`, `lastRetry.exitCode|status|duration|message`, all strings) plus `asInt`/`asFloat`
   (util/expr/env/env.go). Emulated: identifiers with '.', strings, ints, floats, true/false,
   == != < > <= >=, && || ! and or not, `in [..]`, parentheses, asInt(), asFloat().
"""
from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any


class NotEmulated(Exception):
    """The YAML uses something the tier does not emulate: fail loudly rather than guess."""


class ExprError(Exception):
    """An expression Argo itself would reject at evaluation (a node Error, not a tier gap)."""


_TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+(?:\.\d+)?)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[<>!(),\[\]])
  | (?P<bad>\S+))""", re.X)

# govaluate parsing.go tryParseTime: these strings become TIME tokens (date comparison, not emulated)
_GO_TIME_FORMATS = ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%SZ")


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        kind = m.lastgroup
        if kind is None:
            continue
        if kind == "bad":
            raise NotEmulated(f"expression {text!r}: token {m.group(kind)!r} is not emulated")
        out.append((kind, m.group(kind)))
    return out


def _unquote(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s[1:-1])


class _Parser:
    """Precedence climbing shared by both languages: || < && < comparison < unary ! < primary."""

    def __init__(self, text: str, atom: Callable[[_Parser], Any]) -> None:
        self.text, self.toks, self.i, self.atom = text, _tokens(text), 0, atom

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise ExprError(f"unexpected end of expression {self.text!r}")
        self.i += 1
        return tok

    def is_op(self, *ops: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[1] in ops and tok[0] in ("op", "ident")

    def parse(self) -> Any:
        value = self.or_()
        if self.peek() is not None:
            raise ExprError(f"unexpected {self.peek()[1]!r} in {self.text!r}")
        return value

    def or_(self) -> Any:
        left = self.and_()
        while self.is_op("||", "or"):
            self.take()
            right = self.and_()
            left = _bool(left, self.text) or _bool(right, self.text)
        return left

    def and_(self) -> Any:
        left = self.cmp()
        while self.is_op("&&", "and"):
            self.take()
            right = self.cmp()
            left = _bool(left, self.text) and _bool(right, self.text)
        return left

    def cmp(self) -> Any:
        left = self.unary()
        while self.is_op("==", "!=", "<", ">", "<=", ">=", "in"):
            op = self.take()[1]
            right = self.unary()
            left = _compare(op, left, right, self.text)
        return left

    def unary(self) -> Any:
        if self.is_op("!", "not"):
            self.take()
            return not _bool(self.unary(), self.text)
        if self.is_op("("):
            self.take()
            value = self.or_()
            if self.take()[1] != ")":
                raise ExprError(f"missing ) in {self.text!r}")
            return value
        return self.atom(self)


def _bool(value: Any, text: str) -> bool:
    if not isinstance(value, bool):
        raise ExprError(f"{text!r}: {value!r} is not a boolean")
    return value


def _compare(op: str, left: Any, right: Any, text: str) -> Any:
    if op == "in":
        if not isinstance(right, list):
            raise ExprError(f"{text!r}: right side of `in` is not a list")
        return left in right
    if op in ("==", "!="):
        # govaluate: reflect.DeepEqual; expr-lang: equality of untyped values. "1" == 1 is false in both.
        same = type(left) is type(right) or (isinstance(left, (int, float)) and isinstance(right, (int, float))
                                               and not isinstance(left, bool) and not isinstance(right, bool))
        equal = same and left == right
        return equal if op == "==" else not equal
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
    if not numeric:
        raise ExprError(f"{text!r}: {op} needs numbers, got {left!r} and {right!r}")
    return {"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right}[op]


# ---- govaluate (`when`) -------------------------------------------------------------------------------

def _govaluate_atom(p: _Parser) -> Any:
    kind, text = p.take()
    if kind == "num":
        return float(text)
    if kind == "str":
        value = _unquote(text)
        for fmt in _GO_TIME_FORMATS:
            try:
                datetime.strptime(value, fmt)
            except ValueError:
                continue
            raise NotEmulated(f"when {p.text!r}: {text} is a govaluate TIME token (date comparison)")
        return value
    if kind == "ident":
        if text in ("true", "false"):
            return text == "true"
        if text in ("in", "IN", "and", "or", "not"):
            raise NotEmulated(f"when {p.text!r}: operator {text!r}")
        if "." in text:  # an ACCESSOR: Argo only rewrites VARIABLE tokens, and has no parameters
            raise ExprError(f"when {p.text!r}: accessor {text!r} cannot be evaluated (no parameters)")
        return text  # shouldExecute: VARIABLE -> STRING
    raise ExprError(f"when {p.text!r}: unexpected {text!r}")


def eval_when(text: str) -> bool:
    """shouldExecute(when): "" is true; the result must be a boolean."""
    if text == "":
        return True
    if "{{" in text:
        raise ExprError(f"when {text!r}: unresolved {{{{...}}}} (govaluate: invalid token)")
    result = _Parser(text, _govaluate_atom).parse()
    if not isinstance(result, bool):
        raise ExprError(f"Expected boolean evaluation for {text!r}. Got {result!r}")
    return result


# ---- expr-lang (`depends`, retry `expression`) ----------------------------------------------------------

def _expr_atom(env: dict[str, Any]) -> Callable[[_Parser], Any]:
    def atom(p: _Parser) -> Any:
        kind, text = p.take()
        if kind == "num":
            return float(text) if "." in text else int(text)
        if kind == "str":
            return _unquote(text)
        if kind == "op" and text == "[":
            items = []
            while not p.is_op("]"):
                items.append(p.or_())
                if p.is_op(","):
                    p.take()
            p.take()
            return items
        if kind != "ident":
            raise ExprError(f"{p.text!r}: unexpected {text!r}")
        if text in ("true", "false"):
            return text == "true"
        if text in ("asInt", "asFloat") and p.is_op("("):
            p.take()
            arg = p.or_()
            if p.take()[1] != ")":
                raise ExprError(f"{p.text!r}: missing ) after {text}(")
            try:
                return int(arg) if text == "asInt" else float(arg)
            except (TypeError, ValueError):
                raise ExprError(f"{p.text!r}: {text}({arg!r}) failed") from None
        if p.is_op("("):
            raise NotEmulated(f"{p.text!r}: function {text}() is not emulated")
        value: Any = env
        for part in text.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ExprError(f"{p.text!r}: unknown name {text!r}")
            value = value[part]
        return value
    return atom


def eval_expr(text: str, env: dict[str, Any]) -> Any:
    return _Parser(text, _expr_atom(env)).parse()


TASK_RESULTS = ("Succeeded", "Failed", "Errored", "Skipped", "Omitted", "Daemoned", "AnySucceeded", "AllFailed")


def eval_depends(logic: str, phases: dict[str, str]) -> bool:
    """dag.go evaluateDependsLogic: one TaskResults per dependency (its node phase), names with '-'
    replaced by '_' in both the scope and the expression. No task groups here (no withItems), so
    AnySucceeded/AllFailed are false."""
    scope = {name.replace("-", "_"): {
        "Succeeded": phase == "Succeeded", "Failed": phase == "Failed", "Errored": phase == "Error",
        "Skipped": phase == "Skipped", "Omitted": phase == "Omitted", "Daemoned": False,
        "AnySucceeded": False, "AllFailed": False} for name, phase in phases.items()}
    result = eval_expr(logic.replace("-", "_"), scope)
    return _bool(result, logic)


# ancestry.go taskNameRegex: `name.Result` or a bare task name
_DEPENDS_NAME = re.compile(r"([a-zA-Z0-9][-a-zA-Z0-9]*?\.[A-Z][a-zA-Z]+)|([a-zA-Z0-9][-a-zA-Z0-9]*)")


def depends_tasks(logic: str) -> list[str]:
    """common.GetTaskDependencies: the task names a depends expression mentions. A bare name (no
    .Result) expands to (X.Succeeded || X.Skipped || X.Daemoned) in Argo; not used here -> NotEmulated."""
    names = []
    for m in _DEPENDS_NAME.finditer(logic):
        if m.group(1):
            name, result = m.group(1).split(".")
            if result not in TASK_RESULTS:
                raise ExprError(f"task result '{result}' for task '{name}' is invalid")  # ValidateTaskResults
            names.append(name)
        else:  # also `and`/`or`: Argo's regex takes them for task names too
            raise NotEmulated(f"depends {logic!r}: bare task name {m.group(2)!r} (expandDependency)")
    return list(dict.fromkeys(names))
