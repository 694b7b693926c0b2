#!/bin/bash
# Stand-in for "python -m hpc.cli VERB RUN ..." in rendered jobs (set as slurm.<group>.python):
# it records its arguments, environment and signals under RUN/fake/, then follows the plan in
# RUN/fake/<role>.plan ("SECONDS STATUS": sleep, then exit with STATUS; default "600 0").
# SIGUSR1/SIGTERM are recorded and end it with status 0, as a drained role would.
[ "$1" = -m ] && shift 2
verb=$1 run=$2
fake="$run/fake"
mkdir -p "$fake"
if [ "$verb" = init ]; then
  echo "init $*" >>"$fake/init.log"
  exit 0
fi
role=${verb%-node}
tag="$role-${SLURMD_NODENAME:-none}-${SLURM_PROCID:-0}-j${SLURM_JOB_ID:-0}-r${SLURM_RESTART_COUNT:-0}"
# Traps first, then the env file (written whole, by rename): a test that sees the file may signal at once.
trap 'echo USR1 >>"$fake/$tag.signals"; exit 0' USR1
trap 'echo TERM >>"$fake/$tag.signals"; exit 0' TERM
env | grep -E '^(SLURM|SLURMD|CUDA_VISIBLE|SPOOLRL|APPTAINER_CONTAINER)' | sort >"$fake/.$tag.env.tmp"
mv -f "$fake/.$tag.env.tmp" "$fake/$tag.env"
read -r secs status 2>/dev/null <"$fake/$role.plan" || { secs=600; status=0; }
echo "started $tag plan=$secs/$status"
sleep "$secs" &
wait $!
echo "ending $tag with $status"
exit "$status"
