#!/usr/bin/env bash
# Provisions the VM: containerd, Kata (static release), kubeadm/kubelet for in-place resize with
# the static CPU manager and the single-numa-node Topology Manager, node-problem-detector,
# node-exporter, and kata-topo built from /vagrant. Versions come from the Vagrantfile.
set -euo pipefail

say() { printf '\n== %s\n' "$*"; }
: "${CONTAINERD_VERSION:?}" "${KATA_VERSION:?}" "${KUBERNETES_VERSION:?}" "${NPD_VERSION:?}" "${RUST_VERSION:?}"
export DEBIAN_FRONTEND=noninteractive

say "packages"
apt-get update -qq
apt-get install -y -qq --no-install-recommends ca-certificates curl gnupg build-essential \
  pkg-config libhwloc-dev libudev-dev hwloc protobuf-compiler busybox-static bzip2 \
  prometheus-node-exporter socat conntrack ethtool iptables jq xz-utils pciutils

say "kernel: br_netfilter, forwarding, no swap, vfio"
modprobe br_netfilter overlay vfio-pci
printf 'br_netfilter\noverlay\nvfio-pci\n' > /etc/modules-load.d/kata-topo.conf
sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
printf 'net.ipv4.ip_forward=1\nnet.bridge.bridge-nf-call-iptables=1\n' > /etc/sysctl.d/90-kata-topo.conf
swapoff -a
sed -i '/\sswap\s/d' /etc/fstab

say "NUMA nodes seen by the guest"
lscpu | grep -i numa || true

say "containerd ${CONTAINERD_VERSION}"
curl -fsSL "https://github.com/containerd/containerd/releases/download/v${CONTAINERD_VERSION}/containerd-${CONTAINERD_VERSION}-linux-amd64.tar.gz" \
  | tar -xz -C /usr/local
curl -fsSL "https://raw.githubusercontent.com/containerd/containerd/v${CONTAINERD_VERSION}/containerd.service" \
  -o /etc/systemd/system/containerd.service
apt-get install -y -qq --no-install-recommends runc

say "Kata ${KATA_VERSION} (static release into /opt/kata)"
curl -fsSL "https://github.com/kata-containers/kata-containers/releases/download/${KATA_VERSION}/kata-static-${KATA_VERSION}-amd64.tar.xz" \
  | tar -xJ -C /
ln -sf /opt/kata/bin/containerd-shim-kata-v2 /usr/local/bin/containerd-shim-kata-v2

say "kata-topo from /vagrant"
if ! command -v cargo >/dev/null; then
  curl -fsSL https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain "${RUST_VERSION}"
fi
# shellcheck disable=SC1091
. "${HOME}/.cargo/env"
make -C /vagrant install PREFIX=/usr/local

say "the passthrough device: bind the NIC on NUMA node 1 to vfio-pci"
nic=$(lspci -Dn -d 8086:10d3 | awk 'NR==1 {print $1}')
if [ -n "${nic}" ]; then
  echo "${nic}: numa_node $(cat "/sys/bus/pci/devices/${nic}/numa_node")"
  echo vfio-pci > "/sys/bus/pci/devices/${nic}/driver_override"
  if [ -e "/sys/bus/pci/devices/${nic}/driver" ]; then
    echo "${nic}" > "/sys/bus/pci/devices/${nic}/driver/unbind"
  fi
  echo "${nic}" > /sys/bus/pci/drivers_probe
  group=$(basename "$(readlink "/sys/bus/pci/devices/${nic}/iommu_group")")
  echo "${nic} bound to vfio-pci, IOMMU group ${group}"
  # A CDI device the pods request by annotation (cdi.k8s.io/vfio: kata-topo.io/vfio=nic).
  mkdir -p /etc/cdi
  cat > /etc/cdi/kata-topo-vfio.json <<CDI
{"cdiVersion": "0.6.0", "kind": "kata-topo.io/vfio",
 "devices": [{"name": "nic", "containerEdits": {"deviceNodes": [{"path": "/dev/vfio/${group}"}]}}]}
CDI
else
  echo "no emulated NIC (VirtualBox): the scenario simulates the device"
fi

say "containerd configuration with the kata-topo runtime handler"
mkdir -p /etc/containerd
cat > /etc/containerd/config.toml <<'TOML'
version = 2
imports = ["/usr/local/share/kata-topo/containerd/kata-topo-config-v2.toml"]
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi"]
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
TOML
# kata-topo writes metrics where node-exporter's textfile collector reads.
sed -i 's|^# metrics_dir = .*|metrics_dir = "/var/lib/prometheus/node-exporter"|' \
  /opt/kata/share/defaults/kata-containers/configuration-kata-topo.toml
systemctl daemon-reload
systemctl enable --now containerd
echo 'ARGS="--collector.textfile.directory=/var/lib/prometheus/node-exporter"' > /etc/default/prometheus-node-exporter
systemctl restart prometheus-node-exporter

say "Kubernetes ${KUBERNETES_VERSION}"
curl -fsSL "https://pkgs.k8s.io/core:/stable:/v${KUBERNETES_VERSION}/deb/Release.key" \
  | gpg --dearmor --yes -o /etc/apt/keyrings/kubernetes.gpg
echo "deb [signed-by=/etc/apt/keyrings/kubernetes.gpg] https://pkgs.k8s.io/core:/stable:/v${KUBERNETES_VERSION}/deb/ /" \
  > /etc/apt/sources.list.d/kubernetes.list
apt-get update -qq
apt-get install -y -qq kubelet kubeadm kubectl
apt-mark hold kubelet kubeadm kubectl
cat > /root/kubeadm.yaml <<'YAML'
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
networking:
  podSubnet: 10.244.0.0/16
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
cpuManagerPolicy: static
cpuManagerReconcilePeriod: 10s
reservedSystemCPUs: "0"
topologyManagerPolicy: single-numa-node
topologyManagerScope: container
memoryManagerPolicy: None
YAML
kubeadm init --config /root/kubeadm.yaml --ignore-preflight-errors=NumCPU
mkdir -p /root/.kube && cp /etc/kubernetes/admin.conf /root/.kube/config
kubectl taint nodes --all node-role.kubernetes.io/control-plane- || true
kubectl label node "$(hostname)" katacontainers.io/kata-runtime=true kata-topo.io/installed=true --overwrite
kubectl apply -f /usr/local/share/kata-topo/kubernetes/runtimeclass.yaml

say "node-problem-detector ${NPD_VERSION} with kata-topo's monitors"
curl -fsSL "https://github.com/kubernetes/node-problem-detector/releases/download/${NPD_VERSION}/node-problem-detector-${NPD_VERSION}-linux_amd64.tar.gz" \
  | tar -xz -C /usr/local
cat > /etc/systemd/system/node-problem-detector.service <<UNIT
[Unit]
Description=node-problem-detector
After=kubelet.service
[Service]
ExecStart=/usr/local/bin/node-problem-detector --logtostderr \
  --apiserver-override=https://127.0.0.1:6443?inClusterConfig=false&auth=/root/.kube/config \
  --config.system-log-monitor=/usr/local/share/kata-topo/node-problem-detector/kata-topo-filelog-monitor.json \
  --config.custom-plugin-monitor=/usr/local/share/kata-topo/node-problem-detector/kata-topo-plugin-monitor.json
Restart=always
[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now node-problem-detector

say "ready: vagrant provision --provision-with test"
