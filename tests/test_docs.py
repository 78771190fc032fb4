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


def readme_blocks(language: str = "") -> list[str]:
    """The README's fenced code blocks in `language` ("" for blocks with none)."""
    blocks, current, fence_language = [], None, None
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            if current is None:
                current, fence_language = [], line[3:].strip()
            else:
                if fence_language == language:
                    blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_every_perflab_command_in_the_readme_parses(monkeypatch):
    from perflab.cli import build_parser
    import shlex
    commands = [line.split("#")[0].strip() for block in readme_blocks() + readme_blocks("bash")
                for line in block.splitlines() if line.strip().startswith("perflab ")]
    # synopsis lines with placeholders (NAME, N, DIR) describe a command rather than give one
    commands = [c for c in commands if not re.search(r"\b[A-Z]{1,}(=[A-Z]+)?\b|\[", c.replace("<", "").replace(">", ""))]
    assert len(commands) >= 10
    parser = build_parser()
    for command in commands:
        argv = shlex.split(command.replace("...", "").replace("|", " "))[1:]
        argv = argv[:argv.index("--")] if "--" in argv else argv  # `-- python train.py`: the script's own
        if argv[:1] == ["env"] and len(argv) > 1:
            continue  # "perflab env | calibrate" names two commands
        try:
            parser.parse_args(argv)
        except SystemExit as exit_info:
            assert exit_info.code == 0, f"README command does not parse: {command}"


def test_the_readme_python_snippet_runs_as_written(tmp_path, monkeypatch):
    import shutil
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    snippet = next(block for block in readme_blocks("python") if "perflab.run(" in block and "result.save" in block)
    snippet = snippet.replace("steps=50", "steps=3, trials=1, warmup=1")  # the same calls, fewer steps
    exec(compile(snippet, "README.md", "exec"), {})
    assert (tmp_path / "runs" / "mine" / "result.json").is_file()


def test_no_tracked_text_file_holds_a_merge_conflict_marker():
    # a merge once left <<<<<<< / >>>>>>> blocks in README.md and two docs, and nothing else noticed
    import subprocess
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    marker = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)
    suffixes = {".md", ".py", ".toml", ".cfg", ".txt", ".yml", ".yaml"}
    found = [name for name in tracked.stdout.splitlines()
             if Path(name).suffix in suffixes and (ROOT / name).is_file()
             and marker.search((ROOT / name).read_text(errors="replace"))]
    assert found == []


def lever_table_flags() -> list[list[str]]:
    """The flags in the first cell of each row of docs/levers.md's tables (`--pin-memory` / `--no-pin-memory`: two)."""
    rows = [line for line in (ROOT / "docs" / "levers.md").read_text().splitlines() if line.startswith("| `")]
    first_cells = [re.split(r"(?<!\\)\|", row)[1].replace("\\|", "|") for row in rows]
    return [re.findall(r"`([^`]+)`", cell) + (["(not a lever)"] if "not a lever" in cell or "(default)" in cell else [])
            for cell in first_cells]


def test_every_lever_has_a_row_in_the_lever_tables():
    from perflab.levers import all_levers
    tabled = {flag for flags in lever_table_flags() for flag in flags}
    missing = [f"{lever.name} ({lever.flag})" for lever in all_levers() if lever.flag not in tabled]
    assert missing == [], f"docs/levers.md has no row for {missing}"


def test_every_row_of_the_lever_tables_is_a_lever_or_says_it_is_not():
    from perflab import options
    from perflab.config import RunConfig
    from perflab.levers import all_levers
    lever_flags = {lever.flag for lever in all_levers()}
    spellings = {spelling for declared in options.options_of(RunConfig) for spelling in declared.spellings}
    for flags in lever_table_flags():
        if "(not a lever)" in flags:  # an option beside the levers (--non-blocking) or a default (--precision fp32)
            assert flags[0].split()[0] in spellings, f"docs/levers.md names an option that does not exist: {flags[0]}"
        else:
            assert flags[0] in lever_flags, f"docs/levers.md has a row for {flags[0]}, which is no lever's flag"
