"""Collection: which YAML files are case files, each file's instances as items, selection.

A case file is validated and expanded at collection (every problem of a file reported
together, at ``file:line:col``); instances become :class:`~harness.plugin.items.CaseItem`
items, deselected by ``--world-size``/``--full``/``--perf`` and grouped by rank pool.
"""

from __future__ import annotations

import fnmatch
import gc
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from ..casefile import collect
from ..errors import CaseFileError, CaseFileErrors, clip
from ..model import TORCH_MODE_IMPORTS
from ..run import forkserver
from . import warmup
from .items import CaseItem
from .session import mark_started
from .state import CONFIG, harness_session

CASE_SUFFIXES = (".yaml", ".yml")


def is_case_file(file_path: Path, config: pytest.Config) -> bool:
    """Whether a YAML file is a case file: named on the command line, or inside a directory
    whose name matches ``collective_case_dirs`` (default ``cases``). Decided from the path
    alone, never from the content, so a malformed case file is reported, never skipped."""
    if file_path.suffix.lower() not in CASE_SUFFIXES:
        return False
    here = config.invocation_params.dir
    for arg in config.args:
        named = Path(arg.split("::", 1)[0])
        if (here / named).resolve() == file_path.resolve():
            return True
    dirs = [str(d) for d in config.getini("collective_case_dirs")]
    return any(fnmatch.fnmatchcase(part, pattern) for part in file_path.parent.parts
               for pattern in dirs)


def named_directory(file_path: Path, config: pytest.Config) -> Path | None:
    """The directory named on the command line that holds ``file_path`` (None if none does,
    or if only the invocation directory itself was named: ``pytest`` / ``pytest .``)."""
    here = config.invocation_params.dir.resolve()
    for arg in config.args:
        named = (here / arg.split("::", 1)[0]).resolve()
        if named != here and named.is_dir() and named in file_path.resolve().parents:
            return named
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if not is_case_file(file_path, parent.config):
        # A YAML file under a directory the user named is not collected (only directories
        # named like collective_case_dirs hold case files, so unrelated YAML never runs), but
        # it is not skipped in silence: the collection report lists it and says how.
        if file_path.suffix.lower() in CASE_SUFFIXES:
            hs = harness_session(parent.config)
            if named_directory(file_path, parent.config) is not None:
                hs.skipped_yaml.append(file_path)
            elif len(hs.here_yaml) < MAX_HERE_YAML:
                hs.here_yaml.append(file_path)
        return None
    hs = harness_session(parent.config)
    hs.saw_case_file = True
    warmup.start(parent.config, hs, named=False)
    mark_started(parent.config, hs)
    return CaseFile.from_parent(parent, path=file_path)


class CaseFile(pytest.File):
    """A YAML case file: validated at collection, one item per instance."""

    def collect(self) -> list[pytest.Item]:
        # Collection allocates many long-lived objects and little cyclic garbage, and the
        # cyclic GC's full passes over the growing heap cost 1.4 s of the bundled suite's
        # collection: it is paused while a case file is collected (pytest_collection_finish
        # then collects once and freezes the survivors; see HarnessSession.add_record).
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._collect()
        finally:
            if enabled:
                gc.enable()

    def _collect(self) -> list[pytest.Item]:
        hs = harness_session(self.config)
        try:
            display = str(self.path.relative_to(self.config.rootpath))
        except ValueError:
            display = str(self.path)
        try:
            instances = collect.from_file(str(self.path), hs.backend, display, hs.limits,
                                          launched=hs.launched, already=hs.collected_count)
        except (CaseFileError, CaseFileErrors) as exc:
            raise self.CollectError(str(exc)) from None
        except RecursionError:
            raise self.CollectError(f"{display}:1:1: the file is nested too deeply to read"
                                    ) from None
        except Exception as exc:  # a harness bug must still name the file, not dump a trace
            raise self.CollectError(
                f"{display}:1:1: internal error of collective-harness while reading this "
                f"file: {type(exc).__name__}: {clip(str(exc), 200)} (please report it)"
            ) from None
        hs.collected_count += len(instances)
        items: list[pytest.Item] = []
        for inst in instances:
            # The id is given in pytest's own form (name, then the bracketed parameters), so
            # the ids the cache records for --lf/--ff/--sw parse back to these items' ids.
            name = f"{inst.case}[{inst.id}]"
            item = CaseItem.from_parent(self, name=name, nodeid=f"{self.nodeid}::{name}",
                                        instance=inst)
            items.append(item)
        return items


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    hs = harness_session(config)
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        if isinstance(item, CaseItem):
            inst = item.instance
            if hs.world_sizes is not None and inst.world_size not in hs.world_sizes:
                dropped.append(item)
                hs.deselected_world_size += 1
                continue
            if "full" in inst.marks and not hs.full:
                dropped.append(item)
                hs.deselected_full += 1
                continue
            if "perf" in inst.marks and not harness_session(config).settings.perf.enabled:
                dropped.append(item)
                hs.deselected_perf += 1
                continue
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    # Group instances by pool so each pool starts once (CaseItem.pool_key); other tests keep
    # their order.
    others = [i for i in keep if not isinstance(i, CaseItem)]
    case_items = sorted((i for i in keep if isinstance(i, CaseItem)), key=CaseItem.pool_key)
    cases: list[pytest.Item] = list(case_items)
    items[:] = others + cases


def pytest_deselected(items: list[pytest.Item]) -> None:
    # -k, -m, --world-size, --full: a selection, recorded as such, not incompleteness.
    config = CONFIG.get("config")
    if config is not None:
        hs = harness_session(config)
        hs.deselected += sum(isinstance(i, CaseItem) for i in items)
        hs.deselected_items += len(items)  # what pytest's own "N deselected" counts


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    case_items = [i for i in session.items if isinstance(i, CaseItem)]
    harness_session(session.config).collected.update(i.nodeid for i in case_items)
    # Before the first pool starts: what the selected cases' torch modes import is imported
    # once in the forkserver instead of once in every rank.
    forkserver.preload(sorted({m for i in case_items for mode in i.instance.torch_modes
                         for m in TORCH_MODE_IMPORTS.get(mode, ())}))
    if case_items:
        # No gc.collect() first: over the bundled suite it found 56 objects of garbage and
        # cost 0.35 s; frozen, they are freed at exit.
        gc.freeze()  # see HarnessSession.add_record


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    # The xdist controller collects nothing itself: each worker tells it what it collected.
    config = CONFIG.get("config")
    if config is not None:
        hs = harness_session(config)
        cases = [i for i in ids if i.split("::", 1)[0].endswith((".yaml", ".yml"))]
        if cases:
            hs.saw_case_file = True
            mark_started(config, hs)
        hs.collected.update(cases)


MAX_SKIPPED_LISTED = 5
MAX_HERE_YAML = 50  # YAML files kept for the "nothing collected" hint (pytest / pytest .)


def pytest_report_collectionfinish(config: pytest.Config, start_path: Path,
                                   items: list[pytest.Item]) -> list[str]:
    """Under pytest's "collected N items": YAML files under the directories the user named
    that were not collected as case files, and the exact option that collects them."""
    hs = harness_session(config)
    if not hs.skipped_yaml and not items and hs.here_yaml:
        # ``pytest`` or ``pytest .`` in one's own folder of cases collected nothing: the YAML
        # files there are listed like a named directory's (a project whose other tests ran
        # hears nothing of its unrelated YAML).
        hs.skipped_yaml = hs.here_yaml
    if not hs.skipped_yaml:
        return []
    here = config.invocation_params.dir
    shown = [os.path.relpath(p, here) for p in hs.skipped_yaml[:MAX_SKIPPED_LISTED]]
    more = len(hs.skipped_yaml) - len(shown)
    dirs = sorted({p.resolve().parent.name for p in hs.skipped_yaml})
    args = [a for a in config.invocation_params.args]
    fix = shlex.join(["pytest", *args, "-o", f"collective_case_dirs={dirs[0]}"])
    lines = [f"collective-harness: {len(hs.skipped_yaml)} YAML file(s) under the paths you "
             f"named were not collected as case files: {', '.join(shown)}"
             + (f" and {more} more" if more else ""),
             "  only YAML files in directories named like the ini option collective_case_dirs "
             f"({', '.join(map(str, config.getini('collective_case_dirs')))}) are case files, "
             "or files named one by one on the command line;",
             f"  to collect these: {fix}"
             + (" (and the same for " + ", ".join(dirs[1:]) + ")" if len(dirs) > 1 else "")]
    return lines
