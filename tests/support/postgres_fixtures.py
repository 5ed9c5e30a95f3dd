"""A throwaway PostgreSQL cluster on 127.0.0.1 for the team-registry tests (Debian's `postgresql` package).

`initdb` refuses to run as root, so as root the cluster is made and run by the `postgres` system user the
package creates; its folder is a fresh temporary one (trust authentication on loopback only). `make test`
installs the package (Makefile `postgres-deps`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.servers import free_port

BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)  # Debian keeps them off PATH


def pg_tool(name: str) -> str:
    found = shutil.which(name) or next((str(d / name) for d in BIN_DIRS if (d / name).exists()), None)
    if found is None:
        raise AssertionError(
            f"PostgreSQL's {name} is not installed: run `make postgres-deps` (apt-get install -y postgresql)"
        )
    return found


@dataclass
class Postgres:
    folder: Path
    port: int
    user: str = "unmask"

    def uri(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        _as_owner([pg_tool("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name])
        return self.uri(name)


def _as_owner(argv: list[str]) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr or done.stdout}")
    return done


def start_postgres() -> Postgres:
    folder = Path(tempfile.mkdtemp(prefix="unmask-postgres-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    _as_owner([pg_tool("initdb"), "-D", str(folder / "data"), "-A", "trust", "-U", "unmask", "-E", "UTF8", "--no-sync"])
    pg = Postgres(folder, free_port())
    resume_postgres(pg)
    return pg


def pause_postgres(pg: Postgres) -> None:
    """Stop the server (its data kept): clients see an outage until `resume_postgres`."""
    _as_owner([pg_tool("pg_ctl"), "-D", str(pg.folder / "data"), "-m", "fast", "-w", "stop"])


def resume_postgres(pg: Postgres) -> None:
    """Start the server on its data and port."""
    options = f"-h 127.0.0.1 -p {pg.port} -k {pg.folder} -c fsync=off -c max_connections=200"
    data, server_log = str(pg.folder / "data"), str(pg.folder / "server.log")
    _as_owner([pg_tool("pg_ctl"), "-D", data, "-l", server_log, "-w", "-t", "60", "-o", options, "start"])


def stop_postgres(pg: Postgres) -> None:
    try:
        pause_postgres(pg)
    finally:
        shutil.rmtree(pg.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL cluster for the session; each user of it creates its own database."""
    pg = start_postgres()
    try:
        yield pg
    finally:
        stop_postgres(pg)


def database_name(prefix: str) -> str:
    return f"{prefix}_{time.time_ns() % 10**12}"


def backend_store(request, folder: Path, name: str) -> str:
    """The store a server fixture runs on: its param "sqlite" (a file in `folder`) or "postgres" (a database
    of the session's PostgreSQL cluster, tests/support/postgres_fixtures.py)."""
    if request.param == "postgres":
        return request.getfixturevalue("postgres").create_database(database_name(name))
    return f"sqlite:///{folder / (name + '.db')}"
