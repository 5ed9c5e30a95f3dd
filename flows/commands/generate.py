"""`unmask generate`: decode one prompt with the diffusion sampler and print text, NFE and time."""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def generate_command(
    prompt: str = typer.Argument(..., help="Prompt text."),
    model: str = typer.Option("tiny-llada", "--model", "-m", help="Model folder, or a bundled/catalog id."),
    steps: int = typer.Option(None, help="Sampling steps (default: gen_length)."),
    gen_length: int = typer.Option(64, "--gen-length", help="Positions to generate."),
    block_length: int = typer.Option(32, "--block-length", help="Semi-autoregressive block width."),
    temperature: float = typer.Option(0.0, help="0 = greedy; > 0 = Gumbel-max sampling."),
    cfg_scale: float = typer.Option(0.0, "--cfg-scale", help="Classifier-free guidance scale."),
    remasking: str = typer.Option("low_confidence", help="low_confidence or random."),
    seed: int = typer.Option(0, help="Random seed."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16."),
    raw: bool = typer.Option(False, "--raw", help="Print only the generated text."),
) -> None:
    """Generate a completion for PROMPT."""
    import torch

    from models import CheckpointError, load_model
    from sampler import SamplerConfig, generate

    try:
        loaded = load_model(model, device=device, dtype=dtype)
    except (CheckpointError, ValueError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    try:
        config = SamplerConfig(
            steps=steps or gen_length,
            gen_length=gen_length,
            block_length=min(block_length, gen_length),
            temperature=temperature,
            cfg_scale=cfg_scale,
            remasking=remasking,
            mask_id=loaded.mask_id,
            eos_id=loaded.eos_id,
            eot_id=loaded.eot_id,
            seed=seed,
        )
    except ValueError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    ids = torch.tensor([loaded.encode(prompt)], device=device)
    start = time.perf_counter()
    out = generate(loaded.model, ids, config)
    elapsed = time.perf_counter() - start
    tokens = out.generated[0].tolist()
    if loaded.eos_id in tokens:
        tokens = tokens[: tokens.index(loaded.eos_id)]
    text = loaded.decode(tokens)
    if raw:
        print(text)
        return
    console.print(text, markup=False, highlight=False)
    table = Table(show_header=False, box=None)
    table.add_row("model", str(loaded.path))
    table.add_row("NFE", str(out.nfe))
    table.add_row("time", f"{elapsed:.3f} s")
    table.add_row("config", config.to_json())
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("generate")(generate_command)
