"""A FLAC too short for one feature window (the centred STFT reflects half a window at each end): refused from its
header when the split is listed, before a run folder exists, or skipped and counted in training under
data.skip_bad_items; an evaluation split never skips it."""

import json

import pytest
import torch

from cli_util import invoke, one_line_error
from emarule.engine.baditems import ItemError
from emarule.errors import UserError
from emarule.speech.features import LogMel
from emarule.speech.librispeech import SpeechSet, list_split
from speech_util import write_tree

RATE = 16000
SHORT = 100 / RATE  # 100 samples: half of the 400-sample window is 200
# 2 s batches over 5 s of audio, 6 steps: every training file is read
TINY = ["ctc-polyak", "--preset", "tiny", "--set", "data.source=librispeech", "--set", "data.eval_splits=[dev-clean]",
        "--set", "batch.size=2", "--set", "schedule.total_steps=6", "--set", "eval.every_base_steps=6"]


def tree(root, train_short=False, dev_short=False):
    write_tree(root, "train-clean-100", {(19, 198): [(1.0, "HELLO WORLD"), (SHORT if train_short else 0.7, "A"),
                                                     (1.2, "IT'S A TEST"), (0.8, "OK")],
                                         (26, 495): [(0.9, "THE CAT"), (1.1, "SAT ON A MAT")]})
    write_tree(root, "dev-clean", {(84, 121): [(0.6, "OK"), (SHORT if dev_short else 0.9, "HELLO")]})
    return root


def test_min_samples_is_what_the_featurizer_needs():
    f = LogMel()
    assert f(torch.zeros(f.min_samples)).shape[0] == 2
    with pytest.raises(RuntimeError):
        f(torch.zeros(f.min_samples - 1))


def test_a_short_file_is_refused_from_its_header_or_listed_for_the_loop_to_skip(tmp_path):
    write_tree(tmp_path, "dev-clean", {(1, 2): [(0.5, "A"), (200 / RATE, "B"), (201 / RATE, "C")]})
    need = LogMel().min_samples
    with pytest.raises(UserError) as e:
        list_split(tmp_path, "dev-clean", min_samples=need)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path}/dev-clean/1/2/1-2-0001.flac: 200 samples of audio, fewer than the 201 ")
    assert "remove its line from 1-2.trans.txt" in msg and "skip_bad_items" not in msg  # not a training split
    with pytest.raises(UserError, match="or set data.skip_bad_items: true to skip such training items"):
        list_split(tmp_path, "dev-clean", min_samples=need, skippable=True)
    utts = list_split(tmp_path, "dev-clean")  # listed unchecked: the loop's item error when read
    s = SpeechSet(utts, LogMel(), cache=True)
    assert s.features(2).shape[0] == 2  # 201 samples: one more than half a window is enough
    with pytest.raises(ItemError) as e:
        s.features(1)
    assert e.value.path == str(utts[1].path) and "200 samples of audio" in e.value.why


def test_a_short_training_file_stops_the_run_before_its_folder_or_is_skipped_and_counted(tmp_path):
    data = tree(tmp_path / "ls", train_short=True)
    bad = data / "train-clean-100" / "19" / "198" / "19-198-0001.flac"
    res = invoke("run", *TINY, "--data", data, "--out", tmp_path / "a")
    one_line_error(res, str(bad), "100 samples of audio", "remove its line from 19-198.trans.txt",
                   "data.skip_bad_items")
    assert not (tmp_path / "a").exists()
    res = invoke("run", *TINY, "--data", data, "--out", tmp_path / "b", "--set", "data.skip_bad_items=true")
    assert res.exit_code == 0, res.output
    assert f"warning: skipped {bad} (100 samples of audio" in res.output
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_items"] for r in rows if r["kind"] == "train"][-1] >= 1


def test_a_short_evaluation_file_is_refused_even_when_training_skips(tmp_path):
    data = tree(tmp_path / "ls", dev_short=True)
    bad = data / "dev-clean" / "84" / "121" / "84-121-0001.flac"
    res = invoke("run", *TINY, "--data", data, "--out", tmp_path / "a", "--set", "data.skip_bad_items=true")
    one_line_error(res, str(bad), "100 samples of audio", "remove its line from 84-121.trans.txt")
    assert "skip_bad_items" not in res.output and not (tmp_path / "a").exists()


def test_the_pseudo_label_probe_leaves_out_a_short_unlabeled_file_that_training_skips(tmp_path):
    from emarule.config.load import load_spec
    from emarule.engine.context import RunContext
    from emarule.scaling import plan
    from emarule.tasks import ctc

    data = tree(tmp_path / "ls")
    write_tree(data, "train-clean-360", {(5, 6): [(SHORT, "A"), (1.0, "B C"), (0.9, "D")]})
    spec = load_spec("ctc-pseudo-label", preset="tiny", overrides=[
        "data.source=librispeech", "data.eval_splits=[dev-clean]", "data.unlabeled=[train-clean-360]",
        "data.pl_eval_utterances=2", "data.skip_bad_items=true"])
    ctx = RunContext(spec=spec, kappa=1.0, ema_rule="exponential", plan=plan(spec, 1.0), out=tmp_path / "unused",
                     data=data)
    parts = ctc.build(ctx)
    assert len(parts.train_set.unlabeled) == 3  # training lists it, and skips it when it is read
    probe = parts.evaluations[-1].data.speech
    assert [u.id for u in probe.utts] == ["5-6-0001", "5-6-0002"]
