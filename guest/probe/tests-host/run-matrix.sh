#!/usr/bin/env bash
# Boots the probe under the throwaway KVM harness in the configurations the
# probe must pass (and a few it must fail), and prints "N passed, N failed".
# Needs /dev/kvm; skips (exit 0, says so) without it.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ ! -w /dev/kvm ]; then
  echo "SKIP: /dev/kvm not available"
  exit 0
fi
elf="$("$here/../build.sh" | tail -1)" || { echo "probe build failed" >&2; exit 1; }
(cd "$here" && cargo build --release --quiet) || { echo "harness build failed" >&2; exit 1; }
harness="$here/target/x86_64-unknown-linux-gnu/release/probe-harness"
log="$(mktemp -d)"
pass=0 fail=0

# run NAME EXPECT(pass|fail) HARNESS-ARGS...
run() {
  local name="$1" expect="$2"; shift 2
  local out="$log/$name.log" rc
  timeout 120 "$harness" --elf "$elf" --timeout-s 60 "$@" >"$out" 2>&1
  rc=$?
  if { [ "$expect" = pass ] && [ $rc -eq 0 ]; } || { [ "$expect" = fail ] && [ $rc -eq 1 ] && grep -q "PROBE FAIL" "$out"; }; then
    pass=$((pass + 1)); echo "ok   $name ($(grep -o 'after [0-9.]* ms' "$out" | tail -1))"
  else
    fail=$((fail + 1)); echo "FAIL $name (rc=$rc), log:"; sed 's/^/    /' "$out"
  fi
}

run boot-256m        pass --scenario boot --mem-mib 256
run boot-4g          pass --scenario boot --mem-mib 4096
run boot-32m         pass --scenario boot --mem-mib 32
run smp-1            pass --scenario smp --vcpus 1
run smp-2            pass --scenario smp --vcpus 2
run smp-4-4g         pass --scenario smp --vcpus 4 --mem-mib 4096
run spin             pass --scenario spin
run neg-no-token     fail --omit-token
run neg-mem-mismatch fail --claim-mem-mib 512
run neg-scenario     fail --scenario no-such-scenario
run neg-aps-runnable fail --scenario smp --vcpus 2 --aps-runnable
rm -rf "$log"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
