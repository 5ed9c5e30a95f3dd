"""The memory fit before a pull (sampler/fit.py): each term against a hand computation, and the verdicts."""

from __future__ import annotations

from pathlib import Path

from models.catalog import CATALOG_PATH, CatalogEntry, load_catalog, parse_entry
from sampler.fit import DOES_NOT_FIT, FITS, UNKNOWN, Shape, config_shape, memory_fit

GIB = 2**30
LLADA_SHAPE = Shape(layers=32, kv_heads=32, head_dim=128, vocab=126_464)
STATED = {"layers": 32, "kv_heads": 32, "head_dim": 128, "vocab": 126_464}  # LLADA_SHAPE as a catalog states it
FROM_CATALOG = "from the catalog's architecture (config.json not here yet)"


def entry(**changes: object) -> CatalogEntry:
    raw = {
        "id": "big",
        "family": "llada",
        "kind": "masked-diffusion",
        "role": "candidate",
        "source": "hf://acme/big",
        "revision": "main",
        "license": "MIT",
        "adapter": "llada",
        "parameters": 8_000_000_000,
        "decoding": {"gen_length": 128, "block_length": 32},
    } | changes
    return parse_entry(raw, 0, Path("/tmp/catalog.yaml"))


def fit(e: CatalogEntry, have: int = 80 * GIB, **kw: object):
    args = {"device": "cuda", "dtype_bytes": 2, "have": have, "have_basis": "stated --memory", "max_canvas": 1024}
    return memory_fit(e, **(args | kw))  # type: ignore[arg-type]


def test_each_term_is_the_hand_computed_number():
    result = fit(entry(), shape=LLADA_SHAPE)
    terms = {t.name: t.bytes for t in result.terms}
    assert result.positions == 1024  # the serving limit's canvas is wider than gen_length 128
    assert terms["weights"] == 8_000_000_000 * 2  # bf16
    assert terms["kv_cache"] == 2 * 32 * 32 * 128 * 1024 * 2 == 536_870_912  # K and V, every layer, bf16
    assert terms["logits"] == 1024 * 126_464 * 4  # masked diffusion: float32 logits over every position
    assert result.need_known == 16_000_000_000 + 536_870_912 + 517_996_544
    assert result.verdict == FITS and result.unknown == []


def test_block_diffusion_logits_are_over_its_block_and_moe_keeps_every_expert():
    moe = entry(kind="block-diffusion", adapter="none", notes="n", active_parameters=1_000_000_000)
    terms = {t.name: t for t in fit(moe, shape=LLADA_SHAPE).terms}
    V = 126_464
    assert terms["logits"].bytes == 6 * 32 * V * 4 + 32 * V * 2  # seven (block, vocab) tensors, one in bf16
    assert terms["weights"].bytes == 16_000_000_000  # all 8B resident, not the 1B active
    assert "1,000,000,000 active per token" in terms["weights"].basis


def test_known_terms_over_the_budget_refuse_and_unknown_ones_never_do():
    small = fit(entry(), have=1 * GIB)  # no config here: the caches are unknown, the weights alone are 16 GB
    assert small.verdict == DOES_NOT_FIT and small.unknown == ["kv_cache", "logits"]
    assert "have: 1.00 GiB (stated --memory, cuda)" in small.lines()
    roomy = fit(entry(), have=100 * GIB)
    assert roomy.verdict == UNKNOWN  # the weights fit, the rest cannot be known yet
    nothing = fit(entry(parameters=None), have=1)
    assert nothing.verdict == UNKNOWN and nothing.need_known == 0  # no parameters stated: not guessed


def test_config_shape_reads_hugging_face_llada_and_nested_text_configs():
    hf = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584}
    assert config_shape(hf | {"vocab_size": 152_064}) == Shape(28, 4, 128, 152_064)
    llada = {"n_layers": 32, "n_heads": 32, "d_model": 4096, "vocab_size": 126_464}
    assert config_shape(llada) == LLADA_SHAPE  # n_kv_heads absent: as many as the heads
    nested = {"text_config": hf | {"vocab_size": 10, "head_dim": 256}}
    assert config_shape(nested) == Shape(28, 4, 256, 10)
    assert config_shape({"hidden_size": 8}) is None


def test_the_catalog_architecture_makes_the_terms_known_before_a_pull():
    result = fit(entry(architecture=STATED))  # no config.json here: the catalog's numbers
    terms = {t.name: t for t in result.terms}
    assert terms["kv_cache"].bytes == 2 * 32 * 32 * 128 * 1024 * 2  # as from the files' config.json
    assert terms["logits"].bytes == 1024 * 126_464 * 4
    assert terms["kv_cache"].basis.endswith(FROM_CATALOG) and terms["logits"].basis.endswith(FROM_CATALOG)
    assert result.verdict == FITS and result.unknown == []  # was "unknown" before the pull


def test_the_files_config_wins_over_the_catalog_and_a_disagreement_is_said():
    files = Shape(layers=16, kv_heads=32, head_dim=128, vocab=126_464)
    terms = {t.name: t for t in fit(entry(architecture=STATED), shape=files).terms}
    assert terms["kv_cache"].bytes == 2 * 16 * 32 * 128 * 1024 * 2  # the config.json's 16 layers, not the catalog's 32
    assert terms["kv_cache"].basis.endswith(
        "from config.json; the catalog's architecture (layers 32, kv_heads 32, head_dim 128, vocab 126,464) "
        "disagrees and is not used"
    )
    agreeing = fit(entry(architecture=STATED), shape=LLADA_SHAPE).terms[2]
    assert agreeing.basis.endswith("from config.json (the catalog's architecture agrees)")
    assert fit(entry(), shape=files).terms[1].basis.endswith("; from config.json")


def test_llada2_flash_is_judged_on_every_term_before_a_pull():
    """The bundled entry states its published shape: 32 layers, 4 key/value heads of 128, vocabulary 157,184."""
    result = fit(load_catalog(CATALOG_PATH).get("llada2.0-flash"))
    terms = {t.name: t.bytes for t in result.terms}
    assert terms["kv_cache"] == 2 * 32 * 4 * 128 * 1024 * 2 == 64 * 2**20
    assert terms["logits"] == (6 * 4 + 2) * 32 * 157_184  # block 32: six float32 (block, vocab) tensors, one bf16
    assert result.verdict == DOES_NOT_FIT and result.unknown == []  # 186 GiB of weights against 80
