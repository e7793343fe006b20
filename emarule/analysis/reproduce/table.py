"""The README's table of claims, written from the verdict.json files of one `make repro`.

    python -m emarule.analysis.reproduce.table ROOT [--readme README.md] [--pages DIR] [--figures DIR]
                                                    [--wall-s SECONDS]

ROOT holds `<family>/verdict.json` (`emarule reproduce FAMILY`, every claim on the default seeds) and
`<family>-headline/verdict.json` (`emarule reproduce FAMILY --headline --seeds 100-104`, the headline claim on
seeds no preset was tuned on). One row per judged claim (an "up to κ" claim once per κ), in the order of
`claims.FAMILIES`, then one row per family with its runs and wall times. --readme replaces the text between
START and END (else the table is printed); --pages DIR writes each training family's rows into
DIR/<experiment>.md between PAGE_START and PAGE_END; --figures DIR copies the README's FIGURES from ROOT.
The table never borrows a number from another run: a family with no verdict.json, or whose latest invocation
did not finish (its ledger, `ledger.LEDGER`, ends with a line that `ended`, or its lock file is still there),
gets a row that says so, as its verdict.json is an earlier invocation's. A reproduction made with other
arguments than `make repro`'s (`--preset tiny`, other κ, other seeds) has them named in each of its rows.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from emarule.analysis.reproduce import ledger
from emarule.analysis.reproduce import render as T
from emarule.analysis.reproduce import rules as R
from emarule.analysis.reproduce.claims import FAMILIES, PROBES, Family
from emarule.engine.rundir import atomic_write_text
from emarule.engine.runlock import LOCK  # there while a reproduction holds its root
from emarule.errors import UserError
from emarule.request.seeds import seeds_label

START = "<!-- claims table: written by `make repro` (python -m emarule.analysis.reproduce.table) -->"
END = "<!-- end of claims table -->"
HEADLINE = "-headline"  # ROOT/<family><HEADLINE>: the headline claim on new seeds
NEW_SEEDS = tuple(range(100, 105))  # the Makefile's REPRO_SEEDS_NEW: the headline checks' seeds


def _load(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: not valid JSON ({e}); run that reproduction again") from None
    if problem := _shape(data):
        raise UserError(f"{path}: not a reproduction's verdict.json ({problem}); run that reproduction again")
    return data


def _shape(data) -> str:
    """What is wrong with a verdict.json's shape for this table ("" when nothing is)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    if not isinstance(data.get("claims"), list):
        return 'no "claims" list'
    for i, c in enumerate(data["claims"]):
        if not isinstance(c, dict) or not isinstance(c.get("claim"), str):
            return f'claim {i + 1} has no "claim" text'
        if c.get("kappa") is not None and (isinstance(c["kappa"], bool) or not isinstance(c["kappa"], (int, float))):
            return f'claim {i + 1}\'s "kappa" is not a number'
    for k, kinds, said in (("timing", dict, "object"), ("optimizer_check", dict, "object"),
                           ("probe_check", dict, "object"), ("seeds", list, "list"), ("command", str, "string")):
        if data.get(k) is not None and not isinstance(data[k], kinds):
            return f'"{k}" is not a JSON {said}'
    return ""


@dataclass
class Root:
    """One reproduction's folder as the table reads it: its verdict.json, unless its latest invocation did
    not finish (`unfinished` says how), and how its arguments differ from `make repro`'s (`other_args`)."""

    verdict: dict | None
    unfinished: str = ""
    other_args: str = ""


def _unfinished(folder: Path) -> str:
    """Why the latest invocation in FOLDER did not finish ("" if it did, or none ran)."""
    if (folder / LOCK).exists():
        return f"{folder.name}/{LOCK} is there (a reproduction is running, or was killed)"
    lines = ledger.entries(folder / ledger.LEDGER)
    if lines and lines[-1].get("ended"):
        return f"its last invocation stopped ({lines[-1]['ended']})"
    return ""


def _other_args(family: Family, verdict: dict, headline: bool) -> str:
    """The preset and κ the verdict was made with, where they differ from `make repro`'s (its seeds are named in
    the verdict's cell)."""
    made = ledger.of_verdict(family.name, verdict, headline)
    wanted = ledger.resolved(family.name, seeds=NEW_SEEDS if headline else None, headline=headline)
    if made is None or wanted is None:
        return ""
    differ = [f"preset {made['preset']}"] if made["preset"] != wanted["preset"] else []
    if made["kappas"] != wanted["kappas"]:
        differ.append("κ " + ", ".join(f"{k:g}" for k in made["kappas"]))
    return ", ".join(differ)


def _root(folder: Path, family: Family, headline: bool = False) -> Root:
    verdict = _load(folder / "verdict.json")
    unfinished = _unfinished(folder) if folder.is_dir() else ""
    if verdict is None:
        return Root(None, unfinished)
    return Root(None if unfinished else verdict, unfinished, _other_args(family, verdict, headline))


def _seeds(seeds) -> str:
    return seeds_label(tuple(seeds)) if seeds else "—"


def _same_claim(a: dict, b: dict) -> bool:
    return a.get("short") == b.get("short") and a.get("kappa") == b.get("kappa") and a.get("claim") == b.get("claim")


def reproductions(root: Path) -> list[tuple[str, Family, Root, Root | None]]:
    """(name, family, its reproduction, its headline check's) for every family, in order."""
    return [(name, family, _root(root / name, family),
             _root(root / f"{name}{HEADLINE}", family, True) if family.kind == "sweep" else None)
            for name, family in FAMILIES.items()]


def _made_with(r: Root) -> str:
    """What a row adds where its reproduction ran with other arguments than `make repro`'s."""
    return f" (made with {r.other_args}, not `make repro`'s)" if r.other_args else ""


def holm(loaded: list) -> dict:
    """Holm's correction over every row of the training families that the rules judged (reproduced, not
    reproduced at this preset, contradicted; not the rows set aside, not testable or not measured), at a
    family-wise error rate of 5 % for each of "reproduced" and "contradicted" (`rules.holm`). The rows share
    runs, which Holm's correction allows. Where a judged row has no p-values (a verdict.json written before
    them) nothing is corrected, as leaving its rows out would divide by too few: `missing` counts them."""
    judged = [(name, i, c) for name, family, r_main, _ in loaded if family.kind == "sweep" and r_main.verdict
              for i, c in enumerate(r_main.verdict["claims"]) if c.get("verdict") in R.VERDICTS]
    missing = sum(1 for *_, c in judged if c.get("p_reproduced") is None or c.get("p_contradicted") is None)
    out = {"rows": len(judged), "missing": missing, "cut": {}}
    if missing:
        return out
    for verdict, key in ((R.REPRODUCED, "p_reproduced"), (R.CONTRADICTED, "p_contradicted")):
        stands = R.holm([c[key] for _, _, c in judged])
        mine = [(name, i, c, ok) for (name, i, c), ok in zip(judged, stands, strict=True) if c["verdict"] == verdict]
        out[verdict] = (sum(ok for *_, ok in mine), len(mine))
        out["cut"] |= {(name, i): c[key] for name, i, c, ok in mine if not ok}
    return out


def _holm_note(h: dict, name: str, i: int) -> str:
    """What a verdict cell adds where its row's verdict does not stand Holm's correction over the table."""
    p = h["cut"].get((name, i))
    return "" if p is None else f"; not after Holm's correction over the table's {h['rows']} rows (p {p:.2g})"


def rows(root: Path, loaded: list | None = None, h: dict | None = None) -> tuple[list[list[str]], list[list[str]],
                                                                                 set, set]:
    """(claim rows, family rows, the seed labels of the full reproductions, those of the headline checks);
    a verdict cell is (verdict, seeds), its seeds named only where the families' seeds differ (`markdown`).
    `h`: Holm's correction (`holm`) over the whole table, where `loaded` holds only part of it."""
    claims, runs, seen, seen_new = [], [], set(), set()
    loaded = loaded if loaded is not None else reproductions(root)
    h = h if h is not None else holm(loaded)
    for name, family, r_main, r_new in loaded:
        main, new = r_main.verdict, r_new.verdict if r_new is not None else None
        page = f"[{family.experiment}](emarule/experiments/{family.experiment}.md)"
        if main is None:
            why = (f"did not finish: {r_main.unfinished}; no verdict of an earlier invocation is shown"
                   if r_main.unfinished else f"not run: no {name}/verdict.json")
            claims.append([f"{family.section}: every claim of the family", "—", why, "—", "—", "—", page])
            runs.append([name, "did not finish" if r_main.unfinished else "—", "—", "—", "—", "—", "—"])
            continue
        bar, bar_new = _bar(main), _bar(new or {})
        # the headline's row, its check not run: the first row of the headline claim (an "up to κ" claim has one
        # row per κ, so the claim's index is not its row's)
        top = family.claims[family.headline] if family.kind == "sweep" and family.claims else None
        unchecked = next((i for i, c in enumerate(main["claims"]) if top is not None and c.get("claim") == top.text
                          and c.get("short") == top.short), None) if new is None else None
        for i, c in enumerate(main["claims"]):
            head = "—"
            if i == unchecked:
                head = (f"did not finish: {name}{HEADLINE}: {r_new.unfinished}" if r_new and r_new.unfinished
                        else f"not run: no {name}{HEADLINE}/verdict.json")
            elif new is not None:
                match = [h for h in new["claims"] if _same_claim(h, c)]
                if match:
                    seen_new.add(_seeds(new.get("seeds")))
                    head = (T.cell(T.verdict(match[0])) + _caveat(match[0], bar_new) + _made_with(r_new),
                            _seeds(new.get("seeds")))
            if main.get("seeds"):
                seen.add(_seeds(main["seeds"]))
            verdict = T.cell(T.verdict(c)) + _holm_note(h, name, i) + _caveat(c, bar) + _made_with(r_main)
            claims.append([T.cell(T.label(c)), T.kappa(c.get("kappa")),
                           (verdict, _seeds(main.get("seeds"))), T.cell(T.effect(c)), T.cell(T.mde(c)), head, page])
        t = main.get("timing") or {}
        reused = f" ({_reused(t)} reused)" if _reused(t) else ""
        runs.append([name + _made_with(r_main), f"{t.get('runs', '—')}{reused}", _wall(t),
                     _headline_time(family, r_new), (main.get("optimizer_check") or {}).get("summary", "—"),
                     bar["text"], noise(main)])
    return claims, runs, seen, seen_new


def noise(verdict: dict) -> str:
    """The range, over every part of every claim, of the sd of a per-seed effect in baseline pair spreads: the
    noise the rules' error rates must hold at (`emarule power --noise`; docs/reproduce.md)."""
    out = []
    for c in verdict.get("claims") or []:
        for p in c.get("parts") or []:
            v = [x for x in p.get("per_seed") or [] if isinstance(x, (int, float)) and math.isfinite(x)]
            spread = p.get("spread")
            if len(v) > 1 and isinstance(spread, (int, float)) and spread > 0:
                out.append(R.summarize(v).sd / spread)
    return f"{min(out):.2g}–{max(out):.2g}" if out else "—"


def _reused(timing: dict) -> int:
    """Runs no invocation in this root trained: a later invocation that only re-judged (and reused every
    run) does not make the runs earlier ones trained count as reused, nor does one that resumed an
    interrupted invocation, whose ledger line counts the runs it trained (`ledger`; an interrupted line
    without run counts leaves its runs counted as reused)."""
    if "trained" in timing and "runs" in timing:
        return max(0, int(timing["runs"]) - int(timing["trained"]))
    return int(timing.get("reused") or 0)


def _headline_time(family, r_new: Root | None) -> str:
    """The family row's headline-check cell: its wall time and runs, or why there is none."""
    if r_new is not None and r_new.verdict is not None:
        t = r_new.verdict.get("timing") or {}
        return _wall(t, f"{t.get('runs')} runs" if t else "") + _made_with(r_new)
    if r_new is not None and r_new.unfinished:
        return "did not finish"
    return "not run" if family.kind == "sweep" else "—"


# A verdict on a probe (the tracking one, or the final teachers' converged one) where the data bar is missed
# (the baselines' trained teachers, probed to convergence, must beat the better of the teachers at
# initialization and the raw pixels by the bar's points, offline_probe.BAR): the probe does not read enough of
# what the teacher learned there, so the verdict is shown with that caveat.
BAR_MISSED = " (the probe misses the data bar)"


def _caveat(claim: dict, bar: dict) -> str:
    """BAR_MISSED where a verdict on a probe rests on seeds whose own probe check missed the data bar."""
    return BAR_MISSED if claim.get("metric") in PROBES and not bar["met"] else ""


def _bar(verdict: dict) -> dict:
    """The self-supervised data bar of the reproduction's probe check: the trained teachers' converged
    probe against the better of the teachers at initialization and the raw pixels."""
    b = (verdict.get("probe_check") or {}).get("bar")
    if not b:
        return {"met": True, "text": "—"}
    text = (f"trained {b['trained']:.1f}, init {b['init']:.1f}, pixels {b['pixels']:.1f}: margin {b['margin']:+.1f} "
            f"({'meets' if b['met'] else 'misses'} the {b['required']:g}-point bar)")
    return {"met": bool(b["met"]), "text": text}


def wall_s(timing: dict) -> float | None:
    """A reproduction's wall time: summed over the invocations of its command (`ledger.record`)."""
    return timing.get("wall_s_total", timing.get("wall_s"))


def _wall(timing: dict, runs: str = "") -> str:
    """Minutes, with `runs` and the invocations' count in one parenthesis where there are any."""
    n, s = timing.get("invocations") or 1, wall_s(timing)
    said = ", ".join(x for x in (runs, f"{n} invocations" if n > 1 else "") if x)
    return ("—" if s is None else f"{float(s) / 60:.1f} min") + (f" ({said})" if said else "")


# What the table can say: one sentence under the tally.
SCOPE = ("At CPU scale a verdict says whether this preset shows the paper's effect, not whether the paper holds at "
         "its own scale: \"not reproduced\" and \"not testable\" leave the paper's claim open, and only an opposite "
         "effect, a \"matches\" wholly beyond its margin, or an absence shown against a size the paper states, reads "
         "\"contradicted\".")


def tally(root: Path, loaded: list | None = None, correction: dict | None = None) -> dict:
    """The claims about neural networks (the sweep families'), by row and by claim. A claim judged at several
    κ ("up to κ") is one claim with several rows; a claim is decided when every row where it applies (every
    row not set aside) is reproduced or contradicted, and at least one row applies. Headlines agree when the
    family's headline claim gets the same verdict on both seed sets (at the κ the headline check judged).
    `correction`: Holm's correction (`holm`) where the caller has it already."""
    rows_n = dict.fromkeys(R.ALL_VERDICTS, 0)
    by_claim: dict = {}
    agree, checked = 0, 0
    loaded = loaded if loaded is not None else reproductions(root)
    for name, family, r_main, r_new in loaded:
        main, new = r_main.verdict, r_new.verdict if r_new is not None else None
        if family.kind != "sweep" or main is None:
            continue
        for c in main["claims"]:
            v = c.get("verdict")
            rows_n[v if v in rows_n else R.NOT_MEASURED] += 1
            applies = by_claim.setdefault((name, c.get("claim"), c.get("short")), [])
            if v != R.SET_ASIDE:
                applies.append(v)
        match = [c for c in main["claims"] if _same_claim(new["claims"][0], c)] if new and new.get("claims") else []
        if match:
            checked += 1
            agree += match[0].get("verdict") == new["claims"][0].get("verdict")
    decided = sum(1 for vs in by_claim.values() if vs and all(v in (R.REPRODUCED, R.CONTRADICTED) for v in vs))
    return {"rows": rows_n, "claims": len(by_claim), "decided": decided, "headlines": checked,
            "headlines_agree": agree, "holm": correction if correction is not None else holm(loaded)}


def tally_line(t: dict) -> str:
    by_row = ", ".join(f"{n} {v}" for v, n in t["rows"].items() if n)
    h = t.get("holm") or {}
    stand = ", ".join(f"{h[v][0]} of the {h[v][1]} {v}" for v in (R.REPRODUCED, R.CONTRADICTED) if h.get(v, (0, 0))[1])
    corrected = (f" Under Holm's correction over the {h['rows']} rows the rules judged (a family-wise error rate of "
                 f"5 % for each verdict), {stand} rows stand." if stand else "")
    if h.get("missing"):
        corrected = (f" Holm's correction over the rows is not applied: {h['missing']} of the {h['rows']} rows the "
                     f"rules judged hold no p-values (verdict.json written before them; judge those reproductions "
                     f"again).")
    return (f"Claims about neural networks: {t['decided']} of {t['claims']} decided at every κ where they apply; by "
            f"row, {by_row or 'none'}.{corrected} Headline claims with the same verdict on both seed sets: "
            f"{t['headlines_agree']} of {t['headlines']}. {SCOPE}")


def _with_seeds(v, named: bool = True) -> str:
    """A `rows` verdict cell as text: (verdict, seeds) with its seeds where `named`; any other cell as it is."""
    if not isinstance(v, tuple):
        return v
    verdict, seeds = v
    return f"{verdict} (seeds {seeds})" if named else verdict


def markdown(root: Path, wall: float | None = None) -> str:
    loaded = reproductions(root)
    h = holm(loaded)
    claims, runs, seen, seen_new = rows(root, loaded, h)
    one, one_new = len(seen) == 1, len(seen_new) == 1

    def cell(v, common: bool) -> str:
        return _with_seeds(v, not common and v[1] != "—") if isinstance(v, tuple) else v

    head = "verdict" + (f", seeds {next(iter(seen))}" if one else "")
    head_new = "the headline claim on new seeds" + (f", {next(iter(seen_new))}" if one_new else "")
    out = [f"| # | claim (paper) | κ | {head} | effect [95 % CI] | MDE | {head_new} | page |",
           "|---:|---|---|---|---|---|---|---|"]
    out += [T.row(i, *r[:2], cell(r[2], one), *r[3:5], cell(r[5], one_new), r[6])
            for i, r in enumerate(claims, 1)]
    out += ["", "| family | runs | wall time | headline check | the optimizer-rule check | the probe's data bar | "
            "noise (spreads) |", "|---|---:|---:|---:|---|---|---:|"]
    out += [T.row(*r) for r in runs]
    total = sum(wall_s((r.verdict or {}).get("timing") or {}) or 0.0
                for _, _, main, new in loaded for r in (main, new) if r is not None)
    out += ["", tally_line(tally(root, loaded, h))]
    out += ["", f"The reproductions took {total / 60:.0f} min of wall time in all, each summed over "
            f"every invocation of its command (the family rows give the count where it was more than one)."
            + (f" The `make repro` that wrote this table took {float(wall) / 60:.0f} min." if wall is not None else "")]
    return "\n".join(out) + "\n"


PAGE_START = "<!-- results: written by make repro (python -m emarule.analysis.reproduce.table --pages) -->"
PAGE_END = "<!-- end of results -->"
# The README's figures, from the same root: polyak's Fig. 2, a BYOL figure, ctc-polyak's Fig. 3.
FIGURES = ("polyak", "byol", "ctc-polyak")


def page_block(root: Path, name: str, loaded: list | None = None, h: dict | None = None) -> str:
    """One family's rows of the table (claim, κ, verdict on both seed sets, effect, MDE) and its run row. `h`:
    Holm's correction over the whole table (`holm`), computed from `loaded` where not given."""
    loaded = loaded if loaded is not None else reproductions(root)
    claims, runs, _, _ = rows(root, [x for x in loaded if x[0] == name], h if h is not None else holm(loaded))
    out = ["| claim (paper) | κ | verdict | effect [95 % CI] | MDE | the headline claim on new seeds |",
           "|---|---|---|---|---|---|"]
    out += [T.row(*r[:2], _with_seeds(r[2]), *r[3:5], _with_seeds(r[5])) for r in claims]
    run = runs[0]
    out += ["", f"Runs: {run[1]}; wall time {run[2]}; the headline check {run[3]}. The optimizer-rule check: {run[4]}."]
    if run[5] != "—":
        out.append(f"The probe's data bar: {run[5]}.")
    if run[6] != "—":
        out.append(f"The sd of a per-seed effect, over the claims' parts: {run[6]} baseline pair spreads.")
    return "\n".join(out) + "\n"


def _between(path: Path, text: str, start: str, end: str, block: str) -> None:
    """PATH, whose TEXT the caller has read and found both markers in, with the text between START and END
    replaced by BLOCK (under a temporary name, then renamed)."""
    head, rest = text.split(start, 1)
    atomic_write_text(path, f"{head}{start}\n{block}{end}{rest.split(end, 1)[1]}")


def write_pages(root: Path, folder: Path) -> list[Path]:
    """Each training family's block in its page (`folder/<experiment>.md`); pages without markers are left."""
    loaded, written = reproductions(root), []
    h = holm(loaded)
    for name, family, _, _ in loaded:
        page = folder / f"{family.experiment}.md"
        text = page.read_text() if family.kind == "sweep" and page.is_file() else ""
        if PAGE_START in text and PAGE_END in text:
            _between(page, text, PAGE_START, PAGE_END, page_block(root, name, loaded, h))
            written.append(page)
    return written


def copy_figures(root: Path, folder: Path) -> list[Path]:
    """The README's figures from the root (each family's `figures/<family>.png`), those that exist."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in FIGURES:
        src = root / name / "figures" / f"{name}.png"
        if src.is_file():
            tmp = folder / f".{name}.png.tmp"
            shutil.copyfile(src, tmp)
            tmp.replace(folder / f"{name}.png")
            out.append(folder / f"{name}.png")
    return out


def write_readme(readme: Path, table: str) -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        raise UserError(f"{readme}: no claims-table markers; put the lines {START!r} and {END!r} where the "
                        f"table goes")
    _between(readme, text, START, END, table)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit code 2, as every emarule command, not the usage text
        print(f"error: {message}; see --help", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m emarule.analysis.reproduce.table", description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    for flag in ("--readme", "--pages", "--figures"):
        ap.add_argument(flag, type=Path)
    ap.add_argument("--wall-s", type=float)
    a = ap.parse_args(argv)
    try:
        if not a.root.is_dir():
            raise UserError(f"{a.root}: no such folder; `make repro` writes runs/reproduce")
        if a.wall_s is not None and not 0 <= a.wall_s < math.inf:
            raise UserError(f"--wall-s must be a finite number of seconds ≥ 0, got {a.wall_s:g}")
        if a.readme is not None and not a.readme.is_file():
            raise UserError(f"--readme {a.readme}: no such file; give the README that holds the table's markers")
        for folder in (a.pages, a.figures):
            if folder is not None and not folder.is_dir():
                raise UserError(f"{folder}: no such folder")
        table = markdown(a.root, a.wall_s)
        if a.readme is not None:
            write_readme(a.readme, table)
        else:
            sys.stdout.write(table)
        if a.pages is not None:
            write_pages(a.root, a.pages)
        if a.figures is not None:
            copy_figures(a.root, a.figures)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
