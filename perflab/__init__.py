"""perflab: a profile-first performance lab for PyTorch training and inference."""
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.pipeline import run
from perflab.profile.markers import mark
from perflab.results import Result
from perflab.version import __version__
from perflab.workloads.base import Workload

__all__ = ["Workload", "RunConfig", "Result", "run", "mark", "PerflabError", "__version__"]
