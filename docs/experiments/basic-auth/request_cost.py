"""What one request costs through MLflow's basic-auth server, as a user and as the admin.

    .venv/bin/python docs/experiments/basic-auth/request_cost.py [REQUESTS]

Starts `mlflow server --app-name basic-auth` on 127.0.0.1 with the walk-through's configuration
(docs/walkthrough/basic_auth.ini) on a scratch store in a temporary folder, creates one user, and times
REQUESTS (default 20) `experiments/search` calls as that user and as the admin. The server checks the password
hash (scrypt) on every request, which is why the walk-through's dashboard reads the store file instead.
"""
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


def per_request(url: str, auth: tuple[str, str], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        requests.post(url + "/api/2.0/mlflow/experiments/search", auth=auth, json={"max_results": 10},
                      timeout=60).raise_for_status()
    return (time.perf_counter() - start) / n


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with tempfile.TemporaryDirectory() as work:
        port = free_port()
        env = os.environ | {"MLFLOW_AUTH_CONFIG_PATH": os.path.join(REPO, "docs", "walkthrough", "basic_auth.ini"),
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
            print(f"per request through basic auth, {n} experiments/search calls each:")
            print(f"  as a user:  {per_request(url, user, n):.3f} s")
            print(f"  as admin:   {per_request(url, ADMIN, n):.3f} s")
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
