"""docs/walkthrough.md is a test: its fenced `bash` blocks run in order on a fresh UNMASK_HOME, each
command exits 0 (or the `# exit N` its line states), the `text` excerpt under a block appears in what
the block printed (`...` stands for what changes between runs), and every screenshot the page shows is
taken again at its place in the arc (the real dashboard under `streamlit run`, Debian's Chromium via
Playwright at 1280x800), each page checked to load with no exception.

A line of the form `[NAME=value ...] unmask ARGS` runs in this process through the real `unmask` app
(typer's CliRunner, with the line's assignments in the environment and `$NAME` expanded as the shell
would): a process per line spent ~3 s of CPU importing MLflow each, and each approval started its own
temporary Prefect server. State still passes between lines only through UNMASK_HOME; the entry point
as a process is tested in test_fuzz_failures and test_dashboard_apptest. Any other line runs in bash.

UNMASK_UPDATE_SCREENSHOTS=1 writes the screenshots to docs/walkthrough/ (the page's images); otherwise
they go to the test's tmp dir.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from tests.support.servers import free_port
from tests.support.walkthrough import ASSIGNMENT, DOC, SHELL_SYNTAX, VARIABLE, parse

SHOTS = REPO / "docs" / "walkthrough"
# a screenshot's file name ends with the page it shows: 01-verdict.png, 04-promotions-staging.png
PAGE_OF = {
    "verdict": ("", "Verdict"),
    "gate-board": ("gate-board", "Gate board"),
    "scores": ("scores", "Scores"),
    "quality-latency": ("quality-latency", "Quality vs latency"),
    "candidate": ("candidate", "Candidate"),
    "promotions": ("promotions", "Promotions"),
}


def flat(text: str) -> str:
    return " ".join(text.split())


def shows(output: str, line: str) -> bool:
    """Whether `line` (with `...` for anything) appears in `output`, whitespace folded."""
    pattern = r".*?".join(re.escape(flat(part)) for part in line.split("..."))
    return re.search(pattern, flat(output)) is not None


def test_the_page_is_well_formed_and_labels_its_demo_files():
    steps = parse(DOC.read_text())
    commands = [c for s in steps for c, _ in s.commands]
    # the people's keys first, then the demo sweep and policy (the registry marked)
    assert next(c for c in commands if c.startswith("unmask ") and "keys" not in c).startswith("unmask run --demo")
    # you (ada) up to poc; every approval of staging and production from another person's own keys folder, with no
    # server: two listed keys are two people
    approvals = [c for c in commands if re.search(r"unmask approve tiny-llada (staging|production)", c)]
    others = [c for c in approvals if c.startswith("UNMASK_KEYS_HOME=$UNMASK_HOME/people/")]
    assert others and all("/people/ada " not in c for c in others), approvals
    assert not any("mlflow server" in c or "MLFLOW_TRACKING_USERNAME" in c for c in commands)
    assert any("unmask keys init" in c for c in commands) and "two listed keys are two people" in DOC.read_text()
    for needed in (
        "unmask sign-off",
        "--to poc",
        "unmask loadtest",
        "--to staging",
        "--to production",
        "unmask report",
        "unmask audit --verify",
        "unmask rollback",
    ):
        assert any(needed in c for c in commands), needed
    assert all(s.excerpt for s in steps if s.commands), "every block that runs something shows an excerpt"
    shots = [p for s in steps for p in s.screenshots]
    assert len(shots) >= 5 and all(page_of(p) for p in shots), shots
    assert all((REPO / "docs" / p).is_file() for p in shots), "every screenshot the page shows is committed"
    for path in (
        "gates/demo-policy.yaml",
        "gates/demo-roles.yaml",
        "evals/sweeps/demo.yaml",
        "docs/walkthrough/basic_auth.ini",
    ):
        assert "DEMO ONLY" in (REPO / path).read_text().splitlines()[0], path
    assert "[walk-through](docs/walkthrough.md)" in (REPO / "README.md").read_text()


def test_the_demo_policy_relaxes_thresholds_only_and_the_demo_sweep_meets_it():
    from evals.sweep import load_sweep
    from gates import load_policy
    from gates.policy import OPT_IN_KINDS
    from gates.roles import load_roles

    demo, bundled = load_policy(REPO / "gates" / "demo-policy.yaml"), load_policy()
    sweep = load_sweep(REPO / "evals" / "sweeps" / "demo.yaml")
    for name in ("poc", "staging", "production"):
        stage, real = demo.stage(name), bundled.stage(name)
        # the bundled policy's gates, plus gates of the opt-in kinds the bundled one leaves out
        assert [(g.name, g.kind) for g in stage.gates if g.kind not in OPT_IN_KINDS] == [
            (g.name, g.kind) for g in real.gates
        ], name
        assert stage.operating_point == real.operating_point and stage.requires_stage == real.requires_stage
        items = {g.name: g for g in stage.gates}["data_validity"].params["min_items"]
        assert all(t.n >= items for t in sweep.tasks if t.task == stage.operating_point.task), name
    assert sweep.models == ["tiny-llada", "tiny-ar"]
    roles = yaml.safe_load((REPO / "gates" / "demo-roles.yaml").read_text())
    load_roles(REPO / "gates" / "demo-roles.yaml")  # valid, or RolesError naming the key
    assert roles["stages"]["staging"]["self_approval"] is False
    assert roles["stages"]["production"]["approvals"] == {"count": 2, "distinct": True}
    # anyone may approve: what refuses the one person past poc is four eyes, not a role; olga alone rolls back
    assert roles["users"] == ["*"] and roles["groups"] == {"oncall": ["olga"]}
    assert all(roles["stages"][s]["approve"] == ["*"] for s in ("poc", "staging", "production"))


def run_line(command: str, env: dict[str, str]) -> tuple[int, str]:
    """Run one of the page's command lines with `env` as the whole environment; (exit code, what it printed)."""
    words = shlex.split(command) if not SHELL_SYNTAX.search(command) else []
    assignments = {}
    while words and (assignment := ASSIGNMENT.match(words[0])):  # $NAME in a value expands, as in a shell
        value = VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), assignment.group(2))
        assignments[assignment.group(1)] = value
        words.pop(0)
    if not words or words[0] != "unmask":
        done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout + done.stderr
    from typer.testing import CliRunner

    from tests.support.fuzz_fixtures import unmask_app

    scope = env | assignments
    args = [VARIABLE.sub(lambda m: scope.get(m.group(1) or m.group(2), ""), word) for word in words[1:]]
    with pytest.MonkeyPatch.context() as mp:  # the process environment is the line's, as in a shell
        for key in set(os.environ) - set(scope):
            mp.delenv(key)
        for key, value in scope.items():
            mp.setenv(key, value)
        mp.chdir(REPO)
        result = CliRunner().invoke(unmask_app(), args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        raise AssertionError(
            f"{command}: uncaught {type(result.exception).__name__}\n{result.output}"
            + "".join(traceback.format_exception(result.exception))
        )
    return result.exit_code, result.output


def page_of(png: str) -> tuple[str, str]:
    name = Path(png).stem.split("-", 1)[1]
    for key in sorted(PAGE_OF, key=len, reverse=True):
        if name == key or name.startswith(key + "-"):
            return PAGE_OF[key]
    raise AssertionError(f"{DOC}: {png} names no dashboard page ({', '.join(PAGE_OF)})")


# the app's root says when a script run is over (Streamlit's status widget shows only once a run lasts a while)
SCRIPT_DONE = "[data-testid='stApp'][data-test-script-state='notRunning']"
# a run can begin and end between two looks at the page: an observer notes every state the root takes
WATCH_RUNS = """() => {
  const root = document.querySelector("[data-testid='stApp']");
  window.unmaskRuns = 0;
  new MutationObserver(() => {
    if (root.getAttribute("data-test-script-state") === "running") window.unmaskRuns += 1;
  }).observe(root, {attributes: true, attributeFilter: ["data-test-script-state"]});
}"""
RAN_AGAIN = """() => window.unmaskRuns > 0 && document.querySelector("[data-testid='stApp']")
  .getAttribute("data-test-script-state") === "notRunning" """


class Dashboard:
    """The real dashboard under `streamlit run` on the walk-through's state, and one headless Chromium to read it.

    Started at the first screenshot and kept for the walk (a server and a browser per screenshot were half the test's
    time); started again only when the environment a screenshot reads differs. Before each screenshot its cached
    reads are dropped the way a user drops them (the sidebar's Refresh clears every session's cache), and the page is
    opened in a new tab: a new session, reading the store as the commands since the last screenshot left it."""

    def __init__(self, profile: Path, logs: Path) -> None:
        self.profile, self.logs = profile, logs
        self.env: dict[str, str] | None = None
        self.server: subprocess.Popen | None = None
        self.playwright = self.browser = None
        self.port = 0

    def start(self, env: dict[str, str]) -> None:
        from playwright.sync_api import sync_playwright

        from flows.commands.dashboard import streamlit_command
        from flows.environment import QUIET_DEFAULTS
        from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, HEIGHT, WIDTH
        from tests.support.servers import free_port, wait_healthy

        self.stop()
        self.env, self.port = env, free_port()
        log = self.logs / f"streamlit-{self.port}.log"
        with log.open("w") as sink:
            self.server = subprocess.Popen(
                streamlit_command(self.port, "127.0.0.1"),
                cwd=REPO,
                env=env | QUIET_DEFAULTS,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        wait_healthy(f"http://127.0.0.1:{self.port}/_stcore/health", self.server, log)
        self.playwright = sync_playwright().start()
        self.browser = self.playwright.chromium.launch_persistent_context(
            str(self.profile),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": WIDTH, "height": HEIGHT},
        )

    def screenshot(self, png: str, env: dict[str, str], out: Path) -> None:
        """Open the page the file names on the store as it is now, check it ran without an exception, and take it at
        1280x800."""
        from playwright.sync_api import expect

        if env != self.env:
            self.start(env)
        path, heading = page_of(png)
        url = f"http://127.0.0.1:{self.port}"
        refresher = self.browser.new_page()
        try:
            refresher.goto(url, timeout=60_000)
            refresher.wait_for_selector(SCRIPT_DONE, timeout=90_000)
            refresher.evaluate(WATCH_RUNS)
            refresher.get_by_role("button", name="Refresh").click()
            refresher.wait_for_function(RAN_AGAIN, timeout=90_000)  # the click's run (which cleared the cache) ended
        finally:
            refresher.close()
        page = self.browser.new_page()
        try:
            page.goto(f"{url}/{path}", timeout=60_000)
            expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible(timeout=90_000)
            page.wait_for_selector(SCRIPT_DONE, timeout=90_000)  # the heading shows while the rest still runs
            page.wait_for_timeout(500)  # and the charts paint after it
            expect(page.get_by_test_id("stException")).to_have_count(0)
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=False)
        finally:
            page.close()
        assert out.stat().st_size > 10_000, f"{out}: an empty screenshot"

    def stop(self) -> None:
        from tests.support.servers import stop

        if self.browser is not None:
            self.browser.close()
            self.playwright.stop()
            self.browser = self.playwright = None
        if self.server is not None:
            stop(self.server)
            self.server = None


# slow: the whole arc: a demo sweep, ~30 CLI calls, a load test, a dashboard per screenshot (minutes)
@pytest.mark.browser
def test_the_walkthrough_runs_as_written(tmp_path):
    home = tmp_path / "home"
    bin_dir = tmp_path / "bin"  # `unmask` as the doc types it, running this checkout
    bin_dir.mkdir()
    launcher = bin_dir / "unmask"
    launcher.write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c 'from flows.cli import main; main()' \"$@\"\n"
    )
    launcher.chmod(launcher.stat().st_mode | stat.S_IEXEC)
    mlflow = bin_dir / "mlflow"  # and `mlflow` (the demo's basic-auth server) from this environment
    mlflow.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m mlflow "$@"\n')
    mlflow.chmod(mlflow.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNMASK_", "MLFLOW_", "PREFECT_API"))}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
        "UNMASK_HOME": str(home),
        "COLUMNS": "200",
        "MLFLOW_PORT": str(free_port()),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    update = os.environ.get("UNMASK_UPDATE_SCREENSHOTS") == "1"
    try:
        walk(env, update, tmp_path)
        deliver_every_event(env, tmp_path)
    finally:  # the page stops its server; if a step failed before that, stop it here (its own process group)
        pid_file = home / "mlflow-server.pid"
        if pid_file.is_file():
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass


def walk(env: dict[str, str], update: bool, tmp_path: Path) -> None:
    dashboard = Dashboard(tmp_path / "chromium-profile", tmp_path)
    try:
        walk_steps(env, update, tmp_path, dashboard)
    finally:
        dashboard.stop()


def walk_steps(env: dict[str, str], update: bool, tmp_path: Path, dashboard: Dashboard) -> None:
    for number, step in enumerate(parse(DOC.read_text()), 1):
        for key, value in step.exports.items():  # the test's own state folder and port; $NAME as a shell would
            if key not in ("UNMASK_HOME", "MLFLOW_PORT"):
                env[key] = VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)
        printed = ""
        for command, expected in step.commands:
            code, output = run_line(command, env)
            assert "Traceback" not in output, f"step {number}: {command}\n{output}"
            assert code == expected, f"step {number}: {command} exited {code}, the page says {expected}\n{output}"
            printed += output
        for line in step.excerpt:
            assert shows(printed, line), (
                f"step {number}: the page's excerpt line {line!r} is not in the output:\n{printed}"
            )
        for png in step.screenshots:
            out = (REPO / "docs" / png) if update else tmp_path / "shots" / Path(png).name
            reader = {k: v for k, v in env.items() if not k.startswith("MLFLOW_TRACKING_")}  # the store file
            dashboard.screenshot(png, reader | {"UNMASK_POLICY": str(REPO / "gates" / "demo-policy.yaml")}, out)


def deliver_every_event(env: dict[str, str], tmp_path: Path) -> None:
    """Events out over the walk's whole chain (issue 53): a real receiver on 127.0.0.1, down after its tenth event
    until the next delivery, gets every event of the walk-through in chain order, each exactly once."""
    import json

    from tests.support.hook_receiver import HookReceiver

    secret = "walkthrough-hook-secret"
    receiver = HookReceiver(secret, down_after=10)
    hooks = tmp_path / "webhooks.yaml"
    hooks.write_text(json.dumps({"webhooks": [{"name": "deploy", "url": receiver.url, "secret_env": "HOOK_SECRET"}]}))
    # the store file, as the dashboard reads it
    store = {k: v for k, v in env.items() if not k.startswith("MLFLOW_TRACKING_")}
    store |= {"UNMASK_WEBHOOKS": str(hooks), "HOOK_SECRET": secret}
    try:
        code, during = run_line("unmask events --deliver", store)
        assert code == 0 and "stopped at event" in during and len(receiver.got) == 10, during
        receiver.down_after = None
        code, after = run_line("unmask events --deliver", store)
        assert code == 0 and "stopped at" not in after, after
        code, listed = run_line("unmask events --format json", store)
    finally:
        receiver.stop()
    every = [json.loads(line) for line in listed.splitlines() if line.startswith("{")]
    assert [e["id"] for e in receiver.got] == [e["id"] for e in every], "each event once, in chain order"
    kinds = {e["type"] for e in every}
    assert {"evidence.registered", "decision.changed", "alias.moved", "approval.recorded"} <= kinds, kinds
    assert {"rollback.emergency", "approval.recorded", "signoff.recorded"} <= kinds, kinds
