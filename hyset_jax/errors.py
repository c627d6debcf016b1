"""User-facing errors.

Anything the user can fix (a bad file, a bad flag, a bad model directory) raises
:class:`UserError`. The console scripts turn it into ``error: <message>`` on stderr
and exit code 2, never a traceback. Messages name the file, line, id or tensor at
fault and say what was expected.
"""


class UserError(Exception):
  """An error caused by user input; reported without a traceback, exit code 2."""
