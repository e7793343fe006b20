"""`emarule reproduce --judge-only`: a root judged again from its runs' records, its checkpoints gone, training
nothing; and what it refuses."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from emarule.cli.main import app

runner = CliRunner()
ARGS = ["reproduce", "polyak", "--preset", "tiny", "--seeds", "1", "--kappas", "1,2"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A finished tiny polyak reproduction (one seed, κ 1 and 2, its arm): 4 runs."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("root") / "polyak"
    res = runner.invoke(app, [*ARGS, "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _logs(root):
    return {p: p.read_bytes() for p in sorted(root.glob("*/*/metrics.jsonl"))}


def test_a_root_without_its_checkpoints_is_judged_again_from_its_records(root, tmp_path):
    copy = tmp_path / "polyak"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("checkpoint.pt"))
    before = _logs(copy)
    res = runner.invoke(app, [*ARGS, "--out", str(copy), "--judge-only"])
    assert res.exit_code == 0, res.output
    assert "judging the 4 runs in" in res.output and "nothing trains" in res.output
    assert _logs(copy) == before and not list(copy.glob("*/*/checkpoint.pt"))  # nothing trained
    old, new = (json.loads((d / "verdict.json").read_text()) for d in (root, copy))
    fields = ("verdict", "effect", "effect_ci", "mde", "spread", "rule")
    assert [[c.get(f) for f in fields] for c in new["claims"]] == [[c.get(f) for f in fields] for c in old["claims"]]
    last = [json.loads(x) for x in (copy / "invocations.jsonl").read_text().splitlines()][-1]
    assert last["runs"] == 4 and last["reused"] == 4


def test_a_plain_reproduce_judges_runs_kept_as_records_and_trains_only_what_is_missing(root, tmp_path):
    copy = tmp_path / "polyak"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("checkpoint.pt"))
    before = _logs(copy)
    res = runner.invoke(app, [*ARGS, "--out", str(copy)])  # every run kept as its records: none trains
    assert res.exit_code == 0, res.output
    assert "judging the 4 runs in" in res.output and _logs(copy) == before
    gone = next(copy.glob("*/tiny-k2-norule-s0"))
    shutil.rmtree(gone)
    res = runner.invoke(app, [*ARGS, "--out", str(copy)])  # three kept, the fourth trains again
    assert res.exit_code == 0, res.output
    assert "3 of the 4 runs ended before and kept only their records" in " ".join(res.output.split())
    assert {p: b for p, b in _logs(copy).items() if gone not in p.parents} == \
        {p: b for p, b in before.items() if gone not in p.parents}
    assert (gone / "checkpoint.pt").exists() and len(list(copy.glob("*/*/checkpoint.pt"))) == 1
    old, new = (json.loads((d / "verdict.json").read_text()) for d in (root, copy))
    fields = ("verdict", "effect", "effect_ci", "mde", "spread")  # the run trained again is the same run
    assert [[c.get(f) for f in fields] for c in new["claims"]] == [[c.get(f) for f in fields] for c in old["claims"]]


@pytest.mark.parametrize("break_it,said", [
    ("empty", "has no records of 4 of the 4 runs this reproduction reads (tiny-k1-rule-s0, tiny-k2-rule-s0, "
              "tiny-k2-norule-s0, tiny-k2-rule-arm-bn-scale-s0); run it without --judge-only to train them"),
    ("unfinished", "holds unfinished records of 1 of the 4 runs this reproduction reads (tiny-k2-rule-s0); run it "
                   "without --judge-only to finish them"),
])
def test_a_root_that_cannot_be_judged_from_its_records_is_refused_in_one_line(root, tmp_path, break_it, said):
    copy = tmp_path / "polyak"
    if break_it == "empty":
        copy.mkdir()
    else:  # a run killed half-way: its log stops before its planned end, with nothing non-finite in it
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("checkpoint.pt"))
        log = next(copy.glob("*/tiny-k2-rule-s0/metrics.jsonl"))
        rows = log.read_text().splitlines()
        log.write_text("\n".join(rows[: len(rows) // 3]) + "\n")
    verdict = (copy / "verdict.json").read_bytes() if break_it != "empty" else None
    res = runner.invoke(app, [*ARGS, "--out", str(copy), "--judge-only"])
    assert res.exit_code == 2 and said in " ".join(res.output.split()), res.output
    assert res.output.startswith("error: --judge-only: ") and res.output.count("\n") <= 2
    assert ((copy / "verdict.json").read_bytes() if verdict else None) == verdict  # the earlier verdict stands


@pytest.mark.parametrize("args,said", [
    (["reproduce", "parabola", "--judge-only"], "the parabola study computes its claims in one run; drop --judge-only"),
    ([*ARGS, "--judge-only", "--executor", "submitit-local"], "trains nothing, so it submits no job; drop --executor"),
])
def test_judge_only_refuses_what_it_cannot_do(tmp_path, args, said):
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and said in res.output, res.output


def test_a_final_teachers_probe_is_read_from_its_cache_when_the_checkpoint_is_gone(tmp_path):
    from emarule.analysis import offline_probe as P

    cache = {"offline_probe_top1": 47.5, "step": 12, "method": P.METHOD, "seal": "of a checkpoint now gone"}
    (tmp_path / P.CACHE).write_text(json.dumps(cache))
    assert P.offline_probe(tmp_path)["offline_probe_top1"] == 47.5
    (tmp_path / P.CACHE).write_text(json.dumps(cache | {"method": "another fit"}))
    assert P.offline_probe(tmp_path) is None  # not this code's fit: nothing to read


def test_records_made_with_other_settings_are_one_line_for_judge_only_and_for_a_plain_reproduce(root, tmp_path):
    copy = tmp_path / "polyak"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("checkpoint.pt"))
    hp = next(copy.glob("*/tiny-k2-rule-s0/hparams.json"))
    record = json.loads(hp.read_text())
    record["fingerprint"]["spec"]["schedule"]["epochs"] += 1
    hp.write_text(json.dumps(record))
    for extra, fix in ((["--judge-only"], "--judge-only judges a root with the settings it was made with"),
                       ([], "give the sweep a new --out or remove that run")):
        res = runner.invoke(app, [*ARGS, "--out", str(copy), *extra])
        said = " ".join(res.output.split())
        assert res.exit_code == 2 and "was made with other settings (spec.schedule.epochs differ)" in said, said
        assert fix in said and "--resume" not in said and res.output.count("\n") <= 2, said
