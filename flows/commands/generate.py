"""`unmask generate`: decode one prompt (the diffusion sampler, or KV-cached AR decoding for an
autoregressive model) and print text, NFE and time."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from flows.commands import options
from flows.failures import print_error

if TYPE_CHECKING:
    from sampler import SamplerConfig
    from sampler.output import GenerateOutput
    from serving.decoding import ServedHandle

console = Console()


def generate_command(
    prompt: str = typer.Argument(..., help="Prompt text."),
    model: str = typer.Option("tiny-llada", "--model", "-m", help="Model folder, or a bundled/catalog id."),
    steps: int = typer.Option(
        None,
        callback=options.positive,
        help="Sampling steps (default: the operating point's; with --exact, gen_length).",
    ),
    gen_length: int = typer.Option(
        None,
        "--gen-length",
        callback=options.positive,
        help="Positions to generate (default: the operating point's; 64 with --exact).",
    ),
    block_length: int = typer.Option(
        None,
        "--block-length",
        callback=options.positive,
        help="Semi-autoregressive block width (default: the operating point's; 32 with --exact).",
    ),
    temperature: float = typer.Option(
        None, help="0 = greedy; > 0 = Gumbel-max sampling (default: the operating point's)."
    ),
    cfg_scale: float = typer.Option(0.0, "--cfg-scale", help="Classifier-free guidance scale."),
    remasking: str = typer.Option(
        None, help="low_confidence, random, margin (top-2 probability gap) or entropy (default: the operating point's)."
    ),
    exact: bool = typer.Option(
        False,
        "--exact",
        help="The reference decode: one position committed per step "
        "(steps = gen_length), instead of the model's operating point.",
    ),
    seed: int = typer.Option(0, help="Random seed."),
    device: str = typer.Option("cpu", callback=options.device, help="cpu or cuda."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16."),
    raw: bool = typer.Option(False, "--raw", help="Print only the generated text."),
    trace: bool = typer.Option(
        False, "--trace", help="Show the canvas as decoding committed it (EOS overflow shows here)."
    ),
) -> None:
    """Generate a completion for PROMPT."""
    import torch

    from models import CheckpointError, load
    from sampler import CommitTrace
    from sampler.decode import DecodeError, check_fits, check_prompt_text, decode

    try:
        loaded = load(model, device=device, dtype=dtype)
    except (CheckpointError, ValueError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    given = {
        "steps": steps,
        "gen_length": gen_length,
        "block_length": block_length,
        "temperature": temperature,
        "remasking": remasking,
    }
    try:
        config, source = generate_config(model, loaded, given, exact, cfg_scale, seed)
    except ValueError as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    kind = loaded.kind
    if trace and kind != "masked-diffusion":
        console.print(
            f"[red]error:[/red] --trace shows the order in which masked diffusion commits positions; "
            f"{model} is a {kind} model",
            highlight=False,
        )
        raise typer.Exit(2)
    try:
        check_prompt_text(loaded, prompt)  # before tokenising: a 5 MB prompt is refused, not encoded
        ids = torch.tensor([loaded.encode(prompt)], device=device)
        check_fits(loaded, ids.shape[1], config.gen_length)
    except DecodeError as e:
        print_error(console, f"{model}: {e}")
        raise typer.Exit(2) from None
    commits = CommitTrace()
    start = time.perf_counter()
    try:
        traced: dict[str, Any] = {"on_step": commits} if trace else {}
        out = decode(loaded, ids, config, **traced)
    except (DecodeError, ValueError, FloatingPointError) as e:  # NaN/inf logits, a config this model cannot decode
        print_error(console, f"{model}: {e}")
        raise typer.Exit(2) from None
    elapsed = time.perf_counter() - start
    text = loaded.response_text(out.generated[0].tolist())
    if raw:
        print(text)
        return
    console.print(text, markup=False, highlight=False)
    if trace:
        ends = loaded.stop_ids | ({loaded.pad_id} - {None})
        pieces = [loaded.decode([t]) if t not in ends else END for t in out.generated[0].tolist()]
        lines, summary = commit_timeline(pieces, commits.generated(out.prompt_length)[0])
        console.print("\n".join(lines), markup=False, highlight=False)
        console.print(summary, markup=False, highlight=False)
    console.print(facts_table(loaded, out, elapsed, source, given, config))


def generate_config(
    model: str, loaded: ServedHandle, given: dict[str, Any], exact: bool, cfg_scale: float, seed: int
) -> tuple[SamplerConfig, str]:
    """The SamplerConfig generate decodes with, and where its settings came from: the reference (`--exact`) or the
    model's operating point, with the flags given on top. ValueError names a setting the sampler refuses."""
    from sampler import SamplerConfig

    base, source = ({}, "exact: one position per step (--exact)") if exact else operating_point(model, loaded)
    settings = (
        EXACT | {k: v for k, v in base.items() if k in SETTINGS} | {k: v for k, v in given.items() if v is not None}
    )
    if exact:
        settings["steps"] = given["steps"] or settings["gen_length"]  # the reference: one committed position per step
    elif given["steps"] is None and given["gen_length"] is not None and base.get("gen_length"):  # the pace kept
        settings["steps"] = max(1, round(base["steps"] * given["gen_length"] / base["gen_length"]))
    ids: dict[str, Any] = loaded.sampler_ids()  # its mask, EOS and EoT ids: the config carries them
    config = SamplerConfig(
        **settings | {"block_length": min(settings["block_length"], settings["gen_length"])},
        cfg_scale=cfg_scale,
        seed=seed,
        **ids,
    )
    return config, source


def facts_table(
    loaded: ServedHandle, out: GenerateOutput, elapsed: float, source: str, given: dict[str, Any], config: SamplerConfig
) -> Table:
    """What generate prints under the text: the model, NFE, time, where the settings came from, the config."""
    table = Table(show_header=False, box=None)
    table.add_row("model", str(loaded.path))
    table.add_row("NFE", str(out.nfe))
    table.add_row("time", f"{elapsed:.3f} s")
    table.add_row(
        "decoded with", source + ("; flags given override it" if any(v is not None for v in given.values()) else "")
    )
    table.add_row("config", config.to_json())
    return table


# The reference decode (--exact): every setting generate reads, one committed position per step (steps = gen_length).
EXACT: dict[str, Any] = {"gen_length": 64, "block_length": 32, "temperature": 0.0, "remasking": "low_confidence"}
SETTINGS = ("steps", "gen_length", "block_length", "temperature", "remasking")


def operating_point(model: str, loaded: ServedHandle) -> tuple[dict[str, Any], str]:
    """The settings MODEL decodes with by default, and where they came from: the gate-chosen config recorded with
    its latest registered version (what `unmask serve` decodes with), else the catalog's decoding defaults. The
    registry is read only where one exists: generate never creates a store."""
    from models.state import state_dir
    from registry import Registry, RegistryError, latest_registration
    from registry.serving import served_version
    from serving.decoding import operating_config

    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{state_dir(create=False) / 'mlflow' / 'mlflow.db'}"
    recorded, where = None, ""
    name = getattr(loaded, "entry_id", "") or model
    if not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).is_file():
        try:
            registry = Registry(uri)
            version = latest_registration(registry.aliases_of(name))
            if version:
                served = served_version(registry, name, at=(name, version))
                recorded, where = served.operating_config, f" of {name} v{version} ({served.stage} gates)"
        except (RegistryError, ValueError, KeyError):  # no such model, or evidence unreadable: the catalog decides
            recorded = None
    config, source = operating_config(loaded, recorded)
    if recorded is None:
        source = "the catalog's decoding defaults (no registered operating point; `unmask run` records one)"
    return {k: getattr(config, k) for k in SETTINGS}, source + where


END, MASKED = "·", "_"


def commit_timeline(pieces: list[str], commit_step: list[int], snapshots: int = 12) -> tuple[list[str], str]:
    """The canvas after evenly spaced decoding steps (`_` still masked, `·` end of text), and a summary.

    `pieces[i]` is position i's final text (END for EOS/EoT/pad) and `commit_step[i]` the step that
    committed it (-1: filled by an early exit). The summary counts end tokens committed while text
    positions before them were still masked: the "EOS overflow" of models trained on EOS padding,
    where the end of the canvas is decided first and creeps left into the answer.
    """
    last = max(commit_step, default=-1)
    marks = sorted({round(last * k / (snapshots - 1)) for k in range(snapshots)}) if last >= 0 else []
    width = len(str(last))
    lines = [
        f"step {s:>{width}}  " + "".join(p if 0 <= c <= s else MASKED for p, c in zip(pieces, commit_step))
        for s in marks
    ]
    text_done = max((c for p, c in zip(pieces, commit_step) if p != END), default=-1)  # step of the last text commit
    early = sum(1 for p, c in zip(pieces, commit_step) if p == END and 0 <= c < text_done)
    ends = sum(1 for p in pieces if p == END)
    return lines, f"end tokens committed before the text was complete: {early} of {ends}"


def register(app: typer.Typer) -> None:
    app.command("generate")(generate_command)
