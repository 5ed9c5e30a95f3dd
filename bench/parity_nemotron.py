"""Nemotron-Labs-Diffusion parity: unmask's native network (models/nemotron_diffusion.py) against Ministral 3.

The published checkpoint's modeling file (remote code, a subclass of transformers' `Ministral3PreTrainedModel`) is not
reachable from where this was written; its backbone is transformers' own `Ministral3` (YaRN RoPE, Llama 4 query
scaling), which is the reference here, with the published layout's names (`encoder.` for `model.`, `diffusion_head`
for `lm_head`). The diffusion pass differs from it only by the attention mask, which transformers takes as a custom
4D mask. The attention formulas were also read against SGLang's native Nemotron-Labs-Diffusion model (SOURCE).

  reference  (the project's venv: transformers is installed there):
      OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/parity_nemotron.py reference
    builds a random small Ministral 3 (float32, YaRN over an original context of 8 positions, so the scaling is
    exercised), writes it in the published layout with the char tokenizer to tests/golden/nemotron/checkpoint, and
    records its logits (causal and bidirectional, cached and left-padded) and its greedy `generate` per prompt.
  check      (native code only):
      OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/parity_nemotron.py check
    prints max |logits difference| per case and token agreement of unmask's three decoding modes with the
    reference's greedy generate (tests/unit/test_nemotron.py asserts the same).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "nemotron"
SOURCE: dict[str, Any] = {
    "reference": "transformers Ministral3ForCausalLM (the backbone the published remote code subclasses)",
    "transformers": "5.25.0",
    "files": {"transformers/models/ministral3/modeling_ministral3.py": None},  # sha256 filled when recorded
    "cross_checked": {
        "repository": "https://github.com/sgl-project/sglang",
        "model_file": {
            "classes": "NemotronLabsDiffusionAttention, NemotronLabsDiffusionLayer, NemotronLabsDiffusionEncoder, "
            "NemotronLabsDiffusionModel",
            "code_index_id": "54628671450",
            "chars": 23665,
            "note": "path and commit not resolved: the repository snapshot (1.2 GB) is over the fetch limit",
        },
        "decoding_file": {
            "path": "python/sglang/srt/dllm/algorithm/linear_spec.py",
            "commit": "4476e1dabd5368653e1761b6e92a2fce9104ccb7",
        },
    },
    "not_reachable": "the published modeling_nemotron_labs_diffusion.py (Hugging Face remote code)",
}
CONFIG: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=1000000.0,
        factor=16.0,
        beta_fast=32.0,
        beta_slow=1.0,
        mscale=1.0,
        mscale_all_dim=0.5,  # the published 1.0 / 1.0 makes YaRN's attention factor 1; here it is exercised
        original_max_position_embeddings=8,
        llama_4_scaling_beta=0.1,
    ),
)
IDS = dict(bos_token_id=2, eos_token_id=1, pad_token_id=0, mask_token_id=3, block_size=4)
PROMPTS = [[2, 17, 40, 91, 5], [2, 33, 8, 120, 77, 64, 9, 100], [2, 50, 14, 30, 99, 81, 42, 7, 66, 12, 15], [2, 88]]
GEN, PAD = 16, 3
SEQ = [2, *range(10, 48)]  # 39 tokens: positions well past the original context of 8


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two rows, the first left-padded by PAD: (ids, positions, real) each `(2, 12)`."""
    ids = torch.tensor([[0] * PAD + PROMPTS[2][:9], PROMPTS[2] + [3]])
    real = torch.tensor([[False] * PAD + [True] * 9, [True] * 12])
    return ids, (real.long().cumsum(1) - 1).clamp(min=0), real


def reference() -> None:
    """Build, save and record the reference's outputs."""
    import transformers
    from safetensors.torch import save_file
    from transformers import DynamicCache, Ministral3Config, Ministral3ForCausalLM

    from models.nemotron_diffusion import MODEL_TYPE
    from models.tokenizer_build import build_char_tokenizer

    assert transformers.__version__ == SOURCE["transformers"], transformers.__version__
    torch.manual_seed(0)
    cfg = Ministral3Config(**CONFIG, sliding_window=None, **{k: IDS[k] for k in ("bos_token_id", "eos_token_id")})
    model = Ministral3ForCausalLM(cfg).eval()
    model.config._attn_implementation = "sdpa"  # the kernel the native model calls (eager: 0.0 difference)
    with torch.no_grad():
        for _, p in model.named_parameters():  # larger than the init's 0.02 so decoding has clear preferences
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if p.dim() == 1 else 0.25 * torch.randn_like(p))
    folder = GOLDEN / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    renamed = {
        ("diffusion_head.weight" if k == "lm_head.weight" else "encoder." + k.removeprefix("model.")): v.contiguous()
        for k, v in model.state_dict().items()
    }
    save_file(renamed, str(folder / "model.safetensors"), metadata={"format": "pt"})
    published = {"architectures": ["NemotronLabsDiffusionModel"], "model_type": MODEL_TYPE, "attention_bias": False}
    published |= {"dlm_paradigm": "bidirectional", "hidden_act": "silu", "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(published | CONFIG | IDS, indent=2) + "\n")
    build_char_tokenizer("").save(str(folder / "tokenizer.json"))
    n = len(SEQ)
    logits: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        ids = torch.tensor([SEQ])
        logits["causal"] = model(ids).logits
        everything = torch.zeros(1, 1, n, n)  # additive: every position sees every position
        logits["bidirectional"] = model(ids, attention_mask=everything, position_ids=torch.arange(n)[None]).logits
        for name, causal in (("cached_block_bidirectional", False), ("cached_block_causal", True)):
            cache = DynamicCache(config=model.config)  # the decode path: a causal prefix, then a block reading it
            model(ids[:, : n - 7], cache=cache, use_cache=True)
            block = torch.zeros(1, 1, 7, n) if not causal else None
            logits[name] = model(
                ids[:, n - 7 :], attention_mask=block, position_ids=torch.arange(n - 7, n)[None], cache=cache
            ).logits
        batch, pos, real = padded_batch()
        logits["left_padded_causal"] = model(batch, attention_mask=real.long(), position_ids=pos).logits
        sees = real[:, None, :] | torch.eye(12, dtype=torch.bool)  # every real key; a pad query sees itself
        additive = torch.zeros(2, 1, 12, 12).masked_fill(~sees[:, None], torch.finfo(torch.float32).min)
        logits["left_padded_bidirectional"] = model(batch, attention_mask=additive, position_ids=pos).logits
    save_file({k: v.contiguous() for k, v in logits.items()}, str(GOLDEN / "logits.safetensors"))
    runs = []
    for index, prompt in enumerate(PROMPTS):  # transformers' greedy generate, each prompt alone
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=GEN, do_sample=False, eos_token_id=1, pad_token_id=0
        )
        tokens = out[0, len(prompt) :].tolist()
        runs.append({"prompt": index, "generated": tokens + [0] * (GEN - len(tokens))})
    modeling = Path(transformers.__file__).parent / "models" / "ministral3" / "modeling_ministral3.py"
    source = json.loads(json.dumps(SOURCE))
    source["files"]["transformers/models/ministral3/modeling_ministral3.py"] = sha256(modeling)
    record = {
        "source": source,
        "config": CONFIG | IDS,
        "prompts": PROMPTS,
        "greedy": runs,
        "gen_length": GEN,
        "weights_sha256": sha256(folder / "model.safetensors"),
        "torch": torch.__version__,
    }
    (GOLDEN / "reference.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {GOLDEN}: {len(logits)} logits cases, {len(runs)} greedy runs")


def native_logits(model: Any) -> dict[str, torch.Tensor]:
    """unmask's native forward on the inputs `reference` scored, with the same masks."""
    from models.nemotron_diffusion import NemotronCache

    n = len(SEQ)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        ids = torch.tensor([SEQ])
        out["causal"] = model(ids).logits
        out["bidirectional"] = model(ids, causal=False).logits
        for name, causal in (("cached_block_bidirectional", False), ("cached_block_causal", True)):
            cache = NemotronCache()
            model(ids[:, : n - 7], cache=cache, store=True)
            out[name] = model(ids[:, n - 7 :], cache=cache, causal=causal).logits
        batch, pos, real = padded_batch()
        out["left_padded_causal"] = model(batch, pos, key_mask=real).logits
        out["left_padded_bidirectional"] = model(batch, pos, key_mask=real, causal=False).logits
    return out


def logits_rows(model: Any) -> list[dict[str, Any]]:
    """Max |logits difference| per case over the real positions (a pad query's own output is never read)."""
    from safetensors.torch import load_file

    golden = load_file(str(GOLDEN / "logits.safetensors"))
    ours, (_, _, real) = native_logits(model), padded_batch()
    rows = []
    for name, want in golden.items():
        got = ours[name]
        diff = (got - want).abs()[real] if name.startswith("left_padded") else (got - want).abs()
        rows.append({"case": f"logits {name}", "max_abs_diff": float(diff.max()), "agree": None})
    return rows


def decode_config(mode: str, **changes: Any) -> Any:
    from sampler.block_diffusion import BlockDiffusionConfig

    settings: dict[str, Any] = dict(
        max_new_tokens=GEN,
        max_denoising_steps=IDS["block_size"],
        canvas="seeded",
        mode=mode,
        remasking="low_confidence_dynamic",
        commit_threshold=0.9,
        temperature=0.0,
        mask_id=IDS["mask_token_id"],
        eos_ids=(IDS["eos_token_id"],),
        pad_id=IDS["pad_token_id"],
        seed=0,
    )
    return BlockDiffusionConfig(**settings | changes)


def decoding_rows(adapter: Any) -> list[dict[str, Any]]:
    """Each mode's greedy tokens against the reference's greedy generate: AR and self-speculative must agree, solo
    and as one left-padded batch; block diffusion is reported (it is a different decoder, not expected to agree)."""
    from sampler.decode import decode_prompts

    record = json.loads((GOLDEN / "reference.json").read_text())
    want = [r["generated"] for r in record["greedy"]]
    rows = []
    for mode in ("autoregressive", "self_speculative", "diffusion"):
        solo = [decode_prompts(adapter, [p], decode_config(mode)).generated[0].tolist() for p in PROMPTS]
        batch = decode_prompts(adapter, PROMPTS, decode_config(mode)).generated.tolist()
        if mode == "diffusion":
            rows.append({"case": "decode diffusion: batch equals solo", "max_abs_diff": None, "agree": batch == solo})
            continue
        rows.append({"case": f"decode {mode} solo vs generate", "max_abs_diff": None, "agree": solo == want})
        rows.append({"case": f"decode {mode} batch vs generate", "max_abs_diff": None, "agree": batch == want})
    return rows


def check() -> list[dict[str, Any]]:
    from models.adapters.nemotron import NemotronAdapter

    adapter = NemotronAdapter.from_folder(GOLDEN / "checkpoint")
    return logits_rows(adapter.model) + decoding_rows(adapter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["reference", "check"])
    args = parser.parse_args()
    if args.mode == "reference":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        reference()
        return
    for row in check():
        diff = "" if row["max_abs_diff"] is None else f"{row['max_abs_diff']:.3g}"
        agree = "" if row["agree"] is None else ("token-identical" if row["agree"] else "DIFFERS")
        print(f"{row['case']:<44} {diff:>10} {agree}")


if __name__ == "__main__":
    main()
