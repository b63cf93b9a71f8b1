#!/bin/busybox sh
# /init of the nested lane's L1 host (busybox sh; see guest/nested/README.md).
#
# L1 is a Linux with KVM + kvm_amd running under QEMU TCG with SVM exposed, so zygote's
# VMM gets a /dev/kvm with hardware-virtualization semantics. This script mounts the
# usual filesystems, then runs the steps of /lane/plan one after the other and reports
# on the serial console with lines the host's driver (scripts/nested-lane.py) parses:
#
#   @@zy l1 <key>=<value> ...       facts about L1, once, before the first step
#   @@zy begin <step>               a step starts; its output follows as is
#   @@zy end <step> rc=<n> ms=<n>   it ended (rc 124: killed by its time limit)
#   @@zy serve <port> <token> <proxy port>
#                                   a "serve" step's daemon answers on <port> (the host
#                                   reaches it through QEMU's forward); the step ends
#                                   when the host writes "done" to the console
#   @@zy lane-done                  every step ran; L1 powers off next
#
# /lane/plan: one step per line, fields separated by a tab: name, time limit in seconds,
# kind (run | serve), command. /lane/env holds the environment every step sees.
PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
export PATH

/bin/busybox mkdir -p /proc /sys /dev /tmp /run /root /var/tmp /usr/bin /usr/sbin /sbin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs tmpfs /run
# Scratch space is tmpfs, except where the host staged the checkout (one under /tmp or
# /root): a tmpfs there would hide it, so that directory stays on the disk and temporary
# files go to a tmpfs on /var/tmp instead.
scratch() {
  [ -z "$(ls -A "$1" 2>/dev/null)" ] && mount -t tmpfs -o "mode=$2" tmpfs "$1"
}
TMPDIR=/tmp
scratch /tmp 1777 || { mount -t tmpfs -o mode=1777 tmpfs /var/tmp; TMPDIR=/var/tmp; }
export TMPDIR
scratch /root 0700 || true
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
# The lane's channel is the first serial port; the kernel logs to the second
# (console=ttyS1), so its messages never split a line of test output.
exec </dev/ttyS0 >/dev/ttyS0 2>&1
# It carries the host's "done" for serve steps: no echo, no line editing.
stty -echo -icanon 2>/dev/null
hostname l1

# Networking for serve steps: QEMU user networking, host forward to this address.
ip link set lo up
if ip link set eth0 up 2>/dev/null; then
  ip addr add 10.0.2.15/24 dev eth0
  ip route add default via 10.0.2.2
fi

svm=no
grep -qw svm /proc/cpuinfo && svm=yes
npt=no
grep -qw npt /proc/cpuinfo && npt=yes
kvm=no
[ -c /dev/kvm ] && kvm=yes
mem=$(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo)
# What kvm_amd actually uses (the CPU flag above only says it could).
kvm_npt=$(cat /sys/module/kvm_amd/parameters/npt 2>/dev/null || echo -)
model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo | tr ' ' '_')
echo "@@zy l1 kernel=$(uname -r) cpus=$(nproc) mem_mib=$mem svm=$svm npt=$npt kvm=$kvm" \
  "kvm_amd.npt=$kvm_npt cpu=$model"

uptime_ms() { awk '{print int($1 * 1000)}' /proc/uptime; }

# Ends whatever a step left behind (VMMs, daemons): kill(-1) from PID 1 reaches every
# process but init itself.
sweep() {
  kill -9 -1 2>/dev/null
  wait 2>/dev/null
  sleep 0.2
}

run_serve() {
  name=$1
  limit=$2
  cmd=$3
  token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  state=$TMPDIR/serve-$name
  mkdir -p "$state"
  umask 077
  echo "$token" >"$state/token"
  umask 022
  sh -c "$cmd --state-dir $state --listen 0.0.0.0:7420 --proxy-listen 0.0.0.0:7421" \
    >"$state/daemon.log" 2>&1 &
  pid=$!
  ready=no
  i=0
  while [ $i -lt 600 ]; do
    if grep -q "listening on" "$state/daemon.log" 2>/dev/null; then
      ready=yes
      break
    fi
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
    i=$((i + 1))
  done
  if [ $ready != yes ]; then
    cat "$state/daemon.log"
    return 1
  fi
  echo "@@zy serve 7420 $token 7421"
  # The host runs its clients now; it writes "done" when they finished (or gave up).
  reply=
  while [ "$reply" != done ]; do
    if ! read -r -t "$limit" reply <&3; then
      echo "no 'done' from the host within ${limit}s"
      break
    fi
  done
  echo "--- daemon log (last 40 lines) ---"
  tail -n 40 "$state/daemon.log"
  kill -TERM $pid 2>/dev/null
  return 0
}

. /lane/env
# fd 3: the console, for the host's "done" (the loop's stdin is the plan).
exec 3<&0
tab=$(printf '\t')
while IFS=$tab read -r name limit kind cmd; do
  case $name in "" | "#"*) continue ;; esac
  echo "@@zy begin $name"
  start=$(uptime_ms)
  case $kind in
  serve)
    run_serve "$name" "$limit" "$cmd"
    rc=$?
    ;;
  *)
    timeout -s KILL "$limit" sh -c "$cmd" </dev/null 2>&1
    rc=$?
    # busybox timeout reports a kill as 137 (128 + SIGKILL).
    [ $rc -eq 137 ] && rc=124
    ;;
  esac
  echo "@@zy end $name rc=$rc ms=$(($(uptime_ms) - start))"
  sweep
done </lane/plan
echo "@@zy lane-done"
sync
poweroff -f
