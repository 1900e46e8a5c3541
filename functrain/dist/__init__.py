"""Distribution: device meshes, sharding plans and the step's collectives."""
