"""Dream parity (issue 52): unmask's native Dream against Dream's published code, on a small random checkpoint.

Three steps, each its own command (the reference runs in a scratch virtual environment with the transformers
Dream pins; unmask's code never imports it, and this repository holds none of its code):

    # 1. the small random checkpoint, in Dream's published layout (unmask's venv)
    PYTHONPATH=. .venv/bin/python bench/parity_dream.py checkpoint --out models/weights/tiny-dream
    # 2. the reference's logits and decodes on it: Dream's modeling_dream.py, configuration_dream.py and
    #    generation_utils.py as published on the Hub, in a folder REF (a package: an empty __init__.py beside them)
    /tmp/ref-dream/venv/bin/python bench/parity_dream.py reference --ref /tmp/ref-dream/dream_ref \\
        --checkpoint models/weights/tiny-dream --out tests/golden/dream
    # 3. unmask's native model and sampler against those golden outputs (what tests/unit/test_dream.py checks)
    PYTHONPATH=. .venv/bin/python bench/parity_dream.py native --checkpoint models/weights/tiny-dream \\
        --golden tests/golden/dream

Step 2 writes `logits.safetensors` (the raw float32 logits of two inputs: a batch without padding, and a
left-padded batch with Dream's padding mask) and `reference.json` (the reference's provenance, the prompts and
every decode's token ids; `origin`'s decodes draw at random, so each records the seed given to torch.manual_seed
and its temperature). Step 3 prints the max |logits difference| and the decodes that agree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

REFERENCE = {  # where the reference files came from (the Hub's files, vendored unchanged in a snapshot commit)
    "repository": "https://github.com/hxhcreate/DARE",
    "commit": "f4999da5cf21e9e4cf69cf7d5fdbb2b02b3a940d",
    "path": "models/Dream-v0-Instruct-7B/",
    "hub": "https://huggingface.co/Dream-org/Dream-v0-Instruct-7B",
}
REF_FILES = ("modeling_dream.py", "configuration_dream.py", "generation_utils.py")
SHAPE = {  # small, and shaped like Dream: grouped-query attention, untied head, theta 1e6
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 160,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 640,
    "mask_token_id": 3,  # the bundled char tokenizer's ids: <|mdm_mask|>, <|pad|>, <|endoftext|>
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 1,
}
SEED, STD = 52, 0.35  # wide weights: peaked distributions, so decoding orders are not decided by rounding
ALGORITHMS = ("maskgit_plus", "topk_margin", "entropy")  # Dream's deterministic ones (models/adapters/dream.py)
# `origin` draws which masks to reveal (even at temperature 0) and, above 0, their tokens: each of its decodes runs
# after torch.manual_seed(ORIGIN_SEED) in the reference and with SamplerConfig.seed=ORIGIN_SEED in unmask.
ORIGIN_SEED, ORIGIN_TEMPERATURES = 52, (0.0, 0.8)
DECODES = [(16, 16), (24, 8)]  # (gen_length, steps): one token a step, and three a step on average
TOP_K = [None, 50]  # no cut, and what Dream's generate keeps when not told (transformers 4.46's config default)
PROMPTS = [[40, 41, 42, 43, 44, 45, 46], [50, 60, 70], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(batch, longest)` ids and attention mask, each row padded on the left."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], mask[row, width - len(p) :] = torch.tensor(p), 1
    return ids, mask


def logits_inputs() -> dict[str, torch.Tensor]:
    """Two batches of 16 positions with masks among them; the second left-padded (rows of 16, 11 and 5 tokens)."""
    g = torch.Generator().manual_seed(SEED)
    plain = torch.randint(5, SHAPE["vocab_size"], (2, 16), generator=g)
    plain[:, 9:] = SHAPE["mask_token_id"]
    padded = torch.randint(5, SHAPE["vocab_size"], (3, 16), generator=g)
    padded[:, 12:] = SHAPE["mask_token_id"]
    mask = torch.ones_like(padded)
    mask[1, :5], mask[2, :11] = 0, 0
    padded = padded.masked_fill(mask == 0, SHAPE["pad_token_id"])
    return {"plain_ids": plain, "padded_ids": padded, "padded_mask": mask}


def decode_cases() -> list[dict[str, Any]]:
    """Every decode the parity covers: each prompt alone and all three as one left-padded batch, per algorithm,
    length and top-k; then `origin`'s, seeded, at each of its temperatures."""
    cases = []
    for alg in ALGORITHMS:
        for top_k in TOP_K:
            for gen_length, steps in DECODES:
                for prompts in [[p] for p in PROMPTS] + [PROMPTS]:
                    case = {"alg": alg, "top_k": top_k, "gen_length": gen_length, "steps": steps, "prompts": prompts}
                    cases.append(case)
    for temperature in ORIGIN_TEMPERATURES:
        for top_k in TOP_K:
            for gen_length, steps in DECODES:
                for prompts in [[p] for p in PROMPTS] + [PROMPTS]:
                    case = {"alg": "origin", "top_k": top_k, "gen_length": gen_length, "steps": steps}
                    cases.append(case | {"temperature": temperature, "seed": ORIGIN_SEED, "prompts": prompts})
    return cases


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- step 1: the checkpoint (unmask's venv) -------------------------------------------------------------------


def write_checkpoint(out: Path) -> None:
    from models.adapters.dream import save_dream
    from models.dream import DreamConfig, DreamModel, init_dream_weights

    network = init_dream_weights(DreamModel(DreamConfig(**SHAPE)), seed=SEED, std=STD)
    save_dream(network, out)
    generation = {"alg": "entropy", "alg_temp": None, "eps": 0.001, "steps": 16, "temperature": 0.0}
    ids = {k: SHAPE[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id")}
    (out / "generation_config.json").write_text(json.dumps(generation | ids, indent=2) + "\n")
    weights = Path(__file__).resolve().parent.parent / "models" / "weights" / "tiny-llada"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(weights / name, out / name)
    print(f"wrote {out}: {sum(p.numel() for p in network.parameters())} parameters")


# -- step 2: the reference (the scratch venv) -----------------------------------------------------------------


def reference_outputs(ref: Path, checkpoint: Path, out: Path) -> None:
    import transformers
    from safetensors.torch import save_file

    sys.path.insert(0, str(ref.parent))
    modeling = __import__(f"{ref.name}.modeling_dream", fromlist=["DreamModel"])
    model = modeling.DreamModel.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    inputs = logits_inputs()
    with torch.no_grad():
        plain = model(inputs["plain_ids"]).logits
        padded = model(inputs["padded_ids"], *dream_padding(inputs["padded_mask"])).logits
    out.mkdir(parents=True, exist_ok=True)
    save_file({"plain": plain.contiguous(), "padded": padded.contiguous()} | inputs, str(out / "logits.safetensors"))
    decodes = []
    for case in decode_cases():
        ids, mask = left_padded(case["prompts"], SHAPE["pad_token_id"])
        if "seed" in case:  # the reference draws from torch's global generator
            torch.manual_seed(case["seed"])
        result = model.diffusion_generate(
            ids,
            attention_mask=mask if len(case["prompts"]) > 1 else None,
            max_new_tokens=case["gen_length"],
            steps=case["steps"],
            temperature=case.get("temperature", 0.0),
            top_k=case["top_k"],
            alg=case["alg"],
            alg_temp=0.0,
            mask_token_id=SHAPE["mask_token_id"],
            return_dict_in_generate=True,
        )
        decodes.append(case | {"sequences": result.sequences.tolist()})
    record = {
        "reference": REFERENCE | {"sha256": {name: sha256(ref / name) for name in REF_FILES}},
        "environment": {"transformers": transformers.__version__, "torch": torch.__version__},
        "checkpoint_sha256": {
            p.name: sha256(p) for p in sorted(checkpoint.iterdir()) if p.is_file() and p.suffix != ".md"
        },
        "decoding": "diffusion_generate(temperature=0.0, alg_temp=0.0, top_k as given, top_p 1.0 (off), eps 1e-3); "
        "a case with a seed (origin) ran after torch.manual_seed(seed), at its temperature",
        "decodes": decodes,
    }
    (out / "reference.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}: logits {tuple(plain.shape)} and {tuple(padded.shape)}, {len(decodes)} decodes")


def dream_padding(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What Dream's generate hands its model for a padded batch: a (B, 1, T, T) mask allowing pairs of real
    tokens, and positions counted over the real tokens (a padding position sits at 1)."""
    real = mask.bool()
    positions = (mask.long().cumsum(-1) - 1).masked_fill(~real, 1)
    return real[:, None, :, None] & real[:, None, None, :], positions


# -- step 3: unmask's native model and sampler (unmask's venv) -------------------------------------------------


def native_comparison(checkpoint: Path, golden: Path) -> dict[str, Any]:
    """Max |logits difference| per input and, per decode, whether unmask's sampler gave the reference's tokens."""
    from safetensors.torch import load_file

    from models.adapters.dream import DreamAdapter, dream_settings
    from sampler import SamplerConfig, generate

    handle = DreamAdapter.from_folder(checkpoint)
    stored = load_file(str(golden / "logits.safetensors"))
    with torch.no_grad():
        plain = handle.model.network(stored["plain_ids"]).logits
        padded = handle.model.network(stored["padded_ids"], stored["padded_mask"]).logits
    diffs = {
        "plain": float((plain - stored["plain"]).abs().max()),
        "padded": float((padded - stored["padded"]).abs().max()),
    }
    agree, cases, groups = 0, json.loads((golden / "reference.json").read_text())["decodes"], {}
    for case in cases:
        ids, mask = left_padded(case["prompts"], handle.pad_id or 0)
        settings = dream_settings(
            case["alg"], case["gen_length"], case["steps"], case["top_k"], case.get("temperature", 0)
        )
        config = SamplerConfig(**settings, **handle.sampler_ids(), seed=case.get("seed", 0))
        out = generate(handle.model, ids, config, attention_mask=mask if len(case["prompts"]) > 1 else None)
        same = out.sequences.tolist() == case["sequences"]
        agree += same
        group = groups.setdefault(f"{case['alg']} temperature {case.get('temperature', 0.0)}", [0, 0])
        group[0], group[1] = group[0] + same, group[1] + 1
    by_case = {name: f"{n} of {total}" for name, (n, total) in groups.items()}
    return {"max_abs_logits_diff": diffs, "decodes_identical": agree, "decodes": len(cases), "by_case": by_case}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("checkpoint").add_argument("--out", type=Path, required=True)
    ref = sub.add_parser("reference")
    ref.add_argument("--ref", type=Path, required=True)
    ref.add_argument("--checkpoint", type=Path, required=True)
    ref.add_argument("--out", type=Path, required=True)
    native = sub.add_parser("native")
    native.add_argument("--checkpoint", type=Path, required=True)
    native.add_argument("--golden", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one reduction order on every machine this runs on
    if args.step == "checkpoint":
        write_checkpoint(args.out)
    elif args.step == "reference":
        reference_outputs(args.ref.resolve(), args.checkpoint, args.out)
    else:
        print(json.dumps(native_comparison(args.checkpoint, args.golden), indent=2))


if __name__ == "__main__":
    main()
