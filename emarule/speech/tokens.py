"""The paper's token set (App. G): 26 letters, the apostrophe and a word boundary, plus the CTC blank.

Index 0 is the blank, 1 the word boundary `|`, 2 the apostrophe, 3–28 the letters a–z (29 in all,
the spec's `model.vocab`). A transcript is spelled letter by letter with `|` between words.
"""

from __future__ import annotations

import torch

BLANK = 0
BOUNDARY = "|"
SYMBOLS = ["<blank>", BOUNDARY, "'"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
VOCAB = len(SYMBOLS)
_INDEX = {s: i for i, s in enumerate(SYMBOLS)}


def normalize(text: str) -> str:
    """Lower case, single spaces; LibriSpeech transcripts are upper case letters and apostrophes."""
    return " ".join(text.lower().split())


def encode(text: str) -> list[int]:
    """Token ids of a transcript; a character outside the token set is a ValueError naming it."""
    ids = []
    for i, word in enumerate(normalize(text).split(" ")):
        if i:
            ids.append(_INDEX[BOUNDARY])
        for ch in word:
            if ch not in _INDEX or ch == BOUNDARY:
                raise ValueError(f"character {ch!r} in {text!r} is not in the token set (a-z, apostrophe)")
            ids.append(_INDEX[ch])
    return ids


def decode(ids) -> str:
    """Token ids (no blanks) back to words."""
    chars = "".join(SYMBOLS[int(i)] for i in ids if int(i) != BLANK)
    return " ".join(w for w in chars.split(BOUNDARY) if w)


def collapse(frame_ids: list[int]) -> list[int]:
    """The paper's hard transcription: repeats merged, then blanks removed ("h##eelll##ll###oo" → hello)."""
    out, prev = [], None
    for t in frame_ids:
        if t != prev and t != BLANK:
            out.append(t)
        prev = t
    return out


def greedy(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
    """Greedy CTC decoding of (batch, frames, vocab) scores with each row's valid frame count."""
    best = log_probs.argmax(-1).cpu()
    return [decode(collapse(best[b, :int(n)].tolist())) for b, n in enumerate(lengths.cpu())]
