"""Training: collate packed rows to tensors, packed forward passes, teacher scoring, losses."""
