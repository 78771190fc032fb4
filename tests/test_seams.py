"""perflab's own records are typed: string-key reads (`x["key"]`, `x.get("key")`) in perflab/ stay few, and the count
is printed. Issue 41 counted 1,522 at d3d75f1 (dicts for serve points, diagnoses, configs, quality, journal rows); at
most a quarter of that may remain: reads of outside formats (Chrome trace events, torch's and NCCL's records,
environment variables, LoadGen's keys) and of maps keyed by name (phases, precisions, collective kinds)."""
import ast
from pathlib import Path

PERFLAB = Path(__file__).resolve().parent.parent / "perflab"
AT_D3D75F1 = 1522
LIMIT = AT_D3D75F1 // 4


def string_key_reads(source: str) -> int:
    """Subscripts with a string constant that are read (not assigned), and `.get("...")` calls."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
                isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            count += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and \
                node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            count += 1
    return count


def test_the_counter_counts_reads_not_writes():
    assert string_key_reads('a["x"]\nb.get("y")\nc["z"] = 1\nd[0]\ne.get(key)') == 2


def test_string_key_reads_in_perflab_stay_under_a_quarter_of_what_issue_41_counted():
    per_file = {str(path.relative_to(PERFLAB.parent)): string_key_reads(path.read_text())
                for path in sorted(PERFLAB.rglob("*.py"))}
    total = sum(per_file.values())
    most = sorted(per_file.items(), key=lambda item: -item[1])[:8]
    print(f"\nstring-key reads in perflab/: {total} (issue 41 counted {AT_D3D75F1}; limit {LIMIT}); most: "
          + ", ".join(f"{name} {count}" for name, count in most))
    assert total <= LIMIT, f"{total} string-key reads in perflab/ (limit {LIMIT}); most: {most}"
