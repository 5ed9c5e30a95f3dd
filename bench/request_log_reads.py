"""What a canary analysis pays to read its window of the request log, against the log's whole history.

    PYTHONPATH=. .venv/bin/python bench/request_log_reads.py [--files 3000] [--rounds 9]

Writes `--files` Parquet files of old rows (two days ago, one row a second, named as the log names them) and a
live log with a minute of recent rows, then times, interleaved round by round, `read_rows` of the last minute
(what `/v1/unmask/analysis` reads) and of everything (what every call read before the log was partitioned). Prints
the median seconds of each and the ratio with its range over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="unmask-log-reads-"))
    old_files(folder, args.files)
    log = RequestLog(folder, flush_rows=64, flush_s=0.2)
    for i in range(600):
        log.append(row(endpoint="completions", status=200, route="default", arm="candidate" if i % 4 else "fallback"))
    log.close()
    since = datetime.now(UTC) - timedelta(minutes=1)
    window, everything = [], []
    for _ in range(args.rounds):
        for times, bound in ((window, since), (everything, None)):
            started = time.perf_counter()
            rows = read_rows(folder, since=bound)
            times.append(time.perf_counter() - started)
        assert len(rows) == args.files + 600
    ratios = sorted(a / b for a, b in zip(everything, window))
    print(f"{args.files} old files, 600 rows in the last minute, {args.rounds} interleaved rounds:")
    print(f"  last minute: median {statistics.median(window):.4f} s ({len(read_rows(folder, since=since))} rows)")
    print(f"  everything:  median {statistics.median(everything):.4f} s ({args.files + 600} rows)")
    spread = f"range {ratios[0]:.0f}x-{ratios[-1]:.0f}x"
    print(f"  everything / last minute: median {statistics.median(ratios):.0f}x ({spread})")


if __name__ == "__main__":
    main()
