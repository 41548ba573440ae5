"""Diagnose: from matched ops to findings and one verdict.

How a culprit is chosen, in order: ``evidence`` finds each rank's blocking op (on each stream, the first
op that did not complete) and whom it waits for; ``blame`` follows those waits to where they end (a rank
nothing blocks is the culprit; ranks that wait for each other are a deadlock, which ``symmetry`` breaks
by the order of ops that differs from the peers'); the rules of ``verdict`` (``RULES``) turn that into
findings, with ``stragglers`` and, where the dumps cannot tell, ``beside`` (stack snapshots and logs,
``frozen``, ``corroborate``); ``verdict.verdict`` weighs them, and ``next_steps`` says what to do."""
