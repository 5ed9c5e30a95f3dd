"""The suite does not depend on the caller's terminal (issue 36): the tests that read what the CLI prints pass when
pytest itself is started from a narrow terminal. tests/conftest.py clears the terminal's variables before any unmask
module is imported and around every test; this runs those tests in a pytest of their own under COLUMNS=100 LINES=20,
as a developer's narrow window would start it (it replaces CI's second run of the whole suite)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO

# Tests whose assertions read rendered tables and one-line errors: the ones a leaked width would break.
NARROW_SENSITIVE = ["tests/integration/test_terminal_tables.py", "tests/integration/test_eval_cli.py"]


def test_the_cli_output_tests_pass_when_pytest_starts_in_a_narrow_terminal():
    env = os.environ | {"COLUMNS": "100", "LINES": "20"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NARROW_SENSITIVE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1] and "failed" not in done.stdout.splitlines()[-1], done.stdout
