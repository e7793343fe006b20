"""A reproduction's wall time, summed over the invocations of its command."""

import json

from emarule.analysis.reproduce import ledger as L

CMD = "emarule reproduce polyak --out /a/polyak"


def _t(wall, runs=30, reused=0):
    return {"wall_s": wall, "runs": runs, "reused": reused, "load_start": 1.0, "load_end": 2.0, "cpus": 2}


def test_invocations_of_one_command_add_up_and_others_do_not(tmp_path):
    assert L.record(tmp_path, CMD, _t(100.0), "verdict.json") == {"invocations": 1, "wall_s_total": 100.0,
                                                                  "trained": 30}
    L.record(tmp_path, "emarule reproduce polyak --seeds 7 --out /a/polyak", _t(50.0, 6), "verdict.json")
    # The same command with the root moved elsewhere counts; its reused runs are not counted as trained.
    got = L.record(tmp_path, "emarule reproduce polyak --out /b/polyak", _t(20.0, 30, 25), "verdict.json")
    assert got == {"invocations": 2, "wall_s_total": 120.0, "trained": 35}
    # A root whose path has a space is quoted in the command; it is still the same command.
    assert L.record(tmp_path, "emarule reproduce polyak --out '/c d/polyak'", _t(5.0, 30, 30),
                    "verdict.json")["invocations"] == 3
    assert len((tmp_path / L.LEDGER).read_text().splitlines()) == 4


def test_an_earlier_verdict_without_a_ledger_is_its_first_line(tmp_path):
    (tmp_path / "verdict.json").write_text(json.dumps({"command": "emarule reproduce polyak --out x",
                                                       "timing": _t(1200.0)}))
    got = L.record(tmp_path, CMD, _t(30.0, 30, 30), "verdict.json")
    assert got == {"invocations": 2, "wall_s_total": 1230.0, "trained": 30}


def test_a_damaged_ledger_line_is_skipped_not_fatal(tmp_path):
    (tmp_path / L.LEDGER).write_text(json.dumps({"command": CMD, **_t(10.0)}) + "\n{\"command\": \"emar\n")
    assert L.record(tmp_path, CMD, _t(5.0, 30, 30), "verdict.json")["wall_s_total"] == 15.0
