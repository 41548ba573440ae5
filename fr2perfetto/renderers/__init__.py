"""One module per output format; each writes a ``Timeline`` it is given and nothing else."""
