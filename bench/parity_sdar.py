"""SDAR parity: unmask's native SDAR (models/sdar.py + sampler/masked_blocks.py) against SDAR's published code.

Two halves, each in its own environment:

  reference  (the scratch venv with the transformers SDAR pins, the reference files and a flash-attn CPU shim):
      /tmp/ref-sdar/venv/bin/python bench/parity_sdar.py reference --ref /tmp/ref-sdar
    builds a random small SDAR with the reference's own `SDARForCausalLM`, saves it with `save_pretrained`
    (safetensors, the published layout) and writes the reference's logits and `block_diffusion_generate`
    outputs to tests/golden/sdar/.
  check      (the project's venv):
      .venv/bin/python bench/parity_sdar.py check
    loads that folder with unmask's native code only and prints the parity table: max |logits difference| and
    token agreement per case (tests/unit/test_sdar.py asserts the same).

`--ref` must hold sdar_ref/{modeling_sdar,configuration_sdar,fused_linear_diffusion_cross_entropy,generate}.py
as published (JetAstra/SDAR, commit in SOURCE below; sha256 checked) and shim/flash_attn (flash_attn_func and
the Triton rms_norm_fn in plain torch: the two CUDA-only kernels the modeling file calls).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "sdar"
SOURCE: dict[str, Any] = {
    "repository": "https://github.com/JetAstra/SDAR",
    "commit": "c2041a8333333d685f6e15122c84f60f51f85ebd",
    "files": {  # path in that repository -> sha256; modeling/configuration are byte-identical (but for the last
        # newline) to hxhcreate/DARE@9bd22ba models/SDAR-{1dot7B,4B,8B}-Chat/, which vendors JetLM's Hub folders
        "training/model/SDAR-4B-Chat/modeling_sdar.py": (
            "ae6c856724088f72e9f52565df6a25637243ecc09acf18dcf28c8a7b0dae5bc5"
        ),
        "training/model/SDAR-4B-Chat/configuration_sdar.py": (
            "eb2830b7c5841c05ad4450b8b15a968703afc890e432e12f2b0f1eb1625720c6"
        ),
        "training/model/SDAR-4B-Chat/fused_linear_diffusion_cross_entropy.py": (
            "0779ba8cceb9903c7e8684cc55ad026b92e7be7e0aa7d2667288a3292a706585"
        ),
        "generate.py": "2855a9c3e28f77a980ea44186494b546159d8057416457775cfc03430d67cc5e",
    },
    "transformers": "4.52.4",
}
CONFIG = dict(
    vocab_size=260,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    block_size=4,
    mask_token_id=259,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
    fuse_cross_entropy=True,
    torch_dtype="float32",
)
MASK, L = 259, 4
PROMPTS = [[2, 17, 40, 91, 5], [2, 33, 8, 120, 77, 64, 9, 200], [2, 250, 14, 3, 99, 181, 42, 7, 66, 12, 150], [2, 88]]
# (name, prompt index, block_diffusion_generate kwargs); the seed is torch.manual_seed before the call
CASES: list[tuple[str, int, dict[str, Any]]] = [
    ("dynamic-0.9 t1", 0, dict(remasking_strategy="low_confidence_dynamic", confidence_threshold=0.9)),
    ("dynamic-0.02 t1", 1, dict(remasking_strategy="low_confidence_dynamic", confidence_threshold=0.02)),
    (
        "dynamic-0.05 t0.7 k50 p0.9",
        2,
        dict(
            remasking_strategy="low_confidence_dynamic", confidence_threshold=0.05, temperature=0.7, top_k=50, top_p=0.9
        ),
    ),
    ("static t1", 2, dict(remasking_strategy="low_confidence_static")),
    ("static steps-2 t1", 1, dict(remasking_strategy="low_confidence_static", denoising_steps=2)),
    ("static top_k-1", 0, dict(remasking_strategy="low_confidence_static", top_k=1)),
    ("sequential t1", 3, dict(remasking_strategy="sequential")),
    ("sequential steps-2 t0.5", 1, dict(remasking_strategy="sequential", denoising_steps=2, temperature=0.5)),
]
GEN, SEED = 13, 7
BATCH_SEEDS = [3, 1, 4, 5]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def block_mask(n_blocks: int) -> torch.Tensor:
    return torch.tril(torch.ones(n_blocks, n_blocks)).repeat_interleave(L, 0).repeat_interleave(L, 1)


def reference(ref: Path) -> None:
    """Build, save and record the reference's outputs (run in the scratch venv)."""
    sys.path[:0] = [str(ref / "shim"), str(ref)]
    for path, digest in SOURCE["files"].items():
        local = ref / "sdar_ref" / Path(path).name
        assert sha256(local) == digest, f"{local}: sha256 differs from the published file"
    import transformers
    from sdar_ref.configuration_sdar import SDARConfig
    from sdar_ref.generate import block_diffusion_generate
    from sdar_ref.modeling_sdar import SDARForCausalLM
    from transformers.cache_utils import DynamicCache

    assert transformers.__version__ == SOURCE["transformers"], transformers.__version__
    torch.manual_seed(0)
    model = SDARForCausalLM(SDARConfig(**CONFIG)).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():  # larger than the init's 0.02 so decoding has clear preferences
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if p.dim() == 1 else 0.25 * torch.randn_like(p))
    folder = GOLDEN / "checkpoint"
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").unlink(missing_ok=True)
    logits: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        ids = torch.tensor([PROMPTS[2] + [MASK] * 5])  # 16 positions, 4 blocks, block-causal
        logits["full"] = model(ids, attention_mask=block_mask(4)[None], position_ids=torch.arange(16)[None]).logits
        cache = DynamicCache()  # the decode path: prefill 3 blocks, then score the 4th reading the cache
        model(
            ids[:, :12],
            attention_mask=block_mask(3)[None],
            position_ids=torch.arange(12)[None],
            past_key_values=cache,
            use_cache=True,
            store_kv=True,
        )
        logits["cached_block"] = model(
            ids[:, 12:],
            attention_mask=torch.ones(1, 4, 16),
            position_ids=torch.arange(12, 16)[None],
            past_key_values=cache,
            use_cache=True,
            store_kv=False,
        ).logits
        # a left-padded batch of two: row 0 has 3 pads; every query sees its block-causal keys (pads see themselves)
        pad = 3
        batch = torch.tensor([[0] * pad + PROMPTS[0] + [MASK] * 4, PROMPTS[2] + [MASK] * 1])
        pos = torch.stack([(torch.arange(12) - pad).clamp(min=0), torch.arange(12)])
        real = torch.tensor([[False] * pad + [True] * 9, [True] * 12])
        blocks = pos // L
        allowed = (blocks[:, None, :] <= blocks[:, :, None]) & real[:, None, :] | torch.eye(12, dtype=torch.bool)
        logits["left_padded"] = model(batch, attention_mask=allowed[:, None], position_ids=pos).logits
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in logits.items()}, str(GOLDEN / "logits.safetensors"))
    runs = []
    for name, index, kwargs in CASES:
        torch.manual_seed(SEED)
        args = dict(gen_length=GEN, block_length=L, denoising_steps=L, temperature=1.0) | kwargs
        x = block_diffusion_generate(model, {"input_ids": torch.tensor([PROMPTS[index]])}, MASK, **args)
        runs.append({"name": name, "prompt": index, "seed": SEED, "kwargs": args, "tokens": x[0].tolist()})
    stop_from = runs[0]["tokens"][len(PROMPTS[0]) + 6]  # a token the first case emits: a stop id mid-way
    torch.manual_seed(SEED)
    args = dict(runs[0]["kwargs"], stopping_criteria_idx=[stop_from])
    x = block_diffusion_generate(model, {"input_ids": torch.tensor([PROMPTS[0]])}, MASK, **args)
    runs.append({"name": "dynamic-0.9 t1 stop", "prompt": 0, "seed": SEED, "kwargs": args, "tokens": x[0].tolist()})
    together: dict[str, Any] = dict(
        gen_length=GEN,
        block_length=L,
        denoising_steps=L,
        temperature=1.0,
        remasking_strategy="low_confidence_dynamic",
        confidence_threshold=0.3,
    )
    for index, seed in enumerate(BATCH_SEEDS):  # each prompt alone: the reference decodes one row at a time
        torch.manual_seed(seed)
        x = block_diffusion_generate(model, {"input_ids": torch.tensor([PROMPTS[index]])}, MASK, **together)
        runs.append(
            {
                "name": f"batch row {index}",
                "prompt": index,
                "seed": seed,
                "kwargs": together,
                "tokens": x[0].tolist(),
                "batch": True,
            }
        )
    record = {
        "source": SOURCE,
        "config": CONFIG,
        "prompts": PROMPTS,
        "runs": runs,
        "weights_sha256": sha256(folder / "model.safetensors"),
        "torch": torch.__version__,
    }
    (GOLDEN / "reference.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {GOLDEN}: {len(runs)} decoding runs, {len(logits)} logits cases")


def native_logits(model: Any) -> dict[str, torch.Tensor]:
    """unmask's native forward on the inputs `reference` scored, with the same block-causal masks."""
    from models.sdar import SDARCache

    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        ids = torch.tensor([PROMPTS[2] + [MASK] * 5])
        out["full"] = model(ids).logits
        cache = SDARCache()
        model(ids[:, :12], cache=cache, store=True)
        out["cached_block"] = model(ids[:, 12:], torch.arange(12, 16)[None], cache=cache).logits
        pad = 3
        batch = torch.tensor([[0] * pad + PROMPTS[0] + [MASK] * 4, PROMPTS[2] + [MASK] * 1])
        pos = torch.stack([(torch.arange(12) - pad).clamp(min=0), torch.arange(12)])
        real = torch.tensor([[False] * pad + [True] * 9, [True] * 12])
        out["left_padded"] = model(batch, pos, key_mask=real).logits
    return out


def block_config(kwargs: dict[str, Any], seed: int, stops: tuple[int, ...] = ()) -> Any:
    from sampler.block_diffusion import BlockDiffusionConfig

    return BlockDiffusionConfig(
        max_new_tokens=kwargs["gen_length"],
        max_denoising_steps=kwargs["denoising_steps"],
        canvas="masked",
        remasking=kwargs["remasking_strategy"],
        commit_threshold=kwargs.get("confidence_threshold", 0.9),
        temperature=kwargs["temperature"],
        top_k=kwargs.get("top_k", 0),
        top_p=kwargs.get("top_p", 1.0),
        mask_id=MASK,
        eos_ids=stops,
        pad_id=None,
        seed=seed,
    )


def check() -> list[dict[str, Any]]:
    """The parity rows: logits cases (max |difference|) and decoding runs (tokens equal), native vs reference."""
    from safetensors.torch import load_file

    from models.adapters.sdar import SDARAdapter
    from sampler.decode import decode_prompts

    record = json.loads((GOLDEN / "reference.json").read_text())
    adapter = SDARAdapter.from_folder(GOLDEN / "checkpoint")
    rows = []
    golden = load_file(str(GOLDEN / "logits.safetensors"))
    ours = native_logits(adapter.model)
    real = torch.tensor([[False] * 3 + [True] * 9, [True] * 12])
    for name, want in golden.items():
        got = ours[name]
        diff = (got - want).abs()[real] if name == "left_padded" else (got - want).abs()
        rows.append({"case": f"logits {name}", "max_abs_diff": float(diff.max()), "agree": None})
    for run in [r for r in record["runs"] if not r.get("batch")]:
        kwargs, prompt = run["kwargs"], record["prompts"][run["prompt"]]
        stops = tuple(kwargs.get("stopping_criteria_idx") or ())
        out = decode_prompts(adapter, [prompt], block_config(kwargs, run["seed"], stops))
        want = run["tokens"][len(prompt) : len(prompt) + kwargs["gen_length"]]
        rows.append({"case": f"decode {run['name']}", "max_abs_diff": None, "agree": out.generated[0].tolist() == want})
    rows.append(batch_row(adapter, record))
    return rows


def batch_row(adapter: Any, record: dict[str, Any]) -> dict[str, Any]:
    """A left-padded batch, each row its own seed, against the reference run on each row alone (it takes one row)."""
    from sampler.decode import decode_prompts

    same = [r for r in record["runs"] if r.get("batch")]
    kwargs, prompts = same[0]["kwargs"], [record["prompts"][r["prompt"]] for r in same]
    out = decode_prompts(adapter, prompts, block_config(kwargs, 0), row_seeds=[r["seed"] for r in same])
    want = [r["tokens"][len(p) : len(p) + kwargs["gen_length"]] for r, p in zip(same, prompts)]
    agree = out.generated.tolist() == want
    return {"case": f"decode left-padded batch of {len(prompts)}", "max_abs_diff": None, "agree": agree}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["reference", "check"])
    parser.add_argument("--ref", type=Path, default=Path("/tmp/ref-sdar"))
    args = parser.parse_args()
    if args.mode == "reference":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        reference(args.ref)
        return
    for row in check():
        diff = "" if row["max_abs_diff"] is None else f"{row['max_abs_diff']:.3g}"
        agree = "" if row["agree"] is None else ("token-identical" if row["agree"] else "DIFFERS")
        print(f"{row['case']:<40} {diff:>10} {agree}")


if __name__ == "__main__":
    main()
