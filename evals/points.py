"""Sweep points: the grid of a sweep file turned into each point's settings and SamplerConfig.

A point keeps only the settings its model kind reads (sampler.effective), so an autoregressive or
block-diffusion model's points collapse to one per distinct setting it reads.
"""

from __future__ import annotations

import itertools
from dataclasses import fields as dc_fields
from typing import Any

from evals.tasks import GSM8KTask, get_task
from sampler import SamplerConfig
from sampler.effective import settings_read

DEFAULT_BACKEND = "torch"


def grid_points(spec: Any) -> list[dict[str, Any]]:
    """Every combination of each grid part's values, parts and values in file order."""
    points = []
    for part in spec.grid or [{}]:
        keys = list(part)
        points += [dict(zip(keys, values)) for values in itertools.product(*(part[k] for k in keys))]
    return points


def settings_for(spec: Any, point: dict[str, Any], gen_length: int, kind: str = "masked-diffusion") -> dict[str, Any]:
    """The full settings of a point: base, then the point, keeping what a model of `kind` reads
    (sampler.effective.settings_read). An AR point keeps the base's block width for its first-block
    clock; a block-diffusion point's block is the model's canvas."""
    settings: dict[str, Any] = {"gen_length": gen_length} | spec.base | point
    read = settings_read(kind)
    if read is not None:
        settings = {k: v for k, v in settings.items() if k in read}
    if kind in ("autoregressive", "api"):  # an API model reads only length and temperature, as AR does
        n = settings["gen_length"]
        settings |= {"steps": n, "block_length": min(spec.base.get("block_length", n), n)}
        if n % settings["block_length"]:
            settings["block_length"] = n
    elif kind == "block-diffusion":
        settings.setdefault("steps", settings["gen_length"])
        settings["block_length"] = settings["gen_length"]
    else:
        settings.setdefault("steps", settings["gen_length"])
    return settings


def build_config(settings: dict[str, Any], ids: dict[str, Any] | None = None) -> tuple[SamplerConfig, str]:
    """(SamplerConfig, backend) from point settings; ValueError says which setting is wrong."""
    settings = dict(settings)
    backend = settings.get("backend", DEFAULT_BACKEND)
    if "backend" not in {f.name for f in dc_fields(SamplerConfig)}:
        settings.pop("backend", None)
        if backend != DEFAULT_BACKEND:
            raise ValueError(f"backend {backend!r} is not available in this sampler (only '{DEFAULT_BACKEND}')")
    return SamplerConfig.from_dict(settings | (ids or {})), backend


def point_problems(spec: Any, task: Any, kind: str = "masked-diffusion") -> list[str]:
    problems = []
    for point in grid_points(spec):
        try:
            build_config(settings_for(spec, point, task_gen_length(task), kind))
        except (ValueError, TypeError) as e:
            problems.append(f"{point}: {e}")
    return problems


def valid_points(spec: Any, task: Any, kind: str = "masked-diffusion") -> list[dict[str, Any]]:
    """The grid points that give a valid SamplerConfig for a model of `kind` (deduplicated where the
    kind ignores settings: AR and block-diffusion models)."""
    seen, points = set(), []
    for point in grid_points(spec):
        settings = settings_for(spec, point, task_gen_length(task), kind)
        try:
            build_config(settings)
        except (ValueError, TypeError):
            continue
        key = repr(sorted(settings.items()))
        if key not in seen:
            seen.add(key)
            points.append(settings)
    return points


def task_gen_length(task: Any) -> int:
    if task.file:
        return GSM8KTask().gen_length

    return get_task(task.task).gen_length
