"""Runtime utilities: backend and precision, device mesh, memory, progress, seeding, errors, paths."""
