"""Word error counts through jiwer, as additive sums (errors, words) that reduce over batches and ranks."""

from __future__ import annotations


def counts(references: list[str], hypotheses: list[str]) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words) over the pairs; WER = errors / words."""
    import jiwer

    # jiwer rejects an empty reference: against one, every hypothesis word is an insertion, counted here. An
    # empty hypothesis is all deletions, which it handles.
    both = list(zip(references, hypotheses, strict=True))
    inserted = sum(len(h.split()) for r, h in both if not r.strip())
    pairs = [(r, h) for r, h in both if r.strip()]
    if not pairs:
        return inserted, 0
    out = jiwer.process_words([r for r, _ in pairs], [h for _, h in pairs])
    return out.substitutions + out.deletions + out.insertions + inserted, sum(len(r.split()) for r, _ in pairs)


def percent(errors: float, words: float) -> float:
    return 100.0 * errors / words if words else float("nan")
