"""The allocator levers: ``expandable`` and ``gc-threshold`` (``PYTORCH_CUDA_ALLOC_CONF``).

Each merges one ``key:value`` into the user's ``PYTORCH_CUDA_ALLOC_CONF`` (replacing
that key's value, keeping every other entry) for the run, and puts the variable back
afterwards. The lever is entered before the script runs, so on a real GPU torch reads
the variable when the script first starts CUDA (were CUDA already started, the setting
is also passed to ``torch.cuda.memory._set_allocator_settings``, and the report says
so); the simulated GPU reads it when it starts (``allocator.settings``).

``garbage_collection_threshold`` acts only under ``set_per_process_memory_fraction``
(torch's ``malloc`` runs ``garbage_collect_cached_blocks`` only when a fraction is set),
on a real GPU and on the simulated one alike (``allocator.recovery`` models it), so the
``gc-threshold`` lever changes nothing in a script that sets no fraction; its report
says so in ``detail``. ``fit`` runs no trial of it (``NOT_TRIED``): its trials set no
fraction, so a trial would repeat the baseline.
"""

from __future__ import annotations

import os
import sys

from .catalog import describe
from .records import LeverReport

__all__ = ["ENV", "NOT_TRIED", "AllocatorLever", "merge_conf", "split_conf"]

ENV = "PYTORCH_CUDA_ALLOC_CONF"

_SETTINGS = {
    "expandable": ("expandable_segments", "True"),
    "gc-threshold": ("garbage_collection_threshold", "0.8"),
}


def split_conf(conf: str) -> list[str]:
    """The entries of a ``PYTORCH_CUDA_ALLOC_CONF`` value, split at the commas outside
    brackets (``roundup_power2_divisions:[256:1,512:2]`` is one entry), blanks dropped."""
    entries, depth, start = [], 0, 0
    for i, char in enumerate(conf):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            entries.append(conf[start:i])
            start = i + 1
    entries.append(conf[start:])
    return [entry.strip() for entry in entries if entry.strip()]


def merge_conf(conf: str, key: str, value: str) -> str:
    """``conf`` with ``key:value`` in place of any ``key`` entry (at the end when none)."""
    entries = [e for e in split_conf(conf) if e.partition(":")[0].strip() != key]
    return ",".join([*entries, f"{key}:{value}"])


def _value(conf: str, key: str) -> str | None:
    for entry in split_conf(conf):
        name, _, value = entry.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


#: Levers ``fit`` runs no simulated trial of, with why (a trial would repeat the baseline).
NOT_TRIED = {
    "gc-threshold": (
        "garbage_collection_threshold acts only under set_per_process_memory_fraction, "
        "which fit's trials do not set"
    )
}


class AllocatorLever:
    """One allocator setting for the run; see the module doc. ``simulated``: the run is
    on the simulated GPU (which reads the variable when it starts, so it is never late)."""

    def __init__(self, name: str, simulated: bool) -> None:
        self.name = name
        self.key, self.value = _SETTINGS[name]
        self.simulated = simulated
        self.why = ""
        self.conf = ""
        self.late = False
        self._before: str | None = None
        self._set = False

    def install(self) -> None:
        self._before = os.environ.get(ENV)
        conf = self._before or ""
        if (_value(conf, self.key) or "").lower() == self.value.lower():
            self.why = f"{ENV} already sets {self.key}:{_value(conf, self.key)}"
            return
        self.conf = merge_conf(conf, self.key, self.value)
        os.environ[ENV] = self.conf
        self._set = True
        torch = sys.modules.get("torch")
        if not self.simulated and torch is not None and torch.cuda.is_initialized():
            torch.cuda.memory._set_allocator_settings(f"{self.key}:{self.value}")
            self.late = True

    def uninstall(self) -> None:
        if not self._set:
            return
        if self._before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._before
        self._set = False

    def report(self) -> LeverReport:
        info = describe(self.name)
        if self.why:
            return LeverReport(self.name, False, self.why, cost=info.cost)
        detail = f"{ENV}={self.conf}"
        if self.late:
            detail += " (CUDA had started: also set by torch.cuda.memory._set_allocator_settings)"
        if self.name == "gc-threshold":
            detail += "; torch applies it only under torch.cuda.set_per_process_memory_fraction"
        return LeverReport(self.name, True, "", detail, f"{ENV}={self.conf}", "", info.cost)
