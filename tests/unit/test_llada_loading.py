"""Loading LLaDA checkpoints in the published layout, and the errors bad ones must give."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from models import CheckpointError, load, load_checkpoint, save_checkpoint
from sampler import SamplerConfig, generate
from tests.support.llada_fixtures import EOS_ID, MASK_ID, VOCAB, tiny_model

# The config.json of GSAI-ML/LLaDA-8B-Base, scaled down; every key it has, including the ones the
# native model ignores, so a real download's config parses unchanged.
LLADA_STYLE_CONFIG = {
    "activation_type": "silu",
    "alibi": False,
    "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0,
    "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig"},
    "bias_for_layer_norm": False,
    "block_group_size": 1,
    "block_type": "llama",
    "d_model": 32,
    "embedding_dropout": 0.0,
    "embedding_size": VOCAB,
    "eos_token_id": EOS_ID,
    "flash_attention": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "init_cutoff_factor": None,
    "init_device": "meta",
    "init_fn": "mitchell",
    "init_std": 0.02,
    "input_emb_norm": False,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "mask_token_id": MASK_ID,
    "max_sequence_length": 128,
    "mlp_hidden_size": 48,
    "mlp_ratio": 4,
    "model_type": "llada",
    "multi_query_attention": None,
    "n_heads": 4,
    "n_kv_heads": 4,
    "n_layers": 2,
    "pad_token_id": 44,
    "precision": "amp_bf16",
    "residual_dropout": 0.0,
    "rms_norm_eps": 1e-05,
    "rope": True,
    "rope_full_precision": True,
    "rope_theta": 500000.0,
    "scale_logits": False,
    "transformers_version": "4.46.3",
    "use_cache": False,
    "vocab_size": VOCAB,
    "weight_tying": False,
}


def write_llada_layout(folder, config=LLADA_STYLE_CONFIG, seed=0, shards=2):
    """Write raw tensors under LLaDA's published names, without going through our own save code."""
    g = torch.Generator().manual_seed(seed)
    d, hidden, vocab = config["d_model"], config["mlp_hidden_size"], config["embedding_size"]
    kv = d // config["n_heads"] * config["n_kv_heads"]
    t = {
        "model.transformer.wte.weight": torch.randn(vocab, d, generator=g) * 0.3,
        "model.transformer.ln_f.weight": 1 + 0.1 * torch.randn(d, generator=g),
        "model.transformer.ff_out.weight": torch.randn(vocab, d, generator=g) * 0.3,
    }
    for i in range(config["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        shapes = {
            "attn_norm": (d,),
            "ff_norm": (d,),
            "q_proj": (d, d),
            "k_proj": (kv, d),
            "v_proj": (kv, d),
            "attn_out": (d, d),
            "ff_proj": (hidden, d),
            "up_proj": (hidden, d),
            "ff_out": (d, hidden),
        }
        for name, shape in shapes.items():
            t[p + name + ".weight"] = (
                (1 + 0.1 * torch.randn(shape, generator=g))
                if len(shape) == 1
                else torch.randn(shape, generator=g) * 0.2
            )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    names = sorted(t)
    parts = [names[k::shards] for k in range(shards)]
    weight_map = {}
    for k, part in enumerate(parts, 1):
        fname = f"model-{k:05d}-of-{shards:05d}.safetensors"
        save_file({n: t[n] for n in part}, str(folder / fname), metadata={"format": "pt"})
        weight_map |= {n: fname for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return t


def plain_llada_logits(t, config, ids):
    """LLaDA's forward written out from the raw tensors: an independent check of the module code."""
    d, nh = config["d_model"], config["n_heads"]
    hs, eps = d // nh, config["rms_norm_eps"]

    def rms(x, w):
        return w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps))

    T = ids.shape[1]
    inv = 1.0 / (config["rope_theta"] ** (torch.arange(0, hs, 2).float() / hs))
    ang = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(x):  # (nh, T, hs), halves rotate together
        x1, x2 = x[..., : hs // 2], x[..., hs // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = t["model.transformer.wte.weight"][ids[0]]
    for i in range(config["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        h = rms(x, t[p + "attn_norm.weight"])
        q = (h @ t[p + "q_proj.weight"].T).view(T, nh, hs).transpose(0, 1)
        k = (h @ t[p + "k_proj.weight"].T).view(T, -1, hs).transpose(0, 1)
        v = (h @ t[p + "v_proj.weight"].T).view(T, -1, hs).transpose(0, 1)
        k = k.repeat_interleave(nh // k.shape[0], 0)
        v = v.repeat_interleave(nh // v.shape[0], 0)
        att = torch.softmax(rope(q) @ rope(k).transpose(-1, -2) / math.sqrt(hs), -1)  # no causal mask
        x = x + (att @ v).transpose(0, 1).reshape(T, d) @ t[p + "attn_out.weight"].T
        h = rms(x, t[p + "ff_norm.weight"])
        x = x + (F.silu(h @ t[p + "ff_proj.weight"].T) * (h @ t[p + "up_proj.weight"].T)) @ t[p + "ff_out.weight"].T
    return rms(x, t["model.transformer.ln_f.weight"]) @ t["model.transformer.ff_out.weight"].T


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_published_layout_loads_and_matches_plain_forward(tmp_path, n_kv_heads):
    config = LLADA_STYLE_CONFIG | {"n_kv_heads": n_kv_heads}
    tensors = write_llada_layout(tmp_path / "ckpt", config)
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert (loaded.mask_id, loaded.eos_id, loaded.pad_id) == (MASK_ID, EOS_ID, 44)
    ids = torch.randint(0, 40, (1, 11))
    got = loaded.model(ids).logits[0]
    assert got.shape == (11, VOCAB)
    torch.testing.assert_close(got, plain_llada_logits(tensors, config, ids), rtol=1e-4, atol=1e-4)


def test_sharded_round_trip_and_weight_tying(tmp_path):
    for tying in (False, True):
        model = tiny_model(seed=5, weight_tying=tying)
        folder = save_checkpoint(model, tmp_path / f"tied-{tying}", max_shard_bytes=8_000)
        assert len(list(folder.glob("model-*.safetensors"))) > 1
        loaded = load_checkpoint(folder)
        ids = torch.randint(0, 40, (2, 9))
        torch.testing.assert_close(loaded.model(ids).logits, model(ids).logits, rtol=0, atol=0)
        cfg = SamplerConfig(steps=8, gen_length=8, block_length=8, mask_id=MASK_ID, eos_id=EOS_ID, eot_id=None)
        assert torch.equal(generate(loaded.model, ids, cfg).sequences, generate(model, ids, cfg).sequences)


def test_bfloat16_load(tmp_path):
    folder = save_checkpoint(tiny_model(), tmp_path / "m")
    loaded = load(folder, dtype="bfloat16")
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.model(torch.tensor([[1, 2, 3]])).logits.dtype == torch.bfloat16


@pytest.fixture
def good(tmp_path):
    return save_checkpoint(tiny_model(), tmp_path / "good")


def test_missing_folder_and_config(tmp_path, good):
    with pytest.raises(CheckpointError, match="no such folder"):
        load(tmp_path / "nope")
    (good / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        load_checkpoint(good)


@pytest.mark.parametrize(
    "key,value,expect",
    [
        ("d_model", "32", "key 'd_model' must be"),
        ("rope_theta", "big", "key 'rope_theta' must be"),
        ("weight_tying", 1, "key 'weight_tying' must be"),
        ("n_heads", 5, "do not divide"),
        ("block_type", "sequential", "key 'block_type'"),
        ("scale_logits", True, "key 'scale_logits'"),
    ],
)
def test_bad_config_values_name_the_key(good, key, value, expect):
    cfg = json.loads((good / "config.json").read_text())
    cfg[key] = value
    (good / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=expect) as err:
        load_checkpoint(good)
    assert "config.json" in str(err.value)


def test_malformed_json_config(good):
    (good / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(good)


def test_wrong_tensor_shape_names_the_tensor(good, tmp_path):
    cfg = json.loads((good / "config.json").read_text())
    cfg["mlp_hidden_size"] = 64
    (good / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError,
        match=r"model\.transformer\.blocks\.0\.ff_proj\.weight' has shape \(48, 32\), expected \(64, 32\)",
    ):
        load_checkpoint(good)


def test_truncated_safetensors_names_the_file(good):
    path = good / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unreadable safetensors"):
        load_checkpoint(good)


def test_missing_tensor_and_missing_shard(tmp_path):
    folder = save_checkpoint(tiny_model(), tmp_path / "sharded", max_shard_bytes=8_000)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (folder / shard).unlink()
    with pytest.raises(CheckpointError, match=f"{shard}: missing shard"):
        load_checkpoint(folder)
    folder2 = save_checkpoint(tiny_model(), tmp_path / "single")
    from safetensors.torch import load_file

    tensors = load_file(str(folder2 / "model.safetensors"))
    del tensors["model.transformer.ln_f.weight"]
    save_file(tensors, str(folder2 / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor 'model\.transformer\.ln_f\.weight' missing"):
        load_checkpoint(folder2)


def test_pickle_only_checkpoint_is_refused(good):
    (good / "model.safetensors").unlink()
    (good / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(CheckpointError, match="only pickle weights"):
        load_checkpoint(good)


def test_nan_logits_stop_decoding_with_a_clear_error(good):
    loaded = load_checkpoint(good)
    with torch.no_grad():
        loaded.model.model.transformer.blocks[1].ff_out.weight[0, 0] = float("nan")
    cfg = SamplerConfig(steps=8, gen_length=8, block_length=8, mask_id=MASK_ID, eos_id=EOS_ID, eot_id=None)
    from sampler import NonFiniteLogitsError

    with pytest.raises(NonFiniteLogitsError, match=r"block 0 step 0: model returned \d+ non-finite logits"):
        generate(loaded.model, torch.tensor([[1, 2, 3]]), cfg)


def test_sampler_config_checks_and_hash():
    with pytest.raises(ValueError, match="gen_length=30 must be a multiple of block_length=8"):
        SamplerConfig(gen_length=30, block_length=8, steps=30)
    with pytest.raises(ValueError, match="steps=5 must be a multiple of the number of blocks"):
        SamplerConfig(gen_length=16, block_length=8, steps=5)
    with pytest.raises(ValueError, match="remasking='best'"):
        SamplerConfig(remasking="best")
    with pytest.raises(ValueError, match="unknown setting 'stepz'"):
        SamplerConfig.from_dict({"stepz": 3})
    cfg = SamplerConfig(steps=64, gen_length=64, block_length=32, temperature=0.5)
    assert SamplerConfig.from_json(cfg.to_json()) == cfg
    assert cfg.hash() == SamplerConfig.from_json(cfg.to_json()).hash() != cfg.with_(seed=1).hash()
    assert hash(cfg) == hash(SamplerConfig.from_json(cfg.to_json()))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), "both infs"])
def test_the_logits_check_finds_one_bad_value_and_names_its_row(bad):
    from sampler import NonFiniteLogitsError
    from sampler.proposal import check_logits

    logits = torch.randn(4, 8, 149)
    if bad == "both infs":  # +inf and -inf sum to NaN: still found
        logits[1, 2, 3], logits[3, 0, 0] = float("inf"), -float("inf")
        rows = r"\[1, 3\]"
    else:
        logits[2, 7, 148] = bad
        rows = r"\[2\]"
    with pytest.raises(NonFiniteLogitsError, match=rf"here: model returned \d non-finite logits .* rows {rows}"):
        check_logits(logits, "here")


def test_the_logits_check_passes_finite_logits_whose_half_precision_sum_overflows():
    from sampler.proposal import check_logits

    logits = torch.full((2, 8, 149), 60000.0, dtype=torch.float16)  # finite, each near float16's largest
    assert not torch.isfinite(logits.sum())  # the quick sum says "look closer"
    check_logits(logits, "here")  # and the closer look finds nothing
    check_logits(torch.randn(2, 8, 149), "here")


def test_a_configs_kept_digest_is_its_own_and_its_dict_a_copy():
    cfg = SamplerConfig(temperature=0, gen_length=8, block_length=8, steps=8)
    again = SamplerConfig(temperature=0.0, gen_length=8, block_length=8, steps=8)
    assert cfg == again and cfg.hash() == cfg.hash()
    assert again.hash() != cfg.hash()  # equal configs, different JSON ("0" against "0.0"): each keeps its own digest
    assert cfg.with_(steps=4, gen_length=8).hash() != cfg.hash()
    data = cfg.to_dict()
    data["steps"] = 99  # the caller's dict, not the config's state
    assert cfg.steps == 8 and cfg.to_dict()["steps"] == 8 and SamplerConfig.from_dict(cfg.to_dict()) == cfg
