"""What an approver and a promoter wait for through a real `mlflow server --app-name basic-auth` on 127.0.0.1:
`unmask approve` and `unmask promote` to poc, staging and production, each timed as the function call and as the
command a person types (its own process), with the MLflow client calls each made (issue #46 asks for under 3 s).

    PYTHONPATH=. .venv/bin/python bench/promotion_server.py [--rounds 3] [--auth-cache-ttl 60]

The server is set up as docs/team-setup.md sets it up, with MLflow's credential cache on (`auth_cache_ttl_seconds`,
60 here): each user's scrypt hash is checked once, not on every request. `--auth-cache-ttl 0` checks it on every
request, MLflow's default: about 0.5 s of server CPU per request on a 2-core host, which then dominates. eve
registers the evidence and requests; grace approves poc and staging; grace and linus approve production, each
with their own key (listed in the bundled roles: staging and production count only signed acts).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.promotion_calls import report  # noqa: E402 - counts MlflowClient calls in this process
from tests.support.gate_fixtures import OK, fast_llada, register_pair  # noqa: E402
from tests.support.governance import team_environment  # noqa: E402
from tests.support.mlflow_calls import Calls, counting  # noqa: E402
from tests.support.servers import launch_mlflow_server, stop_group  # noqa: E402

USERS = {"eve": "EDIT", "grace": "MANAGE", "linus": "MANAGE"}
MODEL = "tiny-llada"


def password(user: str) -> str:
    return f"{user}-password-{len(user)}x"


def act_as(user: str, url: str, admin_password: str = "") -> None:
    os.environ |= {
        "MLFLOW_TRACKING_URI": url,
        "MLFLOW_TRACKING_USERNAME": user,
        "MLFLOW_TRACKING_PASSWORD": admin_password or password(user),
    }


def served(folder: Path, cache_ttl_s: int) -> tuple[str, subprocess.Popen, str]:
    admin_password = secrets.token_urlsafe(16)
    (folder / "basic_auth.ini").write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{folder / 'basic_auth.db'}\n"
        f"admin_username = admin\nadmin_password = {admin_password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {cache_ttl_s}\n"
    )
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(folder / "basic_auth.ini"), "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32}
    url, proc = launch_mlflow_server(folder, f"sqlite:///{folder / 'mlflow.db'}", "--app-name", "basic-auth", env=env)
    return url, proc, admin_password


def governed(url: str, admin_password: str) -> None:
    """The users, eve's evidence (tiny-llada and the tiny-ar fallback, every manual item signed off, each stage's
    gates judged), and each user's permissions on the models and on the audit trail."""
    from mlflow.server import get_app_client

    from checklists import load_checklist
    from registry import Registry, sign_off
    from registry.connection import AUDIT_EXPERIMENT
    from registry.judging import judge

    act_as("admin", url, admin_password)
    auth = get_app_client("basic-auth", tracking_uri=url)
    for user in USERS:
        auth.create_user(user, password(user))
    audit = Registry(url).experiment_id(AUDIT_EXPERIMENT)
    for user in USERS:  # everyone appends to the trail (and the first writer names the store's identity on it)
        auth.grant_user_permission(user, "experiment", audit, "EDIT")
    act_as("eve", url)
    reg = Registry(url)
    register_pair(reg, fast_llada())
    act_as("admin", url, admin_password)
    for user, permission in USERS.items():
        for name in ("tiny-llada", "tiny-ar"):
            if user == "eve":  # the server made her MANAGE what she created; an evaluator EDITs
                auth.revoke_user_permission(user, "registered_model", name)
            auth.grant_user_permission(user, "registered_model", name, permission)
    act_as("eve", url)
    for stage in ("poc", "staging", "production"):
        for item in load_checklist(stage).manual_items():
            sign_off(Registry(url), MODEL, "1", stage, item, None, f"{item} checked for {stage}")
        judge(Registry(url), MODEL, "1", stage)  # the gates stored, as `unmask run` leaves them


def timed(label: str, calls: Calls, act) -> float:
    start = time.perf_counter()
    report(label, calls, act)
    return time.perf_counter() - start


def command(url: str, user: str, *args: str) -> float:
    env = dict(os.environ, MLFLOW_TRACKING_URI=url, MLFLOW_TRACKING_USERNAME=user)
    env["MLFLOW_TRACKING_PASSWORD"] = password(user)
    start = time.perf_counter()
    done = subprocess.run([str(REPO / ".venv/bin/unmask"), *args], env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"unmask {' '.join(args)} as {user} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="candidates walked poc -> production (default 3)")
    parser.add_argument("--auth-cache-ttl", type=int, default=60, help="auth_cache_ttl_seconds (0: check each)")
    args = parser.parse_args()
    os.environ["UNMASK_SIGNING_KEY"] = f"srv:{secrets.token_hex(32)}"  # every client of the server signs with it
    times: dict[str, list[float]] = {}
    with counting() as calls:
        for _ in range(args.rounds):  # a fresh server each round: tiny-llada from poc to production
            walk(args.auth_cache_ttl, calls, times)
    print(f"\n{args.rounds} rounds, each on a fresh server (basic-auth, credential cache {args.auth_cache_ttl} s):")
    for label, took in times.items():
        print(f"  {label:<34} median {statistics.median(took):.2f} s  ({', '.join(f'{t:.2f}' for t in took)})")


def walk(cache_ttl_s: int, calls: Calls, times: dict[str, list[float]]) -> None:
    from registry import Registry, approve, promote

    folder = Path(tempfile.mkdtemp(prefix="unmask-promotion-server-"))
    os.environ["UNMASK_HOME"] = str(folder / "home")
    os.environ.update(team_environment(folder, list(USERS)))  # each user's key, listed in the bundled roles
    url, proc, admin_password = served(folder, cache_ttl_s)
    try:
        governed(url, admin_password)
        for label, user, act in (
            ("approve poc (grace)", "grace", lambda: approve(Registry(), MODEL, "1", "poc", None, OK)),
            ("promote poc (eve)", "eve", lambda: promote(MODEL, "poc")),
            ("approve staging (grace)", "grace", lambda: approve(Registry(), MODEL, "1", "staging", None, OK)),
            ("promote staging (eve)", "eve", lambda: promote(MODEL, "staging")),
        ):
            act_as(user, url)
            times.setdefault(label, []).append(timed(label, calls, act))
        for label, user, argv in (
            ("unmask approve production (grace)", "grace", ["approve", MODEL, "production", "-c", OK]),
            ("unmask approve production (linus)", "linus", ["approve", MODEL, "production", "-c", OK]),
            ("unmask promote production (eve)", "eve", ["promote", MODEL, "--to", "production"]),
        ):
            times.setdefault(label, []).append(command(url, user, *argv))
    finally:
        stop_group(proc)


if __name__ == "__main__":
    main()
