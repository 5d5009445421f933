"""Bad release specs, overlays and report files, many of them generated (hypothesis), through the real
CLI entry: each ends in exit 2 with `error: FILE: FIELD`, never a traceback, and `render -o` writes
nothing. Well-formed-but-wrong manifests (e.g. a patch setting maxReplicas to a word) are findings
(exit 1), covered by test_rules.py.

Examples are derandomized and few (a case that gets past the spec pays for a kustomize run), so the
file stays under a minute on 2 cores; PDOPS_FUZZ_SCALE=20 runs twenty times as many, at random.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from tests.conftest import ROOT
from validation.yaml_input import MAX_SPEC_BYTES, MAX_YAML_DEPTH, field_path
from workflows.cli.main import main
from workflows.spec.tiny_model import NAME

SCALE = int(os.environ.get("PDOPS_FUZZ_SCALE", "1"))


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=SCALE == 1, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# The richest spec (prod) plus the free-form parts it lacks; mutations start from it.
BASE = yaml.safe_load((ROOT / "overlays" / "prod" / "release.yaml").read_text())
BASE["prefill"]["env"] = {"VLLM_LOGGING_LEVEL": "INFO"}
BASE["decode"]["engine_kwargs"] = {"enable_prefix_caching": True, "compilation_config": {"level": 0}}
FREE_FORM = ("engine_kwargs", "env")          # keys chosen by the user, not by the spec model
BOUNDED_BY_SPEC = ("slo", "validation")       # validation/config.py does not bound sizes (yet)


def nodes(doc, path=()):
    """(path, value) of every node below the root, depth first."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for key, value in items:
        yield path + (key,), value
        yield from nodes(value, path + (key,))


def spec_nodes(kind=object, *, free_form=False, sized=True):
    """Nodes of BASE of one type (int excludes bool); outside engine_kwargs/env unless free_form;
    outside slo/validation when the test is about sizes."""
    return [(p, v) for p, v in nodes(BASE)
            if (type(v) is int if kind is int else isinstance(v, kind))
            and (free_form or not set(p) & set(FREE_FORM)) and not (sized and p[0] in BOUNDED_BY_SPEC)]


def put(doc, path, value):
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """kustomize/ and overlays/local copied, next to a folder outside the repository."""
    top = tmp_path_factory.mktemp("bad-input")
    shutil.copytree(ROOT / "kustomize", top / "repo" / "kustomize")
    shutil.copytree(ROOT / "overlays" / "local", top / "repo" / "overlays" / "local")
    (top / "outside").mkdir()
    (top / "outside" / "kustomization.yaml").write_text("resources: [cm.yaml]\n")
    (top / "outside" / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: stolen}\n")
    return top / "repo"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:       # argparse usage errors
            code = exc.code
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def written(path: Path, data: str | bytes):
    original = path.read_bytes()
    path.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    try:
        yield path
    finally:
        path.write_bytes(original)


def outcome(repo: Path, command: str) -> tuple[int, str, bool]:
    """(exit code, stderr, whether `render -o` wrote its file) of one command on the overlay."""
    overlay = repo / "overlays" / "local"
    out_file = repo.parent / "rendered.yaml"
    out_file.unlink(missing_ok=True)
    argv = [command, str(overlay)] + (["-o", str(out_file)] if command == "render" else [])
    code, out, err = run(*argv)
    if code == 2:
        assert out == ""
    return code, err, out_file.exists()


def assert_rejected(repo: Path, name: str, data: str | bytes, field: str | None = None,
                    commands=("check", "render", "build-config"), words: str = "") -> None:
    with written(repo / "overlays" / "local" / name, data) as path:
        for command in commands:
            code, err, wrote = outcome(repo, command)
            assert code == 2 and not wrote, (command, code, err)
            assert err.startswith(f"error: {path}"), err
            if field is not None:
                assert err.startswith(f"error: {path}: {field}"), err
            assert words in err, err


def spec_text(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def test_base_spec_is_accepted(repo):
    """The mutation base is valid, so each rejection below is the mutation's doing."""
    with written(repo / "overlays" / "local" / "release.yaml", spec_text(BASE)):
        code, out, err = run("build-config", str(repo / "overlays" / "local"))
    assert code == 0, err


# -- release.yaml: generated ----------------------------------------------------------------------

@fuzz(15)
@given(where=st.sampled_from([()] + [p for p, _ in spec_nodes(dict)]),
       key=st.from_regex(r"x_[a-z0-9_]{0,10}", fullmatch=True))
def test_unknown_key_anywhere(repo, where, key):
    doc = put(BASE, where + (key,), 1) if where else {**BASE, key: 1}
    assert_rejected(repo, "release.yaml", spec_text(doc), field_path(where + (key,)), ("check",), "unknown field")


junk = st.one_of(st.lists(st.integers(0, 9), max_size=2), st.dictionaries(st.sampled_from("ab"), st.integers(0, 9), max_size=2))


@fuzz(20)
@given(node=st.sampled_from(spec_nodes(sized=False)), data=st.data())
def test_wrong_type_anywhere(repo, node, data):
    path, value = node
    wrong = data.draw(st.lists(st.integers(0, 9), max_size=2) if isinstance(value, dict) else
                      st.dictionaries(st.sampled_from("ab"), st.integers(0, 9), max_size=2) if isinstance(value, list)
                      else junk)
    assert_rejected(repo, "release.yaml", spec_text(put(BASE, path, wrong)), field_path(path), ("check",))


@fuzz(10)
@given(node=st.sampled_from(spec_nodes(int)), huge=st.one_of(st.integers(2**31, 2**62), st.integers(2**63, 2**300),
                                                            st.integers(-(2**300), -1)))
def test_huge_or_negative_number(repo, node, huge):
    path, _ = node
    assert_rejected(repo, "release.yaml", spec_text(put(BASE, path, huge)), field_path(path), ("check",))


@fuzz(8)
@given(node=st.sampled_from(spec_nodes(str)), size=st.integers(33_000, MAX_SPEC_BYTES - 2_000))
def test_huge_string(repo, node, size):
    path, _ = node
    assert_rejected(repo, "release.yaml", spec_text(put(BASE, path, "a" * size)), field_path(path), ("check",))


@fuzz(10)
@given(node=st.sampled_from([p for p, _ in nodes(BASE)]), depth=st.integers(MAX_YAML_DEPTH + 1, 1_500),
       brackets=st.sampled_from(["[]", "{}"]))
def test_deep_nesting(repo, node, depth, brackets):
    opening = "[" if brackets == "[]" else "{a: "
    deep = opening * depth + "1" + brackets[1] * depth
    text = spec_text(put(BASE, node, "DEEP_VALUE_HERE")).replace("DEEP_VALUE_HERE", deep)
    assert_rejected(repo, "release.yaml", text, None, ("check",), f"nested deeper than {MAX_YAML_DEPTH} levels")


hidden = st.characters(categories=["Cc", "Cf", "Cs"], exclude_characters="\t\n\r")


@fuzz(20)
@given(node=st.sampled_from(spec_nodes(str, free_form=True, sized=False) + spec_nodes(dict, free_form=True, sized=False)),
       char=hidden, at=st.integers(0, 100))
def test_hidden_characters_in_values_and_keys(repo, node, char, at):
    """NUL, bidi overrides, zero-width and lone surrogates: what a reviewer sees is not what would run."""
    path, value = node
    if isinstance(value, dict):
        assume(value)
        key = next(iter(value))
        value = {key[:at] + char + key[at:] if k == key else k: v for k, v in value.items()}
    else:
        value = value[:at] + char + value[at:]
    assert_rejected(repo, "release.yaml", spec_text(put(BASE, path, value)), field_path(path), ("check",),
                    f"U+{ord(char):04X}")


@fuzz(12)
@given(name=st.one_of(
    st.builds(lambda up, rest: "../" * up + rest, st.integers(1, 8), st.sampled_from(["x", "etc", "tmp/m", ""])),
    st.sampled_from(["/etc", "/tmp/m", "..", ".", ".hidden", "a/b", "a\\b", "", "x" * 65]),
    st.text(st.characters(categories=["L", "N", "P", "S", "Zs"]), min_size=1, max_size=20).filter(
        lambda s: not NAME.fullmatch(s))))
def test_tiny_model_name_cannot_leave_the_cache(repo, name):
    doc = put(BASE, ("model", "source"), "tiny-model://" + name)
    assert_rejected(repo, "release.yaml", spec_text(doc), "model.source", words="tiny-model name")


@fuzz(25)
@given(edit=st.tuples(st.integers(0, 2_000), st.integers(0, 40), st.text(max_size=30)))
def test_any_edit_of_a_valid_spec_fails_cleanly_or_works(repo, edit):
    """Delete and insert anywhere: exit 0, 1 or 2, never a traceback; a file only on exit 0."""
    text = (ROOT / "overlays" / "local" / "release.yaml").read_text()
    at, cut, insert = edit
    at = min(at, len(text))
    with written(repo / "overlays" / "local" / "release.yaml", text[:at] + insert + text[at + cut:]) as path:
        code, err, wrote = outcome(repo, "render")
        assert code in (0, 1, 2) and wrote == (code == 0), (code, err)
        assert code != 2 or err.startswith(f"error: {path}"), err


@fuzz(15)
@given(data=st.binary(max_size=3_000))
def test_arbitrary_bytes_as_release_spec(repo, data):
    assert_rejected(repo, "release.yaml", data, None, ("check",))


# -- release.yaml: cases found while fuzzing, and the classic ones ----------------------------------

@pytest.mark.parametrize("text, field, words", [
    ("", "", "found 0"),
    ("name: pd-llm\n---\nname: other\n", "", "found 2"),
    ("name: pd-llm\nname: other\nmodel: {id: m, source: s}\n", "line 2, column 1", "duplicate key 'name'"),
    ("name: !!python/object/apply:os.system [id]\n", "line 1", "could not determine a constructor"),
    ("name: pd-llm\nmodel: {id: m, source: s, max_model_len: " + "9" * 5000 + "}\n", "line 2", "cannot read this int"),
    ("name: pd-llm\nmodel: {id: m, source: s}\nprefill: {env: {A: 2001-02-30}}\n", "line 3", "cannot read this timestamp"),
    ("name: pd-llm\nmodel: {id: m, source: s}\nprefill: {engine_kwargs: {x: 0b" + "1" * 200 + "}}\n",
     "prefill.engine_kwargs.x", "beyond 64 bits"),
    ("name: pd-llm\nmodel: {id: m, source: s}\nslo: {prefill: {ttft_p90_ms: .inf}}\n", "slo.prefill.ttft_p90_ms", "infinite"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n", "", "expands to more than"),
    ("name: pd-llm\nmodel: {id: m, source: s}\nprefill: {engine_kwargs: {tensor_parallel_size: many}}\n",
     "prefill.engine_kwargs", "use tensor_parallel_size of this phase"),
    ("name: pd-llm\nmodel: {id: m, source: s}\ndecode: {engine_kwargs: {kv_transfer_config: 5}}\n",
     "decode.engine_kwargs", "must be a mapping"),
    ("name: pd-llm\nmodel: {id: m, source: s}\nprefill: {env: {A=B: x}}\n", "prefill.env.A=B", "should match pattern"),
    ("name: pd-llm\nmodel: {id: \"m\\n\", source: s}\n", "model.id", "should match pattern"),
    ("name: pd-llm\nmodel: {id: m, source: s}\n#" + "x" * MAX_SPEC_BYTES + "\n", "", f"the limit is {MAX_SPEC_BYTES}"),
    ("name: pd-llm\x00\n", "", "unacceptable character #x0000"),
])
def test_bad_release_spec_examples(repo, text, field, words):
    assert_rejected(repo, "release.yaml", text, field, words=words)


@pytest.mark.parametrize("data, words", [
    (bytes(range(256)), "not UTF-8"),
    ("name: pd-llm\nmodel: {id: m, source: s}\n".encode("utf-16"), "not UTF-8"),
])
def test_release_spec_not_utf8(repo, data, words):
    assert_rejected(repo, "release.yaml", data, "", words=words)


def test_tiny_model_command_refuses_a_traversal_name(tmp_path, monkeypatch):
    monkeypatch.setenv("PDOPS_HOME", str(tmp_path / "home"))
    code, _, err = run("tiny-model", "--name", "../../escaped")
    assert code == 2 and "tiny-model name '../../escaped'" in err
    assert not (tmp_path / "escaped").exists() and not list(tmp_path.rglob("escaped*"))


# -- kustomization.yaml ----------------------------------------------------------------------------

LOCAL_KUSTOMIZATION = yaml.safe_load((ROOT / "overlays" / "local" / "kustomization.yaml").read_text())
REFERENCES = {  # field -> how to place a path there
    "resources[1]": lambda k, p: {**k, "resources": k["resources"] + [p]},
    "components[1]": lambda k, p: {**k, "components": k["components"] + [p]},
    "patches[0].path": lambda k, p: {**k, "patches": [{"path": p}]},
    "patchesStrategicMerge[0]": lambda k, p: {**k, "patchesStrategicMerge": [p]},
    "openapi.path": lambda k, p: {**k, "openapi": {"path": p}},
    "configMapGenerator[0].files[0]": lambda k, p: {**k, "configMapGenerator": [{"name": "c", "files": [f"key={p}"]}]},
    "secretGenerator[0].envs[0]": lambda k, p: {**k, "secretGenerator": [{"name": "s", "envs": [p]}]},
    "crds[0]": lambda k, p: {**k, "crds": [p]},
    "transformers[0]": lambda k, p: {**k, "transformers": [p]},
}
outside_paths = st.one_of(
    st.builds(lambda up, rest: "../" * up + rest, st.integers(3, 10),
              st.sampled_from(["etc/passwd", "etc/hostname", "etc", "outside", "outside/cm.yaml", "proc/self/environ"])),
    st.sampled_from(["/etc/passwd", "/etc/hostname", "/proc/self/environ", "/root",
                     "https://github.com/kubernetes-sigs/kustomize//examples/helloWorld?ref=v5.0.0",
                     "github.com/kubernetes-sigs/kustomize/examples/helloWorld", "git@github.com:org/repo.git",
                     "no-such-file.yaml", "../../kustomize/nope"]))


@fuzz(25)
@given(field=st.sampled_from(sorted(REFERENCES)), path=outside_paths)
def test_kustomization_cannot_name_files_outside_the_repository(repo, field, path):
    """Renders run with LoadRestrictionsNone: without the fence, kustomize would read /etc/hostname
    into a ConfigMap, include a base from anywhere on disk, or fetch one from the network."""
    text = yaml.safe_dump(REFERENCES[field](LOCAL_KUSTOMIZATION, path), sort_keys=False)
    assert_rejected(repo, "kustomization.yaml", text, field, ("check", "render"), "the repository")


def test_symlink_out_of_the_repository_is_outside(repo):
    link = repo / "overlays" / "local" / "elsewhere"
    link.symlink_to(repo.parent / "outside", target_is_directory=True)
    try:
        text = yaml.safe_dump({**LOCAL_KUSTOMIZATION, "resources": ["../../kustomize/base", "elsewhere"]})
        assert_rejected(repo, "kustomization.yaml", text, "resources[1]", ("check", "render"), "points outside")
    finally:
        link.unlink()


def test_included_kustomization_is_fenced_too(repo):
    """The fence follows resources into other kustomizations and names the file that has the path."""
    base = repo / "kustomize" / "base" / "kustomization.yaml"
    k = yaml.safe_load(base.read_text())
    with written(base, yaml.safe_dump({**k, "resources": k["resources"] + ["../../../outside"]})):
        code, err, wrote = outcome(repo, "render")
    assert code == 2 and not wrote and err.startswith(f"error: {base}: resources[{len(k['resources'])}]"), err


@pytest.mark.parametrize("text, field, words", [
    ("", "", "found 0"),
    ("resources: [unclosed\n", "line 2", "invalid YAML"),
    ("resources: [../../kustomize/base]\nresourcez: [x]\n", "", 'unknown field "resourcez"'),
    ("resources: 5\n", "", "kustomize build failed"),
    ("- a\n", "", "kustomize build failed"),
    ("resources: [../../kustomize/base]\nresources: [../../kustomize/base]\n", "line 2", "duplicate key"),
    ("namespace: \"pdops\u202e-local\"\nresources: [../../kustomize/base]\n", "namespace", "U+202E"),
    ("x: " + "[" * 3000 + "]" * 3000 + "\n", "", "nested deeper"),
    ("resources: [../../kustomize/base]\n#" + "x" * MAX_SPEC_BYTES + "\n", "", "the limit is"),
])
def test_bad_kustomization_examples(repo, text, field, words):
    assert_rejected(repo, "kustomization.yaml", text, field, ("check", "render"), words)


@fuzz(10)
@given(data=st.binary(max_size=2_000))
def test_arbitrary_bytes_as_kustomization(repo, data):
    assert_rejected(repo, "kustomization.yaml", data, None, ("render",))


def test_patch_with_a_value_of_the_wrong_type_is_a_finding(repo):
    """kustomize accepts `maxReplicas: lots`; the rules must report it, not crash on int('lots')."""
    patch = repo / "overlays" / "local" / "lots.yaml"
    patch.write_text("apiVersion: ray.io/v1\nkind: RayService\nmetadata: {name: pd-llm}\nspec:\n  rayClusterConfig:\n"
                     "    workerGroupSpecs:\n    - {groupName: prefill, maxReplicas: lots}\n")
    try:
        with written(repo / "overlays" / "local" / "kustomization.yaml",
                     yaml.safe_dump({**LOCAL_KUSTOMIZATION, "patches": [{"path": "lots.yaml"}]})):
            code, err, wrote = outcome(repo, "render")
    finally:
        patch.unlink()
    assert code == 1 and not wrote, err
    assert "maxReplicas: 'lots' is not of type 'integer'" in err and "could not be checked" in err


junk_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=4),
                        st.lists(st.integers(0, 2), max_size=2), st.dictionaries(st.sampled_from("ab"), st.integers(0, 2), max_size=2))


@fuzz(30)
@given(data=st.data(), junk=junk_values)
def test_check_of_a_damaged_manifest_never_crashes(rendered, tmp_path_factory, data, junk):
    """`check -f` on a rendered manifest with any one value replaced (objects or serveConfigV2):
    findings or bad input, never a traceback."""
    from workflows.render.manifest import dump_manifest, dump_yaml, serve_config_of

    r = rendered("local")
    inside_serve_config = data.draw(st.booleans())
    doc = serve_config_of(r.rayservice) if inside_serve_config else r.objects
    path, _ = data.draw(st.sampled_from(list(nodes(doc))))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = junk
    if inside_serve_config:
        r.rayservice["spec"]["serveConfigV2"] = dump_yaml(doc)
    manifest = tmp_path_factory.mktemp("damaged") / "manifest.yaml"
    manifest.write_text(dump_manifest(r.objects))
    code, out, err = run("check", "-f", str(manifest))
    assert code in (0, 1, 2), err


# -- pdops compat / bench / gate arguments ---------------------------------------------------------

URL = "http://127.0.0.1:9/v1"       # nothing listens: every case must stop before sending anything
BENCH = ["bench", "--base-url", URL, "--model", "m", "--profile", "balanced"]


@pytest.mark.parametrize("argv, words", [
    (["compat", "--base-url", "127.0.0.1:8000", "--model", "m"], "argument --base-url: expected http(s)://"),
    (["compat", "--base-url", "file:///etc/passwd", "--model", "m"], "argument --base-url"),
    (["compat", "--base-url", URL, "--model", "m", "--only", "nope"], "unknown compat case(s): nope"),
    (["compat", "--base-url", URL, "--model", "m", "--optional", "nope"], "unknown compat case(s): nope"),
    (["compat", "--base-url", URL, "--model", "m", "--json", "/tmp"], "argument --json: '/tmp' is a directory"),
    (BENCH + ["--concurrency", "0"], "argument --concurrency: expected a finite number > 0"),
    (BENCH + ["--concurrency", "two"], "argument --concurrency: expected a number"),
    (BENCH + ["--rate", "nan"], "argument --rate"),
    (BENCH + ["--rate", "inf"], "argument --rate"),
    (BENCH + ["--concurrency", "1", "--requests", "-1"], "argument --requests"),
    (BENCH + ["--concurrency", "1", "--warmup", "-1"], "argument --warmup: expected a finite number >= 0"),
    (BENCH + ["--concurrency", "1", "--metrics-url", "localhost:8080"], "argument --metrics-url"),
    (BENCH[:-2] + ["--profile", "nope", "--concurrency", "1"], "unknown profile 'nope'"),
    (BENCH[:-2] + ["--concurrency", "1"], "need --profile or both"),
])
def test_compat_and_bench_argument_errors(argv, words):
    code, out, err = run(*argv)
    assert code == 2 and words in err, err


@pytest.fixture
def reports(tmp_path):
    files = {"missing": None, "bad": "{not json", "empty": "", "number": "5", "ints": "[1, 2]",
             "deep": "[" * 100_000 + "]" * 100_000, "benches-not-list": '{"benches": 3}', "list": "[]"}
    for name, text in files.items():
        if text is not None:
            (tmp_path / f"{name}.json").write_text(text)
    (tmp_path / "binary.json").write_bytes(bytes(range(256)))
    (tmp_path / "a-dir.json").mkdir()
    return tmp_path


@pytest.mark.parametrize("flag, name, words", [
    ("--bench", "missing", "file not found"),
    ("--bench", "bad", "line 1, column 2: invalid JSON"),
    ("--bench", "empty", "invalid JSON"),
    ("--bench", "number", "expected a JSON object or list, got int"),
    ("--bench", "ints", "expected a bench report"),
    ("--bench", "benches-not-list", "expected a bench report"),
    ("--bench", "deep", "nested too deeply"),
    ("--bench", "binary", "not UTF-8"),
    ("--bench", "a-dir", "cannot read"),
    ("--compat", "missing", "file not found"),
    ("--compat", "list", "expected the JSON object"),
    ("--stable-report", "bad", "invalid JSON"),
])
def test_gate_report_file_errors(reports, flag, name, words):
    path = reports / f"{name}.json"
    bench = path if flag == "--bench" else reports / "list.json"     # [] is a valid (empty) bench list
    code, out, err = run("gate", "--bench", str(bench), "--release", str(ROOT / "overlays" / "local" / "release.yaml"),
                         "--out", str(reports / "out"), *([flag, str(path)] if flag != "--bench" else []))
    assert code == 2 and err.startswith(f"error: {path}") and words in err, err
    assert not (reports / "out").exists()


def test_gate_output_and_release_errors(reports):
    release = str(ROOT / "overlays" / "local" / "release.yaml")
    code, _, err = run("gate", "--bench", str(reports / "list.json"), "--release", release,
                       "--out", str(reports / "bad.json"))
    assert code == 2 and "argument --out" in err and "not a directory" in err
    code, _, err = run("gate", "--bench", str(reports / "list.json"), "--release", str(reports / "r" / "release.yaml"),
                       "--out", str(reports / "out"))
    assert code == 2 and "release.yaml: file not found" in err


BENCH_KEYS = ["ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "load", "samples", "server", "errors", "requests_ok",
              "profile", "lengths", "itl_level", "tokens_per_chunk", "goodput_rps", "slo_attainment"]
json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.floats(0, 10) | st.text(max_size=3),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=6)


@fuzz(15)
@given(report=st.dictionaries(st.sampled_from(BENCH_KEYS), json_values, max_size=5))
def test_gate_on_json_that_is_not_a_bench_report(tmp_path_factory, report):
    """Valid JSON of the wrong shape: a verdict (rollback) or bad input naming the file, never a traceback.

    (Bad input names the file and then the field: the shape (`not reports ...`) or a figure the gate
    cannot judge (validation/gate_inputs.py, e.g. `requests_total: null or missing`).)"""
    folder = tmp_path_factory.mktemp("gate")
    (folder / "bench.json").write_text(json.dumps({"kind": "bench", **report}))
    code, _, err = run("gate", "--bench", str(folder / "bench.json"), "--out", str(folder / "out"),
                       "--release", str(ROOT / "overlays" / "local" / "release.yaml"))
    assert code in (1, 2), err
    assert code == 1 or (err.startswith(f"error: {folder / 'bench.json'}: ") and "\n  fix: " in err), err


@pytest.mark.parametrize("slo_or_load, field", [
    ("validation: {load: [{requests: 1000000000000000000}]}", "validation.load[0].requests"),
    ("validation: {load: [{concurrency: 100000}]}", "validation.load[0].concurrency"),
    ("validation: {load: [{profile: ../../etc/passwd}]}", "validation.load[0].profile"),
    ("validation: {load: []}", "validation.load"),
    ("validation: {golden_max_tokens: 1000000}", "validation.golden_max_tokens"),
    ("slo: {decode: {itl_p99_ms: 1.0e+300}}", "slo.decode.itl_p99_ms"),
    ("slo: {vs_stable: {ttft_p90: .nan}}", "slo.vs_stable.ttft_p90"),
    ("slo: {remeasure_void: -1}", "slo.remeasure_void"),       # a void load rolls back (0) at the least
    ("slo: {remeasure_void: 100}", "slo.remeasure_void"),      # at most 4 runs more: a starved client stays void
    ("slo: {remeasure_void: .nan}", "slo.remeasure_void"),
    ("slo: {remeasure_void: null}", "slo.remeasure_void"),
])
def test_validation_values_beyond_sanity_limits(repo, slo_or_load, field):
    """Limits keep a typo from hanging a release (10**18 requests) or gating on nothing (.nan)."""
    assert_rejected(repo, "release.yaml", "name: pd-llm\nmodel: {id: m, source: s}\n" + slo_or_load + "\n", field, ("check",))
