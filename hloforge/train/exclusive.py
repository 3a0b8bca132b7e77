"""One call at a time per object, for the API's methods that must never run twice at once (Model.fit).

A second call while one runs is refused with one line, never run beside it: from the running call's
own thread it is a callback's (the running loop would be stepped under itself), from another thread
a second run on the same state. Refused rather than made to wait: two fits of one model from two
threads have no order a caller chose."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from hloforge.core.errors import UnsupportedSpec

F = TypeVar("F", bound=Callable[..., Any])

_LOCK = threading.Lock()
# (id of the object, method name) → the thread running it; an entry lives only while its call does,
# so the object is alive and its id is its own
_RUNNING: dict[tuple[int, str], int] = {}


def one_at_a_time(thing: str) -> Callable[[F], F]:
    """A method decorator: a call while the same object's call runs raises UnsupportedSpec, saying
    whether it came from that call's own thread (a callback's) or another. `thing`: what the object is
    to its users ("model")."""

    def wrap(method: F) -> F:
        name = method.__name__
        from_itself = f"{name} called from a callback of this {thing}'s running {name}; {name} after it returns"
        from_another_thread = (f"{name} called while another thread's {name} of this {thing} runs; one {name} at "
                               f"a time (wait for it to return, or {name} a copy made before it: "
                               f"copy.deepcopy({thing}))")

        @functools.wraps(method)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            key, me = (id(self), name), threading.get_ident()
            with _LOCK:
                owner = _RUNNING.get(key)
                if owner is None:
                    _RUNNING[key] = me
            if owner is not None:
                raise UnsupportedSpec(from_itself if owner == me else from_another_thread)
            try:
                return method(self, *args, **kwargs)
            finally:
                with _LOCK:
                    del _RUNNING[key]

        return guarded  # type: ignore[return-value]

    return wrap


# id of a callback → the thread whose fit runs it; an entry lives only while that fit does
_CALLBACKS: dict[int, int] = {}


def own_callbacks(method: F) -> F:
    """A decorator of fit: each callback given (its `callbacks` keyword) runs in one fit at a time. A callback holds
    its fit's state (its `model`, its best epoch, its patience): a second fit at once, of another model on another
    thread, set the callback's `model` to its own, and an EarlyStopping shared so never stopped the first fit. Refused
    in one line instead; one fit after the other, a callback is taken again, as before."""

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = kwargs.get("callbacks", ())
        if not isinstance(given, Iterable) or isinstance(given, (str, bytes, Mapping)) or \
                hasattr(given, "on_epoch_end"):  # not a list of callbacks: fit refuses it, naming it
            return method(self, *args, **kwargs)
        kwargs["callbacks"] = given = list(given)  # a generator read once, here
        ids, me = {id(cb) for cb in given}, threading.get_ident()
        with _LOCK:
            busy = [cb for cb in given if _CALLBACKS.get(id(cb), me) != me]
            ids = set() if busy else ids - set(_CALLBACKS)  # this fit's (a fit under it holds its own)
            _CALLBACKS.update(dict.fromkeys(ids, me))
        if busy:
            raise UnsupportedSpec(f"callback {type(busy[0]).__name__} is in another fit running on another thread; "
                                  "a callback keeps one fit's state (its model, its best epoch): give each fit one "
                                  "of its own")
        try:
            return method(self, *args, **kwargs)
        finally:
            with _LOCK:
                for i in ids:
                    _CALLBACKS.pop(i, None)

    return guarded  # type: ignore[return-value]


def _forget_in_child() -> None:
    """A forked child holds only the thread that forked: the parent's other threads' calls do not run here, so a fit
    they ran was refused in the child as running on another thread ('wait for it to return': it never would), and
    _LOCK, were one of them holding it, stayed held. The forking thread's own calls are kept."""
    global _LOCK
    _LOCK, me = threading.Lock(), threading.get_ident()
    for running in (_RUNNING, _CALLBACKS):
        for key in [k for k, owner in running.items() if owner != me]:
            del running[key]


os.register_at_fork(after_in_child=_forget_in_child)
