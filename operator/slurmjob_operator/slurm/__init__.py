"""slurmrestd adapter: dialects per REST API version, one normalised job view, the client."""
