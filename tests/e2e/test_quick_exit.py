"""`unmask` leaves once its atexit hooks ran, skipping the interpreter's teardown (flows/quick_exit.py): the
exit code and every line printed survive, and a hook a library registers (Prefect's server stop, MLflow's
flushes) still runs. Real `unmask` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO


def unmask(*args: str, prelude: str = "", home: Path) -> subprocess.CompletedProcess:
    code = f"{prelude}\nfrom flows.cli import main\nmain()"
    env = dict(os.environ) | {"UNMASK_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_exit_code_and_every_line_survive(tmp_path):
    helped = unmask("--help", home=tmp_path)
    assert helped.returncode == 0 and helped.stdout.rstrip().endswith("─╯"), helped.stdout[-300:]
    refused = unmask("gates", "tiny-llada", "--stage", "nowhere", home=tmp_path)
    said = (refused.stdout + refused.stderr).strip()
    assert refused.returncode == 2 and said.startswith("error:") and said.endswith("'nowhere'"), refused


def test_hooks_registered_after_the_cli_still_run(tmp_path):
    prelude = "import atexit, flows.cli\natexit.register(lambda: print('a library hook ran', flush=True))"
    done = unmask("--help", prelude=prelude, home=tmp_path)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("a library hook ran"), done.stdout[-200:]


def test_a_process_that_only_imports_the_cli_exits_as_usual(tmp_path):
    code = "import atexit, flows.cli\natexit.register(lambda: print('teardown as usual'))\nraise SystemExit(3)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "teardown as usual" in done.stdout
