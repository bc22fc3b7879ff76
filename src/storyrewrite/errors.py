"""The one error a user sees as a line, not a traceback (storyrewrite.io.run_stage: exit 2)."""


class InputError(ValueError):
    """Bad input data or parameters; the message names the file and line, or the parameter."""
