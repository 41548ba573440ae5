"""What the members of a collective must pass alike, op by op, so that only an illegal call is a mismatch.

From what PyTorch records (``FlightRecorder::record`` takes the op's input and output tensors as the
backend received them) and what each op requires:

- all_reduce, broadcast, reduce, barrier, all_gather into a tensor, reduce_scatter of a tensor (and
  the ``_broadcast_oop`` / ``_reduce_oop`` pieces of an uneven all_gather or reduce_scatter, each
  sized by its root): every member passes inputs of the same sizes.
- gather: every member sends one tensor of the same size; only the root records outputs, the others
  an empty list (sizes and dtypes). scatter: the other way round, only the root records inputs.
- all_to_all and all_to_all_single: with uneven splits each member sends and receives its own sizes.
- every op: the dtypes a member names, on whichever side it records, agree.
Ops not listed here get no size rule: an unknown op is never called a size mismatch.
"""

from __future__ import annotations

from collections.abc import Callable

from ..base.model import Entry

_SAME_INPUTS = frozenset(
    {
        "all_reduce", "allreduce", "all_reduce_barrier", "barrier", "broadcast", "_broadcast_oop", "reduce",
        "_reduce_oop", "all_gather", "allgather", "_allgather_base", "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced", "allreduce_coalesced", "all_reduce_coalesced",
    }
)  # fmt: skip


def _inputs(entry: Entry) -> object:
    return entry.input_sizes


def _outputs(entry: Entry) -> object:
    return entry.output_sizes


def _unconstrained(entry: Entry) -> object:
    return None


def size_rule(op: str) -> Callable[[Entry], object]:
    """The sizes of an entry that every member must pass alike (None from the rule: no constraint)."""
    if op in _SAME_INPUTS or op == "gather":
        return _inputs
    if op == "scatter":
        return _outputs
    return _unconstrained


def sizes_that_agree(entry: Entry) -> object:
    """What of an entry's sizes every member of its op must match."""
    return size_rule(entry.op)(entry)


def dtypes_that_agree(entry: Entry) -> frozenset[str]:
    """The dtypes an entry names on either side: gather and scatter leave one side empty off the root."""
    return frozenset(entry.input_dtypes) | frozenset(entry.output_dtypes)


def recorded_sizes(entry: Entry) -> tuple[tuple[int, ...], ...]:
    """The sizes a person compares: the side the rule reads (a root's gather outputs are not it)."""
    return entry.output_sizes if size_rule(entry.op) is _outputs else entry.input_sizes or entry.output_sizes
