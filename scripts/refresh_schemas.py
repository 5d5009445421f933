#!/usr/bin/env python3
"""Refresh or verify the pinned upstream schemas in workflows/data/schemas (Apache-2.0 data).

Each folder is one upstream project at one tag; SOURCES below is the single list of what is pinned
(mirrored in workflows/data/schemas/README.md). The files are kept unchanged; SHA256SUMS records
what was fetched so a review (or CI) can tell an edited copy from the upstream one.

  python scripts/refresh_schemas.py --verify            # the committed files match SHA256SUMS
  python scripts/refresh_schemas.py                     # download every file from its tag, rewrite SHA256SUMS
  python scripts/refresh_schemas.py --source-root DIR   # copy from local checkouts DIR/<repo name> at the tags

To move to a new tag: edit SOURCES (folder name carries the tag), run without --verify, commit the
new folder and SHA256SUMS, remove the old folder, and update the table in workflows/data/schemas/README.md.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import urllib.request
from pathlib import Path

DEST = Path(__file__).resolve().parent.parent / "workflows" / "data" / "schemas"
SUMS = DEST / "SHA256SUMS"

# folder -> (GitHub repository, tag, {file in folder: path in the repository at the tag})
SOURCES: dict[str, tuple[str, str, dict[str, str]]] = {
    "kuberay-v1.7.0": ("ray-project/kuberay", "v1.7.0", {
        f"ray.io_{k}.yaml": f"helm-chart/kuberay-operator/crds/ray.io_{k}.yaml"
        for k in ("rayservices", "rayclusters")}),
    "argo-workflows-v4.0.10": ("argoproj/argo-workflows", "v4.0.10", {
        **{f"argoproj.io_{k}.yaml": f"manifests/base/crds/full/argoproj.io_{k}.yaml"
           for k in ("workflowtemplates", "cronworkflows", "workflows")},
        "schema.json": "api/jsonschema/schema.json"}),
    "argo-events-v1.9.11": ("argoproj/argo-events", "v1.9.11", {
        **{f"argoproj.io_{k}.yaml": f"manifests/base/crds/argoproj.io_{k}.yaml"
           for k in ("eventsources", "sensors", "eventbus")},
        "schema.json": "api/jsonschema/schema.json"}),
}


def files() -> list[tuple[str, str, str, str]]:
    """(folder/file, repository, tag, upstream path) for every pinned file."""
    return [(f"{folder}/{name}", repo, tag, path)
            for folder, (repo, tag, names) in SOURCES.items() for name, path in names.items()]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify(dest: Path) -> list[str]:
    """Problems: a pinned file missing, edited (checksum differs) or not pinned at all."""
    sums = dict(line.split("  ", 1)[::-1] for line in (dest / "SHA256SUMS").read_text().splitlines() if line)
    want = {rel for rel, *_ in files()}
    problems = [f"{rel}: in SHA256SUMS but not in SOURCES" for rel in sorted(set(sums) - want)]
    for rel in sorted(want):
        p = dest / rel
        if not p.is_file():
            problems.append(f"{rel}: missing (run scripts/refresh_schemas.py)")
        elif rel not in sums:
            problems.append(f"{rel}: no checksum in SHA256SUMS")
        elif digest(p) != sums[rel]:
            problems.append(f"{rel}: differs from the pinned upstream file "
                            f"(sha256 {digest(p)[:12]} != {sums[rel][:12]})")
    extra = {str(p.relative_to(dest)) for p in dest.glob("*/*") if p.is_file()} - want
    problems += [f"{rel}: a file no source pins (remove it or add it to SOURCES)" for rel in sorted(extra)]
    return problems


def refresh(dest: Path, source_root: Path | None) -> None:
    lines = []
    for rel, repo, tag, path in files():
        if source_root is not None:
            data = (source_root / repo.split("/")[1] / path).read_bytes()
        else:
            url = f"https://raw.githubusercontent.com/{repo}/{tag}/{path}"
            print(f"fetching {url}", file=sys.stderr)
            with urllib.request.urlopen(url, timeout=60) as resp:   # a fixed https URL of the pinned tag
                data = resp.read()
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {rel}")
    (dest / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="check the committed files against SHA256SUMS")
    ap.add_argument("--source-root", type=Path, help="local checkouts (DIR/<repo name>) at the pinned tags")
    ap.add_argument("--dest", type=Path, default=DEST, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.verify:
        problems = verify(args.dest)
        for p in problems:
            print(f"error: {args.dest}/{p}", file=sys.stderr)
        verdict = "match SHA256SUMS" if not problems else f"{len(problems)} problems"
        print(f"{len(files())} pinned schema files {verdict}")
        return 1 if problems else 0
    refresh(args.dest, args.source_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
