"""Suggestions for mistyped names: the closest known name, and keyword checks that use it.

Every public option object and ``make_loader`` are wrapped with :func:`suggest_keywords`, so a
typo such as ``BatchOptions(drop_lst=True)`` is a ``TypeError`` that names the keyword meant
(``did you mean drop_last=?``) instead of Python's bare one. ``ShardedDataset``, the field names
of a dataset and the command line use :func:`closest` for theirs.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

__all__ = ["closest", "unexpected_keyword", "suggest_keywords"]

T = TypeVar("T")


def closest(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The choice most like ``word`` (difflib's ratio at least ``cutoff``), or None."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return close[0] if close else None


def unexpected_keyword(owner: str, name: str, known: Iterable[str]) -> str:
    """The message for keyword ``name`` that ``owner`` does not take: Python's words, then the
    closest of ``known`` (or, when none is close, every one of them)."""
    known = list(known)
    meant = closest(name, known)
    hint = f"; did you mean {meant}=?" if meant else f"; it takes {', '.join(f'{k}=' for k in known)}"
    return f"{owner}() got an unexpected keyword argument {name!r}{hint}"


def _keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The names ``fn`` takes as keywords; None when it takes any (``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _checked(fn: Callable[..., Any], owner: str, skip: int) -> Callable[..., Any]:
    known = _keywords(fn)
    if known is None:
        return fn
    names = [n for n in inspect.signature(fn).parameters][skip:]  # in the order they are declared

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        for name in kwargs:
            if name not in known:
                raise TypeError(unexpected_keyword(owner, name, names))
        return fn(*args, **kwargs)

    return call


def suggest_keywords(obj: T) -> T:
    """``obj`` (a class, after ``@dataclass``, or a function) whose calls with a keyword it does
    not take raise a ``TypeError`` naming the closest one it does. Signatures are kept."""
    if isinstance(obj, type):
        cls = cast(Any, obj)
        cls.__init__ = _checked(cls.__init__, obj.__name__, skip=1)  # skip self
        return obj
    fn = cast(Callable[..., Any], obj)
    return cast(T, _checked(fn, getattr(fn, "__name__", "function"), skip=0))
