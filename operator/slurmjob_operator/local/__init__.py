"""`slurmjob-operator submit`: the operator's core without Kubernetes, for trying a site.

The same `Controller` and `Poller` the operator runs, on a `LocalStore` instead of the API
server: each SlurmJob is a JSON file `<state dir>/<namespace>/<name>.json` (the whole object,
status included, rewritten atomically), status writes are RFC 7386 merge patches as on the
API server, Events are lines on stderr, and Secrets come from a YAML file
`{secretName: {key: value}}`.
"""

from slurmjob_operator.local.runner import LocalOptions, LocalResult, LocalRunner, logging_to
from slurmjob_operator.local.store import (
    LocalInputError,
    LocalStore,
    default_state_dir,
    load_secrets_file,
    new_object,
    object_key,
)

__all__ = [
    "LocalInputError",
    "LocalOptions",
    "LocalResult",
    "LocalRunner",
    "LocalStore",
    "default_state_dir",
    "load_secrets_file",
    "logging_to",
    "new_object",
    "object_key",
]
