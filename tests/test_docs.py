"""The README and docs stand alone: relative links point at files of this repository."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))


def links(document: str) -> list[str]:
    return [target for target in LINK.findall((ROOT / document).read_text()) if not target.startswith("#")]


@pytest.mark.parametrize("document", ["README.md", *DOCS])
def test_relative_links_point_inside_the_repository_at_files_that_exist(document):
    for target in links(document):
        if "://" in target:
            continue  # a web page (docs cite a few projects)
        resolved = (ROOT / document).parent.joinpath(target.split("#")[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{document} links outside the repository: {target}"
        assert resolved.exists(), f"{document} links to a missing file: {target}"


def test_readme_links_nothing_outside_the_repository():
    assert [target for target in links("README.md") if "://" in target] == []
