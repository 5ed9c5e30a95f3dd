"""`unmask train`: reproduce a bundled tiny model from a seed on the CPU (or a GPU host), resumable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from flows.commands import options
from flows.failures import print_error

console = Console(soft_wrap=True)


def train_command(
    model: str = typer.Option(
        "tiny-llada",
        "--model",
        "-m",
        help="Recipe: tiny-llada (masked diffusion), tiny-dgemma (block diffusion) or tiny-ar (causal twin).",
    ),
    steps: int = typer.Option(None, callback=options.positive, help="Optimizer steps (default: the recipe's)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last resumable checkpoint in --state-dir."),
    stop_after: int = typer.Option(
        None,
        "--stop-after",
        callback=options.positive,
        help="End this session at that step (checkpointed); --resume later.",
    ),
    out: Path = typer.Option(None, help="Where the final checkpoint goes (default: <state>/trained/<model>)."),
    force: bool = typer.Option(
        False, "--force", help="Overwrite a checkpoint already in --out (the bundled ones too)."
    ),
    state_dir: Path = typer.Option(None, "--state-dir", help="Resumable checkpoints (default: <state>/train/<model>)."),
    seed: int = typer.Option(None, help="Seed for initialisation, batches and masking (default: the recipe's)."),
    threads: int = typer.Option(
        None, callback=options.threads, help="torch CPU threads (default: $UNMASK_THREADS, else 1)."
    ),
    lr: float = typer.Option(None, help="Peak learning rate (default: the recipe's)."),
    mixture: str = typer.Option(None, help="Data schedule from evals/tasks/mixture.py (default: the recipe's)."),
    restart: list[int] = typer.Option(None, "--restart", help="Step where the cosine starts again (repeatable)."),
    restart_lr: float = typer.Option(
        None, "--restart-lr", help="Peak learning rate after a restart (default: the recipe's)."
    ),
    init_from: str = typer.Option(
        None, "--init-from", help="Fine-tune from this checkpoint folder (default: the recipe's, under <state>)."
    ),
    device: str = typer.Option(
        "cpu", callback=options.device, help="Where to train: cpu, or cuda[:N] on a GPU host (same batches and masks)."
    ),
) -> None:
    """Train a bundled tiny model on the generated task suite (train split only)."""
    from evals.tasks import alphabet
    from evals.tasks.mixture import build_mixture
    from models.checkpoint import resolve_device
    from models.loading import WEIGHTS_DIR
    from models.state import state_dir as default_state
    from models.tokenizer_build import build_char_tokenizer
    from models.training import RECIPES, train

    if model not in RECIPES:
        print_error(console, f"--model {model!r}; known: {', '.join(RECIPES)}")
        raise typer.Exit(2)
    try:
        resolve_device(device)
    except ValueError as exc:
        print_error(console, f"--device: {exc}")
        raise typer.Exit(2) from None
    threads, threads_from = options.apply_threads(threads)
    console.print(f"torch threads: {threads} ({threads_from})", highlight=False)
    cfg = RECIPES[model]
    given: dict[str, Any] = {
        "steps": steps,
        "seed": seed,
        "lr": lr,
        "mixture": mixture,
        "restarts": tuple(restart) if restart else None,
        "restart_lr": restart_lr,
        "init_from": init_from,
    }
    cfg = replace(cfg, **{k: v for k, v in given.items() if v is not None})
    try:
        source = build_mixture(cfg.mixture, seed=cfg.seed)
    except ValueError as exc:
        print_error(console, f"--mixture: {exc}")
        raise typer.Exit(2) from None
    out = out or default_state() / "trained" / model  # never over the bundled models/weights/<model> by default
    if holds_checkpoint(out) and not force:
        bundled = " (a bundled model: tests and demos use it)" if out.resolve().is_relative_to(WEIGHTS_DIR) else ""
        print_error(
            console, f"--out {out}: holds a checkpoint already{bundled}; give another --out, or --force to overwrite it"
        )
        raise typer.Exit(2)
    state_dir = state_dir or default_state() / "train" / model
    console.print(f"training {model} for {cfg.steps} steps on {device} -> {out} (resumable state in {state_dir})")
    try:
        _, state = train(
            cfg,
            source,
            build_char_tokenizer(alphabet()),
            out,
            state_dir,
            resume=resume,
            stop_after=stop_after,
            console=console,
            device=device,
            init_base=default_state(),
        )
    except FileNotFoundError as exc:
        print_error(console, str(exc))
        raise typer.Exit(2) from None
    console.print(f"done: {state.step} steps, {state.wall_seconds:.0f} s, final loss (EMA) {state.loss_ema:.4f}")


def holds_checkpoint(folder: Path) -> bool:
    return folder.is_dir() and ((folder / "config.json").is_file() or any(folder.glob("*.safetensors")))


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
