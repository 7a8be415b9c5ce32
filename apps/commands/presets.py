"""Ready-made scheduler hooks (ClusterHooks) for Slurm and Kubernetes: argv only, no shell.

Slurm: cordon and drain set the node DRAIN with Opsboard's reason (running jobs finish, no
new ones start; Opsboard's drain has already checkpointed and stopped the job), uncordon
RESUMEs it; the state hook is `sinfo -h -N -o "%N %T %E"`, whose drained, down or
not-responding nodes Opsboard marks down with Slurm's reason (`%E`, last: it may hold
spaces) (apps.commands.services.scheduler_states).
Kubernetes: `kubectl cordon / uncordon / drain`; no state hook (`kubectl get nodes` prints
more than "NODE STATE"; a node's NotReady reaches Opsboard through its missing heartbeat).

`env` puts variables in front of each command through `env(1)`, still without a shell: a
Slurm whose configuration is not at the default path (`SLURM_CONF`), a kubeconfig.
"""

from __future__ import annotations

from collections.abc import Mapping

SLURM = "slurm"
KUBERNETES = "kubernetes"

PRESETS: dict[str, dict[str, list[str]]] = {
    SLURM: {
        "cordon_argv": [
            "scontrol", "update", "NodeName={node}", "State=DRAIN", "Reason=opsboard: {reason}"
        ],
        "drain_argv": [
            "scontrol", "update", "NodeName={node}", "State=DRAIN", "Reason=opsboard: {reason}"
        ],
        "uncordon_argv": ["scontrol", "update", "NodeName={node}", "State=RESUME"],
        "state_argv": ["sinfo", "-h", "-N", "-o", "%N %T %E"],
    },
    KUBERNETES: {
        "cordon_argv": ["kubectl", "cordon", "{node}"],
        "drain_argv": [
            "kubectl", "drain", "{node}", "--ignore-daemonsets", "--delete-emptydir-data",
            "--timeout=300s",
        ],
        "uncordon_argv": ["kubectl", "uncordon", "{node}"],
        "state_argv": [],
    },
}  # fmt: skip


def hooks_preset(scheduler: str, env: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """The ClusterHooks argv fields for `scheduler` (SLURM or KUBERNETES), each command
    prefixed with `env NAME=VALUE ...` when `env` names variables."""
    prefix = ["env", *(f"{name}={value}" for name, value in (env or {}).items())] if env else []
    return {field: [*prefix, *argv] if argv else [] for field, argv in PRESETS[scheduler].items()}
