#!/bin/sh
# Runs a command as if every N consecutive ranks of the job shared a host of their own:
# HVD_HOSTNAME is hvd's host identity (README, Configuration), so hierarchical allreduce and
# local ranks see N ranks on each of size/N hosts, all on this machine.
#
#   fake_hosts.sh N command [args...]     (the rank from HVD_RANK, else OMPI_COMM_WORLD_RANK)
set -eu
per_host=$1
shift
rank=${HVD_RANK:-${OMPI_COMM_WORLD_RANK:?fake_hosts.sh: no HVD_RANK or OMPI_COMM_WORLD_RANK}}
HVD_HOSTNAME=fake-host-$((rank / per_host))
export HVD_HOSTNAME
exec "$@"
