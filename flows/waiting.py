"""A paused promote flow run says so in the registry, so `unmask approve` starts no temporary Prefect server to
look for one that is not there (a registry write then takes a second or two, not half a minute).

While `promote_flow` waits in `pause_flow_run`, the version carries `unmask.waiting_flow.<stage>` = its flow run id
("" once it resumed or timed out). Without Prefect imports: `unmask approve` reads it on its fast path.
"""

from __future__ import annotations

import os
from typing import Any

from registry import Registry
from registry.store import model_tag


def waiting_tag(stage: str) -> str:
    """The version tag a paused promote flow run leaves while it waits: its flow run id ("" once it resumed)."""
    return model_tag(f"waiting_flow.{stage}")


def mark_waiting(tracking_uri: str, model_id: str, version: str, stage: str, flow_run_id: str) -> None:
    """Say in the registry that a flow run waits for this approval, so `unmask approve` asks Prefect only then."""
    Registry(tracking_uri).set_version_tags(model_id, version, {waiting_tag(stage): flow_run_id})


def may_be_waiting(registry: Any, model_id: str, version: str, stage: str) -> bool:
    """Whether a promote flow run may be paused for this approval: one said so in the registry, or a Prefect
    server is configured (asking it is cheap). Otherwise no temporary Prefect server is started to look."""
    return bool(registry.version_tags(model_id, version).get(waiting_tag(stage)) or os.environ.get("PREFECT_API_URL"))
