"""The SlurmJob resource: spec and status models, site validation and the generated CRD."""
