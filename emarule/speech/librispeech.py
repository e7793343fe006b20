"""LibriSpeech from disk (`--data ROOT`), and the generated corpus, which is written in the same layout.

    ROOT/<split>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac
    ROOT/<split>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt    lines "<utterance id> TRANSCRIPT"

ROOT may also be the folder that holds `LibriSpeech/` (as the archives unpack). Audio is read with
soundfile (FLAC), 16 kHz mono; durations come from the file headers, so listing a split reads no audio.
Nothing is downloaded: a missing split is one error line naming it and the layout expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from emarule.errors import UserError
from emarule.speech import tokens
from emarule.speech.features import LogMel

LAYOUT = "<split>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac with <speaker>-<chapter>.trans.txt"


@dataclass(frozen=True)
class Utterance:
    id: str
    path: Path
    text: str  # normalized: lower case words
    seconds: float


def split_dir(root: Path, split: str) -> Path:
    for base in (root, root / "LibriSpeech"):
        if (base / split).is_dir():
            return base / split
    layout = LAYOUT.replace("<split>", split)
    raise UserError(f"LibriSpeech split {split!r} not found under {root}: expected {root}/{layout} "
                    f"(nothing is downloaded; unpack the split there or point --data at its parent)")


def list_split(root: Path, split: str, sample_rate: int = 16000, limit: int | None = None) -> list[Utterance]:
    """Every utterance of a split with its transcript and duration, in id order."""
    import soundfile

    d = split_dir(Path(root), split)
    out = []
    for trans in sorted(d.glob("*/*/*.trans.txt")):
        for line in trans.read_text().splitlines():
            if not line.strip():
                continue
            uid, _, text = line.strip().partition(" ")
            path = trans.parent / f"{uid}.flac"
            if not path.is_file():
                raise UserError(f"{trans}: {uid} has no audio file {path.name}; expected {LAYOUT}")
            info = soundfile.info(str(path))
            if info.samplerate != sample_rate:
                raise UserError(f"{path}: sampled at {info.samplerate} Hz, expected {sample_rate} Hz "
                                f"(LibriSpeech's rate)")
            try:
                tokens.encode(text)
            except ValueError as e:
                raise UserError(f"{trans}: {uid}: {e}") from None
            out.append(Utterance(uid, path, tokens.normalize(text), info.frames / info.samplerate))
            if limit is not None and len(out) >= limit:
                return out
    if not out:
        raise UserError(f"LibriSpeech split {split!r} at {d} holds no utterances: expected {d}/{LAYOUT}")
    return out


def read_audio(path: Path) -> torch.Tensor:
    import soundfile

    wave, _ = soundfile.read(str(path), dtype="float32", always_2d=True)
    return torch.from_numpy(np.ascontiguousarray(wave.mean(axis=1)))


class SpeechSet:
    """Utterances → (features, token ids) on demand; small sets keep their features in memory."""

    def __init__(self, utterances: list[Utterance], featurizer: LogMel, cache: bool):
        self.utts = utterances
        self.featurizer = featurizer
        self.cache: dict[int, torch.Tensor] | None = {} if cache else None
        self.targets = [tokens.encode(u.text) for u in utterances]

    def __len__(self) -> int:
        return len(self.utts)

    def seconds(self, i: int) -> float:
        return self.utts[i].seconds

    def features(self, i: int) -> torch.Tensor:
        if self.cache is not None and i in self.cache:
            return self.cache[i]
        f = self.featurizer(read_audio(self.utts[i].path))
        if self.cache is not None:
            self.cache[i] = f
        return f
