"""One read of the store per question: an `MlflowClient` seen through a snapshot.

An action that judges (a promotion, an approval) asks the same things many times on its way: the version's tags,
the aliases, the audit trail, the evidence run. Inside `Registry.reading()` each distinct read goes to MLflow
once and its answer is reused; a write through the same client forgets every answer it could have changed, so
the action reads its own writes. Answers are not shared across threads or kept after the block: the snapshot is
what the action judged, and whatever must see the store as it is *now* (a lock's holder, the chain's last entry
before the next is written) reads through `Registry.direct` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlflow.tracking import MlflowClient

# reads by family: what a write of that family can change
MODEL_READS = frozenset(
    {
        "get_registered_model",
        "search_registered_models",
        "get_model_version",
        "search_model_versions",
        "get_model_version_by_alias",
        "get_latest_versions",
    }
)
RUN_READS = frozenset({"get_run", "search_runs"})
EXPERIMENT_READS = frozenset({"get_experiment", "get_experiment_by_name", "search_experiments"})
READS = MODEL_READS | RUN_READS | EXPERIMENT_READS
# writes that change neither a run's data nor its status: an artifact is not part of what a run read returns
ARTIFACT_WRITES = frozenset({"log_text", "log_dict", "log_artifact", "log_artifacts", "log_figure", "log_image"})
VERSION_TAG_WRITES = frozenset({"set_model_version_tag", "delete_model_version_tag"})
VERSION_LISTS = frozenset({"search_model_versions", "get_model_version_by_alias", "get_latest_versions"})
ALIAS_WRITES = ("set_registered_model_alias", "delete_registered_model_alias")
RUN_WRITES = ("log_", "set_tag", "delete_tag", "set_terminated", "update_run", "delete_run", "restore_run")

Key = tuple[str, tuple[Any, ...], tuple[tuple[str, Any], ...]]


class ReadOnce:
    """`client`'s methods, each read answered once per distinct arguments; writes pass through and forget.

    What a write forgets: a version tag, the version searches (the version's own read keeps it, as written);
    an alias, every model read but the versions' own (which keep it, as written); any other registry write (a
    registered model), every model read; a new run, the searches of its
    experiment; a run write, that run's read and the searches of its experiment (of every experiment, when the
    run was not seen); an experiment tag, the reads of that experiment; another experiment write, every
    experiment and run read; anything unknown, or a write that failed, everything.
    """

    def __init__(self, client: MlflowClient):
        self._client = client
        self._answers: dict[Key, Any] = {}
        self._experiment_of: dict[str, str] = {}  # run id -> its experiment, from the runs read or created

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if name.startswith("_") or not callable(method):
            return method
        return self._read(name, method) if name in READS else self._write(name, method)

    def _read(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def read(*args: Any, **kwargs: Any) -> Any:
            key = (name, _frozen(args), tuple(sorted((k, _frozen(v)) for k, v in kwargs.items())))
            if key not in self._answers:
                self._answers[key] = self._note(method(*args, **kwargs))  # an error is raised, not kept
            return self._answers[key]

        return read

    def _write(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def write(*args: Any, **kwargs: Any) -> Any:
            try:
                answer = self._note(method(*args, **kwargs))
            except BaseException:
                self._answers.clear()  # it may have been written all the same
                raise
            self._forget(name, args, kwargs)
            return answer

        return write

    def _forget(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if name in ARTIFACT_WRITES:
            return
        if name in VERSION_TAG_WRITES:
            touched = _model_version(args, kwargs)
            self._drop(lambda key: key[0] in VERSION_LISTS)
            tag = args[2] if len(args) > 2 else kwargs.get("key")
            value = (args[3] if len(args) > 3 else kwargs.get("value")) if name == "set_model_version_tag" else None
            for key in [k for k in self._answers if _version_of(k) == touched]:  # this action's write, read back
                self._answers[key] = WithTag(self._answers[key], str(tag), value)
        elif name in ALIAS_WRITES:  # every other model read forgotten; a version read gets the alias as written
            model, alias = _model_alias(args, kwargs)
            holder = str(args[2] if len(args) > 2 else kwargs.get("version")) if name == ALIAS_WRITES[0] else None
            self._drop(lambda key: key[0] in MODEL_READS - {"get_model_version"})
            for key in [k for k in self._answers if (_version_of(k) or ("",))[0] == model]:
                version = (_version_of(key) or ("", ""))[1]
                self._answers[key] = WithAlias(self._answers[key], str(alias), version == holder)
        elif "registered_model" in name or "model_version" in name:
            self._drop(lambda key: key[0] in MODEL_READS)
        elif name in {"set_experiment_tag", "delete_experiment_tag"}:  # not part of what a run read returns
            experiment = str(args[0] if args else kwargs.get("experiment_id"))
            self._drop(lambda key: key[0] in EXPERIMENT_READS and self._names(key, experiment))
        elif "experiment" in name:
            self._drop(lambda key: key[0] in EXPERIMENT_READS | RUN_READS)
        elif name == "create_run":
            experiment = str(args[0] if args else kwargs.get("experiment_id"))
            self._drop(lambda key: key[0] == "search_runs" and experiment in _experiments_searched(key))
        elif name.startswith(RUN_WRITES):
            run_id = str(args[0] if args else kwargs.get("run_id"))
            home = self._experiment_of.get(run_id)
            self._drop(
                lambda key: (
                    (key[0] == "get_run" and _run_read(key) == run_id)
                    or (key[0] == "search_runs" and (home is None or home in _experiments_searched(key)))
                )
            )
        else:
            self._answers.clear()

    def _names(self, key: Key, experiment: str) -> bool:
        """Whether an experiment read's answer is (or may include) `experiment`: a lookup that found nothing
        or found another experiment is not changed by its tags."""
        if key[0] == "search_experiments":
            return True
        found = self._answers.get(key)
        return found is not None and str(getattr(found, "experiment_id", "")) == experiment

    def _note(self, answer: Any) -> Any:
        """Remember which experiment each run in an answer belongs to (a later write to it forgets only that
        experiment's searches)."""
        for run in answer if isinstance(answer, list) else [answer]:
            info = getattr(run, "info", None)
            if info is not None and getattr(info, "experiment_id", None) is not None:
                self._experiment_of[str(info.run_id)] = str(info.experiment_id)
        return answer

    def _drop(self, which: Callable[[Key], bool]) -> None:
        for key in [k for k in self._answers if which(k)]:
            del self._answers[key]


class WithTag:
    """A version read as this action last saw it, with its own tag write applied (`value` None: deleted)."""

    def __init__(self, found: Any, key: str, value: str | None):
        self._found = found
        kept = {k: v for k, v in dict(found.tags).items() if k != key}
        self.tags = kept | ({key: value} if value is not None else {})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._found, name)


class WithAlias:
    """A version read as this action last saw it, with its own alias write applied: `holds` the alias or not."""

    def __init__(self, found: Any, alias: str, holds: bool):
        self._found = found
        kept = [a for a in (found.aliases or []) if a != alias]
        self.aliases = kept + ([alias] if holds else [])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._found, name)


def _model_alias(args: tuple[Any, ...], named: dict[str, Any]) -> tuple[Any, Any]:
    """(model, alias) of an alias write given them positionally or by MLflow's names."""
    return (args[0] if args else named.get("name")), (args[1] if len(args) > 1 else named.get("alias"))


def _experiments_searched(key: Key) -> list[str]:
    """The experiment ids a `search_runs` read asked about."""
    named = dict(key[2])
    ids = key[1][0] if key[1] else named.get("experiment_ids", ())
    return [str(i) for i in (ids if isinstance(ids, tuple) else (ids,))]


def _run_read(key: Key) -> str:
    return str(key[1][0] if key[1] else dict(key[2]).get("run_id"))


def _version_of(key: Key) -> tuple[Any, str] | None:
    """The (model, version) a `get_model_version` read asked for, else None."""
    if key[0] != "get_model_version":
        return None
    return _model_version(key[1], dict(key[2]))


def _model_version(args: tuple[Any, ...], named: dict[str, Any]) -> tuple[Any, str]:
    """(model, version) of a call given them positionally or by MLflow's names."""
    model = args[0] if args else named.get("name")
    version = args[1] if len(args) > 1 else named.get("version")
    return model, str(version)


def _frozen(value: Any) -> Any:
    """A hashable stand-in for an argument (lists of experiment ids or order-by clauses)."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value
