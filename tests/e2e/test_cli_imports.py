"""A registry write from the command line loads what it writes with and no more: `unmask approve`, `reject` and
`sign-off` (and `--help`) run as their own process, as a person types them, against a real SQLite registry, and
never import Prefect (so never start its temporary server), torch, transformers, Great Expectations or the serving
app. A paused `promote` flow still takes the approval (tests/integration/test_governance.py resumes one through
`unmask approve`).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.support.gate_fixtures import fast_llada, fresh_registry, register_pair
from tests.support.governance import ME, roles_data, with_keys

HEAVY = (
    "prefect",
    "torch",
    "transformers",
    "great_expectations",
    "serving",
    "sampler",
    "streamlit",
    "uvicorn",
    "scipy.stats",
    "matplotlib",
)
# The command in a process of its own; after it, which heavy packages it imported (stderr, last line).
RUN = (
    "import sys\nfrom flows.cli import main\nsys.argv = ['unmask', *sys.argv[1:]]\ncode = 0\ntry:\n    main()\n"
    "except SystemExit as e:\n    code = e.code\n"
    f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\nsys.exit(code)\n"
)


@pytest.fixture
def registry_env(tmp_path, monkeypatch):
    roles = roles_data()  # the governance tests' roles, with this process's OS account (its identity) in each group
    roles["users"] = [*roles["users"], ME]
    roles["groups"] = {group: [*people, ME] for group, people in roles["groups"].items()}
    (tmp_path / "roles.yaml").write_text(yaml.safe_dump(with_keys(roles)))  # and their keys: staging counts signed acts
    monkeypatch.setenv("UNMASK_ROLES", str(tmp_path / "roles.yaml"))
    reg = fresh_registry(tmp_path)
    register_pair(reg, fast_llada())
    return {
        "MLFLOW_TRACKING_URI": reg.tracking_uri,
        "UNMASK_ROLES": str(tmp_path / "roles.yaml"),
        "UNMASK_HOME": str(tmp_path / "home"),
        "COLUMNS": "200",
        "PREFECT_API_URL": "",
    }


def unmask(env: dict, *args: str) -> tuple[int, str, list[str]]:
    import os

    done = subprocess.run(
        [sys.executable, "-c", RUN, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | env,
    )
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    assert last.startswith("HEAVY "), done.stderr[-3000:]
    return done.returncode, done.stdout + done.stderr, eval(last.removeprefix("HEAVY "))


def test_approve_reject_and_sign_off_write_the_registry_without_prefect_torch_or_gx(registry_env):
    code, out, heavy = unmask(
        registry_env,
        "sign-off",
        "tiny-llada",
        "--stage",
        "poc",
        "--item",
        "tooling-maturity",
        "--comment",
        "serve, export and eval tooling checked",
    )
    assert code == 0 and f"poc/tooling-maturity signed off for tiny-llada v1 by {ME}" in out, out
    assert heavy == [], heavy
    code, out, heavy = unmask(
        registry_env, "approve", "tiny-llada", "poc", "--comment", "poc evidence and checklist reviewed"
    )
    assert code == 0 and f"approval by {ME} recorded on tiny-llada v1" in out, out
    assert heavy == [], heavy
    code, out, heavy = unmask(
        registry_env, "reject", "tiny-llada", "staging", "--comment", "the sort task regressed against the fallback"
    )
    assert code == 0 and f"declined by {ME}" in out, out
    assert heavy == [], heavy


def test_help_lists_the_commands_by_task_without_loading_any_command_dependency(registry_env):
    code, out, heavy = unmask(registry_env, "--help")
    assert code == 0 and heavy == [], (heavy, out)
    panels = [panel for panel in ("evaluate", "decide", "serve", "roll out", "audit") if f"─ {panel} " in out]
    assert panels == ["evaluate", "decide", "serve", "roll out", "audit"], out
    assert "<bool>" not in out and "<str>" not in out


@pytest.mark.parametrize(
    "args",
    [
        ("audit", "--verify"),
        ("audit",),
        ("gates", "tiny-llada", "--stored"),
        ("sign-off", "--help"),
        ("approve", "--help"),
    ],
)
def test_reading_commands_load_neither_torch_nor_the_serving_stack(registry_env, args):
    """What a reviewer types to read the registry (issue 50): the audit trail and the stored gate reports."""
    code, out, heavy = unmask(registry_env, *args)
    assert code == 0, out
    assert heavy == [], (args, heavy)


def test_the_serving_app_loads_without_the_analysis_statistics_or_the_ranking_plots():
    """A server's cold start (issue 50): scipy.stats (0.6 s) is imported when a canary analysis first judges, pymcdm
    with its matplotlib (0.4 s) when candidates are first ranked; loading the app needs neither."""
    probe = (
        "import sys\nfrom serving import create_app\nfrom serving.app import routed_as\n"
        "print(sorted(m for m in ('scipy.stats', 'matplotlib', 'pymcdm') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
