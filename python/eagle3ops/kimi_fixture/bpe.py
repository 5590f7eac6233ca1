"""The fixture's own tiktoken vocabulary: a byte-level BPE trained offline on a small seeded corpus, written as a
``tiktoken.model`` file (one ``base64(token bytes) rank`` line per token, ranks 0..N-1, the 256 single bytes
first), the format the published Kimi tokenizer ships.

Pre-tokenisation is Kimi's rule (:data:`PATTERN`): runs of Han characters stand alone, and a run of letters
keeps an English contraction suffix (``'s 't 're 've 'm 'll 'd``) attached, so ``we'll`` is one pre-token and
its BPE can merge across the apostrophe. The generic tiktoken converter in transformers splits contractions off
first instead; that difference is what a test of the fixture shows (native and remote-code tokenizers disagree).
"""

from __future__ import annotations

import base64
import itertools
import random
from collections import Counter
from pathlib import Path

# the remote tokenizer class in the model folder (remote/tokenization_kimi.py) spells the same pattern; a test
# holds the two equal
_LETTERS_NOT_HAN = r"\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]"
_LOWER_NOT_HAN = r"\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
PATTERN = "|".join(
    [
        r"[\p{Han}]+",  # Han runs
        rf"[^\r\n\p{{L}}\p{{N}}]?[{_LETTERS_NOT_HAN}]*[{_LOWER_NOT_HAN}]+{_CONTRACTION}",  # Word, word, word's
        rf"[^\r\n\p{{L}}\p{{N}}]?[{_LETTERS_NOT_HAN}]+[{_LOWER_NOT_HAN}]*{_CONTRACTION}",  # WORD, WORDs
        r"\p{N}{1,3}",  # digits, three at most
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",  # punctuation runs
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

_WORD_TEXT = (
    "the a an of to in on for with and or but not is are was were be been have has had do does did can could "
    "will would should may might must shall this that these those it its they them their we our you your he she "
    "his her i me my what which who when where why how all any some each every more most less few many much "
    "number numbers list word words letter letters answer question sum total count order sort reverse first "
    "last next step steps result value values check again because so then now here there think thinking "
    "reason reasoning plan call tool tools function functions weather city temperature location unit units "
    "celsius fahrenheit search query file files read write open close time date today tomorrow model draft "
    "target token tokens layer layers hidden state states train training serve serving test tests data row "
    "rows please thanks sure okay yes no right left up down small large fast slow good bad new old same other "
    "user assistant system return returned arguments name type string object integer required properties "
    "description kimi moonshot speculative decoding accept acceptance length"
)
_CONTRACTION_TEXT = (
    "we'll don't it's I'm they're you've she'd can't won't that's there's let's isn't aren't didn't doesn't "
    "I'll you'll they'll we're you're we've I've he's what's wouldn't shouldn't couldn't"
)
_WORDS, _CONTRACTIONS = _WORD_TEXT.split(), _CONTRACTION_TEXT.split()
_FIXED = [  # text the chat template itself writes between special tokens
    "system",
    "user",
    "assistant",
    "tool",
    "tool_declare",
    "## Return of functions.get_weather:0\n",
    "functions.search:1",
    '{"city": "Paris", "unit": "celsius"}',
    '[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]',
    "You are Kimi, an AI assistant created by Moonshot AI.",
]


def corpus(seed: int, sentences: int = 1500) -> str:
    """Seeded English-like text with contractions, numbers, punctuation and the template's own strings."""
    rng = random.Random(seed)
    out = list(_FIXED)
    for _ in range(sentences):
        n = rng.randint(4, 14)
        words = [rng.choice(_CONTRACTIONS) if rng.random() < 0.15 else rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        s = " ".join(words)
        out.append(s[0].upper() + s[1:] + rng.choice([".", "?", "!", ",", ":", "."]))
    out.append("中文 测试 你好")
    return "\n".join(out)


def pretokens(text: str) -> list[str]:
    import regex

    return regex.findall(PATTERN, text, flags=regex.V1)


def train(text: str, ranks: int) -> list[bytes]:
    """Byte-level BPE: the 256 single bytes, then the most frequent adjacent pair merged, ``ranks - 256`` times
    (ties broken by the pair's bytes, so the result depends on the text only)."""
    words = Counter(tuple(bytes([b]) for b in piece.encode("utf-8")) for piece in pretokens(text))
    vocab = [bytes([b]) for b in range(256)]
    while len(vocab) < ranks:
        pairs: Counter = Counter()
        for word, n in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += n
        if not pairs:
            raise ValueError(f"the corpus supports only {len(vocab)} ranks, not {ranks}")
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = best[0] + best[1]
        vocab.append(merged)
        words = Counter({_merge(word, best, merged): n for word, n in words.items()})
    return vocab


def _merge(word: tuple, pair: tuple, merged: bytes) -> tuple:
    if len(word) < 2:
        return word
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def write_tiktoken_model(vocab: list[bytes], path: Path) -> None:
    lines = [f"{base64.b64encode(tok).decode('ascii')} {rank}" for rank, tok in enumerate(vocab)]
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
