"""What runs one response without HTTP: the turn, the run, the tool loop, background runs, offload. Imports every layer below `server/`, never an HTTP framework."""
