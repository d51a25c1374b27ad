"""The store: everything on disk under --path (checkpoints, history, trajectories, review decisions)
and the completion records a train step reads; torch-free."""
