"""An epoch's last batch in seconds: kept when its padded cost is the budget exactly, dropped when it has room
left (as every run made before kept it), and a batch that no epoch can fill is refused before anything runs."""

from cli_util import invoke, one_line_error
from speech_util import write_tree

from emarule.engine import batching


def epoch(b: batching.Batcher, size: float) -> list[list[int]]:
    pos, out = 0, []
    while (got := b.take(0, pos, size)) is not None:
        out.append(got[0])
        pos += len(got[0])
    return out


def test_a_rest_that_fills_the_budget_exactly_is_a_batch():
    b = batching.Batcher(8, 0, durations=[1.0] * 8)
    batches = epoch(b, 4.0)
    assert [len(x) for x in batches] == [4, 4] and sorted(sum(batches, [])) == list(range(8))
    assert [len(x) for x in epoch(batching.Batcher(8, 0, durations=[0.5] * 8), 4.0)] == [8]


def test_a_rest_with_room_left_is_still_dropped():
    assert [len(x) for x in epoch(batching.Batcher(7, 0, durations=[1.0] * 7), 4.0)] == [4]
    assert [len(x) for x in epoch(batching.Batcher(8, 0, durations=[1.0] * 8), 4.5)] == [4]


def test_a_batch_no_epoch_can_fill_is_refused_before_anything_is_written(tmp_path):
    for split in ("train-clean-100", "dev-clean", "test-clean"):
        write_tree(tmp_path / "ls", split, {(19, 198): [(0.5, "HELLO WORLD")] * 8})
    # 8 × 0.5 s: 4 s of audio, within the training set's seconds, yet the 8 items take less than κB
    res = invoke("run", "ctc-polyak", "--preset", "tiny", "--set", "data.source=librispeech", "--data",
                 tmp_path / "ls", "--batch-size", "4.0000005", "--out", tmp_path / "run")
    one_line_error(res, "never fills", "8 items", "--batch-size")
    assert not (tmp_path / "run").exists()
