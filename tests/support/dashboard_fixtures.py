"""A registry filled the way `unmask run` fills it, for the dashboard tests: a real (small) sweep, real
evidence, gate reports, sign-offs, an approval, promotions, a rollback, a refusal and a nightly regression finding.

Models: the bundled `tiny-llada` and `tiny-ar` when they are in `models/weights/`, else two random-weight
char-level models (a diffusion one and a causal one, tests/support/eval_fixtures.py); set
UNMASK_DASHBOARD_MODELS=random or =bundled to choose. Random weights score 0 on every task, so the
fixture judges with a policy (written beside the registry, named by $UNMASK_POLICY for the dashboard)
whose PoC gates such a model can clear at this size; staging and production keep real thresholds and
fail for stated reasons.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from gates.policy import POLICY_PATH

TASK, GEN_LENGTH, ITEMS = "arith", 32, 2  # arith answers (worked line + `#### N`) need 32 positions
APPROVER, SIGNER, ONCALL = "grace", "ada", "oncall"


@dataclass(frozen=True)
class DashboardRegistry:
    """Where the filled registry lives and what was put in it."""

    home: Path  # UNMASK_HOME of the fixture (the registry is home/mlflow/mlflow.db)
    tracking_uri: str
    policy_path: Path
    candidate: str
    fallback: str
    candidate_version: str
    fallback_version: str

    def env(self) -> dict[str, str]:
        """The environment a dashboard process needs to read this registry with this policy."""
        return {
            "UNMASK_HOME": str(self.home),
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            "UNMASK_POLICY": str(self.policy_path),
        }


def fixture_policy(path: Path) -> Path:
    """The bundled policy with the operating point at this sweep's size and PoC gates a tiny model can clear."""
    data = yaml.safe_load(POLICY_PATH.read_text())
    for stage in data["stages"].values():
        stage["operating_point"] = {"task": TASK, "gen_length": GEN_LENGTH}
    poc = data["stages"]["poc"]["gates"]
    poc["quality"]["threshold"] = 0.0
    poc["quality_vs_fallback"]["min_absolute_change"] = -1.0
    poc["latency"]["max_p95_s"] = 120.0
    poc["speedup"]["min_speedup"] = 0.0
    poc["data_validity"]["min_items"] = ITEMS
    staging = data["stages"]["staging"]["gates"]
    staging["data_validity"]["min_items"] = ITEMS
    for stage in data["stages"].values():  # no load test runs here, so no serving record exists
        stage["gates"].pop("serving", None)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def model_refs(root: Path) -> tuple[str, str]:
    """(diffusion candidate, AR fallback) model references."""
    from models.loading import WEIGHTS_DIR

    choice = os.environ.get("UNMASK_DASHBOARD_MODELS", "auto")
    bundled = all((WEIGHTS_DIR / m / "config.json").is_file() for m in ("tiny-llada", "tiny-ar"))
    if choice == "bundled" or (choice == "auto" and bundled):
        return "tiny-llada", "tiny-ar"
    from tests.support.eval_fixtures import write_model

    return (str(write_model(root / "random-llada", seed=1)), str(write_model(root / "random-ar", causal=True, seed=2)))


def sweep_spec(models: list[str]):
    from evals.sweep import parse_sweep

    return parse_sweep(
        {
            "name": "dashboard-fixture",
            "models": models,
            "tasks": [{"task": TASK, "split": "test", "n": ITEMS}],
            "base": {"gen_length": GEN_LENGTH, "block_length": 8, "temperature": 0.0},
            "grid": [
                {"steps": [8, 32]},
                {"steps": [32], "parallel": ["threshold"], "parallel_threshold": [0.9]},
                {"gen_length": [64], "steps": [16]},
            ],
            "measure": {"warmup": 0, "batch_size": 1},
        }
    )


def build_dashboard_registry(root: Path) -> DashboardRegistry:
    """Evaluate, register, judge, approve, promote and roll back, into a new registry under `root`."""
    from evals.evaluate import load_task
    from evals.evidence import gather_evidence
    from evals.pipeline import measure_speeds
    from evals.reproducibility import probe_model
    from evals.sweep import run_sweep
    from gates.policy import load_policy
    from gates.results import speed_points
    from registry import Registry, audit, judge, promote, register_evidence, rollback, sign_off
    from registry.audit import AuditEvent
    from registry.promotion import PromotionRefused
    from registry.store import now_iso
    from tests.support.flow_fixtures import seed_registry

    home = root / "home"
    seed_registry(home)  # the session's migrated template store, not a second migration
    tracking_uri = f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
    policy_path = fixture_policy(root / "policy.yaml")
    policy = load_policy(policy_path)
    diffusion, ar = model_refs(root)
    spec = sweep_spec([diffusion, ar])
    result = run_sweep(spec, root / "records")
    if result.failures or not result.records:
        raise RuntimeError(f"dashboard fixture sweep failed: {result.failures}")
    gathered = gather_evidence(spec, result, plots=False, reproducibility=False)
    prompts = [item.prompt for item in load_task(TASK, "test", ITEMS).items]
    evidence = {}
    for ref, ev in zip([diffusion, ar], gathered.candidates):
        settings = next(p.settings for p in result.plan if p.ref == ref)
        # same-process and batch-invariance only: a fresh interpreter per model costs more than the test is worth
        verdict = probe_model(ref, settings, prompts, fresh_process=False)
        evidence[ref] = replace(ev, reproducibility=verdict)
    candidate_plan = next(plan for plan in result.plans.values() if any(p.ref == diffusion for p in plan.points))
    pairs = speed_points(evidence[diffusion], evidence[ar], policy.stages.values())
    evidence[diffusion] = replace(evidence[diffusion], speed=measure_speeds(pairs, candidate_plan, ar))

    reg = Registry(tracking_uri)
    fallback_version, fallback = register_evidence(reg, evidence[ar])
    candidate_version, candidate = register_evidence(reg, evidence[diffusion])
    name, fb = candidate.candidate, fallback.candidate
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, name, candidate_version, "poc", item, SIGNER, f"{item} reviewed for the PoC")
    sign_off(reg, fb, fallback_version, "poc", "tooling-maturity", SIGNER, "the AR serving stack is in production")
    for stage in ("poc", "staging", "production"):
        judge(reg, fb, fallback_version, stage, policy)
    comment = "PoC gates pass on the dashboard fixture sweep"
    promote(name, "poc", approver=APPROVER, comment=comment, registry=reg, policy=policy)
    rollback("poc", who=ONCALL, comment="back to the AR fallback while the PoC is reviewed", registry=reg)
    promote(name, "poc", approver=APPROVER, comment=comment + ", again", registry=reg, policy=policy)
    judge(reg, name, candidate_version, "staging", policy)  # as `unmask run` judges every stage it registers
    try:  # a real refusal: staging's four eyes, and the fresh-process reproducibility check this fixture did not run
        promote(
            name,
            "staging",
            approver=APPROVER,
            comment="staging requested from the fixture",
            registry=reg,
            policy=policy,
        )
    except PromotionRefused:
        pass
    # a nightly re-check of the candidate at production, written the way the nightly flow writes its findings
    decision = judge(reg, name, candidate_version, "production", policy)
    failed = [{"gate": r.gate, "reason": r.reason} for r in decision.gate_results if not r.passed]
    audit.append(
        reg,
        AuditEvent(
            "gate_evaluation",
            "nightly",
            now_iso(),
            "production",
            name,
            candidate_version,
            comment="regression: fails production gates: " + "; ".join(f["gate"] for f in failed),
            evidence={"kind": "regression", "failed": failed},
        ),
    )
    return DashboardRegistry(home, tracking_uri, policy_path, name, fb, candidate_version, fallback_version)


@functools.lru_cache(maxsize=1)
def shared_dashboard_registry() -> DashboardRegistry:
    """The filled registry, built once per test process (a real sweep takes a while on two cores)."""
    root = Path(tempfile.mkdtemp(prefix="unmask-dashboard-"))
    atexit.register(shutil.rmtree, root, True)
    before = os.environ.get("UNMASK_HOME")
    os.environ["UNMASK_HOME"] = str(root / "home")  # locks and state of the build stay beside its registry
    try:
        return build_dashboard_registry(root)
    finally:
        if before is None:
            os.environ.pop("UNMASK_HOME", None)
        else:
            os.environ["UNMASK_HOME"] = before


@pytest.fixture(scope="module")
def filled() -> DashboardRegistry:
    """The shared filled registry, as a fixture (tests/conftest.py registers this module for every test)."""
    return shared_dashboard_registry()


@pytest.fixture
def env(filled, monkeypatch) -> DashboardRegistry:
    """The filled registry, with this test's environment pointing at it."""
    for key, value in filled.env().items():
        monkeypatch.setenv(key, value)
    return filled
