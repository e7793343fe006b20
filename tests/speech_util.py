"""Shared helper for the speech tests (data, corrupt items, the CTC task): a tiny LibriSpeech-layout tree."""

import numpy as np
import soundfile


def write_tree(root, split, utterances, rate=16000):
    """A LibriSpeech-layout split: {(speaker, chapter): [(seconds, transcript), ...]} as FLAC + trans.txt."""
    g = np.random.default_rng(0)
    for (spk, chap), items in utterances.items():
        d = root / split / str(spk) / str(chap)
        d.mkdir(parents=True, exist_ok=True)
        lines = []
        for k, (seconds, text) in enumerate(items):
            uid = f"{spk}-{chap}-{k:04d}"
            wave = 0.1 * g.standard_normal(int(seconds * rate))
            soundfile.write(str(d / f"{uid}.flac"), wave, rate, format="FLAC", subtype="PCM_16")
            lines.append(f"{uid} {text}")
        (d / f"{spk}-{chap}.trans.txt").write_text("\n".join(lines) + "\n")
