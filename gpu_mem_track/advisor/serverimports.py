"""Imported by fit's fork server among its preloads (``forked``): makes the script's
imports of installed packages that ``preload.ENV`` names (``preload.make_imports``)."""

from __future__ import annotations

from .preload import make_imports

make_imports()
