"""Hand-written single-operator reference tasks (data files, loaded by tasks.builtin; not imported)."""
