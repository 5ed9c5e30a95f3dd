"""Keep freed activation memory in the process, so a batched CPU forward does not fault its pages in anew.

glibc's malloc hands a large block (above `M_MMAP_THRESHOLD`, 128 KiB at first) out of a fresh `mmap` and
returns it to the kernel on free, and it gives a heap's free top back once it passes `M_TRIM_THRESHOLD`.
A forward of tiny-llada over 16 canvases allocates and frees some 34 MB of activations in blocks of a few
MB; with glibc's defaults every one of those pages is faulted in and zeroed by the kernel again on every
forward: 8,400-8,600 minor faults a forward, which made the 16-row forward 27-31 ms where it is 17-18 ms
with the pages kept (docs/experiments/serving-batching/README.md, "The allocator"). A thread's arena (the
server's compute thread) behaves the same way. One forward of one row allocates little and is not changed.

`retain_freed_memory()` raises both thresholds once per process through `mallopt`, the documented
run-time form of the `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` variables: blocks up to 32 MiB
(as high as glibc's own moving threshold ever goes, and half a thread arena's heap) come from the heap, and
up to 1 GiB of freed heap stays with the process for the next forward. The price is a resident size that
does not shrink back after a large batch. Where the operator set either variable, or `GLIBC_TUNABLES` names
malloc, their choice stands and nothing is changed; on a C library other than glibc there is nothing to tune.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform

M_TRIM_THRESHOLD = -1  # mallopt parameter numbers, from glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # bytes: the ceiling of glibc's own moving threshold on a 64-bit host
TRIM_THRESHOLD = 1 << 30  # bytes of freed heap top kept before any is given back to the kernel
OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

log = logging.getLogger("unmask.models")


@functools.cache  # once per process; two threads racing here would only set the same values twice
def retain_freed_memory() -> str:
    """Tune glibc's malloc once per process (see the module docstring) and say what was done: 'tuned',
    'operator' (the environment already sets malloc's thresholds), 'not glibc' or 'refused' (mallopt answered 0
    for a value; logged as a warning, since batched CPU forwards then fault their pages in again)."""
    if any(name in os.environ for name in OPERATOR_SETTINGS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return "operator"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "not glibc"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # setting either turns glibc's dynamic thresholds off, so both are set
    ok = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and ok
    if not ok:
        log.warning(
            "glibc's mallopt refused the thresholds (mmap %d, trim %d bytes): batched CPU forwards will "
            "fault their activation pages in anew",
            MMAP_THRESHOLD,
            TRIM_THRESHOLD,
        )
    return "tuned" if ok else "refused"
