"""`unmask pull MODEL_ID`: judge the memory fit, then fetch a catalog entry at its pinned revision, verify it,
install it atomically."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.console import Console

from flows.failures import print_error

if TYPE_CHECKING:
    from models.catalog import CatalogEntry
    from sampler.fit import MemoryFit

console = Console()


DEVICE_HELP = (
    "Judge the memory fit for cpu (this host's available RAM) or cuda (with --memory, or the GPU's free memory)."
)
MEMORY_HELP = "Memory to judge the fit against, e.g. 80GiB (default: what the device has available now)."
DTYPE_HELP = "Weights' dtype for the fit: float32, bfloat16 or float16 (default: float32 on cpu, bfloat16 on cuda)."


def entry_fit(entry: CatalogEntry, device: str, memory: str | None, dtype: str | None) -> MemoryFit | None:
    """The memory fit of `entry` (None for an API entry, whose memory is its provider's); ValueError on a bad
    --device, --memory or --dtype."""
    from gates.request_limits import RequestLimits
    from gates.serving_policy import ServingPolicyError, load_serving_policy
    from models.loading import resolve_dtype
    from models.pull import PullError, entry_path
    from sampler.fit import memory_fit, parameters_on_disk, read_shape
    from sampler.memory import available_bytes, parse_bytes

    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device: expected cpu or cuda, got {device!r}")
    if entry.is_api:
        return None
    width = resolve_dtype(dtype or ("bfloat16" if device == "cuda" else "float32")).itemsize
    if memory is not None:
        have, basis = parse_bytes(memory), "stated --memory"
    elif device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no GPU here; state the accelerator's memory with --memory, e.g. 80GiB")
        have, basis = available_bytes("cuda"), "free on the GPU"
    else:
        have, basis = available_bytes("cpu"), "MemAvailable of this host"
    try:
        max_canvas = load_serving_policy().limits.max_canvas
    except ServingPolicyError:
        max_canvas = RequestLimits().max_canvas
    try:
        folder = entry_path(entry)
    except PullError:
        folder = None  # not here yet: the terms that need its files say unknown
    counted = parameters_on_disk(folder) if folder is not None and entry.parameters is None else None
    return memory_fit(
        entry,
        device=device,
        dtype_bytes=width,
        have=have,
        have_basis=basis,
        max_canvas=max_canvas,
        shape=read_shape(folder),
        counted=counted,
    )


def pull_command(
    model_id: str = typer.Argument(..., help="Catalog id (see `unmask models`)."),
    catalog: str = typer.Option(None, "--catalog", help="Catalog file (default: $UNMASK_CATALOG or the bundled one)."),
    offline: bool = typer.Option(
        None, "--offline/--online", help="Use only the Hugging Face cache (default: $HF_HUB_OFFLINE)."
    ),
    device: str = typer.Option("cpu", "--device", help=DEVICE_HELP),
    memory: str = typer.Option(None, "--memory", help=MEMORY_HELP),
    dtype: str = typer.Option(None, "--dtype", help=DTYPE_HELP),
    no_fit_check: bool = typer.Option(
        False, "--no-fit-check", help="Pull even when the memory fit says it does not fit (kept in the manifest)."
    ),
) -> None:
    """Pull MODEL_ID into the local model store (<state>/models/MODEL_ID), after a memory fit."""
    from models.catalog import CatalogError, load_catalog
    from models.pull import PullError, pull
    from sampler.fit import DOES_NOT_FIT

    try:
        entries = load_catalog(catalog)
        entry = entries.get(model_id)
        fit = entry_fit(entry, device, memory, dtype)
    except (CatalogError, ValueError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    recorded = None
    if fit is not None:
        recorded = fit.to_dict() | {"overridden": no_fit_check and fit.verdict == DOES_NOT_FIT}
        if fit.verdict == DOES_NOT_FIT and not no_fit_check:
            print_error(console, f"model '{entry.id}' does not fit: nothing was downloaded")
            for line in fit.lines():
                console.print(f"  {line}", highlight=False)
            console.print("  (pull anyway with --no-fit-check; the override is kept in the pull's manifest)")
            raise typer.Exit(1)  # a decision, as `unmask gates` exits 1 when blocked
        shown = "overridden by --no-fit-check, " if recorded["overridden"] else ""
        console.print(f"memory fit: {shown}{fit.summary()}", highlight=False)
    try:
        result = pull(entry, catalog=entries, offline=offline, fit=recorded)
    except PullError as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    console.print(f"pulled [bold]{result.entry_id}[/bold] -> {result.path}", highlight=False)
    console.print(f"  {len(result.files)} files verified" + (f", commit {result.commit}" if result.commit else ""))
    for finding in result.findings:
        colour = "red" if finding["severity"] == "error" else "yellow"
        console.print(f"  [{colour}]{finding['check']} finding:[/{colour}] {finding['message']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("pull")(pull_command)
