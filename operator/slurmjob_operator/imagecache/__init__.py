"""The OCI image cache (issue 44): `spec.framework.image` turned into a cache entry on the
shared storage, imported once by a Slurm job and checked cheaply by every job that uses it.

A SlurmJob names an OCI reference from a registry its tenant lists. The operator keeps one
record per (scope, canonical reference) in an object it owns, submits an *import job* (a
batch job on a CPU partition, run as the cache user) that resolves the digest for
linux/amd64, builds a SquashFS (Enroot/Pyxis) or a SIF (Apptainer) in a temporary directory,
checks it, writes a result file and renames the image into the cache under its digest. The
job that uses the image checks only its size, inode and ctime as recorded. Images pulled with
a tenant's credentials are that tenant's (`tenant-<name>` scope), anonymous pulls are shared.

Pure modules (no I/O, no Kubernetes, HTTP, Slurm or template library; import-linter enforces
it):

- `reference`: the strict OCI reference parser, registry allow-lists, the runtimes' URIs;
- `layout`: the cache's paths, the record key, the import job's name, the scope words;
- `record`: the operator-owned record and the import job's result file (pydantic);
- `decide`: what to do next for a record (submit, adopt, wait, ready, fail, retry) and
  whether a SlurmJob may use a record;
- `evict`: which cache files go when the cache is over its cap (the share rule of
  `core.shares`, pins included) and whether a scope may start another import;
- `usage`: what the cache's metrics report (bytes and entries per scope, an import's end);
- `verifyrecord`, `verifydecide`: registry artifacts verified once by a job of the cache user
  where the site opts in (SLURMJOB_ARTIFACT_VERIFY_JOBS): the record, the result file and
  what to do next (adapters: `verifyjob`, `verifystore`, `verifygate`).

The adapters (script rendering, the record store, Slurm submission) build on these.
"""
