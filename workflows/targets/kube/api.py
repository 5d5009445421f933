"""Kubernetes API calls with typed errors (the shape of kopf's `_cogs/clients`: one request helper, errors
classified by status, callers catch what they can handle: `NotFound`, `Conflict`, ...).

Every call goes through the official client's `ApiClient.call_api` on the REST path of the kind,
as plain JSON (the generated models would reject partial objects). Writes carry `dryRun=All`
when the target is a dry run: the API server then validates and admits them and stores nothing.
"""
from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from workflows.names import FIELD_MANAGER
from workflows.targets.base import TargetError

APPLY_PATCH = "application/apply-patch+yaml"
# kind -> (apiVersion, plural, namespaced). Anything else in a manifest is refused, not guessed at.
KINDS: dict[str, tuple[str, str, bool]] = {
    "Service": ("v1", "services", True), "ServiceAccount": ("v1", "serviceaccounts", True),
    "ConfigMap": ("v1", "configmaps", True), "Pod": ("v1", "pods", True), "Event": ("v1", "events", True),
    "Node": ("v1", "nodes", False),
    "RayService": ("ray.io/v1", "rayservices", True),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets", True),
    "PodMonitor": ("monitoring.coreos.com/v1", "podmonitors", True),
    "Lease": ("coordination.k8s.io/v1", "leases", True),
    "EndpointSlice": ("discovery.k8s.io/v1", "endpointslices", True),
}


class ApiError(TargetError):
    """The API server refused a request; `status` is its HTTP status."""

    def __init__(self, status: int, reason: str, what: str, namespace: str, message: str) -> None:
        self.status, self.reason, self.message = status, reason, message
        details = [message]
        # 5xx and 429 are the API server's "try again" (client-go's rest client retries them too);
        # 0 is no HTTP answer at all. 409 Conflict says the object changed between our read and our
        # write (a resourceVersion or uid precondition, another writer): the API conventions' recovery
        # is to GET again and retry (kubernetes/community api-conventions.md, "409 StatusConflict";
        # client-go util/retry RetryOnConflict), which is what a retried step does: every step reads
        # the cluster afresh and decides again (slots.py). Other 4xx are answers about the request:
        # retrying changes nothing.
        transient = status in (0, 409, 429) or status >= 500
        if status == 403:
            details.append("the pd-release Role (kustomize/argo/rbac.yaml) grants what rollout/promote/rollback "
                           f"need in {namespace}; check the ServiceAccount the step runs as")
        super().__init__(f"Kubernetes API refused to {what} in {namespace}: {status} {reason}", details,
                         transient=transient)


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409: the object changed since it was read (resourceVersion, delete precondition), exists, or an
    apply conflict."""


class Forbidden(ApiError):
    pass


class Invalid(ApiError):
    """422: the object fails validation (e.g. a ConfigMap over 1 MiB)."""


_BY_STATUS = {404: NotFound, 409: Conflict, 403: Forbidden, 422: Invalid}


class Kube:
    def __init__(self, api: client.ApiClient, namespace: str, dry_run: bool = False) -> None:
        self.api, self.namespace, self.dry_run = api, namespace, dry_run

    def _path(self, kind: str, name: str | None = None, all_namespaces: bool = False) -> str:
        api_version, plural, namespaced = KINDS[kind]
        root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        ns = f"/namespaces/{self.namespace}" if namespaced and not all_namespaces else ""
        return f"{root}{ns}/{plural}" + (f"/{name}" if name else "")

    def request(self, method: str, kind: str, name: str | None = None, *, body: Any = None, query: dict | None = None,
                content_type: str = "application/json", what: str = "", all_namespaces: bool = False) -> Any:
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        if self.dry_run and method in ("POST", "PUT", "PATCH", "DELETE"):
            params.append(("dryRun", "All"))
        try:
            method_, url, headers, payload, post = self.api.param_serialize(
                method, self._path(kind, name, all_namespaces), query_params=params, body=body,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                auth_settings=["BearerToken"])
            response = self.api.call_api(method_, url, headers, payload, post)
            response.read()
        except urllib3.exceptions.HTTPError as exc:
            raise TargetError(f"cannot reach the Kubernetes API at {self.api.configuration.host}: {exc}",
                              ["check --kubeconfig/--context and that the cluster endpoint is reachable"],
                              transient=True) from None
        except ApiException as exc:
            raise self._error(exc.status, exc.reason, exc.body,
                              what or f"{method.lower()} {kind}/{name or ''}") from None
        if not 200 <= response.status <= 299:
            raise self._error(response.status, response.reason, response.data,
                              what or f"{method.lower()} {kind}/{name or ''}")
        return json.loads(response.data or b"null")

    def _error(self, status: int | None, reason: str | None, body: Any, what: str) -> ApiError:
        try:
            message = json.loads(body or "{}").get("message") or reason
        except (ValueError, AttributeError):
            message = reason
        return _BY_STATUS.get(status or 0, ApiError)(status or 0, str(reason), what, self.namespace, str(message))

    # ---- verbs ----

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", kind, name)
        except NotFound:
            return None

    def list(self, kind: str, labels: dict[str, str] | str | None = None, fields: str | None = None,
             all_namespaces: bool = False) -> list[dict[str, Any]]:
        selector = (labels if isinstance(labels, str) or labels is None
                    else ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
        data = self.request("GET", kind, query={"labelSelector": selector, "fieldSelector": fields},
                            all_namespaces=all_namespaces, what=f"list {KINDS[kind][1]}")
        return data.get("items") or []

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (field manager pdops, force): creates the object when it is missing."""
        return self.request("PATCH", obj["kind"], obj["metadata"]["name"], body=obj, content_type=APPLY_PATCH,
                            query={"fieldManager": FIELD_MANAGER, "force": "true"},
                            what=f"apply {obj['kind']}/{obj['metadata']['name']}")

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", obj["kind"], body=obj, query={"fieldManager": FIELD_MANAGER},
                            what=f"create {obj['kind']}/{obj['metadata']['name']}")

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT carrying metadata.resourceVersion: 409 Conflict when the object changed since it was read."""
        return self.request("PUT", obj["kind"], obj["metadata"]["name"], body=obj,
                            query={"fieldManager": FIELD_MANAGER},
                            what=f"update {obj['kind']}/{obj['metadata']['name']}")

    def delete(self, kind: str, name: str, resource_version: str | None = None, uid: str | None = None) -> bool:
        """False when already gone; with `resource_version` (or `uid`), 409 Conflict unless it is unchanged
        (or the same object, not another of that name)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        preconditions = {k: v for k, v in (("resourceVersion", resource_version), ("uid", uid)) if v}
        if preconditions:
            body["preconditions"] = preconditions
        try:
            self.request("DELETE", kind, name, body=body, what=f"delete {kind}/{name}")
            return True
        except NotFound:
            return False
