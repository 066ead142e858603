#!/usr/bin/env bash
# make vm-test: the live topology path in a real two-socket guest.
#
# Boots Debian's kernel (from its linux-image package, fetched with apt-get download and cached
# under target/vm-cache/) in QEMU with two NUMA nodes (CPU 0 on node 0, CPU 1 on node 1), an
# Intel vIOMMU and an e1000e NIC behind a PCIe expander bus on node 1. The guest's userland is
# this host's Debian: /usr and /etc shared read-only over virtio-9p, the workspace read-only
# (binaries, images, scripts), target/vm-test/guest/ read-write for the results; a small
# initramfs built here from busybox loads the kernel package's modules and mounts them. Inside,
# integration/vm-test/guest.sh runs the scenario against containerd with the wrapper on the live
# topology. This script writes target/vm-test/report.json and prints `vm-test: N/M steps pass`
# last; it exits 0 only when every step passed.
#
# KVM is used when a short probe boots the guest kernel under it, TCG otherwise. QEMU runs under
# `timeout` with a parent-death signal, and is killed on every exit path of this script.
#
# Environment: KT_VM_ACCEL=auto|kvm|tcg (default auto), KT_VM_TIMEOUT (seconds for the guest,
# default 480), KT_VM_PROBE_TIMEOUT (seconds for the KVM probe, default 15).
#
#   run.sh [SCENARIO]   SCENARIO names a folder of integration/ with the guest's guest.sh
#                       (default vm-test). Its optional host.sh, sourced here, adds to the
#                       machine (scenario_memory_mib per NUMA node, scenario_qemu_args,
#                       scenario_shares), starts what the guest reaches on the host
#                       (scenario_up), stops it on every exit path (scenario_down), and adds
#                       to the report (scenario_report, scenario_not_covered). A host.sh that
#                       defines scenario_run boots the machine its own way instead of once
#                       here (make kata-test: a service boots one per pod). Results go to
#                       target/SCENARIO/.
set -euo pipefail

started=$(date +%s)
workspace=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
scenario=${1:-vm-test}
case "${scenario}" in */* | .* | "") echo "run.sh: a scenario is a folder name under integration/" >&2; exit 2 ;; esac
here=${workspace}/integration/${scenario}
[ -f "${here}/guest.sh" ] || { echo "run.sh: no integration/${scenario}/guest.sh" >&2; exit 2; }
vm=${workspace}/integration/vm-test
# KT_VM_OUT names the results folder under target/ (default: the scenario's name).
out_name=${KT_VM_OUT:-${scenario}}
case "${out_name}" in */* | .* | "") echo "run.sh: KT_VM_OUT is a folder name" >&2; exit 2 ;; esac
out=${workspace}/target/${out_name}
cache=${workspace}/target/vm-cache
bins=${workspace}/target/debug
images=${workspace}/target/kata-topo-images
accel_wanted=${KT_VM_ACCEL:-auto}
guest_timeout=${KT_VM_TIMEOUT:-480}
probe_timeout=${KT_VM_PROBE_TIMEOUT:-15}

# The guest kernel's modules the initramfs loads, in this order (with their dependencies first):
# the 9p shares, overlayfs for containerd's snapshotter, the NIC's own driver, vfio-pci, and
# virtio-net for a scenario that reaches the host (k8s-test's API server), bridge and veth for
# k8s-test's pod network (the CNI bridge plugin).
modules=(virtio_pci 9pnet_virtio 9p overlay e1000e vfio_iommu_type1 vfio-pci virtio_net bridge veth)

say() { printf '%s: %s\n' "${scenario}" "$*" >&2; }
die() { say "error: $*"; exit 2; }

# What a scenario's host.sh may set or define (vm-test's guest needs none of it).
scenario_memory_mib=1024
scenario_qemu_args=()
scenario_shares=()
scenario_not_covered=""
scenario_up() { :; }
scenario_down() { :; }
scenario_report() { echo '{}'; }
if [ -f "${here}/host.sh" ]; then
  # shellcheck source=/dev/null
  . "${here}/host.sh"
fi

# Scratch space (the initramfs, the unpacked package) inside the output directory: removed on
# exit, and by the next run should this one be killed outright.
tmp=${out}/work
qemu_pid=""
tail_pid=""

stop_qemu() {
  if [ -n "${qemu_pid}" ]; then
    # `timeout` passes TERM on to QEMU; QEMU also dies with its parent (pdeathsig).
    kill -TERM "${qemu_pid}" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "${qemu_pid}" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "${qemu_pid}" 2>/dev/null || true
    wait "${qemu_pid}" 2>/dev/null || true
    qemu_pid=""
  fi
  if [ -n "${tail_pid}" ]; then
    kill "${tail_pid}" 2>/dev/null || true
    wait "${tail_pid}" 2>/dev/null || true
    tail_pid=""
  fi
}

cleanup() {
  stop_qemu
  scenario_down
  rm -rf "${tmp}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rm -rf "${out}"
mkdir -p "${out}/guest" "${tmp}" "${cache}"

case "${workspace}" in *,*) die "QEMU's options cannot name a path with a comma: ${workspace}" ;; esac
case "${accel_wanted}" in auto | kvm | tcg) ;; *) die "KT_VM_ACCEL is auto, kvm or tcg" ;; esac
[[ "${guest_timeout}" =~ ^[1-9][0-9]*$ ]] || die "KT_VM_TIMEOUT is a number of seconds"
[[ "${probe_timeout}" =~ ^[1-9][0-9]*$ ]] || die "KT_VM_PROBE_TIMEOUT is a number of seconds"
for tool in qemu-system-x86_64 busybox apt-get dpkg-deb jq setpriv timeout gzip; do
  command -v "${tool}" > /dev/null || die "${tool} is missing (make deps installs it)"
done
for bin in containerd-shim-kata-topo-v2 kata-topo kata-topo-cri; do
  [ -x "${bins}/${bin}" ] || die "${bins}/${bin} is missing (make build-all builds it)"
done

# --- the guest kernel: Debian's package, cached ---------------------------------------------
kernel_package() {
  apt-cache depends linux-image-amd64 2>/dev/null \
    | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }'
}

package=$(kernel_package)
if [ -z "${package}" ]; then
  say "apt knows no linux-image-amd64; apt-get update"
  apt-get update -qq
  package=$(kernel_package)
fi
[ -n "${package}" ] || die "apt-cache cannot resolve linux-image-amd64"

deb=$(find "${cache}" -maxdepth 1 -name "${package}_*_amd64.deb" | sort | tail -n 1)
if [ -z "${deb}" ]; then
  say "downloading ${package}"
  download() { (cd "${tmp}" && apt-get download -q -o APT::Sandbox::User=root "${package}"); }
  if ! download > "${tmp}/apt.log" 2>&1; then
    say "apt-get download failed; apt-get update and again"
    apt-get update -qq
    download > "${tmp}/apt.log" 2>&1 || die "apt-get download ${package}: $(tail -n 3 "${tmp}/apt.log")"
  fi
  # One kernel in the cache: the one linux-image-amd64 names now.
  find "${cache}" -mindepth 1 -maxdepth 1 -name 'linux-image-*' -exec rm -rf {} +
  mv "${tmp}/${package}"_*_amd64.deb "${cache}/"
  deb=$(find "${cache}" -maxdepth 1 -name "${package}_*_amd64.deb" | sort | tail -n 1)
fi
package_version=$(dpkg-deb -f "${deb}" Version)

# The kernel image and the modules the initramfs needs, with their dependencies (from each
# module's own .modinfo), extracted once per package and module list.
kdir=${cache}/${package}
if [ "$(cat "${kdir}/modules.list" 2>/dev/null)" != "${modules[*]}" ]; then
  say "extracting ${package} ${package_version}"
  rm -rf "${kdir}"
  dpkg-deb -x "${deb}" "${tmp}/deb"
  vmlinuz=$(find "${tmp}/deb/boot" -name 'vmlinuz-*' | head -n 1)
  [ -n "${vmlinuz}" ] || die "no vmlinuz in ${deb}"
  release=${vmlinuz##*/vmlinuz-}
  tree=${tmp}/deb/lib/modules/${release}
  [ -d "${tree}" ] || die "no modules for ${release} in ${deb}"
  mkdir -p "${kdir}/modules"
  declare -A path_of=() loaded=()
  while IFS= read -r f; do
    name=${f##*/}
    name=${name%%.ko*}
    path_of[${name//-/_}]=${f}
  done < <(find "${tree}/kernel" -name '*.ko*')
  order=()
  add_module() { # NAME: its dependencies first, then itself
    local key=${1//-/_} file deps dep
    [ -z "${loaded[${key}]:-}" ] || return 0
    loaded[${key}]=1
    file=${path_of[${key}]:-}
    [ -n "${file}" ] || die "module $1 is not in ${package}"
    case "${file}" in
      *.ko.xz) xz -dc "${file}" > "${kdir}/modules/${key}.ko" ;;
      *.ko.zst) zstd -qdc "${file}" > "${kdir}/modules/${key}.ko" ;;
      *.ko) cp "${file}" "${kdir}/modules/${key}.ko" ;;
      *) die "unknown module format ${file}" ;;
    esac
    deps=$(tr '\0' '\n' < "${kdir}/modules/${key}.ko" | sed -n 's/^depends=//p' | head -n 1)
    for dep in ${deps//,/ }; do add_module "${dep}"; done
    order+=("${key}.ko")
  }
  for m in "${modules[@]}"; do add_module "${m}"; done
  printf '%s\n' "${order[@]}" > "${kdir}/modules/order"
  cp "${vmlinuz}" "${kdir}/vmlinuz"
  echo "${release}" > "${kdir}/release"
  echo "${package_version}" > "${kdir}/version"
  rm -rf "${tmp}/deb"
  echo "${modules[*]}" > "${kdir}/modules.list"
fi
release=$(cat "${kdir}/release")

# --- the initramfs ----------------------------------------------------------------------------
initramfs=${tmp}/initramfs
mkdir -p "${initramfs}/bin" "${initramfs}/proc" "${initramfs}/sys" "${initramfs}/dev"
busybox=$(command -v busybox)
cp "${busybox}" "${initramfs}/bin/busybox"
for applet in $("${busybox}" --list); do
  [ "${applet}" = busybox ] || ln -s busybox "${initramfs}/bin/${applet}"
done
cp -r "${kdir}/modules" "${initramfs}/modules"
install -m 0755 "${vm}/init" "${initramfs}/init"
(cd "${initramfs}" && find . | "${busybox}" cpio -o -H newc 2> /dev/null) | gzip -1 > "${tmp}/initrd.gz"

# --- the images the guest's containerd imports -----------------------------------------------
if [ ! -f "${images}/busybox.tar" ] || [ ! -f "${images}/pause.tar" ]; then
  bash "${workspace}/integration/images/build.sh" "${images}" > /dev/null
fi

# --- QEMU -------------------------------------------------------------------------------------
# The machine of vagrant/Vagrantfile at a smaller scale: two NUMA cells, a vIOMMU, the NIC on a
# PCIe expander bus on node 1; the host's /usr and /etc, the workspace and the results as 9p.
qemu_args() { # ACCEL SERIAL APPEND
  local accel=$1 serial=$2 append=$3
  local args=(
    -accel "${accel}" -machine "q35,kernel-irqchip=split" -cpu max -smp 2 -m "$((2 * scenario_memory_mib))M"
    -object "memory-backend-ram,id=m0,size=${scenario_memory_mib}M"
    -object "memory-backend-ram,id=m1,size=${scenario_memory_mib}M"
    -numa "node,nodeid=0,cpus=0,memdev=m0" -numa "node,nodeid=1,cpus=1,memdev=m1"
    -device "intel-iommu,intremap=on,caching-mode=on"
    -device "pxb-pcie,id=pxb1,bus_nr=0x80,numa_node=1,bus=pcie.0"
    -device "pcie-root-port,id=rp1,bus=pxb1,chassis=1"
    -netdev "user,id=n1,restrict=on" -device "e1000e,bus=rp1,netdev=n1"
    -kernel "${kdir}/vmlinuz" -initrd "${tmp}/initrd.gz" -append "${append}"
    -display none -nodefaults -no-user-config -serial "file:${serial}" -no-reboot
    "${scenario_qemu_args[@]}"
  )
  local tag path mode options share
  for share in usr:/usr:ro etc:/etc:ro "workspace:${workspace}:ro" "results:${out}/guest:rw" \
    "${scenario_shares[@]}"; do
    IFS=: read -r tag path mode <<< "${share}"
    options="local,id=fs_${tag},path=${path},security_model=none,multidevs=remap"
    if [ "${mode}" = ro ]; then options="${options},readonly=on"; fi
    args+=(-fsdev "${options}" -device "virtio-9p-pci,fsdev=fs_${tag},mount_tag=${tag},bus=pcie.0")
  done
  printf '%s\0' "${args[@]}"
}

run_qemu() { # ACCEL SECONDS SERIAL APPEND -> sets qemu_rc
  local args=()
  mapfile -d '' args < <(qemu_args "$1" "$3" "$4")
  [ "${#args[@]}" -gt 20 ] || die "building QEMU's command line failed"
  : > "$3"
  # `timeout` dies with this script and QEMU with `timeout`, even on SIGKILL (pdeathsig).
  setpriv --pdeathsig KILL timeout --kill-after=5 "$2" \
    setpriv --pdeathsig KILL qemu-system-x86_64 "${args[@]}" < /dev/null > "${tmp}/qemu.out" 2>&1 &
  qemu_pid=$!
}

wait_qemu() { # -> qemu_rc
  qemu_rc=0
  wait "${qemu_pid}" || qemu_rc=$?
  qemu_pid=""
}

# no_timer_check: on a loaded host an emulated guest's timer can miss the kernel's early check
# through the remapped IO-APIC, which then panics ("timer doesn't work through
# Interrupt-remapped IO-APIC"); Kata's own guests boot with it for the same reason.
cmdline="console=ttyS0 intel_iommu=on panic=-1 quiet no_timer_check kt_scenario=${scenario}"
for share in "${scenario_shares[@]}"; do
  IFS=: read -r tag _ <<< "${share}"
  cmdline="${cmdline} kt_share=${tag}"
done
accel=tcg
accel_detail="TCG (software emulation)"
if [ "${accel_wanted}" = tcg ]; then
  accel_detail="TCG: KT_VM_ACCEL=tcg"
elif [ ! -w /dev/kvm ]; then
  accel_detail="TCG: /dev/kvm is not usable here"
else
  say "probing KVM (${probe_timeout} s)"
  run_qemu kvm "${probe_timeout}" "${out}/probe-serial.log" "${cmdline} kt_probe"
  wait_qemu
  if grep -q 'vm-test-init: alive' "${out}/probe-serial.log"; then
    accel=kvm
    accel_detail="KVM: the probe guest booted"
  elif [ "${qemu_rc}" = 124 ] || [ "${qemu_rc}" = 137 ]; then
    accel_detail="TCG: under KVM the guest kernel showed no sign of life in ${probe_timeout} s"
  else
    accel_detail="TCG: QEMU with KVM exited ${qemu_rc}: $(head -c 300 "${tmp}/qemu.out" | tr '\n' ' ')"
  fi
fi
[ "${accel}" = kvm ] || [ "${accel_wanted}" != kvm ] || die "KT_VM_ACCEL=kvm: ${accel_detail}"
say "guest ${release} (${package} ${package_version}), ${accel_detail}"
scenario_up

if declare -F scenario_run > /dev/null; then
  # scenario_run ACCEL SECONDS SERIAL APPEND: the machine is `qemu_args ACCEL SERIAL APPEND`;
  # it returns what QEMU's `timeout` would (124 when SECONDS ran out).
  qemu_rc=0
  scenario_run "${accel}" "${guest_timeout}" "${out}/serial.log" "${cmdline}" || qemu_rc=$?
else
  run_qemu "${accel}" "${guest_timeout}" "${out}/serial.log" "${cmdline}"
  # The guest's progress lines, live; tail ends with QEMU's `timeout`.
  tail --pid="${qemu_pid}" -n +1 -F "${out}/serial.log" 2> /dev/null \
    | sed -u -n 's/\r$//; /^\(vm-test-init\|guest\):/p' >&2 &
  tail_pid=$!
  wait_qemu
  sleep 0.3
  stop_qemu
fi
case "${qemu_rc}" in
  0) guest_end="powered off" ;;
  124 | 137) guest_end="was killed after the ${guest_timeout} s timeout" ;;
  *) guest_end="ended with QEMU exit ${qemu_rc}: $(head -c 300 "${tmp}/qemu.out" | tr '\n' ' ')" ;;
esac
init_failure=$(sed -n 's/\r$//; s/^vm-test-init: FAILED: //p' "${out}/serial.log" | tail -n 1)
[ -z "${init_failure}" ] || guest_end="${guest_end} after its initramfs failed: ${init_failure}"
if [ ! -f "${out}/guest/finished" ]; then
  say "the guest did not finish: ${guest_end}; last console lines:"
  tail -n 15 "${out}/serial.log" >&2
fi

# What the scenario's host side does once the guest has ended (k8s-test: stops its second node
# and records what it left).
if declare -F scenario_finish > /dev/null; then scenario_finish || true; fi

# --- the report -------------------------------------------------------------------------------
# Every step runs the same under TCG and KVM. What this guest cannot show under either: no VM
# runs inside it (neither TCG nor this kind of host gives it nested virtualisation).
not_covered="${scenario_not_covered:-Kata itself: the delegate is runc, so the VM view and its rules (vcpu-*, guest-numa-uncovered) are not exercised here (integration/tests/vm.rs covers them against a real QEMU); the Kubernetes side (kubectl, the RuntimeClass, a resize through the resize subresource) runs with the real kubelet in make k8s-test; the node condition and node-exporter over HTTP run only in the Vagrant VM}"
# Every step the guest defines; one it never reported failed with the reason.
mapfile -t names < <(bash "${here}/guest.sh" --list-steps)
steps=${out}/guest/steps.jsonl
touch "${steps}"
for name in "${names[@]}"; do
  if ! jq -e -s --arg n "${name}" 'any(.[]; .name == $n)' "${steps}" > /dev/null 2>&1; then
    jq -cn --arg n "${name}" --arg d "not reached: the guest ${guest_end}" \
      '{name: $n, pass: false, rules: [], detail: $d}' >> "${steps}"
  fi
done
json_or_null() { if jq -e . "$1" > /dev/null 2>&1; then cat "$1"; else echo null; fi; }
json_or_null "${out}/guest/topology.json" > "${tmp}/topology.json"
json_or_null "${out}/guest/vfio.json" > "${tmp}/vfio.json"
scenario_report > "${tmp}/scenario.json" 2> /dev/null || echo '{}' > "${tmp}/scenario.json"
jq -e 'type == "object"' "${tmp}/scenario.json" > /dev/null 2>&1 || echo '{}' > "${tmp}/scenario.json"
jq -n \
  --arg accel "${accel}" --arg accel_detail "${accel_detail}" \
  --arg kernel "$(cat "${out}/guest/kernel.txt" 2> /dev/null || echo "${release}")" \
  --arg package "${package} ${package_version}" --arg guest_end "${guest_end}" \
  --slurpfile topology "${tmp}/topology.json" --slurpfile vfio "${tmp}/vfio.json" \
  --slurpfile steps "${steps}" --slurpfile extra "${tmp}/scenario.json" --argjson names "$(printf '%s\n' "${names[@]}" | jq -R . | jq -s .)" \
  --argjson seconds "$(($(date +%s) - started))" \
  --arg not_covered "${not_covered}" \
  '{accel: $accel, accel_detail: $accel_detail, guest_kernel: $kernel, kernel_package: $package,
    guest: $guest_end, topology: $topology[0], vfio_device: $vfio[0],
    steps: [$names[] as $n | first($steps[] | select(.name == $n))],
    not_covered: $not_covered, seconds: $seconds} + $extra[0]
   | .passed = ([.steps[] | select(.pass == true)] | length) | .total = (.steps | length)' \
  > "${out}/report.json"

for name in "${names[@]}"; do
  jq -r --arg n "${name}" 'select(.name == $n) | "\(if .pass then "pass" else "FAIL" end) \(.name) [\(.rules | join(","))]\(if .seconds then " \(.seconds) s" else "" end): \(.detail)"' "${steps}" | head -n 1 >&2
done
passed=$(jq .passed "${out}/report.json")
total=$(jq .total "${out}/report.json")
say "report ${out}/report.json (${accel}, $(jq .seconds "${out}/report.json") s)"
echo "${scenario}: ${passed}/${total} steps pass"
[ "${passed}" = "${total}" ] && [ "${total}" -gt 0 ]
