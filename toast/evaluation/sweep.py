"""``toast sweep``: many comparisons in one batch (models x meshes x hardware x memory limits x seeds), on the
local cores or as tasks on a Ray cluster.

A sweep file is TOML::

    [sweep]
    models = ["gemma_small", "toast.examples.itx:itx_small"]   # EXAMPLES names or module:function[?k=v&...]
    meshes = ["batch=4,model=2", "batch=2,model=4"]
    hardware = ["a100_80gb", "tpu_v3"]
    memory = ["hbm", 16]          # GiB per device, or "hbm" for the profile's (default ["hbm"])
    seeds = [0]                   # default [0]
    rollouts = 500                # the search's rollout budget (default 2000; a budget, not seconds, so
                                  # the same job gives the same strategy wherever it runs); a list of
                                  # budgets, e.g. [500, 2000], is one more axis of the product
    variants = ["default", "no_box"]   # analysis variants (rules/variants/NAME.toml or TOML paths;
                                       # default ["default"])
    rules = ["", "my_rules"]      # folders of user .dl files ("" or absent: the package's rules alone)
    engine = "embedded"           # "embedded", "souffle" or "auto", or a list of them (default "embedded")
    search = ["mcts", "random"]   # the searches (toast.search.registry.SEARCHES), one or a list (default
                                  # "mcts"; `toast sweep --search NAME` where the file has none)

Every combination is a job, named by its settings (``Job.key``; a variant, rules folder, engine or search other
than the default adds a part). A job writes ``DIR/jobs/<key>.json``: its
settings and either its comparison (``toast compare``'s JSON: toast's strategy file and every manual
strategy's cost) or its error. A job that fails (an unknown model, a mesh the program cannot take), crashes,
is killed (out of memory), calls ``sys.exit`` or runs past ``--job-timeout`` is recorded with its reason and
the others go on; a rerun skips every job whose record exists (and reruns one it cannot read). After the
jobs, and also when the sweep is stopped (Ctrl-C, SIGTERM), ``DIR/summary.csv`` and ``DIR/summary.md`` have
one row per job, in the sweep's order (``not run`` for a stopped sweep's remaining jobs). One sweep at a time
writes a folder (``DIR/.lock``).

Jobs run in parallel: in worker processes on the local cores (``jobs``; always at least one, so a job never
takes the sweep down with it), or with ``ray_address`` as Ray tasks (``"auto"`` or ``"ray://..."``: a running
cluster; ``"local"``: one started in this process). Each job's search runs in its own process on one core, so
the results do not depend on where the jobs ran. The workers follow ``toast.processes``: they ignore Ctrl-C
and die with the sweep.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import math
import os
import re
import signal
import stat
import time
import tomllib
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from toast.errors import InputError, ToastError
from toast.processes import worker_setup, workers_starting

SUMMARY_FIELDS = ("job", "model", "mesh", "hardware", "memory_gib", "seed", "variant", "rules", "engine", "search",
                  "status",
                  "colors", "resolution_bits", "unruled_ops", "toast_step_time_s", "toast_peak_bytes",
                  "toast_over_memory", "best_manual", "best_manual_step_time_s", "best_manual_peak_bytes", "speedup",
                  "search_seconds", "job_seconds", "error")
DEFAULT_ENGINE = "embedded"  # a sweep's jobs give the same results wherever they run: no engine chosen by PATH
DEFAULT_SEARCH = "mcts"  # toast.search.registry.DEFAULT_SEARCH (not imported: reading a sweep file stays light)


@dataclass(frozen=True, slots=True)
class Job:
    """One comparison of a sweep.

    Attributes:
      model: a ``toast.examples.EXAMPLES`` name or ``module:function[?NAME=VALUE&...]``.
      mesh: ``"batch=4,model=2"``.
      hardware: a profile name or a TOML path.
      memory_gib: memory per device in GiB (``None``: the profile's HBM).
      seed: the search's seed.
      rollouts: the search's rollout budget.
      variant: the analysis variant (a name in ``rules/variants/`` or a TOML path).
      rules: a folder of user ``.dl`` files (``""``: the package's rules alone).
      engine: the Datalog engine (``embedded``, ``souffle`` or ``auto``).
      search: the search (a name in ``toast.search.registry.SEARCHES``).
    """

    model: str
    mesh: str
    hardware: str
    memory_gib: float | None
    seed: int
    rollouts: int
    variant: str = "default"
    rules: str = ""
    engine: str = DEFAULT_ENGINE
    search: str = DEFAULT_SEARCH

    def __post_init__(self) -> None:
        from toast.cost.hardware import memory_limit_gib

        memory_limit_gib(self.memory_gib)  # a NaN limit would make every strategy fit

    @property
    def key(self) -> str:
        """A file name made of the job's settings (``gemma_small__batch4-model2__a100_80gb__hbm__s0__r2000``;
        ``__v-no_box``, ``__rules-NAME``, ``__souffle`` and ``__random`` where the variant, rules, engine or
        search are not the defaults, so the keys of earlier sweeps stay what they were)."""
        memory = "hbm" if self.memory_gib is None else f"{self.memory_gib:g}GiB"
        parts = [self.model, self.mesh, Path(self.hardware).stem, memory, f"s{self.seed}", f"r{self.rollouts}"]
        if self.variant != "default":
            parts.append(f"v-{Path(self.variant).stem}")
        if self.rules:
            parts.append(f"rules-{Path(self.rules).name}")
        if self.engine != DEFAULT_ENGINE:
            parts.append(self.engine)
        if self.search != DEFAULT_SEARCH:
            parts.append(self.search)
        return "__".join(re.sub(r"[^A-Za-z0-9_.]+", "-", part).strip("-") for part in parts)


@dataclass(frozen=True, slots=True)
class Sweep:
    """A sweep file's jobs, in its order (models, then meshes, hardware, memory limits, seeds, rollouts, variants,
    rules, engines, searches)."""

    source: str
    jobs: tuple[Job, ...]


def load_sweep(path: str | Path, *, search: str | None = None) -> Sweep:
    """Read a sweep file; ``search``: every job's search where the file names none (``toast sweep --search``).

    Raises:
      InputError: one line naming the file (and line, for a TOML syntax error) and the problem (an unknown
        search; ``search`` given and the file's own ``search`` key too).
    """
    from toast.cost.hardware import MAX_MEMORY_GIB, memory_limit_gib
    from toast.search.registry import SEARCHES

    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except OSError as err:
        raise InputError(f"{path}: cannot read the sweep file ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{path}: {err}") from None
    table = document.get("sweep")
    if not isinstance(table, dict):
        raise InputError(f"{path}: no [sweep] table (models, meshes, hardware, memory, seeds, rollouts)")
    known = ("models", "meshes", "hardware", "memory", "seeds", "rollouts", "variants", "rules", "engine", "search")
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise InputError(f"{path}: [sweep] has unknown key '{unknown[0]}' (known: {', '.join(known)})")

    def strings(key: str, default: list[str] | None = None, *, empty: bool = False, one: bool = False) -> list[str]:
        value = table.get(key, default)
        if one and isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and (v or empty) for v in value):
            raise InputError(f"{path}: [sweep] {key} must be a non-empty list of strings")
        return value

    models, meshes, hardware = strings("models"), strings("meshes"), strings("hardware", ["a100_80gb"])
    memory_values = table.get("memory", ["hbm"])
    memory: list[float | None] = []
    for value in memory_values if isinstance(memory_values, list) and memory_values else [False]:
        if value == "hbm":
            memory.append(None)
            continue
        try:
            memory.append(memory_limit_gib(value))  # what toast.autoshard and --memory take; refuses a bool
        except ToastError:
            raise InputError(f"{path}: [sweep] memory must list GiB per device (numbers above 0, at most "
                             f"{MAX_MEMORY_GIB:.0f}) or \"hbm\"") from None
    seeds = table.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                            for s in seeds):
        raise InputError(f"{path}: [sweep] seeds must be a non-empty list of integers, 0 or more")
    rollouts = table.get("rollouts", 2000)
    budgets = rollouts if isinstance(rollouts, list) else [rollouts]  # one budget, or a list: one job each
    if not budgets or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in budgets):
        raise InputError(f"{path}: [sweep] rollouts must be a positive integer or a non-empty list of them")
    variants = strings("variants", ["default"])
    for variant in variants:
        _check_variant(path, variant)
    rules = strings("rules", [""], empty=True, one=True)
    for folder in rules:
        if folder and not (path.parent / folder).is_dir() and not Path(folder).is_dir():
            raise InputError(f"{path}: [sweep] rules: no folder {folder!r}")
    engines = strings("engine", [DEFAULT_ENGINE], one=True)
    for engine in engines:
        if engine not in ("embedded", "souffle", "auto"):
            raise InputError(f"{path}: [sweep] engine {engine!r}: give embedded, souffle or auto")
    if search is not None and "search" in table:
        raise InputError(f"{path}: [sweep] search is given, and --search {search}: give one or the other")
    searches = strings("search", [search or DEFAULT_SEARCH], one=True)
    for name in searches:
        if name not in SEARCHES:
            where = f"{path}: [sweep] search" if search is None else "--search"
            raise InputError(f"{where} {name!r}: the searches are {', '.join(SEARCHES)}")
    rules = [str(path.parent / folder) if folder and (path.parent / folder).is_dir() else folder for folder in rules]
    jobs = tuple(Job(model, mesh, name, limit, seed, budget, variant, folder, engine, searched)
                 for model, mesh, name, limit, seed, budget, variant, folder, engine, searched in itertools.product(
                     models, meshes, hardware, memory, seeds, budgets, variants, rules, engines, searches))
    return Sweep(str(path), jobs)


def _check_variant(path: Path, variant: str) -> None:
    """Refuse a variant that names no file of ``rules/variants/`` and no TOML file."""
    from toast.datalog.variants import load_variant

    try:
        load_variant(variant)
    except ToastError as err:
        raise InputError(f"{path}: [sweep] variants: {_first_line(err)}") from None


def run_job(job: Job) -> dict[str, Any]:
    """Run one job (the analysis, the search on one core, every manual strategy); returns the job's record:
    its settings, ``"status": "ok"`` and the comparison, or ``"status": "error"`` and the error's line."""
    from toast.analysis.named_dimensions import analyze
    from toast.cost.hardware import load_hardware
    from toast.evaluation.compare import compare, comparison_json
    from toast.evaluation.report import report_section
    from toast.examples import EXAMPLES
    from toast.search.base import Budget
    from toast.sharding.mesh import parse_mesh
    from toast.sharding.roles import roles_for_input

    record: dict[str, Any] = {"job": job.key, "settings": asdict(job)}
    start = time.perf_counter()
    try:
        mesh = parse_mesh(job.mesh)
        hardware = load_hardware(job.hardware)
        source = EXAMPLES.get(job.model, job.model)
        analysis = _analysis(source, analyze, engine=job.engine, rules=job.rules or None, variant=job.variant)
        record["analysis"] = {"colors": len(analysis.colors), "resolution_bits": analysis.conflicts.resolution_bits,
                              "unruled_ops": len(analysis.unruled_ops)}
        try:
            roles = roles_for_input(source.partition("?")[0])
        except ToastError:
            roles = None
        budget = Budget(seed=job.seed, rollouts=job.rollouts, workers=1)
        result = compare(analysis, mesh, hardware, source=source, roles=roles, budget=budget, search=job.search,
                         memory_gib=job.memory_gib)
        record.update(status="ok", comparison=comparison_json(result), report=report_section(result))
    except (ToastError, ValueError) as err:  # ValueError: a factory's own check of its sizes
        record.update(status="error", error=_first_line(err))
    except SystemExit as err:  # a factory's sys.exit(): this job ends, the sweep goes on
        record.update(status="error", error=f"the job called sys.exit({err.code!r})")
    except Exception as err:  # noqa: BLE001 - one job's failure must not stop the sweep; it is in its row
        record.update(status="error", error=f"internal error: {type(err).__name__}: {_first_line(err)}")
    record["job_seconds"] = time.perf_counter() - start
    return record


def _first_line(err: Exception) -> str:
    text = str(err)
    return text.splitlines()[0] if text else type(err).__name__


# Per worker process, the last analyses made (by model, engine, rules and variant): their jobs analyze once.
_ANALYSES: dict[tuple[str, str, str | None, str], Any] = {}
_KEPT_ANALYSES = 4


def _analysis(source: str, analyze: Callable[..., Any], *, engine: str, rules: str | None, variant: str):
    key = (source, engine, rules, variant)
    if key in _ANALYSES:
        _ANALYSES[key] = _ANALYSES.pop(key)  # most recently used last
    else:
        while len(_ANALYSES) >= _KEPT_ANALYSES:
            del _ANALYSES[next(iter(_ANALYSES))]
        _ANALYSES[key] = analyze(source, engine=engine, rules=rules, variant=variant)
    return _ANALYSES[key]


def sweep(jobs: Sequence[Job], out_dir: str | Path, *, workers: int = 0, ray_address: str | None = None,
          job_timeout: float | None = None,
          progress: Callable[[dict[str, Any], int, int], None] | None = None) -> list[dict[str, Any]]:
    """Run the jobs whose record ``out_dir`` lacks, write each record as it arrives, then the summaries.

    Each job runs in a worker process: a job that crashes, is killed (out of memory), calls ``sys.exit``
    or passes ``job_timeout`` is recorded as failed with the reason, and the others go on. The summaries
    are written whatever happens (an interrupted sweep's jobs not run are rows saying so); the folder is
    locked while a sweep writes it.

    Args:
      jobs: the jobs, in the summary's order.
      out_dir: the folder of ``jobs/<key>.json``, ``summary.csv`` and ``summary.md``.
      workers: local worker processes (``0``: one per core); ignored with ``ray_address``.
      ray_address: run the jobs as Ray tasks on this cluster (``"local"``: start one in this process).
      job_timeout: seconds a local job may run before it is stopped and recorded as timed out (``None``:
        no limit).
      progress: called with ``(record, done, total)`` after each job that ran.

    Returns:
      Every job's record, in ``jobs`` order (the ones that existed read back).

    Raises:
      ToastError: two jobs with one key, another sweep writing ``out_dir``, a folder that cannot be
        written, or Ray asked for and not installed.
      KeyboardInterrupt: Ctrl-C or SIGTERM (``toast.processes.Terminated``); the workers are stopped and
        the summaries written first.
    """
    out = Path(out_dir)
    keys = [job.key for job in jobs]
    if len(set(keys)) < len(keys):
        duplicate = next(key for key in keys if keys.count(key) > 1)
        raise ToastError(f"the sweep has job {duplicate} twice")
    if job_timeout is not None and not (math.isfinite(job_timeout) and job_timeout > 0):
        raise ToastError(f"a job timeout of {job_timeout:g} s: give a number of seconds above 0")
    folder = out / "jobs"
    with _ray_cluster(ray_address):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ToastError(f"-o {out}: cannot make the sweep's folder: {err.strerror}") from None
        return _sweep_in(jobs, out, folder, workers=workers, ray_address=ray_address, job_timeout=job_timeout,
                         progress=progress)


def _sweep_in(jobs: Sequence[Job], out: Path, folder: Path, *, workers: int, ray_address: str | None,
              job_timeout: float | None, progress: Callable[[dict[str, Any], int, int], None] | None
              ) -> list[dict[str, Any]]:
    """``sweep`` once its folder exists (and Ray is connected, where asked for)."""
    with _locked(out):
        records = {job.key: _read_record(folder / f"{job.key}.json") for job in jobs}
        todo = [job for job in jobs if records[job.key] is None]
        done = 0
        try:
            with contextlib.closing(_run(todo, workers=workers, ray_address=ray_address,
                                         job_timeout=job_timeout)) as results:
                for record in results:
                    _write_json(folder / f"{record['job']}.json", record)
                    records[record["job"]] = record
                    done += 1
                    if progress is not None:
                        progress(record, done, len(todo))
        finally:
            found = [records[job.key] or _not_run_record(job) for job in jobs]
            rows = [summary_row(record) for record in found]
            _write_text(out / "summary.csv", summary_csv(rows))
            _write_text(out / "summary.md", summary_markdown(rows))
    return found


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold ``out/.lock`` (an advisory lock, released when the process ends however it ends).

    Raises:
      ToastError: another sweep holds it, or ``out/.lock`` is a link or not a regular file (refused, not
        followed), or the folder cannot be written.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    path = out / ".lock"
    # Never through a link: a symbolic link (or a hard link) planted at DIR/.lock would have the sweep truncate
    # and write its target. O_NONBLOCK: opening a FIFO planted there does not wait for a writer.
    flags = (os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_NONBLOCK", 0))
    try:
        descriptor = os.open(path, flags, 0o600)
    except OSError as err:
        if os.path.islink(path):
            raise ToastError(f"-o {out}: {path} is a symbolic link, not the sweep's lock file; remove it") from None
        raise ToastError(f"-o {out}: cannot write the sweep's folder: {err.strerror}") from None
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
        os.close(descriptor)
        what = "a link to another file" if stat.S_ISREG(status.st_mode) else "not a regular file"
        raise ToastError(f"-o {out}: {path} is {what}, not the sweep's lock file; remove it")
    handle = os.fdopen(descriptor, "r+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            raise ToastError(f"-o {out}: another sweep (pid {holder}) is writing this folder; wait for it to end "
                             "or give another folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()


def _read_record(path: Path) -> dict[str, Any] | None:
    """A job's record, or ``None`` where there is none or it cannot be read (the job runs again)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict) or "status" not in record:
        return None
    return record


def _not_run_record(job: Job) -> dict[str, Any]:
    return {"job": job.key, "settings": asdict(job), "status": "not run", "error": "not run (the sweep was stopped)"}


def _failed_record(job: Job, reason: str, seconds: float) -> dict[str, Any]:
    return {"job": job.key, "settings": asdict(job), "status": "error", "error": reason, "job_seconds": seconds}


def _run(jobs: Sequence[Job], *, workers: int, ray_address: str | None, job_timeout: float | None
         ) -> Generator[dict[str, Any], None, None]:
    """The records of ``jobs`` as they finish (any order)."""
    if not jobs:
        return
    if ray_address is not None:
        yield from _run_on_ray(jobs)
        return
    yield from _run_local(jobs, max(1, min(workers or os.cpu_count() or 1, len(jobs))), job_timeout)


@dataclass(slots=True)
class _Worker:
    """A job worker process and the job it runs (``None``: idle)."""

    process: Any
    connection: Any
    job: Job | None = None
    started: float = 0.0


def _job_worker(connection: Any, parent_pid: int) -> None:
    """A worker process's loop: run the jobs sent until the parent closes the pipe."""
    worker_setup(parent_pid)
    while True:
        try:
            job = connection.recv()
        except (EOFError, OSError):
            return
        connection.send(run_job(job))


def _run_local(jobs: Sequence[Job], count: int, job_timeout: float | None) -> Iterator[dict[str, Any]]:
    """The records of ``jobs`` run in ``count`` worker processes, one job at a time each; a worker that dies
    or passes ``job_timeout`` gives its job a failed record and is replaced."""
    import multiprocessing
    import multiprocessing.connection

    # Spawned, not forked: a job lowers with JAX, whose runtime does not survive a fork.
    context = multiprocessing.get_context("spawn")
    waiting = list(reversed(jobs))
    pool: list[_Worker] = []

    def start() -> _Worker:
        parent_end, child_end = context.Pipe()
        process = context.Process(target=_job_worker, args=(child_end, os.getpid()), daemon=True,
                                  name="toast-sweep-job")
        with workers_starting():
            process.start()
        child_end.close()
        worker = _Worker(process, parent_end)
        pool.append(worker)
        return worker

    def retire(worker: _Worker) -> None:
        pool.remove(worker)
        worker.connection.close()
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)

    try:
        while waiting or any(worker.job is not None for worker in pool):
            for worker in [w for w in pool if w.job is None] + [None] * (count - len(pool)):
                if not waiting:
                    break
                worker = worker or start()
                worker.job, worker.started = waiting.pop(), time.monotonic()
                worker.connection.send(worker.job)
            busy = [worker for worker in pool if worker.job is not None]
            timeout = None if job_timeout is None else max(
                0.0, min(worker.started + job_timeout for worker in busy) - time.monotonic())
            multiprocessing.connection.wait([w.connection for w in busy] + [w.process.sentinel for w in busy],
                                            timeout=timeout)
            for worker in busy:
                job = worker.job
                assert job is not None
                seconds = time.monotonic() - worker.started
                record = None
                if worker.connection.poll():
                    try:
                        record = worker.connection.recv()
                    except (EOFError, OSError):
                        record = None
                if record is not None:
                    worker.job = None
                    yield record
                elif not worker.process.is_alive():
                    worker.process.join(timeout=5)
                    retire(worker)
                    yield _failed_record(job, _death(worker.process.exitcode), seconds)
                elif job_timeout is not None and seconds >= job_timeout:
                    retire(worker)
                    yield _failed_record(job, f"timed out after {job_timeout:g} s (--job-timeout)", seconds)
            if not waiting:
                for worker in [w for w in pool if w.job is None]:
                    retire(worker)
    finally:
        for worker in list(pool):  # interrupted, or done: no worker outlives the sweep
            retire(worker)


def _death(exitcode: int | None) -> str:
    """Why a job's process ended without a record, in words."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory?)" if -exitcode == signal.SIGKILL else ""
        return f"the job's process was killed by {name}{hint}"
    return f"the job's process exited with status {exitcode} before recording a result"


@contextlib.contextmanager
def _ray_cluster(address: str | None) -> Iterator[None]:
    """Connected to the Ray cluster at ``address`` for the block (``"local"``: one started here; ``None``: no
    Ray); the connection is made before anything is written, and any failure is one line."""
    if address is None:
        yield
        return
    try:
        import ray
    except ImportError:
        raise ToastError("--ray: Ray is not installed (pip install 'ray[default]')") from None
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False)
        except Exception as err:  # noqa: BLE001 - Ray raises many kinds (ConnectionError, ValueError, ...)
            raise ToastError(f"--ray {address}: cannot connect to a Ray cluster: {_first_line(err)}") from None
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _run_on_ray(jobs: Sequence[Job]) -> Iterator[dict[str, Any]]:
    """The records of ``jobs`` run as Ray tasks on the connected cluster; a task Ray loses (its worker died)
    gives its job a failed record."""
    import ray

    task = ray.remote(num_cpus=1)(run_job)
    started = time.monotonic()
    pending = {task.remote(job): job for job in jobs}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready[0])
            try:
                yield ray.get(ready[0])
            except Exception as err:  # noqa: BLE001 - a lost task is that job's failure, not the sweep's
                yield _failed_record(job, f"the Ray task failed: {type(err).__name__}: {_first_line(err)}",
                                     time.monotonic() - started)
    finally:
        for reference in pending:
            ray.cancel(reference, force=True)


def summary_row(record: dict[str, Any]) -> dict[str, Any]:
    """One summary row (``SUMMARY_FIELDS``) of a job's record."""
    settings = record["settings"]
    row: dict[str, Any] = {field: "" for field in SUMMARY_FIELDS}
    row.update(job=record["job"], model=settings["model"], mesh=settings["mesh"], hardware=settings["hardware"],
               memory_gib="hbm" if settings["memory_gib"] is None else settings["memory_gib"], seed=settings["seed"],
               variant=settings.get("variant", "default"), rules=settings.get("rules", ""),
               engine=settings.get("engine", DEFAULT_ENGINE), search=settings.get("search", DEFAULT_SEARCH),
               status=record["status"],
               job_seconds=round(record.get("job_seconds", 0.0), 2), **record.get("analysis", {}))
    if record["status"] != "ok":
        row["error"] = record.get("error", "")
        return row
    strategies = record["comparison"]["strategies"]
    toast_row = strategies[0]
    row.update(toast_step_time_s=toast_row["step_time_s"], toast_peak_bytes=toast_row["peak_bytes"],
               toast_over_memory=toast_row["over_memory"], search_seconds=round(toast_row["search_seconds"], 2))
    applied = [s for s in strategies[1:] if s["applies"]]
    fitting = [s for s in applied if not s["over_memory"]] or applied
    if fitting:
        best = min(fitting, key=lambda s: s["step_time_s"])
        row.update(best_manual=best["strategy"], best_manual_step_time_s=best["step_time_s"],
                   best_manual_peak_bytes=best["peak_bytes"],
                   speedup=round(best["step_time_s"] / toast_row["step_time_s"], 4) if toast_row["step_time_s"] else "")
    return row


def summary_csv(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as CSV with a header (``SUMMARY_FIELDS``)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=SUMMARY_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def summary_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table: step times and peaks in human units, errors in the last column."""
    from toast.output.report import human_bytes, human_seconds, markdown_cell

    lines = ["| model | mesh | hardware | memory | seed | analysis, search | colors | resolution bits | unruled ops | "
             "toast step | toast peak | over memory | best manual | its step | speedup | search s | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        memory = row["memory_gib"] if row["memory_gib"] == "hbm" else f"{row['memory_gib']:g} GiB"
        analysis = " ".join(part for part in (
            row["variant"], f"rules {Path(row['rules']).name}" if row["rules"] else "",
            row["engine"] if row["engine"] != DEFAULT_ENGINE else "",
            f"search {row['search']}" if row.get("search") not in ("", None, DEFAULT_SEARCH) else "") if part)
        job = " | ".join(markdown_cell(cell) for cell in (row["model"], row["mesh"], row["hardware"], memory,
                                                          row["seed"], analysis))
        counts = " | ".join(str(row[field]) if row[field] != "" else "-"
                            for field in ("colors", "resolution_bits", "unruled_ops"))
        if row["status"] != "ok":
            lines.append(f"| {job} | {counts} | - | - | - | - | - | - | - | {markdown_cell(row['error'])} |")
            continue
        best = markdown_cell(row["best_manual"]) if row["best_manual"] else "-"
        best_step = human_seconds(row["best_manual_step_time_s"]) if row["best_manual"] else "-"
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] != "" else "-"
        lines.append(f"| {job} | {counts} | {human_seconds(row['toast_step_time_s'])} | "
                     f"{human_bytes(row['toast_peak_bytes'])} | "
                     f"{'yes' if row['toast_over_memory'] else 'no'} | {best} | {best_step} | {speedup} | "
                     f"{row['search_seconds']} | |")
    return "\n".join(lines) + "\n"


def _write_json(path: Path, document: dict[str, Any]) -> None:
    _write_text(path, json.dumps(document, indent=1, sort_keys=True) + "\n")


def _write_text(path: Path, text: str) -> None:
    """Write whole or not at all (a temporary file of this process renamed over the target): a rerun never
    reads half a record.

    Raises:
      ToastError: the file cannot be written."""
    from toast.output.files import Output, write_outputs

    write_outputs([Output("-o", path, text)])
