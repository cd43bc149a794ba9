"""`jax.distributed.initialize()` with no arguments in processes started by
`python -m jax_trn.launch` (issue 17).

JAX finds the coordinator, the process count and this process's index by asking each
`ClusterEnv` subclass it knows whether its environment is present (SLURM, Open MPI,
Kubernetes, ...). This one is present when the launcher's variables are set:

    JAX_TRN_COORDINATOR     host:port of process 0's coordination service
    JAX_TRN_NUM_PROCESSES   how many processes the run has
    JAX_TRN_PROCESS_ID      this process's index, 0..N-1

so code written for a cluster (`jax.distributed.initialize()` and nothing else) runs
unchanged, N processes on this machine sharing one simulated system. Arguments given to
`initialize` explicitly win over these. The class registers itself when this module is
imported (`import jax_trn` does, and so does the launcher before it runs the script).
"""
from __future__ import annotations

from jax._src.clusters import ClusterEnv

from jax_trn.config import LAUNCH_VARIABLES, launch_variables

COORDINATOR, NUM_PROCESSES, PROCESS_ID = LAUNCH_VARIABLES


class TrnLaunch(ClusterEnv):
    """The processes of one `python -m jax_trn.launch` run."""

    name = "jax_trn"

    @classmethod
    def is_env_present(cls) -> bool:
        return len(launch_variables()) == len(LAUNCH_VARIABLES)

    @classmethod
    def get_coordinator_address(cls, timeout_secs, override_coordinator_port=None) -> str:
        address = launch_variables()[COORDINATOR]
        if override_coordinator_port:
            address = f"{address.rsplit(':', 1)[0]}:{override_coordinator_port}"
        return address

    @classmethod
    def get_process_count(cls) -> int:
        return int(launch_variables()[NUM_PROCESSES])

    @classmethod
    def get_process_id(cls) -> int:
        return int(launch_variables()[PROCESS_ID])

    @classmethod
    def get_local_process_id(cls) -> int | None:
        return None        # every process sees the devices; the plugin says which are its own
