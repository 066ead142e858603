#!/usr/bin/env bash
# The installer's steps of the k8s-test guest (sourced by guest.sh; run after its own steps,
# before cleanup), on both nodes: deploy/installer/ applied with kubectl -k, its DaemonSet's
# pods installing kata-topo on node A (this guest) and node B (node-b.sh, on the host), a pod
# through the installed wrapper on each, an upgrade to a second image rolled node by node while
# those pods run, their containers recreated and resized after the upgrade, and the removal
# restoring both nodes' files. What the guest cannot see of node B (its files, its containerd,
# its wrapper's processes) node B answers from inside its namespaces (node_b_ask).
#
# Independent of guest.sh's steps: the installer's handler and RuntimeClass are named
# kata-topo-installed (the hand-installed handler and RuntimeClass kata-topo stay untouched),
# the node label kata-topo.io/installed the guest (and the node-b step) set is taken off first
# and put back at the end, and the guest's device plugin is stopped while the installer's runs,
# then started again.
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
declare -A inst_their_label=() inst_current=() inst_plugin=() inst_daemon=()
inst_done=""

# The node's files the installer may touch (node-files.sh: the same listing on node B).
inst_node_files() { bash "${ws}/integration/k8s-test/node-files.sh" "${run}"; }

inst_nodes=() # node A, node B (set when the steps run: node_b is steps-seed.sh's)
inst_on_b() { [ "$1" = "${node_b}" ]; }
# What NODE's files and processes say: node A answers here, node B from inside its namespaces.
inst_ask() { # NODE files|containerd|stamp|dropin
  if inst_on_b "$1"; then
    node_b_ask "$2"
    return
  fi
  case "$2" in
    files) inst_node_files ;;
    containerd) cat "${run}/containerd.pid" ;;
    stamp) inst_image_of /opt/kata-topo/bin/containerd-shim-kata-topo-v2 ;;
    dropin) cat "${run}"/containerd.d/*.toml 2> /dev/null | grep -m1 '^version' ;;
  esac
}
# The configuration version the installer writes for NODE's containerd: 3 for 2.x, 2 for 1.x.
inst_want_dropin() { # NODE
  local f=${results}/containerd.version major
  inst_on_b "$1" && f=${node_b_share}/containerd.version
  major=$(awk '{print $3}' "${f}" 2> /dev/null | sed 's/^v//; s/\..*//')
  if [ "${major:-1}" -ge 2 ]; then echo "version = 3"; else echo "version = 2"; fi
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

# The pod the DaemonSet controller runs on NODE for DAEMONSET, once it is there and not being
# deleted; not PREVIOUS (the one an update replaces). Prints its name.
inst_ds_pod_now() { # NODE DAEMONSET [PREVIOUS]
  local name
  name=$(k -n kube-system get pods -o json | jq -r --arg node "$1" --arg ds "$2" --arg old "${3:-}" \
    '[.items[] | select(.metadata.deletionTimestamp == null and .spec.nodeName == $node
        and .metadata.name != $old
        and any(.metadata.ownerReferences[]?; .kind == "DaemonSet" and .name == $ds and .controller))
      | .metadata.name] | first // empty')
  [ -n "${name}" ] && echo "${name}"
}
inst_ds_pod() { # NODE DAEMONSET [PREVIOUS]: waits up to 300 s for it
  local _
  for _ in $(seq 1 300); do
    inst_ds_pod_now "$@" && return 0
    sleep 1
  done
  return 1
}

inst_pod_ready() { [ "$(k -n kube-system get pod "$1" -o jsonpath='{.status.containerStatuses[0].ready}')" = true ]; }
inst_pod_running() { [ "$(k -n kube-system get pod "$1" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}')" != "" ]; }
inst_label() { k get node "$1" -o jsonpath='{.metadata.labels.kata-topo\.io/installed}'; } # NODE
# The installer labels kata-topo.io/installed=true (what the selectors use) and puts the version
# in kata-topo.io/installed-version.
inst_version() { k get node "$1" -o jsonpath='{.metadata.labels.kata-topo\.io/installed-version}'; } # NODE
inst_label_is() { [ "$(inst_label "$1")" = true ] && [ "$(inst_version "$1")" = "$2" ]; }        # NODE VERSION
inst_image_of() { # FILE: the version the installer's image stamped into the binary
  readelf -p .kata_topo_image "$1" 2> /dev/null | sed -n 's/^ *\[ *0\] *//p' | head -n 1
}
inst_apps_gone() { ! k get pods -o name | grep -q '^pod/kti-'; }
inst_gone() { ! k -n kube-system get pod "$1" > /dev/null 2>&1; }
# Waits for kube-system's pods to be gone (the preStop hook may restart containerd) up to 300 s.
inst_wait_gone() { # POD...
  local p
  for p in "$@"; do poll 300 inst_gone "${p}" || true; done
}
# Where NODE's pod logs are: node A's own /var/log, node B's on its share.
inst_log_root() { if inst_on_b "$1"; then echo "${node_b_share}/var-log"; else echo /var/log; fi; }
# The installer container's log lines, from the node's log directory.
inst_log() { # POD NODE
  cat "$(inst_log_root "$2")"/pods/kube-system_"$1"_*/installer/*.log 2> /dev/null | sed 's/^[^ ]* [^ ]* [^ ]* //'
}

# Keeps POD's installer log while it runs and terminates (the kubelet removes a deleted pod's
# log directory): node A's in ${results}/POD.log, node B's kept by node B itself (a tail here
# does not see what the host appends to a file of the share) in its share's follow-POD.log.
inst_follow_pids=()
inst_follow_log() { # POD NODE
  local f
  if inst_on_b "$2"; then
    node_b_ask follow "$1" > /dev/null || true
    return 0
  fi
  f=$(find /var/log/pods -path "*/kube-system_$1_*/installer/*.log" 2> /dev/null | head -n 1)
  [ -n "${f}" ] || return 0
  tail -n +1 -F "${f}" > "${results}/$1.log" 2> /dev/null &
  inst_follow_pids+=($!)
}
inst_followed() { # POD NODE: its kept log, without the CRI prefix
  local f=${results}/$1.log
  inst_on_b "$2" && f=${node_b_share}/follow-$1.log
  sed 's/^[^ ]* [^ ]* [^ ]* //' "${f}" 2> /dev/null
}

# A pod through the installed handler on NODE: host network, the shared pool, a small memory
# limit.
inst_app_pod() { # NAME NODE
  k apply -f - > /dev/null << EOF
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  nodeSelector: {kubernetes.io/hostname: $2}
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
# The app pod of each node.
inst_app_of() { if inst_on_b "$1"; then echo kti-b; else echo kti-app; fi; } # NODE

# The sandbox of pod NAME on node A (its container's CRI annotation).
inst_sandbox_of() { # NAME
  local cid
  cid=$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
  cid=${cid#containerd://}
  [ -n "${cid}" ] || return 1
  ctr -a "${sock}" -n k8s.io containers info --spec "${cid}" 2> /dev/null \
    | jq -r '.annotations["io.kubernetes.cri.sandbox-id"] // empty'
}
# The wrapper daemon serving pod NAME's sandbox on node A: the process whose command line names
# the sandbox, whose executable is a containerd-shim-kata-topo-v2.
inst_daemon_of() { # NAME -> PID
  local sandbox p args
  sandbox=$(inst_sandbox_of "$1") || return 1
  [ -n "${sandbox}" ] || return 1
  for p in /proc/[0-9]*; do
    case "$(readlink "${p}/exe" 2> /dev/null)" in *containerd-shim-kata-topo-v2*) ;; *) continue ;; esac
    args=$(tr '\0' ' ' < "${p}/cmdline" 2> /dev/null) || continue
    case " ${args} " in *" ${sandbox} "*) echo "${p##*/}"; return 0 ;; esac
  done
  return 1
}
# Pod NAME's sandbox on node B and its wrapper daemon (a pid of node B's namespace), as node B's
# kata-topo status says: "SANDBOX PID ALIVE".
inst_b_sandbox() { # NAME
  node_b_ask status 2> /dev/null | jq -r --arg p "$1" \
    '[.sandboxes[] | select(any(.verdicts[]; .[1].pod.name == $p))
      | "\(.sandbox_id) \(.daemon.wrapper.pid // "none") \(.wrapper)"] | last // empty'
}
inst_b_known() { [ -n "$(inst_b_sandbox "$1")" ]; } # NAME
# The wrapper's log and metrics directory on NODE.
inst_log_of() { if inst_on_b "$1"; then echo "${node_b_share}/kata-topo.log"; else echo "${log}"; fi; }
inst_metrics_of() { if inst_on_b "$1"; then echo "${node_b_share}/metrics"; else echo "${metrics}"; fi; }
# The rules of the findings NODE's wrapper logged for pod NAME after line MARK of its log.
inst_rules_since() { # NODE MARK NAME
  tail -n "+$(($2 + 1))" "$(inst_log_of "$1")" 2> /dev/null \
    | jq -R -r --arg p "$3" 'fromjson? | select(.event == "finding" and .pod_name == $p) | .rule' \
    | sort -u | paste -sd ' ' -
}
inst_log_mark() { wc -l 2> /dev/null < "$(inst_log_of "$1")" || echo 0; } # NODE

step_installer_install() {
  local v1 v t0 import_s n detail="" ok=1 label stamp dropin want pid_after
  local -A pid_before=()
  mapfile -t inst_versions < "${results}/k8s/installer-versions"
  v1=${inst_versions[0]}
  inst_nodes=("${node}" "${node_b}")
  if ! step_passed node-b; then
    record installer-install false "" "node B did not join (step node-b): the installer's story runs on both nodes"
    return 1
  fi
  # The guest's own labels go while the installer's steps run (put back at the end).
  for n in "${inst_nodes[@]}"; do
    inst_their_label[${n}]=$(inst_label "${n}")
    k label node "${n}" kata-topo.io/installed- > /dev/null
    inst_ask "${n}" files > "${results}/installer-files-before-${n}.txt"
    pid_before[${n}]=$(inst_ask "${n}" containerd)
  done
  # Node B imported the images when it came up (natively, in seconds); node A imports them now.
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
  for n in "${inst_nodes[@]}"; do
    inst_current[${n}]=$(inst_ds_pod "${n}" kata-topo-installer) \
      || { record installer-install false "" "the DaemonSet controller created no installer pod on ${n}: $(k -n kube-system get daemonset kata-topo-installer -o jsonpath='{.status}')"; return 1; }
  done
  for n in "${inst_nodes[@]}"; do
    poll 300 inst_label_is "${n}" "${v1}" || true
    poll 120 inst_pod_ready "${inst_current[${n}]}" || true
    # The device plugin's DaemonSet selects the label: its pod comes once the node has it.
    inst_plugin[${n}]=$(inst_ds_pod "${n}" kata-topo-device-plugin) \
      || { record installer-install false "" "the DaemonSet controller created no device plugin pod on ${n}"; return 1; }
    poll 120 inst_pod_running "${inst_plugin[${n}]}" || true
  done
  poll 120 node_field_is '{.status.allocatable.kata-topo\.io/vfio}' 1 || true
  for n in "${inst_nodes[@]}"; do
    label=$(inst_version "${n}")
    stamp=$(inst_ask "${n}" stamp)
    dropin=$(inst_ask "${n}" dropin)
    want=$(inst_want_dropin "${n}")
    pid_after=$(inst_ask "${n}" containerd)
    detail="${detail}${n}: installer pod ${inst_current[${n}]} ready $(inst_pod_ready "${inst_current[${n}]}" && echo yes || echo no), labels kata-topo.io/installed=$(inst_label "${n}") installed-version=${label}, shim stamped ${stamp:-?}, drop-in ${dropin:-none} (${want} wanted), containerd ${pid_before[${n}]} -> ${pid_after}, device plugin pod ${inst_plugin[${n}]} $(inst_pod_running "${inst_plugin[${n}]}" && echo running || echo 'not running'), installer log: $(inst_log "${inst_current[${n}]}" "${n}" | tail -n 1); "
    if ! { [ "${label}" = "${v1}" ] && inst_pod_ready "${inst_current[${n}]}" && [ "${stamp}" = "${v1}" ] \
      && [ "${dropin}" = "${want}" ] && [ "${pid_before[${n}]}" != "${pid_after}" ] \
      && inst_pod_running "${inst_plugin[${n}]}"; }; then
      ok=""
    fi
  done
  detail="images imported on ${node} in ${import_s} s; ${detail}/opt/kata-topo/bin on ${node}: $(find /opt/kata-topo/bin -type f -printf '%f ' 2> /dev/null); ${node} allocatable kata-topo.io/vfio $(k get node "${node}" -o jsonpath='{.status.allocatable.kata-topo\.io/vfio}')"
  if [ -n "${ok}" ] && node_field_is '{.status.allocatable.kata-topo\.io/vfio}' 1; then
    record installer-install true "" "$(cut -c 1-1800 <<< "${detail}")"
  else
    record installer-install false "" "expected on both nodes the labels, the binaries, the drop-in, containerd restarted and the device plugin running (node A's serving its VFIO device): $(cut -c 1-1800 <<< "${detail}")"
  fi
}

inst_daemon_inode=""
step_installer_pod() {
  local v exe b detail vb
  inst_app_pod kti-app "${node}" || true
  inst_app_pod kti-b "${node_b}" || true
  poll 180 ready kti-app || true
  poll 180 ready kti-b || true
  if ! ready kti-app || ! ready kti-b; then
    record installer-pod false "" "kti-app ready: $(ready kti-app && echo yes || echo no), kti-b ready: $(ready kti-b && echo yes || echo no): $(k get pod kti-app kti-b -o jsonpath='{range .items[*]}{.metadata.name}: {.status.conditions}; {end}' | cut -c 1-600)"
    return 1
  fi
  poll 30 inst_daemon_of kti-app || true
  inst_daemon[${node}]=$(inst_daemon_of kti-app || true)
  exe=$(readlink "/proc/${inst_daemon[${node}]:-0}/exe" 2> /dev/null || true)
  inst_daemon_inode=$(stat -L -c %i "/proc/${inst_daemon[${node}]:-0}/exe" 2> /dev/null || true)
  # The wrapper checked the container: its state keeps the latest verdict of each task (the
  # create's, or the CPU manager's cpuset push that follows it at once).
  poll 30 has_verdict kti-app '.operation == "create" or .operation == "update"' || true
  v=$(verdict_of kti-app)
  # Node B's wrapper, as its own kata-topo status sees it (the pids are its namespace's).
  poll 30 inst_b_known kti-b || true
  b=$(inst_b_sandbox kti-b)
  inst_daemon[${node_b}]=$(awk '{print $2}' <<< "${b}")
  vb=$(node_b_verdicts kti-b)
  detail="kubectl: kti-app on ${node}, kti-b on ${node_b} (runtimeClassName ${inst_handler}) ready; kti-app's wrapper daemon ${inst_daemon[${node}]:-none} runs ${exe:-?} (inode ${inst_daemon_inode:-?}), its latest verdict: $(jq -c '{operation, decision, findings: [.findings[].rule]}' <<< "${v:-null}"); kti-b on ${node_b}: sandbox, wrapper pid, wrapper: ${b:-none}; its verdicts: ${vb:-none}"
  if [ "${exe}" = /opt/kata-topo/bin/containerd-shim-kata-topo-v2 ] && [ -n "${v}" ] \
    && jq -e '.operation == "create" or .operation == "update"' <<< "${v}" > /dev/null \
    && [ "$(awk '{print $3}' <<< "${b}")" = serving ] \
    && jq -e 'length > 0 and all(.[]; (.findings | length) == 0)' <<< "${vb:-[]}" > /dev/null; then
    record installer-pod true "" "$(cut -c 1-1500 <<< "${detail}")"
  else
    record installer-pod false "" "expected kti-app's and kti-b's sandboxes served by the installed wrapper on each node, with their verdicts in its state: $(cut -c 1-1500 <<< "${detail}")"
  fi
}

# When pod NAME's Ready condition last turned true, and when the pod was created (RFC 3339).
inst_ready_at() { k -n kube-system get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastTransitionTime}'; }
inst_created_at() { k -n kube-system get pod "$1" -o jsonpath='{.metadata.creationTimestamp}'; }

step_installer_upgrade() {
  local v2=${inst_versions[1]:-} n inode_before inode_after daemon_exe new_daemon new_exe detail="" kept ok=1
  local first second b_after
  local -A old_pod=() old_plugin=() pid_before=() pid_after=() created=() ready_at=()
  [ -n "${v2}" ] || { record installer-upgrade false "" "no second installer image"; return 1; }
  inode_before=$(stat -c %i /opt/kata-topo/bin/containerd-shim-kata-topo-v2 2> /dev/null || echo none)
  # The old pods' logs followed before the update: node B's goes within a second of it.
  for n in "${inst_nodes[@]}"; do
    pid_before[${n}]=$(inst_ask "${n}" containerd)
    old_pod[${n}]=${inst_current[${n}]}
    old_plugin[${n}]=${inst_plugin[${n}]}
    inst_follow_log "${old_pod[${n}]}" "${n}"
  done
  inst_overlay "${v2}"
  # The rolling update, the DaemonSet controller's (maxUnavailable: 1): one node's old pod
  # deleted (the installer's preStop sees its DaemonSet stay), its new one started and ready,
  # then the next node's.
  k_kustomize apply -k "${inst_dir}" > "${run}/apply" 2>&1 \
    || { record installer-upgrade false "" "kubectl apply -k (${v2}) failed: $(tail -n 3 "${run}/apply")"; return 1; }
  # Node A's files once its old pod is gone, before its replacement installs: the old version
  # still (the hook saw the DaemonSet stay). Read as soon as it is gone; the replacement may
  # already have started.
  inst_wait_gone "${old_pod[${node}]}"
  kept="label $(inst_version "${node}"), /opt/kata-topo/share/VERSION $(cat /opt/kata-topo/share/VERSION 2> /dev/null || echo gone), handler $([ -f "${run}/containerd.d/${inst_handler}.toml" ] && echo kept || echo gone)"
  for n in "${inst_nodes[@]}"; do
    inst_wait_gone "${old_pod[${n}]}"
    inst_current[${n}]=$(inst_ds_pod "${n}" kata-topo-installer "${old_pod[${n}]}") || true
  done
  for n in "${inst_nodes[@]}"; do
    poll 300 inst_label_is "${n}" "${v2}" || true
    poll 120 inst_pod_ready "${inst_current[${n}]}" || true
    created[${n}]=$(inst_created_at "${inst_current[${n}]}")
    ready_at[${n}]=$(inst_ready_at "${inst_current[${n}]}")
    inst_wait_gone "${old_plugin[${n}]}"
    inst_plugin[${n}]=$(inst_ds_pod "${n}" kata-topo-device-plugin "${old_plugin[${n}]}") || true
    poll 120 inst_pod_running "${inst_plugin[${n}]}" || true
    pid_after[${n}]=$(inst_ask "${n}" containerd)
  done
  # Node by node: the second new pod was created no earlier than the first was ready.
  first=${node} second=${node_b}
  if [[ "${created[${node_b}]}" < "${created[${node}]}" ]]; then first=${node_b} second=${node}; fi
  inode_after=$(stat -c %i /opt/kata-topo/bin/containerd-shim-kata-topo-v2 2> /dev/null || echo none)
  daemon_exe=$(readlink "/proc/${inst_daemon[${node}]:-0}/exe" 2> /dev/null || echo gone)
  b_after=$(inst_b_sandbox kti-b)
  # A pod started now gets the new binary.
  inst_app_pod kti-app2 "${node}" || true
  poll 180 ready kti-app2 || true
  poll 30 inst_daemon_of kti-app2 || true
  new_daemon=$(inst_daemon_of kti-app2 || true)
  new_exe=$(stat -L -c %i "/proc/${new_daemon:-0}/exe" 2> /dev/null || echo none)
  for n in "${inst_nodes[@]}"; do
    detail="${detail}${n}: ${old_pod[${n}]} -> ${inst_current[${n}]} (created ${created[${n}]}, ready ${ready_at[${n}]}), label $(inst_label "${n}") $(inst_version "${n}"), shim stamped $(inst_ask "${n}" stamp), containerd ${pid_before[${n}]} -> ${pid_after[${n}]}, the old pod's hook: $(inst_followed "${old_pod[${n}]}" "${n}" | grep -m1 'daemonset' || echo none); "
    if ! { inst_label_is "${n}" "${v2}" && [ "$(inst_ask "${n}" stamp)" = "${v2}" ] \
      && [ "${pid_before[${n}]}" = "${pid_after[${n}]}" ] && inst_followed "${old_pod[${n}]}" "${n}" | grep -q 'stays'; }; then
      ok=""
    fi
  done
  detail="rolled ${first} then ${second}: ${detail}node A's shim inode ${inode_before} -> ${inode_after}; kti-app $(ready kti-app && echo ready || echo 'not ready'), its daemon ${inst_daemon[${node}]:-none}: ${daemon_exe} (inode $(stat -L -c %i "/proc/${inst_daemon[${node}]:-0}/exe" 2> /dev/null || echo gone)); kti-app2's daemon ${new_daemon:-none} on inode ${new_exe}; kti-b $(ready kti-b && echo ready || echo 'not ready'), its sandbox, daemon and wrapper on ${node_b}: ${b_after:-none} (daemon before: ${inst_daemon[${node_b}]:-none}); node A after its old pod went: ${kept}"
  if [ -n "${ok}" ] && [ -n "${ready_at[${first}]}" ] && [[ ! "${created[${second}]}" < "${ready_at[${first}]}" ]] \
    && [ "${inode_after}" != "${inode_before}" ] && ready kti-app && ready kti-b \
    && [ "$(stat -L -c %i "/proc/${inst_daemon[${node}]:-0}/exe" 2> /dev/null)" = "${inst_daemon_inode}" ] \
    && [ "$(awk '{print $2, $3}' <<< "${b_after}")" = "${inst_daemon[${node_b}]} serving" ] \
    && [ "${new_exe}" = "${inode_after}" ] \
    && grep -q ", handler kept" <<< "${kept}" && ! grep -q gone <<< "${kept}"; then
    record installer-upgrade true "" "$(cut -c 1-1800 <<< "${detail}")"
  else
    record installer-upgrade false "" "expected the rollout node by node, the new binaries on both nodes without a containerd restart, kti-app and kti-b on their old daemons and kti-app2 on the new binary: $(cut -c 1-1800 <<< "${detail}")"
  fi
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

# After the upgrade, each node's app pod (still on its old wrapper daemon) is recreated in
# place — kti-app's container killed, kti-b's image changed — and then its memory limit raised:
# the kubelet recreates the container in the running sandbox and resizes it, and the wrapper
# checks both against what the pod was admitted with, the node selector its RuntimeClass gave
# it before the upgrade, which the node still matches. Both checks clean on both nodes: the
# upgrade left nothing for the checks to trip over.
inst_recreate_resize() { # NODE: one line of detail; returns 1 unless clean
  local n=$1 name sb prom sel mark rec0 rec1 upd0 upd1 f0 f1 restarts applied rules how id
  name=$(inst_app_of "${n}")
  if inst_on_b "${n}"; then sb=$(inst_b_sandbox "${name}" | awk '{print $1}'); else sb=$(inst_sandbox_of "${name}" || true); fi
  [ -n "${sb}" ] || { echo "${name}: no sandbox"; return 1; }
  prom=$(inst_metrics_of "${n}")/kata-topo-k8s.io-${sb}.prom
  sel=$(k get pod "${name}" -o jsonpath='{.spec.nodeSelector}')
  rec0=$(inst_checks "${prom}" recreate)
  f0=$(inst_findings "${prom}")
  mark=$(inst_log_mark "${n}")
  if inst_on_b "${n}"; then
    how="image changed (kubectl set image)"
    k set image "pod/${name}" app=localhost/kata-topo/busybox:2 > /dev/null 2>&1 || { echo "${name}: kubectl set image failed"; return 1; }
  else
    how="container killed"
    id=$(k get pod "${name}" -o jsonpath='{.status.containerStatuses[0].containerID}')
    ctr -a "${sock}" -n k8s.io tasks kill -s KILL "${id#containerd://}" > /dev/null 2>&1 || { echo "${name}: cannot kill ${id}"; return 1; }
  fi
  poll 120 pod_field_is_at_least "${name}" '{.status.containerStatuses[0].restartCount}' 1 || true
  poll 120 ready "${name}" || true
  poll 60 inst_checks_above "${prom}" recreate "${rec0}" || true
  rec1=$(inst_checks "${prom}" recreate)
  restarts=$(k get pod "${name}" -o jsonpath='{.status.containerStatuses[0].restartCount}')
  # The CPU manager's push after the recreate counts as an update too: counted from here.
  sleep 3
  upd0=$(inst_checks "${prom}" update)
  resize_memory "${name}" 96 > /dev/null 2>&1 || true
  poll 120 pod_field_is "${name}" '{.status.containerStatuses[0].resources.limits.memory}' 96Mi || true
  poll 60 inst_checks_above "${prom}" update "${upd0}" || true
  upd1=$(inst_checks "${prom}" update)
  applied=$(k get pod "${name}" -o jsonpath='{.status.containerStatuses[0].resources.limits.memory}')
  f1=$(inst_findings "${prom}")
  rules=$(inst_rules_since "${n}" "${mark}" "${name}")
  echo "${name} on ${n} (nodeSelector ${sel}; label kata-topo.io/installed=$(inst_label "${n}")): ${how}: restartCount ${restarts:-?}, ready $(ready "${name}" && echo yes || echo no); resized to 96Mi: in force ${applied:-?}; checks counted in ${prom##*/}: recreate ${rec0} -> ${rec1}, update ${upd0} -> ${upd1} (allowed), findings ${f0} -> ${f1}; findings logged: [${rules}]"
  grep -q '"kata-topo.io/installed":"true"' <<< "${sel}" && [ "${restarts:-0}" -ge 1 ] && ready "${name}" \
    && [ "${rec1}" -gt "${rec0}" ] && [ "${upd1}" -gt "${upd0}" ] && [ "${applied}" = 96Mi ] \
    && [ "${f1}" = "${f0}" ] && [ -z "${rules}" ]
}
step_installer_restart_resize() {
  local n detail="" ok=1 line daemon_exe
  for n in "${inst_nodes[@]}"; do
    line=$(inst_recreate_resize "${n}") || ok=""
    detail="${detail}${line}; "
  done
  daemon_exe=$(readlink "/proc/${inst_daemon[${node}]:-0}/exe" 2> /dev/null || echo gone)
  detail="${detail}kti-app's wrapper daemon ${inst_daemon[${node}]:-none}: ${daemon_exe}; kti-b's on ${node_b}: $(inst_b_sandbox kti-b | awk '{print $2, $3}')"
  if [ -n "${ok}" ] && [ "${daemon_exe}" != gone ]; then
    record installer-restart-resize true "" "$(cut -c 1-1800 <<< "${detail}")"
  else
    record installer-restart-resize false "" "expected each app pod's recreate and resize checked by its wrapper after the upgrade, and clean: $(cut -c 1-1800 <<< "${detail}")"
  fi
}

step_installer_removal() {
  local n detail="" ok=1 diff_out rc label files_after
  local -A pid_before=() pid_after=()
  k delete pod kti-app kti-app2 kti-b --wait=false > /dev/null 2>&1 || true
  # Gone before the binaries go: containerd runs the wrapper's binary to clean up after a pod.
  poll 120 inst_apps_gone || true
  # The DaemonSets deleted; the garbage collector deletes their pods: the installer's preStop
  # finds its DaemonSet gone and restores its node.
  for n in "${inst_nodes[@]}"; do
    pid_before[${n}]=$(inst_ask "${n}" containerd)
    inst_follow_log "${inst_current[${n}]}" "${n}"
  done
  k -n kube-system delete daemonset kata-topo-installer kata-topo-device-plugin > /dev/null 2>&1 || true
  for n in "${inst_nodes[@]}"; do inst_wait_gone "${inst_current[${n}]}" "${inst_plugin[${n}]}"; done
  # The guest's device plugin back (its socket is one of the node's files compared).
  inst_restore_plugin
  poll 60 test -S "${kubelet_root}/device-plugins/kata-topo-vfio.sock" || true
  k_kustomize delete -k "${inst_dir}" --ignore-not-found > /dev/null 2>&1 || true
  for n in "${inst_nodes[@]}"; do
    pid_after[${n}]=$(inst_ask "${n}" containerd)
    inst_ask "${n}" files > "${results}/installer-files-after-${n}.txt"
    rc=0
    diff_out=$(diff "${results}/installer-files-before-${n}.txt" "${results}/installer-files-after-${n}.txt") || rc=$?
    label=$(inst_label "${n}")
    files_after="the same, $(wc -l < "${results}/installer-files-after-${n}.txt") entries"
    [ "${rc}" = 0 ] || files_after=$(paste -sd ' ' - <<< "${diff_out}" | cut -c 1-400)
    detail="${detail}${n}: the hook: $(inst_followed "${inst_current[${n}]}" "${n}" | grep -E 'uninstall|removed' | tail -n 1); containerd ${pid_before[${n}]} -> ${pid_after[${n}]}; label kata-topo.io/installed=${label:-<none>}; node files (installer-files-before-${n}.txt vs -after): ${files_after}; "
    if ! { [ "${rc}" = 0 ] && [ -s "${results}/installer-files-after-${n}.txt" ] && [ -z "${label}" ] \
      && [ "${pid_before[${n}]}" != "${pid_after[${n}]}" ] \
      && ! grep -q '^/opt/kata-topo ' "${results}/installer-files-after-${n}.txt" \
      && inst_followed "${inst_current[${n}]}" "${n}" | grep -q "removed kata-topo's files from node"; }; then
      ok=""
    fi
  done
  detail="kubectl delete daemonset, then its pods; ${detail}"
  if [ -n "${ok}" ] && [ ! -e /opt/kata-topo ]; then
    record installer-removal true "" "$(cut -c 1-1800 <<< "${detail}")"
  else
    record installer-removal false "" "expected each node's files as before the install, the labels gone, containerd restarted on both: $(cut -c 1-1800 <<< "${detail}")"
  fi
}

# Both nodes' labels and the guest's device plugin, as before these steps; what a failed step
# left of the installer goes (deleting the DaemonSets runs its hook on each node).
inst_restore() {
  local n
  [ -z "${inst_done}" ] || return 0
  inst_done=1
  k delete pod kti-app kti-app2 kti-b --ignore-not-found --wait=false > /dev/null 2>&1 || true
  if k -n kube-system get daemonset kata-topo-installer > /dev/null 2>&1; then
    k -n kube-system delete daemonset kata-topo-installer kata-topo-device-plugin --ignore-not-found > /dev/null 2>&1 || true
    for n in "${!inst_current[@]}"; do inst_wait_gone "${inst_current[${n}]}"; done
  fi
  for n in "${!inst_their_label[@]}"; do
    if [ -n "${inst_their_label[${n}]}" ]; then
      k label node "${n}" "kata-topo.io/installed=${inst_their_label[${n}]}" --overwrite > /dev/null || true
    fi
  done
  inst_restore_plugin
}
inst_restore_plugin() {
  if [ -z "${plugin_pid}" ]; then
    "${bin}/kata-topo-device-plugin" --device-plugin-dir "${kubelet_root}/device-plugins" \
      < /dev/null >> "${results}/device-plugin.log" 2>&1 &
    plugin_pid=$!
  fi
}
