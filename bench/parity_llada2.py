"""LLaDA2 parity: unmask's native LLaDA2 (models/llada2.py + sampler/masked_blocks.py) against LLaDA2's published code.

Two halves, each in its own environment:

  reference  (a scratch venv with transformers 4.56.2, torch 2.13.0 and the reference files):
      /tmp/ref-llada2/venv/bin/python bench/parity_llada2.py reference --ref /tmp/ref-llada2
    builds a random small LLaDA2-MoE with the reference's own `LLaDA2MoeModelLM`, saves it with `save_pretrained`
    (safetensors, the published layout) and writes the reference's logits and `generate` outputs to
    tests/golden/llada2/.
  check      (the project's venv):
      .venv/bin/python bench/parity_llada2.py check
    loads that folder with unmask's native code only and prints the parity table: max |logits difference| and
    token agreement per case (tests/unit/test_llada2.py asserts the same).

`--ref` must hold llada2_ref/{modeling_llada2_moe,configuration_llada2_moe}.py (sha256 checked against SOURCE).
The modeling file needs no CUDA-only kernel (its flash-attn import is guarded), so there is no shim.

The reference's `generate` at `temperature=0.0` does not take the argmax: it skips the division by the temperature
and draws `torch.multinomial` from the untempered softmax, i.e. it samples at temperature 1. Its decoding is
therefore reproduced seeded (`torch.manual_seed` before the call) with unmask's `temperature=1.0`; unmask's own
temperature 0 is the argmax its docstring describes, checked batch-invariant in tests/unit/test_llada2.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "llada2"
SOURCE: dict[str, Any] = {
    # dllm (ZHZisZZ/dllm) vendors the Hub folder inclusionAI/LLaDA2.0-mini's two Python files; this repository
    # carried that dllm tree. The Hub copy itself was unreachable from here; a published review of it lists
    # configuration_llada2_moe.py at 3157 bytes / 88 lines and modeling_llada2_moe.py at 60421 bytes / 1439 lines,
    # so this modeling file (59334 bytes / 1431 lines) is a reformatted copy, not byte-identical.
    "repository": "https://github.com/yks23/Information-Gain-Sampler",
    "commit": "e03368da1c19784240006c928e272c18606e149d",
    "files": {  # path in that repository -> sha256
        "dllm/dllm/pipelines/llada2/models/modeling_llada2_moe.py": (
            "7ddce43e981f7db02a7228e27f18dc30df755fee6a52534ec1944ed870f9524e"
        ),
        "dllm/dllm/pipelines/llada2/models/configuration_llada2_moe.py": (
            "21c8ae7a3694e7dea425ca7858eac0fdd1276ebf60066bafc2e5665855f5e15a"
        ),
    },
    "transformers": "4.56.2",
}
CONFIG = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    num_shared_experts=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    partial_rotary_factor=0.5,
    rope_theta=600000.0,
    rms_norm_eps=1e-6,
    use_qkv_bias=False,
    use_bias=False,
    use_qk_norm=True,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    pad_token_id=0,
    eos_token_id=1,
    torch_dtype="float32",
)
MASK, L = 299, 8
PROMPTS = [[2, 17, 40, 91, 5], [2, 33, 8, 120, 77, 64, 9, 200], [2, 250, 14, 3, 99, 181, 42, 7, 66, 12, 150], [2, 88]]
# (name, prompt index, generate kwargs); the seed is torch.manual_seed before the call; eos_id -1 matches nothing
CASES: list[tuple[str, int, dict[str, Any]]] = [
    ("block 8 steps 8 threshold 0.95", 0, dict()),
    ("block 8 steps 4 threshold 0.5", 1, dict(steps=4, threshold=0.5)),
    ("block 8 threshold 0.3 t0.7 k50 p0.9", 2, dict(threshold=0.3, temperature=0.7, top_k=50, top_p=0.9)),
    ("block 8 steps 2 threshold 1.0", 3, dict(steps=2, threshold=1.0)),
    ("block 32 steps 32 threshold 0.95", 2, dict(block_length=32, steps=32, gen_length=40)),
]
GEN, SEED = 21, 7
BATCH_SEEDS = [3, 1, 4, 5]
BATCH_KWARGS: dict[str, Any] = dict(threshold=0.3)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def block_allowed(positions: torch.Tensor, real: torch.Tensor, block: int) -> torch.Tensor:
    """Boolean `(B, T, T)`: a query sees the real keys of its block and earlier ones (a pad sees itself)."""
    blocks = torch.div(positions, block, rounding_mode="floor")
    allowed = (blocks[:, None, :] <= blocks[:, :, None]) & real[:, None, :]
    return allowed | torch.eye(positions.shape[1], dtype=torch.bool)


def additive(allowed: torch.Tensor) -> torch.Tensor:
    """The reference's mask form: `(B, 1, T, T)` of 0 (attend) and -inf."""
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[:, None]


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two rows, the first left-padded by 3: ids, positions and the real-key mask, all `(2, 16)`."""
    pad = 3
    ids = torch.tensor([[0] * pad + PROMPTS[0] + [MASK] * 8, PROMPTS[2] + [MASK] * 5])
    pos = torch.stack([(torch.arange(16) - pad).clamp(min=0), torch.arange(16)])
    real = torch.tensor([[False] * pad + [True] * 13, [True] * 16])
    return ids, pos, real


def cast_mask_to_query_dtype() -> None:
    """`generate` builds its block mask in bfloat16 (0 / -inf), which float32 SDPA refuses on this torch; cast it
    to the query's dtype (both values are exact in float32). The eager path is no way out: transformers 4.56 reads
    a 4-D mask there as 1/0 and masks every key."""
    import torch.nn.functional as F

    sdpa = F.scaled_dot_product_attention

    def cast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None, **kwargs: Any) -> torch.Tensor:
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(q.dtype)
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    F.scaled_dot_product_attention = cast  # type: ignore[assignment]


def build_reference(ref: Path) -> Any:
    """The reference's own model with random weights (expert biases too), saved to tests/golden/llada2/checkpoint."""
    cast_mask_to_query_dtype()
    sys.path[:0] = [str(ref)]
    for path, digest in SOURCE["files"].items():
        local = ref / "llada2_ref" / Path(path).name
        assert sha256(local) == digest, f"{local}: sha256 differs from the recorded file"
    import transformers
    from llada2_ref.configuration_llada2_moe import LLaDA2MoeConfig
    from llada2_ref.modeling_llada2_moe import LLaDA2MoeModelLM

    assert transformers.__version__ == SOURCE["transformers"], transformers.__version__
    torch.manual_seed(0)
    model = LLaDA2MoeModelLM(LLaDA2MoeConfig(**CONFIG)).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():  # larger than the init's 0.02 so decoding has clear preferences
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if p.dim() == 1 else 0.25 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):  # the routing-only bias: nonzero so it is exercised
                b.copy_(0.3 * torch.randn_like(b))
    folder = GOLDEN / "checkpoint"
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").unlink(missing_ok=True)
    return model


def reference_logits(model: Any) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        ids = torch.tensor([PROMPTS[2] + [MASK] * 13])  # 24 positions, 3 blocks of 8, block-causal
        pos = torch.arange(24)[None]
        full = model(ids, attention_mask=additive(block_allowed(pos, torch.ones(1, 24, dtype=torch.bool), L)))
        out["full"] = full.logits
        out["cached_block"] = full.logits[:, 16:].clone()  # the native side scores it reading a KV cache
        ids, pos, real = padded_batch()
        out["left_padded"] = model(ids, attention_mask=additive(block_allowed(pos, real, L)), position_ids=pos).logits
    return out


def reference_runs(model: Any) -> list[dict[str, Any]]:
    runs = []
    base = dict(gen_length=GEN, block_length=L, steps=L, temperature=0.0, threshold=0.95, top_k=None, top_p=None)
    base |= dict(eos_id=-1, mask_id=MASK)
    for name, index, kwargs in CASES:
        args = base | kwargs
        torch.manual_seed(SEED)
        x = model.generate(torch.tensor([PROMPTS[index]]), **args)
        runs.append({"name": name, "prompt": index, "seed": SEED, "kwargs": args, "tokens": x[0].tolist()})
    stop = runs[0]["tokens"][9]  # a token the first case emits in its second block: a stop id mid-way
    args = runs[0]["kwargs"] | {"eos_id": stop}
    torch.manual_seed(SEED)
    x = model.generate(torch.tensor([PROMPTS[0]]), **args)
    runs.append({"name": "block 8 eos mid-way", "prompt": 0, "seed": SEED, "kwargs": args, "tokens": x[0].tolist()})
    for index, seed in enumerate(BATCH_SEEDS):  # each prompt alone: the reference decodes one row
        args = base | BATCH_KWARGS
        torch.manual_seed(seed)
        x = model.generate(torch.tensor([PROMPTS[index]]), **args)
        row = {"name": f"batch row {index}", "prompt": index, "seed": seed, "kwargs": args, "batch": True}
        runs.append(row | {"tokens": x[0].tolist()})
    return runs


def reference(ref: Path) -> None:
    """Build, save and record the reference's outputs (run in the scratch venv)."""
    from safetensors.torch import save_file

    model = build_reference(ref)
    logits = reference_logits(model)
    save_file({k: v.contiguous() for k, v in logits.items()}, str(GOLDEN / "logits.safetensors"))
    runs = reference_runs(model)
    record = {
        "source": SOURCE,
        "config": CONFIG,
        "prompts": PROMPTS,
        "runs": runs,
        "weights_sha256": sha256(GOLDEN / "checkpoint" / "model.safetensors"),
        "torch": torch.__version__,
    }
    (GOLDEN / "reference.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {GOLDEN}: {len(runs)} decoding runs, {len(logits)} logits cases")


def native_logits(model: Any) -> dict[str, torch.Tensor]:
    """unmask's native forward on the inputs `reference` scored, with the same block-causal masks."""
    from models.sdar import SDARCache

    out: dict[str, torch.Tensor] = {}
    model.block_size = L
    with torch.no_grad():
        ids = torch.tensor([PROMPTS[2] + [MASK] * 13])
        out["full"] = model(ids).logits
        cache = SDARCache()
        model(ids[:, :16], cache=cache, store=True)
        out["cached_block"] = model(ids[:, 16:], torch.arange(16, 24)[None], cache=cache).logits
        ids, pos, real = padded_batch()
        out["left_padded"] = model(ids, pos, key_mask=real).logits
    return out


def generated(tokens: list[int], kwargs: dict[str, Any]) -> list[int]:
    """What a reference run answers: its tokens up to the first EOS (inclusive), or `gen_length` of them."""
    return tokens[: kwargs["gen_length"]]


def block_config(kwargs: dict[str, Any], seed: int) -> Any:
    """The BlockDiffusionConfig that decodes as the reference's `generate(**kwargs)` (its temperature 0 samples)."""
    from sampler.block_diffusion import BlockDiffusionConfig

    return BlockDiffusionConfig(
        max_new_tokens=kwargs["gen_length"],
        max_denoising_steps=min(kwargs["steps"], kwargs["gen_length"]),
        canvas="masked",
        remasking="low_confidence_dynamic",
        commit_threshold=kwargs["threshold"],
        temperature=kwargs["temperature"] or 1.0,
        top_k=kwargs.get("top_k") or 0,
        top_p=kwargs.get("top_p") or 1.0,
        mask_id=MASK,
        eos_ids=() if kwargs["eos_id"] < 0 else (kwargs["eos_id"],),
        pad_id=0,  # CONFIG's pad_token_id
        seed=seed,
    )


def answer(row: torch.Tensor, eos_id: int) -> list[int]:
    """A native row cut as the reference cuts: through the first EOS."""
    tokens = row.tolist()
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens


def adapter_for(block: int) -> Any:
    from models.adapters.llada2 import LLaDA2Adapter

    return LLaDA2Adapter.from_folder(GOLDEN / "checkpoint", defaults={"block_length": block, "mask_id": MASK})


def decode_row(run: dict[str, Any], prompts: list[list[int]]) -> bool:
    """One reference run decoded natively from the same seed: token-identical?"""
    from sampler.decode import decode_prompts

    kwargs = run["kwargs"]
    out = decode_prompts(
        adapter_for(kwargs["block_length"]), [prompts[run["prompt"]]], block_config(kwargs, run["seed"])
    )
    return answer(out.generated[0], kwargs["eos_id"]) == generated(run["tokens"], kwargs)


def batch_row(record: dict[str, Any]) -> dict[str, Any]:
    """A left-padded batch, each row its own seed, against the reference run on each row alone (it takes one row)."""
    from sampler.decode import decode_prompts

    same = [r for r in record["runs"] if r.get("batch")]
    kwargs, prompts = same[0]["kwargs"], [record["prompts"][r["prompt"]] for r in same]
    out = decode_prompts(adapter_for(L), prompts, block_config(kwargs, 0), row_seeds=[r["seed"] for r in same])
    got = [answer(row, kwargs["eos_id"]) for row in out.generated]
    agree = got == [generated(r["tokens"], kwargs) for r in same]
    return {"case": f"decode left-padded batch of {len(prompts)}", "max_abs_diff": None, "agree": agree}


def check() -> list[dict[str, Any]]:
    """The parity rows: logits cases (max |difference|) and decoding runs (tokens equal), native vs reference."""
    from safetensors.torch import load_file

    record = json.loads((GOLDEN / "reference.json").read_text())
    golden = load_file(str(GOLDEN / "logits.safetensors"))
    ours = native_logits(adapter_for(L).model)
    real = padded_batch()[2]
    rows = []
    for name, want in golden.items():
        diff = (ours[name] - want).abs()
        diff = diff[real] if name == "left_padded" else diff
        rows.append({"case": f"logits {name}", "max_abs_diff": float(diff.max()), "agree": None})
    for run in [r for r in record["runs"] if not r.get("batch")]:
        rows.append(
            {"case": f"decode {run['name']}", "max_abs_diff": None, "agree": decode_row(run, record["prompts"])}
        )
    rows.append(batch_row(record))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["reference", "check"])
    parser.add_argument("--ref", type=Path, default=Path("/tmp/ref-llada2"))
    args = parser.parse_args()
    if args.mode == "reference":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        reference(args.ref)
        return
    for row in check():
        diff = "" if row["max_abs_diff"] is None else f"{row['max_abs_diff']:.3g}"
        agree = "" if row["agree"] is None else ("token-identical" if row["agree"] else "DIFFERS")
        print(f"{row['case']:<44} {diff:>10} {agree}")


if __name__ == "__main__":
    main()
