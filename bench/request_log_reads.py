"""What a canary analysis pays to read its window of the request log, against the log's whole history.

    PYTHONPATH=. .venv/bin/python bench/request_log_reads.py [--files 3000] [--rounds 9]
    PYTHONPATH=. .venv/bin/python bench/request_log_reads.py --postgres [URL] [--rows 43200] [--rounds 9]

Writes `--files` Parquet files of old rows (two days ago, one row a second, named as the log names them) and a
live log with a minute of recent rows, then times, interleaved round by round, `read_rows` of the last minute
(what `/v1/unmask/analysis` reads) and of everything (what every call read before the log was partitioned). Prints
the median seconds of each and the ratio with its range over the rounds.

`--postgres` does the same against the team PostgreSQL store (evals/evidence_store.py): a day of rows (`--rows`,
one every two seconds by default) written as 1,200-row journals, then the last minute and the whole day read,
interleaved. Without a URL it starts a throwaway cluster (Debian's postgresql, tests/support/postgres_fixtures.py).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from serving.request_log import HOUR, SCHEMA, STAMP, RequestLog, read_rows, row


def old_files(folder: Path, n: int) -> None:
    start = datetime.now(UTC) - timedelta(days=2)
    for i in range(n):
        when = start + timedelta(seconds=i)
        part = folder / when.strftime(HOUR)
        part.mkdir(exist_ok=True)
        table = pa.Table.from_pylist([row(endpoint="completions", status=200) | {"time": when.isoformat()}], SCHEMA)
        pq.write_table(table, part / f"requests-{when.strftime(STAMP)}-{when.strftime(STAMP)}-old-{i:05d}.parquet")


def interleaved(read: Callable[[datetime | None], int], since: datetime, rounds: int) -> tuple[list[float], ...]:
    """Seconds of a read of the window and of everything, round by round, alternating."""
    window, everything = [], []
    for _ in range(rounds):
        for times, bound in ((window, since), (everything, None)):
            started = time.perf_counter()
            read(bound)
            times.append(time.perf_counter() - started)
    return window, everything


def report(what: str, window: list[float], everything: list[float], in_window: int, total: int) -> None:
    ratios = sorted(a / b for a, b in zip(everything, window))
    print(f"{what}, {len(window)} interleaved rounds:")
    print(f"  last minute: median {statistics.median(window):.4f} s ({in_window} rows)")
    print(f"  everything:  median {statistics.median(everything):.4f} s ({total} rows)")
    spread = f"range {ratios[0]:.0f}x-{ratios[-1]:.0f}x"
    print(f"  everything / last minute: median {statistics.median(ratios):.0f}x ({spread})")


def postgres(url: str | None, rows: int, rounds: int) -> None:
    from evals.evidence_store import PostgresEvidence

    server = None
    if url is None:
        from tests.support.postgres_fixtures import database_name, start_postgres

        server = start_postgres()
        url = server.create_database(database_name("bench_reads"))
    store = PostgresEvidence(url)
    try:
        now = datetime.now(UTC)
        step = timedelta(days=1) / rows
        day = [row(endpoint="completions", status=200, route="default", latency_s=0.1) for _ in range(rows)]
        for i, entry in enumerate(day):
            entry["time"] = (now - timedelta(days=1) + step * (i + 1)).isoformat(timespec="milliseconds")
            entry["arm"] = "candidate" if i % 4 else "fallback"
        for n, first in enumerate(range(0, rows, 1200)):  # as a writer's journals arrive
            store.append_requests(day[first : first + 1200], f"bench-1-x-{n:05d}", "bench")
        since = now - timedelta(minutes=1)
        window, everything = interleaved(lambda bound: len(store.read_requests(bound)), since, rounds)
        report(f"PostgreSQL, a day of {rows} rows", window, everything, len(store.read_requests(since)), rows)
    finally:
        store.close()
        if server is not None:
            from tests.support.postgres_fixtures import stop_postgres

            stop_postgres(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--postgres", nargs="?", const="", default=None, metavar="URL")
    parser.add_argument("--rows", type=int, default=24 * 3600 // 2)
    args = parser.parse_args()
    if args.postgres is not None:
        postgres(args.postgres or None, args.rows, args.rounds)
        return
    folder = Path(tempfile.mkdtemp(prefix="unmask-log-reads-"))
    old_files(folder, args.files)
    log = RequestLog(folder, flush_rows=64, flush_s=0.2)
    for i in range(600):
        log.append(row(endpoint="completions", status=200, route="default", arm="candidate" if i % 4 else "fallback"))
    log.close()
    since = datetime.now(UTC) - timedelta(minutes=1)
    assert len(read_rows(folder)) == args.files + 600
    window, everything = interleaved(lambda bound: len(read_rows(folder, since=bound)), since, args.rounds)
    in_window = len(read_rows(folder, since=since))
    report(f"{args.files} old files, 600 rows in the last minute", window, everything, in_window, args.files + 600)


if __name__ == "__main__":
    main()
