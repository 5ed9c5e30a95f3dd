"""Reading a YAML file that a person wrote (checklists, policies, roles): one place for what can go wrong
before its keys are checked, each said in one line that names the file."""

from __future__ import annotations

from pathlib import Path
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
    """yaml.SafeLoader (libyaml's where built) refusing a duplicate mapping key (YAML 1.2: keys are unique).

    The same class as `models/unique_keys.py`'s, which the layers below read with: checklists is a leaf that
    imports no other package. tests/integration/test_fuzz_surfaces.py holds both to the same cases."""

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


def one_line(error: Exception) -> str:
    """A parser's message on one line (PyYAML's span several, with a caret under the offending column)."""
    return " ".join(str(error).split())


def read_yaml_file(path: Path, error: type[Exception], what: str) -> tuple[Any, bytes]:
    """The parsed content of `path` and its bytes; `error` (naming the file and `what` it should be) when it is
    missing, a folder, not UTF-8 or not YAML."""
    try:
        raw = path.read_bytes()
        return load_yaml(raw.decode("utf-8")), raw
    except FileNotFoundError:
        raise error(f"{path}: {what} file not found") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a {what} file") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except DuplicateKeyError as e:
        raise error(f"{path}: {e}; each key once") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {one_line(e)}") from None
