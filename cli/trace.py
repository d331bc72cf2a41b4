"""`radixcache trace`: statistics, format conversion, and the synthetic generators."""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

from radixcache.cli.errors import FriendlyCommand, FriendlyGroup, debug_option
from radixcache.cli.piped_trace import readable_trace, shown_name
from radixcache.cli.stdout import is_stdout, through_stdout
from radixcache.errors import RadixCacheError
from radixcache.runtime import atomic_file
from radixcache.trace import (
    CONVERSATIONS,
    DEFAULT_BLOCK_SIZE,
    FORMAT_KINDS,
    FORMATS,
    MOONCAKE,
    TOKEN_JSONL,
    TOKEN_MSGPACK,
    TraceError,
    read_trace,
    write_conversations,
    write_mooncake,
    write_token_jsonl,
    write_token_msgpack,
)
from radixcache.trace.generator_args import MAX_UNITS
from radixcache.trace.replay_output import is_replay_json, read_replay_json, replay_stats
from radixcache.trace.stats import trace_stats
from radixcache.trace.synthetic import GENERATORS

_WRITERS = {
    TOKEN_JSONL: write_token_jsonl,
    TOKEN_MSGPACK: write_token_msgpack,
    MOONCAKE: write_mooncake,
    CONVERSATIONS: write_conversations,
}
_COUNT_PARAM = {
    "chat": "conversations",
    "agent": "agents",
    "agent-sessions": "agents",
    "rag": "queries",
    "few-shot": "batches",
}


@click.group(cls=FriendlyGroup)
def trace() -> None:
    """Trace tools: statistics, format conversion, and synthetic workloads.

    \b
    Example:
      radixcache trace stats ../shared/traces/mooncake_synthetic_trace.jsonl
    """


@trace.command(cls=FriendlyCommand)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Trace format (default: detect).")
@click.option("--page-size", default=16, show_default=True, type=click.IntRange(min=1), help="Page of a token trace.")
@click.option("--block-size", default=DEFAULT_BLOCK_SIZE, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@debug_option
def stats(path: str, fmt: str | None, page_size: int, block_size: int, as_json: bool, debug: bool) -> None:
    """Requests, tokens, sessions and reuse structure of a trace (PATH '-': stdin).

    Reuse counts prompt blocks (pages of --page-size tokens, or hash blocks) that an earlier request already
    inserted: the hit rate of an infinite cache.

    \b
    Example:
      radixcache trace stats chat.jsonl --page-size 16 --json
    """
    shown = shown_name(path)
    with readable_trace(path) as readable:  # a pipe ('-': stdin) is copied to a file first: detection reads its head
        try:
            if fmt is None and is_replay_json(readable):  # the output of `radixcache replay --json`
                log = read_replay_json(readable)
                runs = [replay_stats(run) for run in (log, log.no_cache) if run is not None]
                _print_stats(shown, runs if len(runs) > 1 else runs[0], as_json)
                return
            loaded = read_trace(readable, fmt, block_size=block_size)
            _refuse_unused_size(loaded.kind)
            result = trace_stats(loaded, page_size=page_size, block_size=block_size)
        except RadixCacheError as exc:
            raise click.ClickException(str(exc)) from None
    _print_stats(shown, result.as_dict(), as_json)


def _refuse_unused_size(kind: str) -> None:
    """A usage error for --page-size on a hash trace (its page is --block-size) or --block-size on a token trace (its
    page is --page-size), or either on a text trace: given on the command line, they were ignored without a word."""
    ctx = click.get_current_context()
    unused = {"hash": ["page_size"], "token": ["block_size"], "text": ["page_size", "block_size"]}[kind]
    why = {"hash": "its pages are --block-size", "token": "its pages are --page-size", "text": "it holds no tokens"}
    for name in unused:
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
            raise click.UsageError(f"--{name.replace('_', '-')} does not apply to a {kind} trace ({why[kind]})")


def _print_stats(path: str, result: dict | list[dict], as_json: bool) -> None:
    if as_json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    for one in result if isinstance(result, list) else [result]:
        _stats_table(path, one)


def _stats_table(path: str, result: dict) -> None:
    title = f"{path} ({result['format']}{', ' + result['run'] if result.get('run') else ''})"
    table = Table(title=Text(title), show_header=False)  # a path is text, not markup
    table.add_column("", justify="left")
    table.add_column("", justify="right")
    for key, value in result.items():
        if key in ("format", "run") or (value in (0, 0.0) and key not in ("requests", "reused_refs")):
            continue
        if key.endswith("rate"):
            shown = f"{value:.2%}"
        elif key.endswith("_s"):
            shown = f"{value:,.3f}"
        elif isinstance(value, int):  # exact: through a float a sum past 2**53 lost its last digits
            shown = f"{value:,}"
        elif isinstance(value, float):
            shown = f"{value:,.0f}"
        else:
            shown = str(value)
        table.add_row(key.replace("_", " "), Text(shown))  # a replay's model or label is text, not markup
    Console().print(table)


@trace.command(cls=FriendlyCommand)
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Format of SRC (default: detect).")
@click.option("--to", "to", type=click.Choice(sorted(_WRITERS)), help="Format of DST (default: from its extension).")
@debug_option
def convert(src: str, dst: str, fmt: str | None, to: str | None, debug: bool) -> None:
    """Convert SRC to DST: token JSONL <-> msgpack (lossless), text traces -> conversation JSONL. SRC '-' is stdin,
    DST '-' stdout.

    \b
    Example:
      radixcache trace convert chat.jsonl chat.msgpack
      radixcache trace convert sharegpt.json conversations.jsonl
    """
    try:
        with readable_trace(src) as readable:  # SRC '-' (stdin) or a pipe, copied to a file first
            loaded = read_trace(readable, fmt)
        target = to or _default_target(dst, loaded.kind)
        if FORMAT_KINDS[target] != loaded.kind:
            raise click.ClickException(f"cannot convert {loaded.format} ({loaded.kind} records) to {target}")
        if target != TOKEN_MSGPACK and _default_target(dst, "token") == TOKEN_MSGPACK:
            # Every reader takes a .msgpack (.mpk, .mp) file for a msgpack stream: this one would be unreadable.
            raise click.ClickException(f"{dst}: a {target} trace is JSON lines, not msgpack: give DST a .jsonl name")
        if target == TOKEN_MSGPACK and is_stdout(dst) and sys.stdout.isatty():
            raise click.ClickException("a msgpack trace is binary: redirect stdout to a file or a pipe")
        with staged(dst) as path:
            n = _written(_WRITERS[target], path, loaded.records)
    except RadixCacheError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {n:,} records to {_shown(dst)} ({target})", err=True)


@trace.command(cls=FriendlyCommand)
@click.argument("kind", type=click.Choice(sorted(GENERATORS)))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option(
    "--count",
    type=click.IntRange(1, MAX_UNITS),
    help=f"Conversations / agents / queries / batches (1 to {MAX_UNITS:,}).",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--set", "overrides", multiple=True, metavar="NAME=VALUE", help="Any generator parameter; repeat.")
@debug_option
def gen(kind: str, out: str, count: int | None, seed: int, overrides: tuple[str, ...], debug: bool) -> None:
    """Write a seeded synthetic token trace (chat, agent, agent-sessions, rag, few-shot) to OUT (.jsonl or .msgpack;
    '-': JSONL to stdout).

    Parameters of the generator (see radixcache.trace.synthetic) can be set with --set, e.g. --set turns=2,6.

    \b
    Example:
      radixcache trace gen agent agents.jsonl --count 50 --set fanout_prob=0.5 --seed 1
    """
    generator = GENERATORS[kind]
    kwargs: dict = {"seed": seed}
    given: dict[str, str] = {}  # parameter -> the option that set it: a second one was taken over it without a word
    if click.get_current_context().get_parameter_source("seed") is not ParameterSource.DEFAULT:
        given["seed"] = "--seed"
    if count is not None:
        kwargs[_COUNT_PARAM[kind]] = count
        given[_COUNT_PARAM[kind]] = "--count"
    params = inspect.signature(generator).parameters
    for item in overrides:
        name, _, raw = item.partition("=")
        if name not in params or not raw:
            raise click.BadParameter(
                f"{item!r}: expected NAME=VALUE with NAME one of {', '.join(params)}", param_hint="--set"
            )
        if name in given:
            raise click.BadParameter(f"{name} is set by {given[name]} too: give it once", param_hint=f"--set {name}")
        given[name] = f"--set {name}"
        kwargs[name] = _parse_value(raw, params[name].default, name)
    units = kwargs.get(_COUNT_PARAM[kind])
    # Refused before the file is made, as --count is; 0 too: it wrote an empty file, whose format no reader can
    # detect (JSON lines of four formats), so `trace stats` and `simulate` refused it unless given --format.
    if isinstance(units, int) and not 1 <= units <= MAX_UNITS:
        raise click.BadParameter(
            f"{_COUNT_PARAM[kind]}={units}: need 1 <= it <= {MAX_UNITS:,} (2**20)",
            param_hint=f"--set {_COUNT_PARAM[kind]}",
        )
    try:
        requests = generator(**kwargs)
    except ValueError as exc:  # a value out of range (nan, negative, too large): a usage error, as for --count
        count_name = _COUNT_PARAM[kind] if count is not None else None
        named = _options_named(str(exc), [item.partition("=")[0] for item in overrides], count_name)
        raise click.BadParameter(str(exc), param_hint=named) from None
    writer = write_token_msgpack if _default_target(out, "token") == TOKEN_MSGPACK else write_token_jsonl
    with staged(out) as path:
        n = _written(writer, path, requests)
    click.echo(f"wrote {n:,} requests to {_shown(out)}", err=True)


@contextlib.contextmanager
def staged(path: str) -> Iterator[str]:
    """The file to write `path` through: a hidden one beside it, synced and moved onto it once the block succeeds
    and removed if it fails (a refused record, Ctrl-C), so a failed or killed write leaves neither a shorter trace,
    which reads as a sound one, nor an earlier file at `path` wiped (radixcache.runtime.atomic_file: an earlier
    file's mode is kept, a killed write's hidden file is removed by the next). Stdout ('-', or the file stdout is:
    cli/stdout.py) gets the whole file once it is written. A `path` that exists and is no regular file (a pipe) is
    written directly: there is nothing to keep, and no rename onto it."""
    if is_stdout(path):
        with through_stdout() as staging, _named(staging, "stdout"):
            yield staging
        return
    with atomic_file.staged(path) as staging, _named(staging, path):
        yield staging


@contextlib.contextmanager
def _named(staging: str, path: str) -> Iterator[None]:
    """Errors of the block that name the file `staging` name `path`, the file the user asked for."""
    try:
        yield
    except TraceError as exc:  # named as the file asked for, not the hidden one
        if exc.path != staging:
            raise
        raise TraceError(path, exc.where, exc.message, exc.field) from None
    except OSError as exc:
        if exc.filename == staging:
            exc.filename = path
        raise


def _shown(path: str) -> str:
    return "stdout" if is_stdout(path) else path


def _written(writer: Callable[[str, Any], int], path: str, records: Any) -> int:
    """`writer(path, records)`, whose write errors name `path`: a full disk was '[Errno 28] No space left on device',
    naming no file (an error from a write carries none, unlike one from the open)."""
    try:
        return writer(path, records)
    except OSError as exc:
        if exc.filename is not None or exc.strerror is None:
            raise
        raise OSError(exc.errno, exc.strerror, path) from None


def _default_target(path: str, kind: str) -> str:
    if kind == "token":
        return TOKEN_MSGPACK if Path(path).suffix.lower() in (".msgpack", ".mpk", ".mp") else TOKEN_JSONL
    return MOONCAKE if kind == "hash" else CONVERSATIONS


def _options_named(message: str, set_names: list[str], count_name: str | None) -> str:
    """The options a generator's error `message` is about: those of `set_names` (given with --set) it names, as
    '--set mean_think_ms'; else --count where it names `count_name` (None: no --count given); else the one --set
    given (the defaults pass every bound: "a conversation's prompts may reach ..." is about --set turns); else
    '--set'."""
    names = list(dict.fromkeys(set_names))
    named = [f"--set {name}" for name in names if re.search(rf"\b{re.escape(name)}\b", message)]
    if named:
        return " / ".join(named)
    if count_name is not None and re.search(rf"\b{count_name}\b", message):
        return "--count"
    return f"--set {names[0]}" if len(names) == 1 else "--set"


def _parse_value(raw: str, default: object, name: str) -> object:
    try:
        if isinstance(default, tuple):  # a range or pair: as many values as the default has
            parts = raw.split(",")
            if len(parts) != len(default):
                raise ValueError(f"{len(parts)} values for {len(default)}")
            return tuple(type(default[0])(part) for part in parts)
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes")
        return type(default)(raw)
    except (TypeError, ValueError):
        raise click.BadParameter(f"{raw!r}: expected a value like {default!r}", param_hint=f"--set {name}") from None
