"""The ``snapshot`` command's analysis of a PyTorch memory snapshot: the replay of its trace
(``replay``), the analysis (``analyse``, with ``attribution`` naming the user's lines),
the text report (``report``) and the run folder it writes (``folder``). The file format
itself (records and reader) is ``snapshotfile``'s; the allocator's rules are
``allocator``'s.
"""
