"""Serving records (`unmask loadtest`) into MLflow and back, against the version that answered.

Each `ServingRecord` is its own run in the `unmask-evaluations` experiment, a child of the version's
evidence run: tags name the model, version, weights sha256 and concurrency (`unmask.kind` =
`serving`), the measurements are metrics, and `serving/record.json` holds the record, its sha256 a
run tag checked on every read (registry/integrity.py), exactly as evidence artifacts are.
`serving_records(registry, model, version)` gives the latest record per concurrency for the weights
the version holds; `registry.tracking.verified_evidence` attaches them to the evidence gates judge.

A load test's throughput-vs-latency plot is one run of its own (`unmask.kind` = `serving-curve`) holding
`serving/curve.png` and naming the record runs it was drawn from; its points are those records, not a copy.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from mlflow.entities import Metric

from evals.records import ServingRecord
from registry.connection import EVALUATIONS_EXPERIMENT, RegistryError
from registry.integrity import seal_run, verify_artifact
from registry.store import Registry, filter_literal, model_tag

log = logging.getLogger(__name__)
ARTIFACT = "serving/record.json"
CURVE_ARTIFACT = "serving/curve.png"
METRICS = (
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "ttfb_p50_s",
    "tokens_per_s",
    "requests_per_s",
    "error_rate",
    "same_answer_share",
    "requests",
    "concurrency",
)


def log_serving_record(registry: Registry, record: ServingRecord) -> ServingRecord:
    """Log `record` against its registered version (RegistryError unless the registry holds that version with
    those weights); returns it with `run_id` set."""
    tags = registry.version_tags(record.model, record.version)
    held = tags.get(model_tag("weights_sha256"), "")
    if record.weights_sha256 != held:
        raise RegistryError(
            f"{record.model} version {record.version} holds weights {held[:12] or 'none'}, the "
            f"server answered with {record.weights_sha256[:12] or 'unnamed weights'}; not logged"
        )
    client = registry.client
    run = client.create_run(
        registry.experiment_id(EVALUATIONS_EXPERIMENT),
        run_name=(f"{record.model}/{record.version} serving c={record.concurrency}"),
        tags={
            model_tag("kind"): "serving",
            model_tag("model"): record.model,
            model_tag("version"): record.version,
            model_tag("weights_sha256"): record.weights_sha256,
            model_tag("concurrency"): str(record.concurrency),
            model_tag("served_as"): record.served_as,
            **({"mlflow.parentRunId": tags[model_tag("evidence_run")]} if tags.get(model_tag("evidence_run")) else {}),
        },
    )
    logged = replace(record, run_id=run.info.run_id)
    data = json.dumps(logged.to_dict(), indent=2, sort_keys=True).encode()
    ms = int(time.time() * 1000)
    seal_run(
        client,
        run.info.run_id,
        [Metric(name, float(getattr(record, name)), ms, 0) for name in METRICS if getattr(record, name) is not None],
        ARTIFACT,
        data,
    )
    return logged


def log_load_curve(registry: Registry, records: list[ServingRecord], plot: Path) -> str:
    """Log the PNG `plot` of logged `records` (each with its run id) as one `serving-curve` run; its run id."""
    runs = [r.run_id for r in records if r.run_id]
    if not runs:
        raise RegistryError("log_load_curve: none of the records was logged; there is no curve to log against")
    client = registry.client
    run = client.create_run(
        registry.experiment_id(EVALUATIONS_EXPERIMENT),
        run_name="load test curve",
        tags={
            model_tag("kind"): "serving-curve",
            model_tag("serving_runs"): ",".join(runs),
            model_tag("models"): ",".join(dict.fromkeys(f"{r.model}/{r.version}" for r in records if r.run_id)),
        },
    )
    try:
        with tempfile.TemporaryDirectory() as folder:
            named = Path(folder) / Path(CURVE_ARTIFACT).name
            shutil.copyfile(plot, named)
            client.log_artifact(run.info.run_id, str(named), str(Path(CURVE_ARTIFACT).parent))
        client.set_terminated(run.info.run_id, "FINISHED")
    except BaseException:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    run_id: str = run.info.run_id  # mlflow's RunInfo.run_id (a property subclass) reads as Any
    return run_id


def serving_records(
    registry: Registry, model: str, version: str, weights_sha256: str | None = None
) -> list[ServingRecord]:
    """The latest serving record of each concurrency logged against `model` `version` (and its weights), by
    concurrency; a record whose artifact no longer matches its sha256 raises EvidenceTampered.

    In a snapshot they are picked from its one read of every serving record (a judgement reads the candidate's and
    the baselines'); else the store filters them."""
    wanted = {model_tag("kind"): "serving", model_tag("model"): model, model_tag("version"): str(version)}
    if weights_sha256:
        wanted[model_tag("weights_sha256")] = weights_sha256
    if registry.snapshot:
        every = registry.search_runs(EVALUATIONS_EXPERIMENT, f"tags.`{model_tag('kind')}` = 'serving'")
        found = [r for r in every if all(r.data.tags.get(k) == v for k, v in wanted.items())]
    else:
        literal = {model_tag("model"): "model", model_tag("version"): "version", model_tag("weights_sha256"): "weights"}
        found = list(
            registry.search_runs(
                EVALUATIONS_EXPERIMENT,
                " and ".join(f"tags.`{k}` = {filter_literal(v, literal.get(k, 'kind'))}" for k, v in wanted.items()),
            )
        )
    latest: dict[int, ServingRecord] = {}
    for run in found:
        if run.info.status != "FINISHED":
            continue
        # a record that is gone or unreadable weakens the evidence (the serving gate then lacks that level); it
        # takes nothing down. One that reads but does not match its sha256 is tampered: EvidenceTampered.
        try:
            data = registry.load_artifact_bytes(run.info.run_id, ARTIFACT)
        except RegistryError as e:
            log.warning("%s version %s: serving record left out: %s", model, version, e)
            continue
        verify_artifact(dict(run.data.tags), model, version, run.info.run_id, ARTIFACT, data)
        try:
            record = ServingRecord.from_dict(json.loads(data))
        except (ValueError, TypeError) as e:
            log.warning(
                "%s version %s: serving record of run %s left out: unreadable (%s)", model, version, run.info.run_id, e
            )
            continue
        latest[record.concurrency] = record  # runs come oldest first: the last one of a level wins
    return [latest[c] for c in sorted(latest)]
