#!/bin/bash
# Stand-in for "python -m hpc.cli VERB RUN ..." in rendered jobs (set as slurm.<group>.python):
# it records its arguments, environment and signals under RUN/fake/, then follows the plan in
# RUN/fake/<role>.plan ("SECONDS STATUS": wait, then exit with STATUS; default "600 0").
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
# The plan's wait (below) is a timed read on a FIFO nobody writes, not a `sleep` child: Slurm signals a
# step's process tree deepest first, so under load a `sleep` died of the SIGTERM, this shell took
# that for the end of its plan and exited before its own SIGTERM came (nothing recorded). A read
# keeps the task one process, as a role is, and a trapped signal interrupts it at once.
mkfifo "$fake/.$tag.fifo"
exec 3<>"$fake/.$tag.fifo"
rm -f "$fake/.$tag.fifo"
env | grep -E '^(SLURM|SLURMD|CUDA_VISIBLE|SPOOLRL|APPTAINER_CONTAINER)' | sort >"$fake/.$tag.env.tmp"
mv -f "$fake/.$tag.env.tmp" "$fake/$tag.env"
read -r secs status 2>/dev/null <"$fake/$role.plan" || { secs=600; status=0; }
echo "started $tag plan=$secs/$status"
read -r -t "$secs" -u 3
echo "ending $tag with $status"
exit "$status"
