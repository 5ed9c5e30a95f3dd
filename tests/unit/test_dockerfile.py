"""The Dockerfile installs unmask the way the Makefile (README: `make run`) does, so neither drifts alone.
No image is built here (no Docker daemon on this host); the steps are compared."""

from __future__ import annotations

import re
import tomllib

from tests.support import REPO

ROOT = REPO


def makefile_install() -> list[str]:
    """The Makefile's install recipe, its variables written out as the Dockerfile names them."""
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("$(VENV)/.installed: pyproject.toml\n", 1)[1].split("\n\n", 1)[0]
    steps = [line.strip() for line in recipe.splitlines() if "pip install" in line or " -m venv " in line]
    values = {
        "$(PY)": ".venv/bin/python",
        "$(VENV)": ".venv",
        "$(PYTHON)": "python3.11",
        "$(ONNX_FLAVOUR)": "${ONNX_FLAVOUR}",
    }
    for name, value in values.items():
        steps = [s.replace(name, value) for s in steps]
    return [s.removeprefix("test -x .venv/bin/python || ") for s in steps]


def dockerfile_install() -> list[str]:
    runs = re.findall(r"^RUN (.+)$", (ROOT / "Dockerfile").read_text(), flags=re.M)
    return [r for r in runs if "pip install" in r or " -m venv " in r]


def test_the_dockerfile_repeats_the_makefile_install_step_by_step():
    make, docker = makefile_install(), dockerfile_install()
    assert len(make) == len(docker) == 3, (make, docker)
    assert docker[0] == make[0] == "python3.11 -m venv .venv"
    assert docker[1] == make[1] == ".venv/bin/python -m pip install -q --upgrade pip"
    # the project itself: the same flavour variable, installed (not editable) without the test extra, with the
    # runtime extras a worker needs; torch comes from pyproject's exact pin in both
    assert make[2] == ".venv/bin/python -m pip install -q -e '.[${ONNX_FLAVOUR},dev]'"
    assert (
        docker[2] == '.venv/bin/python -m pip install -q --extra-index-url "${TORCH_INDEX}" '
        '".[${ONNX_FLAVOUR},dask,ray,postgres]"'
    )
    assert "torch" not in " ".join(docker)  # no second torch install that could override the pin


def test_the_image_pins_the_python_and_torch_of_the_project():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11,<3.12"
    assert "FROM python:3.11-" in (ROOT / "Dockerfile").read_text()
    assert any(re.fullmatch(r"torch==\d+\.\d+\.\d+", d) for d in project["dependencies"])  # exact, not a range
    extras = project["optional-dependencies"]
    flavour = re.search(r"ARG ONNX_FLAVOUR=(\w+)", (ROOT / "Dockerfile").read_text()).group(1)
    assert flavour == "cpu" and {"cpu", "gpu", "dask", "postgres"} <= set(extras)
    copied = set(re.findall(r"^COPY (\w+) ", (ROOT / "Dockerfile").read_text(), flags=re.M))
    packages = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    )
    assert {p.rstrip("*") for p in packages} == copied  # every package the wheel includes is in the image


def test_every_container_the_project_renders_or_documents_runs_an_unmask_sub_command():
    """Issue 49: the docs' KServe example passed args ["serve", ...] to an image with only a CMD (no ENTRYPOINT), so
    the container ran `serve` as a program. The image's ENTRYPOINT is `unmask`; every container's args, rendered
    (serving/manifests.py: the serving pods and the analysis beside them) or documented (docs/controllers/), start
    with a sub-command the CLI registers."""
    import json

    import typer.main
    import yaml

    from flows.cli import _register_all, app
    from serving.manifests import TARGETS, render

    text = (ROOT / "Dockerfile").read_text()
    entrypoint = re.findall(r"^ENTRYPOINT (.+)$", text, flags=re.M)
    assert [json.loads(e) for e in entrypoint] == [["unmask"]]
    _register_all()
    commands = set(typer.main.get_command(app).commands)
    assert json.loads(re.search(r"^CMD (.+)$", text, flags=re.M).group(1))[0] in commands

    arm = {"name": "staging", "alias": "staging", "model": "m", "version": "2", "source": "s", "weights_sha256": "0"}
    spec = {
        "route": "default",
        "image": "unmask:0.1.0",
        "weight": 25,
        "resources": {},
        "arms": [arm, arm | {"name": "production", "alias": "production"}],
        "steps": [25, 100],
        "interval_s": 60,
        "routes_text": "default: {arm: production}\n",
        "tracking_uri": "http://mlflow.team:5000",
        "request_log_claim": "unmask-requests",
    }
    documented = [
        d for f in sorted((ROOT / "docs" / "controllers").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
    ]
    manifests = [m for target in TARGETS for m in render(target, spec)] + [d for d in documented if d]
    containers = []

    def find(node):
        if isinstance(node, dict):
            containers.extend(c for c in node.get("containers", []) if isinstance(c, dict))
            for value in node.values():
                find(value)
        elif isinstance(node, list):
            for value in node:
                find(value)

    find(manifests)
    assert len(containers) >= 6
    assert ["analysis", "serve"] in [c["args"][:2] for c in containers]  # the controllers' analysis (kserve, argo)
    for container in containers:
        assert "command" not in container and container["args"][0] in commands, container
