"""`radixcache replay`: a chat trace through the real model, measuring what the prefix cache saves.

The work is `radixcache.runtime.replay.run`; this module parses options, loads the model, shows progress and prints.
Exit status: 0, 1 on an error, 2 on a bad option, 3 when turns were skipped (too long for the model or the
cache; the table and JSON still come out), 130 when interrupted by Ctrl-C or SIGTERM (what finished is still printed
and saved).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from radixcache.cli import engine_options
from radixcache.cli.errors import (
    EXIT_INTERRUPTED,
    EXPECTED,
    FriendlyCommand,
    debug_option,
    describe,
    fail,
    sigterm_as_ctrl_c,
)
from radixcache.cli.record import (
    CONCURRENT_NOTE,
    INTERRUPTED_NOTE,
    StagedRecording,
    check_distinct_files,
    check_record_path,
    command_notes,
    record_option,
    simulate_command,
)
from radixcache.cli.replay_output import progress, summary_table, text_verdict
from radixcache.cli.replicas import check_replica_flags, cluster_engine, replica_options, replica_table
from radixcache.cli.stdout import is_stdout
from radixcache.runtime import atomic_file
from radixcache.trace import FORMATS

if TYPE_CHECKING:
    from radixcache.runtime.engine.protocol import GenerationEngine

EXIT_SKIPPED = 3


@click.command(cls=FriendlyCommand)
@click.argument("trace", required=False, type=click.Path(exists=True, dir_okay=False))
@engine_options.model_option
@click.option("--no-cache", is_flag=True, help="Run with the prefix cache disabled (the baseline).")
@click.option("--compare", is_flag=True, help="Run with and without the cache; print both and their ratios.")
@engine_options.engine_choice_options
@replica_options
@click.option(
    "--concurrency",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Conversations in flight at once (continuous batching; each conversation's turns stay in order).",
)
@click.option("--max-tokens", type=click.IntRange(min=1), help="Tokens per reply [default: each turn's own, else 32].")
@click.option("--limit", type=click.IntRange(min=1), help="Replay only the first N conversations.")
@click.option("--mode", default="live", show_default=True, type=click.Choice(["live", "recorded"]))
@click.option("--honor-timestamps", is_flag=True, help="Start each request at its trace time (token traces).")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write the summary and every request here ('-': to stdout, the table then to stderr).",
)
@record_option
@click.option(
    "--seed", default=0, show_default=True, type=engine_options.SEED, help="Sampling seed (request i uses seed + i)."
)
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0), help="0 is greedy.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Trace format [default: detect].")
@click.option("-v", "--verbose", is_flag=True, help="Print every request as it finishes.")
@debug_option
def replay(
    trace: str | None,
    model: str,
    no_cache: bool,
    compare: bool,
    engine_choices: engine_options.EngineChoices,
    replicas: int | None,
    router: str,
    ray_address: str | None,
    stall_timeout: float | None,
    concurrency: int,
    max_tokens: int | None,
    limit: int | None,
    mode: str,
    honor_timestamps: bool,
    json_path: str | None,
    record_trace: str | None,
    seed: int,
    temperature: float,
    fmt: str | None,
    verbose: bool,
    debug: bool,
) -> None:
    """Replay a multi-turn chat TRACE through the model and report what the prefix cache saves.

    With no TRACE, replays the sample trace shipped with radixcache (8 conversations over 2 shared system
    prompts, 28 turns). TRACE may be ShareGPT JSON/JSONL, conversation JSONL, OpenAI messages JSONL, or a
    token trace (JSONL or msgpack). In --mode live the model's replies become the next turn's history; in
    --mode recorded the trace's assistant turns do, and the model still generates for timing.

    \b
    Examples:
      radixcache replay
      radixcache replay --compare --limit 2
      radixcache replay chat.jsonl --mode recorded --max-tokens 16 --json replay.json
    """
    # Bad combinations are refused before the runtime (torch) is imported: at once, not after a second or two.
    if compare and no_cache:
        raise click.UsageError("--compare already runs without the cache; drop --no-cache")
    if record_trace is not None and (compare or replicas is not None):
        raise click.UsageError("--record-trace records one engine's run: drop --compare and --replicas")
    if replicas is not None and (compare or no_cache):
        raise click.UsageError("--replicas routes by what each replica caches: drop --compare and --no-cache")
    check_replica_flags(replicas)
    check_record_path(record_trace)
    json_file = None if json_path == "-" else json_path  # '-': stdout
    check_record_path(json_file, "--json")
    check_distinct_files(trace, {"--record-trace": record_trace, "--json": json_file})
    from radixcache.runtime.replay import (
        ReplayConfig,
        ReplayError,
        check_trace_for_model,
        engine_factory,
        load_replay_trace,
        plan_sessions,
    )
    from radixcache.runtime.replay import compare as compare_runs
    from radixcache.runtime.replay import replay as replay_run

    kwargs = engine_choices.engine_kwargs(no_cache)
    try:
        config = ReplayConfig(
            mode=mode,
            max_tokens=max_tokens,
            limit=limit,
            temperature=temperature,
            seed=seed,
            concurrency=concurrency,
            honor_timestamps=honor_timestamps,
        )
    except ReplayError as exc:  # a value click's ranges let through (--temperature nan, or over the engine's 100)
        raise click.UsageError(f"--{exc}") from None
    loaded_trace = load_replay_trace(trace, fmt)
    sessions = plan_sessions(loaded_trace, limit)
    turns = sum(s.turns for s in sessions)
    cluster = None
    if replicas is not None:
        # before Ray and the replicas start, as the replay (and, for a text trace, its chat template) would after
        tokenizer = check_trace_for_model(loaded_trace, limit, model, max_tokens)
        _check_chat_template(sessions, tokenizer, trace)
        cluster = cluster_engine(model, replicas, router, ray_address, kwargs, stall_timeout)
        make_engine: Callable[[bool], GenerationEngine] = lambda _enable_cache: cluster  # noqa: E731
    else:
        loaded_model = engine_choices.load_model(model)
        _check_chat_template(sessions, loaded_model.tokenizer, trace)
        make_engine = engine_factory(loaded_model, **kwargs)
    name = Path(trace).name if trace else "sample_chat.jsonl (built in)"

    written = False  # a recording placed at --record-trace's FILE
    staged: StagedRecording | None = None
    with sigterm_as_ctrl_c(), progress(turns, verbose) as (start, on_result, warn):  # kill: what finished is kept
        if compare:
            outcome: Any = compare_runs(
                make_engine, loaded_trace, config, on_start=start, on_result=on_result, on_warning=warn
            )
            results = [outcome.cached, outcome.uncached]
        else:
            start("no cache" if no_cache else "cache")
            engine = make_engine(not no_cache)
            staged = None if record_trace is None else StagedRecording(record_trace)
            try:
                outcome = replay_run(
                    engine,
                    loaded_trace,
                    config,
                    on_result=on_result if staged is None else _placing(on_result, staged),
                    on_warning=warn,
                    record_trace=None if staged is None else staged.staging,
                )
            finally:
                written = staged is not None and staged.finish()
            results = [outcome]
    json_error = _write_json(json_path, outcome.as_dict()) if json_path else None
    console = Console(stderr=json_path is not None and is_stdout(json_path))  # `--json - | jq`: the JSON alone
    first = results[0].summary
    console.print(f"replay of {name}", highlight=False, markup=False)  # names are text, not markup
    console.print(
        f"{first.model}, {first.mode} mode, {first.page_size}-token pages, {first.capacity_blocks:,} blocks, "
        f"{first.policy}",
        highlight=False,
        markup=False,
    )
    console.print(summary_table([r.summary for r in results], outcome if compare else None))
    if cluster is not None:
        console.print(replica_table(cluster))
        cluster.close()
    if compare:
        console.print(f"generated text with and without the cache: {text_verdict(outcome)}")
    if json_path and json_error is None and json_path != "-":
        click.echo(f"wrote {json_path}", err=True)
    stopped = getattr(getattr(outcome, "recorder", None), "stopped", None)  # a write error cut the recording short
    failures = []  # outputs that could not be written: after the table, exit 1
    if json_error is not None:  # the run is not lost with the file
        failures.append(f"cannot write --json {json_path}: {json_error} (the table above holds the summary)")
    if staged is not None and staged.error is not None:  # FILE is as it was; the recording is beside it
        failures.append(f"cannot move the recording onto {record_trace} ({staged.error}): it is in {staged.staging}")
    elif stopped is not None:  # what FILE holds is not this run: no command is offered as reproducing it
        n = outcome.recorder.written
        held = f"holds its first {n:,} request{'s' * (n != 1)}" if written else "is left as it was"
        failures.append(f"the recording stopped ({stopped}): {record_trace} {held}")
    elif record_trace is not None:
        if not written:  # nothing recorded: an earlier recording at FILE stays
            click.echo(f"recorded nothing (no request ran): {record_trace} left as it was", err=True)
        else:
            click.echo(f"recorded {record_trace}" + ("" if first.requests else ": no request finished"), err=True)
        if not no_cache and first.requests and written:  # an empty file is no trace: the command would fail on it
            tiers = getattr(engine, "tiers", None)
            command = simulate_command(record_trace, first, kwargs.get("admission"), tiers)
            click.echo(f"its hit rate through the tree alone: {command}", err=True)
            for note in command_notes(first.policy, tiers):
                click.echo(note, err=True)
            if first.concurrency > 1:
                click.echo(CONCURRENT_NOTE, err=True)
            if first.interrupted:  # the engine served (and recorded) what it had of the request Ctrl-C cut short
                click.echo(INTERRUPTED_NOTE, err=True)
    for message in failures[:-1]:
        click.echo(f"error: {message}", err=True)
    if failures:
        fail(failures[-1])
    interrupted = any(r.summary.interrupted for r in results)
    skipped = results[0].summary.skipped_too_long + results[0].summary.skipped_kv_full
    if interrupted:
        fail("interrupted: the table and JSON hold the requests that finished", EXIT_INTERRUPTED)
    if skipped:
        fail(f"{skipped} turns were skipped (too long for the model's context or the KV cache)", EXIT_SKIPPED)


def _check_chat_template(sessions: list[Any], tokenizer: Any, trace: str | None) -> None:
    """Refuse, before the engine's warm-up, a text trace the model's chat template cannot render: each turn is
    rendered with it, and the first failed after the warm-up with the Python API's hint (pass chat_template=...).
    The first turn of the first conversation with a system prompt and of the first without one are rendered: some
    templates refuse a system message (Gemma's: 'System role not supported'), and a trace whose first conversation
    had none failed at the first that had one, after the turns before it had run, with no result kept."""
    firsts: dict[bool, Any] = {}  # has a system prompt -> the first such conversation
    for session in sessions:
        if session.conversation is not None:
            firsts.setdefault(session.conversation.system is not None, session.conversation)
            if len(firsts) == 2:
                break
    if not firsts or tokenizer is None:
        return  # a token trace (or no turn), or no tokenizer (which the replay refuses itself)
    where = trace or "the built-in sample"
    if not tokenizer.chat_templates:
        fail(
            f"{where} is a text (chat) trace, whose turns are rendered with the model's chat template, and "
            f"{tokenizer.name} has none: replay it with a chat model, or replay a token trace (docs/traces.md)"
        )
    for first in firsts.values():
        probe = [{"role": "system", "content": first.system}] if first.system is not None else []
        probe.append({"role": "user", "content": first.turns[0].user if first.turns else "?"})
        try:
            tokenizer.apply_chat_template(probe, add_generation_prompt=True)
        except EXPECTED as exc:
            fail(f"cannot replay {where}: conversation {first.id!r} turn 1: {describe(exc)}")


def _write_json(path: str, data: dict[str, Any]) -> str | None:
    """Write the run's JSON to `path`, replacing an earlier file whole (radixcache.runtime.atomic_file: a write that
    fails or is killed leaves it as it was); the OSError's reason if it failed (a full disk, a folder removed during
    the run), which the caller reports after the table: raised here, it lost the table of a run that may have taken
    hours, and named no file ('[Errno 28] No space left on device'). The file stdout is (`--json /dev/stdout`, under
    `> FILE` too) is written directly."""
    try:
        if path == "-":
            click.echo(json.dumps(data, indent=2))
            return None
        text = (json.dumps(data, indent=2) + "\n").encode("utf-8")
        if is_stdout(path):
            with open(path, "wb") as handle:
                handle.write(text)
        else:
            atomic_file.write_bytes(path, text)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise  # `| head`: the reader left (cli.errors)
        return exc.strerror or str(exc)
    return None


def _placing(on_result: Callable[[Any], None], staged: StagedRecording) -> Callable[[Any], None]:
    """`on_result`, which first moves the recording onto its FILE once it holds a line."""

    def call(result: Any) -> None:
        staged.place()
        on_result(result)

    return call
