"""A full disk during `unmask run` (issue #51, item 6): the first refused write ends the run with one line that
names the path and the free space, never a scorecard and exit 0.

A real full disk cannot be produced on demand, so the fault is injected at the file system call: the first write
under the state folder's `evals/` (the evaluation files, the run's first artifacts) raises ENOSPC as `write()` does,
without a file name; the writes after it succeed, as when another process frees space meanwhile. MLflow and Prefect
are real (the session's Prefect harness, MLflow on SQLite)."""

from __future__ import annotations

import errno
import os
import pathlib
import re

from typer.testing import CliRunner

from tests.support.flow_fixtures import CANDIDATE, FALLBACK, cli_app, seed_registry, tiny_models, write_sweep

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_a_full_disk_at_the_first_artifact_write_fails_the_run_naming_the_path_and_the_free_space(
    prefect_harness, tmp_path, monkeypatch
):
    models = tiny_models(tmp_path / "models")
    sweep = write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE], models[FALLBACK]], steps=(2,))
    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    refused: list[str] = []
    write_text = pathlib.Path.write_text

    def full_under_evals(self, *args, **kwargs):
        if not refused and (home / "evals") in pathlib.Path(self).parents:
            refused.append(str(self))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write() raises it: no file name
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full_under_evals)
    result = CliRunner().invoke(cli_app("run"), ["run", "--sweep", sweep, "--no-repro"], env={"COLUMNS": "200"})
    text = ANSI.sub("", result.output)
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert refused, "the injected fault never fired: no evaluation file was written"
    assert result.exit_code == 1, text
    assert len(errors) == 1, text
    assert f"cannot write {home / 'evals'}" in errors[0] and "No space left on device" in errors[0], errors[0]
    assert re.search(r"\(\d[\d.]* [KMGT]?i?B free on /", errors[0]), errors[0]
    assert "scorecard" not in text and "Traceback" not in text
