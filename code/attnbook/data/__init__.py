"""Data loaders: each reads a data file shipped in a package (offline), with a seeded split."""
