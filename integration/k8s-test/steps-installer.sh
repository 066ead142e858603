#!/usr/bin/env bash
# The installer's steps of the k8s-test guest (sourced by guest.sh; run after its own steps,
# before cleanup): deploy/installer/ applied with kubectl -k, its DaemonSet's pod installing
# kata-topo on this node, a pod through the installed wrapper, an upgrade to a second image
# while that pod runs, that pod's container restarted and resized after the upgrade, and the
# removal restoring the node's files.
#
# Independent of guest.sh's steps: the installer's handler and RuntimeClass are named
# kata-topo-installed (the hand-installed handler and RuntimeClass kata-topo stay untouched),
# the node label kata-topo.io/installed the guest set is taken off first and put back at the
# end, and the guest's device plugin is stopped while the installer's runs, then started again.
#
# The cluster's controllers do the rest, as on any cluster: the DaemonSet controller creates the
# pod on this node and replaces it on an upgrade (its rolling update), the garbage collector
# deletes a deleted DaemonSet's pods, and the ServiceAccount admission plugin gives the pod its
# API token (with kube-root-ca.crt, which the controllers publish). The
# overlay points the installer at the guest's paths: containerd's configuration and the
# directory it imports under /run (the guest's /etc is the host's, read-only), its supervisor's
# restart command, and the API server's forwarded address. The delegate here is runc, whose shim
# refuses Kata's runtime options: the handler passes no ConfigPath, and the installed wrapper
# reads the configuration containerd's environment names (KATA_TOPO_CONFIG, the guest's).
# shellcheck disable=SC2154,SC2034 # installer_steps is guest.sh's to use; run, results, ws, node, sock, bin, state, k8s, plugin_pid are guest.sh's
set -euo pipefail

installer_steps=(installer-install installer-pod installer-upgrade installer-restart-resize installer-removal)

inst_handler=kata-topo-installed
inst_dir="" # ${run}/installer, set when the steps run (guest-lib.sh sets run after this file)
inst_versions=()
inst_their_label=""
inst_done=""

# The node's files the installer may touch, one a line: path, type, and a digest of a regular
# file's content. The device plugins' directory by name only: the kubelet rewrites its own
# checkpoint there whenever a plugin registers.
inst_node_files() {
  local p
  for p in /opt/kata-topo "${run}/containerd.d" "${run}/containerd.toml" "${run}/npd" "${run}/bin"; do
    [ -e "${p}" ] || [ -L "${p}" ] || continue
    find "${p}" -printf '%p %y %m %l\n' | sort | while read -r path type mode link; do
      if [ "${type}" = f ]; then
        echo "${path} f ${mode} $(sha256sum < "${path}" | cut -c 1-16)"
      else
        echo "${path} ${type} ${mode} ${link}"
      fi
    done
  done
  find /var/lib/kubelet/device-plugins -mindepth 1 -printf '%p %y\n' 2> /dev/null | sort
}

# deploy/installer/ as an operator releases it (a copy with the image's tag set), and the
# overlay this node needs, in ${inst_dir}.
inst_overlay() { # VERSION
  local d
  rm -rf "${inst_dir}"
  mkdir -p "${inst_dir}/deploy"
  for d in installer device-plugin kubernetes; do cp -r "${ws}/deploy/${d}" "${inst_dir}/deploy/"; done
  sed -i "s/^    newTag: .*/    newTag: \"$1\"/" "${inst_dir}/deploy/installer/kustomization.yaml"
  cat > "${inst_dir}/configuration-kata-topo.toml" << EOF
[topology_guard]
delegate_shim = "containerd-shim-runc-v2"
mode = "audit"
default_policy = "restricted"
sysfs_root = "/sys"
state_dir = "${state}"
log_file = "${log}"
metrics_dir = "${metrics}"
topology_refresh_seconds = 5
kubelet_timeout_ms = 2000
EOF
  cat > "${inst_dir}/kustomization.yaml" << EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - deploy/installer
configMapGenerator:
  - name: kata-topo-installer-config
    namespace: kube-system
    files: [configuration-kata-topo.toml]
    options: {disableNameSuffixHash: true}
patches:
  - target: {kind: RuntimeClass, name: kata-topo}
    patch: |
      - {op: replace, path: /metadata/name, value: ${inst_handler}}
      - {op: replace, path: /handler, value: ${inst_handler}}
      - {op: remove, path: /overhead}
  - target: {kind: DaemonSet, name: kata-topo-installer}
    patch: |
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: kata-topo-installer}
      spec:
        template:
          spec:
            terminationGracePeriodSeconds: 120
            containers:
              - name: installer
                env:
                  - {name: KATA_TOPO_HANDLER, value: ${inst_handler}}
                  - {name: KATA_TOPO_CONTAINERD_CONFIG, value: ${run}/containerd.toml}
                  - {name: KATA_TOPO_SHIM_LINK_DIR, value: ${run}/bin}
                  - {name: KATA_TOPO_NPD_DIR, value: ${run}/npd/kata-topo}
                  - {name: KATA_TOPO_RESTART_CONTAINERD, value: ${run}/restart-containerd}
                  - {name: KATA_TOPO_CONFIG_PATH_OPTION, value: "false"}
                  - {name: KUBERNETES_SERVICE_HOST, value: 10.0.2.100}
                  - {name: KUBERNETES_SERVICE_PORT, value: "6443"}
EOF
}

# The pod the DaemonSet controller runs on this node for DAEMONSET, once it is there and not
# being deleted; not PREVIOUS (the one an update replaces). Prints its name.
inst_ds_pod_now() { # DAEMONSET [PREVIOUS]
  local name
  name=$(k -n kube-system get pods -o json | jq -r --arg ds "$1" --arg node "${node}" --arg old "${2:-}" \
    '[.items[] | select(.metadata.deletionTimestamp == null and .spec.nodeName == $node
        and .metadata.name != $old
        and any(.metadata.ownerReferences[]?; .kind == "DaemonSet" and .name == $ds and .controller))
      | .metadata.name] | first // empty')
  [ -n "${name}" ] && echo "${name}"
}
inst_ds_pod() { # DAEMONSET [PREVIOUS]: waits up to 300 s for it
  local _
  for _ in $(seq 1 300); do
    inst_ds_pod_now "$@" && return 0
    sleep 1
  done
  return 1
}

inst_pod_ready() { [ "$(k -n kube-system get pod "$1" -o jsonpath='{.status.containerStatuses[0].ready}')" = true ]; }
inst_pod_running() { [ "$(k -n kube-system get pod "$1" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}')" != "" ]; }
inst_label() { k get node "${node}" -o jsonpath='{.metadata.labels.kata-topo\.io/installed}'; }
# The installer labels kata-topo.io/installed=true (what the selectors use) and puts the version
# in kata-topo.io/installed-version.
inst_version() { k get node "${node}" -o jsonpath='{.metadata.labels.kata-topo\.io/installed-version}'; }
inst_label_is() { [ "$(inst_label)" = true ] && [ "$(inst_version)" = "$1" ]; }
inst_image_of() { # FILE: the version the installer's image stamped into the binary
  readelf -p .kata_topo_image "$1" 2> /dev/null | sed -n 's/^ *\[ *0\] *//p' | head -n 1
}
inst_app_gone() { ! k get pods -o name | grep -q '^pod/kti-app'; }
inst_gone() { ! k -n kube-system get pod "$1" > /dev/null 2>&1; }
# Waits for kube-system's pods to be gone (the preStop hook may restart containerd) up to 300 s.
inst_wait_gone() { # POD...
  local p
  for p in "$@"; do poll 300 inst_gone "${p}" || true; done
}
# The installer container's log lines, from the node's log directory.
inst_log() { # POD
  cat /var/log/pods/kube-system_"$1"_*/installer/*.log 2> /dev/null | sed 's/^[^ ]* [^ ]* [^ ]* //'
}

# Keeps POD's installer log in the results while it runs and terminates (the kubelet removes a
# deleted pod's log directory): ${results}/POD.log.
inst_follow_pids=()
inst_follow_log() { # POD
  local f
  f=$(find /var/log/pods -path "*/kube-system_$1_*/installer/*.log" 2> /dev/null | head -n 1)
  [ -n "${f}" ] || return 0
  tail -n +1 -F "${f}" > "${results}/$1.log" 2> /dev/null &
  inst_follow_pids+=($!)
}
inst_followed() { # POD: its kept log, without the CRI prefix
  sed 's/^[^ ]* [^ ]* [^ ]* //' "${results}/$1.log" 2> /dev/null
}

# A pod through the installed handler: host network, the shared pool, a small memory limit.
inst_app_pod() { # NAME
  k apply -f - > /dev/null << EOF
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  nodeSelector: {kubernetes.io/hostname: ${node}}
  runtimeClassName: ${inst_handler}
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
    - name: app
      image: localhost/kata-topo/busybox:1
      imagePullPolicy: Never
      command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
      resources:
        requests: {cpu: "0", memory: 32Mi}
        limits: {cpu: 100m, memory: 64Mi}
EOF
}

# The wrapper daemon serving pod NAME's sandbox: the process whose command line names the
# sandbox, whose executable is a containerd-shim-kata-topo-v2.
inst_daemon_of() { # NAME -> PID
  local cid sandbox p args
  cid=$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
  cid=${cid#containerd://}
  [ -n "${cid}" ] || return 1
  sandbox=$(ctr -a "${sock}" -n k8s.io containers info --spec "${cid}" 2> /dev/null \
    | jq -r '.annotations["io.kubernetes.cri.sandbox-id"] // empty')
  [ -n "${sandbox}" ] || return 1
  for p in /proc/[0-9]*; do
    case "$(readlink "${p}/exe" 2> /dev/null)" in *containerd-shim-kata-topo-v2*) ;; *) continue ;; esac
    args=$(tr '\0' ' ' < "${p}/cmdline" 2> /dev/null) || continue
    case " ${args} " in *" ${sandbox} "*) echo "${p##*/}"; return 0 ;; esac
  done
  return 1
}

inst_current=""
inst_plugin=""
step_installer_install() {
  local v1 t0 t1 import_s pid_before pid_after dropin major detail label
  mapfile -t inst_versions < "${results}/k8s/installer-versions"
  v1=${inst_versions[0]}
  # The guest's own label goes while the installer's steps run (put back at the end).
  inst_their_label=$(inst_label)
  k label node "${node}" kata-topo.io/installed- > /dev/null
  inst_node_files > "${results}/installer-files-before.txt"
  t0=$(date +%s)
  for v in "${inst_versions[@]}"; do
    ctr -a "${sock}" -n k8s.io images import "${ws}/target/kata-topo-images/installer-${v}.tar" > /dev/null \
      || { record installer-install false "" "ctr images import installer-${v}.tar failed"; return 1; }
  done
  import_s=$(($(date +%s) - t0))
  inst_overlay "${v1}"
  k_kustomize kustomize "${inst_dir}" > "${results}/installer-${v1}.yaml"
  k_kustomize apply -k "${inst_dir}" > "${run}/apply" 2>&1 \
    || { record installer-install false "" "kubectl apply -k failed: $(tail -n 3 "${run}/apply")"; return 1; }
  # The guest's device plugin makes way for the DaemonSet's.
  if [ -n "${plugin_pid}" ]; then
    kill -TERM "${plugin_pid}" 2> /dev/null || true
    wait "${plugin_pid}" 2> /dev/null || true
    plugin_pid=""
  fi
  pid_before=$(cat "${run}/containerd.pid")
  t0=$(date +%s)
  inst_current=$(inst_ds_pod kata-topo-installer) \
    || { record installer-install false "" "the DaemonSet controller created no installer pod on ${node}: $(k -n kube-system get daemonset kata-topo-installer -o jsonpath='{.status}')"; return 1; }
  poll 300 inst_label_is "${v1}" || true
  poll 120 inst_pod_ready "${inst_current}" || true
  t1=$(date +%s)
  # The device plugin's DaemonSet selects the label: its pod comes once the node has it.
  inst_plugin=$(inst_ds_pod kata-topo-device-plugin) \
    || { record installer-install false "" "the DaemonSet controller created no device plugin pod on ${node}"; return 1; }
  poll 120 inst_pod_running "${inst_plugin}" || true
  poll 120 node_field_is '{.status.allocatable.kata-topo\.io/vfio}' 1 || true
  pid_after=$(cat "${run}/containerd.pid")
  label=$(inst_version)
  dropin=${run}/containerd.d/${inst_handler}.toml
  major=$(containerd --version | awk '{print $3}' | sed 's/^v//; s/\..*//')
  local want_version=2
  [ "${major}" -ge 2 ] && want_version=3
  detail="images imported in ${import_s} s; installer pod ${inst_current} ready $(inst_pod_ready "${inst_current}" && echo yes || echo no) after $((t1 - t0)) s; node labels kata-topo.io/installed=$(inst_label), kata-topo.io/installed-version=${label}; /opt/kata-topo/bin: $(find /opt/kata-topo/bin -type f -printf '%f ' 2> /dev/null); shim stamped $(inst_image_of /opt/kata-topo/bin/containerd-shim-kata-topo-v2); drop-in $(grep -m1 '^version' "${dropin}" 2> /dev/null) for containerd ${major}.x; containerd ${pid_before} -> ${pid_after} (restarted); device plugin pod ${inst_plugin}: kata-topo.io/vfio $(k get node "${node}" -o jsonpath='{.status.allocatable.kata-topo\.io/vfio}'); installer log: $(inst_log "${inst_current}" | tail -n 2 | paste -sd '|' -)"
  if [ "${label}" = "${v1}" ] && inst_pod_ready "${inst_current}" \
    && [ "$(inst_image_of /opt/kata-topo/bin/containerd-shim-kata-topo-v2)" = "${v1}" ] \
    && grep -qx "version = ${want_version}" "${dropin}" && [ "${pid_before}" != "${pid_after}" ] \
    && inst_pod_running "${inst_plugin}" && node_field_is '{.status.allocatable.kata-topo\.io/vfio}' 1; then
    record installer-install true "" "$(cut -c 1-1200 <<< "${detail}")"
  else
    record installer-install false "" "expected the label, the binaries, a version ${want_version} drop-in, containerd restarted and the device plugin serving: $(cut -c 1-1200 <<< "${detail}")"
  fi
}

inst_daemon=""
inst_daemon_inode=""
step_installer_pod() {
  local v exe
  inst_app_pod kti-app || true
  if ! poll 180 ready kti-app; then
    record installer-pod false "" "kti-app not ready: $(k get pod kti-app -o jsonpath='{.status}' | cut -c 1-600)"
    return 1
  fi
  poll 30 inst_daemon_of kti-app || true
  inst_daemon=$(inst_daemon_of kti-app || true)
  exe=$(readlink "/proc/${inst_daemon:-0}/exe" 2> /dev/null || true)
  inst_daemon_inode=$(stat -L -c %i "/proc/${inst_daemon:-0}/exe" 2> /dev/null || true)
  # The wrapper checked the container: its state keeps the latest verdict of each task (the
  # create's, or the CPU manager's cpuset push that follows it at once).
  poll 30 has_verdict kti-app '.operation == "create" or .operation == "update"' || true
  v=$(verdict_of kti-app)
  local detail
  detail="kubectl: kti-app (runtimeClassName ${inst_handler}) ready; its wrapper daemon ${inst_daemon:-none} runs ${exe:-?} (inode ${inst_daemon_inode:-?}); the wrapper's latest verdict for it: $(jq -c '{operation, decision, findings: [.findings[].rule]}' <<< "${v:-null}")"
  if [ "${exe}" = /opt/kata-topo/bin/containerd-shim-kata-topo-v2 ] && [ -n "${v}" ] \
    && jq -e '.operation == "create" or .operation == "update"' <<< "${v}" > /dev/null; then
    record installer-pod true "" "${detail}"
  else
    record installer-pod false "" "expected kti-app's sandbox served by the installed wrapper, with its verdict in the wrapper's state: ${detail}"
  fi
}

step_installer_upgrade() {
  local v2=${inst_versions[1]:-} old_pod old_plugin pid_before pid_after inode_before inode_after daemon_exe new_daemon new_exe detail kept
  [ -n "${v2}" ] || { record installer-upgrade false "" "no second installer image"; return 1; }
  inode_before=$(stat -c %i /opt/kata-topo/bin/containerd-shim-kata-topo-v2 2> /dev/null || echo none)
  pid_before=$(cat "${run}/containerd.pid")
  inst_overlay "${v2}"
  k_kustomize apply -k "${inst_dir}" > "${run}/apply" 2>&1 \
    || { record installer-upgrade false "" "kubectl apply -k (${v2}) failed: $(tail -n 3 "${run}/apply")"; return 1; }
  # The rolling update, the DaemonSet controller's: each old pod deleted (the installer's preStop
  # sees its DaemonSet stay), a new one from the new template.
  old_pod=${inst_current}
  old_plugin=${inst_plugin}
  inst_follow_log "${old_pod}"
  inst_wait_gone "${old_pod}"
  # Once the old pod is gone the node still holds the old version (the hook saw the DaemonSet
  # stay): read before the replacement installs (it may already have started).
  kept="label $(inst_version), /opt/kata-topo/share/VERSION $(cat /opt/kata-topo/share/VERSION 2> /dev/null || echo gone), handler $([ -f "${run}/containerd.d/${inst_handler}.toml" ] && echo kept || echo gone)"
  inst_current=$(inst_ds_pod kata-topo-installer "${old_pod}") || true
  poll 300 inst_label_is "${v2}" || true
  poll 120 inst_pod_ready "${inst_current}" || true
  inst_wait_gone "${old_plugin}"
  inst_plugin=$(inst_ds_pod kata-topo-device-plugin "${old_plugin}") || true
  poll 120 inst_pod_running "${inst_plugin}" || true
  inode_after=$(stat -c %i /opt/kata-topo/bin/containerd-shim-kata-topo-v2 2> /dev/null || echo none)
  pid_after=$(cat "${run}/containerd.pid")
  daemon_exe=$(readlink "/proc/${inst_daemon:-0}/exe" 2> /dev/null || echo gone)
  # A pod started now gets the new binary.
  inst_app_pod kti-app2 || true
  poll 180 ready kti-app2 || true
  poll 30 inst_daemon_of kti-app2 || true
  new_daemon=$(inst_daemon_of kti-app2 || true)
  new_exe=$(stat -L -c %i "/proc/${new_daemon:-0}/exe" 2> /dev/null || echo none)
  detail="label $(inst_label) $(inst_version); shim inode ${inode_before} -> ${inode_after}, stamped $(inst_image_of /opt/kata-topo/bin/containerd-shim-kata-topo-v2); containerd ${pid_before} -> ${pid_after}; kti-app $(ready kti-app && echo ready || echo 'not ready'), its daemon ${inst_daemon:-none}: ${daemon_exe} (inode $(stat -L -c %i "/proc/${inst_daemon:-0}/exe" 2> /dev/null || echo gone)); kti-app2's daemon ${new_daemon:-none} on inode ${new_exe}; after the old pods went: ${kept}; the old pod's hook: $(inst_followed "${old_pod}" | grep -m1 'daemonset' || echo none)"
  if inst_label_is "${v2}" && [ "${inode_after}" != "${inode_before}" ] \
    && [ "$(inst_image_of /opt/kata-topo/bin/containerd-shim-kata-topo-v2)" = "${v2}" ] \
    && [ "${pid_before}" = "${pid_after}" ] && ready kti-app \
    && [ "$(stat -L -c %i "/proc/${inst_daemon:-0}/exe" 2> /dev/null)" = "${inst_daemon_inode}" ] \
    && [ "${new_exe}" = "${inode_after}" ] \
    && grep -q ", handler kept" <<< "${kept}" && ! grep -q gone <<< "${kept}" \
    && inst_followed "${old_pod}" | grep -q 'stays'; then
    record installer-upgrade true "" "$(cut -c 1-1200 <<< "${detail}")"
  else
    record installer-upgrade false "" "expected the new binaries in place without a containerd restart, kti-app on its old daemon and kti-app2 on the new binary: $(cut -c 1-1200 <<< "${detail}")"
  fi
}

# The sandbox of pod NAME (its container's CRI annotation).
inst_sandbox_of() { # NAME
  local cid
  cid=$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
  cid=${cid#containerd://}
  [ -n "${cid}" ] || return 1
  ctr -a "${sock}" -n k8s.io containers info --spec "${cid}" 2> /dev/null \
    | jq -r '.annotations["io.kubernetes.cri.sandbox-id"] // empty'
}
# The allowed checks of OPERATION the wrapper counted in the metrics FILE of a sandbox, and
# the findings it counted there (every rule, operation and decision).
inst_checks() { # FILE OPERATION
  sed -n "s/^kata_topo_checks_total{.*operation=\"$2\",decision=\"allow\"} //p" "$1" 2> /dev/null | head -n 1 | grep . || echo 0
}
inst_findings() { # FILE
  awk '/^kata_topo_findings_total/ { n += $NF } END { print n + 0 }' "$1" 2> /dev/null || echo 0
}
inst_checks_above() { [ "$(inst_checks "$1" "$2")" -gt "$3" ]; }

# After the upgrade, kti-app (still on the old wrapper daemon) has its container killed and then
# its memory limit raised: the kubelet recreates the container in the running sandbox and
# resizes it, and the wrapper checks both against what the pod was admitted with — the node
# selector its RuntimeClass gave it before the upgrade, which the node still matches. Both
# checks clean: the upgrade left nothing for the checks to trip over.
step_installer_restart_resize() {
  local sb prom sel id mark rec0 rec1 upd0 upd1 f0 f1 restarts applied rules daemon_exe detail
  sb=$(inst_sandbox_of kti-app || true)
  [ -n "${sb}" ] || { record installer-restart-resize false "" "kti-app has no sandbox: $(k get pod kti-app -o jsonpath='{.status}' | cut -c 1-400)"; return 1; }
  prom=${metrics}/kata-topo-k8s.io-${sb}.prom
  sel=$(k get pod kti-app -o jsonpath='{.spec.nodeSelector}')
  rec0=$(inst_checks "${prom}" recreate)
  f0=$(inst_findings "${prom}")
  mark=$(log_mark)
  id=$(k get pod kti-app -o jsonpath='{.status.containerStatuses[0].containerID}')
  ctr -a "${sock}" -n k8s.io tasks kill -s KILL "${id#containerd://}" > /dev/null 2>&1 \
    || { record installer-restart-resize false "" "cannot kill kti-app's container ${id}"; return 1; }
  poll 120 pod_field_is_at_least kti-app '{.status.containerStatuses[0].restartCount}' 1 || true
  poll 120 ready kti-app || true
  poll 60 inst_checks_above "${prom}" recreate "${rec0}" || true
  rec1=$(inst_checks "${prom}" recreate)
  restarts=$(k get pod kti-app -o jsonpath='{.status.containerStatuses[0].restartCount}')
  # The CPU manager's push after the recreate counts as an update too: counted from here.
  sleep 3
  upd0=$(inst_checks "${prom}" update)
  resize_memory kti-app 96 > /dev/null 2>&1 || true
  poll 120 pod_field_is kti-app '{.status.containerStatuses[0].resources.limits.memory}' 96Mi || true
  poll 60 inst_checks_above "${prom}" update "${upd0}" || true
  upd1=$(inst_checks "${prom}" update)
  applied=$(k get pod kti-app -o jsonpath='{.status.containerStatuses[0].resources.limits.memory}')
  f1=$(inst_findings "${prom}")
  rules=$(rules_since "${mark}" '.pod_name == "kti-app"')
  daemon_exe=$(readlink "/proc/${inst_daemon:-0}/exe" 2> /dev/null || echo gone)
  detail="kti-app nodeSelector ${sel}; node label kata-topo.io/installed=$(inst_label); container killed: restartCount ${restarts:-?}, ready $(ready kti-app && echo yes || echo no); resized to 96Mi: in force ${applied:-?}; its wrapper daemon ${inst_daemon:-none}: ${daemon_exe}; checks counted in ${prom##*/}: recreate ${rec0} -> ${rec1}, update ${upd0} -> ${upd1} (allowed), findings ${f0} -> ${f1}; findings logged: [${rules}]"
  if grep -q '"kata-topo.io/installed":"true"' <<< "${sel}" && [ "${restarts:-0}" -ge 1 ] && ready kti-app \
    && [ "${rec1}" -gt "${rec0}" ] && [ "${upd1}" -gt "${upd0}" ] && [ "${applied}" = 96Mi ] \
    && [ "${f1}" = "${f0}" ] && [ -z "${rules}" ] && [ "${daemon_exe}" != gone ]; then
    record installer-restart-resize true "" "$(cut -c 1-1200 <<< "${detail}")"
  else
    record installer-restart-resize false "${rules}" "expected kti-app's recreate and resize checked by its wrapper after the upgrade, and clean: $(cut -c 1-1200 <<< "${detail}")"
  fi
}

step_installer_removal() {
  local pid_before pid_after detail diff_out rc=0
  k delete pod kti-app kti-app2 --wait=false > /dev/null 2>&1 || true
  # Gone before the binaries go: containerd runs the wrapper's binary to clean up after a pod.
  poll 120 inst_app_gone || true
  pid_before=$(cat "${run}/containerd.pid")
  # The DaemonSets deleted; the garbage collector deletes their pods: the installer's preStop
  # finds its DaemonSet gone and restores the node.
  inst_follow_log "${inst_current}"
  k -n kube-system delete daemonset kata-topo-installer kata-topo-device-plugin > /dev/null 2>&1 || true
  inst_wait_gone "${inst_current}" "${inst_plugin}"
  # The guest's device plugin back (its socket is one of the node's files compared).
  inst_restore_plugin
  poll 60 test -S "${kubelet_root}/device-plugins/kata-topo-vfio.sock" || true
  k_kustomize delete -k "${inst_dir}" --ignore-not-found > /dev/null 2>&1 || true
  pid_after=$(cat "${run}/containerd.pid")
  inst_node_files > "${results}/installer-files-after.txt"
  diff_out=$(diff "${results}/installer-files-before.txt" "${results}/installer-files-after.txt") || rc=$?
  local label
  label=$(inst_label)
  detail="kubectl delete daemonset, then its pods; the hook: $(inst_followed "${inst_current}" | grep -E 'uninstall|removed' | paste -sd '|' -); containerd ${pid_before} -> ${pid_after}; label kata-topo.io/installed=${label:-<none>}; node files (installer-files-before.txt vs -after.txt): "
  if [ "${rc}" = 0 ]; then
    detail="${detail}the same, $(wc -l < "${results}/installer-files-after.txt") entries"
  else
    detail="${detail}$(paste -sd ' ' - <<< "${diff_out}" | cut -c 1-600)"
  fi
  if [ "${rc}" = 0 ] && [ -z "${label}" ] && [ "${pid_before}" != "${pid_after}" ] && [ ! -e /opt/kata-topo ] \
    && inst_followed "${inst_current}" | grep -q "removed kata-topo's files from node"; then
    record installer-removal true "" "$(cut -c 1-1200 <<< "${detail}")"
  else
    record installer-removal false "" "expected the node's files as before the install, the label gone, containerd restarted: $(cut -c 1-1200 <<< "${detail}")"
  fi
}

# The guest's label and device plugin, as before these steps.
inst_restore() {
  [ -z "${inst_done}" ] || return 0
  inst_done=1
  if [ -n "${inst_their_label}" ]; then
    k label node "${node}" "kata-topo.io/installed=${inst_their_label}" --overwrite > /dev/null || true
  fi
  inst_restore_plugin
}
inst_restore_plugin() {
  if [ -z "${plugin_pid}" ]; then
    "${bin}/kata-topo-device-plugin" --device-plugin-dir "${kubelet_root}/device-plugins" \
      < /dev/null >> "${results}/device-plugin.log" 2>&1 &
    plugin_pid=$!
  fi
}
