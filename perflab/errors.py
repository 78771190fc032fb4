"""The one exception type for user mistakes; the CLI prints it as one line and exits 2."""


class PerflabError(Exception):
    """A problem with the user's input or environment, with a message that says what to do."""
