"""Held-out scores of a bundled tiny model and the steps-ratio table, written into its MODEL_CARD.md.

    python -m evals.model_report models/weights/tiny-llada --n 200 --ratios 1,2,4,8

A diffusion model is decoded with vanilla LLaDA settings (block_length 32, temperature 0,
low-confidence remasking) at steps = gen_length / ratio; a causal model greedily (ratio 1 only).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from evals.bench import VARIANTS
from evals.quality import evaluate_items, metric_means
from evals.tasks import TASKS, Task, TaskItem, make_split
from evals.tasks.mixture import describe_mixture
from models import load
from models.adapters import folder_layout
from models.checkpoint import resolve_device
from models.pull import sha256_of
from sampler import SamplerConfig


def vanilla_config(gen_length: int, ratio: int = 1) -> SamplerConfig:
    """LLaDA's vanilla decoding at steps = gen_length / ratio."""
    return SamplerConfig(
        steps=gen_length // ratio, gen_length=gen_length, block_length=min(32, gen_length), temperature=0.0
    )


# Decoding modes a card reports per generation length (ratio 1: the step budget is gen_length; the fast
# modes commit as many positions per step as their rule allows and stop once the answer is final), each the
# settings of one `unmask bench` row (evals/bench.py VARIANTS), so a card and the bench decode alike.
# `vanilla+exit` gives vanilla's text exactly (early exit stops only once the text before the first EOS is
# final; tests/unit/test_sampler_modes.py), so it measures vanilla's accuracy at long canvases for a fraction of
# the calls.
MODE_VARIANTS = {
    "vanilla": "vanilla",
    "vanilla+exit": "early-exit",
    "threshold": "parallel-threshold-0.9",
    "threshold+dual+exit": "dual+parallel+exit",
    "threshold+dual+exit+W16": "dual+parallel+exit+W16",
}
MODE_SETTINGS: dict[str, dict[str, Any]] = {
    mode: dict(next(v for v in VARIANTS if v.name == row).settings) for mode, row in MODE_VARIANTS.items()
}
# one evaluation run of a card: (tasks, n, gen_length override, ratios, modes)
RunGroup = tuple[tuple[str, ...], int, int | None, tuple[int, ...], tuple[str, ...]]


def mode_config(mode: str, gen_length: int, ratio: int = 1) -> SamplerConfig:
    """The vanilla config at `ratio` with the mode's fast-decoding settings on top."""
    if mode not in MODE_SETTINGS:
        raise ValueError(f"unknown decoding mode {mode!r}; known: {', '.join(MODE_SETTINGS)}")
    return vanilla_config(gen_length, ratio).with_(**MODE_SETTINGS[mode])


def band_accuracy(task: Task, items: list[TaskItem], predictions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accuracy per answer-length band for a task that defines `bands` (sort), else []."""
    bands = getattr(task, "bands", None)
    if not bands:
        return []
    out = []
    for low, high, _ in bands:
        inside = [p for i, p in zip(items, predictions) if low <= len(i.target) <= high]
        if inside:
            out.append({"band": f"{low}-{high}", "n": len(inside), "accuracy": metric_means(inside, task.metrics)})
    return out


def bands_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: exact-match and char-accuracy per length band and steps ratio (sort)."""
    lines = []
    for r in rows:
        for b in r.get("bands") or []:
            acc = ", ".join(f"{m} {100 * v:.1f}%" for m, v in b["accuracy"].items())
            lines.append(
                f"| {r['task']} | {r['gen_length']} | {r.get('mode', 'vanilla')} | {r['steps']} | {b['band']} | "
                f"{b['n']} | {acc} |"
            )
    if not lines:
        return ""
    return "\n".join(
        ["| task | gen_length | mode | steps | letters | items | accuracy |", "|---|---|---|---|---|---|---|", *lines]
    )


def steps_ratio_table(
    loaded: Any,
    split: str,
    n: int,
    ratios: list[int],
    seed: int = 0,
    batch_size: int = 50,
    tasks: list[str] | None = None,
    gen_lengths: dict[str, int] | None = None,
    modes: list[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per (task, gen_length, mode, ratio): accuracy per metric on `n` items of `split`.

    Vanilla is run at every ratio; the other `modes` (MODE_SETTINGS) at ratio 1. A causal model has
    one row per task (greedy decoding reads none of these settings).
    """
    rows = []
    for name in tasks or list(TASKS):
        task = TASKS[name]
        items = make_split(task, split, n, seed=seed)
        gen_length = (gen_lengths or {}).get(name, task.gen_length)
        runs = (
            [("vanilla", 1)]
            if loaded.causal
            else [
                *((mode, 1) for mode in modes or () if mode != "vanilla"),
                *(("vanilla", r) for r in ratios if "vanilla" in (modes or ["vanilla"])),
            ]
        )
        for mode, ratio in runs:
            result = evaluate_items(loaded, items, mode_config(mode, gen_length, ratio), batch_size)
            rows.append(
                {
                    "task": name,
                    "split": split,
                    "n": n,
                    "gen_length": gen_length,
                    "ratio": ratio,
                    "mode": mode,
                    "steps": gen_length // ratio,
                    "forwards_per_batch": round(result["nfe"] / -(-len(items) // batch_size), 1),
                    "accuracy": result["accuracy"],
                    "seconds": round(result["seconds"], 1),
                    "bands": band_accuracy(task, items, result["predictions"]),
                    "examples": result["predictions"][:3],
                }
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "examples"}), flush=True)
    return rows


def row_groups(rows: list[dict[str, Any]]) -> list[RunGroup]:
    """(tasks, n, gen_length override, ratios, modes) per evaluation run that produced `rows`: tasks measured
    with the same items, length, ratios and modes share one run."""
    per_task: dict[tuple[str, int, int | None], list[dict[str, Any]]] = {}
    for r in rows:
        override = r["gen_length"] if r["gen_length"] != TASKS[r["task"]].gen_length else None
        per_task.setdefault((r["task"], r["n"], override), []).append(r)
    runs: dict[tuple[int, int | None, tuple[int, ...], tuple[str, ...]], list[str]] = {}
    for (task, n, override), group in per_task.items():
        ratios = tuple(sorted({r["ratio"] for r in group if r.get("mode", "vanilla") == "vanilla"})) or (1,)
        modes = tuple(dict.fromkeys(r.get("mode", "vanilla") for r in group))
        runs.setdefault((n, override, ratios, modes), []).append(task)
    return [(tuple(tasks), n, override, ratios, modes) for (n, override, ratios, modes), tasks in runs.items()]


def reproduce_command(model: Path, group: RunGroup) -> str:
    tasks, n, override, ratios, modes = group
    command = (
        f"python -m evals.model_report {model} --split test --n {n} --tasks {','.join(tasks)} "
        f"--ratios {','.join(map(str, ratios))}"
    )
    if modes != ("vanilla",):
        command += f" --modes {','.join(modes)}"
    if override:
        command += "".join(f" --gen-length {t}={override}" for t in tasks)
    return command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--ratios", default="1,2,4,8")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--modes", default="vanilla", help=f"decoding modes, of {', '.join(MODE_SETTINGS)}")
    parser.add_argument("--gen-length", action="append", default=[], help="task=length, e.g. sort=256")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda[:N] on a GPU host")
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the rows")
    parser.add_argument(
        "--card",
        type=Path,
        nargs="+",
        default=None,
        help="write MODEL_CARD.md from these saved rows files (no evaluation)",
    )
    parser.add_argument("--peer", type=Path, nargs="+", default=None, help="the twin's rows files, for comparison")
    parser.add_argument("--notes", type=Path, default=None, help="Markdown file for the card's Notes section")
    args = parser.parse_args()
    if args.card:
        rows = [r for f in args.card for r in json.loads(f.read_text())]
        peer = [r for f in args.peer or [] for r in json.loads(f.read_text())]
        reproduce = [reproduce_command(args.model, group) for group in row_groups(rows)]
        notes = args.notes.read_text() if args.notes else ""
        print(write_card(args.model, rows, peer or None, notes=notes, reproduce=reproduce))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        parser.error(f"--device: {exc}")

    loaded = load(args.model, device=device)
    gen_lengths = {k: int(v) for k, v in (g.split("=") for g in args.gen_length)}
    unknown = [m for m in args.modes.split(",") if m not in MODE_SETTINGS]
    if unknown:
        parser.error(f"--modes: unknown mode {unknown[0]!r}; known: {', '.join(MODE_SETTINGS)}")
    rows = steps_ratio_table(
        loaded,
        args.split,
        args.n,
        [int(r) for r in args.ratios.split(",")],
        tasks=args.tasks.split(","),
        gen_lengths=gen_lengths,
        modes=args.modes.split(","),
    )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


def modes_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per (task, gen_length), one column per decoding mode (accuracy, forwards per batch)."""
    modes = list(dict.fromkeys(r.get("mode", "vanilla") for r in rows if r["ratio"] == 1))
    if modes == ["vanilla"] and len({r["gen_length"] for r in rows}) == 1:
        return ""
    metric_of = {r["task"]: next(iter(r["accuracy"])) for r in rows}
    cells: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["ratio"] == 1:
            cells.setdefault((r["task"], r["gen_length"]), {})[r.get("mode", "vanilla")] = r
    lines = ["| task | gen_length | items | " + " | ".join(modes) + " |", "|" + "---|" * (3 + len(modes))]
    for (task, gen_length), by_mode in sorted(cells.items(), key=lambda kv: (list(TASKS).index(kv[0][0]), kv[0][1])):
        n = next(iter(by_mode.values()))["n"]
        values = [
            f"{100 * by_mode[m]['accuracy'][metric_of[task]]:.1f}%"
            + (f" ({by_mode[m]['forwards_per_batch']:g} fwd)" if "forwards_per_batch" in by_mode[m] else "")
            if m in by_mode
            else ""
            for m in modes
        ]
        lines.append(f"| {task} | {gen_length} | {n} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def scores_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per task, one column per steps ratio (vanilla decoding)."""
    rows = [r for r in rows if r.get("mode", "vanilla") == "vanilla"]
    ratios = sorted({r["ratio"] for r in rows})
    head = (
        "| task | gen_length | metric | "
        + " | ".join(f"steps = gen_length/{r}" if r > 1 else "steps = gen_length" for r in ratios)
        + " |"
    )
    lines = [head, "|" + "---|" * (3 + len(ratios))]
    seen = []
    for r in rows:
        if (r["task"], r["gen_length"]) not in seen:
            seen.append((r["task"], r["gen_length"]))
    for task, gen_length in seen:
        cells = {r["ratio"]: r for r in rows if r["task"] == task and r["gen_length"] == gen_length}
        for metric in next(iter(cells.values()))["accuracy"]:
            values = [f"{100 * cells[q]['accuracy'][metric]:.1f}%" if q in cells else "" for q in ratios]
            lines.append(f"| {task} | {gen_length} | {metric} | " + " | ".join(values) + " |")
    return "\n".join(lines)


DIFFICULTY = """\
- `arith` / `arith-ko`: one operation per problem, addition of two operands in 0-49 or subtraction
  a - b with 0 <= b <= a <= 99 (one- or two-digit numbers, no negative results), one short
  sentence of English or Korean; the answer is a column-arithmetic worked line, units first
  (`7+5=12,3+4+1=8` for 37+45, `12-5=7,8-1-4=3` for 82-45), then `#### c`; gen_length 32.
- `sort`: sort 2-120 lowercase letters (duplicates allowed; 60% of items 2-24 letters, 25% 25-60,
  15% 61-120), answer = the sorted letters (up to 120 tokens); gen_length 128 (also reported at
  256); scores are also given per length band.
- `infill`: seven terms of an arithmetic progression below 100 (step 1-9) with 1-3 consecutive
  inner terms shown as `?`; answer = the missing terms; gen_length 32.
- Splits: a problem's key (operation and operands, the letter string, the progression) is hashed
  into train (90%), validation (5%) and test (5%); English and Korean share keys, so no test
  problem is trained in either language (checked by tests/unit/test_tasks.py)."""


def reproduce_training(model_id: str, recipe: dict[str, Any], training: dict[str, Any]) -> str:
    """The `unmask train` commands that give these weights; a fine-tune names its base and the base's sha256."""
    command = f"`unmask train --model {model_id} --threads 1`"
    if not recipe.get("init_from"):
        return command
    base = f"{model_id}-base"
    out = "" if recipe["init_from"] == f"trained/{base}" else f" --out <state>/{recipe['init_from']}"
    return (
        f"`unmask train --model {base} --threads 1{out}` (the base, weights sha256 "
        f"`{training.get('init_sha256', 'unrecorded')}`), then {command}, which fine-tunes from it"
    )


def write_card(
    folder: Path,
    rows: list[dict[str, Any]],
    peer_rows: list[dict[str, Any]] | None = None,
    notes: str = "",
    reproduce: list[str] | None = None,
) -> Path:
    """Write `folder/MODEL_CARD.md` from config.json's training record and the measured rows."""
    import yaml

    config = json.loads((folder / "config.json").read_text())
    model_id = config.get("unmask_training", {}).get("recipe", {}).get("model_id", folder.name)
    params = sum(v.numel() for v in load(folder).model.parameters())
    sha = sha256_of(folder / "model.safetensors")
    header = card_header(folder, config, model_id, rows, params, sha)
    reproduce = reproduce or [f"python -m evals.model_report models/weights/{model_id} --split test"]
    body = card_body(config, model_id, rows, params, sha, reproduce)
    body += card_sections(rows, peer_rows, notes, causal=bool(config.get("causal")), block=_block(config))
    path = folder / "MODEL_CARD.md"
    path.write_text("---\n" + yaml.safe_dump(header, sort_keys=False, allow_unicode=True) + "---\n\n" + body)
    return path


def card_header(
    folder: Path, config: dict[str, Any], model_id: str, rows: list[dict[str, Any]], params: int, sha: str
) -> dict[str, Any]:
    """The card's YAML front matter: identity, digests, training figures and the best held-out scores."""
    training = config.get("unmask_training", {})
    best = {
        r["task"]: r["accuracy"]
        for r in rows
        if r["ratio"] == 1 and r["gen_length"] == TASKS[r["task"]].gen_length and r.get("mode", "vanilla") == "vanilla"
    }
    return {
        "license": "Apache-2.0",
        "model_id": model_id,
        "family": "diffusion-gemma" if _block(config) else "llada",
        "kind": _kind(config),
        "parameters": params,
        "languages": ["en", "ko"],
        "tasks": list(TASKS),
        "sha256": {
            "model.safetensors": sha,
            "tokenizer.json": sha256_of(folder / "tokenizer.json"),
            "config.json": sha256_of(folder / "config.json"),
        },
        "training_steps": training.get("steps"),
        "training_wall_seconds": training.get("wall_seconds"),
        "final_loss_ema": training.get("final_loss_ema"),
        "heldout_test": {t: {m: round(v, 4) for m, v in acc.items()} for t, acc in best.items()},
    }


def _block(config: dict[str, Any]) -> bool:
    return folder_layout(config) == "diffusion-gemma"


def _kind(config: dict[str, Any]) -> str:
    return "block-diffusion" if _block(config) else "autoregressive" if config.get("causal") else "masked-diffusion"


DECODING = {
    "autoregressive": "greedy AR decoding with a KV cache (sampler/autoregressive.py), up to gen_length new tokens",
    "masked-diffusion": "vanilla LLaDA decoding: steps = gen_length, block_length 32, temperature 0, "
    "low-confidence remasking",
    "block-diffusion": "DiffusionGemma's block decoding (sampler/block_diffusion.py): one canvas after another, at "
    "most steps / canvases denoising steps per canvas, entropy-bounded acceptance, the "
    "linear temperature schedule 0.8 -> 0.4, a canvas stops once stable and confident, seed 0",
}
OBJECTIVE = {
    "autoregressive": "next-token cross-entropy on the response and one closing EOS (causal mask)",
    "masked-diffusion": "LLaDA SFT masked diffusion: t ~ U(0, 1], each response token masked with probability t, "
    "cross-entropy on masked positions weighted 1/t, divided by the response length; the prompt is "
    "never masked; the response is padded with EOS to the canvas length and the padding is trained",
    "block-diffusion": "DiffusionGemma's block-diffusion SFT (models/block_training.py): per step one 32-position "
    "canvas of the EOS-padded response; the causal encoder reads the clean prompt and response up "
    "to that canvas; the decoder denoises the canvas under uniform-state corruption (t ~ U(eps, 1] "
    "per row, each position replaced by a uniform random token with probability t), with "
    "self-conditioning (two passes, p 0.5); flat cross-entropy on every canvas position plus the "
    "encoder's next-token cross-entropy on the response",
}


def _architecture(config: dict[str, Any], recipe: dict[str, Any], params: int) -> str:
    """The card's first paragraph: the layout, sizes and vocabulary of the model."""
    if _block(config):
        text = config.get("text_config", {})
        return (
            f"A block-diffusion model in transformers' DiffusionGemma layout (`DiffusionGemmaForBlockDiffusion`: a "
            f"causal encoder and a bidirectional decoder sharing weights; {text.get('num_hidden_layers')} layers, "
            f"hidden {text.get('hidden_size')}, {text.get('num_attention_heads')} heads "
            f"({text.get('num_key_value_heads')} KV), head dim {text.get('head_dim')}, MLP "
            f"{text.get('intermediate_size')}, canvas {config.get('canvas_length')}, character-level vocabulary "
            f"of {text.get('vocab_size')} tokens), {params:,} parameters, fp32 safetensors."
        )
    causal = bool(config.get("causal"))
    return f"""A {"causal (autoregressive)" if causal else "masked-diffusion"} model in the native LLaDA layout
({recipe.get("n_layers")} layers, d_model {recipe.get("d_model")}, {recipe.get("n_heads")} heads, SwiGLU
{recipe.get("mlp_hidden")}, RoPE, character-level vocabulary of {config.get("vocab_size")} tokens incl.
`<|mdm_mask|>`, `<|endoftext|>` (EOS), `<|eot_id|>`, `<|pad|>`), {params:,} parameters, fp32 safetensors."""


def card_body(
    config: dict[str, Any], model_id: str, rows: list[dict[str, Any]], params: int, sha: str, reproduce: list[str]
) -> str:
    """The card's text through the held-out scores: architecture, training data, training, scores table."""
    training = config.get("unmask_training", {})
    recipe = training.get("recipe", {})
    kind = _kind(config)
    decoding, objective = DECODING[kind], OBJECTIVE[kind]
    loss_ema = training.get("final_loss_ema")
    sizes = ", ".join(
        f"{t}@{g} {n}" for (t, g), n in dict(((r["task"], r["gen_length"]), r["n"]) for r in rows).items()
    )
    return f"""# {model_id}

{_architecture(config, recipe, params)}
Trained by unmask itself on its generated task suite; a test and demo model, not a language model.

License: Apache-2.0 (the project's). Weights sha256 (model.safetensors): `{sha}`.

## Training data

The generators in `evals/tasks/` (seed {recipe.get("seed")}), train split only,
{describe_mixture(recipe.get("mixture", "default"))}.
Difficulty, deliberately easy for the two-core budget:

{DIFFICULTY}

## Training

- objective: {objective}
- recipe (`models/training.py` RECIPES["{model_id}"]): `{json.dumps(recipe)}`
- steps: {training.get("steps")}, wall time: {training.get("wall_seconds")} s on a two-core CPU
  (threads and run history in the notes below, where they matter), final training loss (EMA): {loss_ema}
- reproduce: {reproduce_training(model_id, recipe, training)} (add `--stop-after N` / `--resume` to
  split the run across sessions)

## Held-out test scores

Test items per task: {sizes or "pending"}; {decoding}. Reproduce:

{chr(10).join(f"    {c}" for c in reproduce)}

{scores_table(rows)}
"""


def card_sections(
    rows: list[dict[str, Any]], peer_rows: list[dict[str, Any]] | None, notes: str, causal: bool, block: bool = False
) -> str:
    """The card's closing sections: the ratio columns' note, modes, sort bands, the twin and the notes."""
    body = ""
    if block:
        body += """
Columns right of the first cut the denoising steps per canvas (steps = gen_length / ratio, spread over the
canvases; the first column allows one step per canvas position). Block diffusion reads no LLaDA decoding mode.
"""
    elif not causal:
        body += """
Columns right of the first commit 2, 4 and 8 tokens per step (steps = gen_length / ratio).
"""
    modes = "" if block else modes_table(rows)
    if modes:
        body += (
            "\n### Per generation length and decoding mode\n\nAccuracy on the first metric, and model calls "
            "per batch of "
            "50 (fwd); every mode at steps = gen_length. Modes (`evals/model_report.py` MODE_SETTINGS): "
            + "; ".join(f"`{m}` {json.dumps(v) if v else 'as above'}" for m, v in MODE_SETTINGS.items())
            + ".\n\n"
            + modes
            + "\n"
        )
    bands = bands_table(rows)
    if bands:
        body += "\n### Sort by answer length\n\n" + bands + "\n"
    if peer_rows:
        body += "\n## The twin, for comparison\n\n" + scores_table(peer_rows) + "\n"
    if notes:
        body += "\n## Notes\n\n" + notes.strip() + "\n"
    return body


if __name__ == "__main__":
    main()
