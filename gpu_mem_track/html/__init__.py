"""HTML: the self-contained report page and the notebook's rich display.

``tables``: small HTML tables for ``_repr_html_`` (torch-free, model imports only).
``data``: what the report shows, collected from runs and CSVs as JSON-ready data.
``page``: the page itself (inline ``report.css`` and ``report.js``); ``write_report``.
Importing this package imports nothing else.
"""

from __future__ import annotations

__all__: list[str] = []
