"""CITATION.cff parses, names the package at its current version and cites the paper it implements."""
import pathlib
import re

from symfield.core.version import __version__

CFF = pathlib.Path(__file__).resolve().parents[2] / "CITATION.cff"


def _parse(text):
    try:
        import yaml
    except ImportError:          # a minimal reading of the top-level scalar keys
        return {m[1]: m[2].strip().strip('"') for m in re.finditer(r"^([a-z-]+):[ \t]*(.*)$", text, re.M)}, False
    return yaml.safe_load(text), True


def test_citation_cff_matches_the_package():
    text = CFF.read_text()
    cff, full = _parse(text)
    assert str(cff["cff-version"]) == "1.2.0" and cff["title"] == "symfield"
    assert str(cff["version"]) == __version__
    license_text = (CFF.parent / "LICENSE").read_text()
    assert cff["license"] == "MIT" and license_text.startswith("MIT License")
    assert "When Bias Meets Trainability" in text and "Bassi" in text and "2026" in text
    if full:
        assert cff["authors"] == [{"name": "symfield developers"}]
        ref = cff["references"][0]
        assert ref["title"].startswith("When Bias Meets Trainability") and ref["year"] == 2026
        assert [a["family-names"] for a in ref["authors"]] == ["Bassi", "Baity-Jesi", "Lucchi", "Albert", "Francazi"]
        assert all(a.get("given-names") for a in ref["authors"]) and "ICLR 2026" in ref["conference"]["name"]
        assert "arXiv:2505.12096" in ref["identifiers"][0]["value"]
