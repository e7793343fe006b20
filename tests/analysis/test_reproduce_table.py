"""The README's table of claims, written from a `make repro` root's verdict.json files."""

import json

import pytest

from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import table as T
from emarule.errors import UserError


def _claim(c: K.Claim, verdict: str, kappa=None, why="") -> dict:
    return {"claim": c.text, "short": c.short, "paper": c.paper, "kind": c.kind, "metric": c.metric,
            "kappa": c.kappa if kappa is None else kappa, "verdict": verdict, "why": why}


def _write(root, name, claims, seeds, wall_s=600.0, runs=30, check="the target model's top1 strays first at κ=4"):
    (root / name).mkdir(parents=True)
    (root / name / "verdict.json").write_text(json.dumps({
        "claims": claims, "seeds": seeds, "timing": {"runs": runs, "reused": 0, "wall_s": wall_s},
        "optimizer_check": {"summary": check}}))


@pytest.fixture
def root(tmp_path):
    c = K.POLYAK.claims
    why = "gap with 1, without 1.1: without < 2× with"
    _write(tmp_path, "polyak", [_claim(c[0], "reproduced"), _claim(c[1], "inconclusive", 2.0, why=why),
                                _claim(c[1], "contradicted", 4.0)], [0, 1, 2, 3, 4])
    _write(tmp_path, "polyak-headline", [_claim(c[0], "contradicted")], [100, 101, 102, 103, 104], 300.0, 15)
    return tmp_path


def test_one_row_per_judged_claim_with_its_headline_check(root):
    md = T.markdown(root, wall=5400)
    lines = md.splitlines()
    assert lines[0] == ("| # | claim (paper) | κ | verdict, seeds 0–4 | measured | the headline claim on new seeds, "
                        "100–104 | page |")
    polyak = [line for line in lines if "polyak-r50.md" in line]
    assert polyak[0] == (f"| 3 | {K.POLYAK.claims[0].short} | 2 | reproduced |  | **contradicted** "
                         f"| [polyak-r50](emarule/experiments/polyak-r50.md) |")
    assert "| 2 | inconclusive (without < 2× with) | gap with 1, without 1.1 | — |" in polyak[1]
    assert "| 4 | **contradicted** |  | — |" in polyak[2]
    # Families without a verdict.json say so rather than borrow a number.
    assert "not run: no " in lines[2] and lines[2].count("parabola") >= 1
    assert "| polyak | 30 | 10.0 min | 5.0 min (15 runs) | the target model's top1 strays first at κ=4 | — |" in md
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
    _write(root, "byol-headline", [_claim(c[0], "inconclusive", 4.0)], [100, 101, 102, 103, 104])
    head = json.loads((root / "byol-headline" / "verdict.json").read_text())
    head["probe_check"] = v["probe_check"]
    (root / "byol-headline" / "verdict.json").write_text(json.dumps(head))
    row = next(line for line in T.markdown(root).splitlines() if "byol-r18.md" in line)
    assert row.endswith("| inconclusive (the probe misses the data bar) "
                        "| [byol-r18](emarule/experiments/byol-r18.md) |")
    v["probe_check"]["bar"] |= {"trained": 47.0, "margin": 15.8, "met": True}
    (root / "byol" / "verdict.json").write_text(json.dumps(v))
    assert "| reproduced |" in T.markdown(root) and "(meets the 15-point bar)" in T.markdown(root)
    head["probe_check"] = v["probe_check"]
    (root / "byol-headline" / "verdict.json").write_text(json.dumps(head))
    row = next(line for line in T.markdown(root).splitlines() if "byol-r18.md" in line)
    assert row.endswith("| inconclusive | [byol-r18](emarule/experiments/byol-r18.md) |")


def test_the_tally_counts_claims_rows_and_agreeing_headlines(root):
    t = T.tally(root)
    # claim 0 decided; claim 1 judged at two κ, one of them inconclusive, so not decided at every κ
    assert t == {"rows": {"reproduced": 1, "contradicted": 1, "inconclusive": 1}, "set_aside": 0, "claims": 2,
                 "decided": 1, "headlines": 1, "headlines_agree": 0}
    assert ("Claims about neural networks: 1 of 2 decided at every κ where they apply; by row, 1 reproduced, "
            "1 contradicted, 1 inconclusive. Headline claims with the same verdict on both seed sets: 0 of 1."
            ) in T.markdown(root)
    v = json.loads((root / "polyak-headline" / "verdict.json").read_text())
    v["claims"][0]["verdict"] = "reproduced"
    (root / "polyak-headline" / "verdict.json").write_text(json.dumps(v))
    assert T.tally(root)["headlines_agree"] == 1


def test_a_claim_is_decided_at_the_kappas_where_it_applies(root):
    """A row set aside (the target strays under an EMA claim) does not count against its claim; a claim
    whose every row is set aside applies nowhere and is not decided."""
    c = K.POLYAK.claims
    aside = {"set_aside": "the target model strays", "verdict_if_target_tracked": "reproduced",
             "why": "the target model strays (with the rule at κ=4: top1 gap 5.91): a claim about the EMA is not "
                    "meaningful where the optimizer rule already fails. Measured: gap with 1: there is no drop"}
    _write(root / "x", "polyak", [_claim(c[0], "reproduced"), _claim(c[1], "contradicted", 2.0),
                                  _claim(c[1], "inconclusive", 4.0) | aside,
                                  _claim(c[2], "inconclusive", 4.0) | {"set_aside": "no EMA gap to explain"}],
           [0, 1, 2, 3, 4])
    t = T.tally(root / "x")
    assert t["claims"] == 3 and t["decided"] == 2 and t["set_aside"] == 2 and t["rows"]["inconclusive"] == 2
    md = T.markdown(root / "x")
    assert "| 4 | inconclusive (set aside: the target model strays) |" in md
    assert "| 4 | inconclusive (set aside: no EMA gap to explain) |" in md
    assert "2 of 3 decided at every κ where they apply" in md and "2 inconclusive (2 of them set aside)" in md


# The shapes of `why` the checks write, with the numbers the "measured" cell must keep whole (README rows 4,
# 7, 8, 9 and 13 once read "pre", "pre, D ∈ {1, 2, 16, 100}", "… κ=1024" and "… (the paper").
WHYS = [
    ("pre: ρ* BELOW ρ_B^κ at every κ ≥ 256 ((1−ρ*)/(1−ρ_B^κ) κ=256: 1.0225, κ=512: 1.0480, κ=1024: 1.1102); post: ρ* "
     "above the rule at every κ ≥ 256",
     "pre: ρ* BELOW ρ_B^κ at every κ ≥ 256 ((1−ρ*)/(1−ρ_B^κ) κ=256: 1.0225, κ=512: 1.0480, κ=1024: 1.1102)"),
    ("pre: Err_rule larger for lower ρ_B (0.9999, 0.999, 0.99) at every κ; post: broken at κ = 64, 128",
     "pre: Err_rule larger for lower ρ_B (0.9999, 0.999, 0.99) at every κ"),
    ("pre, D ∈ {1, 2, 16, 100}: Err_rule differs from D=1 by ≤ 0.03%, 1 − ρ* by ≤ 0.00%",
     "pre, D ∈ {1, 2, 16, 100}: Err_rule differs from D=1 by ≤ 0.03%, 1 − ρ* by ≤ 0.00%"),
    ("pre: Err_no_rule / Err_rule ≥ 6.46 over every ρ_B and κ ≥ 2 (smallest at rho=0.99 κ=1024)",
     "pre: Err_no_rule / Err_rule ≥ 6.46 over every ρ_B and κ ≥ 2 (smallest at rho=0.99 κ=1024)"),
    ("`emarule limits --momentum 0.996 --batch-size 4096`: meaningful for batches 0.0609 … 1.77e+07 (κ up to 4323; "
     "the paper: κ ≈ 4K, B ≈ 8M)",
     "`emarule limits --momentum 0.996 --batch-size 4096`: meaningful for batches 0.0609 … 1.77e+07 (κ up to 4323; "
     "the paper: κ ≈ 4K, B ≈ 8M)"),
    ("Err (max |Δ E ζ|, pre, ρ_B=0.9999, D=1): gap with 8.08e-05, without 0.22, floor Err(ρ*) 4.62e-05: without ≥ "
     "2× with, with ≤ 2× floor", "Err (max \\|Δ E ζ\\|, pre, ρ_B=0.9999, D=1): gap with 8.08e-05, without 0.22, floor "
     "Err(ρ*) 4.62e-05"),
    # a decision with a ": " of its own (`verdict.decide`'s "there is no drop")
    ("gap with 3.54, without 3.05, baseline spread 2.21; paired difference without − with, 95 % CI [-1.18, +0.224]: "
     "without the rule the curve stays within 2× spread, and the paired CI lies inside ±1× spread: there is no drop "
     "for the rule to prevent",
     "gap with 3.54, without 3.05, baseline spread 2.21; paired difference without − with, 95 % CI [-1.18, +0.224]"),
    # numbers with labels of their own (`decide_target`, `decide_with_better`, `decide_ema_above`)
    ("EMA metric: gap with 2.16, spread 3.7; target metric: gap with 6.51 (95 % CI [+5.41, +7.75]), spread 2.08: no "
     "EMA gap with the rule to explain (≤ 2× spread)",
     "EMA metric: gap with 2.16, spread 3.7; target metric: gap with 6.51 (95 % CI [+5.41, +7.75]), spread 2.08"),
    ("with − without at the end κ=2: +0.65 [+0.31, +0.98], κ=4: +0.74 [+0.15, +1.34]; end spread 1.83: better at "
     "every κ (every CI above 0)",
     "with − without at the end κ=2: +0.65 [+0.31, +0.98], κ=4: +0.74 [+0.15, +1.34]; end spread 1.83"),
    ("EMA − target at the end, per baseline seed: +0.0977, -0.0977, +0: mixed",
     "EMA − target at the end, per baseline seed: +0.0977, -0.0977, +0"),
    # numbers that end in a percentage or in a diverged run's inf
    ("max over κ ≤ 256 of |(1 − ρ*)/(1 − ρ_B^κ) − 1| = 2.25%: within 5%",
     "max over κ ≤ 256 of \\|(1 − ρ*)/(1 − ρ_B^κ) − 1\\| = 2.25%"),
    ("gap with inf, without 3.05: the run with the rule diverged", "gap with inf, without 3.05"),
]


@pytest.mark.parametrize("why, measured", WHYS)
def test_the_measured_cell_keeps_every_number_of_a_why(why, measured):
    assert T._measured({"why": why}) == measured


def test_the_measured_cell_is_a_studys_own_numbers_where_it_keeps_them_apart():
    from emarule.analysis.reproduce import studies as S

    r = S.precision_fp32_range()
    assert r["numbers"].endswith("(κ up to 4323; the paper: κ ≈ 4K, B ≈ 8M)") and r["decision"] == ""
    assert T._measured(r) == r["numbers"] == r["why"]
    # an inconclusive row gives the decision as its reason, whatever ": " the numbers hold
    c = {"verdict": "inconclusive", "why": "x: 1: a reason", "numbers": "x: 1: a reason", "decision": "the reason"}
    assert T._measured(c) == "x: 1: a reason" and T._verdict(c) == "inconclusive (the reason)"


def _ledger(folder, *lines):
    (folder / "invocations.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_a_family_whose_latest_invocation_did_not_finish_shows_none_of_the_earlier_verdict(root):
    """docs/reproduce.md: "A family that did not finish gets a row saying so; no number is carried over"."""
    before = T.markdown(root)
    assert "gap with 1, without 1.1" in before
    cmd = "emarule reproduce polyak --out x"
    _ledger(root / "polyak", {"command": cmd, "wall_s": 600.0, "runs": 30, "reused": 0},
            {"command": cmd, "wall_s": 12.0, "runs": 1, "reused": 0, "ended": "KeyboardInterrupt"})
    md = T.markdown(root)
    row = next(line for line in md.splitlines() if "polyak-r50.md" in line)
    assert "did not finish: its last invocation stopped (KeyboardInterrupt)" in row
    assert "gap with 1" not in md and "| polyak | did not finish | — | — | — | — |" in md
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
    assert "| polyak | 30 | 10.0 min | did not finish |" in md and "**contradicted** |" not in row


def _command(root, name, command):
    v = json.loads((root / name / "verdict.json").read_text())
    v["command"] = command
    (root / name / "verdict.json").write_text(json.dumps(v))


def test_rows_made_with_other_arguments_than_make_repros_say_so(root):
    _command(root, "polyak", "emarule reproduce polyak --out runs/reproduce/polyak")
    _command(root, "polyak-headline", "emarule reproduce polyak --headline --seeds 100-104 --out r/polyak-headline")
    real = T.markdown(root)
    assert "made with" not in real
    # the same arguments written otherwise are the same command
    _command(root, "polyak", "emarule reproduce polyak --preset cpu --kappas 4,2,1 --seeds 0-4 --out elsewhere")
    assert T.markdown(root) == real
    _command(root, "polyak", "emarule reproduce polyak --preset tiny --seeds 1 --kappas 1,2 --out /tmp/x")
    md = T.markdown(root)
    mark = "(made with `--preset tiny --seeds 1 --kappas 1,2`, not `make repro`'s arguments)"
    rows = [line for line in md.splitlines() if "polyak-r50.md" in line]
    assert all(mark in r.split(" | ")[3] for r in rows) and f"| polyak {mark} | 30 |" in md
    assert "**contradicted** |" in rows[0]  # the headline check's cell: make repro's
    _command(root, "polyak-headline", "emarule reproduce polyak --headline --out r/polyak-headline")
    assert "**contradicted** (made with `--headline`, not `make repro`'s arguments)" in T.markdown(root)


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
