"""What every stage uses: the model of a job (``model``: entries, ops, groups, findings), how text from
outside is shown (``text``) and how findings name ranks and ops (``words``), and the machinery of a run
(the optional C module, the garbage collector paused, process pools, files cleaned up on a signal)."""
