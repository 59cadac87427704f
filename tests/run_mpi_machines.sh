#!/bin/bash
# Runs one rank of an mpirun job as if its machines held PER ranks each:
# LOCAL_RANK / LOCAL_WORLD_SIZE (read before OpenMPI's own variables) from
# the MPI rank, so that one host stands for several machines (hybrid sharding).
# Usage: mpirun -np N run_mpi_machines.sh PER PROGRAM [ARGS...]
PER=$1
shift
export LOCAL_RANK=$((OMPI_COMM_WORLD_RANK % PER)) LOCAL_WORLD_SIZE=$PER
exec "$@"
