"""A user's own script, run unchanged with perflab attached: `perflab run|profile -- python train.py ARGS`."""
from perflab.script.command import ScriptCommand, parse_command
from perflab.script.runner import ScriptOutcome, run_script

__all__ = ["ScriptCommand", "ScriptOutcome", "parse_command", "run_script"]
