#!/bin/bash
# A real multi-node Slurm on this one host, for development and CI (run as root).
#
#   scripts/local_slurm.sh up       install (if missing) + configure + start + wait until nodes are idle
#   scripts/local_slurm.sh down     cancel jobs and stop every daemon this script started
#   scripts/local_slurm.sh status   daemons and node states
#   scripts/local_slurm.sh clean    down, then delete the state directory
#
# What `up` guarantees when it returns 0: munged, MariaDB, slurmdbd (sacct works), slurmctld and one
# slurmd per virtual node are running; nodes cpu1..cpuN (partition `cpu`, default) and gpu1..gpuM
# (partition `gpu`, each with fake `gpu` GRES: symlinks to /dev/null, so --gpus jobs schedule and
# get CUDA_VISIBLE_DEVICES) are idle; the unprivileged submit user exists; $ROOT/shared (mode 1777)
# stands in for a shared filesystem. `up` is idempotent: a second call only checks.
# Why several slurmd on one host: Slurm never places two components of one heterogeneous job on
# the same node, so a het job needs as many nodes as it has groups (Debian builds MULTIPLE_SLURMD).
# Requeue delays are shortened (cred_expire=10, sched_interval=2, bf_interval=1): a requeued job
# runs again after ~12 s instead of ~3 min. No systemd, no cgroups (proctrack/linuxproc).
#
# Knobs (environment):
#   SPOOLRL_SLURM_ROOT       state, logs, spool; must not be under a mode-700 home   [/var/lib/spoolrl-slurm]
#   SPOOLRL_SLURM_CPU_NODES  CPU nodes                                               [2]
#   SPOOLRL_SLURM_GPU_NODES  fake-GPU nodes                                          [2]
#   SPOOLRL_SLURM_CPUS       CPUs declared per node (may exceed the real count)      [4]
#   SPOOLRL_SLURM_MEM_MB     memory declared per node                                [4096]
#   SPOOLRL_SLURM_GPUS       fake GPUs per GPU node                                  [2]
#   SPOOLRL_SLURM_USER       unprivileged submit user to create ('' = none)  [$SPOOLRL_CI_USER or spoolrl-ci]
#   SPOOLRL_SLURM_APT_OPTS   extra apt-get options (e.g. a private source list)      []
set -euo pipefail

ROOT=${SPOOLRL_SLURM_ROOT:-/var/lib/spoolrl-slurm}
NUM_CPU_NODES=${SPOOLRL_SLURM_CPU_NODES:-2}
NUM_GPU_NODES=${SPOOLRL_SLURM_GPU_NODES:-2}
NODE_CPUS=${SPOOLRL_SLURM_CPUS:-4}
NODE_MEM_MB=${SPOOLRL_SLURM_MEM_MB:-4096}
NODE_GPUS=${SPOOLRL_SLURM_GPUS:-2}
SUBMIT_USER=${SPOOLRL_SLURM_USER-${SPOOLRL_CI_USER:-spoolrl-ci}}
read -r -a APT_OPTS <<<"-o DPkg::Lock::Timeout=900 ${SPOOLRL_SLURM_APT_OPTS:-}"
CLUSTER=spoolrl
HOST=$(hostname -s)
CONF=/etc/slurm
CTLD_PORT=6817
DBD_PORT=6819
SLURMD_PORT0=6830          # slurmd of node k listens on SLURMD_PORT0 + k
DB_PORT=3307               # MariaDB on 127.0.0.1, off the default port
DB_SOCK=$ROOT/mysql/mysqld.sock
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)

say() { printf '[local_slurm] %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

nodes() {  # one line per virtual node: NAME PORT KIND
  local i port=$SLURMD_PORT0
  for ((i = 1; i <= NUM_CPU_NODES; i++)); do echo "cpu$i $port cpu"; port=$((port + 1)); done
  for ((i = 1; i <= NUM_GPU_NODES; i++)); do echo "gpu$i $port gpu"; port=$((port + 1)); done
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# ------------------------------------------------------------------------------------ install
install_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get "${APT_OPTS[@]}" update -qq
  # Without systemd (or with policy-rc.d) the postinst scripts start nothing: we start the daemons.
  apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ------------------------------------------------------------------------------------ configure
put() {  # put FILE MODE OWNER:GROUP < content; rewrites only on change (keeps `up` a no-op)
  local tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 0; fi
  install -m "$2" -o "${3%:*}" -g "${3#*:}" "$tmp" "$1"
  rm -f "$tmp"
}

node_hosts() {  # node names resolve to their NodeAddr, as on a real cluster (torch rendezvous uses them)
  local line want
  want="127.0.0.1 $(nodes | awk '{print $1}' | paste -sd' ')  # spoolrl local_slurm nodes"
  line=$(grep -F '# spoolrl local_slurm nodes' /etc/hosts || true)
  [ "$line" = "$want" ] && return 0
  # Rewrite in place (not sed -i): /etc/hosts is often a bind mount that cannot be renamed over.
  { grep -vF '# spoolrl local_slurm nodes' /etc/hosts || true; echo "$want"; } >/etc/hosts.spoolrl.tmp
  cat /etc/hosts.spoolrl.tmp >/etc/hosts
  rm -f /etc/hosts.spoolrl.tmp
}

make_dirs() {
  getent hosts "$HOST" >/dev/null || echo "127.0.0.1 $HOST" >>/etc/hosts
  node_hosts
  install -d -m 755 "$ROOT" "$ROOT/run" "$ROOT/fakegpu" "$ROOT/spool"
  install -d -m 755 -o slurm -g slurm "$ROOT/ctld" "$ROOT/log"
  install -d -m 1777 "$ROOT/shared"
  install -d -m 755 -o mysql -g mysql "$ROOT/mysql" "$ROOT/mysql/data"
  local name port kind k
  while read -r name port kind; do install -d -m 755 "$ROOT/spool/$name"; done < <(nodes)
  for ((k = 0; k < NODE_GPUS; k++)); do ln -sfn /dev/null "$ROOT/fakegpu/nvidia$k"; done
  if [ ! -s /etc/munge/munge.key ]; then
    install -d -m 700 -o munge -g munge /etc/munge
    head -c 1024 /dev/urandom >/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  if [ -n "$SUBMIT_USER" ] && ! id "$SUBMIT_USER" >/dev/null 2>&1; then
    useradd --create-home --shell /bin/bash "$SUBMIT_USER"
  fi
}

slurm_conf() {
  cat <<EOF
# Written by spoolrl scripts/local_slurm.sh: a test cluster of virtual nodes on one host.
ClusterName=$CLUSTER
SlurmctldHost=$HOST
SlurmUser=slurm
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT0
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start cred_expire+1 s after the requeue (default 120 s).
AuthInfo=cred_expire=10
StateSaveLocation=$ROOT/ctld
SlurmdSpoolDir=$ROOT/spool/%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without DefMemPerCPU every job takes a node's whole memory and jobs serialise per node.
DefMemPerCPU=256
SchedulerType=sched/backfill
# Het jobs start only from the backfill scheduler: bf_interval is their start latency.
SchedulerParameters=bf_interval=1,bf_continue,sched_interval=2
ReturnToService=2
KillWait=15
MinJobAge=300
InactiveLimit=0
SlurmdTimeout=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
GresTypes=gpu
EOF
  local name port kind gres
  while read -r name port kind; do
    gres=""
    [ "$kind" = gpu ] && [ "$NODE_GPUS" -gt 0 ] && gres=" Gres=gpu:$NODE_GPUS"
    echo "NodeName=$name NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$port CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB Feature=$kind$gres State=UNKNOWN"
  done < <(nodes)
  local cpu_nodes gpu_nodes
  cpu_nodes=$(nodes | awk '$3 == "cpu" {print $1}' | paste -sd,)
  gpu_nodes=$(nodes | awk '$3 == "gpu" {print $1}' | paste -sd,)
  [ -n "$cpu_nodes" ] && echo "PartitionName=cpu Nodes=$cpu_nodes Default=YES MaxTime=INFINITE State=UP"
  [ -n "$gpu_nodes" ] && echo "PartitionName=gpu Nodes=$gpu_nodes MaxTime=INFINITE State=UP"
  echo "PartitionName=all Nodes=ALL MaxTime=INFINITE State=UP"
}

gres_conf() {
  echo "AutoDetect=off"
  local name port kind
  while read -r name port kind; do
    [ "$kind" = gpu ] && [ "$NODE_GPUS" -gt 0 ] &&
      echo "NodeName=$name Name=gpu File=$ROOT/fakegpu/nvidia[0-$((NODE_GPUS - 1))]"
  done < <(nodes)
}

slurmdbd_conf() {
  cat <<EOF
# Written by spoolrl scripts/local_slurm.sh
AuthType=auth/munge
DbdHost=$HOST
DbdPort=$DBD_PORT
SlurmUser=slurm
PidFile=$ROOT/run/slurmdbd.pid
LogFile=$ROOT/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageLoc=spoolrl_slurm_acct
StorageUser=slurm
StoragePass=spoolrl-local
EOF
}

configure() {
  make_dirs
  slurm_conf | put "$CONF/slurm.conf" 644 root:root
  gres_conf | put "$CONF/gres.conf" 644 root:root
  slurmdbd_conf | put "$CONF/slurmdbd.conf" 600 slurm:slurm
}

# ------------------------------------------------------------------------------------ start
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
db_ok() { mariadb --socket="$DB_SOCK" -e 'select 1' >/dev/null 2>&1; }

poll() {  # poll TRIES CMD...: retry every 0.2 s
  local tries=$1 i
  shift
  for ((i = 0; i < tries; i++)); do "$@" && return 0; sleep 0.2; done
  return 1
}

start_munge() {
  munge_ok && return 0
  install -d -m 755 -o munge -g munge /run/munge
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  cp /run/munge/munged.pid "$ROOT/run/munged.pid"  # marks it as ours for `down`
  poll 50 munge_ok || die "munged does not answer"
}

start_mariadb() {
  db_ok && return 0
  if [ ! -d "$ROOT/mysql/data/mysql" ]; then
    mariadb-install-db --user=mysql --datadir="$ROOT/mysql/data" --auth-root-authentication-method=socket \
      --skip-test-db >"$ROOT/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed: $ROOT/log/mariadb-install.log"
  fi
  # setsid + closed fds: the server must not hold a caller's pipe open (`up | cat` returns).
  setsid runuser -u mysql -- /usr/sbin/mariadbd --no-defaults --datadir="$ROOT/mysql/data" \
    --socket="$DB_SOCK" --pid-file="$ROOT/mysql/mariadbd.pid" --bind-address=127.0.0.1 --port=$DB_PORT \
    --skip-name-resolve --innodb-buffer-pool-size=32M --innodb-log-file-size=16M \
    --log-error="$ROOT/log/mariadb.log" </dev/null >/dev/null 2>&1 &
  poll 150 db_ok || die "MariaDB did not start: $ROOT/log/mariadb.log"
  mariadb --socket="$DB_SOCK" <<'EOF'
CREATE DATABASE IF NOT EXISTS spoolrl_slurm_acct;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'spoolrl-local';
GRANT ALL ON spoolrl_slurm_acct.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
}

start_slurmdbd() {
  alive "$ROOT/run/slurmdbd.pid" || /usr/sbin/slurmdbd
  poll 150 sacctmgr -n list cluster >/dev/null 2>&1 || die "slurmdbd does not answer: $ROOT/log/slurmdbd.log"
  sacctmgr -n list cluster format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
}

start_slurm() {
  if alive "$ROOT/run/slurmctld.pid"; then
    scontrol reconfigure >/dev/null 2>&1 || true
  else
    /usr/sbin/slurmctld
  fi
  local name port kind
  while read -r name port kind; do
    alive "$ROOT/run/slurmd-$name.pid" || /usr/sbin/slurmd -N "$name"
  done < <(nodes)
}

nodes_ready() {  # every node idle, mixed or allocated
  local states
  states=$(sinfo -h -N -o '%t' 2>/dev/null | sort -u)
  [ -n "$states" ] && ! grep -qvE '^(idle|mix|alloc)$' <<<"$states"
}

wait_ready() {
  local deadline=$((SECONDS + 90)) resumed=0 bad
  until nodes_ready; do
    ((SECONDS < deadline)) || { sinfo -N -l >&2 || true; die "nodes not ready after 90 s; logs in $ROOT/log"; }
    # A node drained in an earlier session keeps that state in StateSaveLocation.
    bad=$(sinfo -h -N -t drain,down,fail -o '%N' 2>/dev/null | sort -u | paste -sd,)
    if [ -n "$bad" ] && [ $resumed = 0 ]; then
      sleep 2
      scontrol update NodeName="$bad" State=RESUME 2>/dev/null || true
      resumed=1
    fi
    sleep 0.25
  done
  say "up: $(sinfo -h -o '%P=%D' | paste -sd' ') (state in $ROOT)"
}

up() {
  [ "$(id -u)" = 0 ] || die "run as root (CI does)"
  install_packages
  configure
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurm
  wait_ready
}

# ------------------------------------------------------------------------------------ stop
stop_pid() {  # stop_pid PIDFILE: TERM, wait up to 10 s, then KILL
  local pid i
  [ -s "$1" ] || return 0
  pid=$(cat "$1")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$1"
}

down() {
  [ "$(id -u)" = 0 ] || die "run as root"
  if alive "$ROOT/run/slurmctld.pid"; then
    scancel --quiet --state=PENDING,RUNNING,SUSPENDED --user="$(squeue -h -o %u | sort -u | paste -sd,)" \
      2>/dev/null || true
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  local f
  for f in "$ROOT"/run/slurmd-*.pid "$ROOT/run/slurmctld.pid"; do stop_pid "$f" & done
  wait
  stop_pid "$ROOT/run/slurmdbd.pid" &
  stop_pid "$ROOT/mysql/mariadbd.pid" &
  stop_pid "$ROOT/run/munged.pid" &
  wait
  say "down"
}

status() {
  local f
  for f in "$ROOT"/run/*.pid "$ROOT/mysql/mariadbd.pid"; do
    [ -e "$f" ] || continue
    if alive "$f"; then echo "up    $(basename "$f" .pid) (pid $(cat "$f"))"; else echo "dead  $(basename "$f" .pid)"; fi
  done
  sinfo -N -o '%N %P %t %c %m %G' 2>/dev/null || { echo "slurmctld not answering"; return 1; }
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  clean) down; rm -rf "$ROOT"; say "removed $ROOT" ;;
  *) echo "usage: $0 up|down|status|clean" >&2; exit 2 ;;
esac
