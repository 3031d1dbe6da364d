"""The run folder's format, one home for its producers and its readers.

A run folder ``reports/<run>/`` holds ``meta.json``, ``lines.csv``, ``timeline.csv`` and
``report.txt``; a launch folder holds one per rank and a ranks table. Here: the records
(``records``), writing them (``files``), reading them back (``files``, ``read``, with
``rebuild`` for a run stopped before its ``lines.csv``), the launch's ranks table
(``ranktable``) and the text report (``render``).

Producers (the ``runner``, ``snapshots.folder``, the ``notebook``) and readers (``runs``,
``html``) import this package; it imports none of them, and no torch.
"""
