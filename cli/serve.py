"""`radixcache serve`: the engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from radixcache.cli import engine_options
from radixcache.cli.errors import FriendlyCommand, debug_option
from radixcache.cli.listen import bind_sockets, drop_unread
from radixcache.cli.option_parts import check_device
from radixcache.cli.record import (
    CONCURRENT_NOTE,
    EngineShape,
    StagedRecording,
    check_record_path,
    command_notes,
    record_option,
    simulate_command,
)
from radixcache.cli.replicas import check_replica_flags, cluster_engine, replica_options

if TYPE_CHECKING:
    from radixcache.runtime.engine.protocol import GenerationEngine


# uvicorn closes a connection idle for its default 5 s, the same as httpx's pool expiry: a client reusing a
# connection at 4.99 s sends its request as the server closes it, and reads a reset (httpx.ReadError, "Connection
# reset by peer": what one loaded full-suite run of the SmolLM2 tool-call test hit; a known race, which vLLM and
# others fixed the same way). 75 s, nginx's and gunicorn's usual figure, outlasts the common clients' expiry, so
# the client always lets go first; an agent that thinks for a few seconds between calls keeps its connection.
KEEP_ALIVE_S = 75
SHUTDOWN_TIMEOUT_S = 30.0
# Past --shutdown-timeout the requests still running are aborted, and their responses (a 503, a stream's error event
# and [DONE]) get this long to go out before uvicorn cancels what is left.
ABORT_WAIT_S = 5.0


def _check_max_model_len(model: str, max_model_len: int | None) -> None:
    """Refuse a --max-model-len over the model's context, from its config alone (before the weights load): the
    server clamped it to the context without a word, and /v1/models reported a limit other than the one asked for."""
    if max_model_len is None:
        return
    from radixcache.runtime.loading import load_config_and_tokenizer

    context = load_config_and_tokenizer(model)[0].max_position
    if max_model_len > context:
        message = f"{max_model_len:,} is over the model's context of {context:,} tokens (give at most {context})"
        raise click.BadParameter(message, param_hint="'--max-model-len'")


@click.command(cls=FriendlyCommand)
@engine_options.model_option
@click.option("--served-model-name", help="The model id clients send and /v1/models lists [default: --model].")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    help="Require `Authorization: Bearer KEY` (repeatable); each key gets its own cache namespace.",
)
@click.option(
    "--retain-for",
    "retain_for",
    multiple=True,
    metavar="[KEY=]SECONDS",
    help="Default lease of a request that sends no retain_for: SECONDS for every caller, KEY=SECONDS for one API "
    "key (repeatable; docs/agents.md).",
)
@click.option(
    "--public-metrics",
    is_flag=True,
    help="Serve /metrics without a key even under --api-key (by default it needs one, like /v1).",
)
@engine_options.engine_choice_options
@click.option("--schedule", default="lpm", show_default=True, type=click.Choice(["lpm", "fcfs", "dfs-weight"]))
@click.option(
    "--max-prefill-tokens",
    default=1024,
    show_default=True,
    type=click.IntRange(min=1),
    help="Prompt tokens per engine step while nothing decodes.",
)
@click.option(
    "--mixed-prefill-tokens",
    default=24,
    show_default=True,
    type=click.IntRange(min=1),
    help="Prompt tokens per step while requests decode: lower keeps their token times steady under a long prompt, "
    "higher gives that prompt its first token sooner.",
)
@click.option(
    "--staged-prefill-attention",
    type=click.IntRange(min=1),
    help="While requests decode, a prompt chunk whose attention work (query tokens x positions attended) is over "
    "this runs its layers over several steps, so a long cached prefix does not stall the running streams "
    "[default: never].",
)
@click.option(
    "--max-queue",
    type=click.IntRange(min=0),
    help="Most requests waiting for admission; past it a request gets 429 with Retry-After [default: unbounded].",
)
@click.option(
    "--queue-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a request may wait for admission; then it gets 503 with Retry-After [default: no limit].",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Most seconds a request may run; it then ends with what it generated (finish_reason length). A request's "
    "own `timeout` field may only lower it [default: no limit].",
)
@click.option(
    "--stream-stall-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Most seconds a stream's next chunk may wait for a client that stopped reading; then the stream is given "
    "up (its requests cancelled, their KV freed) and ends with error stream_stalled; a connection whose response "
    "waits that long on a client that reads nothing is dropped, and a body that sends nothing for that long is a "
    "408 [default: 60].",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=2),
    help="Most tokens (prompt + completion) per request, at most the model's context; longer prompts get 400 "
    "context_length_exceeded [default: the model's context].",
)
@click.option(
    "--max-body-size",
    default="64MiB",
    show_default=True,
    help="Largest request body (e.g. 16MiB); a larger one gets 413 before it is read whole.",
)
@click.option(
    "--min-body-rate",
    type=click.FloatRange(min=0),
    metavar="BYTES",
    help="Bytes a second a request body must average: one still arriving --body-grace seconds after its request "
    "began, plus a second per BYTES it sent, gets 408 (a trickling upload); 0: no rate [default: 500].",
)
@click.option(
    "--body-grace",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Seconds any request body may take before --min-body-rate counts [default: 20].",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Seconds a request's headers may take to arrive whole; then 408 and the connection closes [default: 20].",
)
@replica_options
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]))
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda.")
@click.option("--no-cache", is_flag=True, help="Disable prefix reuse (the baseline for benchmarks).")
@click.option("--log-level", default="warning", show_default=True, type=click.Choice(["debug", "info", "warning"]))
@click.option(
    "--keep-alive",
    default=KEEP_ALIVE_S,
    show_default=True,
    type=click.IntRange(1, 86_400),
    help="Seconds an idle connection stays open. Keep it above your clients' pool expiry (httpx, and so the "
    "openai client: 5 s), or a request sent on a connection the server is closing is reset.",
)
@click.option(
    "--shutdown-timeout",
    default=SHUTDOWN_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0),
    help="On SIGTERM or Ctrl-C, seconds in-flight requests get to finish; then each is aborted (503 shutting_down; "
    "a stream ends with that error event and [DONE]).",
)
@record_option
@debug_option
def serve(
    model: str,
    served_model_name: str | None,
    host: str,
    port: int,
    api_keys: tuple[str, ...],
    retain_for: tuple[str, ...],
    public_metrics: bool,
    engine_choices: engine_options.EngineChoices,
    schedule: str,
    max_prefill_tokens: int,
    mixed_prefill_tokens: int,
    staged_prefill_attention: int | None,
    max_queue: int | None,
    queue_timeout: float | None,
    request_timeout: float | None,
    stream_stall_timeout: float | None,
    max_model_len: int | None,
    max_body_size: str,
    min_body_rate: float | None,
    body_grace: float | None,
    header_timeout: float | None,
    replicas: int | None,
    router: str,
    ray_address: str | None,
    stall_timeout: float | None,
    dtype: str,
    device: str,
    no_cache: bool,
    log_level: str,
    keep_alive: int,
    shutdown_timeout: float,
    record_trace: str | None,
    debug: bool,
) -> None:
    """Serve the model over OpenAI's API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/models), with
    /health and Prometheus /metrics. Requests that share a prefix reuse its KV;
    usage.prompt_tokens_details.cached_tokens says how much. Under load, --max-queue and --queue-timeout push back
    with 429 / 503 and Retry-After instead of queueing without bound. Ctrl-C (or SIGTERM) lets in-flight requests
    finish (up to --shutdown-timeout; the rest get 503 shutting_down), then stops.

    \b
    Example:
      radixcache serve --port 8000 --api-key sk-alice --api-key sk-bob
      curl -s localhost:8000/v1/chat/completions -H 'Authorization: Bearer sk-alice' \\
        -H 'Content-Type: application/json' \\
        -d '{"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]}'
    """
    import uvicorn

    from radixcache.runtime.engine.engine import Engine
    from radixcache.runtime.kv.pool import parse_memory
    from radixcache.runtime.server import create_app
    from radixcache.runtime.server.header_deadline import HEADER_TIMEOUT_S, header_deadline_protocol
    from radixcache.runtime.server.http_common import STREAM_STALL_S
    from radixcache.runtime.server.leases import parse_lease_defaults

    kwargs = engine_choices.engine_kwargs(no_cache)
    if any(not k.strip() for k in api_keys):
        raise click.BadParameter("an API key cannot be empty", param_hint="'--api-key'")
    if not host.strip():  # an empty host (an unset variable, say) would listen on every interface, v4 and v6
        raise click.BadParameter(
            "empty: give an address (127.0.0.1, or 0.0.0.0 for every interface)", param_hint="'--host'"
        )
    check_device(device)
    check_replica_flags(replicas)
    if record_trace is not None and replicas is not None:
        raise click.UsageError("--record-trace records one engine: drop --replicas")
    check_record_path(record_trace)
    try:
        lease_defaults = parse_lease_defaults(retain_for)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--retain-for'") from None
    if any(sep and key not in api_keys for key, sep, _ in (spec.rpartition("=") for spec in retain_for)):
        # a default for a key no caller can send (a typo, or no --api-key at all): it would never apply
        raise click.BadParameter("a KEY=SECONDS names a key that no --api-key gives", param_hint="'--retain-for'")
    timeouts = (("--request-timeout", request_timeout), ("--queue-timeout", queue_timeout))
    timeouts += (("--stream-stall-timeout", stream_stall_timeout), ("--shutdown-timeout", shutdown_timeout))
    timeouts += (("--body-grace", body_grace), ("--header-timeout", header_timeout))
    for name, seconds in timeouts:
        if seconds is not None and not math.isfinite(seconds):  # FloatRange lets nan and inf through
            raise click.BadParameter(f"{seconds} is not a finite number of seconds", param_hint=f"'{name}'")
    if min_body_rate is not None and not math.isfinite(min_body_rate):
        raise click.BadParameter(
            f"{min_body_rate} is not a finite number of bytes a second", param_hint="'--min-body-rate'"
        )
    body_rate = {"body_grace": body_grace, "min_body_rate": min_body_rate}
    try:
        max_body_bytes = parse_memory(max_body_size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--max-body-size'") from None
    _check_max_model_len(model, max_model_len)
    options = {
        "schedule": schedule,
        "max_prefill_tokens": max_prefill_tokens,
        "mixed_prefill_tokens": mixed_prefill_tokens,
        "staged_prefill_attention": staged_prefill_attention,
        "max_queue": max_queue,
        "queue_timeout": queue_timeout,
        "dtype": dtype,
        "device": device,
        **kwargs,
    }
    if replicas is not None and no_cache:
        raise click.UsageError("--replicas routes by what each replica caches: drop --no-cache")
    # Every option is checked: the sockets are bound now, before the load, and closed (the engine too) however
    # this ends, a load that fails included.
    staged: StagedRecording | None = None
    recorder: Any = None
    with contextlib.ExitStack() as stack:
        if record_trace is not None:  # FILE is replaced at the first line recorded, not now (docs/traces.md)
            staged = StagedRecording(record_trace)
            stack.callback(staged.finish)  # last: after the engine's close has written its last lines
        listeners = bind_sockets(host, port)
        for listener in listeners:
            stack.callback(listener.close)
        drop_unread(listeners, STREAM_STALL_S if stream_stall_timeout is None else stream_stall_timeout)
        engine: GenerationEngine
        if replicas is not None:
            engine = cluster_engine(model, replicas, router, ray_address, options, stall_timeout)
        else:
            engine = Engine(engine_choices.load_model(model), enable_cache=not no_cache, **options)
        stack.callback(engine.close, 30)  # after uvicorn's drain nothing is in flight; queued disk writes finish
        if engine.tokenizer is None:
            raise ValueError(f"{model}: the server needs a model with a tokenizer")
        if staged is not None:  # closed by engine.close, after the last request left
            recorder = engine.record_trace(staged.staging)
            recorder.on_first_line = staged.place  # before any request: none is served yet
        name = served_model_name or model
        app = create_app(
            engine,
            name,
            api_keys=api_keys,
            public_metrics=public_metrics,
            max_model_len=max_model_len,
            request_timeout=request_timeout,
            lease_defaults=lease_defaults,
            max_body_bytes=max_body_bytes,
            **{name: value for name, value in body_rate.items() if value is not None},
            **({} if stream_stall_timeout is None else {"stream_stall_timeout": stream_stall_timeout}),
        )
        port = listeners[0].getsockname()[1]
        click.echo(f"serving {name} on http://{host}:{port}/v1 (Ctrl-C to stop)", err=True)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=shutdown_timeout + ABORT_WAIT_S,  # a backstop: the abort ends them first
            timeout_keep_alive=keep_alive,
            http=header_deadline_protocol(HEADER_TIMEOUT_S if header_timeout is None else header_timeout),
        )
        # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to our handlers: both end here.
        previous = signal.signal(signal.SIGTERM, _stop)
        try:
            _aborting_server(config, app.state.inflight.abort, shutdown_timeout).run(sockets=listeners)
        except (KeyboardInterrupt, _Stopped):
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
    if staged is not None and record_trace is not None:
        if staged.error is not None:  # FILE is as it was; the recording is beside it
            moved = f"cannot move the recording onto {record_trace} ({staged.error}): it is in {staged.staging}"
            click.echo(moved, err=True)
        elif recorder is not None and recorder.stopped is not None:  # a write error: FILE does not hold the traffic
            n = recorder.written
            held = f"holds its first {n:,} request{'s' * (n != 1)}" if staged.placed else "is left as it was"
            click.echo(f"the recording stopped ({recorder.stopped}): {record_trace} {held}", err=True)
        elif staged.placed:
            _report_recording(engine, record_trace, no_cache, options["admission"])
        else:  # no line: an earlier recording at FILE stays
            click.echo(f"recorded nothing (no request was served): {record_trace} left as it was", err=True)
    click.echo("server stopped", err=True)


def _report_recording(engine: GenerationEngine, path: str, no_cache: bool, admission: str | None) -> None:
    """Where the trace went, the server's own hit rate, and the command that replays it through the tree alone."""
    stats = engine.stats
    click.echo(f"recorded {path}: {stats.requests} requests, hit rate {stats.hit_rate:.2%} as served", err=True)
    if no_cache:
        return
    cache = engine.cache
    shape = EngineShape(cache.capacity_blocks, cache.policy.name, cache.page_size)
    tiers = getattr(engine, "tiers", None)
    click.echo(f"its hit rate through the tree alone: {simulate_command(path, shape, admission, tiers)}", err=True)
    for note in command_notes(shape.policy, tiers):
        click.echo(note, err=True)
    click.echo(CONCURRENT_NOTE, err=True)


def _aborting_server(config: Any, abort: Callable[[], object], grace: float) -> Any:
    """uvicorn's server, which calls `abort` (the app's Inflight.abort) `grace` seconds into a shutdown: each request
    still running then ends in OpenAI's shape (a 503 shutting_down; a stream, that error event and [DONE]). Left to
    uvicorn's own timeout, they were cut off mid-body (a client read "incomplete chunked read", the log a traceback
    per request)."""
    import uvicorn

    class AbortingServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            timer = asyncio.get_running_loop().call_later(grace, abort)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return AbortingServer(config)


class _Stopped(Exception):
    """SIGTERM, re-raised by uvicorn once it has shut down."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped
