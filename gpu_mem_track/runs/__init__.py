"""Finished runs: loading run folders (read with ``runfolder``) and tracker CSVs as one
``Run`` (``load``), comparing two runs (``compare``) and plotting memory timelines
(``plot``). Imports no torch."""
