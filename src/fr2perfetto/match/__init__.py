"""Match: the entries of every rank into ops across ranks. ``ops.match_ops`` matches collectives by
(group, seq), ``coalesce`` the batches and coalesced groups, ``pairs`` each send to its recv in pair order,
``arguments`` what members must agree on; ``clocks`` estimates how far each host's clock runs ahead."""
