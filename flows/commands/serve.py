"""`unmask serve`: the registry's aliases behind an OpenAI-compatible API, on uvicorn.

The served names are aliases (`--alias`, repeatable; default production and fallback) or registered
models (`--model`). Weights are loaded from each version's recorded model reference, or fetched from
the registry where `unmask weights push` put them when that reference is not here (registry/weights.py),
and refused unless they hash to the version's recorded sha256; `--weights NAME=FOLDER` points a
registered model at another folder (still checked). The request log goes to
<state folder>/serving/requests/ (--request-log-dir); with $UNMASK_EVIDENCE_URL (a postgresql:// URL) its rows,
the probe results and the look numbers go to the team PostgreSQL instead, shared by replicas on several machines
(the journals stay in the folder; docs/rollout.md, "Replicas on several machines").
`--routes FILE` (a serving policy, e.g. gates/serving.yaml) routes requests whose `model` is `auto`
(or a route's name) to the arm its routes pick; the aliases its arms need are served too, and the file
is re-read when it changes, as is the live weights overlay a rollout writes (`--weights-file`, default
<state folder>/rollouts/weights.json).
`--route R` is for a server that is one arm of a route an outside controller splits (KServe's
`canaryTrafficPercent`, Argo Rollouts' `setWeight`, Flagger): it serves one name, answers `model` auto or R
with it, and logs every request with route R and that name as its arm, so the canary analysis judges the stable
and the canary pods' rows together (docs/rollout.md, "Outside controllers").
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from flows.commands import options

if TYPE_CHECKING:
    from gates.request_limits import RequestLimits

console = Console(stderr=True)


def parse_weights(values: list[str]) -> dict[str, str]:
    sources = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep or not name or not folder:
            raise typer.BadParameter(f"--weights {value!r}: expected NAME=FOLDER", param_hint="--weights")
        if not Path(folder).expanduser().is_dir():
            raise typer.BadParameter(f"--weights {value!r}: {folder} is not a folder", param_hint="--weights")
        sources[name] = str(Path(folder).expanduser().resolve())
    return sources


def serve_command(
    alias: list[str] = typer.Option(
        None, "--alias", "-a", help="Alias to serve; repeat (default: production, fallback)."
    ),
    model: list[str] = typer.Option(
        None, "--model", "-m", help="Registered model to serve (its current version); repeat."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (0.0.0.0 to share on the network)."),
    port: int = typer.Option(8000, "--port", callback=options.port, help="Port to listen on."),
    weights: list[str] = typer.Option(None, "--weights", help="NAME=FOLDER: load registered model NAME from FOLDER."),
    device: str = typer.Option("cpu", "--device", callback=options.device, help="cpu or cuda."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    max_batch: int = typer.Option(16, "--max-batch", min=1, help="Largest batch; 1 turns batching off."),
    batch_window_ms: float = typer.Option(
        10.0, "--batch-window-ms", min=0, help="How long a request waits for company."
    ),
    max_pending: int = typer.Option(64, "--max-pending", min=1, help="Requests queued per version before 429."),
    continuous: bool = typer.Option(
        None,
        "--continuous/--static-batches",
        help="Deterministic diffusion requests "
        "join a running batch at its next block, or each batch runs start to finish "
        "(default: continuous on a GPU, static on the CPU).",
    ),
    memory_budget: str = typer.Option(
        None,
        "--memory-budget",
        help="Peak bytes a batch may use, e.g. 8GiB (default: the device's free memory once the models are loaded).",
    ),
    timeout_s: float = typer.Option(120.0, "--timeout", min=0.1, help="Per-request timeout in seconds (then 504)."),
    max_tokens: int = typer.Option(
        None,
        "--max-tokens",
        min=1,
        help="Largest max_tokens a request may ask for (default: what the model's context leaves after the prompt).",
    ),
    api_key_file: Path = typer.Option(
        None,
        "--api-key-file",
        help="API keys, one a line (also $UNMASK_API_KEYS, "
        "comma-separated); when set, /v1/ requests need one (else 401).",
    ),
    max_prompt_tokens: int = typer.Option(384, "--max-prompt-tokens", min=1, help="Longest prompt, in tokens."),
    likelihood_samples: int = typer.Option(
        8,
        "--likelihood-samples",
        min=1,
        max=1024,
        help="Monte Carlo samples "
        "a masked-diffusion model scores an echoed prompt with (unmask.likelihood "
        "overrides it per request).",
    ),
    poll_s: float = typer.Option(5.0, "--poll", min=0.1, help="Seconds between registry polls for alias moves."),
    request_log: bool = typer.Option(True, "--request-log/--no-request-log", help="Write the Parquet request log."),
    request_log_dir: Path = typer.Option(
        None,
        "--request-log-dir",
        file_okay=False,
        help="Where the request log goes (default: <state folder>/serving/requests). Replicas that share a "
        "folder (a volume every pod mounts) share their canary evidence: the analysis reads them all.",
    ),
    routes: Path = typer.Option(
        None,
        "--routes",
        help="Serving policy (e.g. gates/serving.yaml): route "
        "`model: auto` requests, with sticky traffic splits re-read live.",
    ),
    route: str = typer.Option(
        None,
        "--route",
        help="The route an outside controller (KServe, Argo Rollouts, Flagger) splits, this server being one arm: "
        "with one --alias (or --model), every request is logged with this route and that name as its arm, so the "
        "canary analysis judges it. Not with --routes.",
    ),
    weights_file: Path = typer.Option(
        None,
        "--weights-file",
        help="Live weights overlay a rollout writes (default: <state folder>/rollouts/weights.json); with --routes.",
    ),
    max_shadows: int = typer.Option(
        4,
        "--max-shadows",
        min=0,
        help="Shadow copies in flight at once (routes' `shadow:`); more are dropped and counted.",
    ),
    threads: int = typer.Option(
        None,
        "--threads",
        callback=options.threads,
        help="torch CPU threads for decoding (default: $UNMASK_THREADS, else 1).",
    ),
) -> None:
    """Serve registered models over OpenAI's completions and chat API, with exact dynamic batching."""
    import uvicorn

    from flows.environment import configure_environment
    from gates.serving_policy import ServingPolicyError
    from serving import Limits, PoolSettings, ServeSettings, create_app
    from serving.app import routed_as

    state = configure_environment()  # idempotent; gives the state folder the rest of unmask uses

    names = list(dict.fromkeys([*(alias or ([] if model else ["production", "fallback"])), *(model or [])]))
    try:
        routed_as(route, routes, names)  # one line before anything else is checked or loaded
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    names, compute, api_keys, analysis_keys, budget = checked_inputs(names, routes, api_key_file, memory_budget)
    evidence_url = checked_evidence()  # the request log's and the analysis's store, when not the folder
    options.port_free(host, port)  # a busy port is one line before any model loads
    pool = PoolSettings(
        names=names,
        sources=parse_weights(weights or []),
        device=device,
        dtype=dtype,
        poll_interval_s=poll_s,
        max_batch=max_batch,
        batch_window_s=batch_window_ms / 1000,
        max_pending=max_pending,
        memory_budget=budget,
        continuous=continuous,
    )
    settings = ServeSettings(
        pool=pool,
        limits=Limits(max_tokens=max_tokens, max_prompt_tokens=max_prompt_tokens),
        request_timeout_s=min(timeout_s, compute.time_budget_s),
        compute=compute,
        request_log_dir=(request_log_dir or state / "serving" / "requests") if request_log else None,
        evidence_url=evidence_url,
        routes_path=routes,
        route=route,
        weights_path=weights_file,
        max_shadows=max_shadows,
        api_keys=api_keys,
        analysis_keys=analysis_keys,
        likelihood_samples=likelihood_samples,
    )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)
    except ServingPolicyError as e:  # routes that clash with the served names
        typer.echo(f"error: --routes: {e}", err=True)
        raise typer.Exit(2) from None
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False))

    async def run() -> None:
        serving = asyncio.create_task(server.serve())
        while not serving.done() and not app.state.pool.ready and not app.state.pool.error:
            await asyncio.sleep(0.1)
        if app.state.pool.error:  # nothing to serve: stop rather than answer 503 for ever
            server.should_exit = True
        await serving

    threads, threads_from = options.apply_threads(threads)
    console.print(
        f"unmask serve: {', '.join(names)} on http://{host}:{port}/v1 (health: /health, metrics: /metrics; "
        f"torch threads: {threads} from {threads_from})",
        highlight=False,
    )
    asyncio.run(run())
    if app.state.pool.error:
        typer.echo(f"error: {app.state.pool.error}", err=True)  # unwrapped: the hashes stay copyable
        raise typer.Exit(2)


def checked_inputs(
    names: list[str], routes: Path | None, api_key_file: Path | None, memory_budget: str | None
) -> tuple[list[str], RequestLimits, frozenset[str], frozenset[str], int | None]:
    """The names to serve (with what the routes need), the compute limits, the API keys, the controllers' analysis
    keys and the memory budget, each checked before any model loads: a bad one is one `error:` line naming its flag
    (exit 2)."""
    from gates.request_limits import RequestLimits
    from gates.serving_policy import ServingPolicyError, load_serving_policy
    from sampler.memory import parse_bytes
    from serving import ApiKeyError, load_analysis_keys, load_api_keys

    compute = RequestLimits()
    if routes is not None:
        try:
            policy = load_serving_policy(routes)
        except ServingPolicyError as e:
            typer.echo(f"error: --routes: {e}", err=True)
            raise typer.Exit(2) from None
        names = list(dict.fromkeys([*names, *policy.aliases()]))  # what the routes need
        compute = policy.limits
    try:
        api_keys, analysis_keys = load_api_keys(api_key_file), load_analysis_keys()
    except ApiKeyError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        budget = parse_bytes(memory_budget) if memory_budget is not None else None
    except ValueError as e:
        typer.echo(f"error: --memory-budget: {e}", err=True)
        raise typer.Exit(2) from None
    return names, compute, api_keys, analysis_keys, budget


def checked_evidence() -> str | None:
    """$UNMASK_EVIDENCE_URL reached and ready (None when unset), or one `error:` line naming its host, port and
    database, never its password (exit 2)."""
    from evals.evidence_store import EvidenceError
    from serving.evidence import checked_evidence_url

    try:
        return checked_evidence_url()
    except EvidenceError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
