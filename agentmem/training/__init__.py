"""Training: collate packed rows to tensors, the shared packed forward path (``forward``), teacher
sources (``teachers``), loss terms and the objective (``terms``, ``objective``), teacher scoring
(``scoring``) and the distill trainer (``distill``)."""
