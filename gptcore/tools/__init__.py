"""Small utilities every part uses: atomic writes, disk space, content fingerprints, process trees."""
