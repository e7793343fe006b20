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

from emarule.engine.baditems import SKIP_KEY, ItemError
from emarule.errors import UserError
from emarule.speech import tokens
from emarule.speech.features import LogMel

SPLIT_LAYOUT = "<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac with <speaker>-<chapter>.trans.txt"
LAYOUT = f"<split>/{SPLIT_LAYOUT}"

# A sweep's worker trains run after run on the same corpus; what a file yields (its header, its features)
# is kept for the process, keyed on the file's identity, so that a file written again is read again.
_HEADERS: dict[tuple, tuple[int, int]] = {}  # identity → (sample rate, frames)
_FEATURES: dict[tuple, torch.Tensor] = {}  # (identity, featurizer) → features
_FEATURES_SECONDS = [0.0]  # the audio behind _FEATURES
MEMO_HOURS = 4.0  # past this much audio the memo starts again, so that one process never holds two corpora


def identity(path: Path) -> tuple:
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


def _header(path: Path) -> tuple[int, int]:
    import soundfile

    key = identity(path)
    if key not in _HEADERS:
        info = soundfile.info(str(path))
        _HEADERS[key] = (info.samplerate, info.frames)
    return _HEADERS[key]


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


def list_split(root: Path, split: str, sample_rate: int = 16000, limit: int | None = None,
               min_samples: int = 0, skippable: bool = False) -> list[Utterance]:
    """Every utterance of a split with its transcript and duration, in id order.

    A file shorter than `min_samples` by its header is refused here, before a run writes anything, naming
    data.skip_bad_items where the split is `skippable` (trained on). With 0 it is listed, and reading it is
    the item error that the loop skips and counts."""
    d = split_dir(Path(root), split)
    out = []
    for trans in sorted(d.glob("*/*/*.trans.txt")):
        raw = trans.read_bytes()
        try:
            text_lines = raw.decode("utf-8").splitlines()
        except UnicodeDecodeError as e:
            line_no = raw[:e.start].count(b"\n") + 1
            raise UserError(f"{trans}: not UTF-8 text (byte {raw[e.start]:#04x} on line {line_no}); LibriSpeech "
                            f"transcripts are UTF-8: extract the split again") from None
        for line in text_lines:
            if not line.strip():
                continue
            uid, _, text = line.strip().partition(" ")
            path = trans.parent / f"{uid}.flac"
            if not path.is_file():
                raise UserError(f"{trans}: {uid} has no audio file {path.name}; expected {LAYOUT}")
            try:
                rate, frames = _header(path)
            except (RuntimeError, OSError, ValueError) as e:  # soundfile's LibsndfileError is a RuntimeError
                raise UserError(f"{path}: cannot read its audio header ({' '.join(str(e).split())}); the file "
                                f"is corrupt: extract it again or remove its line from {trans.name}") from None
            if rate != sample_rate:
                raise UserError(f"{path}: sampled at {rate} Hz, expected {sample_rate} Hz "
                                f"(LibriSpeech's rate)")
            if frames < min_samples:
                raise UserError(f"{path}: {short(frames, min_samples)}; remove its line from {trans.name}"
                                + (f", or set {SKIP_KEY}: true to skip such training items" if skippable else ""))
            try:
                tokens.encode(text)
            except ValueError as e:
                raise UserError(f"{trans}: {uid}: {e}") from None
            out.append(Utterance(uid, path, tokens.normalize(text), frames / rate))
            if limit is not None and len(out) >= limit:
                return out
    if not out:
        raise UserError(f"LibriSpeech split {split!r} at {d} holds no utterances: expected {d}/{SPLIT_LAYOUT}")
    return out


def short(samples: int, min_samples: int) -> str:
    return f"{samples} samples of audio, fewer than the {min_samples} that one feature window needs"


def read_audio(path: Path, seconds: float | None = None, sample_rate: int = 16000) -> torch.Tensor:
    """The file's samples, mono; `seconds` (its header's duration) catches a file cut short, which
    soundfile would otherwise decode to fewer samples without a word."""
    import soundfile

    try:
        wave, sr = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, OSError, ValueError) as e:  # soundfile's LibsndfileError is a RuntimeError
        raise ItemError(path, f"{type(e).__name__}: {e}") from None
    if seconds is not None and len(wave) < round(seconds * sr):
        raise ItemError(path, f"{len(wave)} samples decoded where its header says {round(seconds * sr)}: the file is "
                              f"cut short")
    return torch.from_numpy(np.ascontiguousarray(wave.mean(axis=1)))


class SpeechSet:
    """Utterances → (features, token ids) on demand; small sets keep their features in memory, for the
    process (`_FEATURES`): the next run of a sweep's worker reads them from there."""

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
        u = self.utts[i]
        if self.cache is None:
            return self.compute(u)
        try:
            key = (identity(u.path), self.featurizer.key)
        except OSError:  # gone since it was listed: read_audio says so
            key = None
        f = _FEATURES.get(key) if key is not None else None
        if f is None:
            f = self.compute(u)
            if key is not None:
                if _FEATURES_SECONDS[0] + u.seconds > MEMO_HOURS * 3600:
                    _FEATURES.clear()
                    _FEATURES_SECONDS[0] = 0.0
                _FEATURES[key] = f
                _FEATURES_SECONDS[0] += u.seconds
        self.cache[i] = f
        return f

    def compute(self, u: Utterance) -> torch.Tensor:
        wave = read_audio(u.path, u.seconds)
        if len(wave) < self.featurizer.min_samples:  # a split listed without min_samples meets its short files here
            raise ItemError(u.path, short(len(wave), self.featurizer.min_samples))
        return self.featurizer(wave)
