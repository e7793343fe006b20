"""Every text shown of a verdict, made from its record (`judge.Verdict`, as verdict.json holds it) in one place:
report.md, the console and the README's table call these, and nothing reads the text back. Torch-free."""

from __future__ import annotations

import math

from emarule.analysis.reproduce import rules as R


def num(v, signed: bool = False) -> str:
    """3 significant digits; ∞ for an infinite value, — for none."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, float) and math.isinf(v):
        return ("+∞" if v > 0 else "−∞") if signed else "∞"
    return f"{v:+.3g}" if signed else f"{v:.3g}"


def interval(ci) -> str:
    """The one format of an interval: [−0.12, +1.3]."""
    if not ci:
        return "—"
    return f"[{num(ci[0], True)}, {num(ci[1], True)}]"


def signed(v, ci) -> str:
    """A signed effect with its interval: +0.52 [+0.12, +0.91]."""
    return f"{num(v, True)} {interval(ci)}"


def kappa(v) -> str:
    return "—" if v is None else f"{float(v):g}"


def mean_sd(st: dict | None) -> str:
    """A mean over seeds with its sd, to one decimal: 46.1 ± 2.3."""
    if not st or st.get("mean") is None:
        return "—"
    return f"{st['mean']:.1f}" + (f" ± {st['std']:.1f}" if st.get("std") is not None else "")


def exact(c: dict) -> bool:
    return c.get("shape") == "exact"


def effect(c: dict) -> str:
    """The effect with its interval (signed, the paper's direction positive), or a study's measured numbers."""
    if exact(c) or c.get("effect") is None:
        return c.get("why") or "—"
    out = signed(c["effect"], c.get("effect_ci"))
    if c.get("shape") in ("equivalence", "noninferior") and c.get("margin") is not None:
        out += f", margin {'±' if c['shape'] == 'equivalence' else '−'}{num(c['margin'])}"
    return out


def mde(c: dict) -> str:
    """The minimum detectable effect at the seeds run, and the spread it is measured against."""
    if exact(c) or c.get("mde") is None:
        return "—"
    return f"{num(c['mde'])} (spread {num(c.get('spread'))})"


def mechanism(m: dict | None) -> str:
    if not m:
        return ""
    return f"{m['name']}: {m.get('what') or num(m.get('value'))}"


def verdict(c: dict, bold: bool = True) -> str:
    """The verdict and what qualifies it: the mechanism a preset lacks or what strays (with what the rules alone
    would have said), a part that fell short, a stand-in κ. Never cut short."""
    v = c.get("verdict") or "—"
    text = f"**{v}**" if bold and v == R.CONTRADICTED else v
    if v == R.NOT_TESTABLE:
        m = c.get("mechanism") or {}
        text += (f" ({m.get('name')} not measured: {m.get('what')})" if m and m.get("present") is None
                 else f" (missing {mechanism(m)})")
    elif v == R.SET_ASIDE:
        text += f" ({c.get('set_aside')}: {c.get('why')})"
    if v in (R.NOT_TESTABLE, R.SET_ASIDE) and c.get("verdict_if_applicable"):
        # what the seeds showed all the same, so that a reader sees it beside the reason it does not count
        text += f"; the rules alone: {c['verdict_if_applicable']}"
    elif v == R.NOT_MEASURED or (v == R.NOT_REPRODUCED and c.get("why") and not exact(c)):
        text += f" ({c.get('why')})"
    elif len(c.get("parts") or []) > 1:
        off = [p for p in c["parts"] if p["verdict"] != v]
        if off:
            text += "; " + "; ".join(f"the part “{p['label']}” is {p['verdict']}" for p in off)
    if v == R.CONTRADICTED:
        why = [w for w in map(_contradicted_by, c.get("parts") or [c]) if w]
        text += f" ({'; '.join(why)})" if why else ""
    if c.get("stand_in"):
        text += f"; a stand-in: {c['stand_in']}"
    return text


def _contradicted_by(p: dict) -> str:
    """How a signed part came to read contradicted (its `route`): the opposite effect, or an absence shown, which a
    reader should see beside the sign the seeds measured."""
    route = p.get("route")
    if p.get("verdict") != R.CONTRADICTED or route not in (R.OPPOSITE, R.ABSENT):
        return ""
    if route == R.OPPOSITE:
        said = ("the opposite ordering (at the ratio the claim states)" if p.get("shape") == "comparative"
                else "the opposite effect")
    else:
        e = p.get("effect")
        side = "on the paper's side" if p.get("shape") == "directional" and e is not None and e > 0 else "measured"
        power = f" (MDE against no effect {num(p['mde_from_zero'])})" if p.get("mde_from_zero") is not None else ""
        said = f"an effect beyond ±{num(p.get('margin'))} shown absent{power}, {num(e, True)} {side}"
    return f"{p['label']}: {said}" if p.get("label") else said


def part_line(p: dict) -> str:
    margin = f", margin {num(p['margin'])}" if p.get("margin") is not None else ""
    zero = p.get("mde_from_zero")
    beyond = f" (against no effect {num(zero)})" if zero is not None and num(zero) != num(p["mde"]) else ""
    return (f"{p['label']} ({p['shape']}, {p['statistic']}): {signed(p['effect'], p['effect_ci'])}, "
            f"MDE {num(p['mde'])}{beyond}{margin}, spread {num(p.get('spread'))}, n = {p['n']}: {p['verdict']} "
            f"({p['rule']})")


def cell(text: str) -> str:
    """A Markdown table cell: pipes escaped, never cut."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def row(*cells) -> str:
    """A Markdown table row of cells already made (`cell` escapes text)."""
    return "| " + " | ".join(map(str, cells)) + " |"


def label(c: dict) -> str:
    """A claim's name in a table: its short form, else its text."""
    return c.get("short") or c["claim"]
