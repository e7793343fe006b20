"""The documentation's shape: a README a newcomer reads in minutes, and one page beside every experiment spec."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "emarule" / "experiments").glob("*.yaml"))


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350


def test_every_spec_has_its_page_with_the_recipe_presets_results_and_full_scale():
    assert len(SPECS) == 9
    for spec in SPECS:
        page = spec.with_suffix(".md")
        assert page.exists(), f"{spec.name} has no page {page.name}"
        headings = re.findall(r"^#+ (.*)$", page.read_text(), re.M)
        assert any("Full scale" in h for h in headings), page.name
        if spec.stem in ("byol-vit", "byol-r50-lars", "ctc-pseudo-label"):  # share their family's page
            continue
        for part in ("recipe", "Presets", "Measured"):
            assert any(part.lower() in h.lower() for h in headings), f"{page.name} has no section on {part}"


def test_the_readme_links_every_page_and_answers_the_four_where_questions():
    text = (ROOT / "README.md").read_text()
    for spec in SPECS:
        assert f"emarule/experiments/{spec.stem}.md" in text
    layout = text[text.index("## Layout"):]
    for path in ("engine/schedules.py", "registry/__init__.py", "engine/clock.py", "experiments/<name>.yaml"):
        assert path in layout
