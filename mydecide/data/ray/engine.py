"""Starting or joining Ray for a ``prepare`` run, and the Ray plumbing its steps share: the key-holding actors of a
waved shuffle, waiting for a wave, a task's references as a list."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mydecide.config import RayEngineConfig
from mydecide.recipe_parsing import RecipeError

# Ray settings of a local Ray that a run starts (a cluster the run joins keeps its own; start it with these):
# - every task result goes to the object store: a result under Ray's inline limit (100 KiB) would otherwise stay in
#   the driver's own memory until read, and the shuffles make many;
# - every spilled object gets a file of its own: Ray otherwise fuses objects into files of 100 MB and deletes a file
#   only when every object in it is freed, so a few long-lived objects (reject lines, near pairs, a block's
#   signatures) kept whole files of freed blocks on disk: 42 GB of spill files at 3M rows filled this machine's
#   disk, against 3 MiB left at the end when unfused (docs/distributed-prepare.md).
LOCAL_RAY_SETTINGS = {"max_direct_call_object_size": 1, "max_fused_object_count": 1}


@contextmanager
def ray_engine(settings: RayEngineConfig, *, log: Callable[[str], None] | None = None) -> Iterator[int]:
    """The run's shuffle partitions (``settings.partitions``, else 2 per CPU of the cluster), on the Ray this
    process is connected to, else on ``settings.address`` (or ``$RAY_ADDRESS``), else on a local Ray with
    ``settings.num_workers`` CPUs started for the run (and shut down after it)."""
    try:
        import ray
    except ImportError:
        raise RecipeError(
            "engine: ray needs the ray package (pip install -e '.[distributed]'; requirements.lock pins its version)"
        ) from None
    started = not ray.is_initialized()
    if started:
        address = settings.address or os.environ.get("RAY_ADDRESS") or None
        options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False}
        if address is None:  # a local Ray, set for this path (docs/distributed-prepare.md)
            ray.init(num_cpus=settings.num_workers, _system_config=LOCAL_RAY_SETTINGS, **options)
        else:  # the cluster's workers import mydecide from the copy this run ships
            import mydecide

            package = str(Path(mydecide.__file__).resolve().parent)
            try:
                ray.init(address=address, runtime_env={"py_modules": [package]}, **options)
            except (ConnectionError, ValueError, RuntimeError) as err:
                where = "ray.address" if settings.address else "$RAY_ADDRESS"
                raise RecipeError(f"{where} {address!r}: cannot connect to a Ray cluster ({err})") from None
    try:
        partitions = settings.partitions or 2 * cpus()
        if log is not None:
            log(f"engine ray: {cpus()} CPUs, {partitions} partitions")
        yield partitions
    finally:
        if started:
            ray.shutdown()


def cpus() -> int:
    """The CPUs of the cluster this process is connected to (at least 1)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


@contextmanager
def key_actors(actor: type, count: int) -> Iterator[list[Any]]:
    """``count`` Ray actors of class ``actor`` for a waved shuffle (one per CPU of the cluster, up to
    ``ray.partitions``; no CPU reserved: they hold keys, the tasks do the work), killed when the step ends or
    fails."""
    import ray

    actors: list[Any] = [ray.remote(actor).options(num_cpus=0).remote() for _ in range(count)]
    try:
        yield actors
    finally:
        for handle in actors:
            ray.kill(handle)


def wait_done(refs: list[Any]) -> None:
    """Wait until every task behind ``refs`` has finished, without fetching their results (errors are raised where
    the results are read)."""
    if refs:
        import ray

        ray.wait(refs, num_returns=len(refs), fetch_local=False)


def as_list(refs: Any, n: int) -> list[Any]:
    """A task's references as a list (Ray returns one reference, not a list, for ``num_returns=1``)."""
    return [refs] if n == 1 else list(refs)
