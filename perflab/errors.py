"""The one exception type for user mistakes; the CLI prints it as one line and exits 2."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class PerflabError(Exception):
    """A problem with the user's input or environment, with a message that says what to do."""


@contextmanager
def writing(target: object, what: str = "output") -> Iterator[None]:
    """Turn an OSError while writing `what` to `target` into one clear PerflabError line."""
    try:
        yield
    except OSError as err:
        reason = err.strerror or str(err)
        raise PerflabError(f"cannot write {what} to {target}: {reason}; choose a writable directory "
                           "(--out) or free some space") from None
