"""User-facing errors.

Anything the user can fix (a bad file, a bad flag, a bad model directory) raises
:class:`UserError`. The console scripts turn it into ``error: <message>`` on stderr
and exit code 2, never a traceback. Messages name the file, line, id or tensor at
fault and say what was expected.
"""


class UserError(Exception):
  """An error caused by user input; reported without a traceback, exit code 2."""


class FieldError(UserError):
  """A bad value of one field of a request or filter; ``field`` names it (``max_size``,
  ``queries[2]``, ``tools.allow[2]``, ``--deny``), so a server can report it as that field's
  fault and a caller can rephrase it (``message`` is the text without the field)."""

  def __init__(self, field: str, message: str):
    super().__init__(f"{field}: {message}")
    self.field = field
    self.message = message
