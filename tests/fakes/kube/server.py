"""The HTTP face of the test API server: Kubernetes REST paths onto `Store`, as kube-apiserver serves them.

Paths: /api/v1/... and /apis/GROUP/VERSION/..., namespaced (`namespaces/NS/PLURAL[/NAME[/status]]`)
and cluster-scoped or all-namespace (`PLURAL[/NAME]`). Verbs: GET (get; list with `labelSelector`
in the equality and set forms of k8s.io/apimachinery/pkg/labels, and `fieldSelector` on dotted
paths), POST, PUT, PATCH (merge-patch, strategic-merge taken as merge, json-patch, apply-patch),
DELETE (DeleteOptions preconditions, `dryRun` in the query or the body). `watch=true` is refused
(400): pdops polls. Unknown resources answer 404 like an API server without the CRD.

RBAC, when `ApiServer.rbac` is set (TestCluster.enforce_rbac: the committed Roles and RoleBindings): a request
whose bearer token authenticates as a ServiceAccount (`Rbac.tokens`: a step pod's, entered as the pod starts)
is authorized as kube-apiserver's RBAC authorizer does; any other token (the tests' own clients, the emulated
controllers) may do everything.

Fault injection for tests: `faults.forbidden` (plurals answered 403), `faults.failing`
({plural: n}: the next n writes answer 500 "etcdserver: request timed out"), `faults.before_write`
(callables run before each write, to interleave another writer), `faults.write` (a `WriteFault`:
the Nth write of one client fails as a 500, a 409, a 504 timeout or a killed process), and
`requests` records every request in the order it was served (method, path, query, user agent, body,
the caller's bearer token, when, the status answered and whether a write was stored): the write log
a test reads to see who wrote what when. A pod's token names its pod (tests/argo/pod.py), as a bound
ServiceAccount token does: kube-apiserver adds the pod's name to the caller's user info
(pkg/serviceaccount/claims.go, extra `authentication.kubernetes.io/pod-name`), which the audit log
records with every request.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import yaml

from tests.fakes.kube import apply as ssa
from tests.fakes.kube.store import BY_PATH, ApiError, Resource, Store

WRITES = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class Request:
    method: str
    path: str
    params: dict[str, str]
    agent: str
    body: Any
    user: str = ""          # the bearer token: `pod:<name>` for a step pod (tests/argo/pod.py)
    at: float = 0.0         # time.monotonic() when it was served
    status: int = 0         # what the client was answered
    stored: bool = False    # a write the store committed (not a dry run; a 504 `timeout` fault still stores)
    account: str = ""       # with RBAC enforced: the ServiceAccount the token authenticated as (Rbac.tokens)


def _verb(req: Request, name: str) -> str:
    """The request's RBAC verb (apiserver/pkg/endpoints/request/requestinfo.go NewRequestInfo)."""
    if req.method == "GET":
        return "get" if name else ("watch" if req.params.get("watch") in ("true", "1") else "list")
    if req.method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(req.method, req.method.lower())


@dataclass
class Rbac:
    """kube-apiserver's RBAC authorizer (plugin/pkg/auth/authorizer/rbac/rbac.go RulesAllow -> RuleAllows: a
    rule allows when its verbs, apiGroups and resources, "resource/subresource" for a subresource, each hold the
    request's or "*"; resourceNames limit it to those names) for the ServiceAccounts of `tokens`, with the rules of
    the Roles their RoleBindings bind in each namespace (ClusterRoles and their bindings: none are committed).
    `tokens` is the authenticator's table: a step pod's token (`pod:<name>`) is entered as the pod starts
    (tests/argo/pod.py), as the ServiceAccount its bound token's claims name (pkg/serviceaccount/claims.go)."""
    rules: dict[tuple[str, str], list[dict[str, Any]]]   # (user, namespace) -> rules
    tokens: dict[str, str] = field(default_factory=dict)  # bearer token -> ServiceAccount user
    denied: list[tuple[str, str, str, str]] = field(default_factory=list)   # user, verb, resource, namespace

    @classmethod
    def of(cls, objects: list[dict[str, Any]]) -> Rbac:
        roles = {(o["metadata"]["namespace"], o["metadata"]["name"]): o.get("rules") or []
                 for o in objects if o.get("kind") == "Role"}
        rules: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for b in (o for o in objects if o.get("kind") == "RoleBinding"):
            ns, ref = b["metadata"]["namespace"], b["roleRef"]
            if ref.get("kind") != "Role":
                raise NotImplementedError(f"RoleBinding {ns}/{b['metadata']['name']}: only Roles are emulated")
            for sub in b.get("subjects") or []:
                if sub.get("kind") == "ServiceAccount":
                    user = f"system:serviceaccount:{sub.get('namespace') or ns}:{sub['name']}"
                    rules.setdefault((user, ns), []).extend(roles.get((ns, ref["name"]), []))
        return cls(rules)

    def check(self, req: Request, res: Resource, ns: str | None, name: str, sub: str) -> None:
        """Raises 403 Forbidden as the API server words it (responsewriters/errors.go forbiddenMessage and
        apimachinery errors.NewForbidden) when the request's ServiceAccount may not do it."""
        if not req.account:
            return
        verb, resource = _verb(req, name), res.plural + (f"/{sub}" if sub else "")
        for rule in self.rules.get((req.account, ns or ""), []) if ns else []:
            if (any(v in (verb, "*") for v in rule.get("verbs") or [])
                    and any(g in (res.group, "*") for g in rule.get("apiGroups") or [])
                    and any(r in (resource, "*") for r in rule.get("resources") or [])
                    and (not rule.get("resourceNames") or name in rule["resourceNames"])):
                return
        self.denied.append((req.account, verb, resource, ns or ""))
        where = f'in the namespace "{ns}"' if ns else "at the cluster scope"
        qualified = res.plural + (f".{res.group}" if res.group else "")
        subject = f'{qualified} "{name}"' if name else qualified
        raise ApiError(403, "Forbidden", f'{subject} is forbidden: User "{req.account}" cannot {verb} resource '
                       f'"{resource}" in API group "{res.group}" {where}')


FAULT_KINDS = ("500", "409", "timeout", "kill")


@dataclass
class WriteFault:
    """Fail the `nth` write (1-based) of the clients whose user agent starts with `agent`.

    One of four ways:

    - "500": not stored; 500 InternalError "etcdserver: request timed out" (etcd's ErrTimeout as
      kube-apiserver passes it on);
    - "409": not stored; 409 Conflict "the object has been modified" (another writer came in between:
      storage/errors/storage.go InterpretUpdateError -> errors.NewConflict);
    - "timeout": STORED, then 504 Timeout: kube-apiserver's timeout filter answers 504 "request did not
      complete within the allotted timeout" while the handler goroutine carries on and may commit
      (staging/src/k8s.io/apiserver/pkg/server/filters/timeout.go, timeoutHandler: "post-timeout
      activity"), so the client cannot tell whether its write landed;
    - "kill": STORED, and every later write of that client is refused: the step's process died right
      after sending it, so nothing it would have written next reaches the cluster.

    Leases are not counted: the lock renews them on its own clock, so their number is not a function
    of the step. `seen` counts the writes so far; `fired` is the request the fault hit.
    """

    nth: int
    kind: str
    agent: str = "pdops"
    seen: int = 0
    fired: Request | None = None
    dead: bool = False

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS or self.nth < 1:
            raise ValueError(f"WriteFault(nth={self.nth}, kind={self.kind!r}): nth >= 1, kind one of {FAULT_KINDS}")

    def counts(self, req: Request, plural: str) -> bool:
        return req.method in WRITES and req.agent.startswith(self.agent) and plural != "leases"

    def before(self, req: Request) -> bool:
        """Called before a counted write is served: raises for 500/409 and after a kill; True when the
        write is the one to fail after it is stored (timeout, kill)."""
        if self.dead:
            raise ApiError(503, "ServiceUnavailable", "the client was killed (WriteFault): this write never left it")
        self.seen += 1
        if self.seen != self.nth:
            return False
        self.fired = req
        if self.kind == "500":
            raise ApiError(500, "InternalError", "etcdserver: request timed out")
        if self.kind == "409":
            raise ApiError(409, "Conflict", "Operation cannot be fulfilled: the object has been modified; please "
                           "apply your changes to the latest version and try again")
        return True

    def after(self) -> None:
        """The write the fault hit was stored: answer as the fault says."""
        if self.kind == "kill":
            self.dead = True
            raise ApiError(503, "ServiceUnavailable", "the client was killed (WriteFault) after sending this write")
        raise ApiError(504, "Timeout", "Timeout: request did not complete within the allotted timeout")


@dataclass
class Faults:
    forbidden: set[str] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)
    before_write: list[Callable[[Request], None]] = field(default_factory=list)
    write: WriteFault | None = None


_REQ = re.compile(r"^\s*([^\s!=,()]+)\s*(in|notin)\s*\(([^)]*)\)\s*$")


def label_matcher(selector: str) -> Callable[[dict], bool]:
    """k8s.io/apimachinery/pkg/labels.Parse: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`."""
    terms, depth, cur = [], 0, ""
    for ch in selector:  # split on commas outside parentheses
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    checks: list[Callable[[dict], bool]] = []
    for term in (t.strip() for t in terms if t.strip()):
        if m := _REQ.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            checks.append(lambda l, k=key, vs=values: l.get(k) in vs) if op == "in" else \
                checks.append(lambda l, k=key, vs=values: l.get(k) not in vs)
        elif "!=" in term:
            k, v = (s.strip() for s in term.split("!=", 1))
            checks.append(lambda l, k=k, v=v: l.get(k) != v)
        elif "=" in term:
            k, v = (s.strip() for s in term.replace("==", "=").split("=", 1))
            checks.append(lambda l, k=k, v=v: l.get(k) == v)
        elif term.startswith("!"):
            checks.append(lambda l, k=term[1:].strip(): k not in l)
        else:
            checks.append(lambda l, k=term: k in l)
    return lambda labels: all(c(labels) for c in checks)


def field_matcher(selector: str) -> Callable[[dict], bool]:
    def value(obj: Any, path: str) -> str:
        for part in path.split("."):
            obj = obj.get(part) if isinstance(obj, dict) else None
        return "" if obj is None else str(obj)
    terms = [t.strip() for t in selector.split(",") if t.strip()]
    pairs = [(t.split("!=", 1), False) if "!=" in t else (t.replace("==", "=").split("=", 1), True) for t in terms]
    return lambda o: all((value(o, k) == v) == eq for (k, v), eq in pairs)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 (strategic merge is taken as this: lists replaced, null deletes)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def json_patch(target: dict, ops: list[dict]) -> dict:
    import copy
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        key = (len(parent) if last == "-" else int(last)) if isinstance(parent, list) else last
        if op["op"] == "test" and parent[key] != op["value"]:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: test failed at {op['path']}")
        elif op["op"] == "remove":
            del parent[key]
        elif op["op"] in ("add", "replace"):
            if isinstance(parent, list) and op["op"] == "add":
                parent.insert(key, op["value"])
            else:
                parent[key] = op["value"]
    return doc


class ApiServer:
    def __init__(self, store: Store) -> None:
        self.store, self.faults, self.requests = store, Faults(), []
        self.rbac: Rbac | None = None
        self.app = aiohttp.web.Application(client_max_size=3 * 1024 * 1024)  # apiserver's MaxRequestBodyBytes
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        raw = await request.read()
        try:
            # libyaml's parser under PyYAML's safe constructor (same YAML, same types as yaml.safe_load): server-side
            # apply sends every object as apply-patch+yaml, and the pure-Python parser was a fifth of the CPU of
            # tests/unit/test_kube_idempotent.py (py-spy, 2026-12-07)
            body = (yaml.load(raw, Loader=yaml.CSafeLoader) if "yaml" in (request.content_type or "")
                    else json.loads(raw)) if raw else None
        except ValueError as exc:
            return _error(ApiError(400, "BadRequest", f"cannot decode the body: {exc}"))
        req = Request(request.method, request.path, dict(request.query), request.headers.get("User-Agent", ""), body,
                      user=request.headers.get("Authorization", "").removeprefix("Bearer "), at=time.monotonic())
        if self.rbac is not None:
            req.account = self.rbac.tokens.get(req.user, "")
        self.requests.append(req)
        try:
            if self.rbac is not None:
                res, ns, name, sub = self._route(req.path)
                self.rbac.check(req, res, ns, name, sub)
            fault = self.faults.write
            hit = fault is not None and fault.counts(req, self._plural(req.path)) and fault.before(req)
            answer = self.serve(req, request.content_type or "")
            req.stored = req.method in WRITES and not _dry_run(req)
            if hit and fault is not None:
                fault.after()
            req.status = 200
            return aiohttp.web.json_response(answer)
        except ApiError as exc:
            req.status = exc.code
            return _error(exc)
        except ssa.ApplyConflict as exc:
            req.status = 409
            return _error(ApiError(409, "Conflict", str(exc)))

    def _plural(self, path: str) -> str:
        try:
            return self._route(path)[0].plural
        except ApiError:
            return ""

    def _route(self, path: str) -> tuple[Resource, str | None, str, str]:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        res = BY_PATH.get((group, version, rest[0] if rest else ""))
        if res is None or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return res, ns, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""

    def serve(self, req: Request, content_type: str) -> Any:
        res, ns, name, sub = self._route(req.path)
        ns_key = ns or ""
        if res.plural in self.faults.forbidden:
            raise ApiError(403, "Forbidden", f'{res.group_plural} is forbidden: User "system:serviceaccount:test" cannot '
                           f"{req.method.lower()} resource \"{res.plural}\" in API group \"{res.group}\"")
        if req.method in WRITES:
            if self.faults.failing.get(res.plural):
                self.faults.failing[res.plural] -= 1
                raise ApiError(500, "InternalError", "etcdserver: request timed out")
            for hook in list(self.faults.before_write):
                hook(req)
        manager = req.params.get("fieldManager") or req.agent.split("/")[0] or "unknown"
        dry = _dry_run(req)
        if req.method == "GET":
            if req.params.get("watch") in ("true", "1"):
                raise ApiError(400, "BadRequest", "watch is not served by the test API server")
            if name:
                return self.store.get(res, ns_key, name)
            items, rv = self.store.list(res, ns, label_matcher(req.params.get("labelSelector", "")),
                                        field_matcher(req.params.get("fieldSelector", "")))
            return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": {"resourceVersion": str(rv)}, "items": items}
        if req.method == "POST" and not name:
            return self.store.create(res, ns_key, req.body or {}, manager, dry)
        if req.method == "PUT" and name:
            return self.store.update(res, ns_key, name, req.body or {}, manager, dry, sub)
        if req.method == "DELETE" and name:
            return self.store.delete(res, ns_key, name, (req.body or {}).get("preconditions"), dry)
        if req.method == "PATCH" and name:
            return self._patch(res, ns_key, name, sub, req, content_type, manager, dry)
        raise ApiError(405, "MethodNotAllowed", f"{req.method} is not supported on {req.path}")

    def _patch(self, res: Resource, ns: str, name: str, sub: str, req: Request, content_type: str, manager: str,
               dry: bool) -> Any:
        if content_type == "application/apply-patch+yaml":
            if not req.params.get("fieldManager"):
                raise ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                               "is required for apply patch")
            config = req.body or {}
            for k, want in (("apiVersion", res.api_version), ("kind", res.kind)):
                if config.get(k) != want:
                    raise ApiError(400, "BadRequest", f"{k} {config.get(k)!r} does not match the URL's {want!r}")
            force = req.params.get("force") in ("true", "1")
            old = self.store.find(res, ns, name)
            new = ssa.apply(old, config, manager, force, res.api_version)
            if old is None:  # apply creates (the managedFields ssa.apply recorded are kept)
                new.setdefault("metadata", {})["name"] = name
                return self.store.create(res, ns, new, manager, dry, operation="Apply")
            return self.store.update(res, ns, name, new, manager, dry, sub, operation="Apply")
        old = self.store.get(res, ns, name)
        if content_type == "application/json-patch+json":
            new = json_patch(old, req.body or [])
        else:
            new = merge_patch(old, req.body or {})
        if not (req.body or {}).get("metadata", {}).get("resourceVersion") if isinstance(req.body, dict) else True:
            new["metadata"].pop("resourceVersion", None)  # a patch without resourceVersion is unconditional
        return self.store.update(res, ns, name, new, manager, dry, sub)


def _dry_run(req: Request) -> bool:
    return req.params.get("dryRun") == "All" or (req.method == "DELETE" and "All" in ((req.body or {}).get("dryRun") or []))


def _error(exc: ApiError) -> aiohttp.web.Response:
    return aiohttp.web.json_response(exc.status(), status=exc.code)
