"""What one request costs through MLflow's basic-auth server, as a user and as the admin.

    .venv/bin/python docs/experiments/basic-auth/request_cost.py [REQUESTS]

Starts `mlflow server --app-name basic-auth` on 127.0.0.1 with the walk-through's configuration
(docs/walkthrough/basic_auth.ini) on a scratch store in a temporary folder, creates one user, and times
REQUESTS (default 20) `experiments/search` calls as that user and as the admin, twice in one run: with MLflow's
credential cache off (`auth_cache_ttl_seconds = 0`, MLflow's default: the server checks the password hash on
every request) and with the walk-through's setting (the hash is checked once per user and password per TTL).
"""
import configparser
import os
import socket
import subprocess
import sys
import tempfile
import time

import requests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ADMIN = ("admin", "demo-admin-password")  # docs/walkthrough/basic_auth.ini (DEMO ONLY)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def per_request(url: str, auth: tuple[str, str], n: int) -> tuple[float, float]:
    """Seconds of the first request and the mean of the n after it."""
    times = []
    for _ in range(n + 1):
        start = time.perf_counter()
        requests.post(url + "/api/2.0/mlflow/experiments/search", auth=auth, json={"max_results": 10},
                      timeout=60).raise_for_status()
        times.append(time.perf_counter() - start)
    return times[0], sum(times[1:]) / n


def measure(n: int, cache_ttl: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """(user, admin) (first, mean of the rest) seconds per request on a fresh server whose credential cache lives `cache_ttl` seconds."""
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "docs", "walkthrough", "basic_auth.ini"))
    config["mlflow"]["auth_cache_ttl_seconds"] = cache_ttl
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "basic_auth.ini"), "w") as f:
            config.write(f)
        port = free_port()
        env = os.environ | {"MLFLOW_AUTH_CONFIG_PATH": os.path.join(work, "basic_auth.ini"),
                            "MLFLOW_FLASK_SERVER_SECRET_KEY": os.urandom(16).hex()}
        with open(os.path.join(work, "server.log"), "w") as log:
            server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
                                       "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                                       "--backend-store-uri", f"sqlite:///{work}/mlflow.db"],
                                      cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                try:
                    if requests.get(url + "/health", timeout=5).ok:
                        break
                except requests.ConnectionError:
                    time.sleep(1)
            user = ("bob", "bob-demo-password")
            requests.post(url + "/api/2.0/mlflow/users/create", auth=ADMIN, timeout=60,
                          json={"username": user[0], "password": user[1]}).raise_for_status()
            return per_request(url, user, n), per_request(url, ADMIN, n)
        finally:
            server.terminate()
            server.wait(30)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "docs", "walkthrough", "basic_auth.ini"))
    walkthrough_ttl = config["mlflow"].get("auth_cache_ttl_seconds", "0")
    off, on = measure(n, "0"), measure(n, walkthrough_ttl)
    print(f"seconds per request through basic auth: the first, then the mean of {n} more experiments/search calls")
    print(f"  {'':6} {'cache off: first':>16} {'then':>7} {'cache ' + walkthrough_ttl + ' s: first':>18} {'then':>7}"
          f" {'ratio (then)':>13}")
    for who, a, b in (("user", off[0], on[0]), ("admin", off[1], on[1])):
        print(f"  {who:6} {a[0]:16.3f} {a[1]:7.3f} {b[0]:18.3f} {b[1]:7.3f} {a[1] / b[1]:12.1f}x")


if __name__ == "__main__":
    main()
