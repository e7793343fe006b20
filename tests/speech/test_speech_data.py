"""Speech data: the generated corpus (deterministic, cached, LibriSpeech's layout), the LibriSpeech loader on a
tiny real-layout tree, and the training slots that mix labeled and unlabeled audio."""

import json

import pytest
import torch

from emarule.errors import UserError
from emarule.speech import corpus
from emarule.speech.data import TrainSlots, collate_train, quantile_pairing
from emarule.speech.features import LogMel
from emarule.speech.librispeech import SpeechSet, list_split, read_audio
from speech_util import write_tree


def test_loader_reads_librispeech_layout(tmp_path):
    write_tree(tmp_path / "LibriSpeech", "dev-clean", {(84, 121123): [(0.5, "HE HOPED"), (1.25, "IT'S STUFF")],
                                                      (174, 50561): [(0.75, "A")]})
    utts = list_split(tmp_path, "dev-clean")  # ROOT may hold LibriSpeech/
    assert [u.id for u in utts] == ["174-50561-0000", "84-121123-0000", "84-121123-0001"]
    assert [u.text for u in utts] == ["a", "he hoped", "it's stuff"]
    assert [u.seconds for u in utts] == pytest.approx([0.75, 0.5, 1.25])
    assert read_audio(utts[1].path).shape == (8000,)
    s = SpeechSet(utts, LogMel(), cache=True)
    f = s.features(2)
    assert f.shape == (126, 80) and s.features(2) is f  # cached
    assert s.targets[2][:3] == [3 + 8, 3 + 19, 2]  # i, t, apostrophe


def test_a_process_reads_each_file_once_until_it_is_written_again(tmp_path, monkeypatch):
    """A sweep's worker builds the corpus for each of its runs: the second build takes the headers and the
    features the first computed, equal to computing them afresh, and a file written since is read again."""
    import os

    from emarule.speech import librispeech as L

    monkeypatch.setattr(L, "_HEADERS", {})
    monkeypatch.setattr(L, "_FEATURES", {})
    monkeypatch.setattr(L, "_FEATURES_SECONDS", [0.0])
    write_tree(tmp_path, "dev-clean", {(1, 2): [(0.5, "A"), (0.75, "B")]})
    first = SpeechSet(list_split(tmp_path, "dev-clean"), LogMel(), cache=True)
    f0 = first.features(0)
    reads = []
    monkeypatch.setattr(L, "read_audio", lambda *a, **k: reads.append(a) or read_audio(*a, **k))
    second = SpeechSet(list_split(tmp_path, "dev-clean"), LogMel(), cache=True)
    assert second.features(0) is f0 and not reads  # from the process's memo
    assert torch.equal(f0, LogMel()(read_audio(first.utts[0].path)))  # what computing afresh gives
    assert torch.equal(second.features(1), first.features(1)) and len(reads) == 1
    path = first.utts[0].path
    write_tree(tmp_path, "dev-clean", {(1, 2): [(0.25, "A"), (0.75, "B")]})  # the same names, new audio
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a new identity even within the clock's tick
    third = SpeechSet(list_split(tmp_path, "dev-clean"), LogMel(), cache=True)
    assert third.utts[0].seconds == pytest.approx(0.25) and third.features(0).shape[0] < f0.shape[0]
    unkept = SpeechSet(third.utts, LogMel(), cache=False)  # a large set keeps nothing, here or in the memo
    n = len(L._FEATURES)
    unkept.features(1)
    assert len(L._FEATURES) == n and unkept.cache is None


def test_loader_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="split 'test-other' not found.*nothing is downloaded") as e:
        list_split(tmp_path, "test-other")
    assert f"expected {tmp_path}/test-other/<speaker>/<chapter>/" in str(e.value)  # the split named once
    write_tree(tmp_path, "dev-clean", {(1, 2): [(0.5, "OK")]}, rate=8000)
    with pytest.raises(UserError, match="8000 Hz, expected 16000"):
        list_split(tmp_path, "dev-clean")
    write_tree(tmp_path, "dev-other", {(1, 2): [(0.5, "R2D2")]})
    with pytest.raises(UserError, match="not in the token set"):
        list_split(tmp_path, "dev-other")
    (tmp_path / "test-clean").mkdir()
    with pytest.raises(UserError, match="holds no utterances") as e:
        list_split(tmp_path, "test-clean")
    d = tmp_path / "test-clean"
    assert str(e.value).endswith(f"expected {d}/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac with "
                                 f"<speaker>-<chapter>.trans.txt")  # the split named once, by its folder


def test_generated_corpus_is_deterministic_cached_and_in_librispeech_layout(tmp_path):
    req = corpus.CorpusRequest(seed=3, utterances={"train-clean-100": 6, "dev-other": 4}, speakers=3)
    a = corpus.ensure(req, tmp_path / "a")
    b = corpus.ensure(req, tmp_path / "b")
    ma, mb = (json.loads((r / "manifest.json").read_text()) for r in (a, b))
    assert ma["files"] == mb["files"] and len(ma["files"]) == 6 + 4 + 3 + 3  # audio and trans.txt files
    assert corpus.ensure(req, tmp_path / "a") == a  # cached: the same folder, not rebuilt
    utts = list_split(a, "train-clean-100")
    assert len(utts) == 6 and all(1 <= len(u.text.split()) <= 5 for u in utts)
    assert all(w in corpus.WORDS for u in utts for w in u.text.split())
    assert all(0.1 < u.seconds < 6 for u in utts)
    other = corpus.ensure(corpus.CorpusRequest(seed=4, utterances={"train-clean-100": 6}, speakers=3), tmp_path / "a")
    assert other != a
    assert json.loads((other / "manifest.json").read_text())["files"] != {k: v for k, v in ma["files"].items()
                                                                           if k.startswith("train")}
    with pytest.raises(UserError, match="unknown split 'train-clean-960'"):
        corpus.ensure(corpus.CorpusRequest(seed=0, utterances={"train-clean-960": 1}), tmp_path)


class Fake(SpeechSet):
    def __init__(self, seconds):
        self.utts = [type("U", (), {"seconds": s, "text": f"w{i}"})() for i, s in enumerate(seconds)]
        self.targets = [[3 + i % 26] for i in range(len(seconds))]
        self.cache = {}

    def features(self, i):
        return torch.full((int(self.utts[i].seconds * 100), 80), float(i))


def test_quantile_pairing_matches_durations():
    lab, unl = [1.0, 3.0, 2.0], [2.1, 0.9, 3.2, 1.1, 2.0, 3.0]
    pair = quantile_pairing(lab, unl)
    assert [lab[j] for j in pair] == [2.0, 1.0, 3.0, 1.0, 2.0, 3.0]


def test_train_slots_mix_labeled_and_unlabeled_one_to_three():
    labeled = Fake([1.0, 2.0, 3.0, 1.5])  # 7.5 s
    unlabeled = Fake([1.0, 2.0, 3.0, 1.5] * 6)  # 45 s: labeled repeated twice → 15 : 45
    slots = TrainSlots(labeled, unlabeled, 1, 3)
    assert slots.repeats == 2 and len(slots) == 8 + 24
    lab_s = sum(slots.seconds(i) for i in range(slots.n_labeled))
    unl_s = sum(slots.seconds(i) for i in range(slots.n_labeled, len(slots)))
    assert unl_s / lab_s == pytest.approx(3.0)
    item = slots[9]
    assert item["unlabeled"] and item["main"]["targets"] == [] and item["stand_in"]["targets"]
    assert item["stand_in"]["seconds"] == item["main"]["seconds"]  # durations match: same-rank pairing
    batch = collate_train([slots[0], slots[9], slots[10]])
    assert batch["unlabeled"].tolist() == [False, True, True]
    assert batch["main"]["target_lengths"].tolist() == [1, 0, 0]
    assert batch["stand_in"]["target_lengths"].tolist() == [1, 1, 1]
    assert batch["main"]["feats"].shape[0] == 3 and batch["main"]["frames"].tolist() == [100, 200, 300]
    only = TrainSlots(labeled)
    assert len(only) == 4 and "stand_in" not in collate_train([only[0], only[1]])
