"""No secret in anything the pipeline writes or prints; secrets reach steps only by Secret reference.

The canary is a fresh random API key in the environment, required by the known-timing fake server;
every output of render, build-config, compat, bench and gate (stdout, stderr, JSON, Markdown,
plots) and every Argo object is searched for it.
"""
from __future__ import annotations

import json
import re
import secrets

import pytest
import yaml

from tests.conftest import OVERLAYS, ROOT
from tests.fakes.known_timing_server import KnownTimingServer
from workflows.argo import definitions as argo
from workflows.cli.main import main

SECRET_NAME = re.compile(r"(?i)(^|_)(token|secret|password|passwd|key|apikey|credentials)(_|$)")
HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{20,}")


def walk(node, path=()):
    """(path, value) of every node of a JSON-like document."""
    yield path, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        yield from walk(value, path + (key,))


def env_lists(obj):
    """(where, env list) of every container env in an object."""
    for path, node in walk(obj):
        if path and path[-1] == "env" and isinstance(node, list):
            yield ".".join(map(str, path)), node


@pytest.fixture(scope="module")
def argo_objects():
    return argo.render_objects()


def test_api_key_never_appears_in_any_output(tmp_path, monkeypatch, capfd):
    key = f"sk-pdops-canary-{secrets.token_hex(12)}"
    monkeypatch.setenv("PDOPS_API_KEY", key)
    out = tmp_path / "out"
    release = str(ROOT / "overlays" / "local" / "release.yaml")
    with KnownTimingServer(first_token_delay=0.002, inter_token_delay=0.0005, tokens=8, api_key=key) as server:
        common = ["--base-url", server.base_url, "--model", server.model, "--api-key-env", "PDOPS_API_KEY"]
        codes = [
            main(["compat", *common, "--json", str(out / "compat.json")]),
            main(["bench", *common, "--profile", "balanced", "--concurrency", "2", "--requests", "6",
                  "--metrics-url", server.base_url.removesuffix("/v1") + "/metrics", "--json", str(out / "bench.json")]),
        ]
    codes.append(main(["gate", "--compat", str(out / "compat.json"), "--bench", str(out / "bench.json"),
                       "--release", release, "--out", str(out / "report"), "--json", str(out / "decision.json")]))
    for env in OVERLAYS:
        codes.append(main(["render", str(ROOT / "overlays" / env), "-o", str(out / f"{env}.yaml")]))
    codes.append(main(["build-config", str(ROOT / "overlays" / "local"), "--json"]))
    captured = capfd.readouterr()

    compat = json.loads((out / "compat.json").read_text())
    assert compat["ok"] and next(c for c in compat["cases"] if c["name"] == "auth_401")["status"] == "pass"
    assert json.loads((out / "bench.json").read_text())["requests_ok"] == 6      # the key was used
    assert codes[2] in (0, 1) and set(codes[3:]) == {0}, (codes, captured.err[-2000:])
    written = sorted(p for p in out.rglob("*") if p.is_file())
    assert {"compat.json", "bench.json", "decision.json", "local.yaml"} <= {p.name for p in written}
    assert any(p.suffix == ".md" for p in written) and any(p.suffix == ".png" for p in written)
    texts = {str(p): p.read_bytes() for p in written}
    texts |= {"stdout": captured.out.encode(), "stderr": captured.err.encode()}
    texts |= {name: text.encode() for name, text in argo.render_all().items()}
    for where, data in texts.items():
        assert key.encode() not in data and key[-24:].encode() not in data, f"API key leaked into {where}"


def test_api_key_reaches_validation_steps_by_secret_reference_only(argo_objects):
    for name in ("pd-release.yaml", "pd-canary.yaml"):
        (wf,) = argo_objects[name]
        spec = wf["spec"].get("workflowSpec", wf["spec"])
        templates = {t["name"]: t for t in spec["templates"]}
        (step,) = [n for n in templates if n.startswith("validate")]
        c = templates[step]["container"]
        (env,) = [e for e in c["env"] if e["name"] == argo.API_KEY_ENV]
        assert env == {"name": argo.API_KEY_ENV, "valueFrom": {"secretKeyRef": {
            **argo.API_KEY_SECRET, "optional": True}}}, (name, step)
        assert not any(e["name"] == argo.API_KEY_ENV for t in templates.values() if t is not templates[step]
                       for e in (t.get("container") or {}).get("env", [])), "only validation gets the key"
    # ... and `pdops validate` reads that variable (workflows/cli/common.py api_key)
    import os

    from workflows.cli import common as cli_common

    os.environ[argo.API_KEY_ENV] = "k-test"
    try:
        assert cli_common.api_key() == "k-test"
    finally:
        del os.environ[argo.API_KEY_ENV]


def test_no_secret_values_in_any_manifest(argo_objects, rendered_overlays):
    """Credential-named env vars (HF_TOKEN, *_API_KEY, ...) only as secretKeyRef; no workflow
    parameter carries one; no Hugging Face token string anywhere (serveConfigV2 included)."""
    objects = [o for objs in argo_objects.values() for o in objs]
    objects += [o for r in rendered_overlays.values() for o in r.objects]
    objects += [yaml.safe_load(r.rayservice["spec"]["serveConfigV2"]) for r in rendered_overlays.values()]
    seen_secret_refs = 0
    for obj in objects:
        for where, env in env_lists(obj):
            for e in env:
                if SECRET_NAME.search(e["name"]):
                    assert "value" not in e and set(e["valueFrom"]) == {"secretKeyRef"}, (where, e)
                    seen_secret_refs += 1
        for path, node in walk(obj):
            if isinstance(node, str):
                assert not HF_TOKEN.search(node), path
            if isinstance(node, dict) and path[-1:] == ("env_vars",):     # Ray runtime_env: plain values
                assert not [k for k in node if SECRET_NAME.search(k)], path
            if path[-2:-1] == ("parameters",) and isinstance(node, dict):
                assert not SECRET_NAME.search(node.get("name", "")), (path, node)
    assert seen_secret_refs >= 2       # the API key env of the validate step, in both workflows


def test_release_spec_refuses_credentials_in_env(tmp_path, capsys):
    """release.yaml is committed and rendered as plain text: a token there is refused, not rendered,
    and the refusal does not repeat it."""
    token = "hf_" + secrets.token_hex(16)
    overlay = tmp_path / "overlays" / "x"
    overlay.mkdir(parents=True)
    (overlay / "release.yaml").write_text(f"name: pd-llm\nmodel: {{id: m, source: s}}\nprefill: {{env: {{HF_TOKEN: {token}}}}}\n")
    assert main(["build-config", str(overlay)]) == 2
    out, err = capsys.readouterr()
    assert "HF_TOKEN looks like a credential" in err and token not in out + err


def test_step_image_runs_as_numeric_non_root_user():
    """Kubernetes can only enforce runAsNonRoot for a numeric USER; the workflow pins the same uid."""
    users = re.findall(r"(?m)^USER\s+(\S+)", (ROOT / "Dockerfile").read_text())
    assert users, "Dockerfile has no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))
    assert int(uid) == argo.RUN_AS_USER
