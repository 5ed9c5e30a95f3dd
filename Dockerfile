# unmask in a container: `unmask serve` (the default command) and any other sub-command given as args; the sweep
# workers with another entrypoint (`docker run --entrypoint dask IMAGE worker ...`, a pod's `command: [dask]`).
# The install steps are the Makefile's `setup` (README "make run"), minus the test extra:
# a Python 3.11 venv at .venv, pip upgraded, then the project with one onnxruntime flavour, which brings
# torch==2.13.0 pinned exactly in pyproject.toml. tests/unit/test_dockerfile.py keeps the two in step.
# Build: docker build -t unmask:0.1.0 .            (GPU hosts: --build-arg ONNX_FLAVOUR=gpu
#        --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 for torch's CUDA build)
FROM python:3.11-slim-bookworm

ARG ONNX_FLAVOUR=cpu
# Where pip finds the pinned torch build: the CPU wheel by default (a plain PyPI torch is the multi-GB CUDA one).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 \
    UNMASK_HOME=/var/lib/unmask MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true \
    PREFECT_SERVER_ANALYTICS_ENABLED=false RAY_USAGE_STATS_ENABLED=0

WORKDIR /opt/unmask
COPY pyproject.toml README.md ./
COPY flows ./flows
COPY models ./models
COPY gates ./gates
COPY dashboards ./dashboards
COPY checklists ./checklists
COPY sampler ./sampler
COPY evals ./evals
COPY registry ./registry
COPY serving ./serving

RUN python3.11 -m venv .venv
RUN .venv/bin/python -m pip install -q --upgrade pip
RUN .venv/bin/python -m pip install -q --extra-index-url "${TORCH_INDEX}" ".[${ONNX_FLAVOUR},dask,ray,postgres]"

RUN useradd --system --uid 10001 --home-dir /var/lib/unmask --create-home unmask
USER unmask
ENV PATH=/opt/unmask/.venv/bin:$PATH
EXPOSE 8000
# the image runs `unmask`: a manifest's args (Kubernetes, KServe, Argo) are its sub-command, e.g. ["serve", ...]
ENTRYPOINT ["unmask"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
