"""`pdops advise OVERLAY --bench FILE... [--out PATCH]`: the phase-balance change as a unified diff
of release.yaml and the overlay's node-groups patch, offered only after `pdops check` passes on a
copy of the overlay with the patch applied (`git apply`, as the person committing it will)."""
from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from pydantic import BaseModel

from validation.balance import Balance
from workflows.errors import InputError
from workflows.pipeline.advise import PhaseChange, plan, read_balances
from workflows.render.manifest import Rendered, check_references, render, repository_root
from workflows.spec import yaml_edit
from workflows.spec.release import SPEC_FILE

NODE_GROUPS = "node-groups.yaml"


class Advice(BaseModel):
    overlay: str
    verdicts: list[tuple[str, str]]       # (run, verdict)
    changes: list[PhaseChange]
    patch: str = ""
    offered: bool = False
    blocked: list[str] = []               # why a patch was not offered (pdops check's findings)

    def lines(self) -> list[str]:
        out = [f"{run}: {verdict}" for run, verdict in self.verdicts]
        for c in self.changes:
            out += c.lines()
        if not self.changes:
            out.append("no phase queued in these runs: nothing to change")
        elif self.offered:
            out.append("pdops check passes on a copy of the overlay with the patch applied")
        else:
            out += ["patch NOT offered: pdops check fails on it:"] + [f"  {b}" for b in self.blocked]
        return out


def _release_edit(text: str, c: PhaseChange, file: str) -> str:
    if yaml_edit.find(text, [c.phase], file) is None:
        return yaml_edit.append_top_level(text, f"{c.phase}:\n  replicas: {c.replicas[1] if c.replicas else 1}\n")
    if c.replicas:
        return yaml_edit.set_value(text, [c.phase], "replicas", c.replicas[1], file)
    assert c.autoscaling is not None
    (_, _), (lo, hi) = c.autoscaling
    text = yaml_edit.set_value(text, [c.phase, "autoscaling"], "max_replicas", hi, file)
    return yaml_edit.set_value(text, [c.phase, "autoscaling"], "min_replicas", lo, file)


def _group_path(group: str) -> list:
    return ["spec", "rayClusterConfig", "workerGroupSpecs", ("groupName", group)]


def _node_group_edits(overlay: Path, rendered: Rendered, c: PhaseChange, files: dict[Path, str]) -> None:
    """Set the group's pods in the overlay's patch that names the group; else a new node-groups patch."""
    kfile = overlay / "kustomization.yaml"
    if kfile not in files:
        files[kfile] = yaml_edit.read(kfile)
    kustomization = yaml.safe_load(files[kfile]) or {}
    patches: list[str] = [str(p["path"]) for p in kustomization.get("patches") or []
                          if isinstance(p, dict) and p.get("path")]
    patches += [p for p in kustomization.get("patchesStrategicMerge") or [] if isinstance(p, str)]
    cluster = ((rendered.rayservice or {}).get("spec") or {}).get("rayClusterConfig", {})
    autoscaling = bool(cluster.get("enableInTreeAutoscaling"))
    keys = ("maxReplicas",) if autoscaling else ("replicas", "minReplicas", "maxReplicas")
    for rel in patches:
        path = overlay / rel
        if path not in files:   # a patch written by an earlier change of this advice is not on disk yet
            files[path] = yaml_edit.read(path)
        if yaml_edit.find(files[path], _group_path(c.group), str(path)) is not None:
            for key in keys:
                files[path] = yaml_edit.set_value(files[path], _group_path(c.group), key, c.pods[1], str(path))
            return
    path = overlay / NODE_GROUPS
    if path not in files and path.exists():
        raise InputError(path, "", "exists but the kustomization does not patch with it, and no patch names "
                         f"group {c.group!r}",
                         f"add the {c.group} group's replicas to a patch of the overlay by hand")
    name = ((rendered.rayservice or {}).get("metadata") or {}).get("name", "pd-llm")
    text = files.get(path) or ("# Worker pods per phase for the replicas release.yaml asks (pdops advise; "
                               "docs/adoption.md#phase-balance).\n"
                               f"apiVersion: ray.io/v1\nkind: RayService\nmetadata:\n  name: {name}\n"
                               "spec:\n  rayClusterConfig:\n    workerGroupSpecs:\n")
    text += f"      - groupName: {c.group}\n" + "".join(f"        {k}: {c.pods[1]}\n" for k in keys)
    files[path] = text
    if NODE_GROUPS not in patches:
        seq = yaml_edit.find(files[kfile], ["patches"], str(kfile))
        if seq is None:
            files[kfile] = yaml_edit.append_top_level(files[kfile], f"patches:\n  - path: {NODE_GROUPS}\n")
        elif isinstance(seq, yaml.SequenceNode) and not seq.flow_style and seq.value:
            eol = files[kfile].find("\n", seq.value[-1].end_mark.index - 1)
            eol = len(files[kfile]) if eol < 0 else eol
            entry = f"\n{' ' * seq.start_mark.column}- path: {NODE_GROUPS}"
            files[kfile] = files[kfile][:eol] + entry + files[kfile][eol:]
        else:
            raise InputError(kfile, "patches", "not a block list pdops advise can add to",
                             f"add `- path: {NODE_GROUPS}` by hand")


def edits(overlay: Path, rendered: Rendered, changes: list[PhaseChange]) -> dict[Path, tuple[str | None, str]]:
    """File -> (text before or None for a new file, text after), for the files that change."""
    spec_file = overlay / SPEC_FILE
    files: dict[Path, str] = {spec_file: yaml_edit.read(spec_file)}
    originals = {p: t for p, t in files.items()}
    for c in changes:
        files[spec_file] = _release_edit(files[spec_file], c, str(spec_file))
        if c.pods[1] != c.pods[0]:
            _node_group_edits(overlay, rendered, c, files)
    out = {}
    for path, text in files.items():
        before = originals.get(path, yaml_edit.read(path) if path.exists() else None)
        if text != before:
            out[path] = (before, text)
    return out


def unified(root: Path, changed: dict[Path, tuple[str | None, str]]) -> str:
    """A diff `git apply` takes from the repository root."""
    out = []
    for path, (before, after) in sorted(changed.items()):
        rel = path.resolve().relative_to(root.resolve()).as_posix()
        out.append(f"diff --git a/{rel} b/{rel}\n" + ("new file mode 100644\n" if before is None else ""))
        out += difflib.unified_diff((before or "").splitlines(keepends=True), after.splitlines(keepends=True),
                                    "/dev/null" if before is None else f"a/{rel}", f"b/{rel}")
    return "".join(out)


def check_patch(overlay: Path, patch: str, schema_dir: Path | None = None) -> list[str]:
    """The blocking findings of `pdops check` on a copy of what the overlay reads, with the patch applied."""
    from workflows.checks.run import blocking, check_rendered
    from workflows.checks.schema import schema_dir_from_env

    root = repository_root(overlay)
    with tempfile.TemporaryDirectory(prefix="pdops-advise-") as tmp:
        copy = Path(tmp)
        for src in [*check_references(overlay), *Path(overlay).resolve().rglob("*")]:
            if src.is_file():
                dst = copy / src.resolve().relative_to(root.resolve())
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        proc = subprocess.run(["git", "apply", "-"], cwd=copy, input=patch, capture_output=True, text=True)
        if proc.returncode != 0:
            return [f"the patch does not apply: {proc.stderr.strip()}"]
        try:
            rendered = render(copy / Path(overlay).resolve().relative_to(root.resolve()))
        except InputError as exc:
            return [exc.render().replace(tmp, "<patched copy>")]
        found = blocking(check_rendered(rendered, schema_dir or schema_dir_from_env()))
        return [f.render().replace(tmp, "<patched copy>") for f in found]


def advise(overlay: Path, bench_files: list[str], schema_dir: Path | None = None) -> Advice:
    return advise_runs(overlay, read_balances(bench_files), schema_dir)


def advise_runs(overlay: Path, balances: list[tuple[str, Balance]], schema_dir: Path | None = None,
                rendered: Rendered | None = None) -> Advice:
    rendered = rendered or render(Path(overlay))
    changes = plan(rendered, balances)
    advice = Advice(overlay=str(overlay), verdicts=[(lab, b.verdict) for lab, b in balances], changes=changes)
    if not changes:
        return advice
    advice.patch = unified(repository_root(Path(overlay)), edits(Path(overlay), rendered, changes))
    advice.blocked = check_patch(Path(overlay), advice.patch, schema_dir)
    advice.offered = not advice.blocked
    return advice


def cmd_advise(args: argparse.Namespace) -> int:
    overlay = Path(args.overlay)
    if not (overlay / SPEC_FILE).is_file():
        raise InputError(overlay, "", f"no {SPEC_FILE} here", "pass an overlay directory such as overlays/dev")
    advice = advise(overlay, args.bench, Path(args.schema_dir) if args.schema_dir else None)
    for line in advice.lines():
        print(line, file=sys.stderr if args.out is None and advice.offered else sys.stdout)
    if not advice.offered:
        return 1 if advice.changes else 0
    if args.out:
        Path(args.out).write_text(advice.patch, encoding="utf-8")
        print(f"wrote {args.out}: `git apply {args.out}` from {repository_root(overlay)}")
    else:
        sys.stdout.write(advice.patch)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("advise", help="the replicas and node-group change for the phase that queued in benchmark runs, "
                       "as a checked patch")
    p.add_argument("overlay", help="overlay directory the runs were made against (e.g. overlays/dev)")
    p.add_argument("--bench", nargs="+", required=True, help="bench JSON file(s) or report.json of release runs")
    p.add_argument("--out", help="write the patch here (default: print it)")
    p.add_argument("--schema-dir", help="pinned schemas for the check (default: PDOPS_SCHEMA_DIR)")
    p.set_defaults(func=cmd_advise)
