"""The seven byte categories, named once for the census and the estimator.

Every counted byte is in exactly one category. The census files a storage under the
first tensor kind any of its tensors has (``KINDS`` order); the estimator files a
storage by the role it plays in the step. Both use these names: as record fields
(``Categories``, ``Breakdown``), CSV columns (``cat_<name>``), JSON keys and, through
``LABELS``, in text. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["CATEGORIES", "KIND_CATEGORY", "LABELS", "LEGACY_NAMES", "ByteCategories"]

#: The categories, in display order (the census's precedence order).
CATEGORIES = ("parameter", "buffer", "optimizer_state", "gradient", "input", "activation", "other")

#: How each category is spelled in text reports.
LABELS = {name: name.replace("_", " ") for name in CATEGORIES}

#: The census's tensor kind of each category (``tracker.records.KINDS``; "Tensor" is other).
KIND_CATEGORY = {
    "Parameter": "parameter",
    "Buffer": "buffer",
    "Optimizer state": "optimizer_state",
    "Gradient": "gradient",
    "Input": "input",
    "Activation": "activation",
    "Tensor": "other",
}

#: Names older estimate JSON used (``at_peak``), still accepted by ``from_dict``.
LEGACY_NAMES = {
    "parameters": "parameter",
    "buffers": "buffer",
    "gradients": "gradient",
    "optimizer_states": "optimizer_state",
    "inputs": "input",
    "activations": "activation",
    "temporaries": "other",
}


@dataclass(frozen=True)
class ByteCategories:
    """Bytes per category (fields named as ``CATEGORIES``, in that order)."""

    parameter: int = 0
    buffer: int = 0
    optimizer_state: int = 0
    gradient: int = 0
    input: int = 0
    activation: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        """Bytes of all categories together."""
        return sum(getattr(self, name) for name in CATEGORIES)

    def by_label(self) -> dict[str, int]:
        """Bytes per display label (``LABELS``), in ``CATEGORIES`` order, zeros included."""
        return {LABELS[name]: getattr(self, name) for name in CATEGORIES}

    def to_dict(self) -> dict[str, int]:
        """Bytes per category name."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Inverse of :meth:`to_dict`; the estimator's older names (``LEGACY_NAMES``:
        ``parameters``, ..., ``temporaries``) are accepted too."""
        values = {LEGACY_NAMES.get(key, key): int(value) for key, value in data.items()}
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown byte categories: {', '.join(sorted(unknown))}")
        return cls(**values)
