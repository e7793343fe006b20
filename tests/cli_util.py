"""What the fault tests share: a command through Typer's runner, a directory's snapshot, and the check that a
refusal is one line."""

from pathlib import Path

from typer.testing import CliRunner

from emarule.cli.main import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def snapshot(root: Path) -> dict:
    """Every path under root with its bytes: a file created, removed or changed shows up."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def refused_in_one_line(argv: list, capsys, needle: str) -> str:
    """`main(argv)` ends on exit code 2 with one `error:` line on stderr holding `needle`, nothing on stdout and
    no traceback; the line."""
    import pytest

    from emarule.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2, (out, err)
    assert "Traceback" not in err and out == "", (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], lines[0]
    return lines[0]


def one_line_error(res, *words):
    """Exit code 2, one `error:` line holding every one of `words`, no traceback."""
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (res.output, res.exception)
    assert "Traceback" not in res.output and all(w in lines[0] for w in words), lines[0]
    return lines[0]
