"""The one YAML (and JSON) reader for files a person wrote (catalog, sweeps, license policy, model cards, task
files, config.json): PyYAML's safe loader and json.loads, except that a key given twice is an error instead of
the last one silently winning.

`checklists/yaml_file.py` (a leaf package, which by the layer rule imports no other package) holds the same
class for checklists, policies, roles and serving policies; tests/integration/test_fuzz_surfaces.py holds both to the
same cases.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import yaml


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names one key twice; the message names the key, its line and the first one's."""


# libyaml's parser where PyYAML was built with it (the wheels are): the same safe constructor over a C
# scanner, about 10x faster on the sweep and policy files a run reads some hundred times.
if TYPE_CHECKING:
    _SAFE_LOADER = yaml.SafeLoader  # for the checker: CSafeLoader has the same safe constructor
else:
    _SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(_SAFE_LOADER):
    """yaml.SafeLoader (libyaml's where built) refusing a duplicate mapping key (YAML 1.2: keys are unique)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise DuplicateKeyError(f"duplicate key {key!r} at line {line} (first at line {seen[key]})")
                seen[key] = line
            except TypeError:  # an unhashable key: the base class says so in its own words
                continue
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, refusing duplicate keys (DuplicateKeyError, a yaml.YAMLError)."""
    return yaml.load(text, Loader=UniqueKeyLoader)


class DuplicateJSONKeyError(ValueError):
    """A JSON object that names one key twice (json.loads would keep the last silently)."""


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateJSONKeyError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_json(text: str | bytes) -> Any:
    """`json.loads(text)`, refusing an object with a duplicate key (DuplicateJSONKeyError)."""
    return json.loads(text, object_pairs_hook=_unique_object)
