"""The platform's trusted site: catalogs, runtime artifacts, site resolution, the batch script."""
