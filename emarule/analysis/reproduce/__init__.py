"""`emarule reproduce FAMILY`: every claim of the paper for one family, checked at CPU scale. Torch-free.

    claims.py      the registry: one `Family` per paper section, its claims quoted with their lines
    command.py     runs (or reuses) what a family needs, then measures and writes
    measure.py     a sweep family's runs read into paired tables, and the optimizer-rule check
    paired.py      curves, each run's signed effect from its own seed's baseline, the baselines' pair spread
    mechanisms.py  whether a preset has the mechanism a claim needs
    judge.py       which signed per-seed effects each claim kind is judged on; the `Verdict` record
    rules.py       the decision rules by claim shape, their power and coverage (`emarule power`)
    studies.py     the parabola's and the precision study's exact checks
    render.py      every text of a verdict, made from its record in one place
    report.py      report.md, verdict.json and the printed table
    table.py       the README's table, the family pages' results blocks and figures, from a `make repro` root
    ledger.py      the wall time of a reproduction, summed over the invocations that built it
    figures.py     the paper-style figure of a sweep family

The final teachers' offline probe, which the self-supervised families read, is `emarule.analysis.offline_probe`.
"""
