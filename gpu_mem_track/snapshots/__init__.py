"""The ``snapshot`` command's analysis of a PyTorch memory snapshot: the analysis
(``analyse``, with ``attribution`` naming the user's lines) of its trace as the allocator
model replays it (``allocator.replay``, the replay the allocator check uses too), the
text report (``report``) and the run folder it writes (``folder``). The file format
itself (records and reader) is ``snapshotfile``'s.
"""
