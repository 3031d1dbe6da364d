"""Finished runs: loading runner folders and tracker CSVs (``load``), comparing two runs
(``compare``) and plotting memory timelines (``plot``). Imports no torch."""
