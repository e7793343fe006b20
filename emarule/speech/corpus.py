"""A generated speech corpus in LibriSpeech's layout: the embedded data of the `cpu` and `tiny` presets.

Utterances of 1–5 words from a closed vocabulary, spoken by eSpeak NG (the `espeakng-loader` wheel
ships the library and its voices; driven here through ctypes), resampled to 16 kHz, with noise added,
written as FLAC with `<speaker>-<chapter>.trans.txt` transcripts, so `emarule.speech.librispeech`
reads it exactly as it reads LibriSpeech.

- Voices: each is an eSpeak English voice with a timbre variant (male and female), a base pitch and a
  speaking rate, drawn from the seed. Unlike LibriSpeech, every split uses the same voices (under its
  own speaker ids): with a handful of synthetic voices, a small model does not generalize to unheard
  ones within a CPU budget (tried: dev WER stayed above 80 % while training WER fell to 20 %). Each
  utterance jitters the rate and pitch and adds white noise at 15–30 dB SNR; "-other" splits speak
  30 % faster or 25 % slower, at 5–20 dB.
- Deterministic: all randomness is numpy's, from (seed, split). eSpeak NG's output depends on the
  calls made since the library was loaded in the process (its state is not reset by re-initializing),
  so each split is synthesized in a fresh process, utterance after utterance in a fixed order, and the
  timbre variants with a "breath" noise source are left out (their noise differs between processes);
  the same request then gives the same bytes (tests/speech/test_speech_data.py builds twice and compares the
  manifests' SHA-256).
- Cached: the corpus lives in `<cache>/<key>/`, the key a hash of the request and the generator
  version; `manifest.json` (every file's SHA-256) is written last, and the folder is moved into place
  whole, so a half-built corpus is never used and concurrent builders do not collide.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from emarule.engine.cache import build_once, manifest_holds, sha256
from emarule.errors import UserError

VERSION = 2  # bump when the generator's output changes: a new cache key
SAMPLE_RATE = 16000
ESPEAK_RATE = 22050
PARALLEL = 2  # splits synthesized at once

WORDS = (
    "zero one two three four five six seven eight nine ten "
    "red green blue yellow black white orange purple "
    "cat dog bird fish horse mouse apple bread water stone "
    "run jump stop go open close take give find "
    "big small fast slow cold warm "
    "left right up down yes no "
    "don't it's can't"
).split()

VOICES = ("en-us", "en", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-us-nyc")
# Timbre variants; those with a "breath" setting (f2, f3, f5, ...) are left out: their noise source
# does not repeat from one process to the next, so they would break the corpus's determinism.
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f4", "Annie", "anika", "belinda", "linda", "steph",
            "aunty", "Andy", "Lee", "michel", "travis")

# The splits of LibriSpeech, in a fixed order: each one's index seeds its own random stream.
SPLITS = ("train-clean-100", "train-clean-360", "train-other-500", "dev-clean", "dev-other", "test-clean",
          "test-other")


@dataclass(frozen=True)
class CorpusRequest:
    seed: int
    utterances: dict = field(default_factory=dict)  # split → number of utterances
    speakers: int = 8  # per split

    def key(self) -> str:
        blob = json.dumps({"version": VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache() -> Path:
    return Path(os.environ.get("EMARULE_CACHE", Path.home() / ".cache" / "emarule")) / "speech-corpus"


def ensure(request: CorpusRequest, cache: Path | None = None) -> Path:
    """The corpus root for `request`, built on first use (seconds) and reused after."""
    bad = [s for s in request.utterances if s not in SPLITS]
    if bad:
        raise UserError(f"generated corpus: unknown split {bad[0]!r}; use LibriSpeech's names: {', '.join(SPLITS)}")
    cache = Path(cache) if cache is not None else default_cache()
    return build_once(cache / request.key(), lambda tmp: build(request, tmp), lambda root: complete(root, request),
                      "generated corpus: cannot write in {cache} ({reason}); set corpus.dir (--set corpus.dir=PATH) "
                      "or EMARULE_CACHE to a writable folder",
                      "generated corpus: cannot write in {cache} ({reason}); free space (or raise the limit), or set "
                      "corpus.dir (--set corpus.dir=PATH) or EMARULE_CACHE to a folder with room")


def complete(root: Path, request: CorpusRequest) -> bool:
    """Whether `root` holds `request`'s corpus, every file byte for byte as its manifest recorded it. Hashing
    every file costs 0.15 s for the ctc-polyak `cpu` preset's corpus (1,632 files, 41 MB) and 1 s for
    ctc-pseudo-label's (6,164 files, 165 MB), warm page cache: a file cut short by a full disk, or changed
    since, is caught by its hash, and a size check would need sizes the manifests of existing caches lack."""
    return manifest_holds(root, json.loads(json.dumps(asdict(request))), VERSION)


def build(request: CorpusRequest, out: Path) -> dict:
    """Synthesize every requested split into `out`, each in a fresh process (two at a time); returns the manifest."""
    jobs = [[request.seed, split, n, request.speakers, str(out)] for split, n in request.utterances.items() if n > 0]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]) + os.pathsep
           + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    running: list = []
    results = []
    try:
        for job in jobs + [None] * PARALLEL:
            if job is not None:
                try:
                    running.append(subprocess.Popen([sys.executable, "-m", "emarule.speech.corpus", json.dumps(job)],
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                    env=env))
                except OSError as e:  # not a write: no fork or no interpreter
                    raise UserError(f"generated corpus: cannot start a synthesis process ({e.strerror or e}); "
                                    f"free memory or processes and run the same command again") from None
            if len(running) >= PARALLEL or (job is None and running):
                proc = running[0]  # still in `running` while waited on: an interrupt here stops it too
                stdout, stderr = proc.communicate()
                running.pop(0)
                results.append(split_result(proc.returncode, stdout, stderr))
    finally:  # a split that failed stops the others: none may write into the folder once it is removed
        for proc in running:
            proc.kill()
            proc.communicate()
    manifest = {"request": asdict(request), "version": VERSION, "files": {}}
    for files in results:
        manifest["files"].update(files)
    manifest["files"] = dict(sorted(manifest["files"].items()))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


WRITE_FAILED = 3  # a split's exit code when a write failed; its stdout is [errno, strerror, filename]


def split_result(returncode: int, stdout: str, stderr: str) -> dict:
    """A split's files, or its failure: a failed write as the OSError it was (the cache names the folder and
    the fix), anything else as the synthesis failing."""
    if returncode == WRITE_FAILED:
        try:
            code, reason, filename = json.loads(stdout)
        except (ValueError, TypeError):
            code, reason, filename = None, "a write failed", None
        raise OSError(code, reason, filename)
    if returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"generated corpus: synthesis failed ({last}); check that espeakng-loader is "
                        f"installed (pip install espeakng-loader)")
    return json.loads(stdout)


# --- one split, in its own process ---------------------------------------------------------------


class Espeak:
    """libespeak-ng in synchronous mode (no thread of its own): text → int16 samples at 22.05 kHz."""

    def __init__(self):
        import espeakng_loader

        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        rate = self.lib.espeak_Initialize(2, 0, espeakng_loader.get_data_path().encode(), 0)  # synchronous
        if rate != ESPEAK_RATE:
            raise RuntimeError(f"eSpeak NG did not start (returned {rate})")
        self.chunks: list[np.ndarray] = []
        callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)

        def collect(wav, n, events):
            if wav and n > 0:
                self.chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
            return 0

        self._callback = callback_type(collect)  # kept alive as long as the library may call it
        self.lib.espeak_SetSynthCallback(self._callback)

    def say(self, text: str, voice: str, rate: int, pitch: int) -> np.ndarray:
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise RuntimeError(f"eSpeak NG has no voice {voice!r}")
        self.lib.espeak_SetParameter(1, int(rate), 0)  # espeakRATE, words per minute
        self.lib.espeak_SetParameter(3, int(pitch), 0)  # espeakPITCH, 0-100
        self.chunks = []
        data = text.encode() + b"\0"
        self.lib.espeak_Synth(data, ctypes.c_size_t(len(data)), 0, 0, 0, 0, None, None)
        self.lib.espeak_Synchronize()
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int16)


def speakers(seed: int, count: int) -> list[dict]:
    """The corpus's voices: eSpeak voice + variant, speaking rate (words per minute) and pitch, from the seed."""
    rng = np.random.default_rng([seed, 0x5BEA])
    return [{"voice": f"{VOICES[rng.integers(len(VOICES))]}+{VARIANTS[rng.integers(len(VARIANTS))]}",
             "rate": int(rng.integers(140, 190)), "pitch": int(rng.integers(25, 75))} for _ in range(count)]


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Band-limited resampling through the spectrum (the rfft bins up to the new Nyquist frequency)."""
    n_out = int(round(len(x) * rate_out / rate_in))
    spectrum = np.fft.rfft(x)[: n_out // 2 + 1]
    return np.fft.irfft(spectrum, n_out) * (n_out / len(x))


def build_split(job: tuple) -> dict:
    """Synthesize one split; returns {relative path: sha256} of every file written."""
    import soundfile

    seed, split, n, n_speakers, out = job
    index = SPLITS.index(split)
    rng = np.random.default_rng([seed, index])
    other = "other" in split
    voices = speakers(seed, n_speakers)
    engine = Espeak()
    lines: dict[Path, list[str]] = {}
    files = {}
    root = Path(out)
    for u in range(n):
        k = u % n_speakers
        s = voices[k]
        speaker = 100 * (index + 1) + k  # LibriSpeech-style ids: one per split and voice
        words = [WORDS[i] for i in rng.integers(len(WORDS), size=int(rng.integers(1, 6)))]
        # "-other" splits speak faster or slower and are noisier
        tempo = rng.choice([0.75, 1.3]) if other else 1.0
        rate = int(s["rate"] * tempo * rng.uniform(0.9, 1.1))
        pitch = int(np.clip(s["pitch"] + rng.integers(-8, 9), 0, 100))
        pcm = engine.say(" ".join(words), s["voice"], rate, pitch).astype(np.float64) / 32768.0
        wave = resample(pcm, ESPEAK_RATE, SAMPLE_RATE)
        snr_db = rng.uniform(5.0, 20.0) if other else rng.uniform(15.0, 30.0)
        power = float(np.mean(wave**2)) or 1e-8
        wave = wave + rng.standard_normal(len(wave)) * np.sqrt(power / 10 ** (snr_db / 10))
        wave = np.clip(wave * rng.uniform(0.5, 1.0) / (np.abs(wave).max() + 1e-9) * 0.9, -1.0, 1.0)
        folder = root / split / str(speaker) / "1"
        folder.mkdir(parents=True, exist_ok=True)
        uid = f"{speaker}-1-{u:04d}"
        # encoded in memory (the same bytes) and written by Python: a write that fails then says why (errno),
        # where libsndfile says only "System error."
        flac = io.BytesIO()
        soundfile.write(flac, (wave * 32767).round().astype(np.int16), SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        (folder / f"{uid}.flac").write_bytes(flac.getvalue())
        lines.setdefault(folder / f"{speaker}-1.trans.txt", []).append(f"{uid} {' '.join(words).upper()}")
    for path, text in lines.items():
        path.write_text("\n".join(text) + "\n")
    for p in sorted((root / split).rglob("*")):
        if p.is_file():
            files[str(p.relative_to(root))] = sha256(p)
    return files


if __name__ == "__main__":  # one split, in the fresh process `build` starts
    try:
        written = build_split(json.loads(sys.argv[1]))
    except OSError as e:  # disk full, file-size limit, quota: handed to the parent, which names the fix
        if e.errno is None:  # not a failed system call (a library that does not load): synthesis failed
            raise
        print(json.dumps([e.errno, e.strerror or str(e), e.filename]))
        sys.exit(WRITE_FAILED)
    print(json.dumps(written))
