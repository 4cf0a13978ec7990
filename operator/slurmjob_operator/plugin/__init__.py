"""`kubectl slurmjob` (console script `kubectl-slurmjob`): logs, get, describe and cancel from
the user's side, with nothing but their kubeconfig (`plugin.main`). An entry point: it talks
to the kube-apiserver only (and through it to the operator's log endpoint), never to Slurm or
the storage."""
