"""workflows/spec/yaml_edit.py: one value changes, everything else of the committed file stays as written."""
from __future__ import annotations

import difflib

import pytest
import yaml

from workflows.errors import InputError
from workflows.spec.yaml_edit import set_value

TEXT = """# a comment that must stay
prefill: {tensor_parallel_size: 4}   # flow, no replicas yet
decode:
  tensor_parallel_size: 8   # block
  autoscaling: {min_replicas: 1, max_replicas: 2}
spec:
  groups:
    - groupName: prefill
      template: {a: 1}
    - groupName: decode
      replicas: 2
"""


@pytest.mark.parametrize("path, key, value", [
    (["prefill"], "replicas", 5),                                  # added to a flow mapping
    (["decode"], "replicas", 3),                                   # added to a block mapping
    (["decode", "autoscaling"], "max_replicas", 7),                # replaced in a nested flow mapping
    (["spec", "groups", ("groupName", "decode")], "replicas", 4),  # the sequence item by its key
    (["spec", "groups", ("groupName", "prefill")], "maxReplicas", 4),
])
def test_one_value_changes_and_the_rest_stays(path, key, value):
    out = set_value(TEXT, path, key, value, "f.yaml")
    node = yaml.safe_load(out)
    for step in path:
        node = next(i for i in node if i.get(step[0]) == step[1]) if isinstance(step, tuple) else node[step]
    assert node[key] == value
    diff = list(difflib.ndiff(TEXT.splitlines(), out.splitlines()))
    added, removed = [d for d in diff if d.startswith("+ ")], [d for d in diff if d.startswith("- ")]
    assert len(added) == 1 and len(removed) <= 1 and f"{key}: {value}" in added[0]   # one line reads differently
    assert "# a comment that must stay" in out and "# block" in out


def test_a_path_that_is_not_a_mapping_is_named():
    with pytest.raises(InputError) as exc:
        set_value(TEXT, ["spec", "groups"], "replicas", 1, "f.yaml")
    assert exc.value.field == "spec.groups" and "make the change by hand" in exc.value.fix
