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
                         f"| [polyak-r50](experiments/polyak-r50.md) |")
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
    assert row.endswith("| inconclusive (the probe misses the data bar) | [byol-r18](experiments/byol-r18.md) |")
    v["probe_check"]["bar"] |= {"trained": 47.0, "margin": 15.8, "met": True}
    (root / "byol" / "verdict.json").write_text(json.dumps(v))
    assert "| reproduced |" in T.markdown(root) and "(meets the 15-point bar)" in T.markdown(root)
    head["probe_check"] = v["probe_check"]
    (root / "byol-headline" / "verdict.json").write_text(json.dumps(head))
    row = next(line for line in T.markdown(root).splitlines() if "byol-r18.md" in line)
    assert row.endswith("| inconclusive | [byol-r18](experiments/byol-r18.md) |")


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
