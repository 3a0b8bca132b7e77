"""The `hloforge` command: `main` runs it and maps what goes wrong to an exit code (commands/exits.py).
The parser is commands/options.py (its option types commands/argtypes.py), each subcommand's work
commands/handlers.py; their names are re-exported here (`from hloforge.cli import parser, ...`)."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from hloforge.commands.argtypes import F32_MAX as F32_MAX
from hloforge.commands.argtypes import I64_MAX as I64_MAX
from hloforge.commands.argtypes import MAX_DIFFUSION_STEPS as MAX_DIFFUSION_STEPS
from hloforge.commands.argtypes import MAX_PROCESSES as MAX_PROCESSES
from hloforge.commands.argtypes import finite_float as finite_float
from hloforge.commands.argtypes import integer as integer
from hloforge.commands.argtypes import nonneg_float as nonneg_float
from hloforge.commands.argtypes import nonneg_int as nonneg_int
from hloforge.commands.argtypes import number as number
from hloforge.commands.argtypes import positive_float as positive_float
from hloforge.commands.argtypes import positive_int as positive_int
from hloforge.commands.argtypes import probability as probability
from hloforge.commands.argtypes import unit_open as unit_open
from hloforge.commands.argtypes import variant_value as variant_value
from hloforge.commands.exits import DEBUG_ENV_VAR as DEBUG_ENV_VAR
from hloforge.commands.exits import EXIT_BAD_INPUT as EXIT_BAD_INPUT
from hloforge.commands.exits import EXIT_CODES as EXIT_CODES
from hloforge.commands.exits import EXIT_FAILED as EXIT_FAILED
from hloforge.commands.exits import EXIT_HANGUP as EXIT_HANGUP
from hloforge.commands.exits import EXIT_INTERNAL as EXIT_INTERNAL
from hloforge.commands.exits import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from hloforge.commands.exits import EXIT_OK as EXIT_OK
from hloforge.commands.exits import EXIT_OUTPUT_GONE as EXIT_OUTPUT_GONE
from hloforge.commands.exits import EXIT_TERMINATED as EXIT_TERMINATED
from hloforge.commands.exits import EXIT_USAGE as EXIT_USAGE
from hloforge.commands.exits import Stopped, stop_on_signals
from hloforge.commands.exits import debug_enabled as debug_enabled
from hloforge.commands.exits import exit_codes_text as exit_codes_text
from hloforge.commands.handlers import given as given
from hloforge.commands.handlers import train_config as train_config
from hloforge.commands.options import HelpFormatter as HelpFormatter
from hloforge.commands.options import Parser as Parser
from hloforge.commands.options import net_opts as net_opts
from hloforge.commands.options import parser as parser
from hloforge.commands.options import prepare_parser as prepare_parser
from hloforge.commands.options import variant_flags as variant_flags
from hloforge.commands.options import version as version
from hloforge.core.errors import DeviceMemoryError, HloforgeError, HloforgeWarning, UnsupportedSpec


def _internal_error(e: BaseException) -> str:
    """Write the traceback to a file (under the cache root, else the temp dir); where it is, said for the line.
    Where neither can take it (a full disk: what may have caused the error), that, not a second traceback; a
    file the disk filled midway is removed."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(e))
    name = f"traceback-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"

    def save(fd: int, path: str) -> str:
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(path)
            raise
        return f"the full traceback is in {path}, or run with {DEBUG_ENV_VAR}=1"

    try:
        from hloforge.backends.base import cache_root

        d = cache_root() / "tracebacks"
        d.mkdir(parents=True, exist_ok=True)
        path = str(d / name)
        return save(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), path)
    except Exception:  # an unwritable cache (or one that cannot be imported): the temp dir
        try:
            return save(*tempfile.mkstemp(prefix="hloforge-", suffix=".txt"))
        except OSError as second:
            return f"the traceback could not be saved ({second.strerror}); run with {DEBUG_ENV_VAR}=1 to see it"


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _plugin_fault(e: BaseException) -> str | None:
    """Which third-party plugin's own code raised `e` and how, as one phrase (`layer 'x' (dist 'y') failed:
    KeyError: ...`); None where it is hloforge's code (Registry.at_fault), or no registry was loaded."""
    registry = sys.modules.get("hloforge.core.registry")
    if registry is None or not registry.default_registry.cache_info().currsize:  # no plugin has run
        return None
    entry = registry.default_registry().at_fault(e)
    if entry is None:
        return None
    from hloforge.testing.gate import fault, plugin_label

    return f"{plugin_label(entry.kind, entry.name, entry.distribution)} {fault(e)}"


# What runs across the processes an MPI launcher starts; any other command is one job's work, done by
# rank 0 alone (the others end at once, exit 0), so it is measured, printed and written once.
ACROSS_PROCESSES = ("train",)


def _another_rank_does_it(argv: Sequence[str]) -> bool:
    if argv[:1] and argv[0] in ACROSS_PROCESSES:
        return False
    from hloforge.core.launcher import launched

    return launched()[0] > 0


def _a_later_rank() -> bool:
    """Whether this is a rank other than 0 of an MPI launch whose ranks have not met yet (no MPI world
    made). Every rank parses the same command line, so a usage error or a refusal of the options alone is
    every rank's: rank 0 says it, once, as one process would (after they meet: mpi.shared)."""
    from hloforge.core.launcher import launched

    mpi = sys.modules.get("hloforge.train.mpi")
    return launched()[0] > 0 and not (mpi is not None and mpi.world_made())


def _said_across(argv: Sequence[str], code: int, said: str, file: TextIO) -> bool:
    """A rank of a launch across processes (`train` under mpiexec) that ends before its run starts: it meets
    the others first (mpi.ended_before_start), so none waits for it for ever, and `said` is said once (by
    the rank that alone ended, naming itself). False where it cannot meet them: the caller says it as before."""
    mpi = sys.modules.get("hloforge.train.mpi")
    if not (argv[:1] and argv[0] in ACROSS_PROCESSES) or (mpi is not None and mpi.world_made()):
        return False
    from hloforge.core.launcher import launched

    if launched()[1] == 1:
        return False
    from hloforge.train.mpi import ended_before_start

    text = ended_before_start(code, said)
    if text:
        print(text, end="", file=file)
    return text is not None


def _on_rank(e: BaseException) -> str:
    """' (on rank R of P)' for a fault this rank of a run across MPI processes reports alone (a producer that
    died, a checkpoint it cannot write, a bug): the others say nothing of it, so its line names its machine.
    '' in one process, and for a refusal every rank met (said once) or a peer's absence (which names the peer)."""
    mpi = sys.modules.get("hloforge.train.mpi")
    if mpi is None or not mpi.world_made() or getattr(e, "together", False) or isinstance(e, mpi.PeerError):
        return ""
    w = mpi.world()
    return f" (on rank {w.rank} of {w.size})" if w.size > 1 else ""


def _end_mpi_run(e: BaseException, code: int) -> None:
    """A rank of a run across MPI processes ends for the others too (hloforge.train.mpi.end_after_error);
    nothing where none was started. A rank that aborts alone has said its line, naming itself (_on_rank):
    MPICH's own 'Abort(3) on node 1 (rank 1 in comm 0): ...' after it would be a second line."""
    mpi = sys.modules.get("hloforge.train.mpi")
    if mpi is not None:
        if _on_rank(e):
            sys.stderr.flush()
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        mpi.end_after_error(e, code)


_python_show_warning: Any = warnings.showwarning  # as Python shows a warning, for every other library's


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """hloforge's own warnings as the command's other lines (`hloforge: warning: ...`), not Python's file:line
    and source line from inside hloforge; another library's as Python shows it."""
    if issubclass(category, HloforgeWarning):
        print(f"hloforge: warning: {message}", file=file or sys.stderr)
    else:
        _python_show_warning(filename=filename, lineno=lineno, message=message, category=category, file=file,
                             line=line)


def _os_error_said(e: OSError) -> str:
    """A file the user named that the system refused, with what was expected: `[Errno 13] Permission denied:
    'ro/d'` said as `ro/d: permission denied; expected a path this user may write (or read)`."""
    if e.errno == errno.EMFILE:  # no file of the user's at fault: the process's limit on open files
        import resource

        held = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f"too many open files: this process may hold {held} at once (ulimit -n); expected a higher limit "
                "(ulimit -n 4096), or fewer files at once (--workers: each producer holds its pipes)")
    where = e.filename if e.filename is not None else "a file"
    what = (e.strerror or str(e)).lower()
    if isinstance(e, PermissionError):
        return f"{where}: {what}; expected a path this user may write (or read)"
    if isinstance(e, (FileExistsError, NotADirectoryError, IsADirectoryError)):
        return f"{where}: {what}; expected a path where a file or directory of that kind can be"
    return f"{where}: {what}"


def _output_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader closed it (`hloforge ... | head -1`): poll says POLLERR
    on such a pipe's writing end."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no stdout, or none with a file descriptor
        return False


def _closed_std_streams_on_devnull() -> None:
    """Standard input, output or error closed when the command started (`2>&-`, a daemon's) opened on
    /dev/null: Python leaves sys.stderr None, so the progress bar failed writing to it and each error line
    went to stdout; and the next file opened (a run's lock, its metrics log) took descriptor 2, where the
    XLA plugin's log lines would land."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one (those below it are open by now)
            if getattr(sys, name) is None:
                setattr(sys, name, os.fdopen(fd, "r" if fd == 0 else "w", closefd=False))


def _check_working_directory() -> None:
    """Refuse a working directory deleted since the shell entered it (a checkout or a build that removed it):
    every relative path would fail somewhere later and be blamed on it (numpy's loadtxt asks for the working
    directory: 'reinstall scikit-learn')."""
    try:
        os.getcwd()
    except FileNotFoundError:
        where = os.environ.get("PWD", "")
        raise HloforgeError(f"the working directory {where + ' ' if where else ''}no longer exists (deleted or moved "
                            "since the shell entered it); expected an existing one: cd to it again if it was made "
                            "anew, or to another") from None


def main(argv: Sequence[str] | None = None) -> int:
    """The command; returns its exit status (EXIT_CODES), --help's and a usage error's included."""
    if argv is None:
        _closed_std_streams_on_devnull()
        with contextlib.suppress(AttributeError, ValueError):  # a stdout that is no text stream of Python's
            # each line into a log file as it is said (nohup, SLURM: `tail -f` shows the epochs; a kill -9 loses
            # none), not in 8 KB blocks, the last of them at the exit
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    try:  # first: a value it does not know is refused before any work (an MPI rank's worker included)
        debug = debug_enabled()
    except HloforgeError as e:
        said = f"hloforge: error: {e}\n"  # a rank of a launch meets the others first: set on one machine alone, it
        # left them waiting in MPI_Init for good; said once (by it, naming it) either way
        if not _said_across(list(sys.argv[1:] if argv is None else argv), EXIT_BAD_INPUT, said, sys.stderr) and \
                not _a_later_rank():
            print(said, end="", file=sys.stderr)
        return EXIT_BAD_INPUT
    if argv is None and not debug:  # the process's own command (HLOFORGE_DEBUG: where each was raised)
        warnings.showwarning = _show_warning
    given_argv, argv = argv, list(sys.argv[1:] if argv is None else argv)
    smaller: str | None = None
    if _another_rank_does_it(argv):
        return EXIT_OK
    if given_argv is None and os.environ.get("PMI_FD"):  # a rank under hydra: its worker (hloforge.train.supervise)
        from hloforge.train.supervise import supervise

        supervise(sys.orig_argv[1:])
    try:
        from hloforge.core.launcher import launched
        from hloforge.train.supervise import take_interrupts

        take_interrupts()  # a supervised rank's Ctrl-C that came while it started: said as any other
        if given_argv is None and launched()[1] == 1:  # the process's own; an MPI rank's: as its launcher has them
            stop_on_signals()
        _check_working_directory()
        if argv[:1] == ["bench"]:  # bench parses its own options, -h included
            from hloforge import bench

            return bench.main(argv[1:])
        p = parser()
        out, err = io.StringIO(), io.StringIO()  # argparse's help and usage error, said once for the ranks
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                args = p.parse_args(argv)
        except SystemExit as e:  # a usage error (2), or -h / --version (0)
            code = e.code if isinstance(e.code, int) else EXIT_USAGE
            said, file = (err.getvalue(), sys.stderr) if err.getvalue() else (out.getvalue(), sys.stdout)
            if not _said_across(argv, code, said, file) and not _a_later_rank():
                print(said, end="", file=file)
            return code
        if args.command is None:  # a bare `hloforge`: the help, and nothing run
            p.print_help(sys.stderr)
            return EXIT_USAGE
        smaller = getattr(args, "smaller", None)  # what this command's out-of-memory advice names
        rc = args.func(args)  # a command may return its exit status (verify: 1 on a failed gate)
    except KeyboardInterrupt as e:
        line = f"hloforge: stopped by {e}" if isinstance(e, Stopped) else "hloforge: interrupted"  # SIGTERM, SIGHUP

        def say() -> None:
            if _a_later_rank():  # before the ranks met: the launcher passed it to every rank, and rank 0 says it
                return
            with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
                print(line, file=sys.stderr)

        mpi = sys.modules.get("hloforge.train.mpi")  # under MPI: one line for the job (end_after_interrupt)
        if mpi is not None:
            mpi.end_after_interrupt(say)
        else:
            say()
        return 128 + e.signum if isinstance(e, Stopped) else EXIT_INTERRUPTED
    except (HloforgeError, OSError) as e:  # a refusal, or a file the user named that cannot be read or written
        if isinstance(e, BrokenPipeError) and _output_reader_gone():  # nobody reads on: nothing to say, to nobody
            with contextlib.suppress(OSError):  # the exit's flush of what is left in the buffer goes nowhere
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            _end_mpi_run(e, EXIT_OUTPUT_GONE)
            return EXIT_OUTPUT_GONE
        if isinstance(e, DeviceMemoryError) and smaller:  # a command without --batch: what it takes instead
            e.advise(smaller)
        said = f"hloforge: error: {_os_error_said(e) if isinstance(e, OSError) else e}\n"
        if not getattr(e, "quiet", False) and _said_across(argv, EXIT_BAD_INPUT, said, sys.stderr):
            return EXIT_BAD_INPUT  # (HLOFORGE_DEBUG's traceback: a rank's own, run alone)
        # quiet: an MPI rank whose refusal another rank reports; so is a later rank's refusal of the options
        if not getattr(e, "quiet", False) and not (isinstance(e, UnsupportedSpec) and _a_later_rank()):
            if debug:
                import traceback

                traceback.print_exc()
            print(f"hloforge: error: {_os_error_said(e) if isinstance(e, OSError) else e}{_on_rank(e)}",
                  file=sys.stderr)
        _end_mpi_run(e, EXIT_BAD_INPUT)
        return EXIT_BAD_INPUT
    except MemoryError as e:  # a size asked for (a batch, an input shape) that does not fit, not a bug
        print(f"hloforge: error: out of host memory ({_one_line(e)}); {smaller or 'ask for a smaller batch or input'}"
              f"{_on_rank(e)}", file=sys.stderr)
        _end_mpi_run(e, EXIT_BAD_INPUT)
        return EXIT_BAD_INPUT
    except Exception as e:
        plugin = _plugin_fault(e)  # a third-party plugin's bug is said to be its, not hloforge's
        said = f"plugin error: {plugin}" if plugin else f"internal error: {_one_line(e)}"
        whose = "a bug in that plugin, not in hloforge: tell its authors" if plugin else "a bug"
        if debug:
            import traceback

            traceback.print_exc()
            print(f"hloforge: {said} ({whose})" if plugin else f"hloforge: {said}", file=sys.stderr)
        else:
            print(f"hloforge: {said} ({whose}; {_internal_error(e)}){_on_rank(e)}", file=sys.stderr)
        _end_mpi_run(e, EXIT_INTERNAL)
        return EXIT_INTERNAL
    return int(rc or 0)


if __name__ == "__main__":  # `python -m hloforge.cli`
    sys.exit(main())
