"""A rendered Deployment's container run as a process, as a kubelet would run it: an empty home, only the rendered
env and args, and the files its volumes mount, under a folder of its own (tests/e2e/test_pod.py,
tests/e2e/test_analysis_pod.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def start_pod(
    deployment: dict,
    configmaps: dict[str, dict[str, str]],
    secrets: dict[str, dict[str, str]],
    root: Path,
    port: int,
    claims: dict[str, Path] | None = None,
) -> subprocess.Popen:
    """One replica: the container's args and env (a Secret's key where the env reads one), nothing else of this
    machine's; each ConfigMap or Secret volume's files written under `root` at its mount path, each claim's folder
    (`claims`: a volume every replica shares) linked there; paths under a mount in the args and env read there; the
    port the container listens on mapped to `port`."""
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        target = root / mount["mountPath"].lstrip("/")
        if "persistentVolumeClaim" in volume:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to((claims or {})[volume["persistentVolumeClaim"]["claimName"]], target_is_directory=True)
            continue
        files = (
            configmaps[volume["configMap"]["name"]]
            if "configMap" in volume
            else secrets[volume["secret"]["secretName"]]
        )
        target.mkdir(parents=True)
        for name, text in files.items():
            (target / name).write_text(text)

    def in_pod(value: str) -> str:
        return str(root / value.lstrip("/")) if any(value.startswith(m + "/") or value == m for m in mounts) else value

    def env_value(entry: dict) -> str:
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["secretKeyRef"]
            return secrets[ref["name"]][ref["key"]]
        return in_pod(entry["value"])

    args = [in_pod(a) for a in container["args"]]
    args[args.index("--host") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(port)
    home = root / "var" / "lib" / "unmask"  # the image's UNMASK_HOME, empty (but for a claim mounted in it)
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "UNMASK_HOME": str(home), "UNMASK_THREADS": "1"}
    env |= {e["name"]: env_value(e) for e in container["env"]}
    log = open(root / "pod.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-c", "from flows.cli import main; main()", *args],  # the image's ENTRYPOINT: unmask
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
