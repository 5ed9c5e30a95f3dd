"""How long a second look at a settled weights file takes (models/digest.file_sha256), against the first read.

    .venv/bin/python docs/experiments/weights-digest/memo_bench.py

Writes a 1 GiB `model.safetensors` of random bytes in a temporary folder, moves the digest module's clock 60 s past
the file's stamps (so the file counts as settled), and times `weights_sha256` twice. Measured 2026-12-07 on the
2-core host: first 0.61 s and 0.60 s, second 0.0002 s, the same digest.
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from models import digest  # noqa: E402  # the repository first on the path

folder = Path(tempfile.mkdtemp(prefix="memo-"))
weights = folder / "model.safetensors"
with open(weights, "wb") as out:
    block = os.urandom(1 << 20)
    for _ in range(1024):
        out.write(block)
real_time = time.time
digest.time = type("Clock", (), {"time": staticmethod(lambda: real_time() + 60)})  # the stamps are 60 s old
start = time.perf_counter()
first = digest.weights_sha256(folder)
middle = time.perf_counter()
second = digest.weights_sha256(folder)
end = time.perf_counter()
print(f"1 GiB: first {middle - start:.2f} s, second {end - middle:.4f} s, same digest {first == second}")
weights.unlink()
folder.rmdir()
