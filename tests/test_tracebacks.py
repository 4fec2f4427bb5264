"""What ended a program, read from the end of its output (openenv_gym.tracebacks)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from openenv_gym.tracebacks import final_exception, summarize, whole_lines

CHAINED = """Traceback (most recent call last):
  File "a.py", line 1, in <module>
    f()
KeyError: 'x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "a.py", line 3, in <module>
    g()
pkg.errors.Failure: it broke: badly
"""


def test_the_last_raised_exception_of_a_chain_is_the_cause() -> None:
    assert final_exception(CHAINED) == "pkg.errors.Failure: it broke: badly"


def test_exceptions_ignored_at_exit_are_passed_over() -> None:
    text = (CHAINED + "Exception ignored in: <function X.__del__>\n"
            "Traceback (most recent call last):\n  File \"b\", line 2\nAttributeError: no _state\n")
    assert final_exception(text) == "pkg.errors.Failure: it broke: badly"


def test_a_bare_exception_name_and_output_without_a_traceback() -> None:
    assert final_exception("Traceback (most recent call last):\n  File \"x\"\n    y()\nKeyboardInterrupt\n") == "KeyboardInterrupt"
    assert final_exception("error: no space left on device\nSome: thing") is None
    assert summarize("uv exited 2", "error: resolution failed") == "uv exited 2; the end of its output:\nerror: resolution failed"


def test_a_cut_tail_loses_its_partial_first_line_only() -> None:
    assert whole_lines("rd cut\n  File \"x\"\nValueError: v", cut=True) == '  File "x"\nValueError: v'
    assert whole_lines("whole line\nnext", cut=False) == "whole line\nnext"
    assert summarize("it died", "ut\n  File \"x\"\n    raise\nValueError: v", cut=True).startswith("ValueError: v (it died; ")


@given(st.text(max_size=400), st.booleans())
def test_any_output_gives_a_summary_that_leads_with_what_it_found(text: str, cut: bool) -> None:
    out = summarize("it died", text, cut)
    cause = final_exception(whole_lines(text, cut))
    assert out.startswith(cause if cause is not None else "it died")
