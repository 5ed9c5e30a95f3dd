"""A character-level tokenizer made with the `tokenizers` library for the bundled tiny models.

Every character is one token; printable ASCII and newline are always in the vocabulary, plus
whatever extra characters (the Korean of arith-ko) the caller passes. Special tokens follow
LLaDA's names so the checkpoint loader finds them without configuration.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

MASK = "<|mdm_mask|>"
EOS = "<|endoftext|>"
EOT = "<|eot_id|>"
PAD = "<|pad|>"
UNK = "<|unk|>"
SPECIAL_TOKENS = (PAD, EOS, EOT, MASK, UNK)  # ids 0-4, in this order
BASE_CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


def build_char_tokenizer(extra_chars: str | set[str] = "") -> Tokenizer:
    """Special tokens first, then printable ASCII, newline and `extra_chars`, one id per character."""
    chars = sorted(set(BASE_CHARS) | set(extra_chars))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        if ch not in vocab:
            vocab[ch] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """The ids of mask, EOS, EoT and pad, as config.json keys."""
    return {
        "mask_token_id": _special_id(tokenizer, MASK),
        "eos_token_id": _special_id(tokenizer, EOS),
        "eot_token_id": _special_id(tokenizer, EOT),
        "pad_token_id": _special_id(tokenizer, PAD),
    }


def _special_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    assert token_id is not None, f"{token}: build_char_tokenizer gives every tokenizer of the tiny models its specials"
    return token_id


__all__ = ["EOS", "EOT", "MASK", "PAD", "SPECIAL_TOKENS", "build_char_tokenizer", "special_ids"]
