"""One-line errors for the commands a user runs: a clear message on stderr, a non-zero exit, no traceback.

Use `cls=FriendlyCommand` (or `FriendlyGroup`) on a click command. Bad option values (click's usage errors)
and expected failures (a missing file, a malformed trace, an unknown format, a missing model, a value the
runtime refuses) print `error: <message>` on one line and exit 2 (usage) or 1 (the rest). Anything else is
a bug: it prints one line too and points at `--debug`, which (like RADIXCACHE_DEBUG=1) re-raises with the
traceback. Ctrl-C exits 130 quietly, and so, with status 1, does a command whose reader left (`... | head`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, NoReturn

import click

from radixcache.errors import RadixCacheError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: exceptions whose message is meant for the user; anything else is reported as an internal error
EXPECTED: tuple[type[BaseException], ...] = (RadixCacheError, OSError, ValueError, LookupError)

debug_option = click.option("--debug", is_flag=True, help="Show the full traceback on errors.")


_DEBUG = "radixcache.debug"  # in click's ctx.meta, which a command's context shares with its groups'


def _debugging(ctx: click.Context | None) -> bool:
    if os.environ.get("RADIXCACHE_DEBUG", "") not in ("", "0"):
        return True
    if ctx is not None and ctx.meta.get(_DEBUG):  # a subcommand's --debug, seen by the groups its error goes up
        return True
    while ctx is not None:
        if ctx.params.get("debug"):
            return True
        ctx = ctx.parent
    return "--debug" in sys.argv[1:]


def one_line(message: str) -> str:
    """Collapse a multi-line message (install hints indented on the next line) into one line."""
    return " ".join(message.split())


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print `error: message` on stderr and exit with `code`."""
    click.echo(f"error: {one_line(message)}", err=True)
    raise click.exceptions.Exit(code)


def describe(exc: BaseException) -> str:
    """The user-facing text of an expected exception."""
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, KeyError):
        return f"missing {exc.args[0]!r}" if exc.args else "missing key"
    return str(exc) or type(exc).__name__


def _reader_gone(stream: Any) -> bool:
    """Whether `stream` is a pipe whose reading end is closed: poll reports an error on its writing end."""
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no file descriptor (a test's buffer), or no poll here
        return False


class _Friendly:
    """The shared behaviour of FriendlyCommand and FriendlyGroup (a mixin over click.Command)."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)  # type: ignore[misc]
        except click.UsageError as exc:
            # A group given no command shows its help (click's NoArgsIsHelpError is a usage error whose message is
            # the whole help: on one line it was unreadable).
            if isinstance(exc, click.exceptions.NoArgsIsHelpError) or "--debug" in args or _debugging(parent):
                raise
            name = f"{parent.command_path} {info_name}" if parent is not None else info_name
            fail(f"{exc.format_message()} (see: {name} --help)", EXIT_USAGE)

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.params.get("debug"):
            ctx.meta[_DEBUG] = True
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except (click.exceptions.Exit, click.exceptions.Abort, click.exceptions.NoArgsIsHelpError):
            raise
        except click.ClickException as exc:
            if _debugging(ctx):
                raise
            hint = f" (see: {ctx.command_path} --help)" if isinstance(exc, click.UsageError) else ""
            fail(exc.format_message() + hint, exc.exit_code)
        except KeyboardInterrupt:
            if _debugging(ctx):
                raise
            fail("interrupted", EXIT_INTERRUPTED)
        except BrokenPipeError as exc:
            if _debugging(ctx):
                raise
            if not _reader_gone(sys.stdout):
                fail(describe(exc))
            # `radixcache ... | head`: the reader has what it wanted. Quiet, as Python's docs advise, with stdout on
            # /dev/null so that the exit's flush finds no broken pipe either.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise click.exceptions.Exit(EXIT_ERROR) from None
        except EXPECTED as exc:
            if _debugging(ctx):
                raise
            fail(describe(exc))
        except Exception as exc:
            if _debugging(ctx):
                raise
            fail(f"internal error: {type(exc).__name__}: {exc} (run again with --debug for the traceback)")


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM (`timeout`, a batch scheduler's time limit, `kill`) raises KeyboardInterrupt in the
    main thread, as Ctrl-C does, so a command that keeps what finished on Ctrl-C keeps it on SIGTERM too (Python's
    default ended the process at once). Off the main thread, where no handler can be set, it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class FriendlyCommand(_Friendly, click.Command):
    """A click command whose errors are one line (see the module docstring)."""


class FriendlyGroup(_Friendly, click.Group):
    """A click group whose own and subcommands' errors are one line."""
