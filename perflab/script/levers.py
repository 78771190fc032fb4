"""What perflab's levers are in a script's own code: a script takes no lever flags, its author edits the code
(each lever declares its in-code form: Lever.in_code)."""
from __future__ import annotations

from perflab.levers import all_levers


def levers_in_code(levers: list[str]) -> dict[str, str]:
    """{lever: how to apply it in the script} for the named levers that perflab knows, in order."""
    in_code = {lever.name: lever.in_code for lever in all_levers()}
    return {lever: in_code[lever] for lever in levers if lever in in_code}
