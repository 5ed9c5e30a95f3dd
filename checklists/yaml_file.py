"""Reading a YAML file that a person wrote (checklists, policies, roles): one place for what can go wrong
before its keys are checked, each said in one line that names the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def one_line(error: Exception) -> str:
    """A parser's message on one line (PyYAML's span several, with a caret under the offending column)."""
    return " ".join(str(error).split())


def read_yaml_file(path: Path, error: type[Exception], what: str) -> tuple[Any, bytes]:
    """The parsed content of `path` and its bytes; `error` (naming the file and `what` it should be) when it is
    missing, a folder, not UTF-8 or not YAML."""
    try:
        raw = path.read_bytes()
        return yaml.safe_load(raw.decode("utf-8")), raw
    except FileNotFoundError:
        raise error(f"{path}: {what} file not found") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a {what} file") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {one_line(e)}") from None
