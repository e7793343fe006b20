"""`--seeds`: a count, a range or a list (which may hold ranges), one parser for `sweep` and `reproduce`;
bad forms are one line."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from emarule.cli.main import app
from emarule.errors import UserError
from emarule.request.seeds import MAX_SEED, MAX_SEEDS, parse_seeds, seeds_label, seeds_text
from emarule.analysis.sweep import plan_runs

runner = CliRunner()


@pytest.mark.parametrize("text,seeds", [
    ("5", (0, 1, 2, 3, 4)), ("1", (0,)), (" 3 ", (0, 1, 2)), ("100-104", (100, 101, 102, 103, 104)),
    ("7-7", (7,)), ("3,7,11", (3, 7, 11)), ("11, 3", (11, 3)), (f"{MAX_SEED}", None), (f"0-{MAX_SEEDS - 1}", None),
    (f"{MAX_SEED - 1}-{MAX_SEED}", (MAX_SEED - 1, MAX_SEED)),
    ("0-2,100-101", (0, 1, 2, 100, 101)), ("300-302, 7 ,0-1", (300, 301, 302, 7, 0, 1)), ("5-5,9", (5, 9)),
])
def test_the_three_forms(text, seeds):
    if seeds is None and text == f"{MAX_SEED}":  # a count that large is refused, not a seed
        with pytest.raises(UserError, match="at most 100"):
            parse_seeds(text)
        return
    got = parse_seeds(text)
    assert got == (seeds if seeds is not None else tuple(range(MAX_SEEDS)))


@pytest.mark.parametrize("text,needle", [
    ("", "--seeds is empty"),
    ("0", "--seeds must be ≥ 1, got 0"),
    ("-3", "--seeds must be ≥ 1, got -3"),
    ("101", "--seeds 101: at most 100"),
    ("99999999999999999999", "--seeds 99999999999999999999: at most 100"),
    ("3,,7", "an empty item"),
    ("3,7,", "an empty item"),
    ("3,-7", "-7 is not a seed"),
    ("3,x", "'x' is not a whole number"),
    ("1.5", "give a count (--seeds 5), a range (--seeds 100-104) or a list (--seeds 3,7,11 or 0-4,100-104)"),
    ("104-100", "the range 104-100 runs backwards; write it low-high, e.g. --seeds 100-104"),
    ("0-4,9-7", "the range 9-7 runs backwards; write it low-high, e.g. --seeds 7-9"),
    ("0-4,3", "seed 3 is listed twice"),
    ("0-4,2-6", "seed 2 is listed twice"),
    ("0-4,100-", "a range needs both ends"),
    ("0-4,-7-9", "a range needs both ends"),
    ("0-4,x-9", "'x' is not a whole number"),
    ("0-60,100-160", "122 seeds, at most 100"),
    ("100-", "a range needs both ends"),
    ("0-100", "101 seeds, at most 100"),
    (f"3,{MAX_SEED + 1}", f"seed {MAX_SEED + 1} is above {MAX_SEED}"),
    (f"0-{MAX_SEED + 1}", f"is above {MAX_SEED}"),
    ("3,7,3", "seed 3 is listed twice"),
    (",".join(map(str, range(101))), "101 seeds, at most 100"),
])
def test_bad_forms_name_the_problem(text, needle):
    with pytest.raises(UserError) as e:
        parse_seeds(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


@given(st.lists(st.integers(0, MAX_SEED), min_size=1, max_size=MAX_SEEDS, unique=True))
def test_the_written_form_reads_back(seeds):
    assert parse_seeds(seeds_text(seeds)) == tuple(seeds)


def test_short_forms_and_labels():
    assert seeds_text(range(5)) == "5" and seeds_text([100, 101, 102]) == "100-102" and seeds_text([3, 7]) == "3,7"
    assert seeds_label(range(5)) == "0–4" and seeds_label([3, 7, 11]) == "3, 7, 11"
    three_sets = [*range(5), *range(100, 105), *range(300, 305)]
    assert seeds_text(three_sets) == "0-4,100-104,300-304" and seeds_label(three_sets) == "0–4, 100–104, 300–304"
    assert seeds_text([3, 4, 9]) == "3,4,9" and seeds_label([9, 3, 4, 5]) == "9, 3–5"


def test_the_sweep_runs_the_seeds_named():
    runs = plan_runs([1, 2], [None], (100, 102))
    assert [(r.seed, r.kappa, r.baseline) for r in runs] == [(100, 1.0, True), (100, 2.0, False), (102, 1.0, True),
                                                            (102, 2.0, False)]
    assert [r.seed for r in plan_runs([1], [None], 2)] == [0, 1]  # a count still works for callers


@pytest.mark.parametrize("command", [["sweep", "byol-r18", "--preset", "tiny"],
                                     ["reproduce", "byol", "--preset", "tiny"]])
@pytest.mark.parametrize("seeds,needle", [("104-100", "runs backwards"), ("3,3", "listed twice"),
                                          ("3,,4", "an empty item")])
def test_the_cli_refuses_bad_seeds_in_one_line_and_writes_nothing(tmp_path, command, seeds, needle):
    out = tmp_path / "out"
    res = runner.invoke(app, [*command, "--seeds", seeds, "--out", str(out)])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --seeds") and needle in lines[0], res.output
    assert not out.exists()
