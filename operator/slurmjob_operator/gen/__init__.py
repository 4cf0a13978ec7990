"""Build-time generators: the CRD and its reference page."""
