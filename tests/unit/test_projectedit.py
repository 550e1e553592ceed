"""`for this project` (--ask): a host added to .boxy.yaml as a person would add it
(boxyd/config/projectedit.py), checked by parsing what it returns."""

from __future__ import annotations

import pytest
import yaml

from boxyd.config.projectedit import with_allowed_host

SHAPES = [
    ("", None),
    ("profile: node\n", None),
    ("profile: node", None),  # no final newline
    ("allow_hosts:\n  - a.example\n  - b.example  # ours\nprofile: node\n", ["a.example", "b.example"]),
    ("allow_hosts:\n- a.example\nnet: allowlist\n", ["a.example"]),
    ("allow_hosts: [a.example, b.example]\n", ["a.example", "b.example"]),
    ("allow_hosts: []\n", []),
    ("allow_hosts:\n", None),
    ("allow_hosts: ~\nprofile: node\n", None),
    ("# a comment\nallow_hosts:\n  - a.example\n\n  # between\n  - b.example\n", ["a.example", "b.example"]),
    ("'allow_hosts':\n  - a.example\n", ["a.example"]),
]  # fmt: skip


@pytest.mark.parametrize("text,before", SHAPES)
@pytest.mark.parametrize("host", ["api.example", "*.cdn.example"])
def test_the_host_is_appended_and_nothing_else_changes(
    text: str, before: list[str] | None, host: str
) -> None:
    new = with_allowed_host(text, host)
    assert new is not None
    old_doc = yaml.safe_load(text) or {}
    new_doc = yaml.safe_load(new)
    assert new_doc == {**old_doc, "allow_hosts": [*(before or []), host]}
    # the file's own lines are kept, in order (the key's own line may be rewritten)
    kept = iter(new.splitlines())
    assert all(
        any(ln == other for other in kept) for ln in text.splitlines() if "allow_hosts" not in ln
    ), new


@pytest.mark.parametrize(
    "text",
    [
        "allow_hosts: [a.example] # trailing comment\n",  # a comment on the key's line
        "allow_hosts: &hosts\n  - a\n",  # an anchor
        "allow_hosts: !!seq\n  - a\n",  # a tag
        "allow_hosts: a.example\n",  # a scalar, not a list
        "allow_hosts: [a,\n  b]\n",  # a flow list over lines
        "allow_hosts:\n  - a\nallow_hosts:\n  - b\n",  # twice
        "allow_hosts: ~\n  - a\n",
    ],
)
def test_a_shape_it_does_not_know_is_left_alone(text: str) -> None:
    assert with_allowed_host(text, "api.example") is None


def test_what_it_cannot_see_is_caught_by_the_parse_after_it() -> None:
    """A flow-style document gets a block key after it: not YAML; the caller parses
    what comes back and writes nothing (config/trust.py allow_in_project)."""
    new = with_allowed_host("{profile: node}\n", "api.example")
    assert new is not None
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(new)
