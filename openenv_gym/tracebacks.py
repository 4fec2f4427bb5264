"""What ended a Python program, read from the end of its output.

A program that dies (a Verifiers harness, an isolated env's host) leaves its traceback in its
output, and what reaches us is often only the end of it, cut to a size by whoever kept it, with
noise after the real cause (``Exception ignored in: ...`` reports from finalizers at exit). A
report built from that tail must lead with the cause (``TypeError: Invalid timeout ...``), then
show whole lines: :func:`summarize` does both. Standard library only.
"""

from __future__ import annotations

import re

__all__ = ["final_exception", "summarize", "whole_lines"]

_EXCEPTION = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*(?::\s.*)?$")
"""``TypeError: ...``, ``pkg.errors.Failure: ...``, ``KeyboardInterrupt``: a name, then its message."""
_IGNORED = "Exception ignored"


def _is_exception_line(line: str, previous: str) -> bool:
    """A traceback's closing line: flush left, right after a frame's indented lines."""
    if not line or line[0].isspace() or not previous[:1].isspace():
        return False
    return bool(_EXCEPTION.match(line))


def final_exception(output: str) -> str | None:
    """The ``Type: message`` line of the exception that ended the program, if the output shows one.

    A traceback's exception line follows its frames; a chain (``During handling ...``) ends with the
    one raised last; the reports of exceptions ignored at exit (``Exception ignored in:``) are
    passed over, since the program was dying of something else by then.
    """
    found = None
    ignoring = False
    previous = ""
    for line in output.splitlines():
        if line.startswith(_IGNORED):
            ignoring = True
        elif _is_exception_line(line, previous):
            if ignoring:
                ignoring = False
            else:
                found = line.strip()
        previous = line
    return found


def whole_lines(tail: str, cut: bool) -> str:
    """``tail`` without its first line when that line was cut mid-way (``cut``: the tail was shortened)."""
    tail = tail.strip("\n")
    if cut and "\n" in tail:
        tail = tail.split("\n", 1)[1]
    return tail.strip("\n").rstrip()


def summarize(what: str, output: str, cut: bool = False) -> str:
    """``"<Type: message> (<what>; the end of its output:\\n<whole lines>)"``, or ``what`` and the lines.

    >>> print(summarize("harness exited 1", "Traceback (most recent call last):\\n"
    ...                 '  File "h.py", line 3, in <module>\\nTypeError: Invalid timeout\\n'))
    TypeError: Invalid timeout (harness exited 1; the end of its output:
    Traceback (most recent call last):
      File "h.py", line 3, in <module>
    TypeError: Invalid timeout)
    """
    lines = whole_lines(output, cut)
    cause = final_exception(lines)
    if cause is None:
        return f"{what}; the end of its output:\n{lines}" if lines else what
    return f"{cause} ({what}; the end of its output:\n{lines})"
