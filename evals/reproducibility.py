"""Reproducibility probe: same model, config, seed and prompts, twice in this process and once in a
fresh one; and batch invariance (a prompt's output alone equals its output inside a batch).

Run as `python -m evals.reproducibility --model M --config JSON --prompts FILE` it is the fresh
process: it decodes and prints the output hash and its fingerprint as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from evals.fingerprint import environment_fingerprint, output_hash
from evals.measure import describe_error
from evals.points import build_config
from evals.records import ReproducibilityResult
from models import load
from sampler.decode import batch_row_seeds, decode_prompts
from sampler.effective import config_from_dict, effective_config

# Fingerprint keys that may differ between two processes without saying anything about the output.
VOLATILE_KEYS = {"executable"}


def decode_alone(
    loaded: Any, config: Any, prompts: list[list[int]], device: str = "cpu"
) -> tuple[list[list[int] | None], list[str]]:
    """(outputs, errors): each prompt decoded on its own; a failed prompt gives None and an error message.
    The prompts decode on the model's device (`device` is where it was loaded)."""
    outputs: list[list[int] | None] = []
    errors: list[str] = []
    for i, prompt in enumerate(prompts):
        try:
            out = decode_prompts(loaded, [prompt], config)
            outputs.append(out.sequences[0, out.prompt_length :].tolist())
        except Exception as e:
            outputs.append(None)
            errors.append(f"prompt {i}: {describe_error(e)}")
    return outputs, errors


def decode_batched(loaded: Any, config: Any, prompts: list[list[int]], device: str = "cpu") -> list[list[int]] | str:
    """All prompts in one left-padded batch, seeded row by row as `unmask serve` batches them (`batch_row_seeds`:
    the batch whose answers serving promises equal to each prompt's alone); the error message if it failed."""
    try:
        seeds = batch_row_seeds(loaded, config, [config.seed] * len(prompts))
        out = decode_prompts(loaded, prompts, config, row_seeds=seeds)
    except Exception as e:
        return describe_error(e)
    return out.sequences[:, out.prompt_length :].tolist()


def fresh_process_run(
    model_path: str | Path, config: Any, prompts: list[list[int]], device: str, dtype: str, timeout: float = 300
) -> dict[str, Any]:
    """Decode in a new Python process with the same thread count; returns its hash and fingerprint."""
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = Path(tmp) / "prompts.json"
        prompt_file.write_text(json.dumps(prompts))
        cmd = [
            sys.executable,
            "-m",
            "evals.reproducibility",
            "--model",
            str(model_path),
            "--config",
            config.to_json(),
            "--prompts",
            str(prompt_file),
            "--device",
            device,
            "--dtype",
            dtype,
            "--threads",
            str(torch.get_num_threads()),
        ]
        repo_root = Path(__file__).resolve().parent.parent
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=repo_root)
    if proc.returncode:
        raise RuntimeError(f"fresh process exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def first_difference(a: list[int], b: list[int]) -> tuple[int, int]:
    """(positions that differ, first differing position)."""
    diffs = [i for i, (x, y) in enumerate(zip(a, b)) if x != y] + list(range(min(len(a), len(b)), max(len(a), len(b))))
    return len(diffs), (diffs[0] if diffs else -1)


def probe(
    loaded: Any,
    config: Any,
    prompts: list[list[int]],
    *,
    candidate: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    fresh_process: bool = True,
) -> ReproducibilityResult:
    """The reproducibility verdict for a model handle (`models.load`) on token-id prompts, under an
    effective config (a SamplerConfig, or a block-diffusion model's BlockDiffusionConfig).

    fresh_process=False skips the subprocess (for models that exist only in this process); the
    result then cannot be `reproducible`, and says why.
    """
    if not prompts:
        raise ValueError("reproducibility probe: no prompts")
    differences: list[str] = []
    first, errors = decode_alone(loaded, config, prompts, device)
    second, errors_again = decode_alone(loaded, config, prompts, device)
    errors += errors_again
    for message in dict.fromkeys(errors):
        differences.append(f"a run failed: {message}")
    hashes = [output_hash(first), output_hash(second)]
    same = hashes[0] == hashes[1] and not errors
    if hashes[0] != hashes[1]:
        bad = [i for i, (a, b) in enumerate(zip(first, second)) if a != b]
        differences.append(
            f"second run in the same process differs on prompts {bad} (hash {hashes[0][:12]} vs {hashes[1][:12]})"
        )

    fingerprint = environment_fingerprint(
        device, dtype, weights_sha256=loaded.weights_sha256, config_hash=config.hash()
    )
    fresh = False
    if fresh_process:
        try:
            other = fresh_process_run(loaded.path, config, prompts, device, dtype)
            hashes.append(other["output_hash"])
            fresh = other["output_hash"] == hashes[0] and not errors
            if other["output_hash"] != hashes[0]:
                changed = sorted(
                    k
                    for k in set(fingerprint) | set(other["fingerprint"])
                    if k not in VOLATILE_KEYS and fingerprint.get(k) != other["fingerprint"].get(k)
                )
                differences.append(
                    f"fresh process gave hash {other['output_hash'][:12]}, this process {hashes[0][:12]}"
                    + (f"; fingerprint differs in {', '.join(changed)}" if changed else "; same fingerprint")
                )
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, KeyError) as e:
            differences.append(f"fresh process could not run: {e}")
    else:
        differences.append("fresh-process run skipped")

    batched = decode_batched(loaded, config, prompts, device) if len(prompts) > 1 else [first[0]]
    if isinstance(batched, str):
        invariant = False
        differences.append(f"batch of {len(prompts)} failed: {batched}")
    else:
        invariant = not errors
        for i, (alone, inside) in enumerate(zip(first, batched)):
            if alone is None or inside is None:  # inside is None only where alone is (one prompt: the same)
                continue
            n, at = first_difference(alone, inside)
            if n:
                invariant = False
                differences.append(
                    f"prompt {i}: output in a batch of {len(prompts)} differs from its output alone "
                    f"at {n} of {len(alone)} positions (first at {at})"
                )
    return ReproducibilityResult(
        candidate=candidate or loaded.entry_id,
        reproducible=same and fresh and invariant,
        same_process=same,
        fresh_process=fresh,
        batch_invariant=invariant,
        differences=differences,
        output_hashes=hashes,
        config_hash=config.hash(),
        fingerprint=fingerprint,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Decode prompts and print their output hash (the fresh-process half of the probe)."
    )
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--config", required=True, help="the effective config as JSON (SamplerConfig or BlockDiffusionConfig)"
    )
    parser.add_argument("--prompts", required=True, help="JSON file: a list of token-id lists")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load(args.model, device=args.device, dtype=args.dtype)
    config = config_from_dict(json.loads(args.config))
    prompts = json.loads(Path(args.prompts).read_text())
    outputs, _ = decode_alone(loaded, config, prompts, args.device)
    fingerprint = environment_fingerprint(
        args.device, args.dtype, weights_sha256=loaded.weights_sha256, config_hash=config.hash()
    )
    print(json.dumps({"output_hash": output_hash(outputs), "fingerprint": fingerprint}, default=str))


def probe_model(
    ref: str,
    settings: dict[str, Any],
    prompts: list[str],
    *,
    device: str = "cpu",
    dtype: str = "float32",
    fresh_process: bool = True,
) -> ReproducibilityResult:
    """Load `ref`, build its effective config from sweep `settings` and probe it on text prompts."""
    loaded = load(ref, device=device, dtype=dtype)
    config = effective_config(loaded, build_config(settings, loaded.sampler_ids())[0])
    ids = [loaded.encode(p) for p in prompts]
    return probe(
        loaded,
        config,
        ids,
        candidate=ref if not Path(ref).is_dir() else Path(ref).name,
        device=device,
        dtype=dtype,
        fresh_process=fresh_process,
    )


if __name__ == "__main__":
    main()
