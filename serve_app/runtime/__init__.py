"""What runs one response without HTTP: the run, the tool loop, background runs, offload."""
