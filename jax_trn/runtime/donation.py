"""Buffer donation: an argument's HBM becomes an output's (input/output aliasing).

JAX marks a donated argument (`jax.jit(..., donate_argnums / donate_argnames)`) that an
output can reuse in the module: `tf.aliasing_output = j` (output j of the same type
takes it over) or `jax.buffer_donor` (the compiler may give it to any output of the
same size; JAX's choice for programs whose output shardings are left to the
partitioner). `aliases` reads both into {parameter: output}: an output buffer of the
same number of bytes (per device), each output at most once.

At execution (PJRT's semantics, `PJRT_ExecuteOptions.non_donatable_input_indices`):
every aliased argument is donated unless the caller lists it as non-donatable. The
aliased output is made without allocating (`Allocations.reuse`): it gets the donated
argument's HBM when the call succeeds, and the argument is deleted (reading it raises
JAX's "Array has been deleted"); a call that fails donates nothing. The program still
reads the argument while it runs: the simulator keeps the two host arrays apart, the
device's byte count (`memory_stats`) is what reuse saves.

Passing a donated buffer twice in one call is an error, with XLA's messages
(`check_clashes`).
"""
from __future__ import annotations


class DonationError(ValueError):
    """A donated buffer also used by the same call (INVALID_ARGUMENT, as in XLA)."""


class DeletedArgument(ValueError):
    """A call given a deleted (e.g. donated) buffer: INVALID_ARGUMENT with XLA's
    message (JAX's dispatch passes it on without looking; reading it raises there)."""


def aliases(arg_attrs: list[dict], params, outputs) -> dict[int, int]:
    """{parameter index: output index} from the entry function's argument attributes
    (`tf.aliasing_output` first, then each `jax.buffer_donor` to the first free output
    of its byte size); `params` / `outputs`: the per-device DRAM tensors."""
    out: dict[int, int] = {}
    taken: set[int] = set()
    for i, attrs in enumerate(arg_attrs):
        j = attrs.get("tf.aliasing_output")
        if isinstance(j, int) and not isinstance(j, bool) and _fits(params[i], outputs, j):
            out[i] = j
            taken.add(j)
    for i, attrs in enumerate(arg_attrs):
        if i in out or not attrs.get("jax.buffer_donor"):
            continue
        j = next((j for j in range(len(outputs)) if j not in taken
                  and outputs[j].nbytes == params[i].nbytes), None)
        if j is not None:
            out[i] = j
            taken.add(j)
    return out


def _fits(param, outputs, j: int) -> bool:
    return 0 <= j < len(outputs) and outputs[j].nbytes == param.nbytes


def donated(alias: dict[int, int], keep) -> dict[int, int]:
    """The aliases a call donates: all but the caller's non-donatable parameters."""
    return {i: j for i, j in alias.items() if i not in keep}


def check_clashes(args: list, donate: dict[int, int], partition: int) -> None:
    """XLA's rule: a donated buffer may appear only once among a call's arguments."""
    first: dict[int, tuple[int, bool]] = {}
    for i, buf in enumerate(args):
        give = i in donate
        seen = first.get(id(buf))
        if seen is None:
            first[id(buf)] = (i, give)
            continue
        where = f"flattened argument {i}, replica 0, partition {partition}, first use: {seen[0]}"
        if give and seen[1]:
            raise DonationError(f"Attempt to donate the same buffer twice in Execute() "
                                f"({where}). Toy example for this bug: "
                                "`f(donate(a), donate(a))`.")
        if give:
            raise DonationError(f"Attempt to donate a buffer which is also used by the "
                                f"same call to Execute() ({where}). Toy example for this "
                                "bug: `f(a, donate(a))`.")
        if seen[1]:
            raise DonationError(f"Attempt to use a buffer that was previously donated in "
                                f"the same call to Execute() ({where}). Toy example for "
                                "this bug: `f(donate(a), a)`.")
