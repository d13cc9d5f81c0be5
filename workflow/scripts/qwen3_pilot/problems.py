"""How an error lists what went wrong: one place for the wording every stage, check and tool raises with."""

from __future__ import annotations

from collections.abc import Iterable


def problem_list(heading: str, problems: Iterable[str]) -> str:
    """`heading` and a colon, then each problem on a line of its own as an indented bullet ("\\n  - ...")."""
    return f"{heading}:" + "".join(f"\n  - {problem}" for problem in problems)
