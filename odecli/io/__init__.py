"""HDF5 run files: atomic writes and the layouts other tools rely on."""
