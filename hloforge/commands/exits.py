"""The `hloforge` command's exit codes (listed by `hloforge -h` and README's Exit codes)."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

from hloforge.core.switches import env_switch

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
# a stop signal's: 128 + its number, the status a shell gives a process that signal ended
EXIT_HANGUP, EXIT_TERMINATED = 128 + signal.SIGHUP, 128 + signal.SIGTERM
EXIT_OUTPUT_GONE = 128 + signal.SIGPIPE  # as a command that SIGPIPE ended (Python ignores it: BrokenPipeError)
EXIT_CODES = {
    EXIT_OK: "ok",
    EXIT_FAILED: "a check ran and failed (verify: a plugin failed its gate)",
    EXIT_USAGE: "usage: an unknown command or flag, a missing argument, a value of the wrong kind or range",
    EXIT_BAD_INPUT: "bad input, refused in one line: a spec, dataset, checkpoint or run that cannot be\n"
                    "used, options that do not go together, a file that cannot be read or written",
    EXIT_INTERNAL: "internal error (a bug; a third-party plugin's is a plugin error naming it): one line\n"
                   "naming the file that holds the traceback (HLOFORGE_DEBUG=1 prints it instead)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_HANGUP: "stopped by SIGHUP (its terminal closed), as at Ctrl-C",
    EXIT_TERMINATED: "stopped by SIGTERM (kill, or a scheduler's stop: SLURM, Kubernetes), as at Ctrl-C",
    EXIT_OUTPUT_GONE: "its output's reader went away (`| head -1`): stopped as at Ctrl-C, saying nothing",
}
DEBUG_ENV_VAR = "HLOFORGE_DEBUG"


def debug_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """$HLOFORGE_DEBUG: whether a refusal or an internal error prints its traceback. A value not on/off
    is one error line, never a guess (`false` once meant on: everything but empty and 0 did)."""
    return env_switch(DEBUG_ENV_VAR, on="print tracebacks", environ=environ)


def exit_codes_text() -> str:
    rows = (f"  {code:<5}" + meaning.replace("\n", "\n" + " " * 7) for code, meaning in EXIT_CODES.items())
    return "exit codes:\n" + "\n".join(rows)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread where Ctrl-C raises KeyboardInterrupt: the command
    stops as it does at Ctrl-C (temp files removed, worker processes stopped, the last checkpoint whole)
    instead of dying at once with none of that done and nothing said."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: Any) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once, as it did before
    raise Stopped(signum)


def _interrupted(signum: int, frame: Any) -> None:
    # A second Ctrl-C while the command stops (a terminal's key repeat, an impatient user) changes nothing:
    # Python's own handler would raise again in the midst of the stop (a temp file left, a traceback) or,
    # once the interpreter is finalizing, end the process by SIGINT (status -2) after its one line.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise Stopped in this process, Ctrl-C KeyboardInterrupt once. A signal its parent
    set ignored stays ignored (nohup's SIGHUP: the run goes on after its terminal closes; `&`'s SIGINT)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)
