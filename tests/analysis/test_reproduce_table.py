"""The README's table of claims, written from a `make repro` root's verdict.json files."""

import contextlib
import json
import re

import pytest

from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import report as RP
from emarule.analysis.reproduce import rules as R
from emarule.analysis.reproduce import table as T
from emarule.errors import UserError
from test_reproduce import polyak_runs

NR = R.NOT_REPRODUCED
NUM = r"[+−-](?:[\d.e+−-]+|∞)"
EFFECT_CELL = re.compile(rf"{NUM} \[{NUM}, {NUM}\](?:, margin [±−][\d.e+−-]+)?")


def _claim(c: K.Claim, verdict: str, kappa=None, why="", effect=3.0, ci=(2.5, 3.5), mde=0.4) -> dict:
    return {"claim": c.text, "short": c.short, "paper": c.paper, "kind": c.kind, "metric": c.metric,
            "kappa": c.kappa if kappa is None else kappa, "verdict": verdict, "why": why, "shape": "directional",
            "effect": effect, "effect_ci": list(ci), "mde": mde, "spread": 0.42, "parts": [],
            "route": R.OPPOSITE if verdict == R.CONTRADICTED and ci[1] < 0 else ""}


def _write(root, name, claims, seeds, wall_s=600.0, runs=30, check="the target model's top1 strays first at κ=4"):
    (root / name).mkdir(parents=True)
    (root / name / "verdict.json").write_text(json.dumps({
        "claims": claims, "seeds": seeds, "timing": {"runs": runs, "reused": 0, "wall_s": wall_s},
        "optimizer_check": {"summary": check}}))


@pytest.fixture
def root(tmp_path):
    c = K.POLYAK.claims
    _write(tmp_path, "polyak", [_claim(c[0], R.REPRODUCED), _claim(c[1], NR, 2.0, effect=0.2, ci=(-0.3, 0.7), mde=0.9),
                                _claim(c[1], R.CONTRADICTED, 4.0, effect=-2.0, ci=(-2.5, -1.5))], [0, 1, 2, 3, 4])
    _write(tmp_path, "polyak-headline", [_claim(c[0], "contradicted", effect=-2.0, ci=(-2.5, -1.5))],
           [100, 101, 102, 103, 104], 300.0, 15)
    return tmp_path


def test_the_family_row_gives_the_range_of_its_measured_noise(root):
    """The sd of each part's per-seed effects over that part's spread: 1 and 0.5 here; parts without per-seed
    values (a part whose run stopped), or without a spread, do not count."""
    c = K.POLYAK.claims
    part = {"label": "a part", "shape": "directional", "verdict": R.REPRODUCED, "effect": 2.0, "effect_ci": [1, 3],
            "mde": 1.0, "margin": None, "rule": "CI95 lies above 0", "n": 3}
    parts = [part | {"per_seed": [1.0, 3.0, 2.0], "spread": 1.0}, part | {"per_seed": [0.0, 1.0, 0.5], "spread": 1.0},
             part | {"per_seed": [5.0], "spread": 1.0}, part | {"per_seed": [1.0, 9.0], "spread": None}]
    import shutil

    shutil.rmtree(root / "polyak")
    _write(root, "polyak", [_claim(c[0], R.REPRODUCED) | {"parts": parts}], [0, 1, 2])
    assert T.noise(json.loads((root / "polyak" / "verdict.json").read_text())) == "0.5–1"
    assert "| the target model's top1 strays first at κ=4 | — | 0.5–1 |" in T.markdown(root)
    assert "over the claims' parts: 0.5–1 baseline pair spreads." in T.page_block(root, "polyak")


def test_one_row_per_judged_claim_with_its_headline_check(root):
    md = T.markdown(root, wall=5400)
    lines = md.splitlines()
    assert lines[0] == ("| # | claim (paper) | κ | verdict, seeds 0–4 | effect [95 % CI] | MDE | the headline claim on "
                        "new seeds, 100–104 | page |")
    polyak = [line for line in lines if "polyak-r50.md" in line]
    assert polyak[0] == (f"| 3 | {K.POLYAK.claims[0].short} | 2 | reproduced | +3 [+2.5, +3.5] | 0.4 (spread 0.42) | "
                         f"**contradicted** (the opposite effect) | [polyak-r50](emarule/experiments/polyak-r50.md) |")
    assert f"| 2 | {NR} | +0.2 [-0.3, +0.7] | 0.9 (spread 0.42) | — |" in polyak[1]
    assert "| 4 | **contradicted** (the opposite effect) | -2 [-2.5, -1.5] | 0.4 (spread 0.42) | — |" in polyak[2]
    # Families without a verdict.json say so rather than borrow a number.
    assert "not run: no " in lines[2] and lines[2].count("parabola") >= 1
    assert "| polyak | 30 | 10.0 min | 5.0 min (15 runs) | the target model's top1 strays first at κ=4 | — | — |" in md
    assert md.rstrip().endswith("The reproductions took 15 min of wall time in all, each summed over every invocation "
                                "of its command (the family rows give the count where it was more than one). "
                                "The `make repro` that wrote this table took 90 min.")


def test_a_reproduction_built_over_several_invocations_counts_all_their_time(root):
    t = json.loads((root / "polyak" / "verdict.json").read_text())
    t["timing"] |= {"wall_s_total": 1500.0, "invocations": 2, "trained": 30}
    (root / "polyak" / "verdict.json").write_text(json.dumps(t))
    md = T.markdown(root)
    assert "| polyak | 30 | 25.0 min (2 invocations) | 5.0 min (15 runs) |" in md
    assert "The reproductions took 30 min of wall time in all" in md and "The `make repro`" not in md
    assert T._wall({"wall_s_total": 600.0, "invocations": 2}, "15 runs") == "10.0 min (15 runs, 2 invocations)"


@pytest.mark.parametrize("trained, last_reused, shown", [
    (30, 30, "| polyak | 30 | 25.0 min"),  # the last invocation only re-judged: every run was trained in this root
    (20, 30, "| polyak | 30 (10 reused) | 25.0 min"),  # ten runs no invocation here trained
])
def test_reused_counts_runs_that_no_invocation_trained(root, trained, last_reused, shown):
    t = json.loads((root / "polyak" / "verdict.json").read_text())
    t["timing"] |= {"wall_s_total": 1500.0, "invocations": 2, "trained": trained, "reused": last_reused}
    (root / "polyak" / "verdict.json").write_text(json.dumps(t))
    assert shown in T.markdown(root)


def test_seeds_that_differ_between_families_are_named_in_the_cell(root):
    c = K.DINO.claims
    _write(root, "dino", [_claim(c[0], "reproduced")], [0, 1, 2])
    md = T.markdown(root)
    assert "| verdict | " in md and "| reproduced (seeds 0–2) |" in md and "| reproduced (seeds 0–4) |" in md
    # dino's headline check has no verdict.json: its headline row and family row say so.
    dino = [line for line in md.splitlines() if "dino-vit.md" in line or line.startswith("| dino |")]
    assert "| not run: no dino-headline/verdict.json |" in dino[0]
    assert dino[1].startswith("| dino | 30 | 10.0 min | not run |")


def test_readme_rewritten_between_the_markers_only(root, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# top\n\n{T.START}\nold table\n{T.END}\n\nbelow\n")
    T.write_readme(readme, T.markdown(root))
    text = readme.read_text()
    assert text.startswith(f"# top\n\n{T.START}\n| # |") and text.endswith(f"{T.END}\n\nbelow\n")
    assert "old table" not in text and text.count(T.START) == 1
    readme.write_text("# no markers\n")
    with pytest.raises(UserError, match="no claims-table markers"):
        T.write_readme(readme, "x")
    assert readme.read_text() == "# no markers\n"


def test_bad_root_and_damaged_json_are_one_line_errors(tmp_path, capsys, root):
    assert T.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    (root / "polyak" / "verdict.json").write_text("{half")
    assert T.main([str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid JSON" in err and "polyak" in err


def test_a_probe_verdict_where_the_data_bar_is_missed_says_so(root):
    c = K.BYOL.claims
    _write(root, "byol", [_claim(c[0], "reproduced", 4.0)], [0, 1, 2, 3, 4])
    v = json.loads((root / "byol" / "verdict.json").read_text())
    v["probe_check"] = {"bar": {"trained": 78.8, "init": 88.8, "pixels": 96.9, "margin": -18.1, "required": 15.0,
                                "met": False}}
    (root / "byol" / "verdict.json").write_text(json.dumps(v))
    md = T.markdown(root)
    assert "| reproduced (the probe misses the data bar) |" in md
    assert "trained 78.8, init 88.8, pixels 96.9: margin -18.1 (misses the 15-point bar) |" in md
    # The headline check on new seeds carries its own seeds' bar.
    _write(root, "byol-headline", [_claim(c[0], NR, 4.0)], [100, 101, 102, 103, 104])
    head = json.loads((root / "byol-headline" / "verdict.json").read_text())
    head["probe_check"] = v["probe_check"]
    (root / "byol-headline" / "verdict.json").write_text(json.dumps(head))
    row = next(line for line in T.markdown(root).splitlines() if "byol-r18.md" in line)
    assert row.endswith(f"| {NR} (the probe misses the data bar) "
                        "| [byol-r18](emarule/experiments/byol-r18.md) |")
    v["probe_check"]["bar"] |= {"trained": 47.0, "margin": 15.8, "met": True}
    (root / "byol" / "verdict.json").write_text(json.dumps(v))
    assert "| reproduced |" in T.markdown(root) and "(meets the 15-point bar)" in T.markdown(root)
    head["probe_check"] = v["probe_check"]
    (root / "byol-headline" / "verdict.json").write_text(json.dumps(head))
    row = next(line for line in T.markdown(root).splitlines() if "byol-r18.md" in line)
    assert row.endswith(f"| {NR} | [byol-r18](emarule/experiments/byol-r18.md) |")


def test_the_tally_counts_claims_rows_and_agreeing_headlines(root):
    t = T.tally(root)
    assert t.pop("holm") == {"rows": 3, "missing": 3, "cut": {}}  # these verdict.json files hold no p-values
    # claim 0 decided; claim 1 judged at two κ, one of them not reproduced, so not decided at every κ
    assert t == {"rows": dict.fromkeys(R.ALL_VERDICTS, 0) | {R.REPRODUCED: 1, NR: 1, R.CONTRADICTED: 1},
                 "claims": 2, "decided": 1, "headlines": 1, "headlines_agree": 0}
    assert (f"Claims about neural networks: 1 of 2 decided at every κ where they apply; by row, 1 reproduced, 1 {NR}, "
            f"1 contradicted. Holm's correction over the rows is not applied: 3 of the 3 rows the rules judged hold "
            f"no p-values (verdict.json written before them; judge those reproductions again). Headline claims with "
            f"the same verdict on both seed sets: 0 of 1. {T.SCOPE}"
            ) in T.markdown(root)
    assert "only an opposite effect" in T.SCOPE and "not testable" in T.SCOPE
    v = json.loads((root / "polyak-headline" / "verdict.json").read_text())
    v["claims"][0]["verdict"] = R.REPRODUCED
    (root / "polyak-headline" / "verdict.json").write_text(json.dumps(v))
    assert T.tally(root)["headlines_agree"] == 1


def test_holm_s_correction_over_the_rows_the_rules_judged(root):
    """Four rows judged by the rules, three of polyak's and one of dino's: Holm compares the smallest p-value
    with 0.05/4. polyak's reproduced row at 0.015 does not stand (0.05/3 over polyak's rows alone would keep
    it) and says so in its cell, on the README and on polyak's page; the contradicted row's 0.001 stands. A
    row set aside is no hypothesis of the table, whatever its p-values; a judged row without p-values stops
    the correction, which then says why."""
    v = json.loads((root / "polyak" / "verdict.json").read_text())
    for c, (pr, pc) in zip(v["claims"], ((0.015, 0.9), (0.4, 0.3), (0.8, 0.001)), strict=True):
        c |= {"p_reproduced": pr, "p_contradicted": pc}
    aside = _claim(K.POLYAK.claims[2], R.SET_ASIDE, 4.0) | {"p_reproduced": 1e-6, "p_contradicted": 1.0,
                                                             "set_aside": "the target strays", "why": "w"}
    v["claims"].append(aside)
    (root / "polyak" / "verdict.json").write_text(json.dumps(v))
    dino = _claim(K.DINO.claims[1], NR, effect=0.1, ci=(-0.2, 0.4))
    _write(root, "dino", [dino | {"p_reproduced": 0.5, "p_contradicted": 0.7}], [0, 1, 2, 3, 4])
    h = T.tally(root)["holm"]
    assert (h["rows"], h["missing"], h[R.REPRODUCED], h[R.CONTRADICTED]) == (4, 0, (0, 1), (1, 1))
    md = T.markdown(root)
    row = next(line for line in md.splitlines() if line.startswith("| 3 |"))
    assert "| reproduced; not after Holm's correction over the table's 4 rows (p 0.015) |" in row
    assert "Under Holm's correction over the 4 rows the rules judged (a family-wise error rate of 5 % for each " \
           "verdict), 0 of the 1 reproduced, 1 of the 1 contradicted rows stand." in md
    assert "not after Holm's correction over the table's 4 rows (p 0.015)" in T.page_block(root, "polyak")
    # a judged row without p-values: no row is marked, and the tally says why
    (root / "dino" / "verdict.json").write_text(json.dumps({**json.loads((root / "dino" / "verdict.json")
                                                                         .read_text()), "claims": [dino]}))
    md = T.markdown(root)
    assert "not after Holm" not in md
    assert "Holm's correction over the rows is not applied: 1 of the 4 rows the rules judged hold no p-values" in md


def test_a_claim_is_decided_at_the_kappas_where_it_applies(root):
    """A row set aside (the target strays under an EMA claim) does not count against its claim; a claim
    whose every row is set aside applies nowhere and is not decided. A row not testable or not measured
    leaves its claim undecided."""
    c = K.POLYAK.claims
    why = "with the rule at κ=4: top1 worse by +3 [+2.9, +3.1] against a spread of +0.424"
    aside = {"verdict": R.SET_ASIDE, "set_aside": "the target model strays", "verdict_if_applicable": R.REPRODUCED,
             "why": why}
    absent = {"mechanism": {"name": "m", "what": "w 0.2", "present": False}}
    _write(root / "x", "polyak", [_claim(c[0], R.REPRODUCED), _claim(c[1], R.CONTRADICTED, 2.0),
                                  _claim(c[1], R.REPRODUCED, 4.0) | aside, _claim(c[2], R.REPRODUCED, 4.0) | aside,
                                  _claim(c[3], R.NOT_TESTABLE, 1.0) | absent],
           [0, 1, 2, 3, 4])
    t = T.tally(root / "x")
    assert t["claims"] == 4 and t["decided"] == 2 and t["rows"][R.SET_ASIDE] == 2 and t["rows"][R.NOT_TESTABLE] == 1
    md = T.markdown(root / "x")
    assert f"| 4 | set aside (the target model strays: {why}); the rules alone: reproduced |" in md
    assert "| 1 | not testable at this preset (missing m: w 0.2) |" in md
    assert "2 of 4 decided at every κ where they apply" in md and "2 set aside" in md


def test_every_row_of_a_measured_family_has_one_interval_format_and_nothing_cut(tmp_path):
    """verdict.json as `emarule reproduce polyak` writes it (the target strays with the rule: EMA claims set
    aside; the bn-scale arm not run: not measured), through the README's table."""
    m = M.measure(K.POLYAK, polyak_runs(tmp_path / "runs", ema_with=-3.0, ema_without=-6.0, target_with=-3.0))
    claims = RP.clean(m["claims"])
    assert {c["verdict"] for c in claims} >= {R.SET_ASIDE, R.REPRODUCED, R.NOT_MEASURED}
    long_why = next(c["why"] for c in claims if c["verdict"] == R.SET_ASIDE)
    assert len(long_why) > 60
    _write(tmp_path / "root", "polyak", claims, [0, 1, 2])
    md = T.markdown(tmp_path / "root")
    rows = [line for line in md.splitlines() if "polyak-r50.md" in line]
    assert len(rows) == len(claims)
    for c, row in zip(claims, rows, strict=True):
        cells = row.split(" | ")
        assert not any(x.rstrip(" |").endswith("…") for x in cells), row
        if c["effect"] is not None:
            assert EFFECT_CELL.fullmatch(cells[4]), cells[4]
            assert cells[5].endswith(f"(spread {c['spread']:.3g})")
        else:
            assert cells[4] == c["why"] and cells[5] == "—"
        if c["verdict"] == R.SET_ASIDE:
            assert c["why"] in cells[3]  # the target's numbers, whole
        if c["verdict"] == R.CONTRADICTED:
            assert cells[3].startswith("**contradicted**")
    t = T.tally(tmp_path / "root")
    assert sum(t["rows"].values()) == len(claims)
    assert t["rows"][R.SET_ASIDE] == sum(c["verdict"] == R.SET_ASIDE for c in claims)


def _ledger(folder, *lines):
    (folder / "invocations.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_a_family_whose_latest_invocation_did_not_finish_shows_none_of_the_earlier_verdict(root):
    """docs/reproduce.md: "A family that did not finish gets a row saying so; no number is carried over"."""
    before = T.markdown(root)
    assert "+0.2 [-0.3, +0.7]" in before
    cmd = "emarule reproduce polyak --out x"
    _ledger(root / "polyak", {"command": cmd, "wall_s": 600.0, "runs": 30, "reused": 0},
            {"command": cmd, "wall_s": 12.0, "runs": 1, "reused": 0, "ended": "KeyboardInterrupt"})
    md = T.markdown(root)
    row = next(line for line in md.splitlines() if "polyak-r50.md" in line)
    assert "did not finish: its last invocation stopped (KeyboardInterrupt)" in row
    assert "+0.2 [-0.3, +0.7]" not in md and "| polyak | did not finish | — | — | — | — |" in md
    assert "Claims about neural networks: 0 of 0 decided" in md
    # finished again: its verdict is shown
    _ledger(root / "polyak", {"command": cmd, "wall_s": 12.0, "runs": 1, "reused": 0, "ended": "KeyboardInterrupt"},
            {"command": cmd, "wall_s": 600.0, "runs": 30, "reused": 29})
    assert T.markdown(root) == before
    # a reproduction that holds the root (or was killed outright, leaving its lock file)
    (root / "polyak" / T.LOCK).write_text("{}")
    assert ".emarule.lock is there (a reproduction is running, or was killed)" in T.markdown(root)
    (root / "polyak" / T.LOCK).unlink()
    # a headline check that did not finish says so in its cells
    _ledger(root / "polyak-headline", {"command": cmd, "wall_s": 5.0, "ended": "RuntimeError"})
    md = T.markdown(root)
    row = next(line for line in md.splitlines() if "polyak-r50.md" in line)
    assert "| did not finish: polyak-headline: its last invocation stopped (RuntimeError) |" in row
    assert "| polyak | 30 | 10.0 min | did not finish |" in md and "**contradicted** (the opposite effect) |" not in row


def _made(root, name, **fields):
    v = json.loads((root / name / "verdict.json").read_text())
    v.update(fields)
    (root / name / "verdict.json").write_text(json.dumps(v))


def test_rows_made_with_other_arguments_than_make_repros_say_so(root):
    real = T.markdown(root)
    assert "made with" not in real
    # the same arguments written otherwise are the same
    _made(root, "polyak", preset="cpu", kappas=[4, 2, 1, 0.5])
    assert T.markdown(root) == real
    _made(root, "polyak", preset="tiny", seeds=[1], kappas=[1, 2])
    md = T.markdown(root)
    mark = "(made with preset tiny, κ 1, 2, not `make repro`'s)"
    rows = [line for line in md.splitlines() if "polyak-r50.md" in line]
    assert all(mark in r.split(" | ")[3] for r in rows) and f"| polyak {mark} | 30 |" in md
    assert "**contradicted** (the opposite effect) |" in rows[0]  # the headline check's cell: make repro's
    _made(root, "polyak-headline", kappas=[1, 4])
    assert "**contradicted** (the opposite effect) (made with κ 1, 4, not `make repro`'s)" in T.markdown(root)


@pytest.mark.parametrize("content, says", [
    ("[]", "a JSON list, not an object"),
    ('{"claims": [{"verdict": "reproduced"}]}', 'claim 1 has no "claim" text'),
    ('{"claims": {}}', 'no "claims" list'),
    ('{"claims": [], "timing": [1]}', '"timing" is not a JSON object'),
])
def test_a_verdict_of_the_wrong_shape_is_a_one_line_error(root, capsys, content, says):
    (root / "polyak" / "verdict.json").write_text(content)
    assert T.main([str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "polyak" in err and err.startswith("error: ")


def test_runs_trained_by_an_interrupted_invocation_are_not_reused_after_it_resumes(tmp_path):
    """Interrupted with 3 of 4 runs trained (the third cut short), then resumed: no run was reused."""
    from emarule.analysis.reproduce import ledger as L

    cmd = "emarule reproduce polyak --preset tiny --seeds 1 --kappas 1,2 --out x"
    L.record(tmp_path, cmd, {"wall_s": 40.0, "cpus": 2, "ended": "KeyboardInterrupt", "runs": 3, "reused": 0},
             "verdict.json")
    t = {"wall_s": 47.0, "runs": 4, "reused": 3}  # the resumed invocation finds 3 runs there
    t |= L.record(tmp_path, cmd, t, "verdict.json")
    assert t["trained"] == 4 and T._reused(t) == 0


@pytest.mark.parametrize("args,needle", [
    (["--readme", "{tmp}/missing.md"], "--readme"),
    (["--readme", "{tmp}"], "no such file"),
    (["--wall-s", "abc"], "invalid float value"),
    (["--wall-s", "nan"], "--wall-s must be a finite number"),
    (["--wall-s", "-5"], "--wall-s must be a finite number"),
    (["--pages", "{tmp}/nowhere"], "no such folder"),
])
def test_the_tables_bad_options_are_one_line_and_write_nothing(tmp_path, capsys, root, args, needle):
    readme = tmp_path / "README.md"
    readme.write_text(f"{T.START}\nold\n{T.END}\n")
    argv = [str(root)] + [a.format(tmp=tmp_path) for a in args] + (["--readme", str(readme)] if "--readme" not in
                                                                     args else [])
    with pytest.raises(SystemExit) if "invalid" in needle else contextlib.nullcontext():
        assert T.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err
    assert readme.read_text() == f"{T.START}\nold\n{T.END}\n"


def test_a_missing_root_argument_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        T.main([])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "required: root" in err
