"""The tiny model's tokenizer: a SentencePiece-style vocabulary with byte
fallback (``tokenizer.ggml.model = "llama"``) and a ChatML chat template.

The 256 byte tokens ``<0x00>``..``<0xFF>`` mean any text can be tokenized;
the other pieces are common words and letter pairs, so that ordinary prompts
take fewer tokens than bytes. :mod:`yard.demo.tinymodel` writes them into the
GGUF file.
"""

from __future__ import annotations

import string
from collections.abc import Iterator

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, the template the model carries (``tokenizer.chat_template``)."""

# Token types as GGUF numbers them (gguf.TokenType).
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6
SPECIALS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
UNK_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = range(5)
"""Ids of the special tokens, in :data:`SPECIALS` order."""
MIN_VOCAB = len(SPECIALS) + 256 + 1
"""The smallest vocabulary: the specials, the 256 bytes and ``▁``."""
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "an",
    "each",
    "which",
    "she",
    "do",
    "how",
    "their",
    "if",
    "will",
    "up",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "so",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "yard",
    "model",
    "queue",
    "start",
    "load",
    "swap",
    "memory",
    "deadline",
    "priority",
    "request",
]


def vocabulary(vocab_size: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types of a SentencePiece-style vocabulary.

    Byte fallback makes any text tokenizable; the remaining pieces are words
    and letter pairs so that ordinary prompts take fewer tokens than bytes.
    """
    tokens: list[str] = list(SPECIALS)
    types = [_UNKNOWN, _CONTROL, _CONTROL, _CONTROL, _CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [_BYTE] * 256

    def pieces() -> Iterator[str]:
        yield "▁"
        for word in _WORDS:
            yield "▁" + word
        yield from (c for c in string.printable.strip() if c != " ")
        for c in string.ascii_letters + string.digits:
            yield "▁" + c
        for a in string.ascii_lowercase:
            for b in string.ascii_lowercase:
                yield a + b
                yield "▁" + a + b
        n = 0
        while True:  # endless unique filler for large vocabularies
            yield f"▁w{n}"
            n += 1

    seen = set(tokens)
    for piece in pieces():
        if len(tokens) >= vocab_size:
            break
        if piece in seen:
            continue
        seen.add(piece)
        tokens.append(piece)
        types.append(_NORMAL)
    # SentencePiece merges prefer higher scores: earlier pieces win.
    scores = [0.0 if t != _NORMAL else -float(i) for i, t in enumerate(types)]
    return tokens, scores, types
