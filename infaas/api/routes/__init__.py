"""HTTP routes, one module per resource. Routes parse, call the use case, and serialise."""
